"""Mutants of the state-timeline test's waits: does the wait, not luck, make it pass? (issue 33)

``tests/e2e/test_dashboard_queries.py`` ends each phase (idle, busy, hung) only when the state
panel's own range query shows the phase's state at a settled step (``harness/settled.py``). Each
mutant below replaces those waits in a copy of the test (``tests/e2e/_mutant_*.py``, removed
afterwards) and runs it against the real chain, as often as asked, with and without a CPU hog:

- ``none``: the test as it is (the control: must pass every run);
- ``one-evaluation``: each phase ends after the first rule evaluation that reports its state;
- ``proxy``: each phase ends when the old proxy holds (``min_over_time(...[5s]) == 1``, which one
  evaluation satisfies: the wait CI went red with);
- ``no-wait``: the phases are not waited for at all beyond the restart decision.

    python bench/wait_mutants.py [--runs N] [--hog] [--only MUTANT ...] >> bench/RESULTS-wait-mutants.md

A mutant is *caught* in a run when the state-timeline test fails; the table gives each run's
outcome and the failing assertion's first line. Needs Prometheus and Alertmanager (the real tier).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = ROOT / "tests" / "e2e" / "test_dashboard_queries.py"
TIMELINE = "test_the_state_timeline_shows_idle_busy_and_hung"

CURRENT = '''

def _current(stack, state):
    return stack.query('target:hangwatch_backend_state:current{state="%s"} == 1' % state)


def _proxy(stack, state):
    return stack.query('min_over_time(target:hangwatch_backend_state:current{state="%s"}[5s]) == 1' % state)
'''

WAITS = {
    "idle": 'wait_shown(stack, start, "idle", start, 40)',
    "busy": 'wait_shown(stack, start, "busy", busy_from, 50)',
    "hung": 'wait_shown(stack, start, "hung", hung_from, 30)',
}

MUTANTS = {
    "none": None,
    "one-evaluation": 'wait_until(lambda: _current(stack, "{state}"), 60, "{state} at one evaluation")',
    "proxy": 'wait_until(lambda: _proxy(stack, "{state}"), 60, "the old proxy for {state}")',
    "no-wait": "None",
}


def mutant_source(name: str) -> str:
    source = TEST.read_text()
    replacement = MUTANTS[name]
    if replacement is None:
        return source
    for state, wait in WAITS.items():
        assert source.count(wait) == 1, f"the test no longer has {wait!r}: update bench/wait_mutants.py"
        source = source.replace(wait, replacement.format(state=state))
    return source + CURRENT


def run_once(name: str, hog: bool) -> tuple[str, float, str]:
    path = TEST.with_name(f"_mutant_{name.replace('-', '_')}_test.py")
    path.write_text(mutant_source(name))
    env = dict(os.environ, CI="true")
    if hog:
        env["HANGWATCH_CPU_HOG"] = "1"
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "real",
                               f"{path.relative_to(ROOT)}::{TIMELINE}"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        path.unlink(missing_ok=True)
    took = time.monotonic() - began
    if done.returncode == 0:
        return "passed", took, ""
    found = re.search(r"^E\s+(assert .*|AssertionError.*|.*WaitTimeout.*)$", done.stdout, re.M)
    return "FAILED", took, found.group(1).strip() if found else done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--hog", action="store_true", help="keep one core busy (HANGWATCH_CPU_HOG=1)")
    parser.add_argument("--only", nargs="*", choices=sorted(MUTANTS), default=list(MUTANTS))
    args = parser.parse_args()
    print("\n| mutant | hog | run | outcome | seconds | failure |\n|---|---|---|---|---|---|", flush=True)
    for name in args.only:
        for run in range(1, args.runs + 1):
            outcome, took, why = run_once(name, args.hog)
            print(f"| {name} | {'yes' if args.hog else 'no'} | {run} | {outcome} | {took:.0f} | `{why}` |", flush=True)


if __name__ == "__main__":
    main()
