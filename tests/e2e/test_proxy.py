"""The reverse proxy (`proxy_pass`) as an nginx admin uses it, checked on the wire: raw-socket
HTTP servers behind gannet record every request they get (so the tests see the request line
and headers gannet sends) and answer as each test says, including the ways real servers
break (nothing listening, no answer, garbage, dying mid-answer, closing a kept connection).
One test runs behind a real server (gannet itself as the backend, serving files)."""

import http.client
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import read_chunked, read_head, wait_until
from rawapps import HttpApp, http_answer, made


@pytest.fixture
def app():
    yield from made(HttpApp)


def echo(conn, head, body):
    """Answer with the request as received, and keep the connection."""
    conn.sendall(http_answer(head + b"\r\n\r\n" + body))
    return "again"


def sent_head(app, i=-1):
    """The request line and headers of the i-th request the backend got."""
    lines = app.requests[i][1].decode().split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return lines[0], headers


def test_uri_without_uri_part_is_passed_as_sent(gannet, app):
    a = app(echo)
    srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{a.port}; }}")
    status, _, _ = srv.get("/a%2Fb/../c?x=1&y=%20")
    assert status == 200
    line, h = sent_head(a)
    # Not decoded, not normalised: exactly what the client sent.
    assert line == "GET /a%2Fb/../c?x=1&y=%20 HTTP/1.0"
    assert h["host"] == [f"127.0.0.1:{a.port}"]
    assert h["connection"] == ["close"]


def test_uri_part_replaces_the_location_prefix(gannet, app):
    a = app(echo)
    srv = gannet.start(server=f"""
        location /one/ {{ proxy_pass http://127.0.0.1:{a.port}/two/; }}
        location /r/ {{ rewrite ^/r/(.*)$ /changed/$1 break; proxy_pass http://127.0.0.1:{a.port}/ignored/; }}
    """)
    srv.get("/one/x%20y/z?q=1")
    assert sent_head(a)[0] == "GET /two/x%20y/z?q=1 HTTP/1.0"
    # After a rewrite with break, the whole changed URI is passed (nginx's rule).
    srv.get("/r/abc")
    assert sent_head(a)[0] == "GET /changed/abc HTTP/1.0"


def test_uri_part_in_regex_location_is_a_config_error(gannet):
    r = gannet.check(server="location ~ ^/x { proxy_pass http://127.0.0.1:9/y; }")
    assert r.returncode != 0
    assert "cannot have URI part" in r.stderr and "check.conf:" in r.stderr
    r = gannet.check(server="location ~ ^/x { proxy_pass http://127.0.0.1:9; }")
    assert r.returncode == 0, r.stderr
    r = gannet.check(server="location / { proxy_pass ftp://127.0.0.1:9; }")
    assert r.returncode != 0 and "invalid URL prefix" in r.stderr
    r = gannet.check(server="location / { proxy_pass http://127.0.0.1:9; fastcgi_pass 127.0.0.1:9; }")
    assert r.returncode != 0 and "duplicate" in r.stderr


def test_headers_sent_upstream(gannet, app):
    a = app(echo)
    srv = gannet.start(server=f"""
        location / {{
            proxy_pass http://127.0.0.1:{a.port};
            proxy_set_header Host backend.example;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header Accept-Encoding "";
        }}
    """)
    srv.get("/", headers={
        "X-Forwarded-For": "10.0.0.1",
        "Accept-Encoding": "gzip",
        "TE": "trailers",
        "Keep-Alive": "300",
        "Upgrade": "h2c",
        "X-Custom": "kept",
    })
    _, h = sent_head(a)
    assert h["host"] == ["backend.example"]
    assert h["x-real-ip"] == ["127.0.0.1"]
    assert h["x-forwarded-for"] == ["10.0.0.1, 127.0.0.1"]
    assert h["x-custom"] == ["kept"]
    # An empty value sends nothing; hop-by-hop headers never pass.
    for gone in ("accept-encoding", "te", "keep-alive", "upgrade"):
        assert gone not in h, gone


