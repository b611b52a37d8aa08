"""The simulator's HTTP side: vLLM's OpenAI endpoints, /metrics, /health, /version and ``/_sim/state``.

hangwatch reads a server over HTTP, so the fake one must answer like uvicorn in front of vLLM:
the same paths, status codes, bodies and headers, and in the failure states the same silence. The
controls (``/_sim/``) are not the simulated server: they answer in every state, ``unresponsive``
included, and on a control port of their own (``ControlHandler``) even while the server is ``dead``.
The handler is given its simulator by the server that owns it and never imports it.
"""
from __future__ import annotations

import json
import select
import socket
import time
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

from .engine import VLLM_VERSION, Request
from .page import CONTENT_TYPE_METRICS
from .quiet import QuietThreadingHTTPServer

CONTROLS = "/_sim/"


def count_tokens(text: str) -> int:
    return max(1, len(text.split())) + 1          # + BOS, like a Llama tokenizer


def words(n: int) -> str:
    vocab = ("the", "model", "is", "a", "small", "random", "llama", "and", "it", "talks")
    return "".join(" " + vocab[i % len(vocab)] for i in range(n))


def error_body(message: str, code: int, kind: str, param=None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Server(QuietThreadingHTTPServer):
    allow_reuse_address = True
    request_queue_size = 128


class Server6(Server):
    address_family = socket.AF_INET6


class Handler(BaseHTTPRequestHandler):
    simulator: Any  # the Simulator serving this handler (set by the server that owns it)
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def version_string(self) -> str:
        return "uvicorn"

    def log_message(self, *args) -> None:       # quiet: tests read pages, not logs
        pass

    def setup(self) -> None:
        super().setup()
        with self.simulator._lock:
            self.simulator._conns.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.simulator._lock:
                self.simulator._conns.discard(self.connection)

    def _hold(self) -> bool:
        """Unresponsive: the connection is accepted, nothing is answered. False: drop it."""
        sim = self.simulator
        with sim._lock:
            generation = sim._generation
            while sim._mode == "unresponsive" and not sim._stopping.is_set():
                sim._mode_changed.wait(0.2)
            if sim._stopping.is_set() or (sim._generation != generation and sim._mode == "dead"):
                self.close_connection = True
                return False
        return True

    def parse_request(self) -> bool:
        """The request head is read; hold it here (unresponsive) unless it is for the controls."""
        if not super().parse_request():
            return False
        return self.path.startswith(CONTROLS) or self._hold()

    # -- plumbing ------------------------------------------------------------------------
    def _send(self, code: int, body: bytes, content_type: str = "application/json",
              handler: str | None = None, started: float | None = None) -> None:
        self.send_response(code)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._record(code, handler, len(body), started)

    def _record(self, code: int, handler: str | None, out_size: int, started: float | None) -> None:
        """What vLLM's HTTP instrumentator would count (its own page shows it)."""
        in_size = int(self.headers.get("Content-Length") or 0)
        elapsed = time.monotonic() - (started or time.monotonic())
        self.simulator.http.record(self.command, code, handler or "none", in_size, out_size, elapsed, time.time())

    def _json(self, code: int, obj, handler: str | None = None, started=None) -> None:
        self._send(code, json.dumps(obj).encode(), "application/json", handler, started)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return None

    def _refused(self, path: str, started: float) -> bool:
        """vLLM --api-key: /v1/* without ``Authorization: Bearer KEY`` is 401 (measured, 0.32)."""
        key = self.simulator.api_key
        if key and path.startswith("/v1/") and self.headers.get("Authorization") != f"Bearer {key}":
            self._body()
            self._json(401, {"error": "Unauthorized"}, path, started)
            return True
        return False

    def _begin(self) -> tuple[str, float] | None:
        """The request's path and start; None when it was refused (answered)."""
        path = self.path.split("?", 1)[0]
        started = time.monotonic()
        if self._refused(path, started):
            return None
        return path, started

    # -- routes --------------------------------------------------------------------------
    def do_GET(self) -> None:
        sim = self.simulator
        begun = self._begin()
        if begun is None:
            return
        path, started = begun
        if path == "/metrics" or path.startswith("/metrics/"):
            if sim._mode == "metrics_missing":
                return self._json(404, {"detail": "Not Found"}, "/metrics")
            if sim._mode == "metrics_garbage":
                page = b"<html><head><title>502 Bad Gateway</title></head><body>oops</body></html>"
                return self._send(200, page, "text/html; charset=utf-8", "/metrics")
            return self._send(200, sim.metrics_text().encode(), CONTENT_TYPE_METRICS, "/metrics")
        if path in ("/health", "/ping"):
            return self._send(200, b"", "application/json", path)
        if path == "/version":
            return self._json(200, {"version": VLLM_VERSION}, "/version")
        if path == "/v1/models":
            return self._json(200, sim.models_json(), "/v1/models", started)
        if path == "/_sim/state":
            return self._control_get()
        return self._json(404, {"detail": "Not Found"}, None, started)

    do_HEAD = do_GET

    def do_POST(self) -> None:
        sim = self.simulator
        begun = self._begin()
        if begun is None:
            return
        path, started = begun
        if path == "/_sim/state":
            return self._control_post()
        if path not in ("/v1/completions", "/v1/chat/completions"):
            return self._json(404 if path != "/v1/models" else 405, {"detail": "Not Found"},
                              None, started)
        body = self._body()
        if not isinstance(body, dict):
            return self._json(400, error_body("invalid JSON body", 400, "BadRequestError"),
                              path, started)
        with sim._lock:
            sim.inference_requests += 1
        chat = path.endswith("chat/completions")
        if body.get("model") not in (None, sim.model):
            return self._json(404, error_body(f"The model `{body.get('model')}` does not exist.",
                                          404, "NotFoundError", "model"), path, started)
        if chat:
            messages = body.get("messages") or []
            prompt_tokens = 8 + sum(count_tokens(str(m.get("content", ""))) for m in messages)
        else:
            prompt = body.get("prompt", "")
            prompt_tokens = count_tokens(prompt if isinstance(prompt, str) else " ".join(map(str, prompt)))
        default_max = 16 if not chat else sim.max_model_len - prompt_tokens
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
        if prompt_tokens + int(max_tokens) > sim.max_model_len:
            msg = (f"This model's maximum context length is {sim.max_model_len} tokens. However, "
                   f"you requested {prompt_tokens + int(max_tokens)} tokens "
                   f"({prompt_tokens} in the messages, {max_tokens} in the completion).")
            return self._json(400, error_body(msg, 400, "BadRequestError"), path, started)
        generation = sim._generation
        engine = sim.engine
        req = Request(prompt_tokens, int(max_tokens), sim.clock.now(), synthetic=False)
        engine.submit(req)
        while not req.done.wait(0.05):
            if sim._stopping.is_set() or sim._generation != generation or self._client_gone():
                engine.abort(req)
                self.close_connection = True
                return
        if sim._generation != generation or req.finish_reason is None:
            self.close_connection = True
            return
        self._json(200, self._completion(chat, body, req), path, started)

    # -- the controls ----------------------------------------------------------------------
    def _control_get(self) -> None:
        sim = self.simulator
        self._json(200, {"state": sim.state, "params": sim._params,
                         "inference_requests": sim.inference_requests}, "/_sim/state")

    def _control_post(self) -> None:
        sim = self.simulator
        body = self._body()
        if not isinstance(body, dict):
            return self._json(400, {"error": 'expected a JSON object: {"state": "busy", "n": 3} '
                                             'or {"action": "restart"}'}, "/_sim/state")
        try:
            if body.get("action") == "restart":
                sim.restart()
            else:
                sim.set_state(body.pop("state", "idle"), **body)
        except (ValueError, TypeError) as exc:
            return self._json(400, {"error": str(exc)}, "/_sim/state")
        self._json(200, {"state": sim.state}, "/_sim/state")

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _completion(self, chat: bool, body: dict, req: Request) -> dict:
        sim = self.simulator
        usage = {"prompt_tokens": req.prompt_tokens,
                 "total_tokens": req.prompt_tokens + req.generated,
                 "completion_tokens": req.generated, "prompt_tokens_details": None,
                 "completion_tokens_details": None}
        created = int(time.time())
        text = words(req.generated)
        if chat:
            choice = {"index": 0, "message": {
                "role": "assistant", "content": text, "refusal": None, "annotations": None,
                "audio": None, "function_call": None, "reasoning": None},
                "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None,
                "token_ids": None, "routed_experts": None}
            return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion",
                    "created": created, "model": sim.model, "choices": [choice],
                    "service_tier": None, "system_fingerprint": sim.fingerprint,
                    "usage": usage, "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
                    "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": req.finish_reason, "stop_reason": None, "token_ids": None,
                  "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
        return {"id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion",
                "created": created, "model": sim.model, "choices": [choice],
                "service_tier": None, "system_fingerprint": sim.fingerprint, "usage": usage,
                "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


class ControlHandler(Handler):
    """The control port: only ``/_sim/state``, answered in every state (it is never held or closed)."""

    def parse_request(self) -> bool:
        return BaseHTTPRequestHandler.parse_request(self)

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/_sim/state":
            return self._control_get()
        self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] == "/_sim/state":
            return self._control_post()
        self._json(404, {"detail": "Not Found"})

    do_HEAD = do_GET

    setup = BaseHTTPRequestHandler.setup    # not one of the server's connections: a kill leaves it open
    finish = BaseHTTPRequestHandler.finish

    def _record(self, code: int, handler: str | None, out_size: int, started: float | None) -> None:
        pass  # not the simulated server: nothing in its HTTP stats
