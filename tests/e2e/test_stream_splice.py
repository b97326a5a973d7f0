"""`proxy_splice on` (gannet's own directive): the plain TCP relay of the stream proxy
moves bytes with splice(2). Checked over real sockets: a 50 MB transfer each way at once
arrives byte-exact with the log's byte counts equal to the sizes, half-close, an upstream
reset mid-transfer, `proxy_timeout` on an idle spliced session, the same counts and lines
as nginx's (buffered) relay, and strace on the worker
showing splice(2) calls with the directive (none without it).
"""

from __future__ import annotations

import hashlib
import re
import os
import signal
import socket
import struct
import subprocess
import threading

import pytest

from conftest import free_port, wait_until
from test_stream import Echo, conf, log_lines
from test_stream_misc import both, needs_nginx, ports

BULK = 50 * 1024 * 1024
# A block whose length is no power of two, so a dropped or repeated chunk shows.
BLOCK = os.urandom(1024 * 1024 + 7)


def pattern(n: int, salt: bytes) -> bytes:
    return (salt + BLOCK) * (n // (len(BLOCK) + len(salt))) + (salt + BLOCK)[: n % (len(BLOCK) + len(salt))]


def send_then_shut(sock: socket.socket, data: bytes):
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def read_to_eof(sock: socket.socket) -> tuple[int, str]:
    h, n = hashlib.sha256(), 0
    while True:
        try:
            d = sock.recv(1 << 20)
        except ConnectionResetError:
            break
        if not d:
            break
        h.update(d)
        n += len(d)
    return n, h.hexdigest()


class Bulk:
    """An upstream that, per connection, sends `down` bytes and closes its writing side
    while reading everything the client sends (its size and hash in `got`)."""

    def __init__(self, down: bytes):
        self.down, self.got = down, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        with c:
            t = threading.Thread(target=send_then_shut, args=(c, self.down), daemon=True)
            t.start()
            self.got.append(read_to_eof(c))
            t.join()


def spliced(p: int, upstream: int, extra: str = "", on: bool = True) -> str:
    return conf(f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{upstream};\n"
                f"  proxy_splice {'on' if on else 'off'}; {extra} }}")


def fields(line: str) -> list[str]:
    # $remote_addr $protocol $status $bytes_sent $bytes_received "$upstream_addr"
    # $upstream_bytes_sent $upstream_bytes_received
    return line.split()


def test_bulk_both_ways_half_close(gannet):
    """50 MB each way at once, each side closing its writing side when done: both arrive
    byte-exact, the session ends once both EOFs passed (`proxy_half_close`), the log's
    counts are the sizes, and the error log's line is nginx's."""
    up_data, client_data = pattern(BULK, b"U"), pattern(BULK, b"C")
    back = Bulk(up_data)
    p = free_port()
    srv = gannet.start(conf=spliced(p, back.port, "proxy_half_close on;"))
    with socket.create_connection(("127.0.0.1", p), timeout=60) as s:
        t = threading.Thread(target=send_then_shut, args=(s, client_data), daemon=True)
        t.start()
        got = read_to_eof(s)
        t.join()
    assert got == (BULK, hashlib.sha256(up_data).hexdigest())
    assert wait_until(lambda: back.got)
    assert back.got[0] == (BULK, hashlib.sha256(client_data).hexdigest())
    f = fields(log_lines(srv.tmp, 1)[0])
    assert f[2:5] == ["200", str(BULK), str(BULK)]
    assert f[6:8] == [str(BULK), str(BULK)]
    assert wait_until(lambda: f"bytes from/to client:{BULK}/{BULK}, bytes from/to upstream:{BULK}/{BULK}"
                      in srv.error_log())


@needs_nginx
def test_differential_counts_and_lines(gannet, tmp_path):
    """8 MB each way at once with `proxy_half_close`: gannet spliced and nginx (its buffered relay; it has no splice) give the same access
    log fields and the same "disconnected" lines (the side named aside: which EOF comes
    last is a race in both)."""
    size = 8 << 20
    up_data, client_data = pattern(size, b"u"), pattern(size, b"c")
    back = Bulk(up_data)
    p = ports(1)
    body = lambda side: (f"server {{ listen 127.0.0.1:{p[side][0]}; proxy_pass 127.0.0.1:{back.port};"
                         f" proxy_half_close on; {'proxy_splice on;' if side == 'g' else ''} }}")
    with both(gannet, tmp_path, body) as tmps:
        for side in ("g", "n"):
            with socket.create_connection(("127.0.0.1", p[side][0]), timeout=30) as s:
                t = threading.Thread(target=send_then_shut, args=(s, client_data), daemon=True)
                t.start()
                assert read_to_eof(s) == (size, hashlib.sha256(up_data).hexdigest())
                t.join()
        got = {}
        for side, tmp in tmps.items():
            line = fields(log_lines(tmp, 1)[0])
            err = (tmp / "error.log").read_text()
            said = re.findall(r"(?:client|upstream) disconnected, (bytes .*)", err)
            got[side] = (line[2:5] + line[6:8], said)
    assert got["g"] == got["n"], got
    assert got["g"][0] == ["200"] + [str(size)] * 4
    assert got["g"][1] == [f"bytes from/to client:{size}/{size}, bytes from/to upstream:{size}/{size}"]


def test_client_eof_ends_session_without_half_close(gannet):
    """Without `proxy_half_close` the client's EOF ends the session (nginx's default): the
    client reads EOF though the upstream never closes, "client disconnected" is logged."""
    back = Echo(1)
    p = free_port()
    srv = gannet.start(conf=spliced(p, back.ports[0]))
    with socket.create_connection(("127.0.0.1", p), timeout=10) as s:
        s.sendall(b"ping")
        assert s.recv(100) == b"[0]ping"
        s.shutdown(socket.SHUT_WR)
        assert s.recv(100) == b""
    f = fields(log_lines(srv.tmp, 1)[0])
    assert f[2:5] == ["200", "7", "4"]
    assert "client disconnected, bytes from/to client:4/7, bytes from/to upstream:7/4" in srv.error_log()
    back.close()


def test_proxy_protocol_line_before_spliced_bytes(gannet):
    """`proxy_protocol on` with `proxy_splice on`: the PROXY line goes first (written
    before the splicing starts), then the client's bytes; `$upstream_bytes_sent` counts
    both, `$bytes_received` only the client's."""
    back = Echo(1)
    p = free_port()
    srv = gannet.start(conf=spliced(p, back.ports[0], "proxy_protocol on;"))
    with socket.create_connection(("127.0.0.1", p), timeout=10) as s:
        port = s.getsockname()[1]
        line = f"PROXY TCP4 127.0.0.1 127.0.0.1 {port} {p}\r\n".encode()
        s.sendall(b"x")
        got = b""
        while not got.endswith(b"x"):
            got += s.recv(4096)
        s.shutdown(socket.SHUT_WR)
        while d := s.recv(4096):
            got += d
    assert back.first[0].startswith(line), back.first
    assert got.replace(b"[0]", b"") == line + b"x", got
    f = fields(log_lines(srv.tmp, 1)[0])
    assert f[2] == "200" and f[4] == "1" and f[6] == str(len(line) + 1) and f[3] == f[7] == str(len(got)), (f, got)
    back.close()


def test_upstream_reset_mid_transfer(gannet):
    """The upstream sends 4 MB then resets the connection (SO_LINGER 0): the session ends
    (the client reads to its end), the access log has 200 and the bytes the client got,
    and "upstream disconnected" is logged as nginx's."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def serve():
        c, _ = lsock.accept()
        c.sendall(b"x" * (4 << 20))
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()

    threading.Thread(target=serve, daemon=True).start()
    p = free_port()
    srv = gannet.start(conf=spliced(p, lsock.getsockname()[1]))
    with socket.create_connection(("127.0.0.1", p), timeout=10) as s:
        n, _ = read_to_eof(s)
    f = fields(log_lines(srv.tmp, 1)[0])
    assert f[2] == "200" and f[3] == str(n) and f[7] == str(n), (f, n)
    assert "upstream disconnected" in srv.error_log()
    assert "panic" not in srv.error_log()
    lsock.close()


def test_proxy_timeout_on_idle_spliced_session(gannet):
    """`proxy_timeout 1s`: after an exchange nothing moves, the session ends (the client
    reads EOF) with nginx's "connection timed out" line and 200."""
    back = Echo(1)
    p = free_port()
    srv = gannet.start(conf=spliced(p, back.ports[0], "proxy_timeout 1s;"))
    with socket.create_connection(("127.0.0.1", p), timeout=10) as s:
        s.sendall(b"abc")
        assert s.recv(100) == b"[0]abc"
        assert s.recv(100) == b""
    f = fields(log_lines(srv.tmp, 1)[0])
    assert f[2:5] == ["200", "6", "3"]
    assert "connection timed out" in srv.error_log()
    back.close()


def traced_by(pid: int) -> bool:
    """Each thread of `pid` has a tracer."""
    def tracer(tid):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("TracerPid:"))
    return all(tracer(t) != 0 for t in os.listdir(f"/proc/{pid}/task"))


