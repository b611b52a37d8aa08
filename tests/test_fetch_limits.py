"""The fetch endings that only a limit tells apart, on real sockets: a connect that never
completes (unreachable: down, never the wedge of an accepted-but-silent server), a page that
never ends (cut off at the size cap: blind, not a timeout), and a silent server under a short
deadline (the reading ends at that deadline, not at some per-read timeout of its own).
"""
from __future__ import annotations

import asyncio
import itertools
import socket
import time

import pytest

from hangwatch.client import Client
from hangwatch.deadline import Deadline
from hangwatch.observation import BLIND, TIMEOUT, UNREACHABLE, Options
from hangwatch.observe import observe_backend
from hangwatch.verdict import judge
from tests.support.pages import Page, PageServer


def observed(url: str, seconds: float):
    client = Client()
    try:
        return asyncio.run(observe_backend(client, url, Deadline.after(seconds), Options(engine="vllm")))
    finally:
        client.close()


@pytest.fixture
def full_backlog():
    """A listening socket that never accepts, its one-place queue taken: the kernel drops further
    SYNs, so a connect() to it never completes — as a host that does not answer at all."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    taking = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        taking.close()
        listener.close()


def test_a_connect_that_never_completes_is_unreachable_not_a_stall(full_backlog):
    observation = observed(full_backlog, 0.5)
    assert (observation.status, judge([observation]).state) == (UNREACHABLE, "down"), observation
    # twice in a row is still down: only an accepted connection that stays silent repeats into hung
    assert judge([observation, observation]).state == "down"


def test_a_page_that_never_ends_is_cut_off_at_the_size_cap_and_blind():
    server = PageServer()
    server.pages["/metrics"] = Page(chunks=itertools.repeat(b"# " + b"x" * 65534 + b"\n"))
    try:
        observation = observed(server.url, 10.0)
    finally:
        server.stop()
    assert (observation.status, judge([observation]).state) == (BLIND, "blind"), observation


def test_a_silent_server_ends_the_reading_at_a_short_deadline():
    server = PageServer()
    server.pages["/metrics"] = Page(silent=True)
    try:
        started = time.monotonic()
        observation = observed(server.url, 0.3)
        took = time.monotonic() - started
    finally:
        server.stop()
    assert observation.status == TIMEOUT
    assert took < 0.3 * 5, f"a 0.3 s reading took {took:.2f}s"  # the bound is the feature: generously
