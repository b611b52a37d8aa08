"""hangwatch's Prometheus rules and Grafana dashboard, rendered for the Prometheus they run on.

``hangwatch rules`` and ``hangwatch dashboard`` (``hangwatch.rules.cli``) write them; the
templates ship inside the package (``templates/*.yml``), so a pip user has everything.
"""
