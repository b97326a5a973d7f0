"""Bandwidth policing: `limit_rate` and `limit_rate_after` (sizes or variables, inherited,
lifted by `limit_rate 0` in an `if`), `set $limit_rate`, an upstream's `X-Accel-Limit-Rate`,
and `$limit_rate` in answers and the access log - side by side with Debian's nginx on one
config; HTTP/2 streams paced one by one; and `send_timeout` timing the gaps between writes,
not the whole answer.

A paced answer is 300,000 bytes at 100 KiB/s: nginx lets a second's worth go at once, so it
takes about two seconds (nginx counts whole seconds of its clock: 2 to 3). Unpaced answers
take milliseconds, so the bounds below leave a wide margin on both sides.
"""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess
import threading
import time

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

BIG = bytes(range(256)) * 1172 + b"x" * 32  # 300,064 bytes

CONF = PEER_MAIN + r"""
http {
    log_format lr '$uri $status $body_bytes_sent $limit_rate';
    access_log {tmp}/access.log lr;
    root {root};
    server {
        listen 127.0.0.1:{port};
        location /fixed/ { limit_rate 100k; }
        location /after/ { limit_rate 100k; limit_rate_after 250k; }
        location /var/ { set $r 100k; limit_rate $r; }
        location /badvar/ { set $r lots; limit_rate $r; }
        location /set/ { set $limit_rate 100k; }
        location /badset/ { set $limit_rate lots; return 200 "[$limit_rate]\n"; }
        location /iff/ { limit_rate 100k; if ($arg_fast) { limit_rate 0; } }
        location /show/ { limit_rate 100k; return 200 "$limit_rate\n"; }
        location /proxied/ { proxy_pass http://127.0.0.1:{port}/accel/; }
        location /accel/ { add_header X-Accel-Limit-Rate 102400; alias {root}/fixed/; }
        location /ignored/ { proxy_ignore_headers X-Accel-Limit-Rate; proxy_pass http://127.0.0.1:{port}/accel/; }
    }
}
"""

FILES = {f"{d}/big.bin": BIG for d in ("fixed", "after", "var", "badvar", "set", "iff")}

PACED = ["/fixed/big.bin", "/var/big.bin", "/set/big.bin", "/iff/big.bin", "/proxied/big.bin"]
UNPACED = ["/after/big.bin", "/badvar/big.bin", "/iff/big.bin?fast=1", "/accel/big.bin", "/ignored/big.bin"]
SMALL = ["/badset/", "/show/"]


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode()


