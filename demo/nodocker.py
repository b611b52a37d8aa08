"""``hangwatch webhook`` for the demo: the real app and server, the simulator standing in for Docker.

The webhook looks up the target's container before it re-checks (is it running, did it start
after the alert began?). The demo has no Docker engine, so this module hands the real
``create_app`` a restarter of its own: each stand-in container "runs" a simulator and
started when this process started; a restart (never sent in dry-run) restarts the simulator
through its control endpoint. Everything else — token, payload, triage, re-check, cooldown,
budget, ledger, decision log lines, /metrics, the server and its SIGTERM handling
(``server.serve``) — is the real webhook.

    python -m hangwatch.demo.nodocker --config webhook.yml --listen 127.0.0.1:9878 --dry-run \\
        --container vllm-sim=http://127.0.0.1:8000
"""
from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime, timezone

import requests

from hangwatch.settings import EXIT_CONFIG, ConfigError
from hangwatch.settings import listen_address as parse_listen
from hangwatch.webhook.app import create_app
from hangwatch.webhook.config import load_config, load_reset_token, load_token
from hangwatch.webhook.restarter import Container, ContainerNotFound
from hangwatch.webhook.server import serve


class SimulatorRestarter:
    """A ``Restarter`` over stand-in containers, each one a simulator reached at its URL."""

    def __init__(self, containers: dict[str, str]):
        self._urls = {name: url.rstrip("/") for name, url in containers.items()}
        now = datetime.now(timezone.utc)
        self._started = {name: now for name in containers}

    def find(self, name: str) -> Container:
        if name not in self._urls:
            raise ContainerNotFound(name)
        started = self._started[name]
        return Container(id=f"demo-{name}", name=name, status="running", running=True, restarting=False,
                         paused=False, started_at=started,
                         started_at_text=started.isoformat().replace("+00:00", "Z"))

    def restart(self, container: Container, stop_timeout: float) -> None:
        requests.post(self._urls[container.name] + "/_sim/state", json={"action": "restart"},
                      timeout=5).raise_for_status()
        self._started[container.name] = datetime.now(timezone.utc)

    def log_tail(self, container: Container, lines: int) -> list[str]:
        return ["(demo: the simulator keeps no container log)"]


def _container(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith("http"):
        raise argparse.ArgumentTypeError(f"expected NAME=URL, got {text!r}")
    return name, url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hangwatch.demo.nodocker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--listen", default="127.0.0.1:9878")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--container", type=_container, action="append", default=[],
                        help="NAME=SIMULATOR_URL: a stand-in container (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = load_config(args.config)
        token = load_token(config)
        reset_token = load_reset_token(config, token)
        host, port = parse_listen(args.listen)
    except ConfigError as exc:
        sys.stderr.write(f"demo webhook: {exc}\n")
        return EXIT_CONFIG
    dry_run = bool(config.dry_run or args.dry_run)
    app = create_app(config, token=token, reset_token=reset_token, dry_run=dry_run,
                     restarter=SimulatorRestarter(dict(args.container)))
    return serve(app, host, port, banner=f"demo: no Docker; stand-in containers: "
                                         f"{','.join(n for n, _ in args.container) or 'none'}; "
                                         f"dry_run={str(dry_run).lower()}")


if __name__ == "__main__":
    sys.exit(main())
