"""The log-signature catalogue: each row names its own example and no other row's, the stack table's
names all have a class, and docs/signatures.md is what the tables generate."""
import pathlib

import pytest

from hangwatch.forensics import logsignatures, serverlog, signatures, signatures_doc
from hangwatch.forensics.logsignatures import CLASSES, LOG_SIGNATURES, POLICIES, STACK_CLASSES

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "signatures.md"


@pytest.mark.parametrize("row", LOG_SIGNATURES, ids=lambda r: r.name)
def test_each_row_matches_its_example_and_is_well_formed(row):
    found = logsignatures.match(["INFO an ordinary line", row.example, "INFO another"])
    assert found is not None and found.name == row.name and found.line == row.example
    assert row.klass in CLASSES and row.policy in POLICIES and row.source and row.server


def test_the_strings_of_the_issue_are_rows():
    said = ["No available shared memory broadcast block found", "RPC call to sample_tokens timed out",
            "EngineDeadError", "EngineCore encountered a fatal error", "Watchdog caught collective operation timeout",
            "an illegal memory access was encountered",
            "Health check failed. Server couldn't get a response from detokenizer",
            "token_to_kv_pool_allocator memory leak detected", "Timeout waiting for P side ready",
            "uncorrectable ECC error", "NVRM: Xid (PCI:0000:3b:00): 79"]
    assert all(logsignatures.match([text]) is not None for text in said)
    assert {logsignatures.match([t]).klass for t in said if "Xid" in t or "ECC" in t} == {"hardware"}


def test_hardware_wins_over_what_a_faulted_gpu_makes_the_engine_say():
    found = logsignatures.match(["EngineDeadError: EngineCore encountered an issue",
                                 "CUDA error: an illegal memory access was encountered"])
    assert (found.name, found.klass, found.policy) == ("cuda_illegal_memory_access", "hardware", "alert_only")


def test_ordinary_lines_match_nothing():
    assert logsignatures.match(["INFO: 127.0.0.1 - \"POST /v1/completions HTTP/1.1\" 200 OK",
                                "Loading safetensors checkpoint shards: 100%"]) is None


def test_every_stack_signature_has_a_class_and_an_unknown_name_is_invalid():
    assert set(STACK_CLASSES) == set(signatures.NAMES)
    assert set(STACK_CLASSES.values()) <= set(CLASSES)
    assert logsignatures.stack_class("sent_by_someone") == "invalid"
    assert logsignatures.stack_class(None) == "unknown"


def test_only_lines_since_the_container_started_count():
    from datetime import datetime, timezone
    started = datetime(2026, 12, 5, 7, 0, 0, tzinfo=timezone.utc)
    lines = ["2026-12-05T06:59:59.999999999Z before", "2026-12-05T07:00:00.000000001Z after",
             "not timestamped"]
    assert serverlog.since_start(lines, started) == ["after", "not timestamped"]
    assert serverlog.last_line_at(lines[:2]) == datetime(2026, 12, 5, 7, 0, 0, tzinfo=timezone.utc)


def test_journal_lines_read_like_dockers():
    class Done:
        returncode, stderr = 0, ""
        stdout = "2026-12-05T07:00:01.500000+0000 gpu-3 vllm[311]: No available shared memory broadcast block found\n"

    lines = serverlog.journal_tail("vllm.service", 10, run=lambda *a, **k: Done())
    assert serverlog.since_start(lines, None) == ["No available shared memory broadcast block found"]


def test_docs_signatures_md_is_generated_from_the_tables():
    assert DOC.read_text() == signatures_doc.render(), \
        "docs/signatures.md is stale: python -m hangwatch.forensics.signatures_doc > docs/signatures.md"
