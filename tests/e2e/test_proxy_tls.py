"""`proxy_pass https://...`: gannet as a TLS client of real TLS servers (Python's ssl module,
which records what each handshake carried: SNI, resumption, the client's certificate), with
keys and certificates made at test time by the openssl CLI."""

from __future__ import annotations

import socket
import ssl
import subprocess

import pytest

from conftest import wait_until
from rawapps import HttpApp, Listener, TlsHttpApp, http_answer, made
from test_tls import Pki

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="needs the openssl command-line tool",
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.issue("backend", "localhost", sans=("localhost", "backend.test"))
    p.issue("client", "gannet-client", org="Gannet Test")
    p.self_signed("stranger", "stranger")
    return p


@pytest.fixture
def app():
    yield from made(TlsHttpApp)


@pytest.fixture
def plain():
    yield from made(HttpApp)


def server_ctx(pki, client_ca: bool = False) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.path("backend.pem"), pki.path("backend.key"))
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki.path("ca.pem"))
    return ctx


def echo(conn, head, body):
    """Answer with the request head and body, keeping the connection."""
    conn.sendall(http_answer(head + b"\r\n\r\n" + body))
    return "again"


KEEP = 'proxy_http_version 1.1; proxy_set_header Connection "";'


def test_https_upstream_is_proxied_with_its_host_and_body(gannet, app, pki):
    a = app(echo, server_ctx(pki))
    srv = gannet.start(server=f"""
        location / {{ proxy_pass https://127.0.0.1:{a.port}; }}
        location /v/ {{ set $b 127.0.0.1:{a.port}; proxy_pass https://$b; }}
    """)
    status, _, body = srv.request("POST", "/x?y=1", body=b"hello")
    assert status == 200
    assert body.startswith(b"POST /x?y=1 HTTP/1.0\r\n")
    assert f"Host: 127.0.0.1:{a.port}\r\n".encode() in body
    assert body.endswith(b"\r\n\r\nhello")
    status, _, body = srv.get("/v/z")
    assert status == 200 and body.startswith(b"GET /v/z HTTP/1.0\r\n")
    # No verification by default (the CA is unknown to gannet), TLS 1.3 by default.
    assert [h["version"] for h in a.handshakes] == ["TLSv1.3", "TLSv1.3"]


def test_methods_a_limit_except_block_serves_go_over_tls_too(gannet, app, pki):
    # The block's own settings serve POST here: they need the location's TLS setup too.
    a = app(echo, server_ctx(pki))
    srv = gannet.start(server=f"""
        location / {{ limit_except GET {{ allow 127.0.0.1; }} proxy_pass https://127.0.0.1:{a.port}; }}
    """)
    status, _, body = srv.request("POST", "/p", body=b"hello")
    assert status == 200 and body.startswith(b"POST /p HTTP/1.0\r\n") and body.endswith(b"hello")
    assert srv.get("/g")[0] == 200


def test_protocols_are_what_proxy_ssl_protocols_allows(gannet, app, pki):
    a = app(echo, server_ctx(pki))
    srv = gannet.start(server=f"""
        location / {{ proxy_pass https://127.0.0.1:{a.port}; proxy_ssl_protocols TLSv1.2; }}
    """)
    assert srv.get("/")[0] == 200
    assert a.handshakes[-1]["version"] == "TLSv1.2"


def test_keepalive_connections_are_reused_over_tls(gannet, app, pki):
    a = app(echo, server_ctx(pki))
    srv = gannet.start(
        http=f"upstream tls_b {{ server 127.0.0.1:{a.port}; keepalive 4; }}",
        server=f"location / {{ proxy_pass https://tls_b; {KEEP} }}",
    )
    for i in range(5):
        status, _, body = srv.get(f"/r{i}")
        assert status == 200 and body.startswith(f"GET /r{i} HTTP/1.1".encode())
        # The group's name is the Host, as with http://.
        assert b"Host: tls_b\r\n" in body
    assert a.accepted == 1 and len(a.requests) == 5
    assert all(n == 1 for n, _, _ in a.requests)


