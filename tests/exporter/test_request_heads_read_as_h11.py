"""The exporter reads request heads as h11 does, except where it is deliberately stricter.

The same random and crafted bytes go to the exporter's own path (``head_length`` then
``parse_head``, what a connection runs) and to h11, a careful pure-Python HTTP/1.1
implementation; both must accept or both refuse. Where they may differ, RFC 9112 allows
either choice and the exporter takes the one that leaves nothing to interpret (no request
smuggling, no guessing); each such difference is named below with its reason, and a head is
excused only when it shows that difference:

- HTTP versions other than 1.0 and 1.1 (h11 takes ``HTTP/1.9`` and ``HTTP/2.0`` as 1.1);
- a body (Content-Length other than 0, any Transfer-Encoding): the exporter serves GET/HEAD;
- Content-Length given twice or as a list, even of one value (RFC 9112 §6.3: MAY accept, MAY refuse);
- obs-fold, a header line starting with blanks (§5.2: reject or unfold; h11 unfolds);
- a line ended by LF alone (§2.2: MAY accept);
- control characters other than HTAB in a field value (RFC 9110 §5.5: invalid; h11 keeps them);
- a method llhttp does not know (h11 takes any token; the exporter answers GET and HEAD only);
- a request-target in none of origin-, absolute- or asterisk-form (h11 takes any visible bytes).

And one the other way: empty lines before the request line are skipped (§2.2: a server
SHOULD ignore at least one), where h11 refuses them.
"""
from __future__ import annotations

import re

import h11
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hangwatch.exporter.httpwire import BadRequest, head_length, parse_head

# llhttp's methods (llhttp/src/llhttp/constants.ts, the HTTP ones)
LLHTTP_METHODS = {
    b"DELETE", b"GET", b"HEAD", b"POST", b"PUT", b"CONNECT", b"OPTIONS", b"TRACE", b"COPY", b"LOCK", b"MKCOL",
    b"MOVE", b"PROPFIND", b"PROPPATCH", b"SEARCH", b"UNLOCK", b"BIND", b"REBIND", b"UNBIND", b"ACL", b"REPORT",
    b"MKACTIVITY", b"CHECKOUT", b"MERGE", b"M-SEARCH", b"NOTIFY", b"SUBSCRIBE", b"UNSUBSCRIBE", b"PATCH",
    b"PURGE", b"MKCALENDAR", b"LINK", b"UNLINK", b"SOURCE", b"QUERY",
}
TARGET_FORMS = re.compile(rb"/|\*$|[A-Za-z][A-Za-z0-9+.-]*://")


def exporter_reads(data: bytes) -> bool:
    """Whether the exporter takes the head that starts ``data`` as a request."""
    try:
        length = head_length(data)
        if not length:
            return False  # never a whole head: the exporter waits, then read_timeout closes it
        parse_head(data[:length])
    except BadRequest:
        return False
    return True  # (what follows a whole head is the next request's: h11 too reads one at a time)


def h11_reads(data: bytes) -> h11.Request | None:
    connection = h11.Connection(h11.SERVER)
    connection.receive_data(data)
    try:
        event = connection.next_event()
    except h11.RemoteProtocolError:
        return None
    return event if isinstance(event, h11.Request) else None


def lines_of(data: bytes) -> list[bytes]:
    return re.split(rb"\r?\n", data.lstrip(b"\r\n"))


def why_stricter(data: bytes, request: h11.Request) -> str | None:
    """The documented reason the exporter refuses a head h11 accepts, if this head shows one."""
    raw_headers = lines_of(data)[1:]
    raw_lengths = [line.split(b":", 1)[1] for line in raw_headers
                   if b":" in line and line.split(b":", 1)[0].strip().lower() == b"content-length"]
    headers = dict(request.headers)
    if request.http_version not in (b"1.0", b"1.1"):
        return "version"
    if headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers:
        return "body"
    if len(raw_lengths) > 1 or any(b"," in value for value in raw_lengths):
        return "content-length twice"
    if any(line[:1] in (b" ", b"\t") for line in raw_headers):
        return "obs-fold"
    if re.search(rb"(?<!\r)\n", data):
        return "bare LF"
    if any(re.search(rb"[\x00-\x08\x0a-\x1f\x7f]", value) for _, value in request.headers):
        return "control character in a value"
    if request.method not in LLHTTP_METHODS:
        return "method"
    if not TARGET_FORMS.match(request.target):
        return "target form"
    return None


def why_more_lenient(data: bytes) -> str | None:
    rest = data
    while rest.startswith(b"\r\n"):
        rest = rest[2:]
    if rest != data and h11_reads(rest) is not None:
        return "empty line before the request line"
    return None


