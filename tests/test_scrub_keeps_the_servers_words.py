"""Scrubbing takes secrets out of a log tail, not the server's words (issues 35 and 37 together).

The webhook scrubs the log tail before it matches it against the signature catalogue and records
it. A scrubber that redacts by substring ("token" in ``max_total_num_tokens``) rewrote SGLang's
KV-pool leak line, so the incident no longer held what the server said. Counts named like tokens
survive; credentials named like tokens do not.
"""
from __future__ import annotations

import re

import pytest

from hangwatch.forensics.logsignatures import LOG_SIGNATURES
from hangwatch.scrub import redact_argv, scrub_text, secret_named


@pytest.mark.parametrize("row", LOG_SIGNATURES, ids=[row.name for row in LOG_SIGNATURES])
def test_every_catalogue_line_survives_scrubbing(row):
    assert scrub_text(row.example) == row.example
    assert re.search(row.pattern, scrub_text(row.example))


@pytest.mark.parametrize("name, secret", [
    ("max_total_num_tokens", False), ("prompt_tokens", False), ("--max-num-batched-tokens", False),
    ("author", False), ("max_tokens", False),
    ("hf_token", True), ("HF_TOKEN", True), ("apiKey", True), ("x-api-key", True), ("accesstoken", True),
    ("--api-key", True), ("password", True), ("Authorization", True), ("session", True),
])
def test_secret_names_by_part_not_substring(name, secret):
    assert secret_named(name) is secret


def test_counts_stay_and_credentials_go():
    line = "Namespace(api_key=['k-one-0123', 'k-two-4567'], max_num_batched_tokens=2048, hf_token='hf_x')"
    scrubbed = scrub_text(line)
    assert "k-one" not in scrubbed and "k-two" not in scrubbed and "hf_x" not in scrubbed
    assert "max_num_batched_tokens=2048" in scrubbed
    assert redact_argv(["--max-num-batched-tokens", "2048", "--api-key", "a", "b"]) == \
        ("--max-num-batched-tokens", "2048", "--api-key", "<redacted>", "<redacted>")
