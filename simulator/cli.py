"""``hangwatch simulate`` (``python -m hangwatch.simulator``): serve the simulator and play a scenario.

A demo or a compose service drives the simulator from outside: a scenario of timed states plays in a
thread while the server answers; a bad scenario fails at start-up with exit 64, as every hangwatch command.

    hangwatch simulate --listen 127.0.0.1:8000 --scenario busy-then-hang
"""
from __future__ import annotations

import json
import math
import signal
import sys
import threading

from hangwatch.flags import Parser, listen
from hangwatch.settings import EXIT_CONFIG, ConfigError, not_utf8, parse_yaml, secret_file

from .engine import VLLM_VERSION
from .server import STATES, Simulator

SCENARIOS = {
    "busy-then-hang": [{"state": "idle", "for": 5}, {"state": "busy", "n": 3, "for": 20},
                       {"state": "frozen"}],
    "long-prefill": [{"state": "long_prefill", "prompt_tokens": 30000}],
    "hang-and-recover": [{"state": "busy", "n": 2, "for": 15}, {"state": "frozen", "for": 30},
                         {"state": "busy", "n": 2, "for": 15}],
    "restart-loop": [{"state": "busy", "n": 2, "for": 20}, {"action": "restart"}],
}



def load_scenario(spec: str) -> list[dict]:
    """A built-in scenario name, a state name, or a JSON/YAML file of steps:
    ``[{"state": "busy", "n": 3, "for": 10}, {"state": "frozen"}, {"action": "restart"}]``."""
    if spec in SCENARIOS:
        return [dict(step) for step in SCENARIOS[spec]]
    if spec in STATES:
        return [{"state": spec}]
    try:
        with open(spec, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ConfigError(f"--scenario: {spec!r} is not a state, a built-in scenario or a file "
                          f"(states: {', '.join(STATES)}; scenarios: {', '.join(SCENARIOS)})") from None
    except OSError as exc:
        raise ConfigError(f"--scenario: cannot read {spec}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--scenario: {spec}: not UTF-8: {not_utf8(data, exc)}") from None
    try:
        steps = json.loads(text)
    except ValueError:
        steps = parse_yaml(text, f"--scenario: {spec}")  # YAML is a superset of JSON: its error says more
    if isinstance(steps, dict):
        steps = steps.get("steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
        raise ConfigError(f"--scenario: {spec}: a scenario is a list of steps, e.g. "
                          '[{"state": "busy", "n": 3, "for": 10}, {"state": "frozen"}]')
    return steps


def run_scenario(sim: Simulator, steps: list[dict], stop: threading.Event,
                 loop: bool = False) -> None:
    while True:
        for step in steps:
            step = dict(step)
            seconds = step.pop("for", None)
            if step.pop("action", None) == "restart":
                sim.restart()
            else:
                sim.set_state(step.pop("state", "idle"), **step)
            if seconds is None:
                return
            if stop.wait(float(seconds)):
                return
        if not loop:
            return


def check_steps(steps: list[dict], spec: str) -> None:
    """Every step names a known state or action, and ``for`` is seconds: a typo fails at start-up,
    not in the scenario's thread minutes later."""
    for number, step in enumerate(steps):
        action, state, seconds = step.get("action"), step.get("state", "idle"), step.get("for")
        if action not in (None, "restart"):
            raise ConfigError(f"{spec}: step {number}: unknown action {action!r} (known: restart)")
        if action is None and state not in STATES:
            raise ConfigError(f"{spec}: step {number}: unknown state {state!r} (known: {', '.join(STATES)})")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 <= seconds < math.inf):
            raise ConfigError(f"{spec}: step {number}: for: {seconds!r} is not a number of seconds")


EXIT_CODES = "exit codes: 0 stopped by SIGTERM or SIGINT; 64 bad usage, scenario or address"


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="hangwatch simulate", epilog=EXIT_CODES,
                    description="A fake vLLM 0.32 server for demos and tests, driven into any state hangwatch "
                                "judges\n(POST /_sim/state {\"state\": \"frozen\"}; also python -m hangwatch.simulator).")
    parser.add_argument("--listen", type=listen, default=("127.0.0.1", 8000), metavar="HOST:PORT",
                        help="where to listen: HOST:PORT or :PORT (default 127.0.0.1:8000; 0.0.0.0:8000 in a container)")
    parser.add_argument("--control-listen", type=listen, default=None, metavar="HOST:PORT",
                        help="also serve /_sim/state on this address, apart from the simulated server: it answers "
                             "in every state, dead included (default: on --listen only)")
    parser.add_argument("--model", default="tiny-llama", help="served model name")
    parser.add_argument("--multiprocess", action="store_true",
                        help="page as with --api-server-count > 1 (no process_/python_/_created)")
    parser.add_argument("--scenario", help=f"a state, a built-in ({', '.join(SCENARIOS)}) "
                                           "or a JSON/YAML file of steps")
    parser.add_argument("--loop", action="store_true", help="repeat the scenario")
    parser.add_argument("--api-key-file", metavar="FILE", help="as vLLM --api-key: /v1/* answers 401 without this key")
    args = parser.parse_args(argv)
    host, port = args.listen
    try:
        steps = load_scenario(args.scenario) if args.scenario else []
        check_steps(steps, args.scenario)
        api_key = secret_file(args.api_key_file, "--api-key-file") if args.api_key_file else None
    except ConfigError as exc:
        sys.stderr.write(f"hangwatch simulate: {exc}\n")
        return EXIT_CONFIG
    control = args.control_listen
    try:
        sim = Simulator(args.model, multiprocess=args.multiprocess, host=host, api_key=api_key).start(
            port, control_port=control[1] if control else None, control_host=control[0] if control else None)
    except OSError as exc:  # as the exporter: an address this host cannot bind is a bad config
        sys.stderr.write(f"hangwatch simulate: cannot listen on {host}:{port}: {exc.strerror or exc}\n")
        return EXIT_CONFIG
    stop = threading.Event()

    def _stop(*_):
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"simulator: vLLM {VLLM_VERSION} model={args.model} listening on {sim.url}"
          + (f"; controls on {sim.control_url}/_sim/state" if control else ""), flush=True)
    if steps:
        threading.Thread(target=run_scenario, args=(sim, steps, stop, args.loop),
                         daemon=True).start()
    stop.wait()
    sim.stop()
    return 0
