"""Suite-wide rules: under CI no test may skip unless it says why it may.

A skip in CI hides a missing real part or a missing capture as a green run. So when
``tests.support.require.in_ci()`` holds, every skipped test (at collection, set-up or run)
is reported as failed, naming the skip's reason — unless the test carries
``@pytest.mark.skip_allowed("why skipping here proves nothing is missing")``.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from harness.cpuhog import CpuHog, requested
from tests.support.require import in_ci

pytest_plugins = ["tests.support.exporters"]  # the `exporters` fixture, for every test folder

# Property tests judge the code, not the machine: on two loaded cores (xdist workers beside a
# real server) Hypothesis' too_slow health check and per-example deadline can fail a correct
# test. A test's own @settings still adds to this; print_blob makes any failure replayable.
settings.register_profile("hangwatch", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("hangwatch")


def _allowed(item) -> bool:
    marker = item.get_closest_marker("skip_allowed")
    if marker is None:
        return False
    reason = marker.args[0] if marker.args else marker.kwargs.get("reason")
    assert reason, f"{item.nodeid}: skip_allowed needs a reason"
    return True


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and in_ci() and not _allowed(item):
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI, which must not skip ({_reason(report)}); "
                           "install the missing part, or mark the test "
                           "@pytest.mark.skip_allowed(reason) if skipping proves nothing is missing")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and in_ci():
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid}: skipped at collection under CI ({_reason(report)})"


def pytest_addoption(parser):
    parser.addoption("--cpu-hog", action="store_const", const=1, default=None,
                     help="keep one core busy for the whole run, to shake out races in the real "
                          "tiers' waits before CI does (HANGWATCH_CPU_HOG=N: N cores)")


def pytest_configure(config):
    """Start the CPU hog once, in the controlling process (never in each xdist worker)."""
    if hasattr(config, "workerinput"):
        return
    try:
        cores = requested(config.getoption("--cpu-hog"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if cores:
        config._hangwatch_cpu_hog = CpuHog(cores).start()
        config.add_cleanup(config._hangwatch_cpu_hog.stop)


def pytest_report_header(config):
    hog = getattr(config, "_hangwatch_cpu_hog", None)
    if hog is not None:
        return f"cpu hog: {hog.cores} core(s) kept busy by PIDs {[p.pid for p in hog.processes]}"
