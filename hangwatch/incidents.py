"""The restarts and their evidence, read back from the webhook's state_dir for people.

The webhook writes one incident record per restart (``state_dir/incidents/<ID>.json``: the
readings, the log tail, the stacks and their signature) and a ledger line per decision;
``hangwatch incidents`` lists them and ``incidents show ID`` prints one, which is where the
runbook starts. Reading is the core's (the CLI imports no face): the file layout is the seam.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

from .printable import printable

DEFAULT_STATE_DIR = "/var/lib/hangwatch"
STATE_DIR_ENV = "HANGWATCH_STATE_DIR"
LEDGERS = ("ledger.jsonl.1", "ledger.jsonl")  # the compacted generation first, then the live file


class IncidentError(Exception):
    """The state_dir or an incident cannot be read."""


@dataclass(frozen=True)
class Summary:
    id: str
    decided_at: str | None
    target: str | None
    verdict: str | None
    signature: str | None
    action: str
    outcome: str | None      # the restart's result: ok / failed (None: not recorded)
    recovered: bool | None   # None: no recovery watch recorded either way
    klass: str | None = None   # the signature class (log row's, else the stack's): docs/signatures.md
    policy: str | None = None  # what that class called for: restart | alert_only

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "klass"}
        return out | {"class": self.klass}


def incident_ids(state_dir: str) -> list[str]:
    directory = os.path.join(state_dir, "incidents")
    if not os.path.isdir(directory):
        raise IncidentError(f"{directory}: no such directory (is --state-dir the webhook's state_dir?)")
    return sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(directory, "*.json")))


def read_incident(state_dir: str, incident_id: str) -> dict:
    if not incident_id or "/" in incident_id or incident_id.startswith("."):
        raise IncidentError(f"{incident_id!r} is not an incident ID (see `hangwatch incidents`)")
    path = os.path.join(state_dir, "incidents", f"{incident_id}.json")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise IncidentError(f"no incident {incident_id!r} in {state_dir}") from None
    except (OSError, ValueError) as exc:
        raise IncidentError(f"{path}: cannot read: {exc}") from None


def _ledger_events(state_dir: str) -> list[dict]:
    events = []
    for name in LEDGERS:
        try:
            with open(os.path.join(state_dir, name), "rb") as handle:
                for line in handle:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict) and record.get("event") in ("restart", "recovered", "decision"):
                        events.append(record)
        except OSError:
            continue
    return events


def summaries(state_dir: str, last: int | None = None) -> list[Summary]:
    """The newest ``last`` incidents (all when None), oldest first."""
    ids = incident_ids(state_dir)
    if last is not None:
        ids = ids[-last:] if last > 0 else []
    events = _ledger_events(state_dir)
    by_path = {e.get("incident"): e for e in events if e["event"] == "restart"}
    outcomes = {e.get("incident"): e.get("result") for e in events if e["event"] == "decision" and e.get("incident")}
    recovered = {(e.get("target"), e.get("restart_at")) for e in events if e["event"] == "recovered"}
    out = []
    for incident_id in ids:
        try:
            record = read_incident(state_dir, incident_id)
        except IncidentError:
            out.append(Summary(incident_id, None, None, None, None, "unreadable", None, None))
            continue
        path = os.path.join(state_dir, "incidents", f"{incident_id}.json")
        restart = next((e for p, e in by_path.items() if p and os.path.basename(p) == os.path.basename(path)), None)
        outcome = next((o for p, o in outcomes.items() if os.path.basename(p) == os.path.basename(path)), None)
        was_recovered = None
        if restart is not None and record.get("group") is not None:
            was_recovered = (record.get("target"), restart.get("at")) in recovered
        out.append(Summary(
            id=incident_id, decided_at=record.get("decided_at"), target=record.get("target"),
            verdict=(record.get("recheck") or {}).get("verdict"),
            signature=record.get("signature") or ((record.get("log_signature") or {}).get("name")),
            action=record.get("action", "restart"), outcome=outcome, recovered=was_recovered,
            klass=record.get("class"), policy=record.get("policy")))
    return out


def table(rows: list[Summary]) -> str:
    head = ("ID", "TIME", "TARGET", "VERDICT", "SIGNATURE", "CLASS", "POLICY", "ACTION", "RECOVERED")
    lines = [head] + [(r.id, r.decided_at or "-", r.target or "-", r.verdict or "-", r.signature or "-",
                       r.klass or "-", r.policy or "-", r.action + (f" ({r.outcome})" if r.outcome else ""),
                       {True: "yes", False: "no", None: "-"}[r.recovered]) for r in rows]
    lines = [tuple(printable(cell) for cell in line) for line in lines]  # a record's text never drives a terminal
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def render(record: dict, incident_id: str) -> str:
    """One incident for a person: the decision, the signature with its evidence, the readings, the stacks."""
    forensics = record.get("forensics") or {}
    out = [f"incident {incident_id}",
           f"  target:     {record.get('target')} (container {record.get('container')}, {record.get('url')})",
           f"  decided at: {record.get('decided_at')}   alert began: {(record.get('alert') or {}).get('startsAt')}",
           f"  verdict:    {(record.get('recheck') or {}).get('verdict')}: {(record.get('recheck') or {}).get('reason')}",
           f"  signature:  {record.get('signature') or '-'}" + (f": {forensics.get('cause')}" if forensics.get("cause") else "")]
    said = record.get("log_signature") or {}
    if record.get("class"):
        out.append(f"  class:      {record.get('class')}, policy {record.get('policy')}"
                   + (" (not restarted: a restart cannot help; see docs/signatures.md)"
                      if record.get("policy") == "alert_only" else ""))
    if said:
        out.append(f"  log said:   {said.get('name')}: {said.get('line')}")
    out += [f"    evidence: {line}" for line in forensics.get("evidence") or ()]
    out += [f"    error:    {line}" for line in forensics.get("errors") or ()]
    out.append("  readings:")
    for observation in record.get("observations") or ():
        reading = observation.get("reading") or {}
        load = " ".join(f"{k}={reading[k]}" for k in ("in_flight", "running", "waiting") if k in reading)
        probe = (observation.get("probe") or {}).get("outcome")
        out.append(f"    {observation.get('status')} {load}" + (f" probe={probe}" if probe else ""))
    out += stacks(forensics)
    logs = record.get("logs") or []
    if logs:
        out.append(f"  log tail ({len(logs)} lines):")
        out += [f"    {line}" for line in logs[-20:]]
    return "\n".join(printable(line) for line in out)  # escape sequences from a backend's logs stay text


def stacks(capture: dict) -> list[str]:
    out = []
    for process in capture.get("processes") or ():
        out.append(f"  process {process.get('pid')} {process.get('name')} state {process.get('state')}")
        for thread in process.get("threads") or ():
            out.append(f"    thread {thread.get('name')}{' (holds the GIL)' if thread.get('owns_gil') else ''}")
            out += [f"      {f.get('name')} ({f.get('file')}:{f.get('line')})" for f in thread.get("frames") or ()]
    return [printable(line) for line in out]
