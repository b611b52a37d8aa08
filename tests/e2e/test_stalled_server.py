"""A server that accepts connections and never answers (a SIGSTOPped process), end to end.

Such a scrape lasts the exporter's whole budget, so Prometheus stores each reading (stamped
with the scrape's start) only when the budget is spent. The "twice in a row" of the rules
must hold across that delay: once hung, the state must stay hung, and the restart alert
must fire once — not flap between hung and down with every scrape.
"""
import time

import pytest

from hangwatch.demo.chain import HUNG
from hangwatch.demo.wait import wait_until
from harness.stack import Stack
from tests.support.require import require_binary

pytestmark = pytest.mark.real


@pytest.fixture
def stack(tmp_path):
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    # The shipped ratio: a 10 s timeout on a 15 s scrape (the rules' windows are two scrapes
    # plus the timeout); a silent target's readings land 1.9 s late here.
    stack = Stack(tmp_path, scrape_interval=3.0, scrape_timeout=2.0)
    stack.start()
    try:
        yield stack
    finally:
        stack.close()


def test_a_silent_server_stays_hung_and_alerts_once(stack):
    stack.sim.set_state("busy", n=2)
    stack.wait_state("busy", timeout=30)
    stack.sim.set_state("unresponsive")
    stack.wait_state("hung", timeout=40)
    states, deadline = [], time.monotonic() + 12  # four scrapes of 3 s
    while time.monotonic() < deadline:
        states.append(stack.state())
        time.sleep(0.25)
    assert set(states) == {"hung"}, f"the state left hung while the server stayed silent: {states}"
    wait_until(lambda: stack.receiver.alerts("/alerts", HUNG), 20, "the hang notification")
    assert len(stack.receiver.alerts("/alerts", HUNG)) == 1
