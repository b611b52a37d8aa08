"""The Grafana dashboard, installed as ``hangwatch.dashboards`` (``hangwatch dashboard --out DIR``).

Grafana's file provider loads the ``*.json`` files here and ignores this marker.
"""
