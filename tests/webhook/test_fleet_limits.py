"""Fleet-wide limits with fakes: a shared incident restarts one target of a group, not all;
a restart settles when its backend is seen healthy again (or after `recovery`); the fleet
budget caps restarts across targets; and both hold across two replicas sharing a state_dir."""
import json
import logging
import threading
import time

import pytest

from hangwatch.webhook import restarting as restarting_module

from .fakes import FakeClock, FakeRestarter, payload


def grouped(names, group="llama-70b", start=18000):
    return [{"name": n, "container": n, "url": f"http://127.0.0.1:{start + i}", "group": group}
            for i, n in enumerate(names)]


def reasons(h):
    return sorted((d["action"], d["reason"]) for d in h.decisions())


def metric(h, name, **labels) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    prefix = f"{name}{{{wanted}}} "
    line = next((line for line in h.client.get("/metrics").text.splitlines() if line.startswith(prefix)), None)
    assert line is not None, f"no series {prefix}"
    return float(line[len(prefix):])


def build(harness, targets, **config):
    """A harness whose fake restarter holds exactly the targets' containers."""
    clock = config.pop("clock", None) or FakeClock()
    restarter = config.pop("restarter", None) or FakeRestarter(clock, names=[t["container"] for t in targets])
    return harness(targets=targets, clock=clock, restarter=restarter, **config)


def restarted(h):
    return sorted(name for name, _ in h.restarter.restarts)


def test_a_shared_incident_restarts_one_target_of_a_group_and_leaves_the_rest_to_people(harness, caplog):
    caplog.set_level(logging.INFO, logger="hangwatch.webhook")
    names = ["r1", "r2", "r3"]
    h = build(harness, grouped(names), group_limit=1)
    body = payload(*(h.alert(target=n, container=n) for n in names))  # a driver fault hangs every replica
    assert h.post(body).status_code == 200
    h.settle()
    assert len(h.restarter.restarts) == 1
    assert reasons(h) == [("restart", "hung"), ("skip", "group_limit"), ("skip", "group_limit")]
    first = h.restarter.restarts[0][0]
    withheld = sorted(set(names) - {first})
    for name in withheld:
        assert metric(h, "hangwatch_webhook_restarts_withheld_total", group="llama-70b", limit="group", target=name) == 1
    assert metric(h, "hangwatch_webhook_restarts_withheld_total", group="llama-70b", limit="group", target=first) == 0
    assert metric(h, "hangwatch_webhook_group_restarting", group="llama-70b") == 1
    assert metric(h, "hangwatch_webhook_decisions_total", action="skip", reason="group_limit") == 2
    # People are told at error level, on the decision line (its key=value fields are the interface,
    # docs/runbook.md); why, in the ledger's decision records (files on disk, `hangwatch incidents`).
    errors = [r.getMessage() for r in caplog.records
              if r.levelno == logging.ERROR and "reason=group_limit" in r.getMessage()]
    assert len(errors) == 2
    details = [d["detail"] for d in h.decisions() if d["reason"] == "group_limit"]
    assert len(details) == 2 and all("llama-70b" in d and first in d for d in details), details
    # ... and Alertmanager's next re-send (the backend still hung, the restart not settled) is refused too
    h.clock.advance(60)
    h.post(payload(h.alert(target=withheld[0], container=withheld[0])))
    h.settle()
    assert len(h.restarter.restarts) == 1


def test_a_restart_settles_when_its_backend_answers_again_and_frees_the_groups_slot(harness):
    names = ["r1", "r2"]
    h = build(harness, grouped(names))
    real_restart = h.restarter.restart

    def restart_and_heal(container, stop_timeout):  # the new process serves again
        real_restart(container, stop_timeout)
        h.rechecker.by_url["http://127.0.0.1:18000"] = "idle"

    h.restarter.restart = restart_and_heal
    h.post(payload(h.alert(target="r1", container="r1")))
    h.settle()
    assert h.state.policy.wait_watches(10)
    recovered = [json.loads(line) for line in (h.state_dir / "ledger.jsonl").read_text().splitlines()
                 if '"recovered"' in line]
    assert [(r["target"], r["verdict"]) for r in recovered] == [("r1", "idle")]
    assert metric(h, "hangwatch_webhook_group_restarting", group="llama-70b") == 0
    h.post(payload(h.alert(target="r2", container="r2")))  # another replica hangs later
    h.settle()
    assert restarted(h) == ["r1", "r2"]
    assert reasons(h) == [("restart", "hung"), ("restart", "hung")]