def trace_worker(pid: int, out, calls: str = "splice"):
    """strace attached to all the worker's threads, tracing `calls` (splice(2)); returns it
    once attached."""
    proc = subprocess.Popen(["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(out), "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_until(lambda: traced_by(pid)), "strace did not attach"
    return proc


@pytest.mark.skipif(not os.path.exists("/usr/bin/strace"), reason="needs strace")
@pytest.mark.parametrize("extra,used", [("proxy_splice on;", True), ("proxy_splice off;", False),
                                        ("proxy_splice on; proxy_download_rate 100m;", False)])
def test_splice_is_used(gannet, tmp_path, extra, used):
    """With `proxy_splice on` the worker's relay calls splice(2); with it off, or with a
    rate to pace (the buffered relay's), none."""
    data = pattern(1 << 20, b"S")
    back = Bulk(data)
    p = free_port()
    srv = gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{back.port};"
                                 f" proxy_half_close on; {extra} }}"))
    out = tmp_path / "trace"
    tracer = trace_worker(srv.worker_pid(), out)
    try:
        with socket.create_connection(("127.0.0.1", p), timeout=30) as s:
            s.sendall(b"hello")
            s.shutdown(socket.SHUT_WR)
            assert read_to_eof(s) == (len(data), hashlib.sha256(data).hexdigest())
        assert fields(log_lines(srv.tmp, 1)[0])[2:5] == ["200", str(len(data)), "5"]
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(10)
    calls = [l for l in out.read_text().splitlines() if "splice(" in l]
    if used:
        assert any("SPLICE_F_MOVE|SPLICE_F_NONBLOCK" in l for l in calls), calls[:5]
    else:
        assert calls == []

