"""``startup_deadline`` on a real vLLM 0.32 start-up: past it the sidecar says so, and /livez
fails only because the config opts in; once vLLM answers, the streak ends and all is 200.

The exporter runs as its own process, as a sidecar does, with the deadline short enough to pass
while the real server loads (its port is closed for about a minute on this machine).
"""
import threading
import time

import pytest
import requests

from hangwatch.demo.chain import hangwatch_command
from hangwatch.demo.processes import start_server

pytestmark = pytest.mark.real

DEADLINE = 10.0


@pytest.fixture(scope="module")
def exporter(tmp_path_factory):
    work = tmp_path_factory.mktemp("startup")
    config = work / "exporter.yml"
    config.write_text(f"startup_deadline: {{after: {DEADLINE:g}s, fails_liveness: true}}\n")
    process = start_server("exporter", [*hangwatch_command(), "exporter", "--listen", "127.0.0.1:0",
                                        "--config", str(config)], work / "exporter.log", "/metrics")
    yield process.url
    process.stop()


def test_a_real_start_up_past_the_deadline_fails_liveness_by_opt_in_then_recovers(real_vllm, exporter):
    real_vllm.thaw()
    real_vllm.wait_idle(60)
    seen, stop = [], threading.Event()

    def kubelet():
        while not stop.is_set():
            for endpoint in ("livez", "readyz"):
                answer = requests.get(f"{exporter}/{endpoint}", params={"target": real_vllm.url}, timeout=10)
                seen.append((time.monotonic(), endpoint, answer.status_code, answer.json()))
            stop.wait(1.0)

    poller = threading.Thread(target=kubelet, daemon=True)
    real_vllm.stop()
    closed_at = time.monotonic()
    poller.start()
    try:
        real_vllm.start()  # from the main thread: the server dies with the thread that started it
    finally:
        stop.set()
        poller.join(20)
    down = [(at - closed_at, endpoint, code, body) for at, endpoint, code, body in seen if body["verdict"] == "down"]
    past = [(t, endpoint, code) for t, endpoint, code, body in down if "past startup_deadline" in body["why"]]
    within = [(t, endpoint, code) for t, endpoint, code, body in down if "past startup_deadline" not in body["why"]]
    print(f"{len(down)} calls while down, {len(past)} past the deadline; loading took "
          f"{max(t for t, *_ in down):.0f}s")
    assert within and all(code == (200 if endpoint == "livez" else 503) for _, endpoint, code in within)
    assert past, "the start-up ended before the deadline: nothing was proven"
    assert all(t > DEADLINE - 1 for t, *_ in past)  # never early (the streak starts at the first down call)
    assert {(endpoint, code) for _, endpoint, code in past} == {("livez", 503), ("readyz", 503)}
    live = requests.get(f"{exporter}/livez", params={"target": real_vllm.url}, timeout=10)
    ready = requests.get(f"{exporter}/readyz", params={"target": real_vllm.url}, timeout=10)
    assert (live.status_code, ready.status_code) == (200, 200), (live.json()["why"], ready.json()["why"])
