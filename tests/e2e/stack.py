"""Moved: the one stack of the tests, the demo and the benchmarks is ``tests.support.stack``.

Only ``bench/bench_alert_latency.py`` still imports this name; import ``tests.support.stack``
(and ``tests.support.wait``) instead, then delete this file.
"""
from tests.support.stack import RULE_FILES, TOKEN, Stack, load_retime  # noqa: F401
from tests.support.wait import wait_until  # noqa: F401
