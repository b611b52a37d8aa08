#!/usr/bin/env python3
"""What each attack costs the exporter: peak memory, and whether it still answers.

    python bench/bench_attacks.py [--only table_fill,heads,...] [--exporter-ref COMMIT] [--json FILE]

How it measures: bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from processes import Exporter, Fleet, _stop, free_port, raise_fd_limit  # noqa: E402

from hangwatch.forensics.processes import CLOSE_WAIT, TCP_TABLES, socket_rows  # noqa: E402

MiB = 2**20
HEALTH_PATHS = ("/metrics", "/livez", "/readyz")
# The attacker's source address: another client than the health checks (127.0.0.1), as one on
# another host would be, so a server that caps per client can tell them apart (all of
# 127.0.0.0/8 is loopback on Linux).
ATTACKER = ("127.0.0.2", 0)


# -- measuring ---------------------------------------------------------------------------------------
def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(value.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


class RssWatch:
    """The largest VmRSS of ``pid``, sampled every 50 ms on a thread, until ``stop()``."""

    def __init__(self, pid: int):
        self.pid, self.largest, self._done = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._done.is_set():
            try:
                self.largest = max(self.largest, memory(self.pid)[0])
            except OSError:
                return
            self._done.wait(0.05)

    def stop(self) -> int:
        self._done.set()
        self._thread.join(2)
        return self.largest


def http_get(port: int, path: str, timeout: float, headers: str = "") -> tuple[int | None, bytes]:
    """One GET on a fresh connection: (status or None, body) within ``timeout`` in all."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Connection: close\r\n\r\n"
                         .encode())
            data = b""
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if _complete(data):
                    break
    except OSError:
        return None, b""
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        return int(head.split(b" ", 2)[1]), body
    except (IndexError, ValueError):
        return None, b""


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value)
    return False


HEALTHY = {"url": ""}   # a healthy backend for /livez and /readyz (main starts one)


def answered(port: int, each: int = 10, timeout: float = 5.0) -> str:
    """How many of ``each`` fresh requests to each of /metrics, /livez, /readyz (of a healthy
    backend, as a kubelet asks) got a 200."""
    query = f"?target={HEALTHY['url']}"
    paths = [p + ("" if p == "/metrics" else query) for p in HEALTH_PATHS for _ in range(each)]
    with ThreadPoolExecutor(len(paths)) as pool:
        codes = list(pool.map(lambda p: http_get(port, p, timeout)[0], paths))
    per = {p: sum(1 for q, c in zip(paths, codes) if q.split("?")[0] == p and c == 200) for p in HEALTH_PATHS}
    return f"{sum(per.values())}/{len(paths)} (" + ", ".join(f"{p} {n}" for p, n in per.items()) + ")"


class Pipelined:
    """A raw keep-alive connection that sends many requests and counts whole answers."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=ATTACKER)
        self.buffer = b""
        self.statuses: dict[int, int] = {}

    def answers(self, count: int, deadline: float) -> int:
        """Read until ``count`` answers are whole (or the deadline, or the peer closed)."""
        got = 0
        while got < count:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end >= 0:
                head = self.buffer[:head_end]
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(self.buffer) >= head_end + 4 + length:
                    status = int(head.split(b" ", 2)[1])
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                    self.buffer = self.buffer[head_end + 4 + length:]
                    got += 1
                    continue
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 20)
            except OSError:
                return got
            if not chunk:
                return got
            self.buffer += chunk
        return got

    def close(self):
        self.sock.close()


# -- hostile and silent backends ------------------------------------------------------------------------
class Backend:
    """A loopback server whose every connection runs ``serve(conn)`` on its own thread."""

    def __init__(self, serve):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.port = self.listener.getsockname()[1]
        self.serve, self.stopping, self.requests = serve, threading.Event(), threading.Event()
        self.sent = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            conn.settimeout(10)
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.requests.set()
            self.serve(self, conn)
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self):
        self.stopping.set()
        self.listener.close()


ENDLESS_SECONDS, ENDLESS_BYTES = 6.0, 512 * MiB


def endless_trailer(backend: Backend, conn: socket.socket) -> None:
    """200, chunked, the last chunk, then one trailer line that never ends."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"0\r\nX-Trailer: ")
    block = b"a" * 65536
    ends, sent = time.monotonic() + ENDLESS_SECONDS, 0
    while sent < ENDLESS_BYTES and time.monotonic() < ends and not backend.stopping.is_set():
        conn.sendall(block)
        sent += len(block)
        backend.sent += len(block)


