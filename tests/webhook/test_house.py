"""The webhook's, the rules' and the deploy generators' share of issue 27, checked rather than hoped for.

Small modules with one job, "engine" only ever meaning vLLM and its peers, and one loop behind the
generated deploy files.
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from hangwatch.webhook.worker import Worker

ROOT = Path(__file__).resolve().parents[2]
GENERATORS = (ROOT / "deploy" / "compose_configs.py", ROOT / "deploy" / "kubernetes" / "generate.py")
# The names and words the Docker side used for a Docker host before it was called one.
DOCKER_AS_ENGINE = re.compile(r"\bEngine(Error)?\b|(?-i:\bENGINE_\w+)|\bengine_deadline\b|\bengines_for\b|"
                              r"\b(self|policy)\.engines?\b|Docker engine|container engine|the default engine", re.IGNORECASE)


@pytest.mark.parametrize("path", sorted(ROOT.glob("webhook/*.py")), ids=lambda p: p.name)
def test_the_docker_side_speaks_of_docker_hosts_never_engines(path):
    found = [f"{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
             if DOCKER_AS_ENGINE.search(line)]
    assert not found, f"{path.name} calls a Docker host an engine:\n" + "\n".join(found)


@pytest.mark.parametrize("path", GENERATORS, ids=lambda p: p.name)
def test_every_deploy_generator_uses_the_one_check_loop(path):
    text = path.read_text()
    assert "generated_files.main(" in text
    assert "argparse" not in text and "stale" not in text.split('"""', 2)[2].split("def main", 1)[1], \
        f"{path.name} has its own --check loop again"


def test_waiting_for_the_worker_ends_at_its_deadline_and_as_soon_as_the_job_is_done():
    release = threading.Event()
    worker = Worker(lambda job: release.wait(30))
    assert worker.submit("vllm-a", object())
    started = time.monotonic()
    assert worker.wait_idle(0.3) is False
    assert 0.3 <= time.monotonic() - started < 5, "one deadline, neither cut short nor overrun"
    release.set()
    assert worker.wait_idle(10) is True and worker.in_progress() == 0
