"""The GPU beside the hang: the rules ``hangwatch rules --gpu-labels`` adds, as data (a leaf).

``gpu.py`` writes them to ``hangwatch-gpu.yml``; ``render.py`` puts ``fault_alert`` first in the
hang alert's group. Both read this module, which reads neither: no import circle (issue 34).

A GPU with an Xid hangs vLLM again after every restart; dcgm-exporter says so, but nothing
joined its series to the hang. Rendered only when asked (a Prometheus without dcgm-exporter
would hold a rule that never matches), this file records each GPU group's recent Xid
(``gpu:hangwatch_xid:recent``: the Xid series of both naming generations, in the window, above 0,
kept by the join labels) and raises ``HangwatchGPUFault`` for a hung or stalled backend whose
join labels match it. The join labels are what both sides carry: a label the scrape configs set
on the hangwatch job and on dcgm-exporter alike (``node``, or ``target`` through relabelling).
``examples/alertmanager.yml`` inhibits the restart alert for that backend while it fires. The
alert has no ``for:``: it fires at the first evaluation that sees the hang, and Alertmanager holds
it before the restart alert, which waits its own ``for:`` (docs/gpu.md).
"""
from __future__ import annotations

import re

from hangwatch.settings import ConfigError, duration

from .settings import Settings
from .windows import format_duration

NAME = "hangwatch-gpu.yml"
# dcgm-exporter's Xid series. DCGM_FI_DEV_XID_ERRORS: the value of the last Xid (a gauge, every
# version's default counters). DCGM_EXP_XID_ERRORS_COUNT: the exporter's own count of Xid errors
# in its window, labelled xid (3.3.5-3.4.0 on). dcgm-exporter 4.9 renamed 23 default fields to their
# DCGM 4.7 names; the new name of the Xid field was not found in the sources at hand, so
# --gpu-xid-series adds it (or any other name) without a release of hangwatch.
XID_SERIES = ("DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT")
DEFAULT_WINDOW = 900.0
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_SERIES = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
RESERVED = {"state", "cause", "__name__"}


def labels(text: str) -> tuple[str, ...]:
    """``--gpu-labels node`` or ``node,gpu_slot``: Prometheus label names, each once."""
    found = tuple(part.strip() for part in text.split(",") if part.strip())
    if not found:
        raise ConfigError("--gpu-labels: expected one or more label names (e.g. node)")
    for name in found:
        if not _LABEL.match(name) or name in RESERVED:
            raise ConfigError(f"--gpu-labels: {name!r} is not a label name both series can carry")
    if len(set(found)) != len(found):
        raise ConfigError(f"--gpu-labels: {text!r} names a label twice")
    return found


def series_names(extra: tuple[str, ...]) -> tuple[str, ...]:
    for name in extra:
        if not _SERIES.match(name):
            raise ConfigError(f"--gpu-xid-series: {name!r} is not a metric name")
    return tuple(dict.fromkeys(XID_SERIES + tuple(extra)))


def window(text: str) -> float:
    return duration(text, "--gpu-window", low=60.0, high=7 * 86400.0)


def recording(on: tuple[str, ...], xid_window: float, xid_series: tuple[str, ...]) -> list[dict]:
    joined = ", ".join(on)
    names = "|".join(xid_series)
    return [{
        "name": "hangwatch-gpu",
        "interval": "${scrapes:0.2}",
        "rules": [
            {"comment": f"A GPU group ({joined}) that reported an Xid within {format_duration(xid_window)}: "
                        f"{', '.join(xid_series)}, whichever dcgm-exporter exposes; 1 per group.",
             "record": "gpu:hangwatch_xid:recent",
             "expr": f'max by ({joined}) (max_over_time({{__name__=~"{names}"}}[{format_duration(xid_window)}]) > 0)'
                     " * 0 + 1"}]}]


def fault_alert(settings: Settings) -> dict:
    """HangwatchGPUFault, which render.py puts first in the hang alert's own group: evaluated in the
    same pass as HangwatchBackendHung and without its ``for:``, it reaches Alertmanager at least one
    evaluation before the restart alert can, so the inhibition holds from the first notification."""
    on, xid_window, _ = settings.gpu
    joined = ", ".join(on)
    return {
        "comment": "Hung or stalled (as HangwatchBackendHung reads it) while a GPU it shares the join labels "
                   "with reported an Xid (gpu:hangwatch_xid:recent, hangwatch-gpu.yml): a restart reloads the "
                   "weights onto the same faulted card. No for:, and first in this group: it reaches "
                   "Alertmanager before the restart alert, which Alertmanager then inhibits.",
        "alert": "HangwatchGPUFault",
        "expr": ("max without (state) (max_over_time(target:hangwatch_backend_state:current"
                 f'{{state=~"hung|stalled"}}[${{scrapes:0.5}}])) == 1\nand on ({joined})\n  gpu:hangwatch_xid:recent'),
        "for": "0s",
        "labels": {"severity": "critical"},
        "annotations": {
            "summary": "{{ $labels.target }} hangs on a GPU that reported an Xid: not restarted",
            "description": (f"{{{{ $labels.target }}}} (container {{{{ $labels.container }}}}) is hung or "
                            f"stalled and a GPU it shares {joined} with reported an Xid error (dcgm-exporter) "
                            f"within {format_duration(xid_window)}. A restart would load the weights onto the "
                            "same card and hang again, so Alertmanager holds back the restart alert while "
                            "this fires. Drain the node and check the GPU (nvidia-smi -q, dmesg | grep Xid)."),
            "runbook_url": "${runbook:hangwatchgpufault}"}}
