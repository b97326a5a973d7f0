"""SCGI and uwsgi as a Python admin uses them: gannet in front of a real uWSGI (Debian's
uwsgi-core with the python3 plugin, started per module on a unix socket and a TCP port for
the uwsgi protocol and a TCP port for SCGI) running a small WSGI app that echoes what it got:
the stock `include scgi_params` / `uwsgi_params`, `scgi_param` / `uwsgi_param` overrides and
their inheritance, request bodies (Content-Length and chunked), statuses and headers set by
the app, hidden headers, big answers streamed, `*_intercept_errors`, upstream groups.

Raw-socket applications in this file stand for the ones that misbehave (nothing listening,
no answer, garbage, dying mid-answer) and show the bytes on the wire (uwsgi modifiers, the
SCGI netstring) and that connections are never reused.
"""

import hashlib
import io
import json
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
from contextlib import contextmanager

import pytest

from conftest import REPO, free_port, read_chunked, read_head, wait_until
from rawapps import Listener, made

UWSGI = shutil.which("uwsgi-core")

APP = r'''
import hashlib, json

BLOCK = b"0123456789abcdef" * 4096


def application(env, start_response):
    path, _, query = env.get("REQUEST_URI", "").partition("?")
    args = dict(p.partition("=")[::2] for p in query.split("&") if p)
    if path.startswith("/status"):
        start_response(args.get("code", "200") + " Whatever", [
            ("Content-Type", "text/plain"),
            ("X-App", "yes"),
            ("X-Secret", "hidden"),
            ("X-Accel-Buffering", "no"),
        ])
        return [b"status body\n"]
    if path.startswith("/big"):
        n = int(args.get("n", "0"))
        headers = [("Content-Type", "application/octet-stream")]
        if args.get("length"):
            headers.append(("Content-Length", str(n)))
        start_response("200 OK", headers)

        def pieces(left=n):
            while left > 0:
                piece = BLOCK[:min(left, len(BLOCK))]
                left -= len(piece)
                yield piece
        return pieces()
    body = env["wsgi.input"].read()
    out = {k: v for k, v in env.items() if isinstance(v, str) and k == k.upper()}
    out["BODY_LEN"] = len(body)
    out["BODY_MD5"] = hashlib.md5(body).hexdigest()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [json.dumps(out).encode()]
'''

pytestmark = pytest.mark.skipif(UWSGI is None, reason="uwsgi-core is installed by scripts/test-all.sh")


def connectable(addr) -> bool:
    family = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(0.2)
        try:
            s.connect(addr)
        except OSError:
            return False
    return True