def test_set_header_lists_are_inherited_only_when_none_is_set(gannet, app):
    a = app(echo)
    srv = gannet.start(server=f"""
        proxy_set_header X-Level server;
        location /in/ {{ proxy_pass http://127.0.0.1:{a.port}; }}
        location /own/ {{ proxy_pass http://127.0.0.1:{a.port}; proxy_set_header X-Own yes; }}
    """)
    srv.get("/in/")
    assert sent_head(a)[1]["x-level"] == ["server"]
    srv.get("/own/")
    h = sent_head(a)[1]
    assert h["x-own"] == ["yes"] and "x-level" not in h


def test_request_bodies_go_with_a_length(gannet, app):
    a = app(echo)
    srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{a.port}; }}")
    status, _, body = srv.request("POST", "/p", body=b"x" * 100000, headers={"Content-Type": "text/plain"})
    assert status == 200
    assert a.requests[-1][2] == b"x" * 100000
    assert sent_head(a)[1]["content-length"] == ["100000"]
    # A chunked client body reaches the server whole, with a Content-Length.
    raw = srv.raw(b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                  b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 200")
    assert a.requests[-1][2] == b"hello world"
    h = sent_head(a)[1]
    assert h["content-length"] == ["11"] and "transfer-encoding" not in h


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_answer_framings_reach_the_client(gannet, app, framing):
    payload = b"".join(b"%05d," % i for i in range(3000))

    def answer(conn, head, body):
        if framing == "length":
            conn.sendall(http_answer(payload, headers="X-From: app\r\n"))
            return "again"
        if framing == "chunked":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-From: app\r\n\r\n")
            for i in range(0, len(payload), 7000):
                piece = payload[i:i + 7000]
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.sendall(b"0\r\nX-Trailer: t\r\n\r\n")
            return "again"
        conn.sendall(b"HTTP/1.0 200 OK\r\nX-From: app\r\n\r\n" + payload)
        return None

    a = app(answer)
    srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{a.port}; }}")
    status, h, body = srv.get("/f")
    assert (status, body) == (200, payload)
    assert h["x-from"] == "app"
    # An announced length goes as is; an answer of unknown length that came whole at once
    # gets its length, one the application paused in is streamed in chunks.
    if framing == "length":
        assert h["content-length"] == str(len(payload))
    else:
        assert h.get("content-length") == str(len(payload)) or h.get("transfer-encoding") == "chunked", h
    # HEAD gets the head only; the answer to it has no body whatever its fields say.
    status, h, body = srv.request("HEAD", "/f")
    assert status == 200 and body == b""


def test_big_answer_is_streamed_and_a_cut_closes_the_client(gannet, app):
    block = bytes(range(256)) * 4096  # 1 MiB

    def answer(conn, head, body):
        if b"/cut" in head:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (3 * len(block)))
            conn.sendall(block * 2)
            return None  # closes after 2 of the 3 MiB announced
        conn.sendall(http_answer(block * 3))
        return "again"

    a = app(answer)
    srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{a.port}; }}")
    status, h, body = srv.get("/whole")
    assert status == 200 and body == block * 3
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /cut HTTP/1.1\r\nHost: x\r\n\r\n")
        f = s.makefile("rb")
        head = read_head(f)
        assert head.startswith(b"HTTP/1.1 200")
        # The announced length goes as is, and the body ends short of it: the client sees
        # the answer is incomplete.
        assert b"content-length: %d\r\n" % (3 * len(block)) in head.lower()
        assert len(f.read()) < 3 * len(block)
    assert wait_until(lambda: "upstream prematurely closed connection" in srv.error_log())


def test_keepalive_pool_reuses_connections(gannet, app):
    a = app(echo)
    srv = gannet.start(
        http=f"upstream b {{ server 127.0.0.1:{a.port}; keepalive 4; }}",
        server="""location / { proxy_pass http://b; proxy_http_version 1.1;
                               proxy_set_header Connection ""; }""",
    )
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    for i in range(10):
        c.request("GET", f"/{i}")
        r = c.getresponse()
        assert r.status == 200 and f"GET /{i} HTTP/1.1".encode() in r.read()
    c.close()
    assert len(a.requests) == 10
    assert a.accepted == 1, "ten requests should share one upstream connection"
    assert "connection" not in sent_head(a)[1]


