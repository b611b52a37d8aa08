"""The GPU beside the hang, on real parts: two simulated vLLMs on two nodes → hangwatch exporter →
Prometheus (the shipped rules and ``hangwatch rules --gpu-labels node``, retimed to a 1 s scrape)
beside two fake dcgm-exporters (``simulator/dcgm.py``) → Alertmanager (examples/alertmanager.yml's
routes and inhibit rule) → a recording receiver in the webhook's place.

Both backends freeze. The one whose node's GPU reported an Xid raises HangwatchGPUFault and its
restart alert is inhibited: Alertmanager holds it (``inhibitedBy``) and never sends it to the
webhook; the one on the healthy node is sent to the webhook as today.
"""
from __future__ import annotations

import dataclasses

import pytest

from hangwatch.demo.chain import HUNG
from hangwatch.demo.wait import wait_for_seconds, wait_until
from hangwatch.rules import gpu
from hangwatch.rules.render import shrunk, write
from hangwatch.simulator import Simulator
from hangwatch.simulator.dcgm import DcgmSimulator
from harness.stack import Stack
from tests.support.require import require_binary

pytestmark = pytest.mark.real

NODES = {"vllm-a": "gpu-1", "vllm-b": "gpu-2"}


class GpuStack(Stack):
    """The chain with a ``node`` label on each backend, a dcgm-exporter job per node and the GPU rules."""

    def __init__(self, workdir, dcgm: dict[str, DcgmSimulator], **kwargs):
        super().__init__(workdir, **kwargs)
        self.dcgm = dcgm

    def _groups(self, example_groups):
        groups = super()._groups(example_groups)
        for group in groups:
            node = NODES.get(group["labels"].get("target"))
            if node:
                group["labels"]["node"] = node
        return groups

    def rule_files(self):
        settings = dataclasses.replace(shrunk(self.scrape_interval), gpu=(("node",), 900.0, gpu.XID_SERIES))
        return [*write(self.workdir / "gpu", settings), gpu.write(self.workdir / "gpu", settings)]

    def prometheus_config(self):
        config = super().prometheus_config()
        interval = f"{self.scrape_interval:g}s"
        config["scrape_configs"].append({
            "job_name": "dcgm", "scrape_interval": interval, "scrape_timeout": interval,
            "static_configs": [{"targets": [sim.address], "labels": {"node": node}} for node, sim in self.dcgm.items()]})
        return config


@pytest.fixture
def stack(tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    sims = {name: Simulator().start(port=0) for name in NODES}
    dcgm = {node: DcgmSimulator(hostname=node).start() for node in NODES.values()}
    stack = GpuStack(tmp_path, dcgm, scrape_interval=1.0, targets={name: sim.url for name, sim in sims.items()})
    stack.sims = sims
    try:
        stack.start()
        yield stack
    finally:
        stack.close()
        for sim in sims.values():
            sim.stop()
        for server in dcgm.values():
            server.stop()


def held_by_inhibition(stack, target: str) -> bool:
    return any(a["labels"].get("alertname") == HUNG and a["labels"].get("target") == target
               and a["status"]["inhibitedBy"] for a in stack.alertmanager_alerts())


def test_a_gpu_fault_during_a_hang_keeps_the_restart_alert_from_the_webhook(stack):
    stack.dcgm["gpu-1"].set_xid(48)      # vllm-a's node: a double-bit ECC error
    for sim in stack.sims.values():
        sim.set_state("busy", n=3)
    stack.wait_states({"vllm-a": "busy", "vllm-b": "busy"})
    wait_until(lambda: stack.value('gpu:hangwatch_xid:recent{node="gpu-1"}') == 1, 20, "the Xid recorded")
    assert stack.value('gpu:hangwatch_xid:recent{node="gpu-2"}') is None
    for sim in stack.sims.values():
        sim.set_state("frozen")
    # The healthy node's hang reaches the webhook as today ...
    wait_until(lambda: [a for _, a in stack.receiver.alerts("/alerts", HUNG) if a["labels"]["target"] == "vllm-b"],
               30, "vllm-b's restart alert at the webhook")
    # ... the faulted one's is held by the inhibition, and people hear of the GPU fault.
    wait_until(lambda: held_by_inhibition(stack, "vllm-a"), 20, "vllm-a's restart alert inhibited in Alertmanager")
    wait_until(lambda: [a for _, a in stack.receiver.alerts("/people", "HangwatchGPUFault")
                        if a["labels"]["target"] == "vllm-a"], 20, "HangwatchGPUFault at the people receiver")
    wait_for_seconds(3, "three more group intervals", check=stack.check_alive)
    sent = [a["labels"]["target"] for _, a in stack.receiver.alerts("/alerts")]
    assert "vllm-a" not in sent, sent
    assert held_by_inhibition(stack, "vllm-a")
    assert not [a for _, a in stack.receiver.alerts("/people", "HangwatchGPUFault") if a["labels"]["target"] == "vllm-b"]
