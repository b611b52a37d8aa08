"""The ``hangwatch`` command: check, exporter, webhook, simulate, rules, dashboard; ``--version``.

Bad usage or a bad config is one line on stderr and exit 64 in every subcommand (DESIGN.md),
never a traceback.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys

from . import __version__, logs
from .check import check
from .modules import MODULES
from .observation import PROBE_AUTO, PROBE_KINDS
from .settings import EXIT_CONFIG, ConfigError, duration, secret_file

EXIT_USAGE = EXIT_CONFIG


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 64
        sys.stderr.write(f"hangwatch: {message}\n")
        raise SystemExit(EXIT_USAGE)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or a positive number of seconds")
    return value


def _duration(text: str) -> float:
    try:
        return duration(text, "--stall-window", low=0.001, high=7 * 86400.0)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[-1]) from None


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text) < 10:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL")
    return text.rstrip("/")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hangwatch", description="Keep LLM servers alive without hurting them.")
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = commands.add_parser("check", help="judge one backend: idle, busy, hung, restarted, blind or down "
                                          "(and stalled, given --stall-window)")
    c.add_argument("url", nargs="?", type=_url, help="the backend's base URL, e.g. http://127.0.0.1:8000")
    c.add_argument("--proxy", type=_url, metavar="URL", help="check a load-balancing proxy via /v1/models only")
    c.add_argument("--module", choices=MODULES, default=None)
    c.add_argument("--interval", type=_positive, default=5.0, help="seconds between readings (default 5)")
    c.add_argument("--timeout", type=_positive, default=5.0, help="seconds each request may take (default 5)")
    c.add_argument("--grace", type=_non_negative, default=0.0,
                   help="extra seconds without progress before hung (default 0: two intervals)")
    c.add_argument("--stall-window", type=_duration, default=None, metavar="DURATION",
                   help="also judge stalled (exit 3): in flight and no output (no token, no request "
                        "answered) for this long, e.g. 5m; the check then reads for at least that long")
    c.add_argument("--stalled-is-hung", action="store_true",
                   help="with --liveness and --stall-window: fail the liveness probe on stalled too")
    c.add_argument("--engine", choices=("vllm", "llamacpp", "sglang", "tgi"), default=None,
                   help="skip engine detection")
    c.add_argument("--api-key-file", metavar="FILE", default=None,
                   help="file holding the backend's own API key (vLLM --api-key), sent as a Bearer token")
    c.add_argument("--probe", choices=PROBE_KINDS, default=PROBE_AUTO,
                   help="what the idle probe asks: auto (default), completion, embedding, none")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--liveness", action="store_true",
                   help="an exec liveness probe: exit 1 only for hung (0 for anything else), "
                        "within max(2 x timeout + interval, 2 x interval + timeout) + timeout (see docs/kubernetes.md)")
    c.add_argument("-v", "--verbose", action="store_true", help="print each reading to stderr")

    e = commands.add_parser("exporter", help="the Prometheus exporter (/probe?target=...)")
    e.add_argument("--listen", default="127.0.0.1:9877", help="HOST:PORT (default 127.0.0.1:9877)")
    e.add_argument("--config", default=None, help="YAML config file")
    logs.add_arguments(e)

    w = commands.add_parser("webhook", help="the Alertmanager receiver that restarts hung containers")
    w.add_argument("--config", required=True, help="YAML config file")
    w.add_argument("--listen", default="127.0.0.1:9878", help="HOST:PORT (default 127.0.0.1:9878)")
    w.add_argument("--dry-run", action="store_true", help="decide and log, never restart")
    logs.add_arguments(w)

    f = commands.add_parser("forensics", help="the stacks of a hung server's processes and a signature "
                                              "(refused unless the target is judged hung now)")
    f.add_argument("url", type=_url, help="the server's base URL; its processes are found from the port")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.add_argument("--module", choices=MODULES, default="backend")
    f.add_argument("--interval", type=_positive, default=5.0, help="seconds between the check's readings (default 5)")
    f.add_argument("--timeout", type=_positive, default=5.0, help="seconds each check request may take (default 5)")
    f.add_argument("--api-key-file", metavar="FILE", default=None, help="the backend's own API key (vLLM --api-key)")
    f.add_argument("--deadline", type=_positive, default=10.0,
                   help="seconds the whole capture may take (default 10); what is not read by then is cut")
    f.add_argument("--locals", action="store_true", help="also read local variables (off by default; secret-named "
                                                          "ones and the API key are blanked)")
    f.add_argument("--native", action="store_true", help="also C/C++ frames (py-spy --native: pauses each "
                                                          "process while it is read)")
    f.add_argument("--py-spy", metavar="PATH", default=None, help="the py-spy binary (default: beside this Python, "
                                                                  "then PATH)")

    i = commands.add_parser("incidents", help="the webhook's restarts and their evidence; `incidents show ID`")
    i.add_argument("show", nargs="*", metavar="show ID", help="`show ID`: one incident with its readings and stacks")
    i.add_argument("--last", type=int, default=None, metavar="N", help="only the newest N")
    i.add_argument("--json", action="store_true", help="JSON instead of a table")
    i.add_argument("--state-dir", default=None, metavar="DIR",
                   help="the webhook's state_dir (default $HANGWATCH_STATE_DIR, else /var/lib/hangwatch)")

    commands.add_parser("simulate", help="a vLLM simulator for demos and tests (see hangwatch simulate --help)")

    from hangwatch.rules import cli as rules_cli
    rules_cli.add_rules_arguments(commands.add_parser(
        "rules", help="write the Prometheus rules for your scrape interval, jobs and runbook"))
    rules_cli.add_dashboard_arguments(commands.add_parser("dashboard", help="write the Grafana dashboard"))
    return parser


def version_line() -> str:
    """What ``hangwatch --version`` prints (the same values as the ``hangwatch_build_info`` series)."""
    return f"hangwatch {__version__} (Python {platform.python_version()})"


def run_check(args) -> int:
    if args.proxy and args.url:
        raise _usage("give either URL or --proxy URL, not both")
    url = args.proxy or args.url
    if not url:
        raise _usage("check needs a URL")
    module = "proxy" if args.proxy else (args.module or "backend")
    if args.proxy and args.module not in (None, "proxy"):
        raise _usage("--proxy means --module proxy")

    def show(observation, verdict):
        if args.verbose:
            reading = observation.reading
            load = f"in_flight={reading.in_flight:g}" if reading else f"status={observation.status}"
            probe = observation.probe.outcome if observation.probe else "no"
            sys.stderr.write(f"reading {load} probe={probe} "
                             f"-> {verdict.state}: {verdict.reason}\n")

    api_key = _api_key(args)
    if args.stalled_is_hung and not (args.liveness and args.stall_window):
        raise _usage("--stalled-is-hung needs --liveness and --stall-window")
    if args.liveness:
        return run_liveness(args, url, module, show, api_key=api_key, probe=args.probe)
    result = check(url, module=module, interval=args.interval, timeout=args.timeout, grace=args.grace,
                   stall_window=args.stall_window, engine=args.engine, api_key=api_key, probe=args.probe,
                   on_observation=show)
    if args.json:
        print(json.dumps(result.as_json()))
    else:
        print(f"{result.verdict.state}: {result.verdict.reason}")
    return result.exit_code


def _api_key(args) -> str | None:
    """The backend's own API key from ``--api-key-file`` (a bad file is a usage error)."""
    if not args.api_key_file:
        return None
    try:
        return secret_file(args.api_key_file, "--api-key-file")
    except ConfigError as exc:
        raise _usage(str(exc)) from None


