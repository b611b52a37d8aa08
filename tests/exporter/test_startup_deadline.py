"""``startup_deadline``: a server that never finishes loading is reported, and restarted only by opt-in.

vLLM can wait forever for its engine to start (vLLM #17676), port closed all the while: hangwatch
reads that as ``down``, which /livez must keep alive (loading weights takes minutes). With
``startup_deadline`` the sidecar remembers how long a target has been down without a break:
past it /readyz says so, and /livez fails only where ``fails_liveness: true`` opts in, for the
kubelet's restart window, after which a new process gets a new deadline.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from hangwatch.demo.wait import wait_until
from hangwatch.exporter.config import ConfigError, exporter_config
from hangwatch.liveness import RESTART_WINDOW, StartupClock, StartupDeadline
from harness.ports import closed_port

FAST = {"liveness_interval": "300ms", "liveness_timeout": "300ms", "liveness_budget": "1500ms"}


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_duration_or_a_mapping_is_a_startup_deadline():
    assert exporter_config({"startup_deadline": "20m"}).startup_deadline == StartupDeadline(1200.0, False)
    assert exporter_config({"startup_deadline": {"after": "90s", "fails_liveness": True}}).startup_deadline == \
        StartupDeadline(90.0, True)
    assert exporter_config({}).startup_deadline is None


@pytest.mark.parametrize("value, path", [
    ("soon", "startup_deadline"), (True, "startup_deadline"), ("0s", "startup_deadline"),
    ({"fails_liveness": True}, "startup_deadline.after"), ({"after": "1m", "restart": True}, "startup_deadline.restart"),
    ({"after": "1m", "fails_liveness": "perhaps"}, "startup_deadline.fails_liveness"),
])
def test_a_bad_startup_deadline_is_a_config_error_naming_the_key(value, path):
    with pytest.raises(ConfigError, match=rf"^{path}\b"):
        exporter_config({"startup_deadline": value})


def test_the_exporter_refuses_a_bad_startup_deadline_at_start(tmp_path):
    config = tmp_path / "exporter.yml"
    config.write_text("startup_deadline: {after: 10m, fails_livenes: true}\n")
    done = subprocess.run([sys.executable, "-m", "hangwatch", "exporter", "--listen", "127.0.0.1:0", "--config",
                           str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 64 and "startup_deadline.fails_livenes" in done.stderr, done.stderr


def test_the_clock_counts_one_unbroken_streak_of_down():
    clock = FakeClock()
    startup = StartupClock(StartupDeadline(60.0), clock)
    assert startup.overdue("a", "down") is None
    clock.now += 59
    assert startup.overdue("a", "down") is None
    clock.now += 2
    assert startup.overdue("a", "down") == pytest.approx(61)
    assert startup.overdue("b", "down") is None  # per target
    assert startup.overdue("a", "idle") is None  # it answered: the streak ends
    clock.now += 120
    assert startup.overdue("a", "down") is None  # a new streak
    clock.now += 10_000
    assert startup.overdue("a", "down") == pytest.approx(10_000)  # without fails_liveness: past it for good


def test_after_the_restart_window_a_server_still_down_gets_a_new_deadline():
    clock = FakeClock()
    startup = StartupClock(StartupDeadline(60.0, fails_liveness=True), clock)
    startup.overdue("a", "down")
    clock.now += 61
    assert startup.overdue("a", "down") is not None
    clock.now += RESTART_WINDOW
    assert startup.overdue("a", "down") is None  # the kubelet has restarted it by now: a new process loads
    clock.now += 59
    assert startup.overdue("a", "down") is None
    clock.now += 2
    assert startup.overdue("a", "down") is not None


def ask(url, endpoint, target):
    return requests.get(f"{url}/{endpoint}", params={"target": target}, timeout=10)


@pytest.mark.parametrize("fails_liveness", [False, True])
def test_a_server_still_loading_past_the_deadline_is_not_ready_and_fails_liveness_only_by_opt_in(fails_liveness, exporters):
    target = f"http://127.0.0.1:{closed_port()}"  # port closed: what vLLM looks like while it loads
    config = exporter_config(FAST | {"allow_targets": [target],
                                     "startup_deadline": {"after": "1s", "fails_liveness": fails_liveness}})
    _, url = exporters(config)
    live, ready = ask(url, "livez", target), ask(url, "readyz", target)
    assert (live.status_code, ready.status_code) == (200, 503)  # loading: alive, not ready
    assert live.json()["verdict"] == "down" and "startup_deadline" not in ready.json()["why"]
    def past() -> tuple[requests.Response] | None:
        answer = ask(url, "readyz", target)  # in a tuple: a Response with an error status is falsy
        return (answer,) if "past startup_deadline" in answer.json()["why"] else None
    ready, = wait_until(past, 10, "/readyz to report the startup deadline passed")
    assert ready.status_code == 503 and ready.json()["verdict"] == "down"
    live = ask(url, "livez", target)
    assert live.status_code == (503 if fails_liveness else 200)
    assert "past startup_deadline" in live.json()["why"]


def test_without_a_startup_deadline_loading_is_alive_however_long(exporters):
    target = f"http://127.0.0.1:{closed_port()}"
    _, url = exporters(exporter_config(FAST | {"allow_targets": [target]}))
    assert ask(url, "livez", target).status_code == 200
    assert "startup_deadline" not in ask(url, "readyz", target).json()["why"]
