"""The webhook's stall restart on real parts: a real vLLM with decode dead (tests/vllm_faults) →
exporter → Prometheus with the shipped rules → Alertmanager → webhook → the real dockerd.

One vLLM, watched as two targets: ``vllm-a`` opts in (``restart_on: [hung, stalled]``) and its
container (a stub on the real dockerd, as in the forensics chain) is restarted after the webhook's
own re-check saw no output; ``vllm-b`` keeps the default ``restart_on`` and the same stall leaves
its container alone, with the decision logged, counted and in the ledger as ``not_opted_in``.
"""
from __future__ import annotations

import json
import time

import pytest
import requests

from hangwatch.demo.chain import hangwatch_command
from hangwatch.demo.files import private_file
from hangwatch.demo.processes import start_server
from hangwatch.demo.wait import wait_until
from harness.stack import Stack
from harness.vllm_server import VLLMServer, venv_path, venv_usable
from tests.support.require import require, require_binary
from tests.webhook.real_parts import Backend, backend_image, docker_client, dockerd  # noqa: F401 (fixtures)

from .test_real_vllm_faults import SCRAPE, SCRAPE_TIMEOUT, STALLED, WINDOW, Clients

pytestmark = pytest.mark.real

TOKEN = "stall-restart-e2e-token-0123456789-0123456789"  # the webhook needs 32 characters or more


def decisions(webhook_url: str, reason: str) -> float:
    """``hangwatch_webhook_decisions_total{reason=...}`` summed over actions, from the webhook's /metrics."""
    total = 0.0
    for line in requests.get(webhook_url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("hangwatch_webhook_decisions_total{") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def ledger_decisions(state_dir) -> list[tuple[str, str, str]]:
    """(target, action, reason) of every decision in the webhook's ledger so far."""
    path = state_dir / "ledger.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(e["target"], e["action"], e["reason"]) for e in map(json.loads, lines) if e.get("event") == "decision"]


def test_a_stall_restarts_only_the_target_that_opted_in(docker_client, backend_image, tmp_path):  # noqa: F811
    require(venv_usable(), f"vLLM venv at {venv_path()} (make it with .ci/setup-vllm.sh)")
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    token = private_file(tmp_path / "token", TOKEN + "\n")
    state_dir = tmp_path / "state"
    server = VLLMServer(fault="decode_dead")
    opted = default = clients = webhook = stack = None
    try:
        opted = Backend(docker_client, backend_image, tmp_path / "backends")
        default = Backend(docker_client, backend_image, tmp_path / "backends")
        for stub in (opted, default):
            stub.set_mode("idle")
        server.start()
        config = tmp_path / "webhook.yml"
        config.write_text(json.dumps({
            "token_file": str(token), "state_dir": str(state_dir), "recheck": {"interval": "1s", "timeout": "3s"},
            "targets": [{"name": "vllm-a", "container": opted.name, "url": server.url, "stop_timeout": "2s",
                         "restart_on": ["hung", "stalled"]},
                        {"name": "vllm-b", "container": default.name, "url": server.url, "stop_timeout": "2s"}]}))
        webhook = start_server("webhook", [*hangwatch_command(), "webhook", "--config", str(config), "--listen",
                                           "127.0.0.1:0"], tmp_path / "webhook.log", "/healthz")
        stack = Stack(tmp_path, scrape_interval=SCRAPE, scrape_timeout=SCRAPE_TIMEOUT,
                      targets={"vllm-a": server.url, "vllm-b": server.url},
                      containers={"vllm-a": opted.name, "vllm-b": default.name},
                      hook_url=webhook.url + "/alerts", token_file=token,
                      exporter_config={"targets": [{"url": server.url, "stall_window": f"{WINDOW:g}s"}]}).start()
        # Six clients keep something in flight at every reading; each gives up after 2 s without a
        # byte (an abort in vLLM, which is no output), so prefill keeps moving and decode never does.
        load_started = time.monotonic()
        clients = Clients(server.url, n=6, patience=2.0)
        wait_until(lambda: stack.receiver.alerts("/people", STALLED), WINDOW + 90, "the stall alert", interval=0.5)
        alerted_after = time.monotonic() - load_started
        wait_until(lambda: opted.restarts() >= 1, 90, "the opted-in target's container restarted", interval=0.5)
        restarted_after = time.monotonic() - load_started
        # The ledger line itself: the webhook counts a decision before it appends it to the ledger,
        # and this skip is decided in the request (no job for jobs_in_progress below to wait out).
        wait_until(lambda: ("vllm-b", "skip", "not_opted_in") in ledger_decisions(state_dir), 60,
                   "the default target's skip in the ledger", ignore=(ValueError,))  # a line half-written
        wait_until(lambda: requests.get(webhook.url + "/healthz", timeout=5).json()["jobs_in_progress"] == 0, 60,
                   "the webhook to finish its jobs")
        since = stack.value('target:hangwatch_engine_output:flat_since{target="vllm-a"}')
        assert since is not None, "no stall clock"

        lines = [json.loads(line) for line in (state_dir / "ledger.jsonl").read_text().splitlines()]
        made = [(e["target"], e["action"], e["reason"]) for e in lines if e.get("event") == "decision"]
        assert ("vllm-a", "restart", "stalled") in made, made
        assert ("vllm-b", "skip", "not_opted_in") in made, made
        assert not [m for m in made if m[0] == "vllm-b" and m[1] == "restart"], made
        (restart,) = [e for e in lines if e.get("event") == "decision" and e["action"] == "restart"]
        assert restart["result"] == "ok", restart
        (record,) = [e for e in lines if e.get("event") == "restart"]
        assert (record["target"], record["verdict"]) == ("vllm-a", "stalled"), record
        incident = json.loads(open(restart["incident"]).read())
        assert incident["recheck"]["verdict"] == "stalled", incident["recheck"]
        # Its own readings, one process, no output across them: the same generation-token count in each.
        readings = [o["reading"] for o in incident["observations"] if o.get("reading")]
        assert len(readings) >= 2, incident["observations"]
        assert len({r["process_start"] for r in readings}) == 1, readings
        assert len({(r["generation_tokens"], r["served"]) for r in readings}) == 1, readings
        assert all(r["running"] + r["waiting"] > 0 for r in readings), readings
        assert opted.restarts() == 1 and default.restarts() == 0
        assert decisions(webhook.url, "not_opted_in") >= 1 and decisions(webhook.url, "stalled") == 1
        log = webhook.log_tail(400)
        assert "target=vllm-b" in log and "reason=not_opted_in" in log, log
        print(f"decode dead: stall alert {alerted_after:.1f} s after the load began, the opted-in container "
              f"restarted {restarted_after:.1f} s after it ({restart['at'] - since:.1f} s after the stall's first "
              f"reading; window {WINDOW:g} s, {SCRAPE:g} s scrape); the default target skipped (not_opted_in), "
              f"its container restarted {default.restarts()} times")
    except BaseException:
        if stack is not None:
            print(stack.logs())
        if webhook is not None:
            print(webhook.log_tail(80))
        raise
    finally:
        if clients is not None:
            clients.stop()
        if stack is not None:
            stack.close()
        if webhook is not None:
            webhook.stop()
        server.close()
        for stub in (opted, default):
            if stub is not None:
                stub.remove()