def run_liveness(args, url: str, module: str, show, **target) -> int:
    """`check --liveness`: the bounded check behind the exporter's /livez, as an exit code."""
    from . import liveness
    # A stall window is read whole: the budget grows by it (an exec probe's timeoutSeconds must too).
    budget = liveness.needed_budget(args.interval, args.timeout) + (args.stall_window or 0.0)
    outcome = liveness.run_with_deadline(lambda: liveness.bounded_check(
        url, module=module, interval=args.interval, timeout=args.timeout, budget=budget,
        grace=args.grace, stall_window=args.stall_window, engine=args.engine, on_observation=show, **target),
        budget + 1.0)
    answer = liveness.liveness(outcome, stalled_is_hung=args.stalled_is_hung)
    code = 0 if answer.ok else 1
    if args.json:
        body = outcome.result.as_json() if outcome else {"verdict": None}
        print(json.dumps(body | {"live": answer.ok, "why": answer.why, "exit_code": code}))
    else:
        print(f"{'alive' if answer.ok else 'not alive'}: {answer.why}")
    return code


def run_forensics(args) -> int:
    """0: captured (the target was hung; the errors say what could not be read); 1: refused, not
    hung (nothing captured); 64: bad usage."""
    from . import forensics
    from .forensics.gate import capture_if_hung
    api_key = _api_key(args)
    answer = capture_if_hung(
        args.url, lambda: check(args.url, module=args.module, interval=args.interval, timeout=args.timeout,
                                api_key=api_key),
        secrets=[api_key] if api_key else [], deadline=args.deadline, native=args.native,
        with_locals=args.locals, py_spy=args.py_spy)
    if args.json:
        print(json.dumps(answer))
    elif not answer["captured"]:
        sys.stderr.write(f"hangwatch: {answer['errors'][0]}\n")
    else:
        print(forensics.render(answer))
    return 0 if answer["captured"] else 1