def test_a_pooled_tls_connection_the_server_closed_is_not_reused(gannet, app, pki):
    def answer_then_close_notify(conn, head, body):
        conn.sendall(http_answer(b"ok"))
        # close_notify, with the TCP connection left open: only TLS says it is over.
        conn.unwrap()
        return "again"

    a = app(answer_then_close_notify, server_ctx(pki))
    srv = gannet.start(
        http=f"upstream tls_b {{ server 127.0.0.1:{a.port}; keepalive 4; }}",
        server=f"location / {{ proxy_pass https://tls_b; {KEEP} }}",
    )
    for _ in range(3):
        assert srv.get("/")[:3:2] == (200, b"ok")
    assert a.accepted == 3
    assert "upstream" not in srv.error_log()


def test_sessions_are_resumed_unless_reuse_is_off(gannet, app, pki):
    a = app(echo, server_ctx(pki))
    b = app(echo, server_ctx(pki))
    srv = gannet.start(server=f"""
        location /on/ {{ proxy_pass https://127.0.0.1:{a.port}; }}
        location /off/ {{ proxy_pass https://127.0.0.1:{b.port}; proxy_ssl_session_reuse off; }}
    """)
    for _ in range(3):
        assert srv.get("/on/")[0] == 200
        assert srv.get("/off/")[0] == 200
    assert [h["reused"] for h in a.handshakes] == [False, True, True]
    assert [h["reused"] for h in b.handshakes] == [False, False, False]


def test_sni_is_sent_only_with_proxy_ssl_server_name_on(gannet, app, pki):
    a = app(echo, server_ctx(pki))
    srv = gannet.start(server=f"""
        location /default/ {{ proxy_pass https://localhost:{a.port}; }}
        location /on/ {{ proxy_pass https://localhost:{a.port}; proxy_ssl_server_name on; }}
        location /named/ {{ proxy_pass https://localhost:{a.port}; proxy_ssl_server_name on; proxy_ssl_name backend.test; }}
        location /ip/ {{ proxy_pass https://127.0.0.1:{a.port}; proxy_ssl_server_name on; }}
    """)
    for path in ("/default/", "/on/", "/named/", "/ip/"):
        assert srv.get(path)[0] == 200
    # $proxy_host without its port; an IP address is never sent (RFC 6066).
    assert a.snis == [None, "localhost", "backend.test", None]


def test_verification_with_the_right_and_wrong_ca(gannet, app, pki):
    a = app(echo, server_ctx(pki))
    ca, stranger = pki.path("ca.pem"), pki.path("stranger.pem")
    srv = gannet.start(server=f"""
        proxy_ssl_verify on;
        proxy_ssl_verify_depth 2;
        location /right/ {{ proxy_pass https://localhost:{a.port}; proxy_ssl_trusted_certificate {ca}; }}
        location /ip/ {{ proxy_pass https://127.0.0.1:{a.port}; proxy_ssl_name backend.test; proxy_ssl_trusted_certificate {ca}; }}
        location /wrong/ {{ proxy_pass https://localhost:{a.port}; proxy_ssl_trusted_certificate {stranger}; }}
        location /name/ {{ proxy_pass https://localhost:{a.port}; proxy_ssl_name other.test; proxy_ssl_trusted_certificate {ca}; }}
    """)
    assert srv.get("/right/")[0] == 200
    # The name checked is proxy_ssl_name's, even with SNI off (the default).
    assert srv.get("/ip/")[0] == 200
    assert a.snis == [None, None]
    assert srv.get("/wrong/")[0] == 502
    log = wait_until(lambda: "certificate verify error" in srv.error_log() and srv.error_log())
    assert "upstream SSL certificate verify error: (UnknownIssuer) while SSL handshaking to upstream" in log
    # `localhost` was looked up as the config loaded: the line names the address, as nginx's.
    assert f'upstream: "https://127.0.0.1:{a.port}"' in log
    assert srv.get("/name/")[0] == 502
    log = wait_until(lambda: "does not match" in srv.error_log() and srv.error_log())
    assert 'upstream SSL certificate does not match "other.test" while SSL handshaking to upstream' in log
    # Neither failed handshake carried a request.
    assert len(a.requests) == 2


