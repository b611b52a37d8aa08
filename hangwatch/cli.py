"""The ``hangwatch`` command: check, exporter, webhook, forensics, incidents, simulate, rules, dashboard, demo.

Bad usage or a bad config is one line on stderr and exit 64 in every subcommand (DESIGN.md),
never a traceback; ``hangwatch`` alone prints the usage. Each subcommand's ``--help`` says in one
line what it is for and lists its exit codes. Long waits say what they wait for on a terminal.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys

from . import __version__, logs
from .check import check
from .flags import Parser, seconds
from .modules import MODULES
from .observation import PROBE_AUTO, PROBE_KINDS
from .progress import Progress
from .settings import EXIT_CONFIG, ConfigError, secret_file, url_problem, without_credentials

EXIT_USAGE = EXIT_CONFIG
DAY = 86400.0
POSITIVE = seconds(above=True)                     # --interval, --timeout, --deadline: 5, 5s, 500ms
NON_NEGATIVE = seconds()                           # --grace: 0 allowed
WINDOW = seconds(low=0.001, high=7 * DAY, bare=False)  # --stall-window: a unit, always (5m; 300 what?)

MODULE_HELP = (f"how the target is read: {', '.join(MODULES)} (default backend: a vLLM, llama.cpp, SGLang or TGI "
               "server, the engine detected from its page; proxy: an OpenAI-compatible proxy, /v1/models only)")
EXIT_CODES = {
    "check": "exit codes: 0 idle, busy or restarted; 1 hung; 2 blind or down (cannot judge); 3 stalled;\n"
             "            64 bad usage. With --liveness: 0 alive, 1 hung (stalled too with --stalled-is-hung).",
    "exporter": "exit codes: 0 stopped by SIGTERM or SIGINT; 1 the server failed; 64 bad config or flag,\n"
                "            or an address it cannot listen on.",
    "webhook": "exit codes: 0 stopped by SIGTERM or SIGINT; 1 cannot listen; 64 bad config or flag.",
    "forensics": "exit codes: 0 captured, with stacks; 1 not hung: refused, nothing captured; 2 hung, but no\n"
                 "            stack could be read (the errors say why: py-spy missing or not permitted); 64 bad usage.",
    "incidents": "exit codes: 0 listed or shown (none recorded included); 1 the state_dir or the incident\n"
                 "            cannot be read; 64 bad usage.",
    "rules": "exit codes: 0 written; 64 bad flag, or --out cannot be written.",
    "dashboard": "exit codes: 0 written; 64 bad flag, or --out cannot be written.",
}


def _url(text: str) -> str:
    problem = url_problem(text, allow_path=True)
    if problem:
        raise argparse.ArgumentTypeError(f"{without_credentials(text)!r} {problem}")
    return text.rstrip("/")


def _subcommand(commands, name: str, summary: str, description: str = "", **kwargs) -> argparse.ArgumentParser:
    """One subcommand: ``summary`` in ``hangwatch --help``, and on top of its own ``--help`` with its exit codes."""
    return commands.add_parser(name, help=summary, description=summary + (f"\n\n{description}" if description else ""),
                               epilog=EXIT_CODES.get(name), formatter_class=argparse.RawDescriptionHelpFormatter,
                               **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hangwatch", description="Keep LLM servers alive without hurting them: judge a server from "
                                                   "its own /metrics counters and restart only what is shown hung.",
                    epilog="`hangwatch COMMAND --help` for each command. Docs: README.md, docs/configuration.md.")
    parser.add_argument("--version", action="version", version=version_line())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    c = _subcommand(commands, "check", "judge one server once: idle, busy, hung, restarted, blind or down "
                                       "(and stalled, given --stall-window); never a request while it is busy",
                    "Reads /metrics, waits --interval, reads again until the verdict settles (5-15 s;\n"
                    "each reading is printed on a terminal). Safe as a Docker HEALTHCHECK, cron job or exec probe.")
    c.add_argument("url", nargs="?", type=_url, help="the server's base URL, e.g. http://127.0.0.1:8000 (without /v1)")
    c.add_argument("--proxy", type=_url, metavar="URL", help="check a load-balancing proxy via /v1/models only "
                                                              "(the same as --module proxy)")
    c.add_argument("--module", choices=MODULES, default=None, metavar="MODULE", help=MODULE_HELP)
    c.add_argument("--interval", type=POSITIVE, default=5.0, metavar="DURATION",
                   help="between readings, e.g. 5s or 500ms; a bare number is seconds (default 5s)")
    c.add_argument("--timeout", type=POSITIVE, default=5.0, metavar="DURATION",
                   help="each reading, all its requests together (default 5s)")
    c.add_argument("--grace", type=NON_NEGATIVE, default=0.0, metavar="DURATION",
                   help="extra time without progress before hung (default 0: two intervals)")
    c.add_argument("--stall-window", type=WINDOW, default=None, metavar="DURATION",
                   help="also judge stalled (exit 3): in flight and no output (no token, no request "
                        "answered) for this long, e.g. 5m; the check then reads for at least that long")
    c.add_argument("--stalled-is-hung", action="store_true",
                   help="with --liveness and --stall-window: fail the liveness probe on stalled too")
    c.add_argument("--engine", choices=("vllm", "llamacpp", "sglang", "tgi"), default=None,
                   help="skip engine detection")
    c.add_argument("--api-key-file", metavar="FILE", default=None,
                   help="file holding the server's own API key (vLLM --api-key), sent as a Bearer token")
    c.add_argument("--probe", choices=PROBE_KINDS, default=PROBE_AUTO,
                   help="what the idle probe asks: auto (default), completion, embedding, none")
    c.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    c.add_argument("--liveness", action="store_true",
                   help="an exec liveness probe: exit 1 only for hung (0 for anything else), "
                        "within max(2 x timeout + interval, 2 x interval + timeout) + timeout (see docs/kubernetes.md)")
    c.add_argument("-v", "--verbose", action="store_true", help="print each reading to stderr, terminal or not")

    e = _subcommand(commands, "exporter", "the Prometheus exporter: GET /probe?target=URL answers a server's "
                                          "verdict as series (blackbox_exporter's pattern)",
                    "Try: curl '127.0.0.1:9877/probe?target=http://127.0.0.1:8000&debug=true'")
    e.add_argument("--listen", default="127.0.0.1:9877", metavar="HOST:PORT",
                   help="HOST:PORT or :PORT (loopback) (default 127.0.0.1:9877)")
    e.add_argument("--config", default=None, metavar="FILE", help="YAML config file (docs/configuration.md)")
    logs.add_arguments(e)

    w = _subcommand(commands, "webhook", "the Alertmanager receiver that restarts a hung container, after "
                                         "checking the server itself")
    w.add_argument("--config", required=True, metavar="FILE", help="YAML config file (docs/configuration.md)")
    w.add_argument("--listen", default="127.0.0.1:9878", metavar="HOST:PORT",
                   help="HOST:PORT or :PORT (loopback) (default 127.0.0.1:9878)")
    w.add_argument("--dry-run", action="store_true", help="decide and log, never restart")
    logs.add_arguments(w)

    f = _subcommand(commands, "forensics", "where each process of a hung server waits: its stacks and a "
                                           "signature (refused unless the server is judged hung now)",
                    "Needs py-spy (the forensics extra) and permission to read the server's processes.")
    f.add_argument("url", type=_url, help="the server's base URL; its processes are found from the port")
    f.add_argument("--json", action="store_true", help="print one JSON object, nothing else")
    f.add_argument("--module", choices=MODULES, default="backend", metavar="MODULE", help=MODULE_HELP)
    f.add_argument("--interval", type=POSITIVE, default=5.0, metavar="DURATION",
                   help="between the check's readings (default 5s)")
    f.add_argument("--timeout", type=POSITIVE, default=5.0, metavar="DURATION",
                   help="each reading of the check (default 5s)")
    f.add_argument("--api-key-file", metavar="FILE", default=None, help="the server's own API key (vLLM --api-key)")
    f.add_argument("--deadline", type=POSITIVE, default=10.0, metavar="DURATION",
                   help="the whole capture (default 10s); what is not read by then is cut")
    f.add_argument("--locals", action="store_true", help="also read local variables (off by default; secret-named "
                                                          "ones and the API key are blanked)")
    f.add_argument("--native", action="store_true", help="also C/C++ frames (py-spy --native: pauses each "
                                                          "process while it is read)")
    f.add_argument("--py-spy", metavar="PATH", default=None, help="the py-spy binary (default: beside this Python, "
                                                                  "then PATH)")

    i = _subcommand(commands, "incidents", "what the webhook restarted, with the evidence; `incidents show ID` "
                                           "for one")
    i.add_argument("show", nargs="*", metavar="show ID", help="`show ID`: one incident with its readings and stacks")
    i.add_argument("--last", type=int, default=None, metavar="N", help="only the newest N")
    i.add_argument("--json", action="store_true", help="JSON instead of a table")
    i.add_argument("--state-dir", default=None, metavar="DIR",
                   help="the webhook's state_dir (default $HANGWATCH_STATE_DIR, else /var/lib/hangwatch)")

    commands.add_parser("simulate", help="a fake vLLM to try everything on, no GPU (hangwatch simulate --help)")
    commands.add_parser("demo", help="the whole chain on this machine, no Docker, no GPU: a busy server left alone, "
                                     "a hung one caught (hangwatch demo --help)")

    from hangwatch.rules import cli as rules_cli
    rules_cli.add_rules_arguments(_subcommand(
        commands, "rules", "write the Prometheus rules for your scrape interval, jobs and runbook"))
    rules_cli.add_dashboard_arguments(_subcommand(commands, "dashboard", "write the Grafana dashboard"))
    return parser


def version_line() -> str:
    """What ``hangwatch --version`` prints (the same values as the ``hangwatch_build_info`` series)."""
    return f"hangwatch {__version__} (Python {platform.python_version()})"


def run_check(args) -> int:
    if args.proxy and args.url:
        raise _usage("give either URL or --proxy URL, not both")
    url = args.proxy or args.url
    if not url:
        raise _usage("check needs a URL, e.g. hangwatch check http://127.0.0.1:8000")
    module = "proxy" if args.proxy else (args.module or "backend")
    if args.proxy and args.module not in (None, "proxy"):
        raise _usage("--proxy means --module proxy")
    progress = Progress(args.interval, shown=args.verbose or Progress.on_terminal(json_out=args.json))
    api_key = _api_key(args)
    if args.stalled_is_hung and not (args.liveness and args.stall_window):
        raise _usage("--stalled-is-hung needs --liveness and --stall-window")
    if args.liveness:
        return run_liveness(args, url, module, progress.reading, api_key=api_key, probe=args.probe)
    result = check(url, module=module, interval=args.interval, timeout=args.timeout, grace=args.grace,
                   stall_window=args.stall_window, engine=args.engine, api_key=api_key, probe=args.probe,
                   on_observation=progress.reading)
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
    outcome = liveness.run_with_deadline(lambda: liveness.bounded_check_async(
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
    """0: captured, with stacks; 1: refused, not hung (nothing captured); 2: hung, but no stack read."""
    from . import forensics
    from .forensics.gate import capture_if_hung
    api_key = _api_key(args)
    progress = Progress(args.interval, shown=Progress.on_terminal(json_out=args.json))

    def judge():
        result = check(args.url, module=args.module, interval=args.interval, timeout=args.timeout,
                       api_key=api_key, on_observation=progress.reading)
        if result.verdict.state == "hung":
            progress.say(f"hung: capturing the stacks of its processes (at most {args.deadline:g}s)")
        return result
    answer = capture_if_hung(args.url, judge, secrets=[api_key] if api_key else [], deadline=args.deadline,
                             native=args.native, with_locals=args.locals, py_spy=args.py_spy)
    stacks = forensics_stacks(answer)
    if answer["captured"]:
        progress.say(f"captured {len(answer['processes'])} process(es), {stacks} with stacks, "
                     f"in {answer.get('seconds', 0):.1f}s")
    if args.json:
        print(json.dumps(answer))
    elif not answer["captured"]:
        sys.stderr.write(f"hangwatch: {answer['errors'][0]}\n")
    else:
        print(forensics.render(answer))
    if not answer["captured"]:
        return 1
    return 0 if stacks else 2


def forensics_stacks(answer: dict) -> int:
    """How many captured processes have a stack (threads read by py-spy)."""
    return sum(1 for process in answer.get("processes", ()) if process.get("threads"))


def run_incidents(args) -> int:
    import os

    from . import incidents
    state_dir = args.state_dir or os.environ.get(incidents.STATE_DIR_ENV) or incidents.DEFAULT_STATE_DIR
    if args.last is not None and args.last < 0:
        raise _usage("--last: expected zero or a positive number")
    if args.show and (len(args.show) != 2 or args.show[0] != "show"):
        raise _usage("incidents: expected `incidents show ID` (or no words: the list)")
    if not args.show and not os.path.isdir(os.path.join(state_dir, "incidents")):
        # A machine whose webhook never restarted anything: nothing to list, which is no error.
        sys.stderr.write(f"hangwatch: no incidents recorded in {state_dir} (the webhook writes one per restart; "
                         f"another state_dir? --state-dir DIR)\n")
        print("[]" if args.json else incidents.table([]))
        return 0
    try:
        if args.show:
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


TOOLS = {  # subcommands with a parser of their own: everything after the name is theirs
    "simulate": ("hangwatch.simulator", "main"),
    "demo": ("hangwatch.demo.run", "main"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in TOOLS:
        import importlib
        module, name = TOOLS[argv[0]]
        return getattr(importlib.import_module(module), name)(argv[1:]) or 0
    parser = build_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
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
    parser.print_help(sys.stderr)  # `hangwatch --log-level x` and the like: options, no command
    return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