def bursts_of_three(srv):
    """Three requests at once, answered together (see `together`)."""
    with ThreadPoolExecutor(3) as pool:
        assert [r[0] for r in pool.map(lambda i: srv.get(f"/{i}"), range(3))] == [200] * 3


def together(n):
    """A backend behaviour: answer once `n` requests are in, so that each burst holds `n`
    upstream connections at the same time."""
    barrier = threading.Barrier(n, timeout=10)

    def behave(conn, head, body):
        barrier.wait()
        conn.sendall(http_answer(b"ok"))
        return "again"
    return behave


def test_connections_freed_over_keepalive_serve_the_next_burst_then_close(gannet, app):
    """`keepalive 1` and bursts of three: nginx closes the two connections freed over the one
    it keeps, and opens two again for the next burst; gannet keeps them for a second
    (upstream::SURPLUS_GRACE) and then closes them."""
    a = app(together(3))
    srv = gannet.start(
        http=f"upstream b {{ server 127.0.0.1:{a.port}; keepalive 1; }}",
        server="""location / { proxy_pass http://b; proxy_http_version 1.1;
                               proxy_set_header Connection ""; }""",
    )
    bursts_of_three(srv)
    bursts_of_three(srv)
    assert a.accepted == 3
    # With no more traffic the two over `keepalive` close; the kept one stays open.
    assert wait_until(lambda: a.ended == 2)
    bursts_of_three(srv)
    assert a.accepted == 5 and a.ended == 2


def test_kept_connection_closes_at_keepalive_timeout(gannet, app):
    """The upstream's keepalive_timeout closes an idle kept connection when it passes, with
    no request needed to notice (nginx's timer)."""
    a = app(echo)
    srv = gannet.start(
        http=f"upstream b {{ server 127.0.0.1:{a.port}; keepalive 4; keepalive_timeout 300ms; }}",
        server="""location / { proxy_pass http://b; proxy_http_version 1.1;
                               proxy_set_header Connection ""; }""",
    )
    assert srv.get("/")[0] == 200
    assert a.ended == 0
    assert wait_until(lambda: a.ended == 1)


def test_without_keepalive_settings_each_request_has_its_own_connection(gannet, app):
    a = app(echo)
    srv = gannet.start(
        http=f"upstream b {{ server 127.0.0.1:{a.port}; keepalive 4; }}",
        server="location / { proxy_pass http://b; }",
    )
    for i in range(3):
        assert srv.get(f"/{i}")[0] == 200
    # HTTP/1.0 with Connection: close (nginx's defaults): nothing can be kept.
    assert a.accepted == 3


def test_stale_pooled_connection_is_retried_on_a_fresh_one(gannet, app):
    def once(conn, head, body):
        # Answer as if the connection stayed open, then close it anyway (an idle timeout
        # on the server's side).
        conn.sendall(http_answer(b"ok"))
        return None

    a = app(once)
    srv = gannet.start(
        http=f"upstream b {{ server 127.0.0.1:{a.port}; keepalive 4; }}",
        server="""location / { proxy_pass http://b; proxy_http_version 1.1;
                               proxy_set_header Connection ""; }""",
    )
    for i in range(4):
        status, _, body = srv.request("POST", f"/{i}", body=b"data")
        assert (status, body) == (200, b"ok"), i
    assert len(a.requests) == 4
    assert "upstream prematurely closed" not in srv.error_log()


