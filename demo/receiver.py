"""An in-process HTTP receiver that records what Alertmanager (or anything) posts to it.

One receiver for the stack's routes, the real-Alertmanager test's people route and the payload
benchmark: ``/alerts`` stands for the restart route (with a token, the Bearer token is checked and
401 answered otherwise, as the real webhook answers) and ``/people`` for everything else. Tests ask
it what was delivered, when, and how often; the benchmark reads the raw bodies.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """Records every POST; listens on a loopback port of its own choosing."""

    def __init__(self, token: str | None = None):
        self.token = token
        self.deliveries: list[dict] = []
        self.rejected = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if receiver.token is not None and self.path == "/alerts" and \
                        self.headers.get("Authorization") != f"Bearer {receiver.token}":
                    with receiver.lock:
                        receiver.rejected += 1
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with receiver.lock:
                    receiver.deliveries.append({"path": self.path, "at": time.time(), "body": body,
                                                "payload": json.loads(body)})
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="alert-receiver")
        self.thread.start()

    def bodies(self, path: str) -> list[bytes]:
        """The raw bodies posted to ``path``, oldest first."""
        with self.lock:
            return [d["body"] for d in self.deliveries if d["path"] == path]

    def alerts(self, path: str, alertname: str | None = None) -> list[tuple[float, dict]]:
        """(delivery time, alert) for every firing alert delivered to ``path``."""
        with self.lock:
            deliveries = list(self.deliveries)
        return [(d["at"], alert) for d in deliveries if d["path"] == path
                for alert in d["payload"]["alerts"]
                if alert["status"] == "firing" and alertname in (None, alert["labels"].get("alertname"))]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
