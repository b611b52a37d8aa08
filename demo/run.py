"""``hangwatch demo``: watch hangwatch leave a busy server alone and catch a hung one.

Starts the chain (``stack``), then:

1. idle  — nothing in flight: the exporter's 1-token probe is the only request the server gets;
2. busy  — three requests decoding: the exporter sends no probe, no alert fires;
3. hang  — the engine freezes with requests in flight (like ``kill -STOP`` of vLLM's
   EngineCore): the state turns ``hung``, HangwatchBackendHung fires, Alertmanager routes
   it to the webhook, the webhook re-checks the server itself and decides one (dry-run)
   restart.

It prints what each part saw and decided, and exits 0 only if the busy phase had no probe
and no alert and the hang led to exactly one restart decision. Without Prometheus or
Alertmanager installed, the demo does their job in a few lines of Python and says so.
"""
from __future__ import annotations

import sys
import threading
import time
from datetime import datetime, timezone

import requests

from hangwatch.flags import Parser, seconds

from .stack import CONTAINER, TARGET, Stack
from .wait import wait_until

HUNG = "HangwatchBackendHung"
# A part that is busy or between two answers: the wait goes on (it has a deadline).
TRANSIENT = (requests.RequestException, ValueError, KeyError)


class Narrator:
    def __init__(self, stack: Stack):
        self.stack = stack
        self.t0 = time.monotonic()

    def say(self, part: str, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {part:<12} {message}", flush=True)

    def webhook_decisions(self) -> list[str]:
        """New decision lines from the webhook's log, printed as they are."""
        lines = [line for line in self.stack.webhook.new_lines() if " action=" in line]
        for line in lines:
            self.say("webhook", line.split(" hangwatch.webhook ", 1)[-1])
        return lines


def _value(result: list[dict]) -> float | None:
    return float(result[0]["value"][1]) if result else None


def prometheus_view(stack: Stack, window: str) -> str:
    """One line: the state Prometheus recorded and the exporter's series behind it."""
    q = stack.query
    state = q('target:hangwatch_backend_state:current == 1')
    states = ",".join(sorted(r["metric"].get("state", "?") for r in state)) or "none yet"
    in_flight = _value(q("hangwatch_requests_in_flight"))
    steps = _value(q(f"rate(hangwatch_engine_steps_total[{window}])"))
    tokens = _value(q(f"sum(rate(hangwatch_engine_tokens_total[{window}]))"))
    probe = _value(q("hangwatch_probe_success"))
    return (f"state={states} in_flight={in_flight if in_flight is None else f'{in_flight:g}'} "
            f"steps/s={steps if steps is None else f'{steps:.1f}'} "
            f"tokens/s={tokens if tokens is None else f'{tokens:.0f}'} "
            f"probe={'none (not sent)' if probe is None else ('ok' if probe == 1 else 'FAILED')}")


def v4_payload(alerts: list[dict]) -> dict:
    """An Alertmanager webhook v4 body, for when no Alertmanager is installed."""
    return {"version": "4", "status": "firing", "receiver": "hangwatch-webhook", "groupKey": "demo",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "", "truncatedAlerts": 0,
            "alerts": [{"status": "firing", "labels": a["labels"], "annotations": a.get("annotations", {}),
                        "startsAt": a["startsAt"], "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
                        "fingerprint": ""} for a in alerts]}


class Scraper(threading.Thread):
    """Without Prometheus, someone must scrape the exporter: this reads /probe every interval."""

    def __init__(self, stack: Stack):
        super().__init__(daemon=True, name="demo-scraper")
        self.stack = stack
        self.stop = threading.Event()
        self.last = ""

    def run(self) -> None:
        url = f"{self.stack.exporter.url}/probe"
        while not self.stop.wait(self.stack.scrape_interval):
            try:
                self.last = requests.get(url, params={"target": self.stack.simulator.url}, timeout=10).text
            except requests.RequestException:
                pass

    def samples(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families
        return {s.name: s.value for fam in text_string_to_metric_families(self.last) for s in fam.samples}

    def in_flight(self) -> float:
        return self.samples().get("hangwatch_requests_in_flight") or 0

    def view(self) -> str:
        samples = self.samples()
        probe = samples.get("hangwatch_probe_success")
        in_flight = samples.get("hangwatch_requests_in_flight")
        return (f"in_flight={'?' if in_flight is None else f'{in_flight:g}'} "
                f"probe={'none (not sent)' if probe is None else ('ok' if probe == 1 else 'FAILED')}")


class StandIn(threading.Thread):
    """Plays Prometheus' rules (with ``hangwatch check``) and/or Alertmanager when not installed."""

    def __init__(self, stack: Stack, narrator: Narrator):
        super().__init__(daemon=True, name="demo-stand-in")
        self.stack, self.narrator = stack, narrator
        self.stop = threading.Event()
        self.sent = False
        self.firing: list[dict] = []

    def run(self) -> None:
        from hangwatch.check import check
        while not self.stop.is_set() and not self.sent:
            if self.stack.prometheus:
                self.firing = [a for a in self.stack.alerts()
                               if a["state"] == "firing" and a["labels"].get("action") == "restart"]
            else:
                result = check(self.stack.simulator.url, interval=self.stack.scrape_interval, timeout=2)
                if result.verdict.state == "hung":
                    self.narrator.say("stand-in", f"no Prometheus: hangwatch check says hung ({result.verdict.reason})")
                    now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
                    self.firing = [{"labels": {"alertname": HUNG, "severity": "critical", "action": "restart",
                                               "target": TARGET, "container": CONTAINER}, "startsAt": now}]
            if self.firing:
                self.narrator.say("stand-in", "no Alertmanager: sending the firing alert to the webhook as it would")
                response = requests.post(self.stack.webhook.url + "/alerts", json=v4_payload(self.firing),
                                         headers={"Authorization": f"Bearer {self.stack.token}"}, timeout=5)
                self.narrator.say("stand-in", f"webhook answered {response.status_code} {response.text.strip()}")
                self.sent = True
            self.stop.wait(self.stack.scrape_interval)


def run(stack: Stack, idle_seconds: float, busy_seconds: float, hang_timeout: float) -> bool:
    say = Narrator(stack)
    interval = stack.scrape_interval
    window = f"{max(5 * interval, 5):g}s"
    say.say("demo", f"everything runs on 127.0.0.1, files in {stack.dir}")
    for part in stack.parts:
        say.say(part.name, f"{part.url}  (pid {part.pid})")
    if not stack.prometheus:
        say.say("demo", "Prometheus is not installed: the demo judges with `hangwatch check` instead of the rules")
    elif not stack.alertmanager:
        say.say("demo", "Alertmanager is not installed: the demo forwards Prometheus' firing alert itself")
    stand_in = StandIn(stack, say) if not stack.alertmanager else None
    scraper = Scraper(stack) if not stack.prometheus else None
    if scraper:
        scraper.start()

    # 1. idle -------------------------------------------------------------------------------
    if stack.prometheus:
        wait_until(lambda: stack.query("target:hangwatch_backend_state:current == 1"), 20 * interval,
                   "Prometheus' first recorded state", ignore=TRANSIENT)
    say.say("demo", f"phase 1: idle for {idle_seconds:g}s")
    before = stack.sim_state()["inference_requests"]
    time.sleep(idle_seconds)
    idle_probes = stack.sim_state()["inference_requests"] - before
    say.say("simulator", f"idle: received {idle_probes} inference requests — the exporter's 1-token idle probes")
    if stack.prometheus:
        say.say("prometheus", prometheus_view(stack, window))
    else:
        say.say("exporter", scraper.view())

    # 2. busy -------------------------------------------------------------------------------
    say.say("demo", f"phase 2: busy — 3 requests decoding for {busy_seconds:g}s")
    stack.drive("busy", n=3)
    if stack.prometheus:  # a probe already on its way when the load arrived is not a busy-phase probe
        wait_until(lambda: (_value(stack.query("hangwatch_requests_in_flight")) or 0) > 0, 10 * interval,
                   "Prometheus to see the requests in flight", ignore=TRANSIENT)
    else:
        wait_until(lambda: scraper.in_flight() > 0, 10 * interval, "the exporter to see the requests in flight")
    busy_start = time.time()
    before = stack.sim_state()["inference_requests"]
    busy_alerts: set[str] = set()
    deadline = time.monotonic() + busy_seconds
    while time.monotonic() < deadline:
        time.sleep(min(interval * 2, max(0.1, deadline - time.monotonic())))
        if not stack.prometheus:
            say.say("exporter", scraper.view())
        if stack.prometheus:
            say.say("prometheus", prometheus_view(stack, window))
            # firing alerts, and a pending hang (a restart alert on its way)
            busy_alerts |= {f"{a['labels']['alertname']} ({a['state']})" for a in stack.alerts()
                            if a["state"] == "firing" or a["labels"].get("alertname") == HUNG}
    busy_probes = stack.sim_state()["inference_requests"] - before
    say.say("simulator", f"busy: received {busy_probes} inference requests from hangwatch (no probe while busy)")
    if stack.prometheus:
        say.say("prometheus", f"alerts firing (or a hang pending) during the busy phase: {', '.join(sorted(busy_alerts)) or 'none'}")
    busy_decisions = say.webhook_decisions()

    # 3. hang -------------------------------------------------------------------------------
    say.say("demo", "phase 3: hang — the engine freezes with 3 requests in flight (like kill -STOP of EngineCore)")
    stack.drive("frozen")
    hang_start = time.monotonic()
    if stand_in:
        stand_in.start()
    seen: set[str] = set()
    decisions: list[str] = []

    def progress() -> bool:
        if stack.prometheus:
            view = prometheus_view(stack, window)
            if view != getattr(progress, "last", None):
                say.say("prometheus", view)
                progress.last = view
            for alert in stack.alerts():
                name, state = alert["labels"].get("alertname"), alert["state"]
                if name and f"{name}:{state}" not in seen:
                    seen.add(f"{name}:{state}")
                    say.say("prometheus", f"alert {name} {state} (target={alert['labels'].get('target')}, "
                                          f"action={alert['labels'].get('action', '-')})")
        if stack.alertmanager:
            for alert in stack.alertmanager_alerts():
                name = alert["labels"].get("alertname")
                key = f"am:{name}"
                if key not in seen:
                    seen.add(key)
                    receivers = ",".join(r["name"] for r in alert.get("receivers", []))
                    say.say("alertmanager", f"{name} {alert['status']['state']} → receiver {receivers}")
        decisions.extend(say.webhook_decisions())
        return any("action=restart" in line for line in decisions)

    try:
        wait_until(progress, hang_timeout, "a restart decision", interval=0.5, ignore=TRANSIENT)
        hung_after = time.monotonic() - hang_start
    except TimeoutError as exc:
        say.say("demo", str(exc))
        hung_after = None
    finally:
        if stand_in:
            stand_in.stop.set()
        if scraper:
            scraper.stop.set()
    wait_until(lambda: requests.get(stack.webhook.url + "/healthz", timeout=5).json()["jobs_in_progress"] == 0,
               30, "the webhook to finish its jobs", ignore=TRANSIENT)
    decisions.extend(say.webhook_decisions())
    restart_decisions = stack.webhook_metric("hangwatch_webhook_decisions_total", action="restart")
    # A dry run counts its decision as result="dry_run"; a real restart would be "ok" or "failed".
    real_restarts = (stack.webhook_metric("hangwatch_webhook_restarts_total", result="ok")
                     + stack.webhook_metric("hangwatch_webhook_restarts_total", result="failed"))
    stack.drive("idle")  # thaw: the demo's own cleanup, not hangwatch's doing

    # summary ------------------------------------------------------------------------------
    checks = [
        ("busy phase: no probe sent", busy_probes == 0),
        ("busy phase: no alert", not busy_alerts and not busy_decisions),
        ("hang: exactly one restart decision (dry-run)", restart_decisions == 1),
        ("hang: nothing actually restarted (dry-run)", real_restarts == 0),
    ]
    print(flush=True)
    print("summary", flush=True)
    print(f"  idle: {idle_probes} idle probes; busy: {busy_probes} probes over {time.time() - busy_start:.0f}s; "
          f"hang → restart decision after {'-' if hung_after is None else f'{hung_after:.0f}s'}", flush=True)
    for what, ok in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {what}", flush=True)
    return all(ok for _, ok in checks)


EXIT_CODES = "exit codes: 0 the demo passed; 1 it failed (the summary says which promise); 64 bad usage; 130 interrupted."


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="hangwatch demo", epilog=EXIT_CODES,
                    description="The whole chain on this machine, no Docker, no GPU: a simulated vLLM, the exporter,\n"
                                "Prometheus and Alertmanager when installed, the webhook in dry-run. A busy phase gets\n"
                                "no probe and no alert; a hang gets one (dry-run) restart decision.")
    parser.add_argument("--scrape-interval", type=seconds(low=0.5, high=60), default=2.0, metavar="DURATION",
                        help="e.g. 2s; a bare number is seconds (default 2s; the rules are rendered for it)")
    parser.add_argument("--idle", type=seconds(high=3600), default=6.0, metavar="DURATION",
                        help="how long the idle phase lasts (default 6s)")
    parser.add_argument("--busy", type=seconds(high=3600), default=20.0, metavar="DURATION",
                        help="how long the busy phase lasts (default 20s)")
    parser.add_argument("--hang-timeout", type=seconds(above=True, high=3600), default=120.0, metavar="DURATION",
                        help="how long to wait for the restart decision (default 120s)")
    parser.add_argument("--no-prometheus", action="store_true", help="run as if Prometheus were not installed")
    parser.add_argument("--no-alertmanager", action="store_true", help="run as if Alertmanager were not installed")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (configs, logs) afterwards")
    args = parser.parse_args(argv)
    stack = Stack(scrape_interval=args.scrape_interval, recheck_interval=args.scrape_interval,
                  use_prometheus=not args.no_prometheus, use_alertmanager=not args.no_alertmanager, keep=args.keep)
    try:
        with stack:
            ok = run(stack, args.idle, args.busy, args.hang_timeout)
    except KeyboardInterrupt:
        return 130
    print(f"\n{'demo passed' if ok else 'demo FAILED'}; every process stopped"
          + (f"; files kept in {stack.dir}" if args.keep else ""), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
