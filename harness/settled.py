"""What a range query will show, read only where Prometheus can no longer change it.

A test that later asserts on ``query_range(expr, start, end, step)`` must wait for exactly that
evidence, not for a proxy of it. An instant query such as ``min_over_time(x[5s]) == 1`` is a proxy:
a window that holds one evaluation satisfies it, so it can be true before any step of the range
query falls on the state (CI went red that way: idle never appeared in the panel's range query).

A step ``t`` of a range query is *settled* once the series it reads has a sample at or after
``t``: Prometheus appends a recording rule's samples in time order, so nothing later can change
what the step at ``t`` reads. ``settled_points`` therefore ends the range at the newest
evaluation of the rule the expression reads, and every point it returns is one that the same
range query, asked again later with the same ``start`` and ``step``, returns unchanged.
"""
from __future__ import annotations

from typing import Protocol


class Queries(Protocol):
    def query(self, expr: str, at: float | None = None) -> list[dict]: ...
    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]: ...


def newest_evaluation(prometheus: Queries, series: str) -> float | None:
    """The timestamp of the newest sample of ``series`` (a recording rule's name), or None."""
    result = prometheus.query(f"max(timestamp({series}))")
    return float(result[0]["value"][1]) if result else None


def settled_points(prometheus: Queries, expr: str, reads: str, start: float,
                   step: float) -> list[tuple[float, float]]:
    """``(step time, value)`` of ``query_range(expr, start, …, step)`` at every settled step:
    those from ``start`` up to the newest evaluation of ``reads``, the series ``expr`` is built on.
    """
    newest = newest_evaluation(prometheus, reads)
    if newest is None or newest < start:
        return []
    return [(float(stamp), float(value))
            for series in prometheus.query_range(expr, start, newest, step)
            for stamp, value in series["values"]]


def shows(prometheus: Queries, expr: str, reads: str, start: float, step: float,
          value: float, since: float | None = None) -> list[float]:
    """The settled steps (at or after ``since``, when given) at which the range query shows
    ``value``: empty until the evidence a later assertion on the same query reads exists."""
    return [stamp for stamp, seen in settled_points(prometheus, expr, reads, start, step)
            if seen == value and (since is None or stamp >= since)]