def test_a_restart_that_never_recovers_holds_the_slot_for_recovery_then_frees_it(harness):
    names = ["r1", "r2"]
    h = build(harness, grouped(names), recovery="10m", cooldown="0s")
    h.post(payload(h.alert(target="r1", container="r1")))
    h.settle()
    h.clock.advance(9 * 60)
    h.post(payload(h.alert(target="r2", container="r2")))
    h.settle()
    assert restarted(h) == ["r1"]  # r1 still hung after 9 minutes: r2 is left to people
    h.clock.advance(61)
    assert h.state.policy.wait_watches(10), "the watch ends once recovery has passed"
    h.post(payload(h.alert(target="r2", container="r2")))
    h.settle()
    assert restarted(h) == ["r1", "r2"]
    assert [r for _, r in sorted((d["at"], d["reason"]) for d in h.decisions())] == ["hung", "group_limit", "hung"]


def test_a_share_of_the_group(harness):
    names = [f"r{i}" for i in range(4)]
    h = build(harness, grouped(names), group_limit="50%")
    h.post(payload(*(h.alert(target=n, container=n) for n in names)))
    h.settle()
    assert len(h.restarter.restarts) == 2
    assert reasons(h) == [("restart", "hung")] * 2 + [("skip", "group_limit")] * 2


def test_groups_are_limited_apart_and_targets_without_a_group_only_by_the_fleet_budget(harness):
    targets = grouped(["a1", "a2"], group="a") + grouped(["b1", "b2"], group="b", start=18100) + [
        {"name": "solo1", "container": "solo1", "url": "http://127.0.0.1:18200"},
        {"name": "solo2", "container": "solo2", "url": "http://127.0.0.1:18201"}]
    names = [t["name"] for t in targets]
    h = build(harness, targets)
    h.post(payload(*(h.alert(target=n, container=n) for n in names)))
    h.settle()
    done = restarted(h)
    assert len(done) == 4 and {"solo1", "solo2"} <= set(done)
    assert len({"a1", "a2"} & set(done)) == 1 and len({"b1", "b2"} & set(done)) == 1


def test_the_fleet_budget_caps_restarts_across_all_targets(harness):
    names = ["s1", "s2", "s3"]
    targets = [{"name": n, "container": n, "url": f"http://127.0.0.1:{18000 + i}"} for i, n in enumerate(names)]
    h = build(harness, targets, fleet_budget={"restarts": 2, "window": "1h"})
    h.post(payload(*(h.alert(target=n, container=n) for n in names)))
    h.settle()
    assert len(h.restarter.restarts) == 2
    assert reasons(h) == [("restart", "hung"), ("restart", "hung"), ("skip", "fleet_limit")]
    left = (set(names) - set(restarted(h))).pop()
    assert metric(h, "hangwatch_webhook_restarts_withheld_total", group="", limit="fleet", target=left) == 1
    fleet = [d for d in h.decisions() if d["reason"] == "fleet_limit"][0]
    assert "2 restarts across the fleet within 3600s (fleet_budget 2)" in fleet["detail"]
    h.clock.advance(3601)  # the window slides past both
    h.post(payload(h.alert(target=left, container=left)))
    h.settle()
    assert len(h.restarter.restarts) == 3


def test_two_replicas_sharing_a_state_dir_hold_the_group_limit(harness, tmp_path, monkeypatch):
    """Each replica gets the alert of a different replica of one model at the same moment; the
    check-and-record under the fleet lock lets exactly one restart through. (Without the lock,
    with the incident write slowed, both restarted.)"""
    real_write = restarting_module.write_incident
    slowed = []

    def slow_write(*args, **kwargs):  # widen the window between the check and the record
        slowed.append(args)
        time.sleep(0.3)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(restarting_module, "write_incident", slow_write)
    names = ["r1", "r2"]
    first = build(harness, grouped(names), state_dir=tmp_path / "shared")
    shared_restarter = first.restarter
    second = build(harness, grouped(names), restarter=shared_restarter, clock=first.clock, state_dir=tmp_path / "shared")
    gate = threading.Event()
    first.rechecker.gate = second.rechecker.gate = gate
    assert first.post(payload(first.alert(target="r1", container="r1"))).status_code == 200
    assert second.post(payload(second.alert(target="r2", container="r2"))).status_code == 200
    gate.set()
    first.settle()
    second.settle()
    assert len(shared_restarter.restarts) == 1
    assert reasons(first) == [("restart", "hung"), ("skip", "group_limit")]  # one ledger, both replicas
    # The slowed write must be the one on the restart path, or the window was never widened and
    # the lock proved nothing (the incident write moved: slow the call that replaced it).
    assert len(slowed) == 1, "the slowed incident write was not on the restart path"
    assert len(list((tmp_path / "shared" / "incidents").glob("*.json"))) == 1


@pytest.mark.parametrize("group_limit", [1, "100%"])
def test_dry_run_records_no_restart_so_it_never_holds_a_slot(harness, group_limit):
    names = ["r1", "r2"]
    h = build(harness, grouped(names), group_limit=group_limit, dry_run=True)
    h.post(payload(*(h.alert(target=n, container=n) for n in names)))
    h.settle()
    assert h.restarter.restarts == [] and reasons(h) == [("restart", "hung")] * 2
