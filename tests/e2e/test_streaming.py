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

import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

import rawapps
from conftest import REPO, free_port, read_head, wait_until
from nginx_peer import NGINX, PEER_MAIN, side_by_side
from test_fastcgi import PHP_FPM, fpm  # noqa: F401  (the fixture is reused)
from test_gateways import UWSGI, uwsgi_running

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
    with uwsgi_running(tmp, (("127.0.0.1", uport), ("127.0.0.1", sport)),
                       "--uwsgi-socket", f"127.0.0.1:{uport}", "--scgi-socket", f"127.0.0.1:{sport}",
                       "--env", f"ACKS={acks}"):
        yield {"uwsgi": f"127.0.0.1:{uport}", "scgi": f"127.0.0.1:{sport}"}


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


# Reading ahead of a slow client (`*_buffering on`): the answer is taken from the
# application as fast as it sends, into `*_buffers` and then a temporary file, so the
# application is free long before the client has it all; memory stays bounded.

BIG = 48 * 1024 * 1024


class BigApp(rawapps.HttpApp):
    """Answers BIG bytes (a pattern the client checks), counting what it has handed to its
    socket; `done` is set once all of it is."""

    def __init__(self, accel: str = ""):
        self.sent = 0
        self.done = threading.Event()
        block = bytes(range(256)) * 256

        def behave(conn, _head, _body):
            extra = f"X-Accel-Buffering: {accel}\r\n" if accel else ""
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n{extra}\r\n".encode())
            while self.sent < BIG:
                conn.sendall(block)
                self.sent += len(block)
            self.done.set()
        super().__init__(behave)


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def deleted_files(pid: int, folder: Path) -> list[int]:
    """Sizes of the files gannet holds open that were in `folder` and are unlinked."""
    sizes = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(folder)) and target.endswith("(deleted)"):
            sizes.append(os.stat(fd).st_size)
    return sizes


