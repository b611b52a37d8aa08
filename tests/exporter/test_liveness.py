"""/livez and /readyz on the exporter, and `hangwatch check --liveness`, against the simulator.

What a kubelet relies on: 503 from /livez only for hung (never for a pod loading weights, a
long prefill or a server hangwatch cannot read); an answer always inside the budget; no
request to a backend with work in flight; concurrent calls for one target sharing one check
(counted by the simulator, which counts every inference request it receives); and the same
target validation and allowlist as /probe.
"""
import asyncio
import json
import re
import threading
import time

import pytest
import requests

from hangwatch.cli import main as hangwatch_main
from hangwatch.exporter.config import ConfigError, ExporterConfig, exporter_config
from hangwatch.exporter.health import ChecksFull, SharedChecks
from hangwatch.liveness import Bounded, bounded_check, liveness, needed_budget, readiness
from hangwatch.simulator import Simulator
from tests.support.pages import Page, PageServer
from tests.test_reading import VLLM_TWO_ENGINES

# Short readings for unit tests: hung is reachable in needed_budget(0.3, 0.3) = 1.2 s.
FAST = {"liveness_interval": "300ms", "liveness_timeout": "300ms", "liveness_budget": "1500ms"}
BUDGET = 1.5


@pytest.fixture
def sim():
    simulator = Simulator().start()
    yield simulator
    simulator.thaw()
    simulator.stop()


@pytest.fixture
def exporter(exporters):
    return exporters(exporter_config(FAST))[1]


def ask(exporter, endpoint, target, module=None):
    params = {"target": target} | ({"module": module} if module else {})
    started = time.monotonic()
    answer = requests.get(f"{exporter}/{endpoint}", params=params, timeout=10)
    return answer, time.monotonic() - started


def both(exporter, target):
    """(livez code, readyz code, livez body), each answered within the budget."""
    live, live_s = ask(exporter, "livez", target)
    ready, ready_s = ask(exporter, "readyz", target)
    assert live_s < BUDGET + 0.5 and ready_s < BUDGET + 0.5, (live_s, ready_s)
    return live.status_code, ready.status_code, live.json()


# -- what each state answers ---------------------------------------------------------------------
def test_idle_backend_is_live_and_ready_after_one_probe_each(exporter, sim):
    live, ready, body = both(exporter, sim.url)
    assert (live, ready) == (200, 200)
    assert (body["verdict"], body["probe_sent"], body["ok"]) == ("idle", True, True)
    assert sim.inference_requests == 2  # one check per call (these two did not overlap)


@pytest.mark.parametrize("state, params", [("busy", {"n": 4}), ("saturated", {}),
                                           ("long_prefill", {"prompt_tokens": 30000})])
def test_loaded_backend_is_live_and_ready_and_never_probed(exporter, sim, state, params):
    sim.set_state(state, **params)
    assert sim.wait_for(lambda: sim.running > 0)
    before = sim.inference_requests
    for _ in range(3):
        live, ready, body = both(exporter, sim.url)
        assert (live, ready) == (200, 200), body["why"]
        assert body["verdict"] == "busy" and body["probe_sent"] is False
    assert sim.inference_requests == before


def test_frozen_engine_with_work_in_flight_is_503_within_one_call(exporter, sim):
    sim.set_state("busy", n=3)
    assert sim.wait_for(lambda: sim.running == 3)
    sim.freeze()
    before = sim.inference_requests
    live, ready, body = both(exporter, sim.url)
    assert (live, ready) == (503, 503)
    assert body["verdict"] == "hung" and body["readings"] == 3 and body["probe_sent"] is False
    assert sim.inference_requests == before
    sim.thaw()
    assert both(exporter, sim.url)[:2] == (200, 200)


def test_frozen_idle_engine_is_503_after_two_failed_probes(exporter, sim):
    sim.set_state("frozen_idle")
    live, ready, body = both(exporter, sim.url)
    assert (live, ready) == (503, 503)
    assert "probe failed 2 times" in body["why"]


def test_wedged_process_is_503(exporter, sim):
    sim.set_state("unresponsive")
    live, ready, body = both(exporter, sim.url)
    assert (live, ready) == (503, 503)
    assert "server process is wedged" in body["why"]


