"""hangwatch: keeps self-hosted LLM servers alive without ever hurting them.

This package is the verdict core — read a server's own counters, probe only at idle, judge
idle / busy / hung / restarted / blind / down — plus the shared settings toolkit and the
command line. Its faces are ``hangwatch.exporter`` (Prometheus) and ``hangwatch.webhook``
(the Alertmanager receiver that restarts); the core imports neither (docs/design.md). Run from
a checkout, the parts installed from other folders are found there (``checkout``).
"""
from .checkout import find_parts_in

__version__ = "0.3.0"

find_parts_in(__file__)
