"""The one reading of a ``/probe``, ``/livez`` or ``/readyz`` query: which target, how, or why not.

Each of those routes sends requests — with an API key, perhaps — to the URL a client names,
so each must say no alike: ``/livez`` once kept its own copy of these checks and drifted (it
echoed ``user:password@`` back). Here, once: a target of the form ``http(s)://HOST[:PORT]``
(a base path only for that exact URL in ``allow_targets``), a known module and probe kind
(else 400, which says what is wrong and never repeats what was sent), a target inside
``allow_targets`` and a module the config allows for it (else 403). A query may narrow what
the config allows for a target, never widen it (``ExporterConfig.options_for``).
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs

from hangwatch.modules import MODULES
from hangwatch.observation import PROBE_KINDS, Options
from hangwatch.settings import url_problem

from .config import ExporterConfig

MAX_SHOWN = 40  # characters of an unknown module or probe name repeated in a 400


@dataclass(frozen=True)
class Asked:
    """A good query: where to read, with which module, and how (the API key and probe kind)."""

    target: str
    module: str
    options: Options


@dataclass(frozen=True)
class Refused:
    """A bad query: the HTTP code (400 or 403) and one line saying why, holding no secret."""

    code: int
    why: str


def asked(query: str, config: ExporterConfig) -> Asked | Refused:
    """``query`` (the part after ``?``) read against ``config``: an ``Asked`` or a ``Refused``."""
    params = parse_qs(query, keep_blank_values=True)
    targets, modules, probes = params.get("target", []), params.get("module", [""]), params.get("probe", [""])
    if len(targets) != 1 or len(modules) != 1 or len(probes) != 1:
        return Refused(400, "exactly one target= (and at most one module= and probe=) is required")
    module, probe = modules[0], probes[0] or None
    if module and module not in MODULES:
        return Refused(400, f"unknown module {module[:MAX_SHOWN]!r} (known: {', '.join(MODULES)})")
    if probe is not None and probe not in PROBE_KINDS:
        return Refused(400, f"unknown probe {probe[:MAX_SHOWN]!r} (known: {', '.join(PROBE_KINDS)})")
    text = targets[0]
    problem = url_problem(text, allow_path=True)
    if problem:
        return Refused(400, f"target: the URL {problem}")
    target = text.rstrip("/")
    if not config.allows(target):
        return Refused(403, "target is not in the exporter's allow_targets")
    if "/" in target.split("://", 1)[1] and target not in config.allow_targets:
        return Refused(400, "target: must be http(s)://HOST[:PORT] without a path "
                            "(a base path only when that exact URL is in allow_targets)")
    configured = config.module_for(target)
    module = module or configured or "backend"
    if configured is not None and module != configured:
        return Refused(403, f"module {module!r} is not the one this target is configured with (targets[].module)")
    return Asked(target, module, config.options_for(target, probe))