def check(data: bytes) -> None:
    ours, theirs = exporter_reads(data), h11_reads(data)
    if theirs is not None and not ours:
        assert why_stricter(data, theirs), f"the exporter refuses what h11 accepts: {data!r}"
    if theirs is None and ours:
        assert why_more_lenient(data), f"the exporter accepts what h11 refuses: {data!r}"
    if theirs is not None and ours:
        head = parse_head(data[:head_length(data)])
        assert head.method.encode("latin-1") == theirs.method
        assert {k.encode("latin-1"): v.encode("latin-1") for k, v in head.headers.items()} == {
            name: value for name, value in theirs.headers}  # (names are unique here: h11 keeps them all)
        if theirs.target.startswith(b"/") and b"#" not in theirs.target:
            target = head.path + (f"?{head.query}" if b"?" in theirs.target else "")
            assert target.encode("latin-1") == theirs.target


CRAFTED = [
    b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /probe?target=http://127.0.0.1:8000&module=backend HTTP/1.1\r\nHost: x\r\nUser-Agent: Prometheus/3.0\r\n"
    b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\nAccept-Encoding: gzip\r\n\r\n",
    b"GET /metrics HTTP/1.0\r\n\r\n",
    b"GET http://h:1/metrics?x HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET //[x HTTP/1.1\r\nHost: h\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\x00b\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.9\r\nHost: a\r\n\r\n",
    b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
    b"GET / RTSP/1.0\r\nHost: a\r\n\r\n",
    b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
    b"GET / http/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n",
    b"GET / HTTP/1.1\nHost: a\n\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0, 0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 00\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"CONNECT h:1 HTTP/1.1\r\nHost: h:1\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\n",
    b"get / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"FOO / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\xff\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\x01\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost:\ta\t\r\n\r\n",
    b"GET / HTTP/1.1\r\n: a\r\nHost: a\r\n\r\n",
    b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"\nGET / HTTP/1.0\r\n\r\n",
    b"CONNECT  HTTP/1.0\r\n\r\n",
    b"CONNECT / HTTP/1.0\r\nTransfer-Encoding: x\r\n\r\n",
    b"GET /\r\n\r\n",
    b"GET abc HTTP/1.1\r\nHost: a\r\n\r\n",
]


@pytest.mark.parametrize("data", CRAFTED)
def test_crafted_heads_are_read_as_h11_reads_them(data):
    check(data)


# -- random heads: built from parts each parser has an opinion on, then mutated -----------------------
ODD_BYTES = b"\x00\x01\t\r\n \x7f\x80\xff:;,\"()/?#@[]%"
METHODS = [b"GET", b"HEAD", b"POST", b"OPTIONS", b"PUT", b"DELETE", b"CONNECT", b"get", b"FOO", b"G T", b""]
TARGETS = [b"/", b"/metrics", b"/probe?target=http://127.0.0.1:1&module=backend", b"*", b"http://h/x?y",
           b"HTTP://h:1", b"//[x", b"h:1", b"/a#b", b"/%zz", b""]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.9", b"HTTP/2.0", b"HTTP/0.9", b"http/1.1", b"HTTP/1.1 ",
            b"RTSP/1.0", b"HTTP/11", b""]
NAMES = [b"Host", b"host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"X-A", b"Ho st", b"",
         b"X-Prometheus-Scrape-Timeout-Seconds"]
VALUES = [b"x", b"", b"0", b"5", b"0, 0", b"-1", b"chunked", b"gzip, chunked", b"close", b"keep-alive", b"10"]
SEPARATORS = [b": ", b":", b" : ", b":\t", b" :"]

noise = st.binary(max_size=6) | st.lists(st.sampled_from(list(ODD_BYTES)), max_size=4).map(bytes)
part = lambda known: st.sampled_from(known) | st.tuples(st.sampled_from(known), noise).map(b"".join)  # noqa: E731
header = st.tuples(part(NAMES), st.sampled_from(SEPARATORS), part(VALUES), st.sampled_from([b"\r\n"] * 8 + [b"\n"]))
heads = st.builds(
    lambda lead, method, sp1, target, sp2, version, end, headers: (
        lead + method + sp1 + target + sp2 + version + end
        + b"".join(name + sep + value + eol for name, sep, value, eol in headers) + b"\r\n"),
    st.sampled_from([b""] * 6 + [b"\r\n"]), part(METHODS), st.sampled_from([b" "] * 6 + [b"  ", b"\t"]),
    part(TARGETS), st.sampled_from([b" "] * 6 + [b"  ", b"\t"]), part(VERSIONS),
    st.sampled_from([b"\r\n"] * 8 + [b"\n"]), st.lists(header, max_size=6))


@st.composite
def mutated(draw):
    data = bytearray(draw(heads))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        data[at:at + draw(st.integers(0, 2))] = draw(noise)
    return bytes(data)


SETTINGS = settings(max_examples=1500, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SETTINGS
@given(heads)
@example(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
def test_random_heads_are_read_as_h11_reads_them(data):
    check(data)


@SETTINGS
@given(mutated())
def test_mutated_heads_are_read_as_h11_reads_them(data):
    check(data)


@SETTINGS
@given(st.binary(max_size=200).map(lambda noise: noise + b"\r\n\r\n"))
def test_random_bytes_are_read_as_h11_reads_them(data):
    check(data)