@pytest.mark.skipif(not os.path.exists("/usr/bin/strace"), reason="needs strace")
def test_short_exchange_is_copied_bulk_spliced(gannet, tmp_path):
    """With `proxy_splice on` a direction is copied until a read fills the buffer: a 1 KB
    exchange makes no pipe and no splice(2) call, while in the same session a 1 MB answer
    is spliced; the bytes and counts are the same either way."""
    small, data = pattern(1 << 10, b"s"), pattern(1 << 20, b"B")
    back = Bulk(small)
    p = free_port()
    srv = gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{back.port};"
                                 " proxy_half_close on; proxy_splice on; }"))
    out = tmp_path / "trace"
    tracer = trace_worker(srv.worker_pid(), out, "splice,pipe2")
    try:
        with socket.create_connection(("127.0.0.1", p), timeout=30) as s:
            s.sendall(small)
            s.shutdown(socket.SHUT_WR)
            assert read_to_eof(s) == (len(small), hashlib.sha256(small).hexdigest())
        assert wait_until(lambda: len(log_lines(srv.tmp, 1)) == 1)
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(10)
    assert fields(log_lines(srv.tmp, 1)[0])[2:5] == ["200", str(len(small)), str(len(small))]
    assert [l for l in out.read_text().splitlines() if "splice(" in l or "pipe2(" in l] == []
    back.down = data
    tracer = trace_worker(srv.worker_pid(), out, "splice,pipe2")
    try:
        with socket.create_connection(("127.0.0.1", p), timeout=30) as s:
            s.sendall(small)
            s.shutdown(socket.SHUT_WR)
            assert read_to_eof(s) == (len(data), hashlib.sha256(data).hexdigest())
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(10)
    text = out.read_text()
    assert "pipe2(" in text and "SPLICE_F_MOVE|SPLICE_F_NONBLOCK" in text, text[:500]


def test_config_errors(gannet):
    """A value other than on/off, or no value, is refused with the file and line, as
    nginx's flags; `proxy_splice` is taken in stream and server."""
    cases = [
        ("server { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; proxy_splice yes; }",
         'invalid value "yes" in "proxy_splice" directive, it must be "on" or "off"'),
        ("server { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; proxy_splice; }",
         'invalid number of arguments in "proxy_splice" directive'),
    ]
    for body, msg in cases:
        r = gannet.check(conf=conf(body))
        assert r.returncode != 0 and msg in r.stderr, (body, r.stderr)
        assert re.search(r"\.conf:\d+", r.stderr), r.stderr
    ok = gannet.check(conf=conf("proxy_splice on;\nserver { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; }"))
    assert ok.returncode == 0, ok.stderr
