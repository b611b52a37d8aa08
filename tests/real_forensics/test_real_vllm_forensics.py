"""`hangwatch forensics` on a real vLLM: refused while it serves, the stacks and the right signature
when it hangs — a SIGSTOP'd EngineCore ("process stopped") and an EngineCore wedged in a named
function by the fault plugin ("engine step stuck", naming the function)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.real.vllm_server import proc_title

pytestmark = pytest.mark.real

CHECK = ["--interval", "1", "--timeout", "3"]


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
