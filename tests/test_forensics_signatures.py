"""The signature table names the cause from py-spy dumps (tests/data/forensics/*.json)."""
from __future__ import annotations

import glob
import json
import os

import pytest

from hangwatch.forensics import NAMES, classify
from hangwatch.forensics.capture import _thread

DATA = os.path.join(os.path.dirname(__file__), "data", "forensics")
CASES = sorted(glob.glob(os.path.join(DATA, "*.json")))


def processes_of(case: dict) -> list[dict]:
    """The capture's own shape: as captured (``captured``), or from py-spy's raw `dump --json` threads."""
    if "captured" in case:
        return case["captured"]
    return [{"pid": p["pid"], "name": p["name"], "state": p["state"],
             "threads": [_thread(t, with_locals=False) for t in p["threads"]]} for p in case["processes"]]


@pytest.mark.parametrize("path", CASES, ids=lambda p: os.path.basename(p)[:-5])
def test_each_captured_dump_gets_its_signature_and_evidence(path):
    case = json.load(open(path))
    signature = classify(processes_of(case))
    assert signature.name == case["expect"], signature
    assert any(case["evidence_contains"] in line for line in signature.evidence), signature.evidence


def test_every_signature_the_issue_names_has_a_row_and_a_case():
    wanted = {"process_stopped", "nccl_collective", "cuda_synchronize", "vllm_shm_broadcast_dequeue", "tokenizer",
              "gil_holder", "unknown"}
    assert wanted <= set(NAMES)
    assert len(NAMES) == len(set(NAMES))
    covered = {json.load(open(p))["expect"] for p in CASES}
    assert set(NAMES) <= covered, set(NAMES) - covered


def test_an_idle_workers_dequeue_is_not_the_shm_signature():
    case = json.load(open(os.path.join(DATA, "all_idle_is_unknown.json")))
    assert classify(processes_of(case)).name == "unknown"


def test_a_stopped_process_wins_over_what_the_others_wait_on():
    case = json.load(open(os.path.join(DATA, "engine_stopped.json")))
    signature = classify(processes_of(case))
    assert signature.name == "process_stopped"
    assert "last stack" in signature.evidence[0] and "VLLM::EngineCore" in signature.evidence[0]


def test_no_stacks_at_all_is_unknown_and_says_so():
    signature = classify([{"pid": 1, "name": "x", "state": "S", "threads": []}])
    assert signature.name == "unknown" and "no stacks" in signature.evidence[0]
