"""The Grafana dashboard as shipped, with its runbook links pointing where the user keeps the runbook.

The dashboard (``grafana/dashboards/hangwatch.json``, installed as ``hangwatch.dashboards``)
links its panels to sections of the project's runbook (``render.RUNBOOK_URL``); ``hangwatch
dashboard --runbook-url URL`` writes it with those links moved to ``URL``.
"""
from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

from hangwatch.settings import ConfigError

from .render import RUNBOOK_URL

NAME = "hangwatch.json"


def shipped() -> str:
    return resources.files("hangwatch.dashboards").joinpath(NAME).read_text()


def links(dashboard: dict) -> list[dict]:
    """Every panel link (rows' nested panels included)."""
    found = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            found.extend(inner.get("links", []))
    return found


def render(runbook_url: str = RUNBOOK_URL) -> str:
    if not re.fullmatch(r"https?://\S+", runbook_url):
        raise ConfigError(f"--runbook-url: {runbook_url!r} is not an http(s) URL")
    dashboard = json.loads(shipped())
    for link in links(dashboard):
        if link["url"].startswith(RUNBOOK_URL):
            link["url"] = runbook_url + link["url"][len(RUNBOOK_URL):]
    return json.dumps(dashboard, indent=2) + "\n"


def write(out: Path, runbook_url: str = RUNBOOK_URL) -> Path:
    text = render(runbook_url)
    out.mkdir(parents=True, exist_ok=True)
    path = out / NAME
    path.write_text(text)
    return path
