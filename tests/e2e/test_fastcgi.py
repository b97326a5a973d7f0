"""FastCGI as a PHP admin uses it: gannet in front of a real PHP-FPM (started per module on a
temp unix socket and a TCP port), the stock `include fastcgi.conf` parameters, request bodies
(Content-Length, chunked, 100-continue), statuses and headers set by PHP, STDERR in the error
log, the WordPress-style `try_files ... /index.php?$args` front controller,
`fastcgi_split_path_info`, `fastcgi_intercept_errors` with `error_page`, and every failure an
application can cause: nothing listening (502), no answer (504), not FastCGI at all (502), an
answer cut short (502), a local redirect (`Location: /path` without `Status`).

The broken backends are small raw-socket servers in this file: they stand for applications
that misbehave, which no real one does on demand.
"""

import hashlib
import http.client
import json
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO, free_port, read_chunked, read_head, wait_until
from rawapps import FastCgiApp, end_request, made, record

PHP_FPM = shutil.which("php-fpm8.2") or shutil.which("php-fpm")

pytestmark = pytest.mark.skipif(PHP_FPM is None, reason="php-fpm is installed by scripts/test-all.sh")

INFO_PHP = """<?php
header('Content-Type: application/json');
$keys = ['SCRIPT_FILENAME', 'SCRIPT_NAME', 'REQUEST_URI', 'DOCUMENT_URI', 'QUERY_STRING',
         'REQUEST_METHOD', 'CONTENT_TYPE', 'CONTENT_LENGTH', 'HTTP_HOST', 'HTTP_X_CUSTOM',
         'SERVER_PROTOCOL', 'GATEWAY_INTERFACE', 'SERVER_SOFTWARE', 'REMOTE_ADDR', 'SERVER_PORT',
         'PATH_INFO', 'REDIRECT_STATUS', 'HTTP_COOKIE'];
$out = [];
foreach ($keys as $k) { $out[$k] = $_SERVER[$k] ?? null; }
$out['GET'] = $_GET;
$out['POOL'] = getenv('POOL');
$out['PID'] = getmypid();
echo json_encode($out);
"""

BODY_PHP = """<?php
$b = file_get_contents('php://input');
header('Content-Type: text/plain');
echo strlen($b), ' ', md5($b);
"""

STATUS_PHP = """<?php
http_response_code((int)($_GET['code'] ?? 200));
header('X-App: yes');
header('X-Accel-Buffering: no');
echo "status body\\n";
"""

STDERR_PHP = """<?php
error_log('boom from php');
echo 'ok';
"""

BIG_PHP = """<?php
header('Content-Type: application/octet-stream');
echo str_repeat('0123456789abcdef', 65536 * 3);
"""

FRONT_PHP = """<?php
echo 'front controller: ', $_SERVER['REQUEST_URI'], ' q=', $_SERVER['QUERY_STRING'];
"""


