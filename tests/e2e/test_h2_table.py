"""What a client's HPACK dynamic table names, followed as nginx follows it, on gannet and
Debian's nginx with one config, over raw frames (`conn::h2_table`): a pseudo-header after a
regular field (one named from the dynamic table too) is answered 400 ("client sent out of
order pseudo-headers", nginx 1.31.3+; Debian's 1.22 takes it; the h2 crate alone resets the stream and the client waits), the
connection and its table kept; one in its place named from the dynamic table is taken (one
a late pseudo-header put there too); an
index past the table (after a table size update evicted entries, or in a literal field's
name) ends the connection with COMPRESSION_ERROR naming that block's stream.
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, side_by_side
from test_h2_goaway import CONF as GOAWAY_CONF
from test_h2_goaway import GOAWAY, HEADERS, RST_STREAM, Client, frame

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

# Any number of requests on a connection.
CONF = GOAWAY_CONF.replace("keepalive_requests 2;", "")
assert CONF != GOAWAY_CONF
# GET http://localhost/ named from the static table, :authority plain.
PSEUDO = b"\x82\x86\x84"
AUTHORITY = b"\x01\x09localhost"
# `:authority: localhost` with incremental indexing (name: static index 1).
AUTHORITY_INDEXED = b"\x41\x09localhost"
# `referer: foo` (static name 51) and `x-foo: X-Bar` (literal name), both into the table.
INSERTS = b"\x73\x03foo" + b"\x40\x05x-foo\x05X-Bar"
# A dynamic table size update to 61: room for one of those 42-byte entries.
SIZE_61 = b"\x3f\x1e"
# The static indexes of the :status values both servers answer with.
STATUS = {0x88: 200, 0x89: 204, 0x8A: 206, 0x8B: 304, 0x8C: 400, 0x8D: 404, 0x8E: 500}


def answer(c: Client, sid: int):
    """Stream `sid`'s answer: its status (from the static table), "reset", the GOAWAY
    (last stream, code) ending the connection with an error, or None."""
    def end(f) -> bool:
        return (f[2] == sid and f[0] in (HEADERS, RST_STREAM)) or (f[0] == GOAWAY and f[3][4:8] != bytes(4))

    for kind, _, s, p in c.until(end):
        if s == sid and kind == HEADERS:
            return STATUS.get(p[0], p[:1])
        if s == sid and kind == RST_STREAM:
            return "reset"
        if kind == GOAWAY and end((kind, 0, s, p)):
            return (int.from_bytes(p[:4], "big") & 0x7FFFFFFF, int.from_bytes(p[4:8], "big"))
    return None


def session(port: int, blocks: list[bytes]):
    """Each block sent as a request on its own stream (1, 3, ...) after the previous one is
    answered with a status: the answers."""
    c = Client(port)
    try:
        got = []
        for i, block in enumerate(blocks):
            sid = 2 * i + 1
            c.send(frame(HEADERS, 0x5, sid, block))
            got.append(answer(c, sid))
            if not isinstance(got[-1], int):
                break
        return got
    finally:
        c.close()


SESSIONS = {
    # nginx-tests' "updated table size - remaining index": x-foo (dynamic 62 after the
    # size update) before :authority; then referer, evicted, named past the table.
    "late authority after a dynamic field": [
        PSEUDO + AUTHORITY_INDEXED + INSERTS,
        SIZE_61 + PSEUDO + b"\xbe" + AUTHORITY_INDEXED,
        PSEUDO + b"\xbe" + b"\xbf",
    ],
    # A static regular name, then :authority (the connection goes on).
    "late authority after a static field": [
        PSEUDO + b"\x7a\x04curl" + AUTHORITY,
        PSEUDO + AUTHORITY,
    ],
    # :method after a literal-named field, then :path named from the table after one.
    "late method and path": [
        b"\x86\x84" + AUTHORITY + b"\x00\x03x-a\x01b" + b"\x82",
        b"\x82\x86\x44\x02/a" + AUTHORITY + b"\x40\x03x-b\x01c" + b"\xbf",
        PSEUDO + AUTHORITY,
    ],
    # Pseudo-headers named from the dynamic table in their place are taken.
    "dynamic pseudo-headers in place": [
        b"\x42\x03GET\x86\x84" + AUTHORITY_INDEXED,
        b"\xbf\x86\x84\xbe",
        b"\xbf\x86\x84\xbe" + INSERTS,
        b"\xc1\x86\x84\xc0\xbf\xbe",
    ],
    # A late :authority inserted (the codec holds it under another name), then named from
    # the table in its place: indexed, and as a literal field's name.
    "late authority named again in place": [
        PSEUDO + b"\x7a\x04curl" + AUTHORITY_INDEXED,
        b"\xbe" + PSEUDO,
        b"\x7e\x09localhost" + PSEUDO,
        PSEUDO + b"\xbe",
    ],
    # A literal field whose name is an index past the table.
    "name index past the table": [
        PSEUDO + AUTHORITY_INDEXED,
        PSEUDO + b"\x7f\x01\x03foo",
    ],
}


# The requests (by place in their session) with a pseudo-header after a regular field.
OUT_OF_ORDER = {
    "late authority after a dynamic field": {1},
    "late authority after a static field": {0},
    "late method and path": {0, 1},
    "late authority named again in place": {0},
}


def test_dynamic_table_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        got = {k: session(srv.port, b) for k, b in SESSIONS.items()}
        want = {k: session(nginx_port, b) for k, b in SESSIONS.items()}
    # Out of order pseudo-headers are answered 400 since nginx 1.31.3 (commit a277069b1,
    # "HTTP/2: reject requests with out-of-order pseudo-headers"); Debian's 1.22 takes them
    # (its 400 for the second "late method and path" is for a duplicate :path). Everything
    # else as 1.22.
    for k, answers in got.items():
        assert len(answers) == len(want[k]), k
        for i, (g, w) in enumerate(zip(answers, want[k])):
            if i in OUT_OF_ORDER.get(k, ()):
                assert (g, w in (200, 400)) == (400, True), (k, i, w)
            else:
                assert g == w, (k, i)
    assert got["late authority after a dynamic field"] == [200, 400, (5, 9)]
    assert got["late authority after a static field"] == [400, 200]
    assert got["late method and path"] == [400, 400, 200]
    assert got["dynamic pseudo-headers in place"] == [200, 200, 200, 200]
    assert got["late authority named again in place"] == [400, 200, 200, 200]
    assert got["name index past the table"] == [200, (3, 9)]
