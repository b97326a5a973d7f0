"""An application's `X-Accel-*` answer headers, as nginx acts on them: `X-Accel-Redirect`
(the protected-download pattern: the application checks access, gannet serves the file
from an `internal` location), and `X-Accel-Charset`. Through a raw HTTP application and a
real PHP-FPM, over HTTP/1.1 and h2c, and beside Debian's nginx on the same config.
"""

from __future__ import annotations

import subprocess

import pytest

import rawapps
from conftest import REPO
from nginx_peer import NGINX, PEER_MAIN, side_by_side
from test_fastcgi import PHP_FPM, fpm  # noqa: F401  (the fixture is reused)

FILE = bytes(range(256)) * 40


def accel_app(conn, head, _body):
    """Answers `/go/<target>` with `X-Accel-Redirect: <target>` (`~` for `/`), a body of
    its own and headers, some of which nginx carries to the redirected answer."""
    target = head.split(b" ")[1].decode()
    where = target.split("/go/", 1)[1].replace("~", "/") if "/go/" in target else ""
    extra = f"X-Accel-Redirect: {where}\r\n" if where else ""
    extra += "X-Accel-Charset: koi8-r\r\n" if "charset" in target else ""
    conn.sendall(rawapps.http_answer(
        b"the application's own body",
        headers=extra + "Content-Type: application/x-app\r\nContent-Disposition: attachment; "
                        "filename=\"f.bin\"\r\nX-Other: dropped\r\nSet-Cookie: s=1\r\n"))
    return "again"


LOCATIONS = """
        location /app/ { proxy_pass http://127.0.0.1:%d; %s }
        location /protected/ { internal; }
        location @named { return 200 "named $request_method\\n"; }
"""


@pytest.fixture
def app():
    a = rawapps.HttpApp(accel_app)
    yield a
    a.close()


def start(gannet, app, extra=""):
    return gannet.start(files={"protected/file.bin": FILE}, server="http2 on;" + LOCATIONS % (app.port, extra))


def test_x_accel_redirect_serves_the_internal_file(gannet, app):
    srv = start(gannet, app)
    status, h, body = srv.get("/app/go/~protected~file.bin")
    assert (status, body) == (200, FILE)
    # The application's Content-Type, Content-Disposition and Set-Cookie are carried, as
    # nginx carries them; its other headers, its body and the redirect header are not.
    assert h["content-type"] == "application/x-app"
    assert h["content-disposition"] == 'attachment; filename="f.bin"'
    assert h["set-cookie"] == "s=1"
    assert "x-other" not in h and "x-accel-redirect" not in h
    assert int(h["content-length"]) == len(FILE)
    # The internal location is not reachable from outside.
    assert srv.get("/protected/file.bin")[0] == 404
    # A POST to the application becomes a GET of the file (a POST to a file would be 405).
    status, _, body = srv.request("POST", "/app/go/~protected~file.bin", body=b"x")
    assert (status, body) == (200, FILE)
    # A named location; HEAD stays HEAD.
    assert srv.get("/app/go/@named")[::2] == (200, b"named GET\n")
    assert srv.request("HEAD", "/app/go/~protected~file.bin")[::2] == (200, b"")


def test_x_accel_redirect_to_missing_or_unsafe_is_404(gannet, app):
    srv = start(gannet, app)
    assert srv.get("/app/go/~protected~none.bin")[0] == 404
    status, h, _ = srv.get("/app/go/~protected~..~..~etc~passwd")
    assert status == 404 and h["content-type"] == "text/html"


def test_x_accel_redirect_over_h2(gannet, app):
    srv = start(gannet, app)
    r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-D", "-",
                        f"http://127.0.0.1:{srv.port}/app/go/~protected~file.bin"], capture_output=True, timeout=30)
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/2 200") and body == FILE, head
    assert b"content-type: application/x-app" in head and b"x-accel-redirect" not in head.lower()


def test_ignored_x_accel_redirect_passes_the_answer(gannet, app):
    srv = start(gannet, app, "proxy_ignore_headers X-Accel-Redirect;")
    status, h, body = srv.get("/app/go/~protected~file.bin")
    assert (status, body) == (200, b"the application's own body")
    assert "x-accel-redirect" not in h


def test_x_accel_charset(gannet, app):
    srv = start(gannet, app)
    assert srv.get("/app/charset")[1]["content-type"] == "application/x-app; charset=koi8-r"
    srv.stop()
    srv = start(gannet, app, "proxy_ignore_headers X-Accel-Charset;")
    assert srv.get("/app/charset")[1]["content-type"] == "application/x-app"


PHP = """<?php
header('Content-Type: application/pdf');
header('X-Accel-Redirect: /protected/file.bin');
echo 'php body';
"""


@pytest.mark.skipif(PHP_FPM is None, reason="php-fpm is installed by scripts/test-all.sh")
def test_x_accel_redirect_from_php(gannet, fpm):  # noqa: F811
    srv = gannet.start(files={"protected/file.bin": FILE, "dl.php": PHP}, server=f"""
        location /protected/ {{ internal; }}
        location = /dl.php {{ include {REPO}/conf/fastcgi.conf; fastcgi_pass unix:{fpm['sock']}; }}
    """)
    status, h, body = srv.get("/dl.php")
    assert (status, body) == (200, FILE)
    assert h["content-type"] == "application/pdf"


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_x_accel_redirect_matches_nginx(tmp_path, app):
    conf = PEER_MAIN + """
http {
    access_log {tmp}/access.log;
    server {
        listen 127.0.0.1:{port};
        root {root};
%s
    }
}
""" % (LOCATIONS % (app.port, ""))
    with side_by_side(tmp_path, conf, files={"protected/file.bin": FILE}) as (srv, nginx_port):
        for path in ("/app/go/~protected~file.bin", "/app/go/~protected~none.bin", "/app/go/@named",
                     "/app/go/~protected~..~..~etc~passwd", "/app/plain"):
            ours = srv.get(path)
            theirs = srv.get(path, port=nginx_port)
            assert ours[0] == theirs[0], path
            if ours[0] == 200:
                assert ours[2] == theirs[2], path
                for k in ("content-type", "content-disposition", "set-cookie", "x-other", "x-accel-redirect"):
                    assert ours[1].get(k) == theirs[1].get(k), (path, k)
        for method in ("POST", "HEAD"):
            ours = srv.request(method, "/app/go/~protected~file.bin", body=b"x" if method == "POST" else None)
            theirs = srv.request(method, "/app/go/~protected~file.bin", body=b"x" if method == "POST" else None, port=nginx_port)
            assert ours[::2] == theirs[::2], method