@pytest.fixture(scope="module")
def fpm(tmp_path_factory):
    """A PHP-FPM pool of its own: unix socket and TCP port, two children."""
    tmp = tmp_path_factory.mktemp("fpm")
    sock = tmp / "php.sock"
    port = free_port()
    conf = tmp / "php-fpm.conf"
    conf.write_text(f"""
[global]
pid = {tmp}/php-fpm.pid
error_log = {tmp}/php-fpm.log
daemonize = no

[unix]
listen = {sock}
pm = static
pm.max_children = 2
env[POOL] = unix
catch_workers_output = no
php_admin_value[log_errors] = On
php_admin_value[display_errors] = Off

[tcp]
listen = 127.0.0.1:{port}
pm = static
pm.max_children = 2
env[POOL] = tcp
""")
    proc = subprocess.Popen([PHP_FPM, "-F", "-y", str(conf), "-R"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def up():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return False
        return sock.exists()

    if not wait_until(up, deadline=15):
        proc.kill()
        raise AssertionError(f"php-fpm did not start: {proc.communicate()[0].decode(errors='replace')}")
    yield {"sock": sock, "port": port}
    proc.send_signal(signal.SIGQUIT)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


FILES = {
    "info.php": INFO_PHP,
    "body.php": BODY_PHP,
    "status.php": STATUS_PHP,
    "stderr.php": STDERR_PHP,
    "big.php": BIG_PHP,
    "index.php": FRONT_PHP,
    "static.txt": "plain file\n",
    "404.html": "custom not found\n",
    "sub/index.php": "<?php echo 'sub index';",
}


def php_server(gannet, fpm, via="unix", extra=""):
    target = f"unix:{fpm['sock']}" if via == "unix" else f"127.0.0.1:{fpm['port']}"
    return gannet.start(files=FILES, server=f"""
        index index.php index.html;
        {extra}
        location ~ [^/]\\.php(/|$) {{
            fastcgi_split_path_info ^(.+?\\.php)(/.*)$;
            include {REPO}/conf/fastcgi.conf;
            fastcgi_param PATH_INFO $fastcgi_path_info;
            fastcgi_index index.php;
            fastcgi_pass {target};
        }}
    """)


@pytest.mark.parametrize("via", ["unix", "tcp"])
def test_params_reach_php(gannet, fpm, via):
    srv = php_server(gannet, fpm, via)
    status, headers, body = srv.get("/info.php?a=1&b=two", headers={"X-Custom": "hello", "Cookie": "k=v"})
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(body)
    info = json.loads(body)
    root = gannet.tmp / "www"
    assert info["SCRIPT_FILENAME"] == f"{root}/info.php"
    assert info["SCRIPT_NAME"] == "/info.php"
    assert info["REQUEST_URI"] == "/info.php?a=1&b=two"
    assert info["QUERY_STRING"] == "a=1&b=two"
    assert info["GET"] == {"a": "1", "b": "two"}
    assert info["REQUEST_METHOD"] == "GET"
    assert info["HTTP_X_CUSTOM"] == "hello"
    assert info["HTTP_COOKIE"] == "k=v"
    assert info["HTTP_HOST"] == f"127.0.0.1:{srv.port}"
    assert info["GATEWAY_INTERFACE"] == "CGI/1.1"
    assert info["SERVER_SOFTWARE"].startswith("gannet/")
    assert info["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert info["SERVER_PORT"] == str(srv.port)
    assert info["REMOTE_ADDR"] == "127.0.0.1"
    assert info["REDIRECT_STATUS"] == "200"


def test_split_path_info_and_index(gannet, fpm):
    srv = php_server(gannet, fpm)
    status, _, body = srv.get("/info.php/extra/path")
    assert status == 200, body
    info = json.loads(body)
    assert info["SCRIPT_NAME"] == "/info.php"
    assert info["PATH_INFO"] == "/extra/path"
    assert info["DOCUMENT_URI"] == "/info.php/extra/path"
    # A directory: index finds index.php, which the php location then runs.
    status, _, body = srv.get("/sub/")
    assert (status, body) == (200, b"sub index")


@pytest.mark.parametrize("size", [0, 11, 200_000])
def test_request_body_content_length(gannet, fpm, size):
    srv = php_server(gannet, fpm)
    data = bytes(i % 251 for i in range(size))
    status, _, body = srv.request("POST", "/body.php", {"Content-Type": "application/octet-stream"}, data)
    assert status == 200
    assert body.decode() == f"{size} {hashlib.md5(data).hexdigest()}"


def test_request_body_chunked_and_expect_continue(gannet, fpm):
    srv = php_server(gannet, fpm)
    data = b"x" * 5000 + b"y" * 3000
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (data[:5000], data[5000:])) + b"0\r\n\r\n"
    raw = srv.raw(b"POST /body.php HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunks)
    assert raw.startswith(b"HTTP/1.1 200 ")
    assert raw.endswith(f"8000 {hashlib.md5(data).hexdigest()}".encode())

    # Expect: 100-continue: gannet says 100 before the client sends, then passes the body.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"POST /body.php HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        first = s.recv(100)
        assert first == b"HTTP/1.1 100 Continue\r\n\r\n"
        # (No half-close: as in nginx, a client that closes its side has left, see
        # test_client_abort.py.)
        s.sendall(b"hello")
        rest = b""
        while not rest.endswith(hashlib.md5(b"hello").hexdigest().encode()):
            got = s.recv(4096)
            if not got:
                break
            rest += got
    assert rest.startswith(b"HTTP/1.1 200 ")
    assert rest.endswith(f"5 {hashlib.md5(b'hello').hexdigest()}".encode())


def test_body_over_client_max_body_size(gannet, fpm):
    srv = php_server(gannet, fpm, extra="client_max_body_size 1k;")
    status, _, _ = srv.request("POST", "/body.php", {}, b"z" * 2000)
    assert status == 413
    raw = srv.raw(b"POST /body.php HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n" + b"z" * 2000 + b"\r\n0\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 413 ")


def test_status_headers_and_hidden_headers(gannet, fpm):
    srv = php_server(gannet, fpm)
    status, headers, body = srv.get("/status.php?code=418")
    assert status == 418
    assert headers["x-app"] == "yes"
    assert "x-accel-buffering" not in headers, "nginx hides X-Accel-* from clients"
    assert headers["server"].startswith("gannet")
    assert body == b"status body\n"
    # HEAD: the same head, no body.
    status, headers, body = srv.request("HEAD", "/status.php?code=201")
    assert (status, body) == (201, b"")
    # PHP sends no body and no length for HEAD; a made-up Content-Length: 0 would be wrong.
    assert "content-length" not in headers


def test_big_answer_and_keepalive(gannet, fpm):
    srv = php_server(gannet, fpm)
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    for _ in range(3):
        c.request("GET", "/big.php")
        r = c.getresponse()
        data = r.read()
        assert r.status == 200
        assert len(data) == 16 * 65536 * 3
        assert data[:16] == b"0123456789abcdef"
    c.close()


def test_big_answer_is_streamed_chunked_or_close_delimited(gannet, fpm):
    """Answers over 1 MiB are passed on as they come: chunked to HTTP/1.1 clients (and the
    connection stays open), close-delimited to HTTP/1.0 ones."""
    srv = php_server(gannet, fpm)
    size = 16 * 65536 * 3
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /big.php HTTP/1.1\r\nHost: t\r\n\r\n")
        f = s.makefile("rb")
        head = read_head(f)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
        body = read_chunked(f)
        assert len(body) == size and body[:16] == b"0123456789abcdef"
        # The connection is still usable.
        s.sendall(b"GET /static.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        assert f.readline().startswith(b"HTTP/1.1 200 ")
    raw = srv.raw(b"GET /big.php HTTP/1.0\r\n\r\n", timeout=10)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Connection: close" in head and b"Transfer-Encoding" not in head
    assert len(body) == size


def test_stderr_goes_to_error_log(gannet, fpm):
    srv = php_server(gannet, fpm)
    status, _, body = srv.get("/stderr.php")
    assert (status, body) == (200, b"ok")
    log = wait_until(lambda: "boom from php" in srv.error_log() and srv.error_log())
    assert log, srv.error_log()
    line = next(l for l in log.splitlines() if "boom from php" in l)
    assert "[error]" in line and "FastCGI sent in stderr" in line
    assert 'upstream: "fastcgi://unix:' in line


def test_wordpress_style_front_controller(gannet, fpm):
    srv = gannet.start(files=FILES, server=f"""
        index index.php;
        location / {{ try_files $uri $uri/ /index.php?$args; }}
        location ~ \\.php$ {{
            include {REPO}/conf/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_pass unix:{fpm['sock']};
        }}
    """)
    status, _, body = srv.get("/2024/05/hello-world/?p=3")
    assert status == 200
    assert body == b"front controller: /2024/05/hello-world/?p=3 q=p=3"
    # Static files are still served directly.
    assert srv.get("/static.txt")[2] == b"plain file\n"


DEBIAN_SNIPPET = Path("/etc/nginx/snippets/fastcgi-php.conf")


@pytest.mark.skipif(not DEBIAN_SNIPPET.exists(), reason="Debian's nginx-common ships the snippet")
def test_debian_fastcgi_php_snippet_unchanged(gannet, fpm):
    """Debian's site config: `include snippets/fastcgi-php.conf;` (split_path_info, try_files,
    `set $path_info $fastcgi_path_info`, `include fastcgi.conf`) read from /etc/nginx as is."""
    # The snippet's `include fastcgi.conf` is relative to the main config's directory.
    shutil.copy("/etc/nginx/fastcgi.conf", gannet.tmp / "fastcgi.conf")
    srv = gannet.start(files=FILES, server=f"""
        index index.php;
        location ~ \\.php$ {{
            include {DEBIAN_SNIPPET};
            fastcgi_pass unix:{fpm['sock']};
        }}
    """)
    status, _, body = srv.get("/info.php?x=1")
    assert status == 200, body
    info = json.loads(body)
    assert info["SCRIPT_FILENAME"] == f"{gannet.tmp}/www/info.php"
    assert info["PATH_INFO"] == ""
    assert info["GET"] == {"x": "1"}
    # With a location that lets a path follow the script, $path_info keeps what
    # try_files would have reset.
    srv.stop()
    srv = gannet.start(files=FILES, server=f"""
        location ~ ^(.+\\.php)(/.*)?$ {{
            include {DEBIAN_SNIPPET};
            fastcgi_pass unix:{fpm['sock']};
        }}
    """)
    status, _, body = srv.get("/info.php/extra/path")
    assert status == 200, body
    info = json.loads(body)
    assert (info["SCRIPT_NAME"], info["PATH_INFO"]) == ("/info.php", "/extra/path")
    assert srv.get("/missing.php/x")[0] == 404


def test_if_in_a_fastcgi_location_still_passes(gannet, fpm):
    srv = gannet.start(files=FILES, server=f"""
        location ~ \\.php$ {{
            if ($arg_deny) {{ return 403; }}
            if ($arg_mark) {{ add_header X-Marked yes; }}
            include {REPO}/conf/fastcgi.conf;
            fastcgi_pass unix:{fpm['sock']};
        }}
    """)
    assert srv.get("/info.php?deny=1")[0] == 403
    status, headers, body = srv.get("/info.php?mark=1")
    assert status == 200, body
    assert headers.get("x-marked") == "yes"
    assert json.loads(body)["GET"] == {"mark": "1"}


def test_intercept_errors(gannet, fpm):
    extra = "error_page 404 /404.html; fastcgi_intercept_errors on;"
    srv = php_server(gannet, fpm, extra=extra)
    status, _, body = srv.get("/status.php?code=404")
    assert (status, body) == (404, b"custom not found\n")
    # A status without an error_page goes through as the application sent it.
    status, _, body = srv.get("/status.php?code=409")
    assert (status, body) == (409, b"status body\n")
    # Without intercept_errors the application's own 404 page is kept.
    srv2 = php_server(gannet, fpm, extra="error_page 404 /404.html;")
    assert srv2.get("/status.php?code=404")[2] == b"status body\n"


# --- applications that misbehave -------------------------------------------------------

@pytest.fixture
def backend():
    yield from made(FastCgiApp)


def pass_to(gannet, port, extra=""):
    return gannet.start(files={"x.php": "unused"}, server=f"""
        location ~ \\.php$ {{
            include {REPO}/conf/fastcgi.conf;
            fastcgi_pass 127.0.0.1:{port};
            {extra}
        }}
    """)


def test_nothing_listening_is_502(gannet):
    port = free_port()
    srv = pass_to(gannet, port)
    status, _, body = srv.get("/x.php")
    assert status == 502 and b"502 Bad Gateway" in body
    log = wait_until(lambda: "connect() failed" in srv.error_log() and srv.error_log())
    assert f'upstream: "fastcgi://127.0.0.1:{port}"' in log
    # nginx's wording, which log watchers (fail2ban filters, alerting rules) match.
    assert "connect() failed (111: Connection refused) while connecting to upstream" in log
    # The server is fine afterwards.
    assert srv.get("/x.php")[0] == 502


def test_missing_unix_socket_is_502(gannet, tmp_path):
    srv = gannet.start(files={"x.php": "unused"}, server=f"""
        location ~ \\.php$ {{ fastcgi_pass unix:{tmp_path}/nowhere.sock; }}
    """)
    assert srv.get("/x.php")[0] == 502


def test_silent_application_is_504(gannet, backend):
    held = threading.Event()
    b = backend(lambda conn: held.wait(30))
    srv = pass_to(gannet, b.port, "fastcgi_read_timeout 500ms;")
    try:
        status, _, _ = srv.get("/x.php")
        assert status == 504
        assert wait_until(lambda: "upstream timed out" in srv.error_log())
    finally:
        held.set()


def test_not_fastcgi_is_502(gannet, backend):
    b = backend(lambda conn: conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"))
    srv = pass_to(gannet, b.port)
    assert srv.get("/x.php")[0] == 502
    assert wait_until(lambda: "unsupported FastCGI protocol version" in srv.error_log())


def test_answer_cut_short_is_502(gannet, backend):
    def die(conn):
        conn.sendall(record(6, b"Content-Type: text/plain\r\n\r\npartial bo"))
        conn.shutdown(socket.SHUT_RDWR)

    b = backend(die)
    srv = pass_to(gannet, b.port)
    # The client never sees a complete answer: a 502 if the close came with the head, else
    # the head and what came, then the connection closes without the last chunk (nginx
    # sends the last chunk, so its client takes the cut answer for a whole one).
    raw = srv.raw(b"GET /x.php HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.startswith(b"HTTP/1.1 502") or (
        raw.startswith(b"HTTP/1.1 200") and raw.endswith(b"partial bo\r\n")), raw
    assert wait_until(lambda: "prematurely closed" in srv.error_log())


def test_invalid_head_is_502(gannet, backend):
    b = backend(lambda conn: conn.sendall(record(6, b"this is no header\r\n\r\n") + end_request()))
    srv = pass_to(gannet, b.port)
    assert srv.get("/x.php")[0] == 502
    assert wait_until(lambda: "upstream sent invalid header" in srv.error_log())


def test_application_dying_mid_stream_closes_the_connection(gannet, backend):
    """Half of a big answer, then the application dies: the client gets what came, no final
    chunk, and the connection closes - it never hangs and never looks complete."""
    def die(conn):
        conn.sendall(record(6, b"Content-Type: application/octet-stream\r\n\r\n"))
        for _ in range(40):
            conn.sendall(record(6, b"z" * 65000))
        conn.shutdown(socket.SHUT_RDWR)

    b = backend(die)
    srv = pass_to(gannet, b.port)
    raw = srv.raw(b"GET /x.php HTTP/1.1\r\nHost: t\r\n\r\n", timeout=10)
    assert raw.startswith(b"HTTP/1.1 200 ")
    assert b"Transfer-Encoding: chunked" in raw.split(b"\r\n\r\n", 1)[0]
    assert not raw.endswith(b"0\r\n\r\n"), "a cut answer must not end like a whole one"
    assert wait_until(lambda: "prematurely closed" in srv.error_log())


@pytest.mark.parametrize("sent", [b"world", b"world and more", b"wor"], ids=["exact", "longer", "shorter"])
def test_paused_answer_keeps_its_content_length(gannet, backend, sent):
    """An answer that pauses after its head is streamed, and PHP's Content-Length still
    reaches the client: no chunks, the connection stays open for the next request. As
    nginx: bytes past the length are dropped with a warning; an answer that ends short of it
    closes the connection (the client sees it cut, never whole)."""
    go_on = threading.Event()

    def paced(conn):
        conn.sendall(record(6, b"Content-Type: text/plain\r\nContent-Length: 10\r\n\r\nhello"))
        go_on.wait(10)
        conn.sendall(record(6, sent) + end_request())

    b = backend(paced)
    srv = pass_to(gannet, b.port)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        f = s.makefile("rb")
        s.sendall(b"GET /x.php HTTP/1.1\r\nHost: t\r\n\r\n")
        head = read_head(f)
        assert b"\r\nContent-Length: 10\r\n" in head and b"chunked" not in head, head
        assert f.read(5) == b"hello"
        go_on.set()
        if len(sent) < 5:
            assert f.read(10) == b"wor", "then the close"
            assert wait_until(lambda: "prematurely closed FastCGI stdout" in srv.error_log())
            return
        assert f.read(5) == b"world"
        s.sendall(b"GET /nothing-here HTTP/1.1\r\nHost: t\r\n\r\n")
        assert read_head(f).startswith(b"HTTP/1.1 404 "), "the connection carried on"
    if len(sent) > 5:
        assert wait_until(lambda: "upstream sent more data than specified" in srv.error_log())


def test_local_redirect(gannet, backend):
    """`Location: /path` without `Status` is a CGI local redirect: gannet serves that URI."""
    b = backend(lambda conn: conn.sendall(record(6, b"Location: /target.txt\r\n\r\n") + end_request()))
    srv = gannet.start(files={"x.php": "unused", "target.txt": "the target\n"}, server=f"""
        location ~ \\.php$ {{ include {REPO}/conf/fastcgi.conf; fastcgi_pass 127.0.0.1:{b.port}; }}
    """)
    status, _, body = srv.get("/x.php")
    assert (status, body) == (200, b"the target\n")
    # A Location with a scheme is a client redirect: 302.
    b2 = backend(lambda conn: conn.sendall(record(6, b"Location: http://example.com/\r\n\r\n") + end_request()))
    srv2 = pass_to(gannet, b2.port)
    status, headers, _ = srv2.get("/x.php")
    assert status == 302 and headers["location"] == "http://example.com/"


def test_config_errors(gannet):
    bad = {
        "fastcgi_pass backend_group;": "host not found in upstream \"backend_group\"",
        "fastcgi_pass 127.0.0.1:9000; fastcgi_pass 127.0.0.1:9001;": "duplicate",
        "fastcgi_param A b maybe;": 'invalid parameter "maybe"',
        "fastcgi_split_path_info ^(.+)$;": "must have 2 captures",
        "fastcgi_next_upstream sometimes;": "invalid value",
        "fastcgi_cache zone;": '"fastcgi_cache" zone "zone" is unknown',
    }
    for stmt, msg in bad.items():
        r = gannet.check(server=f"location /x {{ {stmt} }}")
        assert r.returncode != 0, stmt
        assert msg in r.stderr, (stmt, r.stderr)
        assert re.search(r"check\.conf:\d+", r.stderr), r.stderr


# --- upstream groups -------------------------------------------------------------------

def group_server(gannet, upstream, location_extra="", files=None):
    return gannet.start(files=files or FILES, http=upstream, server=f"""
        location ~ \\.php$ {{
            include {REPO}/conf/fastcgi.conf;
            fastcgi_pass php;
            {location_extra}
        }}
    """)


def pools(srv, n, method="GET"):
    out = []
    for _ in range(n):
        status, _, body = srv.request(method, "/info.php")
        assert status == 200, body
        out.append(json.loads(body))
    return out


def test_round_robin_with_weights(gannet, fpm):
    srv = group_server(gannet, f"""upstream php {{
        server unix:{fpm['sock']} weight=2;
        server 127.0.0.1:{fpm['port']};
    }}""")
    seen = [i["POOL"] for i in pools(srv, 9)]
    assert seen.count("unix") == 6 and seen.count("tcp") == 3, seen
    # Smooth weighted round robin never sends three in a row to the heavier server.
    assert "unix,unix,unix" not in ",".join(seen)


def test_dead_server_is_skipped_and_logged(gannet, fpm):
    dead = free_port()
    srv = group_server(gannet, f"""upstream php {{
        server 127.0.0.1:{dead} max_fails=1 fail_timeout=30s;
        server unix:{fpm['sock']};
    }}""")
    assert {i["POOL"] for i in pools(srv, 6)} == {"unix"}
    log = wait_until(lambda: "connect() failed" in srv.error_log() and srv.error_log())
    assert log.count("connect() failed") == 1, "the dead server is tried once, then left alone for fail_timeout"
    assert f'upstream: "fastcgi://127.0.0.1:{dead}"' in log


def test_backup_only_when_primaries_are_down(gannet, fpm):
    srv = group_server(gannet, f"""upstream php {{
        server unix:{fpm['sock']};
        server 127.0.0.1:{fpm['port']} backup;
    }}""")
    assert {i["POOL"] for i in pools(srv, 4)} == {"unix"}
    srv2 = group_server(gannet, f"""upstream php {{
        server unix:{fpm['sock']} down;
        server 127.0.0.1:{fpm['port']} backup;
    }}""")
    assert {i["POOL"] for i in pools(srv2, 3)} == {"tcp"}


def test_all_dead_is_502_no_live_upstreams(gannet):
    srv = group_server(gannet, f"""upstream php {{
        server 127.0.0.1:{free_port()};
        server 127.0.0.1:{free_port()};
    }}""", files={"x.php": "unused"})
    assert srv.get("/x.php")[0] == 502
    assert srv.get("/x.php")[0] == 502
    assert wait_until(lambda: "no live upstreams" in srv.error_log())


def test_post_is_not_sent_twice(gannet, fpm, backend):
    """A request the first server received and then failed on is retried only if it is
    idempotent: a POST might have done its work already."""
    b = backend(lambda conn: conn.shutdown(socket.SHUT_RDWR))
    srv = group_server(gannet, f"""upstream php {{
        server 127.0.0.1:{b.port} max_fails=0;
        server unix:{fpm['sock']} max_fails=0;
    }}""")
    results = [srv.request("POST", "/body.php", {}, b"data")[0] for _ in range(4)]
    assert sorted(results) == [200, 200, 502, 502], results
    # GET goes on to the next server.
    assert all(srv.get("/body.php")[0] == 200 for _ in range(4))


KEPT_ANSWER = record(6, b"Content-Type: text/plain\r\n\r\nkept") + end_request()


def kept_server(gannet, port, keepalive, keep_conn=True):
    """x.php through an upstream of one FastCGI server with `keepalive`."""
    return group_server(gannet, f"""upstream php {{
        server 127.0.0.1:{port};
        keepalive {keepalive};
    }}""", "fastcgi_keep_conn on;" if keep_conn else "", files={"x.php": "unused"})


def test_keepalive_reuses_connections(gannet, backend):
    def answer(conn):
        conn.sendall(KEPT_ANSWER)
        return "again"

    b = backend(answer)
    srv = kept_server(gannet, b.port, 4)
    for _ in range(5):
        status, _, body = srv.get("/x.php")
        assert (status, body) == (200, b"kept")
    assert len(b.conns) == 1, "five requests, one connection"
    # Without fastcgi_keep_conn each request has its own connection, as in nginx.
    srv2 = kept_server(gannet, b.port, 4, keep_conn=False)
    for _ in range(3):
        assert srv2.get("/x.php")[2] == b"kept"
    assert len(b.conns) == 4


def test_fastcgi_connections_over_keepalive_close_at_once(gannet, backend):
    """Unlike proxied HTTP's, a FastCGI connection freed while `keepalive` are idle closes
    at once (as in nginx): idle, it would hold an application process."""
    barrier = threading.Barrier(3, timeout=10)

    def together(conn):
        barrier.wait()
        conn.sendall(KEPT_ANSWER)
        return "again"

    b = backend(together)
    srv = kept_server(gannet, b.port, 1)
    statuses = []
    for burst in range(2):
        threads = [threading.Thread(target=lambda: statuses.append(srv.get("/x.php")[0])) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert statuses == [200] * 6
    assert len(b.conns) == 5, "the second burst opened two connections again"


def test_keepalive_with_php_fpm(gannet, fpm):
    """PHP-FPM honours keep_conn: a kept connection stays with one child."""
    srv = group_server(gannet, f"""upstream php {{
        server unix:{fpm['sock']};
        keepalive 2;
    }}""", "fastcgi_keep_conn on;")
    infos = pools(srv, 5)
    assert len({i["PID"] for i in infos}) == 1, "one kept connection is one PHP-FPM child"


def test_kept_connection_reused_after_a_streamed_answer(gannet, backend):
    def big(conn):
        conn.sendall(record(6, b"Content-Type: text/plain\r\n\r\n"))
        for _ in range(20):
            conn.sendall(record(6, b"y" * 65000))
        conn.sendall(end_request())
        return "again"

    b = backend(big)
    srv = group_server(gannet, f"""upstream php {{
        server 127.0.0.1:{b.port};
        keepalive 2;
    }}""", "fastcgi_keep_conn on;", files={"x.php": "unused"})
    for _ in range(3):
        status, _, body = srv.get("/x.php")
        assert status == 200 and body == b"y" * 65000 * 20
    assert len(b.conns) == 1


def padded(kind: int, content: bytes, pad: int) -> bytes:
    """A FastCGI record with `pad` bytes of padding (PHP-FPM pads its records to 8 bytes)."""
    return struct.pack(">BBHHBB", 1, kind, 1, len(content), pad, 0) + content + b"\0" * pad


def test_records_cut_anywhere_by_the_reads(gannet, backend):
    """PHP-FPM's long answer (a short record with the head, a long one with the body, a
    padded tail) arriving cut at every awkward place: inside a record's header, its
    content, its padding, and with the application pausing mid-record (what came goes to
    the client meanwhile). The body arrives whole and in order, and the kept connection
    carries the next request."""
    head = b"Content-Type: text/plain\r\n\r\n"
    body = bytes(i % 251 for i in range(40001))
    tail = padded(6, body[40000:], 7) + record(6, b"") + end_request()
    long = padded(6, body[:40000], 0)
    resumed = threading.Event()

    def cut(conn):
        # Byte-exact pieces with a pause between each, so each read gets one.
        pieces = [padded(6, head, 3)[:5], padded(6, head, 3)[5:20],
                  padded(6, head, 3)[20:] + long[:3], long[3:12000], long[12000:30000]]
        for p in pieces:
            conn.sendall(p)
            time.sleep(0.05)
        # Mid-record: the client gets what came before the rest is sent.
        resumed.wait(30)
        conn.sendall(long[30000:])
        time.sleep(0.05)
        conn.sendall(tail[:len(tail) - 30])
        time.sleep(0.05)
        conn.sendall(tail[len(tail) - 30:])
        return "again"

    b = backend(cut)
    srv = group_server(gannet, f"""upstream php {{
        server 127.0.0.1:{b.port};
        keepalive 2;
    }}""", "fastcgi_keep_conn on;", files={"x.php": "unused"})
    # The client would time out waiting if what came of the record were held.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        f = s.makefile("rb")
        for _ in range(2):
            resumed.clear()
            s.sendall(b"GET /x.php HTTP/1.1\r\nHost: t\r\n\r\n")
            assert b"chunked" in read_head(f)
            got = b""
            while len(got) < 30000 - 8:
                n = int(f.readline().strip(), 16)
                got += f.read(n)
                assert f.read(2) == b"\r\n"
            resumed.set()
            got += read_chunked(f)
            assert got == body
    assert len(b.conns) == 1


def test_kept_connection_closed_by_the_application(gannet, backend):
    """An application that closes a kept connection between requests: the next request
    notices (or fails on it) and goes through on a new connection, with no error logged."""
    def answer_then_close(conn):
        conn.sendall(record(6, b"Content-Type: text/plain\r\n\r\nonce") + end_request())

    b = backend(answer_then_close)
    srv = group_server(gannet, f"""upstream php {{
        server 127.0.0.1:{b.port};
        keepalive 4;
    }}""", "fastcgi_keep_conn on;", files={"x.php": "unused"})
    for _ in range(4):
        status, _, body = srv.get("/x.php")
        assert (status, body) == (200, b"once")
    assert len(b.conns) == 4
    assert "[error]" not in srv.error_log()


def test_max_conns_with_queue_shares_kept_connections(gannet, fpm):
    """`max_conns` + `queue` (nginx Plus's): many concurrent requests share as many kept
    connections as PHP-FPM has children, instead of opening connections no child serves."""
    srv = group_server(gannet, f"""upstream php {{
        server unix:{fpm['sock']} max_conns=2;
        keepalive 2;
        queue 100 timeout=20s;
    }}""", "fastcgi_keep_conn on;")
    results = []

    def one():
        results.append(srv.get("/info.php"))

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert [r[0] for r in results] == [200] * 20
    assert len({json.loads(r[2])["PID"] for r in results}) <= 2


def test_max_conns_without_queue_is_502(gannet, backend):
    release = threading.Event()

    def slow(conn):
        release.wait(20)
        conn.sendall(record(6, b"Content-Type: text/plain\r\n\r\ndone") + end_request())

    b = backend(slow)
    srv = group_server(gannet, f"""upstream php {{ server 127.0.0.1:{b.port} max_conns=1; }}""",
                       files={"x.php": "unused"})
    first = []
    t = threading.Thread(target=lambda: first.append(srv.get("/x.php")))
    t.start()
    try:
        assert wait_until(lambda: len(b.conns) == 1), "the first request reached the application"
        assert srv.get("/x.php")[0] == 502
        assert wait_until(lambda: "no live upstreams" in srv.error_log())
    finally:
        release.set()
        t.join(20)
    assert first[0][0] == 200 and first[0][2] == b"done"


def test_queue_timeout_is_502_while_the_slot_stays_taken(gannet, backend):
    """A request queued behind `max_conns` gets its 502 when the queue's timeout passes
    (the wait is a slot in the worker's deadline table, swept every 250 ms), while the
    request holding the slot goes on to its answer."""
    release = threading.Event()

    def slow(conn):
        release.wait(20)
        conn.sendall(record(6, b"Content-Type: text/plain\r\n\r\ndone") + end_request())

    b = backend(slow)
    srv = group_server(gannet, f"""upstream php {{
        server 127.0.0.1:{b.port} max_conns=1;
        queue 10 timeout=1s;
    }}""", files={"x.php": "unused"})
    first = []
    t = threading.Thread(target=lambda: first.append(srv.get("/x.php")))
    t.start()
    try:
        assert wait_until(lambda: len(b.conns) == 1), "the first request reached the application"
        start = time.monotonic()
        assert srv.get("/x.php")[0] == 502
        waited = time.monotonic() - start
        assert 0.9 <= waited < 5, waited
        assert "no live upstreams" in srv.error_log()
        assert not first, "the first request is still waiting for its answer"
    finally:
        release.set()
        t.join(20)
    assert first[0][0] == 200 and first[0][2] == b"done"
    assert len(b.conns) == 1


def test_upstream_config_errors(gannet):
    bad = {
        "upstream u { }": 'no servers are inside upstream "u"',
        "upstream u { server 127.0.0.1:9000 weight=0; }": 'invalid parameter "weight=0"',
        "upstream u { server nowhere; }": 'invalid address "nowhere"',
        "upstream u { server 127.0.0.1:9000; least_conn; ip_hash; }": "load balancing method redefined",
        "upstream u { server 127.0.0.1:9000; queue 10 wait=1s; }": 'invalid parameter "wait=1s"',
        "upstream u { server 127.0.0.1:9000 max_conns=x; }": 'invalid parameter "max_conns=x"',
        "upstream u { server 127.0.0.1:9000; } upstream u { server 127.0.0.1:9001; }": 'duplicate upstream "u"',
    }
    for stmt, msg in bad.items():
        r = gannet.check(http=stmt)
        assert r.returncode != 0, stmt
        assert msg in r.stderr, (stmt, r.stderr)
        assert re.search(r"check\.conf:\d+", r.stderr), r.stderr
