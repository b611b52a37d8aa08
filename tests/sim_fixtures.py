"""Helpers for tests that read the vLLM simulator: parse pages, pick out samples, wait."""
from __future__ import annotations

import os
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

from hangwatch.demo.wait import wait_until as support_wait_until

# HANGWATCH_VLLM_CAPTURES points the comparison at another set of pages (e.g. a new capture).
CAPTURES = Path(os.environ.get("HANGWATCH_VLLM_CAPTURES")
                or Path(__file__).parent / "data" / "vllm-0.32")


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(text: str, name: str, **labels) -> float | None:
    """The value of the first sample called ``name`` whose labels include ``labels``."""
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def vllm_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:"))]


def scrape(sim) -> str:
    response = requests.get(sim.url + "/metrics", timeout=5)
    response.raise_for_status()
    return response.text


def wait_until(predicate, timeout: float = 5.0, what: str = "condition"):
    """``hangwatch.demo.wait.wait_until`` with the in-process simulator's short defaults."""
    return support_wait_until(predicate, timeout, what, interval=0.01)


def shape(text: str) -> dict:
    """family name -> (type, set of label-name sets, set of histogram le values)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        label_sets = {frozenset(k for k in s.labels if k not in ("le", "quantile")) for s in fam.samples}
        les = {s.labels["le"] for s in fam.samples if "le" in s.labels}
        out[fam.name] = (fam.type, label_sets, les)
    return out