def test_failures_map_to_502_and_504(gannet, app):
    silent = app(lambda conn, head, body: conn.recv(1))  # never answers
    garbage = app(lambda conn, head, body: conn.sendall(b"SSH-2.0-OpenSSH_9\r\n\r\n"))
    ambiguous = app(lambda conn, head, body: conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"))
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    srv = gannet.start(server=f"""
        location /dead {{ proxy_pass http://127.0.0.1:{dead_port}; }}
        location /silent {{ proxy_pass http://127.0.0.1:{silent.port}; proxy_read_timeout 300ms; }}
        location /garbage {{ proxy_pass http://127.0.0.1:{garbage.port}; }}
        location /ambiguous {{ proxy_pass http://127.0.0.1:{ambiguous.port}; }}
    """)
    assert srv.get("/dead")[0] == 502
    assert srv.get("/silent")[0] == 504
    assert srv.get("/garbage")[0] == 502
    assert srv.get("/ambiguous")[0] == 502
    log = srv.error_log()
    assert 'connect() failed' in log and f'upstream: "http://127.0.0.1:{dead_port}"' in log
    assert "upstream timed out" in log
    assert "upstream sent no valid HTTP/1.0 header" in log
    assert '"Content-Length" and "Transfer-Encoding"' in log


def test_next_upstream_skips_a_dead_server_and_logs_both(gannet, app):
    a = app(echo)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    srv = gannet.start(
        http=f"""upstream b {{ server 127.0.0.1:{dead_port}; server 127.0.0.1:{a.port}; }}
                 log_format up '$uri $status "$upstream_addr" "$upstream_status" $upstream_response_time';
                 access_log {{tmp}}/up.log up;""".replace("{tmp}", str(gannet.tmp)),
        server="location / { proxy_pass http://b; }",
    )
    for i in range(4):
        assert srv.get(f"/n{i}")[0] == 200
    log = (gannet.tmp / "up.log").read_text()
    # The dead one was tried first once; then it is skipped for fail_timeout.
    assert f'"127.0.0.1:{dead_port}, 127.0.0.1:{a.port}" "502, 200"' in log
    assert log.count(str(dead_port)) == 1, log
    assert log.splitlines()[-1].startswith("/n3 200 \"127.0.0.1:")


def test_next_upstream_on_status_and_non_idempotent_requests(gannet, app):
    busy = app(lambda conn, head, body: conn.sendall(http_answer(b"busy", "503 Busy")))
    good = app(lambda conn, head, body: conn.sendall(http_answer(b"good")))
    srv = gannet.start(
        http=f"upstream b {{ server 127.0.0.1:{busy.port} max_fails=0; server 127.0.0.1:{good.port}; }}",
        server="""location / { proxy_pass http://b; proxy_next_upstream error timeout http_503; }
                  location /off/ { proxy_pass http://b; proxy_next_upstream off; }""",
    )
    # Round robin starts on the busy server; its 503 sends GET on to the good one.
    assert srv.get("/a")[2] == b"good"
    assert srv.get("/a")[2] == b"good"
    # POST is not idempotent: the 503 is the answer.
    statuses = {srv.request("POST", "/p", body=b"x")[0] for _ in range(4)}
    assert statuses == {503, 200}
    # With retries off a GET gets the 503 too.
    assert {srv.get("/off/x")[0] for _ in range(4)} == {503, 200}
    # A dying server: POST already sent is not retried.
    dying = app(lambda conn, head, body: None)
    srv2 = gannet.start(
        http=f"upstream d {{ server 127.0.0.1:{dying.port}; server 127.0.0.1:{good.port}; }}",
        server="location / { proxy_pass http://d; }",
    )
    before = len(good.requests)
    results = [srv2.request("POST", "/x", body=b"y")[0] for _ in range(2)]
    assert sorted(results) == [200, 502]
    assert len(good.requests) == before + 1
    # GET to the same pair is retried on the good one.
    assert {srv2.get("/g")[0] for _ in range(2)} == {200}


def test_proxy_redirect_default_and_rules(gannet, app):
    def redirect(conn, head, body):
        target = head.split(b" ")[1].decode()
        loc = f"http://127.0.0.1:{a.port}/two/next" if target.startswith("/two/") else "http://elsewhere.example/x/y"
        conn.sendall(http_answer(b"", "302 Found", f"Location: {loc}\r\nRefresh: 3; url={loc}\r\n"))
        return "again"

    a = app(redirect)
    srv = gannet.start(server=f"""
        location /one/ {{ proxy_pass http://127.0.0.1:{a.port}/two/; }}
        location /off/ {{ proxy_pass http://127.0.0.1:{a.port}/two/; proxy_redirect off; }}
        location /rule/ {{ proxy_pass http://127.0.0.1:{a.port}; proxy_redirect ~^http://elsewhere\\.example/(\\w+)/ /moved/$1/; }}
    """)
    status, h, _ = srv.get("/one/a")
    assert status == 302 and h["location"].endswith("/one/next")
    assert h["refresh"].endswith("url=/one/next")
    _, h, _ = srv.get("/off/a")
    assert h["location"] == f"http://127.0.0.1:{a.port}/two/next"
    _, h, _ = srv.get("/rule/a")
    # A regex rule replaces the whole value, not only what it matched (nginx's rule), and
    # the relative result is made absolute like any Location.
    assert h["location"] == f"http://127.0.0.1:{srv.port}/moved/x/"


def test_intercept_errors_and_hidden_headers(gannet, app):
    a = app(lambda conn, head, body: conn.sendall(http_answer(
        b"app 404", "404 Not Found", "Server: app/1\r\nX-Secret: s\r\nX-Pad: p\r\nX-Shown: v\r\n")))
    srv = gannet.start(
        files={"404.html": "our page"},
        server=f"""
        location /raw/ {{ proxy_pass http://127.0.0.1:{a.port}; proxy_hide_header X-Secret; }}
        location /caught/ {{ proxy_pass http://127.0.0.1:{a.port}; proxy_intercept_errors on; error_page 404 /404.html; }}
        location = /404.html {{ }}
    """)
    status, h, body = srv.get("/raw/x")
    assert (status, body) == (404, b"app 404")
    assert h["server"].startswith("gannet") and "x-secret" not in h and "x-pad" not in h
    assert h["x-shown"] == "v"
    status, _, body = srv.get("/caught/x")
    assert (status, body) == (404, b"our page")


def keepalive_timers(conn, head, body):
    """Answer with what `ss` says of the proxy's side of this very connection: a socket with
    SO_KEEPALIVE shows a `keepalive` timer."""
    gannet_port = conn.getpeername()[1]
    out = subprocess.run(["ss", "-tnoH", "state", "established", f"( sport = :{gannet_port} )"], capture_output=True, text=True, timeout=10).stdout
    conn.sendall(http_answer(out.encode() or b"no socket found"))


def test_socket_keepalive_sets_keepalive_probes(gannet, app):
    a = app(keepalive_timers)
    srv = gannet.start(server=f"""
        location /on/ {{ proxy_pass http://127.0.0.1:{a.port}; proxy_socket_keepalive on; }}
        location /off/ {{ proxy_pass http://127.0.0.1:{a.port}; }}
    """)
    status, _, on = srv.get("/on/")
    assert status == 200 and b"127.0.0.1" in on and b"keepalive" in on, on
    status, _, off = srv.get("/off/")
    assert status == 200 and b"127.0.0.1" in off and b"keepalive" not in off, off


def test_variables_in_proxy_pass_and_groups_by_name(gannet, app):
    a = app(echo)
    srv = gannet.start(
        http=f"upstream grp {{ server 127.0.0.1:{a.port}; }}",
        server=f"""
        location /v/ {{ proxy_pass http://127.0.0.1:{a.port}/fixed$is_args$args; }}
        location /g/ {{ set $b grp; proxy_pass http://$b; }}
        location /bad/ {{ set $u "nonsense"; proxy_pass $u; }}
    """)
    srv.get("/v/anything?k=v")
    assert sent_head(a)[0] == "GET /fixed?k=v HTTP/1.0"
    srv.get("/g/x")
    line, h = sent_head(a)
    assert line == "GET /g/x HTTP/1.0" and h["host"] == ["grp"]
    assert srv.get("/bad/")[0] == 500


def test_behind_a_real_server(gannet, tmp_path):
    """gannet serving files behind gannet: ranges, conditional requests and 404s pass."""
    backend_dir = tmp_path / "backend"
    backend_dir.mkdir()
    (backend_dir / "www").mkdir()
    (backend_dir / "www" / "f.txt").write_text("0123456789" * 100)
    from conftest import Gannet
    back = Gannet(backend_dir)
    try:
        b = back.start()
        srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{b.port}; }}")
        status, h, body = srv.get("/f.txt")
        assert status == 200 and body == b"0123456789" * 100
        etag = h["etag"]
        status, h, body = srv.get("/f.txt", headers={"Range": "bytes=10-19"})
        assert (status, body) == (206, b"0123456789")
        assert h["content-range"] == "bytes 10-19/1000"
        assert srv.get("/f.txt", headers={"If-None-Match": etag})[0] == 304
        assert srv.get("/missing")[0] == 404
    finally:
        back.close()


