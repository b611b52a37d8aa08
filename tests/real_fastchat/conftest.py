"""The real-FastChat tier: one FastChat deployment (controller, two workers, API server) for the package's tests.

The venv and the tiny model come from ``.ci/setup-fastchat.sh`` (``HANGWATCH_FASTCHAT_VENV``,
``HANGWATCH_FASTCHAT_MODEL``). Missing: a failure in CI, a skip elsewhere.
"""
import pytest

from tests.real_fastchat import fleet as fleet_mod
from tests.support.require import require


@pytest.fixture(scope="package")
def fastchat_fleet():
    """A started :class:`tests.real_fastchat.fleet.Fleet`; stopped by PID (thawed first) at the end."""
    require(fleet_mod.venv_usable(), f"FastChat venv at {fleet_mod.venv_path()} (make it with .ci/setup-fastchat.sh)")
    require(fleet_mod.model_built(), f"tiny model at {fleet_mod.model_path()} (made by .ci/setup-fastchat.sh)")
    fleet = fleet_mod.start_fleet(2)
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture
def fleet(fastchat_fleet):
    """The package's deployment with every worker thawed, idle and registered before the test
    (whatever ran before it), and every worker thawed after it."""
    fastchat_fleet.settle()
    try:
        yield fastchat_fleet
    finally:
        for worker in fastchat_fleet.workers:
            worker.thaw()
