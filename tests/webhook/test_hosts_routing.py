"""Many Docker hosts, one webhook, with a fake restarter per host: each alert acts on its own
host's container (same container names on both), every check is judged on that host, and a
host that is down or hangs is a 503 for its own targets only, never a delay for the others."""
import concurrent.futures
import json
import logging
import time

from hangwatch.demo.wait import wait_until
from hangwatch.webhook.lookups import SLOTS

from .fakes import FakeClock, FakeRestarter, auth, iso, payload

HOSTS = {"gpu-2": {"url": "tcp://gpu-2.example:2375", "insecure_tcp": True}}
TARGETS = [{"name": "here", "container": "vllm", "url": "http://127.0.0.1:18000"},
           {"name": "there", "container": "vllm", "url": "http://127.0.0.1:18001", "docker_host": "gpu-2"}]


def two_hosts(harness, **config):
    clock = FakeClock()
    restarters = {"default": FakeRestarter(clock, names=["vllm"]), "gpu-2": FakeRestarter(clock, names=["vllm"])}
    h = harness(targets=TARGETS, docker_hosts=HOSTS, clock=clock, restarter=restarters, **config)
    return h, restarters["default"], restarters["gpu-2"]


def alert(h, name, **kwargs):
    return h.alert(target=name, container="vllm", **kwargs)


def decisions(h):
    return [(d["target"], d["docker_host"], d["reason"]) for d in h.decisions()]


def test_each_alert_restarts_the_container_on_its_own_host(harness, caplog):
    caplog.set_level(logging.INFO, logger="hangwatch.webhook")
    h, here, there = two_hosts(harness)
    assert h.post(payload(alert(h, "there"))).get_json()["queued"] == ["there"]
    h.settle()
    assert (here.restarts, there.restarts) == ([], [("vllm", 30)])
    assert here.gets == [] and there.gets  # the local host was never even asked
    h.post(payload(alert(h, "here")))
    h.settle()
    assert (here.restarts, there.restarts) == ([("vllm", 30)], [("vllm", 30)])
    assert decisions(h) == [("there", "gpu-2", "hung"), ("here", "default", "hung")]
    restarts = [json.loads(line) for line in (h.state_dir / "ledger.jsonl").read_text().splitlines()
                if '"event": "restart"' in line]
    assert [(r["target"], r["docker_host"], r["container"]) for r in restarts] == [
        ("there", "gpu-2", "vllm"), ("here", "default", "vllm")]
    incidents = sorted(json.loads(p.read_text())["docker_host"] for p in (h.state_dir / "incidents").glob("*.json"))
    assert incidents == ["default", "gpu-2"]
    assert any("target=there container=vllm action=restart reason=hung" in r.getMessage()
               and "docker_host=gpu-2" in r.getMessage() for r in caplog.records)


def test_already_restarted_is_judged_on_the_targets_own_host(harness):
    h, here, there = two_hosts(harness)
    there.by_name["vllm"].state["StartedAt"] = iso(h.clock() - 10)  # restarted on gpu-2 after the alert began
    h.post(payload(alert(h, "there"), alert(h, "here")))              # (the local one is an hour old)
    h.settle()
    assert (here.restarts, there.restarts) == ([("vllm", 30)], [])
    assert sorted(decisions(h)) == [("here", "default", "hung"), ("there", "gpu-2", "already_restarted")]


def test_cooldown_and_budget_are_per_target_wherever_it_lives(harness):
    h, here, there = two_hosts(harness, cooldown="0s", budget={"restarts": 1, "window": "1h"})
    for _ in range(2):
        h.post(payload(alert(h, "there")))
        h.settle()
        h.clock.advance(120)
    h.post(payload(alert(h, "here")))
    h.settle()
    assert (len(here.restarts), len(there.restarts)) == (1, 1)
    assert decisions(h) == [("there", "gpu-2", "hung"), ("there", "gpu-2", "circuit_open"), ("here", "default", "hung")]


def test_an_unreachable_host_is_503_for_its_own_targets_only(harness):
    h, here, there = two_hosts(harness)
    there.down = True
    answer = h.post(payload(alert(h, "there")))
    assert answer.status_code == 503 and answer.get_json()["unreachable"] == ["there"]
    answer = h.post(payload(alert(h, "here")))
    assert answer.status_code == 200 and answer.get_json()["queued"] == ["here"]
    h.settle()
    h.clock.advance(60)
    # one notification holding both (a coarser group_by): the reachable one is queued all the same
    answer = h.post(payload(alert(h, "here", starts_at=iso(h.clock() - 30)), alert(h, "there")))
    assert answer.status_code == 503
    assert answer.get_json()["queued"] == ["here"] and answer.get_json()["unreachable"] == ["there"]
    h.settle()
    assert here.restarts == [("vllm", 30)] and there.restarts == []
    seen = decisions(h)
    assert seen[:2] == [("there", "gpu-2", "docker_unreachable"), ("here", "default", "hung")]
    assert sorted(seen[2:]) == [("here", "default", "cooldown"), ("there", "gpu-2", "docker_unreachable")]


def test_a_host_that_hangs_never_delays_another_hosts_lookups(harness):
    """Before: one pool of four threads for every lookup, so six lookups stuck on a hung host
    made the healthy host's alerts wait too, and answer 503."""
    h, here, there = two_hosts(harness)
    there.delay = 3.0  # accepts, then says nothing for 3 s (each call)
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        stuck = [pool.submit(h.app.test_client().post, "/alerts", json=payload(alert(h, "there")), headers=auth())
                 for _ in range(6)]
        # the hung host's lookups are under way: every slot of its pool is held
        wait_until(lambda: len(there.gets) >= SLOTS, 5, "the hung host's lookups to fill its slots", interval=0.01)
        started = time.monotonic()
        answer = h.post(payload(alert(h, "here")))
        took = time.monotonic() - started
        codes = [f.result(timeout=10).status_code for f in stuck]
    assert answer.status_code == 200 and answer.get_json()["queued"] == ["here"]
    # Waiting behind the hung host would cost its whole 3 s silence: half of it is a generous bound.
    assert took < there.delay / 2, f"the healthy host's alert waited {took:.2f}s"
    assert codes == [503] * 6
    h.settle()
    assert here.restarts == [("vllm", 30)] and there.restarts == []
