import pytest

from hangwatch.webhook.app import create_app
from hangwatch.webhook.config import parse_config

from .fakes import TOKEN, FakeClock, FakeRechecker, FakeRestarter, alert, iso
from .real_parts import backend, backend_image, docker_client, dockerd  # noqa: F401 (fixtures)


def make_config(state_dir, **overrides):
    raw = {
        "state_dir": str(state_dir),
        "recheck": {"interval": "1s", "timeout": "1s"},
        "cooldown": "15m",
        "budget": {"restarts": 3, "window": "1h"},
        "targets": [
            {"name": "vllm-a", "container": "vllm-a", "url": "http://127.0.0.1:18000", "stop_timeout": "30s"},
            {"name": "vllm-b", "container": "vllm-b", "url": "http://127.0.0.1:18001"},
        ],
    }
    raw.update(overrides)
    return parse_config(raw)


class Harness:
    """One app with fakes; ``post`` sends an authorized payload; ``settle`` waits for the worker."""

    def __init__(self, state_dir, clock=None, restarter=None, rechecker=None, reset_token=None, forensics=None,
                 **config):
        self.state_dir = state_dir
        self.clock = clock or FakeClock()
        self.restarter = restarter or FakeRestarter(self.clock)
        self.rechecker = rechecker or FakeRechecker()
        self.config = make_config(state_dir, **config)
        self.app = create_app(self.config, token=TOKEN, reset_token=reset_token, restarter=self.restarter,
                              clock=self.clock, rechecker=self.rechecker, forensics=forensics)
        self.state = self.app.extensions["hangwatch"]
        self.client = self.app.test_client()

    def alert(self, **kwargs):
        """A firing alert that began a minute ago (after the fake container started)."""
        kwargs.setdefault("starts_at", iso(self.clock() - 60))
        return alert(**kwargs)

    def decisions(self):
        import json
        with open(self.state_dir / "ledger.jsonl") as handle:
            return [r for r in map(json.loads, handle) if r["event"] == "decision"]

    def post(self, body, headers=None):
        return self.client.post("/alerts", json=body, headers={"Authorization": f"Bearer {TOKEN}"}
                                if headers is None else headers)

    def settle(self, timeout=10.0):
        assert self.state.wait_idle(timeout), "worker did not finish"

    def close(self):
        self.settle()
        self.state.close()


@pytest.fixture
def harness(tmp_path):
    made = []

    def build(**kwargs):
        h = Harness(kwargs.pop("state_dir", tmp_path / "state"), **kwargs)
        made.append(h)
        return h

    yield build
    for h in made:
        h.close()