@pytest.mark.parametrize("state, verdict", [("dead", "down"), ("metrics_missing", "blind"),
                                            ("metrics_garbage", "blind"), ("asleep", "idle")])
def test_backend_that_cannot_serve_but_is_not_hung_is_live_and_not_ready(exporter, sim, state, verdict):
    sim.set_state(state)
    live, ready, body = both(exporter, sim.url)
    assert (live, ready, body["verdict"]) == (200, 503, verdict), body["why"]


def test_restarted_backend_is_live_and_ready_once_it_answers(exporter, sim):
    sim.set_state("dead")
    assert both(exporter, sim.url)[:2] == (200, 503)  # loading weights: never killed, not in rotation
    sim.revive()
    assert both(exporter, sim.url)[:2] == (200, 200)


# -- sharing -------------------------------------------------------------------------------------
def test_concurrent_calls_for_one_target_share_one_check(exporter, sim):
    """A frozen idle engine holds the check's first probe: every call made meanwhile joins it."""
    sim.set_state("frozen_idle")
    answers = []

    def call(endpoint):
        answers.append((endpoint, *ask(exporter, endpoint, sim.url)))

    first = threading.Thread(target=call, args=("livez",))
    first.start()
    assert sim.wait_for(lambda: sim.inference_requests == 1, timeout=2), "the first probe did not arrive"
    others = [threading.Thread(target=call, args=(("livez", "readyz")[i % 2],)) for i in range(7)]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(10)
    assert len(answers) == 8
    assert sim.inference_requests == 2, "each call sent its own probes"
    assert {(endpoint, answer.status_code) for endpoint, answer, _ in answers} == {("livez", 503), ("readyz", 503)}
    assert sorted(answer.json()["shared"] for _, answer, _ in answers) == [False] + [True] * 7
    assert all(seconds < BUDGET * 3 for _, _, seconds in answers)  # at the budget (generously), not after it


def test_shared_check_that_overruns_answers_at_its_deadline_and_is_never_doubled():
    async def scenario():
        release, calls = asyncio.Event(), []

        async def run(target, module, options):
            calls.append(target)
            await asyncio.wait_for(release.wait(), 10)
            return None

        checks = SharedChecks(run, budget=0.3)
        started = time.monotonic()
        assert await checks.result("http://a:1", "backend") == (None, False)
        waited = time.monotonic() - started
        assert 0.25 < waited < 5.0  # its budget, not the 10 s the check is held
        late = time.monotonic()
        assert await checks.result("http://a:1", "backend") == (None, True)  # still running: no second check
        assert time.monotonic() - late < 5.0 and len(calls) == 1
        assert liveness(None).ok and not readiness(None).ok
        release.set()
        deadline = time.monotonic() + 5
        while (await checks.result("http://a:1", "backend"))[1] and time.monotonic() < deadline:
            await asyncio.sleep(0)
        assert len(calls) == 2  # a new check once the overrunning one ended
        release.set()
    asyncio.run(scenario())


def test_no_more_checks_than_most_run_at_once_and_a_running_one_is_still_shared():
    async def scenario():
        release, calls = asyncio.Event(), []

        async def run(target, module, options):
            calls.append(target)
            await asyncio.wait_for(release.wait(), 10)
            return target

        checks = SharedChecks(run, budget=5.0, most=2)
        first = [asyncio.ensure_future(checks.result(f"http://{host}:1", "backend")) for host in "ab"]
        await asyncio.sleep(0.05)
        with pytest.raises(ChecksFull):
            await checks.result("http://c:1", "backend")
        shared = asyncio.ensure_future(checks.result("http://a:1", "backend"))
        await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(*first, shared) == [("http://a:1", False), ("http://b:1", False),
                                                         ("http://a:1", True)]
        assert await checks.result("http://c:1", "backend") == ("http://c:1", False)  # room again
        assert calls == ["http://a:1", "http://b:1", "http://c:1"]
    asyncio.run(scenario())