def never_answers(backend: Backend, conn: socket.socket) -> None:
    backend.stopping.wait(30)


# -- the attacks ----------------------------------------------------------------------------------------
def table_fill(exporter: Exporter, workdir: Path) -> dict:
    request = f"GET /livez HTTP/1.1\r\nHost: 127.0.0.1:{exporter.port}\r\n\r\n".encode() * 20
    socks, refused = [], 0
    for _ in range(1030):
        try:
            sock = socket.create_connection(("127.0.0.1", exporter.port), timeout=2, source_address=ATTACKER)
            sock.sendall(request)
            socks.append(sock)
        except OSError:
            refused += 1
    time.sleep(0.5)  # the exporter takes in what was sent (no condition to wait on from outside)
    try:
        result = {"answered": answered(exporter.port), "detail": f"{len(socks)} attacking connections opened, "
                                                                 f"{refused} refused at connect"}
    finally:
        for sock in socks:
            sock.close()
    return result


def distinct_head(i: int) -> bytes:
    """~1 KB: a distinct unknown path and 95 short headers (each a parsed name and value)."""
    fields = "".join(f"x{j:02d}:{i % 10000:04d}\r\n" for j in range(95))
    return f"GET /nope/{i:06d} HTTP/1.1\r\nHost: 127.0.0.1\r\n{fields}\r\n".encode()


def heads(exporter: Exporter, workdir: Path) -> dict:
    total, per_batch, connections = 20000, 100, 8
    conns: list[Pipelined | None] = [None] * connections
    sent = answered_count = reopened = refused = 0
    statuses: dict[int, int] = {}
    deadline = time.monotonic() + 60
    try:
        while sent < total and time.monotonic() < deadline:
            for k in range(connections):
                if conns[k] is None:
                    try:
                        conns[k] = Pipelined(exporter.port)
                    except OSError:
                        refused += 1
                        time.sleep(0.05)
                        continue
                conn = conns[k]
                batch = b"".join(distinct_head(sent + i) for i in range(per_batch))
                sent += per_batch
                try:
                    conn.sock.sendall(batch)
                except OSError:
                    pass
                got = conn.answers(per_batch, min(deadline, time.monotonic() + 10))
                answered_count += got
                if got < per_batch:  # the server closed it (or stopped answering): a new one
                    for code, n in conn.statuses.items():
                        statuses[code] = statuses.get(code, 0) + n
                    conn.close()
                    conns[k] = None
                    reopened += 1
    finally:
        for conn in conns:
            if conn is not None:
                for code, n in conn.statuses.items():
                    statuses[code] = statuses.get(code, 0) + n
                conn.close()
    rss_now = memory(exporter.pid)[0]
    time.sleep(2)
    rss_later = memory(exporter.pid)[0]
    return {"answered": answered(exporter.port),
            "detail": f"{sent} heads of {len(distinct_head(0))} bytes (95 headers) sent, {answered_count} answered "
                      f"{statuses}, {reopened} connections closed by the server, {refused} refused; "
                      f"RSS {rss_now / MiB:.0f} MiB at once, {rss_later / MiB:.0f} MiB 2 s later"}


def chunked_trailer(exporter: Exporter, workdir: Path) -> dict:
    backend = Backend(endless_trailer)
    try:
        codes = []
        health = None
        for attempt in range(2):
            started = time.monotonic()
            with ThreadPoolExecutor(1) as pool:
                probe = pool.submit(http_get, exporter.port, f"/probe?target=http://127.0.0.1:{backend.port}",
                                    12.0, "X-Prometheus-Scrape-Timeout-Seconds: 5\r\n")
                if attempt == 1:
                    backend.requests.wait(5)
                    health = answered(exporter.port)
                code, body = probe.result()
            up = next((f"up {v}" for v in "01" if f"hangwatch_up {v}".encode() in body), "no hangwatch_up")
            codes.append(f"{code} {up} in {time.monotonic() - started:.1f} s")
        return {"answered": health, "detail": f"probes: {'; '.join(codes)}; the backend sent "
                                              f"{backend.sent / MiB:.0f} MiB of trailer"}
    finally:
        backend.stop()


