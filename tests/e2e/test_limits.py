"""Traffic policing: `limit_req` (refusals past the burst, delays, `delay=`, dry runs,
`limit_req_status`, error pages, inheritance, keys that do not apply) and `limit_conn`
(requests in progress per key, held until the answer is sent), with `$limit_req_status`
and `$limit_conn_status` in the access log. The rate-limited answers are compared with
Debian's nginx running the same config: every status and log line must be the same.

Rates of 1 r/m make the sequences exact: between two requests of a test a few milliseconds
pass, in which a bucket leaks nothing that matters.
"""

from __future__ import annotations

import http.client
import re
import socket
import subprocess
import threading
import time

import pytest

import rawapps
from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    log_format lim '$uri $status $limit_req_status $limit_conn_status';
    access_log {tmp}/access.log lim;
    root {root};
    # Named before the zones that come further down, as nginx allows.
    limit_req zone=srv burst=1 nodelay;
    limit_req_zone $uri zone=slow:1m rate=1r/m;
    limit_req_zone $uri zone=srv:1m rate=1r/m;
    limit_req_zone $http_x_key zone=byhdr:1m rate=1r/m;

    server {
        listen 127.0.0.1:{port};
        location /burst/ { limit_req zone=slow burst=2 nodelay; }
        location /status/ { limit_req zone=slow; limit_req_status 429; }
        location /dry/ { limit_req zone=slow; limit_req_dry_run on; }
        location /page/ { limit_req zone=slow; error_page 503 /busy.html; }
        location = /busy.html { limit_req zone=slow; }
        location /key/ { limit_req zone=byhdr; }
        location /two/ { limit_req zone=slow burst=3 nodelay; limit_req zone=byhdr; }
        location /inherit/ { }
        location /ret/ { limit_req zone=slow; return 200 "before the limits\n"; }
    }
}
"""

FILES = {
    "busy.html": "<p>busy, try later</p>\n",
    **{f"{d}/f.txt": f"{d}\n" for d in ("burst", "status", "dry", "page", "key", "two", "inherit", "ret")},
}


def request(path: str, key: str | None = None) -> bytes:
    extra = f"X-Key: {key}\r\n" if key else ""
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n".encode()


# Each path is its own bucket (the zones are keyed by $uri, or by X-Key).
SENT = (
    [request("/burst/f.txt")] * 5
    + [request("/status/f.txt")] * 2
    + [request("/dry/f.txt")] * 3
    + [request("/page/f.txt")] * 3
    + [request("/key/f.txt")] * 3
    + [request("/key/f.txt", "k1")] * 2
    + [request("/two/f.txt", "k2")] * 2
    + [request("/inherit/f.txt")] * 3
    + [request("/ret/f.txt")] * 3
)

EXPECTED = (
    [200, 200, 200, 503, 503]  # the first is free, then a burst of two
    + [200, 429]
    + [200, 200, 200]  # a dry run only logs
    + [200, 503, 503]  # error_page's page is not limited again (one check per request)
    + [200, 200, 200]  # no X-Key: the key is empty and the limit does not apply
    + [200, 503]
    + [200, 503]  # the second limit refuses what the first would let through
    + [200, 200, 503]  # http's `limit_req`, inherited by a location without one
    + [200, 200, 200]  # `return` answers in the rewrite phase, before the limits
)


def run(srv_port: int) -> list[int]:
    return [exchange(srv_port, r).status for r in SENT]


def log_lines(path, n: int) -> list[str]:
    """The first lines of a log once it has `n` (a line is written just after its answer)."""
    lines = wait_until(lambda: path.exists() and len(path.read_text().splitlines()) >= n and path.read_text().splitlines())
    assert lines, f"{path} never had {n} lines"
    return lines


def test_limit_req_refuses_past_the_burst(gannet):
    srv = gannet.start(conf=CONF, files=FILES)
    assert run(srv.port) == EXPECTED
    assert exchange(srv.port, request("/page/f.txt")).body == b"<p>busy, try later</p>\n"
    log = log_lines(srv.tmp / "access.log", len(SENT) + 1)
    assert log[:5] == ["/burst/f.txt 200 PASSED -"] * 3 + ["/burst/f.txt 503 REJECTED -"] * 2
    assert log[7:10] == ["/dry/f.txt 200 PASSED -"] + ["/dry/f.txt 200 REJECTED_DRY_RUN -"] * 2
    assert "/key/f.txt 200 - -" in log and "/ret/f.txt 200 - -" in log
    err = srv.error_log()
    assert re.search(r'\[error\] .*limiting requests, excess: [23]\.\d{3} by zone "slow", client: 127\.0\.0\.1', err), err
    assert re.search(r'limiting requests, dry run, excess: 1\.\d{3} by zone "slow"', err), err


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_limit_req_same_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        got = {"gannet": run(srv.port), "nginx": run(nginx_port)}
        logs = {"gannet": log_lines(srv.tmp / "access.log", len(SENT)), "nginx": log_lines(tmp_path / "nginx" / "access.log", len(SENT))}
    assert got["gannet"] == got["nginx"] == EXPECTED, got
    assert logs["gannet"] == logs["nginx"]


def timed_get(port: int, path: str) -> tuple[int, float]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        t0 = time.monotonic()
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return r.status, time.monotonic() - t0
    finally:
        c.close()


def test_limit_req_delays_past_delay_and_logs_it(gannet):
    srv = gannet.start(
        files={"d/f.txt": "d\n", "n/f.txt": "n\n"},
        http="log_format lim '$uri $status $limit_req_status'; limit_req_zone $uri zone=fast:1m rate=10r/s;",
        server=f"access_log {gannet.tmp}/lim.log lim; location /d/ {{ limit_req zone=fast burst=5 delay=2; }}"
        " location /n/ { limit_req zone=fast burst=5; }",
    )
    # delay=2: the excess after three quick requests is under 2.000; the fourth's is about
    # 3.000 and waits until it would be 2.000 again, a tenth of a second at 10 r/s.
    answers = [timed_get(srv.port, "/d/f.txt") for _ in range(4)]
    assert [s for s, _ in answers] == [200] * 4
    assert answers[3][1] >= 0.05, answers
    # Without delay= every request past the first waits its turn.
    first, second = timed_get(srv.port, "/n/f.txt"), timed_get(srv.port, "/n/f.txt")
    assert first[0] == second[0] == 200 and second[1] >= 0.05, (first, second)
    log = log_lines(srv.tmp / "lim.log", 6)
    assert log == ["/d/f.txt 200 PASSED"] * 3 + ["/d/f.txt 200 DELAYED", "/n/f.txt 200 PASSED", "/n/f.txt 200 DELAYED"]
    # About 3.000: exactly 3.000 when the four requests came within one millisecond (the
    # bucket leaks by whole milliseconds, as nginx's does).
    assert re.search(r'\[warn\] .*delaying request, excess: (2\.\d{3}|3\.000), by zone "fast"', srv.error_log())


def test_client_leaving_during_a_delay_ends_the_request(gannet):
    # nginx watches the connection while it delays a request: a client that leaves ends
    # it at once (logged 499), rather than when the delay is over - here a minute.
    srv = gannet.start(
        files={"d/f.txt": "d\n"},
        http="log_format lim '$uri $status'; limit_req_zone $uri zone=min:1m rate=1r/m;",
        server=f"access_log {gannet.tmp}/lim.log lim; location /d/ {{ limit_req zone=min burst=5; }}",
    )
    assert srv.get("/d/f.txt")[0] == 200
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"GET /d/f.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        assert wait_until(lambda: "delaying request" in srv.error_log())
    log = log_lines(srv.tmp / "lim.log", 2)
    assert log == ["/d/f.txt 200", "/d/f.txt 499"]
    assert "client prematurely closed connection" in srv.error_log()


class Held:
    """A back end that answers each request only once the test says so."""

    def __init__(self, make):
        self.entered = threading.Event()
        self.release = threading.Event()
        self.app = make(self.behave)

    def behave(self, conn, head, body):
        self.entered.set()
        self.release.wait(10)
        conn.sendall(rawapps.http_answer(b"slow\n", keep=False))


@pytest.fixture
def backend():
    yield from rawapps.made(rawapps.HttpApp)


def test_limit_conn_counts_requests_in_progress(gannet, backend):
    held = Held(backend)
    srv = gannet.start(
        files={"f.txt": "f\n"},
        http="log_format lim '$uri $status $limit_conn_status'; limit_conn_zone $remote_addr zone=addr:1m;"
        " limit_conn_zone $host zone=other:1m;",
        server=f"access_log {gannet.tmp}/lim.log lim; limit_conn addr 1;"
        f" location /slow/ {{ proxy_pass http://127.0.0.1:{held.app.port}; }}"
        f" location /dry/ {{ limit_conn_dry_run on; limit_conn_status 429; alias {gannet.tmp}/www/; }}"
        f" location /own/ {{ limit_conn other 1; alias {gannet.tmp}/www/; }}",
    )
    slow = {}
    t = threading.Thread(target=lambda: slow.update(a=srv.get("/slow/")))
    t.start()
    try:
        assert wait_until(held.entered.is_set), "the proxied request never reached the back end"
        # One request of 127.0.0.1 is in progress: the next is refused, a dry run lets it
        # through, and a location with a limit of its own counts in its own zone.
        status, _, body = srv.get("/f.txt")
        assert status == 503 and b"503 Service Temporarily Unavailable" in body
        assert srv.get("/dry/f.txt")[0] == 200
        assert srv.get("/own/f.txt")[0] == 200
    finally:
        held.release.set()
        t.join(10)
    assert slow["a"][0] == 200 and slow["a"][2] == b"slow\n"
    # The count went with the answer: a keep-alive connection serves request after request.
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    for _ in range(3):
        c.request("GET", "/f.txt")
        r = c.getresponse()
        assert (r.status, r.read()) == (200, b"f\n")
    c.close()
    log = log_lines(srv.tmp / "lim.log", 7)
    assert log[:4] == ["/f.txt 503 REJECTED", "/dry/f.txt 200 REJECTED_DRY_RUN", "/own/f.txt 200 PASSED", "/slow/ 200 PASSED"]
    assert log[4:] == ["/f.txt 200 PASSED"] * 3
    err = srv.error_log()
    assert 'limiting connections by zone "addr"' in err
    assert 'limiting connections, dry run, by zone "addr"' in err


@pytest.mark.parametrize(
    "http, server, message",
    [
        ("", "limit_req zone=nope;", 'unknown limit_req_zone "nope"'),
        ("", "limit_conn nope 1;", 'unknown limit_conn_zone "nope"'),
        ("limit_req_zone $remote_addr zone=a:1k rate=1r/s;", "", 'zone "zone=a:1k" is too small'),
        ("limit_req_zone $remote_addr zone=a rate=1r/s;", "", 'invalid zone size "zone=a"'),
        ("limit_req_zone $remote_addr zone=a:1m rate=0r/s;", "", 'invalid rate "rate=0r/s"'),
        ("limit_req_zone $remote_addr zone=a:1m rate=fast;", "", 'invalid rate "rate=fast"'),
        ("limit_req_zone $remote_addr rate=1r/s sync;", "", 'invalid parameter "sync"'),
        ("limit_req_zone $nope zone=a:1m rate=1r/s;", "", 'unknown "nope" variable'),
        ("limit_conn_zone $remote_addr zone=a:1m; limit_req_zone $uri zone=a:1m rate=1r/s;", "",
         'the shared memory zone "a" is already declared'),
        ("", "limit_req_zone $remote_addr zone=a:1m rate=1r/s;", '"limit_req_zone" directive is not allowed here'),
        ("limit_req_zone $uri zone=a:1m rate=1r/s;", "limit_req burst=5;", '"limit_req" must have "zone" parameter'),
        ("limit_req_zone $uri zone=a:1m rate=1r/s;", "limit_req zone=a burst=0;", 'invalid burst value "burst=0"'),
        ("limit_req_zone $uri zone=a:1m rate=1r/s;", "limit_req zone=a; limit_req zone=a;", '"limit_req" directive is duplicate'),
        ("", "limit_req_status 200;", "value must be between 400 and 599"),
        ("", "limit_req_log_level debug;", 'invalid value "debug"'),
        ("", "limit_conn_dry_run maybe;", 'it must be "on" or "off"'),
        ("limit_conn_zone $remote_addr zone=c:1m;", "limit_conn c 0;", 'invalid number of connections "0"'),
    ],
)
def test_bad_limits_are_config_errors_with_their_line(gannet, http, server, message):
    r = gannet.check(http=http, server=server)
    assert r.returncode != 0
    assert re.search(r"check\.conf:\d+: .*" + re.escape(message), r.stderr), r.stderr


def test_each_http2_stream_is_limited(gannet):
    # Four streams at once on one h2c connection: the first is free, one more fits the
    # burst, the other two are refused; then `limit_conn` counts streams, not connections.
    srv = gannet.start(
        files={"f.txt": "f\n", "big.bin": b"b" * 4_000_000},
        http="limit_req_zone $remote_addr zone=one:1m rate=1r/m; limit_conn_zone $remote_addr zone=addr:1m;",
        server="http2 on; location /r/ { limit_req zone=one burst=1 nodelay; alias " + str(gannet.tmp / "www") + "/; }"
        " location /c/ { limit_conn addr 1; alias " + str(gannet.tmp / "www") + "/; }",
    )
    out = subprocess.run(["h2load", "-n", "4", "-c", "1", "-m", "4", f"http://127.0.0.1:{srv.port}/r/f.txt"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "status codes: 2 2xx, 0 3xx, 0 4xx, 2 5xx" in out, out
    # Two 4 MB downloads asked for together on one connection: the second stream starts
    # while the first is still being sent (4 MB take many turns of the event loop), so
    # it is refused.
    out = subprocess.run(["h2load", "-n", "2", "-c", "1", "-m", "2", f"http://127.0.0.1:{srv.port}/c/big.bin"],
                         capture_output=True, text=True, timeout=60).stdout
    assert "status codes: 1 2xx, 0 3xx, 0 4xx, 1 5xx" in out, out