def run_incidents(args) -> int:
    import os

    from . import incidents
    state_dir = args.state_dir or os.environ.get(incidents.STATE_DIR_ENV) or incidents.DEFAULT_STATE_DIR
    if args.last is not None and args.last < 0:
        raise _usage("--last: expected zero or a positive number")
    try:
        if args.show:
            if len(args.show) != 2 or args.show[0] != "show":
                raise _usage("incidents: expected `incidents show ID` (or no words: the list)")
            record = incidents.read_incident(state_dir, args.show[1])
            print(json.dumps(record, indent=2, sort_keys=True) if args.json else incidents.render(record, args.show[1]))
            return 0
        rows = incidents.summaries(state_dir, args.last)
    except incidents.IncidentError as exc:
        sys.stderr.write(f"hangwatch: {exc}\n")
        return 1
    print(json.dumps([row.as_dict() for row in rows]) if args.json else incidents.table(rows))
    return 0


def _usage(message: str) -> SystemExit:
    sys.stderr.write(f"hangwatch: {message}\n")
    return SystemExit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["simulate"]:  # everything after it belongs to the simulator's own parser
        from hangwatch.simulator import main as simulator_main
        return simulator_main(argv[1:]) or 0
    args = build_parser().parse_args(argv)
    if args.command == "check":
        return run_check(args)
    if args.command == "forensics":
        return run_forensics(args)
    if args.command == "incidents":
        return run_incidents(args)
    if args.command == "exporter":
        from hangwatch.exporter.server import main as exporter_main
        return exporter_main(args)
    if args.command == "webhook":
        from hangwatch.webhook.app import main as webhook_main
        return webhook_main(args)
    if args.command in ("rules", "dashboard"):
        from hangwatch.rules import cli as rules_cli
        try:
            return rules_cli.run_rules(args) if args.command == "rules" else rules_cli.run_dashboard(args)
        except OSError as exc:  # --out cannot be created or written: a bad argument, like an unreadable --config
            raise _usage(f"{args.command}: --out: cannot write {exc.filename or args.out}: "
                         f"{exc.strerror or exc}") from None
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
