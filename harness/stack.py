"""The tests' view of the chain: what Prometheus recorded, and waits on it.

``hangwatch.demo.chain.Chain`` starts the exporter, Prometheus and Alertmanager from the shipped
examples (the demo uses it as it is); tests add here the questions they ask of it — the states the
rules recorded, whether a state held, when a series was last scraped — each wait with one deadline.
"""
from __future__ import annotations

import math
import time

from hangwatch.demo.chain import Chain
from hangwatch.demo.wait import wait_until


def window(seconds: float) -> str:
    """A PromQL range of at least ``seconds``, to the millisecond (whole seconds round it)."""
    return f"{max(1, math.ceil(seconds * 1000))}ms"


class Stack(Chain):
    """The chain, plus what tests read from Prometheus (see ``Chain`` for its arguments)."""

    @property
    def exporter_port(self) -> int:
        return self.exporter.port

    @property
    def prom_port(self) -> int:
        return self.prometheus.port

    @property
    def am_port(self) -> int:
        return self.alertmanager.port

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def by_target(self, expr: str) -> dict[str, float]:
        return {s["metric"].get("target", ""): float(s["value"][1]) for s in self.query(expr)}

    def states(self) -> dict[str, str]:
        """Every backend's current state, as the recording rules see it."""
        return {s["metric"]["target"]: s["metric"]["state"]
                for s in self.query("target:hangwatch_backend_state:current == 1")}

    def state(self, target: str | None = None) -> str | None:
        return self.states().get(target or self.default_target)

    def wait_states(self, expected: dict[str, str], timeout: float = 60.0) -> dict[str, str]:
        def reached():
            self.check_alive()
            states = self.states()
            return states if all(states.get(t) == s for t, s in expected.items()) else None
        try:
            return wait_until(reached, timeout, f"states {expected}", interval=0.2)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; now {self.states()}") from None

    def wait_state(self, state: str, timeout: float = 20.0, target: str | None = None) -> None:
        self.wait_states({target or self.default_target: state}, timeout)

    def ever(self, state: str, seconds: float, target: str | None = None) -> bool:
        """Was ``state`` 1 at any rule evaluation in the last ``seconds``? The window is those
        seconds to the millisecond: rounded to whole seconds it reached up to half a second before
        the span a caller meant (or fell as short of it), and 0.4 s became a whole second."""
        value = self.value(f'max_over_time(target:hangwatch_backend_state:current'
                           f'{{target="{target or self.default_target}",state="{state}"}}[{window(seconds)}])')
        return bool(value)

    def wait_judged(self, since: float, target: str | None = None, timeout: float | None = None) -> None:
        """Wait until the rules have judged a reading of ``target`` scraped at or after ``since``
        (``time.time()``). "Never hung up to ``since``" read before then is true for want of
        evidence: the last readings of the span are not judged yet. A scrape's samples carry its
        start time and land when it ends (up to a scrape timeout later); an evaluation stamped
        after that has them."""
        target = target or self.default_target

        def judged():
            self.check_alive()
            scraped = self.value(f'timestamp(up{{job="hangwatch",target="{target}"}})')
            evaluated = self.value(f'max(timestamp(target:hangwatch_backend_state:current{{target="{target}"}}))')
            return (scraped is not None and evaluated is not None and scraped >= since
                    and evaluated >= scraped + self.scrape_timeout)
        wait_until(judged, timeout or 4 * self.scrape_interval + 2 * self.scrape_timeout + 5,
                   f"the rules to judge a reading of {target} scraped after {since:.1f}", interval=0.2)

    def ever_state(self, target: str, state: str, seconds: float) -> bool:
        return self.ever(state, seconds, target)

    def latest_sample_time(self, metric: str, target: str | None = None) -> float:
        result = self.query(f'timestamp({metric}{{target="{target or self.default_target}"}})')
        return float(result[0]["value"][1]) if result else 0.0

    def state_history(self, seconds: float, target: str | None = None) -> list[tuple[float, str | None]]:
        """(seconds ago, state or None: no reading) every half scrape over the last ``seconds``:
        the evidence to show when a state was not what a test expected."""
        end, step = time.time(), self.scrape_interval / 2
        expr = f'target:hangwatch_backend_state:current{{target="{target or self.default_target}"}} == 1'
        at = {round(float(stamp), 3): series["metric"]["state"]
              for series in self.query_range(expr, end - seconds, end, step) for stamp, _ in series["values"]}
        return [(round(seconds - i * step, 1), at.get(round(end - seconds + i * step, 3)))
                for i in range(int(seconds / step) + 1)]