def slow_client(port: int, path: str = "/big"):
    """A client that reads the head and then nothing until told: (socket, file, head)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    f = s.makefile("rb")
    return s, f, read_head(f)


def read_all_and_check(f) -> None:
    block = bytes(range(256)) * 256
    got = 0
    while got < BIG:
        data = f.read(min(1 << 20, BIG - got))
        assert data, f"answer cut at {got}"
        assert data == (block * ((len(data) // len(block)) + 2))[got % len(block):got % len(block) + len(data)]
        got += len(data)


def test_buffered_answer_frees_the_application_before_a_slow_client(gannet):
    app = BigApp()
    try:
        srv = gannet.start(server=f"location /big {{ proxy_pass http://127.0.0.1:{app.port}; }}")
        idle = rss_kib(srv.worker_pid())
        s, f, head = slow_client(srv.port)
        with s:
            assert head.startswith(b"HTTP/1.1 200") and f"Content-Length: {BIG}".encode() in head
            # The client has read nothing past the head, yet the application has sent it all.
            assert app.done.wait(30), f"application still sending: {app.sent} of {BIG}"
            temp = srv.tmp / "proxy_temp"
            held = deleted_files(srv.worker_pid(), temp)
            assert held and max(held) > BIG // 2, held
            assert rss_kib(srv.worker_pid()) - idle < 16 * 1024, "the answer waits in the file, not in memory"
            assert "an upstream response is buffered to a temporary file" in srv.error_log()
            read_all_and_check(f)
        assert not list(temp.iterdir()), "nothing is left in the temp folder"
    finally:
        app.close()


def sending_stalls(app: BigApp) -> bool:
    """The application's sending has stopped short of the end (it waits for the client):
    its count stays the same over several looks."""
    looks = []

    def stalled():
        looks.append(app.sent)
        return len(looks) >= 5 and len(set(looks[-5:])) == 1
    return bool(wait_until(stalled, deadline=20, every=0.1)) and app.sent < BIG


@pytest.mark.parametrize("how", ["buffering-off", "accel-no", "no-temp-file"])
def test_unbuffered_answer_waits_for_the_client(gannet, how):
    """`proxy_buffering off`, `X-Accel-Buffering: no`, or `proxy_max_temp_file_size 0` once
    the buffers are full: the application waits for the client, nothing goes to a file."""
    app = BigApp(accel="no" if how == "accel-no" else "")
    extra = {"buffering-off": "proxy_buffering off;", "accel-no": "",
             "no-temp-file": "proxy_max_temp_file_size 0;"}[how]
    try:
        srv = gannet.start(server=f"location /big {{ proxy_pass http://127.0.0.1:{app.port}; {extra} }}")
        s, f, head = slow_client(srv.port)
        with s:
            assert head.startswith(b"HTTP/1.1 200")
            assert sending_stalls(app), app.sent
            assert not deleted_files(srv.worker_pid(), srv.tmp / "proxy_temp")
            read_all_and_check(f)
        assert app.done.wait(10)
        assert "buffered to a temporary file" not in srv.error_log()
    finally:
        app.close()


def test_accel_buffering_yes_reads_ahead_with_buffering_off(gannet):
    app = BigApp(accel="yes")
    try:
        srv = gannet.start(server=f"location /big {{ proxy_pass http://127.0.0.1:{app.port}; proxy_buffering off; }}")
        s, f, _ = slow_client(srv.port)
        with s:
            assert app.done.wait(30), f"application still sending: {app.sent} of {BIG}"
            read_all_and_check(f)
    finally:
        app.close()


def test_full_temp_disk_makes_the_application_wait(gannet, tmp_path):
    """A temp folder on a 1 MiB tmpfs: the file fills, gannet logs nginx's pwrite() line,
    and the rest waits for the client; the answer still arrives whole."""
    temp = tmp_path / "small"
    temp.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(temp)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    app = BigApp()
    try:
        srv = gannet.start(server=f"location /big {{ proxy_pass http://127.0.0.1:{app.port}; proxy_temp_path {temp}; }}")
        s, f, _ = slow_client(srv.port)
        with s:
            assert sending_stalls(app), app.sent
            assert wait_until(lambda: "No space left on device" in srv.error_log())
            read_all_and_check(f)
        assert app.done.wait(10)
    finally:
        app.close()
        subprocess.run(["umount", str(temp)], capture_output=True)


def test_temp_directives_are_checked(gannet):
    for bad, says in (("proxy_buffers 1 4k;", 'there must be at least 2 "proxy_buffers"'),
                      ("fastcgi_max_temp_file_size 1x;", "invalid value"),
                      ("scgi_temp_path /tmp/x 11;", '"scgi_temp_path" directive invalid value'),
                      ("uwsgi_temp_file_write_size;", "invalid number of arguments")):
        r = gannet.check(server=bad)
        assert r.returncode != 0 and "check.conf:" in r.stderr and says in r.stderr, (bad, r.stderr)
    ok = gannet.check(server="proxy_buffers 16 8k; proxy_busy_buffers_size 16k; proxy_temp_path /tmp/gt 1 2; "
                             "proxy_max_temp_file_size 10m; proxy_temp_file_write_size 32k;")
    assert ok.returncode == 0, ok.stderr


def test_read_timeout_counts_between_reads(gannet):
    """`proxy_read_timeout 1s` bounds each wait for the upstream, not the answer: a stream
    with an event every 0.4 s outlives it (2 s in all), then a silence past it ends the
    stream (no last chunk) with nginx's log line."""
    def behave(conn, _head, _body):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(5):
            data = b"data: %d\n\n" % i
            conn.sendall(b"%x\r\n%s\r\n" % (len(data), data))
            time.sleep(0.4)  # the application's pace is what is tested here
        conn.recv(1)  # then silent until the proxy gives up and closes
    app = rawapps.HttpApp(behave)
    try:
        srv = gannet.start(server=f"location / {{ proxy_pass http://127.0.0.1:{app.port}; proxy_buffering off; proxy_read_timeout 1s; }}")
        events, head = stream(srv.port, "/s", Path(srv.tmp))
        assert events == ["0", "1", "2", "3", "4"], head
        assert wait_until(lambda: "upstream timed out" in srv.error_log() and "while reading upstream" in srv.error_log())
    finally:
        app.close()
