"""Streamed answers: Server-Sent Events from an application reach the client as they are
sent, through every gateway (proxy, FastCGI with a real PHP-FPM, SCGI and uwsgi with a real
uWSGI), over HTTP/1.1 and HTTP/2, compressed or not, with `*_buffering off` and with the
application's `X-Accel-Buffering: no`.

The applications go in lockstep with the client: each sends event i, then waits until the
client says it has it (a file the client creates in the document root) before sending the
next. A server that holds an event therefore never lets the next one be sent: the
application gives up after a few seconds and says so in the stream (`data: late i`), which
the test sees. No timing is asserted: arrival before the next send is the property.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

import rawapps
from conftest import REPO, free_port, wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side
from test_fastcgi import PHP_FPM, fpm  # noqa: F401  (the fixture is reused)
from test_gateways import UWSGI, connectable

EVENTS = 3
GIVE_UP = 5.0

SSE_PHP = """<?php
header('Content-Type: text/event-stream');
header('Cache-Control: no-cache');
$accel = $_GET['accel'] ?? '';
if ($accel !== '') { header('X-Accel-Buffering: ' . $accel); }
$id = preg_replace('/[^a-z0-9]/', '', $_GET['id'] ?? '');
while (ob_get_level()) { ob_end_flush(); }
$late = false;
for ($i = 0; $i < %d; $i++) {
    echo "data: $i\\n\\n";
    flush();
    $ack = $_SERVER['ACKS'] . "/$id-$i";
    $deadline = $late ? 0 : microtime(true) + %f;
    while (!file_exists($ack) && microtime(true) < $deadline) { usleep(2000); }
    if (!file_exists($ack)) { echo "data: late $i\\n\\n"; $late = true; }
}
echo "data: end\\n\\n";
""" % (EVENTS, GIVE_UP)

SSE_WSGI = r'''
import os, time

ACKS = os.environ["ACKS"]


def application(env, start_response):
    query = dict(p.partition("=")[::2] for p in env.get("QUERY_STRING", "").split("&") if p)
    headers = [("Content-Type", "text/event-stream")]
    if query.get("accel"):
        headers.append(("X-Accel-Buffering", query["accel"]))
    start_response("200 OK", headers)

    def events():
        late = False
        for i in range(%d):
            yield b"data: %%d\n\n" %% i
            ack = os.path.join(ACKS, "%%s-%%d" %% (query.get("id", ""), i))
            deadline = 0 if late else time.monotonic() + %f
            while not os.path.exists(ack) and time.monotonic() < deadline:
                time.sleep(0.002)
            if not os.path.exists(ack):
                late = True
                yield b"data: late %%d\n\n" %% i
        yield b"data: end\n\n"
    return events()
''' % (EVENTS, GIVE_UP)


def wait_ack(acks: Path, name: str) -> bool:
    return bool(wait_until(lambda: (acks / name).exists(), deadline=GIVE_UP, every=0.002))


class SseHttpApp(rawapps.HttpApp):
    """An HTTP/1.1 server answering Server-Sent Events in chunks, in lockstep (see above)."""

    def __init__(self, acks: Path):
        def behave(conn, head, _body):
            target = head.split(b" ")[1].decode()
            query = dict(p.partition("=")[::2] for p in target.partition("?")[2].split("&") if p)
            accel = f"X-Accel-Buffering: {query['accel']}\r\n" if query.get("accel") else ""
            conn.sendall(("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                          f"Transfer-Encoding: chunked\r\n{accel}\r\n").encode())

            def chunk(data: bytes) -> None:
                conn.sendall(b"%x\r\n%s\r\n" % (len(data), data))

            late = False
            for i in range(EVENTS):
                chunk(b"data: %d\n\n" % i)
                name = f"{query.get('id', '')}-{i}"
                if not (acks / name).exists() and (late or not wait_ack(acks, name)):
                    late = True
                    chunk(b"data: late %d\n\n" % i)
            chunk(b"data: end\n\n")
            conn.sendall(b"0\r\n\r\n")
        super().__init__(behave)


@pytest.fixture(scope="module")
def acks(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("acks")


@pytest.fixture(scope="module")
def sse_uwsgi(tmp_path_factory, acks):
    """A uWSGI running the SSE app, the uwsgi protocol on one port and SCGI on another."""
    if UWSGI is None:
        pytest.skip("uwsgi-core is installed by scripts/test-all.sh")
    tmp = tmp_path_factory.mktemp("sse-uwsgi")
    (tmp / "app.py").write_text(SSE_WSGI)
    uport, sport = free_port(), free_port()
    proc = subprocess.Popen([
        UWSGI, "--plugin", "python3", "--master", "--processes", "2", "--die-on-term",
        "--need-app", "--chdir", str(tmp), "--wsgi-file", str(tmp / "app.py"),
        "--uwsgi-socket", f"127.0.0.1:{uport}", "--scgi-socket", f"127.0.0.1:{sport}",
        "--env", f"ACKS={acks}", "--disable-logging",
    ], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ready = lambda: all(connectable(("127.0.0.1", p)) for p in (uport, sport))
    if not wait_until(lambda: proc.poll() is not None or ready(), deadline=20) or proc.poll() is not None:
        proc.kill()
        raise AssertionError(f"uwsgi did not start: {proc.communicate()[0].decode(errors='replace')}")
    yield {"uwsgi": f"127.0.0.1:{uport}", "scgi": f"127.0.0.1:{sport}"}
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def sse_app(request, acks):
    """The application for a protocol: (location body passing to it, the request path)."""
    proto = request.param
    if proto == "proxy":
        app = SseHttpApp(acks)
        yield f"proxy_pass http://127.0.0.1:{app.port};", "/events"
        app.close()
    elif proto == "fastcgi":
        if PHP_FPM is None:
            pytest.skip("php-fpm is installed by scripts/test-all.sh")
        f = request.getfixturevalue("fpm")
        # The few params PHP needs, spelled out: the same text runs in nginx, and the
        # repository's fastcgi.conf names gannet's own variables.
        yield (f"fastcgi_pass 127.0.0.1:{f['port']}; fastcgi_param REQUEST_METHOD $request_method;"
               "fastcgi_param QUERY_STRING $query_string;"
               f"fastcgi_param SCRIPT_FILENAME $document_root/sse.php; fastcgi_param ACKS {acks};"), "/events"
    else:
        u = request.getfixturevalue("sse_uwsgi")
        yield f"include {REPO}/conf/{proto}_params; {proto}_pass {u[proto]};", "/events"


def stream(port: int, path: str, acks: Path, h2: bool = False, gzip: bool = False) -> tuple[list[str], bytes]:
    """curl reads the event stream unbuffered; each event is acknowledged as it arrives.
    Returns the events and curl's response headers."""
    sid = uuid.uuid4().hex
    sep = "&" if "?" in path else "?"
    args = ["curl", "-sN", "--max-time", "60", "-D", "-"]
    if h2:
        args.append("--http2-prior-knowledge")
    if gzip:
        args.append("--compressed")
    proc = subprocess.Popen([*args, f"http://127.0.0.1:{port}{path}{sep}id={sid}"], stdout=subprocess.PIPE)
    events, head = [], b""
    in_head = True
    for line in proc.stdout:
        if in_head:
            head += line
            in_head = line.strip() != b""
            continue
        if line.startswith(b"data: "):
            event = line[6:].strip().decode()
            events.append(event)
            if event.isdigit():
                (acks / f"{sid}-{event}").touch()
    proc.wait(10)
    return events, head


