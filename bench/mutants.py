"""Single-line mutants of the gate (hangwatch/, webhook/, rules/), each run against the fast-tier
tests that should catch it: once with the tests as they were (``--before DIR``: a copy of the
tree at that commit whose code folders and docs/ link to this worktree), once with this tree's tests.

    python bench/mutants.py --before /tmp/tg-before [--only ID ...] > bench/RESULTS-mutants.md
    python bench/mutants.py [--only ID ...]      # this tree's tests only: is every mutant still caught?

Each mutant is applied to this worktree's file, the tests run (
targeted files, ``-n 0``), and the file is restored whatever happens. The table says, per
mutant, the first test that failed (caught) or "survived"; "after" runs the tests this branch
added first, alone, and the old subset only if none of them catches it.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CORE = ["tests/test_idle_confirm.py", "tests/test_verdict.py", "tests/test_check_simulator.py",
        "tests/rules/test_truth_table_python.py", "tests/test_check_bad_input.py"]
CORE_NEW = ["tests/test_probe_gate.py", "tests/test_client_outcomes.py", "tests/test_client_limits.py",
            "tests/webhook/test_recheck_simulator.py"]
FETCH = ["tests/test_hostile_backends.py", "tests/test_check_bad_input.py", "tests/exporter/test_probe_endpoint.py"]
FETCH_NEW = ["tests/test_client_outcomes.py", "tests/test_client_limits.py", "tests/test_client_bounds.py"]
HOOK = ["tests/webhook/test_decisions.py", "tests/webhook/test_ledger.py", "tests/webhook/test_fleet_limits.py",
        "tests/webhook/test_http.py"]
HOOK_NEW = ["tests/webhook/test_restart_guards.py", "tests/webhook/test_recheck_simulator.py"]
RULES = ["tests/rules/test_configs.py", "tests/rules/test_truth_table_promtool.py::test_promql_state_and_alerts_match_truth_table"]
# The truth table at a 30 s scrape first (it passes with the mutant: the two-reading grace it
# writes is implied by the three readings hung needs), then what the mutant does change: cost.
RULES_NEW = ["tests/rules/test_truth_table_promtool.py::test_promql_state_and_alerts_match_truth_table[llamacpp_grace_30s]",
             "tests/rules/test_grace_rule_cost.py"]

# (id, file, exact old text (one line, unique), new text, the mistake, tests before, tests added after)
MUTANTS = [
    # -- the idle-probe gate (hangwatch/observe.py)
    ("gate-in-flight", "hangwatch/observe.py", "reading.in_flight == 0\n", "reading.in_flight <= 1\n",
     "probe with one request in flight", CORE, CORE_NEW),
    ("gate-asleep", "hangwatch/observe.py", "            and not reading.asleep and options.probe",
     "            and options.probe", "probe an asleep engine", CORE, CORE_NEW),
    ("gate-probe-none", "hangwatch/observe.py", "and options.probe != PROBE_NONE)", "and True)",
     "probe a target set to probe: none", CORE, CORE_NEW),
    ("gate-no-second-check", "hangwatch/observe.py", "    if not probe_due(again, options):\n",
     "    if False:\n", "probe although the second reading is busy", CORE, CORE_NEW),
    ("gate-ignore-work", "hangwatch/observe.py", "    if moved:\n", "    if False:\n",
     "probe although the engine worked between the two readings", CORE, CORE_NEW),
    ("gate-no-wait", "hangwatch/observe.py", "    wait = min(IDLE_CONFIRM_S, max(0.0, deadline.left() / 4))",
     "    wait = 0.0", "no confirmation interval between the two readings", CORE, CORE_NEW),
    ("gate-moved-other-process", "hangwatch/observe.py",
     "not same_process(before.reading, after.reading):", "same_process(before.reading, after.reading):",
     "compare the counters of two processes (or never the same one)", CORE, CORE_NEW),
    ("closed-is-stall", "hangwatch/observe.py", "status = UNREACHABLE if fetched.status == BROKEN",
     "status = TIMEOUT if fetched.status == BROKEN",
     "an accepted-then-closed connection counts toward hung", CORE + FETCH, CORE_NEW + FETCH_NEW),
    ("too-large-not-blind", "hangwatch/observe.py",
     'return Observation(taken_at, BLIND, error=f"{what} {fetched.error}"',
     'return Observation(taken_at, TIMEOUT, error=f"{what} {fetched.error}"',
     "a too-large page counts toward hung", CORE + FETCH, CORE_NEW + FETCH_NEW),
    # -- the client (hangwatch/client.py, answer.py)
    ("refused-is-timeout", "hangwatch/answer.py", '"refused": (REFUSED, "connection refused"),',
     '"refused": (TIMEOUT, "connection refused"),', "refused (down, loading weights) counts toward hung",
     FETCH, FETCH_NEW),
    ("connect-timeout-is-stall", "hangwatch/answer.py", '"connect_timeout": (UNREACHABLE,',
     '"connect_timeout": (TIMEOUT,', "an unreachable host (connect timed out) counts toward hung", FETCH, FETCH_NEW),
    ("no-size-limit", "hangwatch/answer.py", "        self.over = self.size > self.limit",
     "        self.over = self.size > self.limit * 1000", "no limit on a page's size", FETCH, FETCH_NEW),
    ("deadline-per-read", "hangwatch/client.py", "call_later(deadline.left(), state.expire, task)",
     "call_later(max(deadline.left(), 2.0), state.expire, task)",
     "a request gets a timeout of its own, not what is left of the reading's", FETCH, FETCH_NEW),
    ("reset-not-broken", "hangwatch/answer.py", '"broken_off": (BROKEN, "answer broken off: {why}"),',
     '"broken_off": (OK, "answer broken off: {why}"),', "a page broken off mid-answer is read as a whole page",
     FETCH, FETCH_NEW),
    # -- the probe (hangwatch/probe.py)
    ("5xx-rejected", "hangwatch/probe.py", "and 400 <= fetched.http_status < 500:",
     "and 400 <= fetched.http_status < 600:", "a probe answered 5xx never counts toward hung", CORE, CORE_NEW),
    ("4xx-failed", "hangwatch/probe.py", "and 400 <= fetched.http_status < 500:",
     "and 400 <= fetched.http_status < 401:", "a probe refused 401 (no API key) counts toward hung",
     CORE, CORE_NEW),
    ("probe-no-key", "hangwatch/probe.py",
     '"/v1/models", deadline=deadline, max_bytes=MAX_ANSWER,\n                             headers=options.auth_headers())',
     '"/v1/models", deadline=deadline, max_bytes=MAX_ANSWER,\n                             headers={})',
     "the probe goes without the target's API key (every probe rejected)", CORE, CORE_NEW),
    # -- the verdict (hangwatch/verdict.py)
    ("timeout-hung-at-once", "hangwatch/verdict.py", "        if streak >= 2:\n            return Verdict(HUNG, f\"{last.error}",
     "        if streak >= 1:\n            return Verdict(HUNG, f\"{last.error}", "one silent reading is hung",
     CORE, CORE_NEW),
    ("probe-fail-hung-at-once", "hangwatch/verdict.py",
     "    if streak >= 2:\n        return Verdict(HUNG, f\"nothing in flight, yet",
     "    if streak >= 1:\n        return Verdict(HUNG, f\"nothing in flight, yet", "one failed probe is hung",
     CORE, CORE_NEW),
    ("hung-after-one-interval", "hangwatch/verdict.py", "    if intervals >= 2 and stalled_for >= grace:",
     "    if intervals >= 1 and stalled_for >= grace:", "hung after one interval with nothing moving",
     CORE, CORE_NEW),
    ("hung-ignores-grace", "hangwatch/verdict.py", "    if intervals >= 2 and stalled_for >= grace:",
     "    if intervals >= 2:", "an engine's grace (a long batch) is ignored", CORE, CORE_NEW),
    ("refused-not-down", "hangwatch/verdict.py", "    if last.status in (REFUSED, UNREACHABLE):",
     "    if last.status in (UNREACHABLE,):", "refused is not down", CORE, CORE_NEW),
    ("gauge-progress", "hangwatch/verdict.py", "if (new != old) if name in GAUGE_FIELDS else (new > old):",
     "if (new > old) if name in GAUGE_FIELDS else (new > old):", "a KV gauge falling is not progress",
     CORE, CORE_NEW),
    # -- check (hangwatch/check.py)
    ("check-too-few-readings", "hangwatch/check.py", "    return 4 + math.ceil(longest / interval)",
     "    return 2 + math.ceil(longest / interval)", "check gives up before hung can be reached", CORE, CORE_NEW),
    # -- the webhook's decision (webhook/policy.py, ledger.py, limits.py)
    ("restart-on-down", "webhook/policy.py", '        if state not in target.restart_on:',
     '        if state not in (*target.restart_on, "down"):', "restart a down backend (loading weights)", HOOK, HOOK_NEW),
    ("cooldown-off-by-sign", "webhook/policy.py", "        if last is not None and now - last < self.config.cooldown:",
     "        if last is not None and now - last > self.config.cooldown:", "cooldown inverted", HOOK, HOOK_NEW),
    ("budget-off-by-one", "webhook/policy.py",
     "        if len(counted) >= self.config.budget.restarts:\n            return self.record(alert, target, SKIP, \"circuit_open\"",
     "        if len(counted) > self.config.budget.restarts:\n            return self.record(alert, target, SKIP, \"circuit_open\"", "one restart more than the budget", HOOK, HOOK_NEW),
    ("no-recheck-of-alert-start", "webhook/policy.py",
     "            if alert.starts_at is not None and started > alert.starts_at:",
     "            if alert.starts_at is not None and started > alert.starts_at and False:",
     "restart again a container restarted after the alert began", HOOK, HOOK_NEW),
    ("torn-cut-too-far", "webhook/ledger.py", "            end = start + newline + 1",
     "            end = start + newline", "the torn-tail repair cuts one byte too far", HOOK, HOOK_NEW),
    ("dry-run-counts", "webhook/ledger.py", 'if event == "restart" and not record.get("dry_run"):',
     'if event == "restart":', "a dry run's restart counts as a restart", HOOK, HOOK_NEW),
    ("reset-ignored", "webhook/ledger.py", "            since = max(now - window, history.reset_at)",
     "            since = now - window", "an operator's circuit reset is ignored", HOOK, HOOK_NEW),
    ("group-limit-off-by-one", "webhook/limits.py", "        if len(others) >= allowed:",
     "        if len(others) > allowed:", "one more of a group restarting than allowed", HOOK, HOOK_NEW),
    ("fleet-budget-off-by-one", "webhook/limits.py", "    if len(recent) >= budget.restarts:",
     "    if len(recent) > budget.restarts:", "one fleet restart more than the budget", HOOK, HOOK_NEW),
    # -- the rules (rules/windows.py)
    ("rules-two-readings-hung", "rules/windows.py", "    return max(3, math.ceil(grace / scrape - 1e-9) + 1)",
     "    return max(2, math.ceil(grace / scrape - 1e-9) + 1)", "the rules call hung after two readings",
     RULES, RULES_NEW),
]


def apply(path: Path, old: str, new: str) -> str:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r} found {text.count(old)} times"
    path.write_text(text.replace(old, new))
    return text


FAILED = re.compile(r"^FAILED (\S+)", re.M)
ERROR = re.compile(r"^ERROR (\S+)", re.M)


def run(cwd: Path, tests: list[str]) -> str:
    tests = [t for t in tests if (cwd / t.split("::")[0]).exists()]
    if not tests:
        return "survived"
    # Targeted files, one process (-n 0): the shared heavy lock's queue was hours deep today.
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "-q", "-x", "-n", "0", "-m", "not real", "--timeout", "180", "-o", "addopts=-ra", *tests],
                          cwd=cwd, capture_output=True, text=True, timeout=1800)
    found = FAILED.search(done.stdout) or ERROR.search(done.stdout)
    if found:
        return found.group(1)
    if done.returncode == 0:
        return "survived"
    return f"(pytest exit {done.returncode})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", type=Path, help="a copy of the tree with the old tests; without it, "
                        "only this tree's tests run (the 'before' cell reads 'not run')")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    print("| mutant | file | the mistake | before (main's tests) | after (this branch) |")
    print("|---|---|---|---|---|")
    for ident, file, old, new, why, tests, added in MUTANTS:
        if args.only and ident not in args.only:
            continue
        path = ROOT / file
        original = apply(path, old, new)
        try:
            before = run(args.before, tests) if args.before else "not run"
            # The tests this branch adds, alone first: does the mutant now have a second catcher?
            after = run(ROOT, added)
            if after == "survived":
                after = run(ROOT, tests) + " (no new test catches it)"
        finally:
            path.write_text(original)
        print(f"| {ident} | {file} | {why} | {before} | {after} |", flush=True)


if __name__ == "__main__":
    main()