@contextmanager
def uwsgi_running(tmp, addrs, *args: str):
    """A uWSGI running the WSGI app in `tmp/app.py` with `args` (its sockets), until the
    block ends; ready once every address in `addrs` accepts."""
    proc = subprocess.Popen([
        UWSGI, "--plugin", "python3", "--master", "--processes", "2", "--die-on-term",
        "--need-app", "--chdir", str(tmp), "--wsgi-file", str(tmp / "app.py"), *args,
        "--disable-logging",
    ], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ready = lambda: all(connectable(a) for a in addrs)
    if not wait_until(lambda: proc.poll() is not None or ready(), deadline=20) or proc.poll() is not None:
        proc.kill()
        raise AssertionError(f"uwsgi did not start: {proc.communicate()[0].decode(errors='replace')}")
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def uwsgi(tmp_path_factory):
    """One uWSGI: the uwsgi protocol on a unix socket and a TCP port, SCGI on another port."""
    tmp = tmp_path_factory.mktemp("uwsgi")
    (tmp / "app.py").write_text(APP)
    sock = tmp / "uwsgi.sock"
    uport, sport = free_port(), free_port()
    addrs = (str(sock), ("127.0.0.1", uport), ("127.0.0.1", sport))
    with uwsgi_running(tmp, addrs, "--uwsgi-socket", str(sock), "--uwsgi-socket", f"127.0.0.1:{uport}",
                       "--scgi-socket", f"127.0.0.1:{sport}",
                       # uWSGI refuses parameter blocks over 4 KiB by default; nginx sends up to 64 KiB.
                       "--buffer-size", "65535"):
        yield {"uwsgi-unix": f"unix:{sock}", "uwsgi-tcp": f"127.0.0.1:{uport}", "scgi-tcp": f"127.0.0.1:{sport}"}


TARGETS = ["uwsgi-unix", "uwsgi-tcp", "scgi-tcp"]


def proto_of(target: str) -> str:
    return target.split("-")[0]


def app_server(gannet, uwsgi, target, location_extra="", server_extra=""):
    p = proto_of(target)
    return gannet.start(files={"static.txt": "plain file\n", "404.html": "custom not found\n"}, server=f"""
        {server_extra}
        location /app {{
            include {REPO}/conf/{p}_params;
            {p}_pass {uwsgi[target]};
            {location_extra}
        }}
        location /status {{ include {REPO}/conf/{p}_params; {p}_pass {uwsgi[target]}; {location_extra} }}
        location /big {{ include {REPO}/conf/{p}_params; {p}_pass {uwsgi[target]}; }}
    """)


@pytest.mark.parametrize("target", TARGETS)
def test_params_reach_the_app(gannet, uwsgi, target):
    srv = app_server(gannet, uwsgi, target)
    status, headers, body = srv.get("/app/x?a=1&b=two", headers={"X-Custom": "hello", "Cookie": "k=v"})
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    # uWSGI ends the answer with a close: a Content-Length if the close came with it, else
    # chunks (it is not held for the close).
    assert headers.get("content-length", str(len(body))) == str(len(body))
    env = json.loads(body)
    assert env["REQUEST_METHOD"] == "GET"
    assert env["REQUEST_URI"] == "/app/x?a=1&b=two"
    assert env["QUERY_STRING"] == "a=1&b=two"
    assert env["DOCUMENT_ROOT"] == str(gannet.tmp / "www")
    assert env["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert env["SERVER_PORT"] == str(srv.port)
    assert env["REMOTE_ADDR"] == "127.0.0.1"
    assert env["HTTP_X_CUSTOM"] == "hello"
    assert env["HTTP_COOKIE"] == "k=v"
    assert env["HTTP_HOST"] == f"127.0.0.1:{srv.port}"
    assert "HTTPS" not in env, "if_not_empty leaves it out on plain HTTP"
    if proto_of(target) == "scgi":
        assert env["SCGI"] == "1"
        assert env["CONTENT_LENGTH"] == "0"
        assert env["DOCUMENT_URI"] == "/app/x"
    else:
        assert env["PATH_INFO"] == "/app/x"
        assert env["REQUEST_SCHEME"] == "http"


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_param_overrides_and_inheritance(gannet, uwsgi, proto):
    target = f"{proto}-tcp"
    # Server-level params reach a location that sets none; a location with its own list
    # gets only that list (nginx's rule). A configured HTTP_* param replaces the header.
    srv = gannet.start(server=f"""
        {proto}_param FROM_SERVER yes;
        {proto}_param REQUEST_URI $request_uri;
        location /app/inherits {{ {proto}_pass {uwsgi[target]}; }}
        location /app/own {{
            include {REPO}/conf/{proto}_params;
            {proto}_param QUERY_STRING overridden;
            {proto}_param HTTP_X_CUSTOM from-config;
            {proto}_param EMPTY "" if_not_empty;
            {proto}_param KEPT_EMPTY "";
            {proto}_pass {uwsgi[target]};
        }}
    """)
    env = json.loads(srv.get("/app/inherits?q=1")[2])
    assert env["FROM_SERVER"] == "yes"
    assert "QUERY_STRING" not in env or env["QUERY_STRING"] == ""
    status, _, body = srv.get("/app/own?q=1", headers={"X-Custom": "from-client"})
    assert status == 200, body
    env = json.loads(body)
    assert "FROM_SERVER" not in env
    assert env["QUERY_STRING"] == "overridden"
    assert env["HTTP_X_CUSTOM"] == "from-config"
    assert "EMPTY" not in env
    assert env["KEPT_EMPTY"] == ""


@pytest.mark.parametrize("target", ["uwsgi-unix", "scgi-tcp"])
@pytest.mark.parametrize("size", [0, 11, 200_000])
def test_request_body_content_length(gannet, uwsgi, target, size):
    srv = app_server(gannet, uwsgi, target)
    data = bytes(i % 251 for i in range(size))
    status, _, body = srv.request("POST", "/app/post", {"Content-Type": "application/x-test"}, data)
    assert status == 200, body
    env = json.loads(body)
    assert (env["BODY_LEN"], env["BODY_MD5"]) == (size, hashlib.md5(data).hexdigest())
    assert env["CONTENT_TYPE"] == "application/x-test"
    assert env["CONTENT_LENGTH"] == str(size) or (size == 0 and env.get("CONTENT_LENGTH", "") in ("", "0"))


@pytest.mark.parametrize("target", ["uwsgi-tcp", "scgi-tcp"])
def test_request_body_chunked(gannet, uwsgi, target):
    """A chunked body is read whole; the app learns its length from CONTENT_LENGTH."""
    srv = app_server(gannet, uwsgi, target)
    data = b"x" * 5000 + b"y" * 3000
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (data[:5000], data[5000:])) + b"0\r\n\r\n"
    raw = srv.raw(b"POST /app/chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), raw[:300]
    if b"Transfer-Encoding: chunked" in head:
        body = read_chunked(io.BytesIO(body))
    env = json.loads(body)
    assert (env["BODY_LEN"], env["BODY_MD5"]) == (8000, hashlib.md5(data).hexdigest())
    assert env["CONTENT_LENGTH"] == "8000"
    assert "HTTP_TRANSFER_ENCODING" in env, "the request's headers are passed as they came"


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_pass_request_body_off(gannet, uwsgi, proto):
    """No body is sent. SCGI's CONTENT_LENGTH says so by itself; a uwsgi CONTENT_LENGTH
    comes from uwsgi_param, so (as with nginx) a config leaves it out or empties it."""
    srv = gannet.start(server=f"""location /app {{
        {proto}_param REQUEST_URI $request_uri;
        {proto}_pass_request_body off;
        {proto}_pass {uwsgi[proto + '-tcp']};
    }}""")
    status, _, body = srv.request("POST", "/app/nobody", {}, b"12345")
    assert status == 200, body
    env = json.loads(body)
    assert env["BODY_LEN"] == 0
    assert env.get("CONTENT_LENGTH", "0") == "0"
    assert env["HTTP_CONTENT_LENGTH"] == "5", "the request's own header is still passed"


@pytest.mark.parametrize("target", TARGETS)
def test_status_headers_and_hidden_headers(gannet, uwsgi, target):
    p = proto_of(target)
    srv = app_server(gannet, uwsgi, target, location_extra=f"{p}_hide_header X-Secret;")
    status, headers, body = srv.get("/status?code=418")
    assert (status, body) == (418, b"status body\n")
    assert headers["x-app"] == "yes"
    assert "x-secret" not in headers
    assert "x-accel-buffering" not in headers, "nginx hides X-Accel-* from clients"
    assert headers["server"].startswith("gannet")
    status, headers, body = srv.request("HEAD", "/status?code=201")
    assert (status, body) == (201, b"")
    # pass_header lets a default-hidden one through.
    srv2 = app_server(gannet, uwsgi, target, location_extra=f"{p}_pass_header X-Accel-Buffering;")
    assert srv2.get("/status")[1]["x-accel-buffering"] == "no"


@pytest.mark.parametrize("target", ["uwsgi-unix", "scgi-tcp"])
@pytest.mark.parametrize("length", ["", "1"])
def test_big_answer_is_streamed(gannet, uwsgi, target, length):
    """Over 1 MiB: with the app's Content-Length as it is, without one chunked to an
    HTTP/1.1 client (the connection stays usable either way), close-delimited to HTTP/1.0."""
    srv = app_server(gannet, uwsgi, target)
    size = 3 * 1024 * 1024 + 5
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(f"GET /big?n={size}&length={length} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        f = s.makefile("rb")
        head = read_head(f)
        assert head.startswith(b"HTTP/1.1 200 "), head
        if length:
            assert f"Content-Length: {size}".encode() in head and b"Transfer-Encoding" not in head
            body = f.read(size)
        else:
            assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
            body = read_chunked(f)
        assert len(body) == size and body[:16] == b"0123456789abcdef"
        s.sendall(b"GET /static.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        assert f.readline().startswith(b"HTTP/1.1 200 ")
    raw = srv.raw(f"GET /big?n={size}&length={length} HTTP/1.0\r\n\r\n".encode(), timeout=10)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Connection: close" in head and b"Transfer-Encoding" not in head
    assert len(body) == size


@pytest.mark.parametrize("target", ["uwsgi-tcp", "scgi-tcp"])
def test_small_answer_with_content_length_is_buffered(gannet, uwsgi, target):
    srv = app_server(gannet, uwsgi, target)
    status, headers, body = srv.get("/big?n=70000&length=1")
    assert status == 200 and len(body) == 70000
    assert headers["content-length"] == "70000"


@pytest.mark.parametrize("target", ["uwsgi-tcp", "scgi-tcp"])
def test_intercept_errors(gannet, uwsgi, target):
    p = proto_of(target)
    srv = app_server(gannet, uwsgi, target, location_extra=f"{p}_intercept_errors on;",
                     server_extra="error_page 404 /404.html;")
    assert srv.get("/status?code=404")[::2] == (404, b"custom not found\n")
    assert srv.get("/status?code=409")[::2] == (409, b"status body\n")


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_upstream_group_skips_a_dead_server(gannet, uwsgi, proto):
    dead = free_port()
    srv = gannet.start(http=f"""upstream app {{
        server 127.0.0.1:{dead} max_fails=1 fail_timeout=30s;
        server {uwsgi[proto + '-tcp']};
        keepalive 4;
    }}""", server=f"""location /app {{ include {REPO}/conf/{proto}_params; {proto}_pass app; }}""")
    for _ in range(4):
        status, _, body = srv.get("/app/grouped")
        assert status == 200, body
        assert json.loads(body)["REQUEST_URI"] == "/app/grouped"
    log = wait_until(lambda: "connect() failed" in srv.error_log() and srv.error_log())
    assert log.count("connect() failed") == 1
    assert f'upstream: "{proto}://127.0.0.1:{dead}"' in log


# --- raw applications -------------------------------------------------------------------

def read_request(conn, proto):
    """One whole request off `conn`: (the header bytes as sent, the params, the body)."""
    with conn.makefile("rb") as f:
        return read_from(f, proto)


def read_from(f, proto):
    if proto == "scgi":
        length = b""
        while not length.endswith(b":"):
            c = f.read(1)
            if not c:
                return None
            length += c
        block = f.read(int(length[:-1]))
        comma = f.read(1)
        assert comma == b",", comma
        items = block.split(b"\0")[:-1]
        params = dict(zip(items[0::2], items[1::2]))
        header = length + block + comma
    else:
        header = f.read(4)
        if len(header) < 4:
            return None
        _, size, _ = struct.unpack("<BHB", header)
        block = f.read(size)
        header += block
        params, pos = {}, 0
        while pos < len(block):
            (kl,) = struct.unpack_from("<H", block, pos)
            key = block[pos + 2:pos + 2 + kl]
            pos += 2 + kl
            (vl,) = struct.unpack_from("<H", block, pos)
            params[key] = block[pos + 2:pos + 2 + vl]
            pos += 2 + vl
    body = f.read(int(params.get(b"CONTENT_LENGTH") or 0))
    return header, params, body


class Backend(Listener):
    """Reads one request per connection, then does `behave(conn, req)`."""

    def __init__(self, proto, behave):
        self.proto, self.behave = proto, behave
        self.requests = []
        super().__init__()

    def serve(self, conn):
        try:
            req = read_request(conn, self.proto)
            if req is None:
                return
            self.requests.append(req)
            if self.behave(conn, req) != "keep":
                conn.close()
        except OSError:
            pass


@pytest.fixture
def backend():
    yield from made(Backend)


def pass_to(gannet, proto, port, extra="", params=True):
    include = f"include {REPO}/conf/{proto}_params;" if params else ""
    return gannet.start(server=f"""
        location / {{ {include} {proto}_pass 127.0.0.1:{port}; {extra} }}
    """)


def answer(conn, req):
    conn.sendall(b"Status: 200 OK\r\nContent-Type: text/plain\r\n\r\nfrom raw")


def test_uwsgi_packet_on_the_wire(gannet, backend):
    b = backend("uwsgi", answer)
    extra = "uwsgi_param CONTENT_LENGTH $content_length; uwsgi_modifier1 5; uwsgi_modifier2 9;"
    srv = pass_to(gannet, "uwsgi", b.port, extra, params=False)
    assert srv.request("POST", "/w?x=1", {"X-A": "b"}, b"body!")[2] == b"from raw"
    header, params, body = b.requests[0]
    assert header[0] == 5 and header[3] == 9
    assert struct.unpack("<H", header[1:3])[0] == len(header) - 4
    # The configured params first, then the request's headers in the order they came.
    assert list(params)[:2] == [b"CONTENT_LENGTH", b"HTTP_HOST"]
    assert params[b"CONTENT_LENGTH"] == b"5"
    assert params[b"HTTP_X_A"] == b"b"
    assert body == b"body!"


def test_scgi_netstring_on_the_wire(gannet, backend):
    b = backend("scgi", answer)
    srv = pass_to(gannet, "scgi", b.port)
    assert srv.request("POST", "/s", {}, b"abc")[2] == b"from raw"
    header, params, body = b.requests[0]
    # The protocol wants CONTENT_LENGTH first and SCGI once, whatever scgi_params says.
    assert re.match(rb"^\d+:CONTENT_LENGTH\x003\x00SCGI\x001\x00REQUEST_METHOD\x00POST\x00", header), header[:80]
    assert header.count(b"SCGI\x00") == 1
    assert body == b"abc"


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_connections_are_never_kept(gannet, backend, proto):
    """Even in a group with `keepalive`, and with an app that leaves the connection open
    after a Content-Length answer: each request has its own connection."""
    def keep_open(conn, req):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nkept")
        return "keep"

    b = backend(proto, keep_open)
    srv = gannet.start(http=f"upstream app {{ server 127.0.0.1:{b.port}; keepalive 4; }}",
                       server=f"location / {{ {proto}_pass app; }}")
    for _ in range(3):
        assert srv.get("/k")[::2] == (200, b"kept")
    assert len(b.conns) == 3


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_nothing_listening_is_502(gannet, proto):
    port = free_port()
    srv = pass_to(gannet, proto, port)
    status, _, body = srv.get("/x")
    assert status == 502 and b"502 Bad Gateway" in body
    log = wait_until(lambda: "connect() failed" in srv.error_log() and srv.error_log())
    assert f'upstream: "{proto}://127.0.0.1:{port}"' in log


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_silent_application_is_504(gannet, backend, proto):
    held = threading.Event()
    b = backend(proto, lambda conn, req: held.wait(30))
    srv = pass_to(gannet, proto, b.port, f"{proto}_read_timeout 500ms;")
    try:
        assert srv.get("/x")[0] == 504
        log = wait_until(lambda: "upstream timed out" in srv.error_log() and srv.error_log())
        assert "while reading response header from upstream" in log and f"{proto}://" in log
    finally:
        held.set()


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_garbage_is_502_with_the_reason(gannet, backend, proto):
    b = backend(proto, lambda conn, req: conn.sendall(b"\x00\x01garbage without a head\r\n\r\n"))
    srv = pass_to(gannet, proto, b.port)
    assert srv.get("/x")[0] == 502
    log = wait_until(lambda: "upstream sent invalid header" in srv.error_log() and srv.error_log())
    assert f'upstream: "{proto}://127.0.0.1:{b.port}"' in log


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_closed_before_the_head_is_502(gannet, backend, proto):
    b = backend(proto, lambda conn, req: conn.sendall(b"Status: 200 OK\r\nContent-Ty"))
    srv = pass_to(gannet, proto, b.port)
    assert srv.get("/x")[0] == 502
    assert wait_until(lambda: "prematurely closed connection while reading response header" in srv.error_log())


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_shorter_than_its_content_length_is_502(gannet, backend, proto):
    """An answer that ends before its Content-Length: a 502 if the close came with the head
    (nothing was sent yet), else the head and what came, and the connection closes short of
    the length. Never a whole-looking answer."""
    b = backend(proto, lambda conn, req: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this"))
    srv = pass_to(gannet, proto, b.port)
    raw = srv.raw(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 502") or (
        raw.startswith(b"HTTP/1.1 200") and b"Content-Length: 100\r\n" in raw and raw.endswith(b"\r\n\r\nonly this")), raw
    assert wait_until(lambda: "upstream prematurely closed connection while reading upstream" in srv.error_log())


def recv_head(s):
    head = b""
    while b"\r\n\r\n" not in head:
        got = s.recv(65536)
        if not got:
            break
        head += got
    return head


def read_rest(s):
    out = b""
    while True:
        got = s.recv(65536)
        if not got:
            return out
        out += got


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
@pytest.mark.parametrize("how", ["short-of-length", "reset"])
def test_application_dying_mid_stream_closes_the_connection(gannet, backend, proto, how):
    """Part of a big answer, then the app dies: the client gets what came, no final chunk,
    and the connection closes. Dying is a close before the announced Content-Length, or a
    reset (a plain close without a length is a normal end). The app dies only once the
    client has the head, so the answer is being streamed by then."""
    streaming = threading.Event()

    def die(conn, req):
        length = b"Content-Length: 9999999\r\n" if how == "short-of-length" else b""
        conn.sendall(b"Status: 200 OK\r\n" + length + b"Content-Type: application/octet-stream\r\n\r\n")
        for _ in range(20):
            conn.sendall(b"z" * 65000)
        streaming.wait(10)
        if how == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    b = backend(proto, die)
    srv = pass_to(gannet, proto, b.port)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        head = recv_head(s)
        streaming.set()
        raw = head + read_rest(s)
    assert raw.startswith(b"HTTP/1.1 200 ")
    head, body = raw.split(b"\r\n\r\n", 1)
    if how == "short-of-length":
        # The announced length goes to the client, which sees the body end short of it.
        assert b"Content-Length: 9999999" in head and len(body) < 9999999
    else:
        assert b"Transfer-Encoding: chunked" in head
        assert not raw.endswith(b"0\r\n\r\n"), "a cut answer must not end like a whole one"
    assert wait_until(lambda: "while reading upstream" in srv.error_log())


def test_uwsgi_params_over_64k_are_500(gannet, backend):
    b = backend("uwsgi", answer)
    big = "$http_x_big" * 10
    srv = pass_to(gannet, "uwsgi", b.port, f'uwsgi_param BIG "{big}";')
    assert srv.get("/x", headers={"X-Big": "v" * 6000})[0] == 500
    assert wait_until(lambda: "uwsgi request cannot be sent" in srv.error_log())
    assert b.requests == [], "nothing reaches the application"
    # Under the limit it goes through.
    assert srv.get("/x", headers={"X-Big": "v" * 5000})[::2] == (200, b"from raw")


def test_config_errors(gannet):
    bad = {
        "scgi_pass 127.0.0.1:9000; uwsgi_pass 127.0.0.1:9001;": '"uwsgi_pass" directive is duplicate',
        "fastcgi_pass 127.0.0.1:9000; scgi_pass 127.0.0.1:9001;": '"scgi_pass" directive is duplicate',
        "uwsgi_pass 127.0.0.1:9000; uwsgi_pass 127.0.0.1:9001;": "duplicate",
        "scgi_pass nowhere;": 'host not found in upstream "nowhere"',
        "uwsgi_param A b maybe;": 'invalid parameter "maybe"',
        "uwsgi_modifier1 256;": 'invalid value "256"',
        "scgi_next_upstream sometimes;": "invalid value",
        "scgi_buffer_size 10x;": '"scgi_buffer_size" directive invalid value',
        "uwsgi_cache zone;": '"uwsgi_cache" zone "zone" is unknown',
        "fastcgi_ignore_headers Foo;": 'invalid value "Foo"',
        "scgi_socket_keepalive maybe;": 'invalid value "maybe"',
        "uwsgi_busy_buffers_size 1x;": '"uwsgi_busy_buffers_size" directive invalid value',
    }
    for stmt, msg in bad.items():
        r = gannet.check(server=f"location /x {{ {stmt} }}")
        assert r.returncode != 0, stmt
        assert msg in r.stderr, (stmt, r.stderr)
        assert re.search(r"check\.conf:\d+", r.stderr), r.stderr
    ok = gannet.check(server=f"""
        include {REPO}/conf/scgi_params;
        location /u {{ include {REPO}/conf/uwsgi_params; uwsgi_pass 127.0.0.1:9000; uwsgi_modifier1 0; uwsgi_store on; }}
        location /s {{ scgi_pass unix:/run/app.sock; scgi_read_timeout 5s; scgi_temp_path /tmp; scgi_store /tmp$uri; }}
        location /f {{
            fastcgi_pass unix:/run/php.sock; fastcgi_busy_buffers_size 64k;
            fastcgi_ignore_headers Cache-Control expires Set-Cookie; fastcgi_socket_keepalive on;
            fastcgi_cache_bypass $cookie_x; fastcgi_no_cache $cookie_x;
            fastcgi_max_temp_file_size 0; fastcgi_temp_file_write_size 64k;
        }}
        location /p {{ proxy_pass http://127.0.0.1:9; proxy_cache_bypass $http_upgrade; proxy_headers_hash_max_size 1024; }}
    """)
    assert ok.returncode == 0, ok.stderr
    # What the PHP and Node.js snippets people copy set: loaded; the hash sizes with a
    # notice, the cache predicates (which act with a `*_cache`) without.
    assert re.search(r'\[notice\] .*check\.conf:\d+: "proxy_headers_hash_max_size" has no effect', ok.stderr), ok.stderr
    assert "_cache_bypass\" has no effect" not in ok.stderr


@pytest.mark.parametrize("proto", ["scgi", "uwsgi"])
def test_request_buffering_off_passes_a_length_body(gannet, uwsgi, proto):
    """The body goes on as it arrives after the header block; the application reads it by
    the CONTENT_LENGTH the block announced."""
    srv = gannet.start(server=f"""location /app {{
        {proto}_param REQUEST_URI $request_uri;
        {"uwsgi_param CONTENT_LENGTH $content_length;" if proto == "uwsgi" else ""}
        {proto}_request_buffering off;
        {proto}_pass {uwsgi[proto + '-tcp']};
    }}""")
    data = bytes(range(256)) * 300
    status, _, body = srv.request("POST", "/app/streamed", {}, data)
    assert status == 200, body
    env = json.loads(body)
    assert (env["BODY_LEN"], env["BODY_MD5"]) == (len(data), hashlib.md5(data).hexdigest())