def expected() -> list[str]:
    return [str(i) for i in range(EVENTS)] + ["end"]


def start(gannet, location: str, extra: str = ""):
    return gannet.start(files={"sse.php": SSE_PHP}, http="gzip on; gzip_types text/event-stream;",
                        server=f"http2 on; location /events {{ {location} {extra} }}")


@pytest.mark.parametrize("sse_app", ["proxy", "fastcgi", "scgi", "uwsgi"], indirect=True)
@pytest.mark.parametrize("h2", [False, True], ids=["h1", "h2"])
@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip"])
def test_events_arrive_as_sent_with_buffering_off(gannet, acks, sse_app, h2, gzip):
    location, path = sse_app
    prefix = location.split("_pass")[0].split()[-1]
    srv = start(gannet, location, f"{prefix}_buffering off;")
    events, head = stream(srv.port, path, acks, h2=h2, gzip=gzip)
    assert events == expected(), head
    assert (b"content-encoding: gzip" in head.lower()) == gzip, head


@pytest.mark.parametrize("sse_app", ["proxy", "fastcgi", "scgi", "uwsgi"], indirect=True)
@pytest.mark.parametrize("h2", [False, True], ids=["h1", "h2"])
def test_x_accel_buffering_no_streams(gannet, acks, sse_app, h2):
    location, path = sse_app
    srv = start(gannet, location)
    events, head = stream(srv.port, path + "?accel=no", acks, h2=h2)
    assert events == expected(), head
    assert b"x-accel-buffering" not in head.lower()


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
@pytest.mark.parametrize("sse_app", ["proxy", "fastcgi", "scgi", "uwsgi"], indirect=True)
def test_streaming_matches_nginx(tmp_path, acks, sse_app):
    """The same config text in Debian's nginx and in gannet: with `*_buffering off`, and with
    `X-Accel-Buffering: no` from the application, both hand each event on as it comes. The
    last case checks the harness itself: nginx with its default buffering and gzip holds the
    small events in its compressor until the answer ends, and the lockstep sees that
    (`late`); gannet flushes the compressor after each piece the application sends."""
    location, path = sse_app
    prefix = location.split("_pass")[0].split()[-1]
    conf = PEER_MAIN + """
http {
    access_log {tmp}/access.log;
    gzip on; gzip_types text/event-stream;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /events { %s %s }
        location /accel { rewrite ^ /events break; %s }
    }
}
""" % (location, f"{prefix}_buffering off;", location)
    with side_by_side(tmp_path, conf, files={"sse.php": SSE_PHP}) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            assert stream(port, path, acks)[0] == expected(), port
            assert stream(port, "/accel?accel=no", acks)[0] == expected(), port
        if prefix == "proxy":
            held = stream(nginx_port, "/accel", acks, gzip=True)[0]
            assert held[:2] == ["0", "late 0"], held
        assert stream(srv.port, "/accel", acks, gzip=True)[0] == expected()
