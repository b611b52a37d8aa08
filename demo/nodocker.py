"""``hangwatch webhook`` for the demo: the real app, with the simulator standing in for Docker.

The webhook looks up the target's container before it re-checks (is it running, did it start
after the alert began?). The demo has no Docker engine, so this module serves the real
``webhook.app.create_app`` with a one-container stand-in: the container "runs" the
simulator, started when this process started; a restart (never sent in dry-run) restarts the
simulator through its control endpoint. Everything else — token, payload, triage, re-check,
cooldown, budget, ledger, decision log lines, /metrics — is the real webhook.

    python -m demo.nodocker --config webhook.yml --listen 127.0.0.1:9878 --dry-run \\
        --container vllm-sim=http://127.0.0.1:8000
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from datetime import datetime, timezone

import requests
from docker.errors import NotFound

from hangwatch.settings import listen_address as parse_listen
from hangwatch.webhook.app import create_app
from hangwatch.webhook.config import ConfigError, load_config, load_token
from hangwatch.webhook.ledger import Ledger


class SimulatorContainer:
    """Just enough of ``docker.models.containers.Container`` for the webhook's decider."""

    def __init__(self, name: str, sim_url: str):
        self.name, self.id, self.sim_url = name, f"demo-{name}", sim_url.rstrip("/")
        self.started_at = datetime.now(timezone.utc)

    @property
    def attrs(self) -> dict:
        return {"State": {"Status": "running", "Running": True, "Paused": False, "Restarting": False,
                          "StartedAt": self.started_at.isoformat().replace("+00:00", "Z")}}

    def logs(self, tail: int = 100, timestamps: bool = False) -> bytes:
        return b"(demo: the simulator keeps no container log)\n"

    def restart(self, timeout: int = 10) -> None:
        requests.post(self.sim_url + "/_sim/state", json={"action": "restart"}, timeout=5).raise_for_status()
        self.started_at = datetime.now(timezone.utc)


class SimulatorDocker:
    """``client.containers.get(name)`` over a fixed set of stand-in containers."""

    def __init__(self, containers: dict[str, SimulatorContainer]):
        self._containers = containers

    @property
    def containers(self) -> "SimulatorDocker":
        return self

    def get(self, name: str) -> SimulatorContainer:
        if name not in self._containers:
            raise NotFound(f"No such container: {name}")
        return self._containers[name]


def _container(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url.startswith("http"):
        raise argparse.ArgumentTypeError(f"expected NAME=URL, got {text!r}")
    return name, url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.nodocker")
    parser.add_argument("--config", required=True)
    parser.add_argument("--listen", default="127.0.0.1:9878")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--container", type=_container, action="append", default=[],
                        help="NAME=SIMULATOR_URL: a stand-in container (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    try:
        config = load_config(args.config)
        token = load_token(config)
        host, port = parse_listen(args.listen)
    except ConfigError as exc:
        sys.stderr.write(f"demo webhook: {exc}\n")
        return 64
    docker = SimulatorDocker({name: SimulatorContainer(name, url) for name, url in args.container})
    app = create_app(config, token=token, docker_client=docker, ledger=Ledger(config.state_dir),
                     dry_run=bool(config.dry_run or args.dry_run))
    from werkzeug.serving import make_server
    server = make_server(host, port, app, threaded=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    signal.signal(signal.SIGINT, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    logging.getLogger("hangwatch.webhook").info(
        "webhook listening on http://%s:%d (demo: no Docker; stand-in containers: %s; dry_run=%s)",
        host, port, ",".join(n for n, _ in args.container) or "none",
        str(bool(config.dry_run or args.dry_run)).lower())
    server.serve_forever()
    state = app.extensions["hangwatch"]
    state.wait_idle(30)
    state.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
