"""grpc_pass: real gRPC calls (Python grpcio, Debian's python3-grpcio) through gannet to a
grpcio server, over h2c (`grpc://`) and TLS (`grpcs://`): the four call shapes, metadata
and trailers both ways, deadlines, cancellation reaching the server, upstream failures as
gRPC statuses, and the unary and error cases side by side with Debian's nginx."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from concurrent import futures

import pytest

from conftest import free_port, wait_until
from nginx_peer import NGINX, side_by_side
from test_tls import Pki

# Debian's grpcio lives in the system's dist-packages (same CPython 3.11 ABI).
sys.path.append("/usr/lib/python3/dist-packages")
grpc = pytest.importorskip("grpc", reason="needs python3-grpcio")

SVC = "test.Svc"


class App:
    """A grpcio server whose methods take and give raw bytes, recording what it saw."""

    def __init__(self, creds=None):
        self.seen_md: dict = {}
        self.release = threading.Event()
        self.first_sent = threading.Event()
        self.cancelled = threading.Event()
        self.deadline_left = None
        self.calls: list = []
        handlers = {
            "Unary": grpc.unary_unary_rpc_method_handler(self.unary),
            "Fail": grpc.unary_unary_rpc_method_handler(self.fail),
            "Slow": grpc.unary_unary_rpc_method_handler(self.slow),
            "Server": grpc.unary_stream_rpc_method_handler(self.server_stream),
            "Client": grpc.stream_unary_rpc_method_handler(self.client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(self.bidi),
        }
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SVC, handlers),))
        self.port = free_port()
        if creds is None:
            self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        else:
            self.server.add_secure_port(f"127.0.0.1:{self.port}", creds)
        self.server.start()

    def stop(self):
        self.server.stop(0)

    def unary(self, req, ctx):
        self.calls.append(req)
        self.seen_md = dict(ctx.invocation_metadata())
        ctx.send_initial_metadata((("x-up-head", "h1"),))
        ctx.set_trailing_metadata((("x-up-trailer", "t1"),))
        return b"echo:" + req

    def fail(self, req, ctx):
        ctx.abort(grpc.StatusCode.NOT_FOUND, "no such thing")

    def slow(self, req, ctx):
        self.deadline_left = ctx.time_remaining()
        ctx.add_callback(self.cancelled.set)
        # Until the call is cancelled (or its deadline passes): never answered otherwise.
        self.cancelled.wait(30)
        return b"late"

    def server_stream(self, req, ctx):
        yield b"first"
        self.first_sent.set()
        # The second message waits until the client has the first: with a buffered
        # answer the client would never get it, and this would time out.
        if not self.release.wait(20):
            return
        yield b"second"

    def client_stream(self, it, ctx):
        return b"+".join(it)

    def bidi(self, it, ctx):
        for m in it:
            yield b"re:" + m


@pytest.fixture
def app():
    a = App()
    yield a
    a.stop()


def conf_for(port_line: str, location: str, http: str = "") -> str:
    return f"""