def slot_leak(exporter: Exporter, workdir: Path) -> dict:
    silent = Backend(never_answers)
    fleet = Fleet(1)
    socks = []
    try:
        with ThreadPoolExecutor(1) as pool:
            holder = pool.submit(http_get, exporter.port, f"/probe?target=http://127.0.0.1:{silent.port}", 15.0,
                                 "X-Prometheus-Scrape-Timeout-Seconds: 3\r\n")
            if not silent.requests.wait(10):
                return {"answered": None, "detail": "the slot holder's probe never reached its backend"}
            bad = (f"GET /probe?target=not-a-url HTTP/1.1\r\nHost: 127.0.0.1:{exporter.port}\r\n"
                   f"X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n").encode()
            refused = 0
            for _ in range(600):
                try:
                    sock = socket.create_connection(("127.0.0.1", exporter.port), timeout=5,
                                                    source_address=ATTACKER)
                except OSError:
                    refused += 1
                    continue
                try:
                    sock.sendall(bad)
                except OSError:
                    pass  # closed at once: _collect counts it as closed unanswered
                sock.setblocking(False)
                socks.append(sock)
            statuses, pending = _collect(socks, time.monotonic() + 12)
            holder_code = holder.result()[0]
        code, body = http_get(exporter.port, f"/probe?target={fleet.urls()[0]}", 10.0,
                              "X-Prometheus-Scrape-Timeout-Seconds: 5\r\n")
        after = f"{code}{' up 1' if b'hangwatch_up 1' in body else ''}"
        opened = len(socks)
        for sock in socks:
            sock.close()
        socks = []
        time.sleep(1.0)  # the exporter sees the clients' FINs (no outside condition to wait on)
        close_wait = count_close_wait(exporter.port)
        return {"answered": answered(exporter.port),
                "detail": f"slot holder {holder_code}; of 600 bad probes {refused} refused at connect, "
                          f"{opened - pending} answered or closed {statuses} (0: closed unanswered), "
                          f"{pending} never; a good probe after: {after}; exporter sockets in CLOSE_WAIT "
                          f"after the clients closed: {close_wait}"}
    finally:
        for sock in socks:
            sock.close()
        silent.stop()
        fleet.stop()


def _collect(socks: list[socket.socket], deadline: float) -> tuple[dict[int, int], int]:
    """Read one answer from each socket until the deadline: (statuses, how many got none)."""
    selector = selectors.DefaultSelector()
    buffers = {}
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
        buffers[sock] = b""
    statuses: dict[int, int] = {}
    open_ = set(socks)
    while open_ and time.monotonic() < deadline:
        for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
            sock = key.fileobj
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            buffers[sock] += chunk
            if _complete(buffers[sock]) or not chunk:
                selector.unregister(sock)
                open_.discard(sock)
                if buffers[sock]:
                    code = int(buffers[sock].split(b" ", 2)[1])
                    statuses[code] = statuses.get(code, 0) + 1
                else:
                    statuses[0] = statuses.get(0, 0) + 1  # closed unanswered
    selector.close()
    return statuses, len(open_)


def count_close_wait(port: int) -> int:
    """Sockets on ``port`` (the exporter's side) in CLOSE_WAIT, from /proc/net/tcp{,6}."""
    return sum(1 for table in TCP_TABLES for _, local, state, _ in socket_rows(table)
               if local == port and state == CLOSE_WAIT)