def upgrading(conn, head, body):
    """Switch to an echo protocol that answers in upper case, with a first message sent in
    the same write as the 101 head; a request without Upgrade gets a 101 anyway (broken)."""
    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: shout\r\nConnection: Upgrade\r\n\r\nready;")
    while True:
        data = conn.recv(65536)
        if not data:
            conn.shutdown(socket.SHUT_WR)
            return None
        conn.sendall(data.upper())


WS = """location /ws {{
    proxy_pass http://127.0.0.1:{port};
    proxy_http_version 1.1;
    proxy_set_header Upgrade $http_upgrade;
    proxy_set_header Connection "upgrade";
    proxy_read_timeout {timeout};
}}"""


def test_upgrade_relays_both_ways_until_both_close(gannet, app):
    a = app(upgrading)
    srv = gannet.start(server=WS.format(port=a.port, timeout="10s"))
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        # The first message rides with the request, as clients may send it.
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: shout\r\nConnection: Upgrade\r\n\r\nfirst;")
        f = s.makefile("rb")
        head = read_head(f).lower()
        assert head.startswith(b"http/1.1 101")
        assert b"upgrade: shout" in head and b"connection: upgrade" in head
        got = b""
        while b"FIRST;" not in got:
            got += f.read1(100)
        assert got == b"ready;FIRST;"
        for word in (b"one", b"two" * 10000):
            s.sendall(word)
            want, got = word.upper(), b""
            while len(got) < len(want):
                got += f.read1(65536)
            assert got == want
        # A half close reaches the server, whose close then reaches the client.
        s.shutdown(socket.SHUT_WR)
        assert f.read1(10) == b""
    line, h = sent_head(a)
    assert h["upgrade"] == ["shout"] and h["connection"] == ["upgrade"]
    assert wait_until(lambda: '"GET /ws HTTP/1.1" 101' in srv.access_log())