def test_concurrent_callers_share_one_check_task_and_no_thread():
    """/livez and /readyz callers await one task on the loop: no thread per check."""
    async def scenario():
        release, calls = asyncio.Event(), []

        async def run(target, module, options):
            calls.append(target)
            await release.wait()
            return "outcome"

        checks = SharedChecks(run, budget=5.0)
        before = threading.active_count()
        callers = [asyncio.ensure_future(checks.result("http://a:1", "backend")) for _ in range(8)]
        await asyncio.sleep(0.05)
        assert threading.active_count() == before and len(calls) == 1
        release.set()
        answers = await asyncio.gather(*callers)
        assert sorted(shared for _, shared in answers) == [False] + [True] * 7
        assert all(outcome == "outcome" for outcome, _ in answers)
    asyncio.run(scenario())


# -- the budget ----------------------------------------------------------------------------------
def test_bounded_check_stops_before_the_budget_and_is_never_hung_for_it():
    backend = PageServer()
    try:
        backend.pages["/metrics"] = Page(VLLM_TWO_ENGINES.encode())  # 6 in flight, nothing moves
        bounded = bounded_check(backend.url, interval=0.2, timeout=0.2, budget=1.0, grace=30)
    finally:
        backend.stop()
    assert not bounded.complete and bounded.seconds <= 1.0
    assert bounded.verdict.state == "busy" and len(bounded.result.observations) >= 3
    assert liveness(bounded).ok and "budget ended the check" in liveness(bounded).why
    assert not any(method == "POST" for method, _ in backend.requests)


def test_budget_too_small_to_reach_hung_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"^liveness_budget: .*needs at least .* = 8s"):
        exporter_config({"liveness_budget": "5s"})
    with pytest.raises(ConfigError, match=r"^liveness_interval: "):
        exporter_config({"liveness_interval": 2})
    assert needed_budget(2, 2) == 8 and ExporterConfig().liveness_budget >= needed_budget(2, 2)


# -- not an open relay ---------------------------------------------------------------------------
@pytest.mark.parametrize("endpoint", ["livez", "readyz"])
def test_bad_and_forbidden_targets_are_refused_without_a_request(endpoint, exporters):
    backend = PageServer()
    _, url = exporters(exporter_config(FAST | {"allow_targets": [backend.url]}))
    elsewhere = backend.url.replace("127.0.0.1", "localhost")  # the same server, not on the list
    try:
        assert requests.get(f"{url}/{endpoint}", timeout=5).status_code == 400
        assert ask(url, endpoint, backend.url.replace("//", "//user:pw@"))[0].status_code == 400
        assert ask(url, endpoint, backend.url, module="nope")[0].status_code == 400
        assert ask(url, endpoint, elsewhere)[0].status_code == 403
        assert backend.requests == []
        assert ask(url, endpoint, backend.url)[0].status_code in (200, 503)  # allowed: checked
        assert backend.requests
    finally:
        backend.stop()


# -- hangwatch check --liveness --------------------------------------------------------------------
# A reading's timeout well above what a loaded two-core machine takes to answer a /metrics read
# (0.3 s once timed out under the fast tier, and a hung backend read as something else).
TIMEOUT = 2.0


def liveness_exit(url, capsys, *extra):
    code = hangwatch_main(["check", url, "--liveness", "--interval", "0.3", "--timeout", str(TIMEOUT), "--json", *extra])
    body = json.loads(capsys.readouterr().out)
    assert body["exit_code"] == code and body["live"] is (code == 0)
    return code, body


@pytest.mark.parametrize("state, verdict", [("idle", "idle"), ("dead", "down"), ("metrics_missing", "blind")])
def test_check_liveness_exits_zero_for_anything_but_hung(sim, capsys, state, verdict):
    sim.set_state(state)
    code, body = liveness_exit(sim.url, capsys)
    assert (code, body["verdict"]) == (0, verdict)


def test_check_liveness_exits_one_for_hung_within_its_budget(sim, capsys):
    sim.set_state("busy", n=2)
    assert sim.wait_for(lambda: sim.running == 2)
    sim.freeze()
    started = time.monotonic()
    code, body = liveness_exit(sim.url, capsys)
    assert (code, body["verdict"]) == (1, "hung")
    assert time.monotonic() - started < needed_budget(0.3, TIMEOUT) * 2  # its budget, generously


def test_readiness_and_liveness_of_a_complete_check_follow_the_verdict():
    from hangwatch.check import CheckResult
    from hangwatch.observe import Observation
    from hangwatch.verdict import Verdict
    down = Bounded(CheckResult(Verdict("down", "connection refused"), "backend",
                               (Observation(0.0, "refused", error="connection refused"),)), True, 0.0)
    assert liveness(down).ok and not readiness(down).ok