def test_client_certificate_for_an_upstream_that_requires_one(gannet, app, pki):
    a = app(echo, server_ctx(pki, client_ca=True))
    cert, key = pki.path("client.pem"), pki.path("client.key")
    srv = gannet.start(server=f"""
        location /with/ {{ proxy_pass https://127.0.0.1:{a.port}; proxy_ssl_certificate {cert}; proxy_ssl_certificate_key {key}; }}
        location /without/ {{ proxy_pass https://127.0.0.1:{a.port}; }}
    """)
    status, _, body = srv.get("/with/")
    assert status == 200 and body.startswith(b"GET /with/ ")
    assert a.handshakes[-1]["subject"]["commonName"] == "gannet-client"
    assert srv.get("/without/")[0] == 502
    assert wait_until(lambda: a.failed)
    assert len(a.requests) == 1


class NotTls(Listener):
    """A plain HTTP server: answers whatever comes with a 400 and closes, as a web server
    does with a ClientHello."""

    def serve(self, conn):
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        conn.close()


class Closer(Listener):
    """Accepts and closes at once."""

    def serve(self, conn):
        conn.close()


@pytest.fixture
def raw():
    listeners = []

    def make(cls):
        listeners.append(cls())
        return listeners[-1]

    yield make
    for listener in listeners:
        listener.close()


def test_a_backend_that_is_not_tls_is_a_502_without_a_hang(gannet, raw):
    plain, closer = raw(NotTls), raw(Closer)
    srv = gannet.start(server=f"""
        proxy_connect_timeout 30s;
        location /plain/ {{ proxy_pass https://127.0.0.1:{plain.port}; }}
        location /closer/ {{ proxy_pass https://127.0.0.1:{closer.port}; }}
    """)
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    for path in ("/plain/", "/closer/"):
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = c.recv(65536)
        assert head.startswith(b"HTTP/1.1 502 "), head
    c.close()
    # The closer either closed before the ClientHello came (end of stream) or after (a
    # reset): either way the handshake failed, and the log says so for each.
    def lines():
        log = srv.error_log().splitlines()
        return [
            [line for line in log if f'upstream: "https://127.0.0.1:{p}"' in line and "while SSL handshaking to upstream" in line]
            for p in (plain.port, closer.port)
        ]

    assert wait_until(lambda: all(lines()))
    assert "SSL_do_handshake() failed (received corrupt message" in lines()[0][0]


def test_a_failed_handshake_goes_to_the_next_upstream(gannet, app, raw, pki):
    bad = raw(NotTls)
    good = app(echo, server_ctx(pki))
    srv = gannet.start(
        http=f"upstream mixed {{ server 127.0.0.1:{bad.port} max_fails=0; server 127.0.0.1:{good.port}; }}",
        server="""
            location / { proxy_pass https://mixed; }
            location /off/ { proxy_pass https://mixed; proxy_next_upstream off; }
        """,
    )
    # Nothing was sent to the first: even a POST goes on to the next.
    for _ in range(2):
        status, _, body = srv.request("POST", "/p", body=b"b")
        assert status == 200 and body.startswith(b"POST /p ")
    assert f'upstream: "https://127.0.0.1:{bad.port}"' in srv.error_log()
    # With next_upstream off, the failing server's turn is a 502.
    statuses = {srv.get("/off/")[0] for _ in range(2)}
    assert statuses == {200, 502}