def test_idle_tunnel_is_closed_after_read_timeout(gannet, app):
    a = app(upgrading)
    srv = gannet.start(server=WS.format(port=a.port, timeout="300ms"))
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: shout\r\nConnection: Upgrade\r\n\r\n")
        got = b""
        while True:
            b = s.recv(1000)
            if not b:
                break
            got += b
        assert got.startswith(b"HTTP/1.1 101") and got.endswith(b"ready;")


def test_101_to_a_request_without_upgrade_is_passed_without_a_body(gannet, app):
    # As nginx (1.22 and since): the 101's head goes to the client, nothing is switched or
    # relayed (what the server sent after it is dropped), and the connection ends; the
    # access log has a 101 with no body bytes.
    a = app(upgrading)
    srv = gannet.start(server=WS.format(port=a.port, timeout="10s"))
    got = srv.raw(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101") and body == b""
    assert wait_until(lambda: '"GET /ws HTTP/1.1" 101 0 ' in srv.access_log())


def test_mirror_copies_requests_without_slowing_them(gannet, app):
    main = app(echo)
    copies = []

    def shadow_never_answers(conn, head, body):
        copies.append((head, body))
        conn.recv(1)  # holds the copy until the test ends

    shadow = app(shadow_never_answers)
    srv = gannet.start(server=f"""
        location / {{
            mirror /mirror;
            proxy_pass http://127.0.0.1:{main.port};
        }}
        location /nobody/ {{
            mirror /mirror;
            mirror_request_body off;
            proxy_pass http://127.0.0.1:{main.port};
        }}
        location = /mirror {{
            internal;
            proxy_pass http://127.0.0.1:{shadow.port}$request_uri;
            proxy_read_timeout 60s;
        }}
    """)
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    # Keep-alive requests one after the other: none waits for the shadow, which never answers.
    for i in range(3):
        c.request("POST", f"/p{i}?a=b", body=f"body{i}".encode())
        r = c.getresponse()
        assert r.status == 200 and f"POST /p{i}?a=b".encode() in r.read()
    c.request("POST", "/nobody/x", body=b"secret")
    assert c.getresponse().read().endswith(b"secret")
    c.close()
    assert wait_until(lambda: len(copies) == 4)
    got = sorted((h.split(b"\r\n")[0], b) for h, b in copies)
    assert got == [
        (b"POST /nobody/x HTTP/1.0", b""),
        (b"POST /p0?a=b HTTP/1.0", b"body0"),
        (b"POST /p1?a=b HTTP/1.0", b"body1"),
        (b"POST /p2?a=b HTTP/1.0", b"body2"),
    ]
    # The mirror location is internal: a client cannot reach it.
    assert srv.get("/mirror")[0] == 404


def test_mirror_copies_requests_over_http2_too(gannet, app):
    main = app(echo)
    copies = []

    def shadow(conn, head, body):
        copies.append((head, body))
        conn.sendall(http_answer(b"dropped"))

    shadow_app = app(shadow)
    srv = gannet.start(server=f"""
        http2 on;
        location / {{ mirror /mirror; proxy_pass http://127.0.0.1:{main.port}; }}
        location = /mirror {{ internal; proxy_pass http://127.0.0.1:{shadow_app.port}$request_uri; }}
    """)
    r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "--data-binary", "h2 body",
                        f"http://127.0.0.1:{srv.port}/h2?x=1"], capture_output=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith(b"POST /h2?x=1 HTTP/1.0") and r.stdout.endswith(b"h2 body")
    assert wait_until(lambda: len(copies) == 1)
    assert copies[0][0].split(b"\r\n")[0] == b"POST /h2?x=1 HTTP/1.0" and copies[0][1] == b"h2 body"


