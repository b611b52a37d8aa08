"""A capture by container ID on the real dockerd (issue 35): the webhook names the container it
knows, and the exporter reads that container's own processes — and refuses, reading nothing,
when the container named has no process where the target's address lives."""
from __future__ import annotations

import os

import pytest
import requests

from hangwatch.exporter.config import exporter_config
from hangwatch.forensics.pins import container_pids
from tests.webhook.real_parts import Backend, backend_image, docker_client, dockerd  # noqa: F401 (fixtures)

pytestmark = pytest.mark.real

FAST = {"liveness_interval": "0.5s", "liveness_timeout": "1s", "liveness_budget": "6s"}


def test_the_containers_own_processes_are_captured_by_its_id(docker_client, backend_image, tmp_path, exporters):
    target = Backend(docker_client, backend_image, tmp_path / "backends")     # hung, host network
    other = Backend(docker_client, backend_image, tmp_path / "backends")      # another container on this host
    try:
        _, exporter = exporters(exporter_config(FAST | {"allow_targets": [target.url], "forensics": {
            "enabled": True, "deadline": "20s", "min_interval": "0s"}}))

        def ask(container_id: str) -> dict:
            answer = requests.get(exporter + "/forensics", params={"target": target.url, "container": container_id},
                                  timeout=90)
            assert answer.status_code == 200, answer.text
            return answer.json()

        own = ask(target.container.id)
        members = set(container_pids(target.container.id))
        read = [p["pid"] for p in own["processes"]]
        assert read and set(read) <= members, (read, members, own["errors"])
        frames = {f["file"].rsplit("/", 1)[-1] for p in own["processes"] for t in p["threads"] for f in t["frames"]}
        assert "fake_backend.py" in frames, own["errors"]
        assert own["netns"] == [os.readlink(f"/proc/{read[0]}/ns/net")]
        # The other container listens on another port: naming it for this target reads nothing.
        wrong = ask(other.container.id)
        assert wrong["processes"] == [] and any("refused" in e or "no process" in e for e in wrong["errors"]), wrong
    finally:
        target.remove()
        other.remove()
