"""`hangwatch forensics` on a real vLLM: refused while it serves, the stacks and the right signature
when it hangs — a SIGSTOP'd EngineCore ("process stopped") and an EngineCore wedged in a named
function by the fault plugin ("engine step stuck", naming the function)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import requests

from hangwatch.demo.chain import HUNG, hangwatch_command
from hangwatch.demo.files import private_file
from hangwatch.demo.processes import start_server
from hangwatch.demo.wait import wait_until
from harness import REPO
from harness.stack import Stack
from harness.vllm_server import proc_title
from tests.real_forensics.conftest import SAYS
from tests.support.require import require_binary
from tests.webhook.real_parts import Backend, backend_image, docker_client, dockerd  # noqa: F401 (fixtures)

pytestmark = pytest.mark.real

CHECK = ["--interval", "1", "--timeout", "3"]
TOKEN = "forensics-e2e-token-0123456789-0123456789"  # the webhook needs 32 characters or more


def forensics(url: str, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "hangwatch", "forensics", url, "--json", *CHECK, *args],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(done.stdout)


def wait_still(server, running: int, apart_s: float = 1.5, deadline_s: float = 60):
    """The first /metrics page identical to one read ``apart_s`` earlier, ``running`` in flight."""
    deadline = time.monotonic() + deadline_s
    earlier = server.metrics()
    while True:
        time.sleep(apart_s)
        page = server.metrics()
        if page.series() == earlier.series() and page.value("vllm:num_requests_running") == running:
            return page
        assert time.monotonic() < deadline, "the page never stood still"
        earlier = page


def shape(answer: dict) -> str:
    threads = sum(len(p["threads"]) for p in answer["processes"])
    return (f"{len(answer['processes'])} processes, {threads} threads, capture {answer['seconds']} s "
            f"(deadline {answer['deadline']} s)")


def test_refused_while_serving_then_a_stopped_engine_core_is_named(wedgeable_vllm):
    server = wedgeable_vllm
    code, answer = forensics(server.url)
    assert code == 1 and answer["verdict"] == "idle" and answer["processes"] == [], answer
    with server.generations(n=2):
        server.wait_until(lambda p: p.value("vllm:num_requests_running") == 2, 60, what="two running")
        code, answer = forensics(server.url)
        assert code == 1 and answer["verdict"] == "busy", answer
        engine = server.freeze()
        try:
            server.wait_frozen(running=2)
            code, answer = forensics(server.url)
        finally:
            server.thaw()
    print("SIGSTOP'd EngineCore:", shape(answer))
    assert code == 0 and answer["verdict"] == "hung", answer
    assert answer["signature"] == "process_stopped", answer["evidence"]
    assert f"pid {engine} (VLLM::EngineCore)" in answer["evidence"][0] and "last stack" in answer["evidence"][0]
    by_pid = {p["pid"]: p for p in answer["processes"]}
    assert by_pid[engine]["state"] == "T" and by_pid[engine]["threads"], by_pid[engine]
    assert answer["processes"][0]["pid"] == server.proc.pid  # the listener: the API server
    assert any(proc_title(p["pid"]).startswith("VLLM::Worker") for p in answer["processes"])
    assert answer["errors"] == []
    server.wait_idle(60)


def test_a_wedged_engine_core_is_named_with_the_function_it_waits_in(wedgeable_vllm):
    server = wedgeable_vllm
    server.prove_healthy()
    with server.generations(n=2):
        server.wait_until(lambda p: p.value("vllm:num_requests_running") == 2, 60, what="two running")
        open(server.wedge_trigger, "w").close()
        wait_still(server, running=2)
        code, answer = forensics(server.url)
        print("wedged EngineCore:", shape(answer))
        assert code == 0 and answer["verdict"] == "hung", answer
        engine = next(p for p in answer["processes"] if p["name"].startswith("VLLM::EngineCore"))
        main = next(t for t in engine["threads"] if t["os_thread_id"] == engine["pid"])
        names = [f["name"] for f in main["frames"]]
        assert any(name.endswith("hangwatch_fault_wedged_here") for name in names), names
        assert answer["signature"] == "engine_step_stuck", (answer["signature"], answer["evidence"])
        assert any("hangwatch_fault_wedged_here" in line and f"pid {engine['pid']}" in line
                   for line in answer["evidence"]), answer["evidence"]
        human = subprocess.run([sys.executable, "-m", "hangwatch", "forensics", server.url, *CHECK],
                               capture_output=True, text=True, timeout=120)
        assert human.returncode == 0 and "signature: engine_step_stuck" in human.stdout


def resolved(stack, alertname: str) -> list[tuple[float, dict]]:
    """(delivery time, alert) for every resolved alert delivered to people."""
    with stack.receiver.lock:
        deliveries = list(stack.receiver.deliveries)
    return [(d["at"], alert) for d in deliveries if d["path"] == "/people" for alert in d["payload"]["alerts"]
            if alert["status"] == "resolved" and alert["labels"].get("alertname") == alertname]


def signature_reaches_people(stack, server, signature: str) -> str:
    """The signature on the dashboard's restart annotation, in the hang alert's resolve and in the
    webhook-restarted alert (issue 25). Prometheus resolves an alert with the annotations of its last active
    evaluation, so the hang ends here only once Prometheus holds the webhook's signature series:
    the stub's restart healed nothing, vLLM is restarted like its container would be."""
    series = f'hangwatch_webhook_last_restart_timestamp_seconds{{target="vllm-a",signature="{signature}"}}'
    began = time.monotonic()
    wait_until(lambda: stack.query(series), 30, "Prometheus to scrape the webhook's signature series", interval=0.5)
    scraped_after = time.monotonic() - began
    dashboard = json.loads((REPO / "grafana" / "dashboards" / "hangwatch.json").read_text())
    (annotation,) = [a for a in dashboard["annotations"]["list"] if a["name"] == "hangwatch restart"]
    # The signature series is set before Docker is called, the restart counter the annotation joins
    # after Docker answers: a scrape between the two holds the first alone. Wait for both.
    marks = wait_until(lambda: stack.query(annotation["target"]["expr"]), 30,
                       "the restart annotation (the restart counter scraped too)", interval=0.5)
    assert [(m["metric"]["target"], m["metric"].get("signature")) for m in marks] == [("vllm-a", signature)], marks
    os.remove(server.wedge_trigger)  # the restarted vLLM serves again
    restart_began = time.time()
    server.restart()
    ((resolved_at, hung),) = wait_until(lambda: resolved(stack, HUNG), 120, "the hang alert's resolve", interval=0.5)
    assert signature in hung["annotations"]["description"], hung["annotations"]
    # The webhook's own alert carries it as a label (firing and resolve alike), whatever the
    # backend's restart looked like (this vLLM reads down for a minute: no HangwatchBackendRestarted).
    delivered, alert = wait_until(lambda: stack.receiver.alerts("/people", "HangwatchWebhookRestarted"), 60,
                                  "the webhook-restarted alert", interval=0.5)[0]
    assert (alert["labels"]["target"], alert["labels"]["signature"]) == ("vllm-a", signature), alert["labels"]
    assert signature in alert["annotations"]["summary"], alert["annotations"]
    return (f"series in Prometheus (waited {scraped_after:.1f} s once the webhook was done) and on the restart "
            f"annotation; "
            f"the hang's resolve ({resolved_at - restart_began:.1f} s after vLLM's restart began) names {signature}; "
            f"HangwatchWebhookRestarted carries it as a label (delivered {delivered - restart_began:.1f} s after it)")


