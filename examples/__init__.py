"""The example configs, installed as ``hangwatch.examples``: ``hangwatch demo`` runs Prometheus and
Alertmanager with them, so the demo shows what users deploy. Copy the ``*.yml`` files; this marker
only makes the folder installable.
"""
