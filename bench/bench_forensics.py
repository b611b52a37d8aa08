#!/usr/bin/env python3
"""How long does a capture of a hung real vLLM take, and what does it read?

    flock /tmp/hangwatch-heavy.lock python bench/bench_forensics.py [--runs 5]

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hangwatch.forensics import capture  # noqa: E402
from harness.vllm_server import VLLMServer  # noqa: E402

FAULTS = str(REPO / "tests" / "vllm_faults")


def wedged_server(workdir: str) -> VLLMServer:
    trigger = os.path.join(workdir, "wedge-now")
    server = VLLMServer(extra_env={"PYTHONPATH": FAULTS, "HANGWATCH_VLLM_FAULT": "wedge",
                                   "HANGWATCH_WEDGE_TRIGGER": trigger})
    server.wedge_trigger = trigger
    return server


def save(answer: dict, path: str) -> None:
    """A real capture as a signature test case (tests/test_forensics_signatures.py)."""
    case = {"note": "captured from the real vLLM 0.32 (CPU) wedged by tests/vllm_faults (bench/bench_forensics.py)",
            "expect": "engine_step_stuck", "evidence_contains": "hangwatch_fault_wedged_here",
            "captured": [{k: p[k] for k in ("pid", "name", "state", "threads")} for p in answer["processes"]]}
    with open(path, "w") as handle:
        json.dump(case, handle, indent=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--save", metavar="DIR", default=str(REPO / "tests" / "data" / "forensics"),
                        help="write one capture of the wedged server there (real-vllm-wedged.json)")
    args = parser.parse_args(argv)
    import tempfile
    with tempfile.TemporaryDirectory() as workdir:
        server = wedged_server(workdir)
        try:
            started = time.monotonic()
            server.start()
            print(f"vLLM ready in {time.monotonic() - started:.1f} s")
            with server.generations(n=2):
                server.wait_until(lambda p: p.value("vllm:num_requests_running") == 2, 60, what="two running")
                open(server.wedge_trigger, "w").close()
                time.sleep(3)  # the next step wedges; nothing moves after it
                rows = []
                for label, options in (("python frames (--nonblocking)", {}),
                                       ("with locals", {"with_locals": True}),
                                       ("native frames (--native)", {"native": True})):
                    seconds, shape = [], None
                    for _ in range(args.runs):
                        t0 = time.monotonic()
                        answer = capture(server.url, **options)
                        seconds.append(time.monotonic() - t0)
                        shape = (len(answer["processes"]), sum(len(p["threads"]) for p in answer["processes"]),
                                 sum(len(t["frames"]) for p in answer["processes"] for t in p["threads"]),
                                 answer["signature"], len(answer["errors"]))
                    rows.append((label, shape, seconds))
                    if not options and args.save:
                        save(answer, os.path.join(args.save, "real-vllm-wedged.json"))
                cli = []
                for _ in range(max(1, args.runs // 2)):
                    t0 = time.monotonic()
                    done = subprocess.run([sys.executable, "-m", "hangwatch", "forensics", server.url, "--json",
                                           "--interval", "1", "--timeout", "3"], capture_output=True, text=True,
                                          timeout=120)
                    cli.append(time.monotonic() - t0)
                    assert done.returncode == 0, done.stderr
                    assert json.loads(done.stdout)["signature"] == "engine_step_stuck"
        finally:
            server.close()
    print(f"{'capture':32} {'procs':>5} {'threads':>7} {'frames':>6} {'signature':>18} {'errors':>6} "
          f"{'median s':>8} {'max s':>6}")
    for label, (procs, threads, frames, signature, errors), seconds in rows:
        print(f"{label:32} {procs:5d} {threads:7d} {frames:6d} {signature:>18} {errors:6d} "
              f"{statistics.median(seconds):8.3f} {max(seconds):6.3f}")
    print(f"{'hangwatch forensics (CLI, check --interval 1 included)':56} median {statistics.median(cli):.2f} s, "
          f"max {max(cli):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