def test_the_whole_chain_leaves_an_incident_with_the_stacks(wedgeable_vllm, docker_client, backend_image, tmp_path):
    """Wedged real vLLM → exporter → Prometheus → Alertmanager → webhook re-check → capture (asked
    of a forensics exporter beside vLLM) → restart on the real dockerd (of a stub container that
    shares nothing with vLLM) → an incident with the stacks and the signature → `incidents show`."""
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    server = wedgeable_vllm
    stub = Backend(docker_client, backend_image, tmp_path / "backends", mirror=server.log_path)  # vLLM's log
    stub.set_mode("idle")
    place = tmp_path / "forensics-exporter.yml"
    # vLLM runs on this host, not in the stub container: the exporter takes its processes from the pin
    # (its main PID and descendants), never from whatever listens on the port; the webhook's ask carries
    # the bearer token the exporter asks for.
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text(f"{server.proc.pid}\n")
    forensics_token = private_file(tmp_path / "forensics-token", "forensics-e2e-bearer-0123456789abcdef\n")
    place.write_text(json.dumps({"allow_targets": [server.url], "forensics": {
        "enabled": True, "token_file": str(forensics_token), "pins": [{"url": server.url, "pid_file": str(pid_file)}]},
        "liveness_interval": "1s", "liveness_timeout": "2s", "liveness_budget": "8s"}))
    token = private_file(tmp_path / "token", TOKEN + "\n")
    state_dir = tmp_path / "state"
    load, forensics_place, webhook, stack = None, None, None, None
    try:
        forensics_place = start_server("forensics-exporter", [*hangwatch_command(), "exporter", "--listen",
                                                              "127.0.0.1:0", "--config", str(place)],
                                       tmp_path / "forensics-exporter.log", "/metrics")
        config = tmp_path / "webhook.yml"
        config.write_text(json.dumps({
            "token_file": str(token), "state_dir": str(state_dir), "recheck": {"interval": "1s", "timeout": "2s"},
            "forensics_token_file": str(forensics_token),
            "targets": [{"name": "vllm-a", "container": stub.name, "url": server.url, "stop_timeout": "2s",
                         "forensics_url": forensics_place.url}]}))
        webhook = start_server("webhook", [*hangwatch_command(), "webhook", "--config", str(config), "--listen",
                                           "127.0.0.1:0"], tmp_path / "webhook.log", "/healthz")
        stack = Stack(tmp_path, scrape_interval=3.0, scrape_timeout=2.0, simulator=server,
                      containers={"vllm-a": stub.name}, hook_url=webhook.url + "/alerts", token_file=token,
                      extra_jobs={"hangwatch_webhook": webhook.url.split("//", 1)[1]}).start()
        if not os.path.exists(server.wedge_trigger):  # alone (-k): wedge it here; after the test above it is
            load = server.generations(n=2).__enter__()
            server.wait_until(lambda p: p.value("vllm:num_requests_running") == 2, 60, what="two running")
            open(server.wedge_trigger, "w").close()
        wedged_at = time.monotonic()
        wait_until(lambda: stub.restarts() >= 1, 150, "the stub container restarted", interval=0.5)
        restarted_after = time.monotonic() - wedged_at
        wait_until(lambda: requests.get(webhook.url + "/healthz", timeout=5).json()["jobs_in_progress"] == 0, 60,
                   "the webhook to finish its jobs")
        lines = [json.loads(line) for line in (state_dir / "ledger.jsonl").read_text().splitlines()]
        (restart,) = [e for e in lines if e.get("event") == "decision" and e["action"] == "restart"]
        assert restart["signature"] == "engine_step_stuck", restart
        # The log and the stacks together: vLLM's own line (the fault plugin wrote it as it wedged,
        # read through the container's Docker log before deciding) names the class and the policy.
        assert (restart["log_signature"], restart["class"], restart["policy"]) == (
            "vllm_shm_broadcast_stalled", "engine_wedge", "restart"), restart
        assert SAYS in restart["line"]
        assert "signature=engine_step_stuck" in webhook.log_tail(200)
        record = json.loads(open(restart["incident"]).read())
        assert record["signature"] == "engine_step_stuck" and record["forensics"]["verdict"] == "hung"
        assert record["forensics"]["pinned"] == f"pid_file {pid_file}", record["forensics"].get("errors")
        assert record["forensics"]["processes"][0]["pid"] == server.proc.pid
        assert record["forensics"]["netns"] == [os.readlink(f"/proc/{server.proc.pid}/ns/net")]
        assert record["log_signature"]["name"] == "vllm_shm_broadcast_stalled" and record["class"] == "engine_wedge"
        frames = {f["name"] for p in record["forensics"]["processes"] if p["name"].startswith("VLLM::EngineCore")
                  for t in p["threads"] for f in t["frames"]}
        assert any(name.endswith("hangwatch_fault_wedged_here") for name in frames), frames
        incident_id = os.path.basename(restart["incident"])[:-5]
        listed = subprocess.run([*hangwatch_command(), "incidents", "--state-dir", str(state_dir), "--json"],
                                capture_output=True, text=True, timeout=60)
        assert [(r["id"], r["target"], r["signature"], r["class"], r["policy"], r["outcome"])
                for r in json.loads(listed.stdout)] == [
            (incident_id, "vllm-a", "engine_step_stuck", "engine_wedge", "restart", "ok")]
        shown = subprocess.run([*hangwatch_command(), "incidents", "show", incident_id, "--state-dir",
                                str(state_dir)], capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "signature:  engine_step_stuck" in shown.stdout
        assert "log said:   vllm_shm_broadcast_stalled" in shown.stdout
        assert "hangwatch_fault_wedged_here" in shown.stdout
        print(f"wedged -> restarted (with the capture) in {restarted_after:.1f} s; {shape(record['forensics'])}")
        carried = signature_reaches_people(stack, server, "engine_step_stuck")
        print(f"signature carried: {carried}")
    except BaseException:
        if stack is not None:
            print(stack.logs())
        for process in (webhook, forensics_place):
            if process is not None:
                print(process.log_tail(60))
        raise
    finally:
        if load is not None:
            load.__exit__(None, None, None)
        if stack is not None:
            stack.close()
        for process in (webhook, forensics_place):
            if process is not None:
                process.stop()
        stub.remove()