def open_file_bytes(pid: int) -> int:
    """Bytes in the regular files ``pid`` holds open (unlinked temporary files included)."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            info = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            total += info.st_size
    return total


def webhook_bodies(workdir: Path, connections: int = 128, body_bytes: int = 4 * MiB - 1024) -> dict:
    """Not the exporter: the webhook's waitress under unauthenticated big bodies (just under its
    4 MiB ``max_request_body_size``: at 4 MiB waitress refuses the request at its head)."""
    token = workdir / "token"
    token.write_text("t" * 40)
    token.chmod(0o600)
    state = workdir / "state"
    state.mkdir(mode=0o700)
    spool = workdir / "spool"
    spool.mkdir()
    config = workdir / "webhook.yml"
    config.write_text(f"token_file: {token}\nstate_dir: {state}\ntargets:\n"
                      "  - {name: vllm-a, container: vllm-a, url: 'http://127.0.0.1:9'}\n")
    port = free_port()
    log = open(workdir / "webhook.log", "wb")
    env = dict(os.environ, TMPDIR=str(spool))
    popen = subprocess.Popen([sys.executable, "-m", "hangwatch", "webhook", "--config", str(config), "--listen",
                              f"127.0.0.1:{port}", "--dry-run"], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env, cwd=workdir)
    socks = []
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if popen.poll() is not None or time.monotonic() > deadline:
                    return {"before": 0, "peak": 0, "largest": 0, "after": 0, "answered": None,
                            "detail": "the webhook did not start: "
                                      + (workdir / "webhook.log").read_text()[-500:]}
                time.sleep(0.05)
        before = memory(popen.pid)[0]
        watch = RssWatch(popen.pid)
        head = (f"POST /alerts HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {body_bytes}\r\n\r\n").encode()
        block = b" " * 65536
        sent = 0
        ends = time.monotonic() + 30
        for _ in range(connections):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(head)
                socks.append(sock)
            except OSError:
                break
        for sock in socks:  # every body but its last byte: the request is never whole
            left = body_bytes - 1
            try:
                while left > 0 and time.monotonic() < ends:
                    n = sock.send(block[:min(left, len(block))])
                    left -= n
                    sent += n
            except OSError:
                pass
        spooled = open_file_bytes(popen.pid)
        largest = watch.stop()
        rss, peak = memory(popen.pid)
        status, _ = http_get(port, "/healthz", 2.0)
        return {"before": before, "peak": peak, "largest": largest, "after": rss,
                "answered": f"/healthz {status}",
                "detail": f"{len(socks)} connections x {body_bytes / MiB:.2f} MiB bodies (all but the last byte), "
                          f"{sent / MiB:.0f} MiB sent; {spooled / MiB:.0f} MiB held in temporary files "
                          f"(tmpfs in compose: the container's memory)"}
    finally:
        for sock in socks:
            sock.close()
        _stop(popen)
        log.close()


EXPORTER_ATTACKS = {
    "table_fill": ("", table_fill),
    "heads": ("", heads),
    "chunked_trailer": ("", chunked_trailer),
    "slot_leak": ("max_concurrent_probes: 1\n", slot_leak),
}
ATTACKS = list(EXPORTER_ATTACKS) + ["webhook_bodies"]


def run_one(name: str, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="hangwatch-attack-") as workdir:
        started = time.monotonic()
        if name == "webhook_bodies":
            row = webhook_bodies(Path(workdir))
        else:
            config, attack = EXPORTER_ATTACKS[name]
            exporter = Exporter(Path(workdir), config, args.exporter_ref)
            try:
                answered(exporter.port, each=1)  # warm: the first answers' imports are not the attack's
                before = memory(exporter.pid)[0]
                watch = RssWatch(exporter.pid)
                row = attack(exporter, Path(workdir))
                largest = watch.stop()
                rss, peak = memory(exporter.pid)
                alive = exporter.popen.poll() is None
                row.update(before=before, peak=peak, largest=largest, after=rss)
                if not alive:
                    row["detail"] += f"; the exporter exited ({exporter.popen.returncode})"
            finally:
                exporter.stop()
        row.update(attack=name, seconds=time.monotonic() - started)
        return row


def show(row: dict) -> str:
    return (f"{row['attack']:16} {row['before'] / MiB:7.1f} {row['peak'] / MiB:8.1f} {row['largest'] / MiB:8.1f} "
            f"{row['after'] / MiB:7.1f} {row['seconds']:5.1f}  {row['answered'] or '-'}\n{'':16} {row['detail']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="peak RSS of the exporter (and webhook) under each attack")
    parser.add_argument("--only", default=",".join(ATTACKS), help=f"comma list of: {', '.join(ATTACKS)}")
    parser.add_argument("--exporter-ref", default=None, help="run this git commit's exporter (before numbers)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in ATTACKS]
    if unknown:
        parser.error(f"--only: unknown attack {', '.join(unknown)} (known: {', '.join(ATTACKS)})")
    raise_fd_limit()
    print(f"{'attack':16} {'RSS MiB':>7} {'VmHWM':>8} {'max RSS':>8} {'after':>7} {'s':>5}  answered 200 "
          f"(fresh /metrics, /livez, /readyz)", flush=True)
    rows = []
    healthy = Fleet(1)
    HEALTHY["url"] = healthy.urls()[0]
    try:
        for name in chosen:
            rows.append(run_one(name, args))
            print(show(rows[-1]), flush=True)
    finally:
        healthy.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
