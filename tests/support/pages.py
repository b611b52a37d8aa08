"""A tiny HTTP server that answers whatever a test tells it to: for bad-input tests.

Each path maps to a response: a status, body and content type, a body generator (for a
100 MB page), or ``"silent"`` (accept the connection, never answer — like a stopped
process). Real sockets, so the fetch code is exercised as in production.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness.ports import closed_port  # noqa: F401 (the bad-input tests import it from here)


@dataclass
class Page:
    body: bytes | None = b""
    status: int = 200
    content_type: str = "text/plain; version=0.0.4"
    chunks: object = None      # an iterable of bytes, sent chunked (for huge pages)
    silent: bool = False       # accept, read the request, never answer
    next: "Page | None" = None  # served instead from the next request on (a page that changes)


class PageServer:
    def __init__(self):
        self.pages: dict[str, Page] = {}
        self.requests: list[tuple[str, str]] = []
        self.connections = 0  # TCP connections accepted (keep-alive reuse shows as fewer)
        self.sent: list[tuple[str, str, object, str | None]] = []  # method, path, JSON body, Authorization
        self._release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                server.connections += 1

            def _answer(self):
                server.requests.append((self.command, self.path))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw
                server.sent.append((self.command, self.path, body, self.headers.get("Authorization")))
                page = server.pages.get(self.path)
                if page is None:
                    page = Page(b"not found", 404)
                elif page.next is not None:
                    server.pages[self.path] = page.next
                if page.silent:
                    server._release.wait(30)
                    return
                self.send_response(page.status)
                self.send_header("Content-Type", page.content_type)
                if page.chunks is not None:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    try:
                        for chunk in page.chunks:
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.write(b"0\r\n\r\n")
                    except (BrokenPipeError, ConnectionResetError):
                        pass
                    return
                self.send_header("Content-Length", str(len(page.body)))
                self.end_headers()
                self.wfile.write(page.body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