def test_active_health_checks_route_around_a_sick_server(gannet, app):
    state = {"sick": True}

    def serve(name):
        def behave(conn, head, body):
            if head.startswith(b"GET /health"):
                if name == "b" and state["sick"]:
                    conn.sendall(http_answer(b"dying", "200 OK"))
                else:
                    conn.sendall(http_answer(b"all ok"))
                return None
            conn.sendall(http_answer(name.encode()))
            return None
        return behave

    a, b = app(serve("a")), app(serve("b"))
    srv = gannet.start(
        http=f"""upstream pool {{ server 127.0.0.1:{a.port}; server 127.0.0.1:{b.port}; }}
                 match healthy {{ status 200; body ~ "ok"; }}""",
        server="""location / { proxy_pass http://pool; health_check interval=100ms fails=2 passes=2 uri=/health match=healthy; }""",
    )
    # b answers its probes with 200 but without "ok": the match marks it unhealthy.
    assert wait_until(lambda: f"127.0.0.1:{b.port} of \"pool\" is unhealthy" in srv.error_log())
    assert {srv.get(f"/{i}")[2] for i in range(6)} == {b"a"}
    state["sick"] = False
    assert wait_until(lambda: f"127.0.0.1:{b.port} of \"pool\" is healthy again" in srv.error_log())
    assert {srv.get(f"/{i}")[2] for i in range(6)} == {b"a", b"b"}
    probes = [h for _, h, _ in b.requests if h.startswith(b"GET /health")]
    assert probes and b"Host: pool" in probes[0]


def test_health_check_config_errors(gannet):
    r = gannet.check(server="location / { proxy_pass http://127.0.0.1:9; health_check; }")
    assert r.returncode != 0 and "needs \"proxy_pass\" to an upstream group" in r.stderr
    r = gannet.check(http="upstream u { server 127.0.0.1:9; }",
                     server="location / { proxy_pass http://u; health_check match=nope; }")
    assert r.returncode != 0 and 'match "nope" not found' in r.stderr
    r = gannet.check(http="upstream u { server 127.0.0.1:9; } match m { status 200-99; }",
                     server="location / { proxy_pass http://u; health_check match=m; }")
    assert r.returncode != 0 and "invalid value" in r.stderr