def timed_all(port: int, paths: list[str]) -> dict:
    """Every path fetched at once (each on its own connection): answer and seconds taken."""
    out = {}

    def one(p):
        t = time.monotonic()
        a = exchange(port, get(p), timeout=10)
        out[p] = (a, time.monotonic() - t)

    threads = [threading.Thread(target=one, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_paced_answers_match_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        results = {}
        for name, port in (("nginx", nginx_port), ("gannet", srv.port)):
            results[name] = timed_all(port, PACED + UNPACED + SMALL)
        n = len(PACED + UNPACED + SMALL)
        nlog = tmp_path / "nginx" / "access.log"
        # + the /accel/ requests behind /proxied/ and /ignored/
        assert wait_until(lambda: len(nlog.read_text().splitlines()) >= n + 2)
        assert wait_until(lambda: len(srv.access_log().splitlines()) >= n + 2)
        logs = {"nginx": sorted(nlog.read_text().splitlines()), "gannet": sorted(srv.access_log().splitlines())}
        errors = {"nginx": (tmp_path / "nginx" / "error.log").read_text(), "gannet": srv.error_log()}
    for name, got in results.items():
        for p in PACED + UNPACED:
            answer, secs = got[p]
            assert answer.status == 200 and answer.body == BIG, (name, p, answer.status, len(answer.body))
            if p in PACED:
                assert 1.5 < secs < 4.5, f"{name} {p} took {secs:.2f} s, paced at 100 KiB/s"
            else:
                assert secs < 1.2, f"{name} {p} took {secs:.2f} s, not paced"
    for p in SMALL:
        assert results["nginx"][p][0].body == results["gannet"][p][0].body, p
    assert results["gannet"]["/badset/"][0].body == b"[0]\n"
    # The directive's rate is taken when the answer is sent: a `return` in the same location
    # still reads 0.
    assert results["gannet"]["/show/"][0].body == b"0\n"
    assert logs["nginx"] == logs["gannet"]
    for name in ("nginx", "gannet"):
        assert re.search(r'\[error\].* invalid size "lots" while sending response to client, client: 127\.0\.0\.1, .*request: "GET /badvar/big\.bin HTTP/1\.1"', errors[name]), name
        assert re.search(r'\[error\].* invalid \$limit_rate "lots", client: 127\.0\.0\.1, .*request: "GET /badset/ HTTP/1\.1"', errors[name]), name


def test_each_http2_stream_is_paced_on_its_own(gannet):
    srv = gannet.start(files={"big.bin": BIG}, server="http2 on; limit_rate 100k;")
    url = f"http://127.0.0.1:{srv.port}/big.bin"
    t = time.monotonic()
    r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code} %{size_download} %{http_version}", url], capture_output=True, text=True, timeout=20)
    one = time.monotonic() - t
    assert r.stdout == f"200 {len(BIG)} 2", r.stdout
    assert 1.5 < one < 4.5, one
    # Three streams of one connection at once: each gets the rate, so three take as long
    # as one (a limit per connection would take three times as long).
    t = time.monotonic()
    r = subprocess.run(["h2load", "-n", "3", "-c", "1", "-m", "3", url], capture_output=True, text=True, timeout=30)
    three = time.monotonic() - t
    assert "3 succeeded, 0 failed" in r.stdout, r.stdout
    assert 1.5 < three < 4.5, three


def slow_read(port: int, path: str, pause_after: int | None = None) -> tuple[bytes, float]:
    """Read an answer through a small receive buffer, about 4 MB/s; with `pause_after`,
    stop reading for 3 s once that many bytes came. Returns the bytes and the seconds."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    s.sendall(get(path))
    got, t = [], time.monotonic()
    n = 0
    try:
        while b := s.recv(65536):
            got.append(b)
            n += len(b)
            if pause_after is not None and n >= pause_after:
                pause_after = None
                time.sleep(3)
            time.sleep(0.015)
    except ConnectionResetError:
        pass
    s.close()
    return b"".join(got), time.monotonic() - t


@pytest.mark.parametrize("sendfile", ["on", "off"])
def test_send_timeout_times_each_write_not_the_whole_answer(gannet, sendfile):
    # 12 MB through a 64 KiB window takes about three seconds, three times send_timeout: the
    # client keeps taking bytes, so nothing times out (it used to be cut after a second).
    data = bytes(range(256)) * (12_000_000 // 256)
    srv = gannet.start(files={"huge.bin": data}, server=f"send_timeout 1s; sendfile {sendfile};")
    raw, secs = slow_read(srv.port, "/huge.bin")
    body = raw.partition(b"\r\n\r\n")[2]
    assert secs > 1.5, secs
    assert len(body) == len(data) and hashlib.sha256(body).digest() == hashlib.sha256(data).digest()
    # A client that stops reading for longer than send_timeout is let go.
    raw, _ = slow_read(srv.port, "/huge.bin", pause_after=1_000_000)
    assert len(raw.partition(b"\r\n\r\n")[2]) < len(data)


def test_send_timeout_is_the_locations(gannet):
    # The default server says 60 s; only /short/ says 1 s, and only there a client that
    # stops reading for three seconds is let go (gannet used the server's for every answer).
    data = bytes(range(256)) * (12_000_000 // 256)
    srv = gannet.start(files={"short/huge.bin": data, "long/huge.bin": data}, server="location /short/ { send_timeout 1s; }")
    raw, _ = slow_read(srv.port, "/short/huge.bin", pause_after=1_000_000)
    assert len(raw.partition(b"\r\n\r\n")[2]) < len(data)
    raw, _ = slow_read(srv.port, "/long/huge.bin", pause_after=1_000_000)
    assert raw.partition(b"\r\n\r\n")[2] == data


@pytest.mark.parametrize(
    "server, message",
    [
        ("limit_rate lots;", '"limit_rate" directive invalid value'),
        ("limit_rate_after 1x;", '"limit_rate_after" directive invalid value'),
        ("limit_rate 1k 2k;", 'invalid number of arguments in "limit_rate" directive'),
        ("limit_rate $nope;", 'unknown "nope" variable'),
        ("location /x/ { limit_except GET { limit_rate 1k; } }", '"limit_rate" directive is not allowed here'),
    ],
)
def test_bad_rates_are_config_errors_with_their_line(gannet, server, message):
    r = gannet.check(server=server)
    assert r.returncode != 0
    assert re.search(r"check\.conf:\d+: .*" + re.escape(message), r.stderr), r.stderr