def test_a_livez_awaiting_its_check_holds_no_probe_slot(exporters, sim):
    """A /livez check mostly waits (here, for a frozen engine's probes to time out, 1 s each): the
    request holds no slot meanwhile, so with one slot a /probe of another target is answered
    while the /livez is still waiting."""
    slow = {"liveness_interval": "1s", "liveness_timeout": "1s", "liveness_budget": "5s", "max_concurrent_probes": 1}
    _, url = exporters(exporter_config(slow))
    other = Simulator().start()
    done = {}
    try:
        sim.set_state("frozen_idle")

        def livez():
            done["livez"] = ask(url, "livez", sim.url)[0]
        thread = threading.Thread(target=livez)
        thread.start()
        assert sim.wait_for(lambda: sim.inference_requests == 1, timeout=5), "the check's first probe did not arrive"
        probe = requests.get(f"{url}/probe", params={"target": other.url}, timeout=10)
        livez_answered_first = "livez" in done
        thread.join(15)
    finally:
        other.stop()
    assert probe.status_code == 200 and "hangwatch_probe_success 1.0" in probe.text, probe.text[:300]
    assert not livez_answered_first, "the /probe waited for the slot the /livez held through its check"
    assert done["livez"].status_code == 503


@pytest.mark.parametrize("listed", [None, "allow_targets", "targets"])
def test_checks_of_unlisted_targets_are_bounded_by_the_probe_slots(exporters, sim, listed):
    """A check outlives its callers, so targets the config does not list could start checks
    without end: at most max_concurrent_probes checks of unlisted targets run at once, and a call
    for one more is answered overloaded (alive, not ready, not a verdict) without reading it.
    Targets listed in allow_targets or targets bound their own checks: every one is checked."""
    other, unread = Simulator().start(), PageServer()  # (a PageServer counts the connections it accepts)
    settings = {"liveness_interval": "1s", "liveness_timeout": "1s", "liveness_budget": "5s", "max_concurrent_probes": 1}
    if listed == "allow_targets":
        settings["allow_targets"] = [sim.url, other.url]
    elif listed == "targets":  # (any target is allowed on loopback; these two are listed)
        settings["targets"] = [{"url": sim.url}, {"url": other.url}]
    _, url = exporters(exporter_config(settings))
    second = other.url if listed else unread.url
    done = {}
    try:
        sim.set_state("frozen_idle")
        thread = threading.Thread(target=lambda: done.setdefault("first", ask(url, "livez", sim.url)[0]))
        thread.start()
        assert sim.wait_for(lambda: sim.inference_requests == 1, timeout=5), "the first check's probe did not arrive"
        before = health_answers(url)
        live, ready = ask(url, "livez", second)[0], ask(url, "readyz", second)[0]
        counted = {key: value - before.get(key, 0) for key, value in health_answers(url).items()}
        running = "first" not in done  # (after the count: the first check's answer is not in it)
        thread.join(15)
    finally:
        other.stop()
        unread.stop()
    assert running, "the first check ended before the second target was asked: nothing was bounded"
    assert done["first"].status_code == 503  # its own verdict (hung), unchanged by the other calls
    if listed:
        assert (live.status_code, ready.status_code) == (200, 200), (live.text, ready.text)
        assert live.json()["verdict"] == "idle"
    else:
        assert (live.status_code, ready.status_code) == (200, 503), (live.text, ready.text)
        assert live.text.startswith("overloaded") and ready.text.startswith("overloaded")
        assert unread.connections == 0  # not read at all
    assert {key: n for key, n in counted.items() if n} == {("livez", "200"): 1, ("readyz", str(ready.status_code)): 1}


def health_answers(url) -> dict[tuple[str, str], float]:
    """The exporter's ``hangwatch_exporter_health_answers_total`` by (endpoint, code)."""
    found = re.findall(r'hangwatch_exporter_health_answers_total\{code="(\d+)",endpoint="(\w+)"\} (\S+)',
                       requests.get(f"{url}/metrics", timeout=5).text)
    return {(endpoint, code): float(value) for code, endpoint, value in found}
