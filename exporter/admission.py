"""Every rule the exporter's server holds against hostile or careless clients, in one leaf.

What one peer address may hold (connections, work slots), who gives way when the table is full
(the address holding the most), how long a head may take to arrive (``read_timeout``: a
slow-loris costs its own connection) and how long an idle keep-alive connection is kept, how
much a client may pipeline while its answer is worked on, which parsed heads are kept (only
those answered 200, bounded in bytes), and how work waits for a slot (round-robin between
addresses, then answered overloaded; work that paused, ``retake``, goes first). Nothing here
imports the server (only the wire, ``httpwire``): a connection is any object with
``client_record``, ``abort()`` and ``start_work()``.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .httpwire import MAX_HEAD_BYTES, Head, parse_head

IDLE_TIMEOUT = 120.0        # an idle keep-alive connection (Prometheus keeps them 5 min)
# While a request is answered, what the client sends meanwhile is kept up to this; past it, its
# connection is not read until the answer is out (pipelining past any sane head).
MAX_PIPELINED = MAX_HEAD_BYTES
# Heads answered 200 are kept parsed (Prometheus sends each target the same head every scrape):
# only heads of at most MAX_KEPT_HEAD bytes, KEPT_HEADS_BYTES of them in all (oldest out first).
# A head on an unknown path, or with a query its route refused, is never kept.
MAX_KEPT_HEAD = 1024
KEPT_HEADS_BYTES = 4 * 1024 * 1024
KEPT_HEAD_OVERHEAD = 1024   # what a kept head costs beside its bytes (its Head, dict, strings)


@dataclass(eq=False, slots=True)
class Peer:
    """One peer address: its connections (oldest first), the idle ones among them (evictable,
    oldest first), the work slots it holds and its work waiting for one (oldest first)."""

    address: str
    connections: dict[Any, None] = field(default_factory=dict)
    idle: OrderedDict[Any, None] = field(default_factory=OrderedDict)
    running: int = 0
    waiting: OrderedDict[Any, None] = field(default_factory=OrderedDict)


class HeadCache:
    """Parsed heads answered 200, by their bytes: bounded in bytes, oldest out first."""

    def __init__(self):
        self.kept: OrderedDict[bytes, Head] = OrderedDict()
        self.bytes = 0

    def parsed(self, head: bytes) -> Head:
        """``parse_head(head)``, from the kept heads when it is one."""
        return self.kept.get(head) or parse_head(head)

    def keep(self, head: bytes, parsed: Head) -> None:
        if len(head) > MAX_KEPT_HEAD or head in self.kept:
            return
        self.kept[head] = parsed._replace(headers=MappingProxyType(parsed.headers))  # shared: read-only
        self.bytes += len(head) + KEPT_HEAD_OVERHEAD
        while self.bytes > KEPT_HEADS_BYTES:
            oldest, _ = self.kept.popitem(last=False)
            self.bytes -= len(oldest) + KEPT_HEAD_OVERHEAD


class Admission:
    """The connection table, the work slots and the queue for them. Loop thread only.

    One address may hold all but a sixty-fourth of the table (room for others to connect without
    evicting, while one Prometheus' burst of 1,000 scrapes fits a table of 1,024), and all but an
    eighth of the work slots (a kubelet's /livez finds one free while another client keeps the rest
    busy; with fewer than 8, round-robin alone)."""

    def __init__(self, *, max_connections: int, workers: int, read_timeout: float,
                 max_client_connections: int | None = None, max_client_slots: int | None = None):
        self.max_connections, self.read_timeout = max_connections, read_timeout
        self.max_client_connections = max_client_connections or max(1, max_connections - max(1, max_connections // 64))
        self.max_client_slots = max_client_slots or max(1, workers - workers // 8)
        self.workers = workers
        self.dropped = dict.fromkeys(("read_timeout", "evicted", "refused", "bad_request"), 0)  # connections
        self.heads = HeadCache()
        self.connections: set[Any] = set()
        self.clients: dict[str, Peer] = {}
        self.free_slots = workers
        self.waiting: OrderedDict[Peer, None] = OrderedDict()  # addresses with waiting work, round-robin
        self.resuming: OrderedDict[asyncio.Future, Peer] = OrderedDict()  # paused work waiting for a slot again

    # -- counters a face can export (this module imports no metrics library), from the state itself --
    @property
    def connections_open(self) -> int:
        return len(self.connections)

    @property
    def work_running(self) -> int:
        return self.workers - self.free_slots

    @property
    def work_waiting(self) -> int:
        """Work not started yet, and paused work waiting for a slot again."""
        return sum(len(client.waiting) for client in self.waiting) + len(self.resuming)

    # -- connections ----------------------------------------------------------------------------
    def peer(self, address: str) -> Peer:
        client = self.clients.get(address)
        if client is None:
            client = self.clients[address] = Peer(address)
        return client

    def admit(self, connection: Any) -> bool:
        """Room for one more connection. An address at its own cap may only replace its own idle
        connection; at a full table the address holding the most gives way (its idle connection
        first, else its oldest), unless that is the newcomer's own (then only its idle one)."""
        client = connection.client_record
        if len(client.connections) >= self.max_client_connections:
            room = self._evict_from(client, busy_too=False)
        elif len(self.connections) >= self.max_connections:
            biggest = max(self.clients.values(), key=lambda c: len(c.connections))
            if len(biggest.connections) > len(client.connections):
                room = self._evict_from(biggest, busy_too=True)
            else:
                room = self._evict_from(client, busy_too=False)
        else:
            room = True
        if not room:
            self.dropped["refused"] += 1
            return False
        self.connections.add(connection)
        client.connections[connection] = None
        return True

    def _evict_from(self, client: Peer, busy_too: bool) -> bool:
        victim = next(iter(client.idle), None)
        if victim is None and busy_too:
            victim = next(iter(client.connections), None)
        if victim is None:
            return False
        self.dropped["evicted"] += 1
        victim.abort()
        return True

    def forget(self, connection: Any) -> None:
        client = connection.client_record
        self.connections.discard(connection)
        client.connections.pop(connection, None)
        client.idle.pop(connection, None)
        self.release(client)

    def release(self, client: Peer) -> None:
        """Drop an address's record once nothing of it is left (its slots included: a client
        that closes its connections still holds the slots their work runs in)."""
        if not client.connections and not client.running and not client.waiting:
            if self.clients.get(client.address) is client:
                del self.clients[client.address]

    # -- work slots ----------------------------------------------------------------------------
    def may_start(self, client: Peer) -> bool:
        """A slot is free for this address now (and none of its work waits before it)."""
        return self.free_slots > 0 and client.running < self.max_client_slots and not client.waiting

    def wait_for_slot(self, connection: Any) -> None:
        client = connection.client_record
        client.waiting[connection] = None
        self.waiting[client] = None

    def unqueue(self, connection: Any) -> bool:
        """Out of the waiting work; True if it was waiting."""
        return connection.client_record.waiting.pop(connection, 0) is None

    def take_slot(self, connection: Any) -> None:
        """The connection's work starts now (out of the waiting work, if it was there)."""
        self.unqueue(connection)
        self._hand(connection.client_record)

    def give_back(self, client: Peer) -> None:
        """A slot comes free (its connection may be gone): to waiting work, in turn."""
        self.free_slots += 1
        client.running -= 1
        self.release(client)
        self.start_waiting()

    async def retake(self, client: Peer, within: float) -> bool:
        """A slot again for work that gave its own back while it waited (``Connection.pause``):
        before any work not yet started, within ``within`` seconds or not at all (False)."""
        if not self.resuming and self.free_slots > 0 and client.running < self.max_client_slots:
            self._hand(client)
            return True
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self.resuming[waiter] = client
        timer = loop.call_later(within, lambda: waiter.done() or waiter.set_result(False))
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.give_back(client)  # handed a slot as the work was cancelled
            raise
        finally:
            timer.cancel()
            self.resuming.pop(waiter, None)

    def _hand(self, client: Peer) -> None:
        self.free_slots -= 1
        client.running += 1

    def start_waiting(self) -> None:
        """Give free slots to paused work first, then to waiting work, one address after
        another; an address at its own cap keeps its turn until one of its slots frees."""
        for waiter, client in list(self.resuming.items()):
            if self.free_slots <= 0:
                return
            if client.running < self.max_client_slots and not waiter.done():
                del self.resuming[waiter]
                self._hand(client)
                waiter.set_result(True)
        passed = 0  # addresses in a row whose turn started nothing
        while self.free_slots > 0 and passed < len(self.waiting):
            client, _ = self.waiting.popitem(last=False)
            if not client.waiting:
                continue
            self.waiting[client] = None  # to the back of the round
            if client.running >= self.max_client_slots:
                passed += 1
                continue
            connection, _ = client.waiting.popitem(last=False)
            if not client.waiting:
                del self.waiting[client]
            passed = 0
            connection.start_work()