worker_processes 1;
pid {{tmp}}/server.pid;
error_log {{tmp}}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {{tmp}}/access.log;
    {http}
    server {{
        {port_line}
        {location}
    }}
}}
"""


def start(gannet, location: str, http: str = ""):
    return gannet.start(conf=conf_for("listen 127.0.0.1:{port} http2;", location, http))


def channel(port):
    return grpc.insecure_channel(f"127.0.0.1:{port}")


def test_unary_with_metadata_and_set_header(gannet, app):
    srv = start(gannet, f"""
        location / {{
            grpc_pass grpc://127.0.0.1:{app.port};
            grpc_set_header X-Set "from-gannet";
        }}""")
    with channel(srv.port) as ch:
        call = ch.unary_unary(f"/{SVC}/Unary")
        resp, c = call.with_call(b"hello", metadata=(("x-client", "c1"),), timeout=10)
    assert resp == b"echo:hello"
    assert app.seen_md.get("x-client") == "c1"
    assert app.seen_md.get("x-set") == "from-gannet"
    assert dict(c.initial_metadata()).get("x-up-head") == "h1"
    assert dict(c.trailing_metadata()).get("x-up-trailer") == "t1"
    assert c.code() == grpc.StatusCode.OK
    wait_until(lambda: "POST /test.Svc/Unary HTTP/2.0\" 200" in srv.access_log())


def test_status_and_message_pass_through(gannet, app):
    srv = start(gannet, f"location / {{ grpc_pass 127.0.0.1:{app.port}; }}")
    with channel(srv.port) as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(f"/{SVC}/Fail")(b"x", timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "no such thing"


def test_server_streaming_arrives_as_sent(gannet, app):
    srv = start(gannet, f"location / {{ grpc_pass grpc://127.0.0.1:{app.port}; }}")
    with channel(srv.port) as ch:
        it = ch.unary_stream(f"/{SVC}/Server")(b"go", timeout=20)
        first = next(it)
        # The first message came while the server still holds the call open.
        assert first == b"first" and not app.release.is_set()
        app.release.set()
        assert list(it) == [b"second"]


def test_upstream_gone_mid_stream_fails_the_call(gannet, app):
    srv = start(gannet, f"location / {{ grpc_pass grpc://127.0.0.1:{app.port}; }}")
    with channel(srv.port) as ch:
        it = ch.unary_stream(f"/{SVC}/Server")(b"go", timeout=20)
        assert next(it) == b"first"
        app.stop()
        # Not a clean end: the client's stream is reset, the call fails.
        with pytest.raises(grpc.RpcError) as e:
            list(it)
        assert e.value.code() != grpc.StatusCode.OK
    app.release.set()
    wait_until(lambda: "while reading upstream" in srv.error_log())


def test_client_streaming_and_bidi(gannet, app):
    srv = start(gannet, f"location / {{ grpc_pass grpc://127.0.0.1:{app.port}; }}")
    with channel(srv.port) as ch:
        assert ch.stream_unary(f"/{SVC}/Client")(iter([b"a", b"b", b"c"]), timeout=10) == b"a+b+c"
        # Each message is sent only once the answer to the previous one came back.
        q: queue.Queue = queue.Queue()
        q.put(b"m0")

        def requests():
            while True:
                m = q.get()
                if m is None:
                    return
                yield m

        got = []
        for r in ch.stream_stream(f"/{SVC}/Bidi")(requests(), timeout=10):
            got.append(r)
            q.put(f"m{len(got)}".encode() if len(got) < 3 else None)
        assert got == [b"re:m0", b"re:m1", b"re:m2"]


def test_deadline_passes_and_cancellation_reaches_upstream(gannet, app):
    srv = start(gannet, f"location / {{ grpc_pass grpc://127.0.0.1:{app.port}; }}")
    with channel(srv.port) as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(f"/{SVC}/Slow")(b"x", timeout=1.5)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # The grpc-timeout header reached the server...
        # (grpcio rounds the header's value up: the server may see a few ms over 1.5 s.)
        assert app.deadline_left is not None and 0 < app.deadline_left <= 1.6
        # ...and the client's RST_STREAM ended the server's call.
        assert app.cancelled.wait(10)
        app.cancelled.clear()
        fut = ch.unary_unary(f"/{SVC}/Slow").future(b"x", timeout=30)
        wait_until(lambda: app.deadline_left is not None and app.deadline_left > 5)
        fut.cancel()
        assert app.cancelled.wait(10)


def test_upstream_down_is_unavailable(gannet):
    dead = free_port()
    srv = start(gannet, f"location / {{ grpc_pass grpc://127.0.0.1:{dead}; }}")
    with channel(srv.port) as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(f"/{SVC}/Unary")(b"x", timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    wait_until(lambda: "connect() failed" in srv.error_log() and f"grpc://127.0.0.1:{dead}" in srv.error_log())
    wait_until(lambda: "HTTP/2.0\" 502" in srv.access_log())


def test_upstream_group_with_keepalive_and_next_upstream(gannet, app):
    dead = free_port()
    srv = start(gannet, """
        location / { grpc_pass grpc://backends; }""", http=f"""
        upstream backends {{
            server 127.0.0.1:{dead};
            server 127.0.0.1:{app.port};
            keepalive 4;
        }}
        log_format up '$upstream_addr $upstream_status';
        access_log {{tmp}}/up.log up;""")
    with channel(srv.port) as ch:
        for i in range(3):
            assert ch.unary_unary(f"/{SVC}/Unary")(b"%d" % i, timeout=10) == b"echo:%d" % i
    log = (srv.tmp / "up.log")
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 3)
    first = log.read_text().splitlines()[0]
    # The dead server was tried and skipped, as grpc_next_upstream's default says.
    assert first == f"127.0.0.1:{dead}, 127.0.0.1:{app.port} 502, 200"


def test_read_timeout_is_504(gannet, app):
    srv = start(gannet, f"""
        location / {{ grpc_pass grpc://127.0.0.1:{app.port}; grpc_read_timeout 300ms; }}""")
    with channel(srv.port) as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(f"/{SVC}/Slow")(b"x", timeout=10)
    # nginx answers 504, which gRPC clients read as UNAVAILABLE.
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    wait_until(lambda: "upstream timed out" in srv.error_log())
    wait_until(lambda: "HTTP/2.0\" 504" in srv.access_log())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.issue("backend", "localhost", sans=("localhost",))
    p.issue("client", "gannet-client")
    # The client key encrypted, its passphrase in a file (grpc_ssl_password_file).
    subprocess.run(["openssl", "pkey", "-in", "client.key", "-aes256", "-passout", "pass:s3cret",
                    "-out", "client.enc.key"], cwd=p.d, check=True, capture_output=True)
    (p.d / "pass.txt").write_text("wrong\ns3cret\n")
    return p


def test_grpcs_with_verification(gannet, pki):
    creds = grpc.ssl_server_credentials(((pki.path("backend.key").read_bytes(), pki.path("backend.pem").read_bytes()),))
    a = App(creds)
    try:
        srv = start(gannet, f"""
            location / {{
                grpc_pass grpcs://127.0.0.1:{a.port};
                grpc_ssl_verify on;
                grpc_ssl_name localhost;
                grpc_ssl_trusted_certificate {pki.path("ca.pem")};
            }}
""")
        with channel(srv.port) as ch:
            it = ch.unary_stream(f"/{SVC}/Server")(b"go", timeout=20)
            assert next(it) == b"first"
            a.release.set()
            assert list(it) == [b"second"]
        wait_until(lambda: "HTTP/2.0\" 200" in srv.access_log())
    finally:
        a.stop()


def test_config_errors(gannet):
    for loc, msg in [
        ("grpc_pass http://127.0.0.1:1;", 'invalid URL prefix in "http://127.0.0.1:1"'),
        ("grpc_pass grpc://127.0.0.1:1; proxy_pass http://127.0.0.1:1;", '"proxy_pass" directive is duplicate'),
        ("grpc_pass grpc://127.0.0.1:1; grpc_pass grpc://127.0.0.1:2;", '"grpc_pass" directive is duplicate'),
    ]:
        conf = gannet.tmp / "bad.conf"
        text, _ = gannet.render(conf_for("listen 127.0.0.1:{port} http2;", f"location / {{ {loc} }}"))
        conf.write_text(text)
        from conftest import gannet_bin
        r = subprocess.run([str(gannet_bin()), "-t", "-c", str(conf)], capture_output=True, text=True)
        assert r.returncode != 0 and msg in r.stderr and "bad.conf:" in r.stderr, (loc, r.stderr)


def test_grpcs_client_certificate_with_encrypted_key(gannet, pki):
    creds = grpc.ssl_server_credentials(
        ((pki.path("backend.key").read_bytes(), pki.path("backend.pem").read_bytes()),),
        root_certificates=pki.path("ca.pem").read_bytes(), require_client_auth=True)
    a = App(creds)
    try:
        srv = start(gannet, f"""
            location / {{
                grpc_pass grpcs://127.0.0.1:{a.port};
                grpc_ssl_certificate {pki.path("client.pem")};
                grpc_ssl_certificate_key {pki.path("client.enc.key")};
                grpc_ssl_password_file {pki.path("pass.txt")};
            }}""")
        with channel(srv.port) as ch:
            assert ch.unary_unary(f"/{SVC}/Unary")(b"tls", timeout=10) == b"echo:tls"
    finally:
        a.stop()


@pytest.mark.skipif(NGINX is None, reason="needs Debian's nginx")
def test_unary_and_errors_side_by_side_with_nginx(tmp_path, app):
    dead = free_port()
    conf = conf_for("listen 127.0.0.1:{port} http2;", f"""
        location /test.Svc/ {{ grpc_pass grpc://127.0.0.1:{app.port}; grpc_set_header X-Set on; }}
        location /down.Svc/ {{ grpc_pass grpc://127.0.0.1:{dead}; }}
    """)
    with side_by_side(tmp_path, conf) as (g, nginx_port):
        results = []
        for port in (g.port, nginx_port):
            with channel(port) as ch:
                resp, c = ch.unary_unary(f"/{SVC}/Unary").with_call(b"hi", metadata=(("x-client", "c"),), timeout=10)
                seen = {k: v for k, v in app.seen_md.items() if k in ("x-client", "x-set")}
                with pytest.raises(grpc.RpcError) as fail:
                    ch.unary_unary(f"/{SVC}/Fail")(b"x", timeout=10)
                with pytest.raises(grpc.RpcError) as down:
                    ch.unary_unary("/down.Svc/Unary")(b"x", timeout=10)
                results.append((resp, seen, dict(c.trailing_metadata()).get("x-up-trailer"),
                                fail.value.code(), fail.value.details(), down.value.code()))
        assert results[0] == results[1]
        assert results[0][3] == grpc.StatusCode.NOT_FOUND
        assert results[0][5] == grpc.StatusCode.UNAVAILABLE


def framed(msg: bytes) -> bytes:
    """One gRPC message on the wire: uncompressed flag, length, bytes."""
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


def test_http1_client_gets_the_answer_whole(gannet, app):
    srv = gannet.start(conf=conf_for("listen 127.0.0.1:{port};", f"""
        location / {{ grpc_pass grpc://127.0.0.1:{app.port}; }}"""))
    status, headers, body = srv.request("POST", f"/{SVC}/Unary", body=framed(b"h1"),
                                        headers={"Content-Type": "application/grpc", "TE": "trailers"})
    assert status == 200
    assert body == framed(b"echo:h1")
    assert headers.get("x-up-head") == "h1"


def test_mirror_gets_the_body_too(gannet, app):
    srv = start(gannet, f"""
        location /m {{
            internal;
            rewrite ^ /{SVC}/Unary break;
            grpc_pass grpc://127.0.0.1:{app.port};
        }}
        location / {{
            grpc_pass grpc://127.0.0.1:{app.port};
            mirror /m;
        }}""")
    with channel(srv.port) as ch:
        resp, c = ch.unary_unary(f"/{SVC}/Unary").with_call(b"mirrored", timeout=10)
    assert resp == b"echo:mirrored"
    assert dict(c.trailing_metadata()).get("x-up-trailer") == "t1"
    # The mirror's copy of the request went up with the body read for it.
    wait_until(lambda: len(app.calls) == 2)
    assert app.calls == [b"mirrored", b"mirrored"]