def test_tls_upgrade_tunnel_relays_both_ways(gannet, app, pki):
    def upgrade(conn, head, body):
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: upgrade\r\n\r\n")
        data = conn.recv(100)
        conn.sendall(b"echo:" + data)
        conn.close()

    a = app(upgrade, server_ctx(pki))
    srv = gannet.start(server=f"""
        location / {{ proxy_pass https://127.0.0.1:{a.port}; proxy_http_version 1.1;
                     proxy_set_header Upgrade $http_upgrade; proxy_set_header Connection upgrade; }}
    """)
    c = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: test\r\nConnection: upgrade\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got:
        got += c.recv(4096)
    assert got.startswith(b"HTTP/1.1 101 ")
    c.sendall(b"ping")
    rest = got.split(b"\r\n\r\n", 1)[1]
    while b"echo:ping" not in rest:
        more = c.recv(4096)
        assert more, rest
        rest += more
    c.close()


@pytest.mark.parametrize("directives,error", [
    ("proxy_ssl_verify on;", "no proxy_ssl_trusted_certificate for proxy_ssl_verify"),
    ("proxy_ssl_verify on; proxy_ssl_trusted_certificate {tmp}/missing.pem;", 'cannot load trusted certificate "{tmp}/missing.pem"'),
    ("proxy_ssl_verify on; proxy_ssl_trusted_certificate {tmp}/junk.pem;", "no PEM certificate in it"),
    ("proxy_ssl_certificate {pki}/client.pem;", 'no "proxy_ssl_certificate_key" is defined for certificate'),
    ("proxy_ssl_certificate {pki}/client.pem; proxy_ssl_certificate_key {pki}/backend.key;", "does not match certificate"),
    ("proxy_ssl_protocols SSLv3;", '"proxy_ssl_protocols" names no protocol gannet offers'),
    ("proxy_ssl_server_name maybe;", "proxy_ssl_server_name"),
])
def test_config_errors_name_the_line(gannet, pki, directives, error):
    (gannet.tmp / "junk.pem").write_text("not a certificate\n")
    fill = lambda s: s.replace("{tmp}", str(gannet.tmp)).replace("{pki}", str(pki.d))
    r = gannet.check(server=f"""
        location / {{
            proxy_pass https://127.0.0.1:1;
            {fill(directives)}
        }}
    """)
    assert r.returncode != 0
    assert fill(error) in r.stderr
    # The directive's line (the config's 'location' is on the line before).
    assert "check.conf:" in r.stderr


def test_verify_without_https_needs_nothing(gannet):
    # As nginx: TLS settings matter only where proxy_pass may be https (a URL with
    # variables may be).
    r = gannet.check(server="proxy_ssl_verify on; location / { proxy_pass http://127.0.0.1:1; }")
    assert r.returncode == 0, r.stderr
    r = gannet.check(server="proxy_ssl_verify on; location / { proxy_pass http://$arg_x; }")
    assert r.returncode != 0 and "no proxy_ssl_trusted_certificate" in r.stderr


def test_health_checks_probe_https_servers_over_tls(gannet, app, raw, pki):
    def serve(conn, head, body):
        conn.sendall(http_answer(b"ok"))
        return None

    good = app(serve, server_ctx(pki))
    bad = raw(NotTls)
    ca = pki.path("ca.pem")
    srv = gannet.start(
        http=f"upstream pool {{ server 127.0.0.1:{good.port}; server 127.0.0.1:{bad.port}; }}",
        server=f"""location / {{ proxy_pass https://pool; proxy_ssl_verify on;
                   proxy_ssl_trusted_certificate {ca}; proxy_ssl_name backend.test;
                   health_check interval=100ms uri=/health; }}""",
    )
    # The plain server fails its probes' handshakes; the TLS one passes them, verified.
    assert wait_until(lambda: f"127.0.0.1:{bad.port} of \"pool\" is unhealthy" in srv.error_log())
    assert wait_until(lambda: any(h.startswith(b"GET /health") for _, h, _ in good.requests))
    assert f"127.0.0.1:{good.port} of \"pool\" is unhealthy" not in srv.error_log()
    assert {srv.get(f"/{i}")[0] for i in range(4)} == {200}
