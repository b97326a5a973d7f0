"""`auth_request` and `auth_request_set`: a subrequest to an authentication service (a small
HTTP app written here) decides whether a request goes on. The same config runs on Debian's
nginx and every answer must be the same: allowed (with the user passed on to the proxied
application by `auth_request_set $user $upstream_http_x_auth_user`), 401 with the service's
WWW-Authenticate, 403, and 500 for a 302, a 404 and a refused connection; `satisfy any | all`
with `allow` / `deny` and `auth_basic`. HTTP/2 goes through the same code (gannet alone:
Debian's nginx 1.22 has no `http2 on`).
"""

from __future__ import annotations

import re
import subprocess

import pytest

import rawapps
from conftest import free_port
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side


def auth_service(conn, head, body):
    """Answers by the X-Original-URI the auth location sends (the path's first part)."""
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    what = headers.get("x-original-uri", "/").split("/")[1]
    method = lines[0].split()[0]
    if method != "GET" or body:
        conn.sendall(rawapps.http_answer(b"", "400 Bad Request"))
    elif what in ("ok", "static", "any", "ok-basic", "h2", "var") or (what == "bearer" and headers.get("authorization") == "Bearer good"):
        # A body nobody should see: the subrequest's body is dropped.
        conn.sendall(rawapps.http_answer(b"auth body\n", headers="X-Auth-User: alice\r\nX-Auth-Groups: admins\r\n"))
    elif what in ("bearer", "u401", "any401"):
        conn.sendall(rawapps.http_answer(b"no\n", "401 Unauthorized", 'WWW-Authenticate: Bearer realm="t"\r\nX-Auth-User: nobody\r\n'))
    elif what in ("u403", "all"):
        conn.sendall(rawapps.http_answer(b"no\n", "403 Forbidden"))
    elif what == "u302":
        conn.sendall(rawapps.http_answer(b"", "302 Found", "Location: http://login.test/\r\n"))
    elif what == "u204":
        conn.sendall(rawapps.http_answer(b"", "204 No Content"))
    else:
        conn.sendall(rawapps.http_answer(b"", "404 Not Found"))
    return "again"


def backend(conn, head, body):
    """The protected application: says which user the proxy told it about."""
    user = re.search(rb"\r\nX-User: ([^\r]*)", head)
    groups = re.search(rb"\r\nX-Groups: ([^\r]*)", head)
    text = b"app saw user=" + (user[1] if user else b"-") + b" groups=" + (groups[1] if groups else b"-") + b"\n"
    conn.sendall(rawapps.http_answer(text))
    return "again"


CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    server_tokens off;
    root {root};
    server {
        listen 127.0.0.1:{port};
        server_name main.test;
        # Authelia's snippets: the auth service's URL in a server-level variable, which the
        # subrequest sees; what its location sets, the main request sees.
        set $auth_url http://127.0.0.1:AUTHPORT/check;

        location = /auth-var {
            internal;
            set $from_sub "set in the subrequest";
            proxy_pass $auth_url;
            proxy_set_header X-Original-URI $request_uri;
        }
        location /var/ {
            auth_request /auth-var;
            auth_request_set $user $upstream_http_x_auth_user;
            add_header X-User $user;
            add_header X-From-Sub $from_sub;
        }
        location = /auth {
            internal;
            proxy_pass http://127.0.0.1:AUTHPORT/check;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
        }
        location = /auth-dead {
            internal;
            proxy_pass http://127.0.0.1:DEADPORT/;
        }
        location = /auth-file { internal; }
        location = /auth-nofile { internal; }

        location / {
            auth_request /auth;
            auth_request_set $user $upstream_http_x_auth_user;
            auth_request_set $groups "[$upstream_http_x_auth_groups]";
            proxy_pass http://127.0.0.1:APPPORT;
            proxy_set_header X-User $user;
            proxy_set_header X-Groups $groups;
        }
        location /static/ {
            auth_request /auth;
            auth_request_set $user $upstream_http_x_auth_user;
            add_header X-User $user;
        }
        location /dead/ { auth_request /auth-dead; }
        location /file/ { auth_request /auth-file; }
        location /nofile/ { auth_request /auth-nofile; }
        location /open/ { auth_request off; }

        location /any/ {
            satisfy any;
            deny all;
            auth_request /auth;
            proxy_pass http://127.0.0.1:APPPORT;
        }
        location /any-allowed/ {
            satisfy any;
            allow 127.0.0.1;
            deny all;
            auth_request /auth;
        }
        location /all/ {
            deny all;
            auth_request /auth;
        }
        location /any401/ {
            satisfy any;
            auth_basic "basic";
            auth_basic_user_file {tmp}/nobody.htpasswd;
            auth_request /auth;
        }
        location /ok-basic/ {
            satisfy any;
            auth_basic "basic";
            auth_basic_user_file {tmp}/nobody.htpasswd;
            auth_request /auth;
            return 200 "basic failed, auth_request allowed\n";
        }
    }
}
"""

FILES = {
    "auth-file": "file answer\n",
    "static/page.txt": "static page\n",
    "open/page.txt": "open page\n",
    "any-allowed/page.txt": "any-allowed page\n",
    "all/page.txt": "all page\n",
    "any401/page.txt": "any401 page\n",
    "file/page.txt": "file page\n",
    "nofile/page.txt": "nofile page\n",
    "var/x": "var page\n",
}


def req(path: str, *headers: str, method: str = "GET", body: bytes = b"") -> bytes:
    extra = "".join(h + "\r\n" for h in headers)
    length = f"Content-Length: {len(body)}\r\n" if body else ""
    return f"{method} {path} HTTP/1.1\r\nHost: main.test\r\n{extra}{length}Connection: close\r\n\r\n".encode() + body


SENT = [
    req("/ok/x"),
    req("/ok/x?a=1", method="POST", body=b"posted"),
    req("/ok/x", method="HEAD"),
    req("/u401/x"),
    req("/bearer/x", "Authorization: Bearer good"),
    req("/bearer/x", "Authorization: Bearer bad"),
    req("/u403/x"),
    req("/u302/x"),
    req("/u404/x"),
    req("/u204/x"),
    req("/static/page.txt"),
    req("/dead/x"),
    req("/file/page.txt"),
    req("/nofile/page.txt"),
    req("/open/page.txt"),
    req("/auth"),
    req("/any/x"),
    req("/any-allowed/page.txt"),
    req("/all/page.txt"),
    req("/any401/page.txt"),
    req("/ok-basic/x"),
    req("/var/x"),
]

COMPARED = ["www-authenticate", "x-user", "content-type", "location", "x-from-sub"]


def config(app_port: int, auth_port: int) -> str:
    return CONF.replace("AUTHPORT", str(auth_port)).replace("APPPORT", str(app_port)).replace("DEADPORT", str(free_port()))


@pytest.fixture
def apps():
    yield from rawapps.made(rawapps.HttpApp)


def view(a, port: int):
    fields = {"status": a.status} | {h: a.headers.get(h) for h in COMPARED}
    body = a.body.replace(b"<center>gannet</center>", b"<center>nginx</center>")
    return fields, body


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_same_answers_as_nginx(tmp_path, apps):
    app, auth = apps(backend), apps(auth_service)
    conf = config(app.port, auth.port)
    with side_by_side(tmp_path, conf, FILES) as (srv, nginx_port):
        answers = [(exchange(nginx_port, r), exchange(srv.port, r)) for r in SENT]
    diffs = []
    for r, (a_n, a_g) in zip(SENT, answers):
        n, g = view(a_n, nginx_port), view(a_g, srv.port)
        if n != g:
            diffs.append(f"{r.split(b' HTTP')[0].decode()}: nginx {n}, gannet {g}")
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
    got = {r.split(b" HTTP")[0].decode(): a_g for r, (_, a_g) in zip(SENT, answers)}
    # The test cannot pass on answers that are all alike: each verdict is seen.
    assert got["GET /ok/x"].body == b"app saw user=alice groups=[admins]\n"
    assert got["GET /u401/x"].status == 401
    assert got["GET /u401/x"].headers["www-authenticate"] == 'Bearer realm="t"'
    assert got["GET /u403/x"].status == 403
    assert {got[p].status for p in ("GET /u302/x", "GET /u404/x", "GET /dead/x", "GET /nofile/page.txt")} == {500}
    assert got["GET /static/page.txt"].headers["x-user"] == "alice"
    assert got["GET /any401/page.txt"].headers["www-authenticate"] == 'Basic realm="basic", Bearer realm="t"'
    assert got["GET /auth"].status == 404
    assert got["GET /any/x"].body == b"app saw user=- groups=-\n"
    assert got["GET /all/page.txt"].status == 403
    assert got["GET /ok-basic/x"].status == 200
    assert got["GET /any-allowed/page.txt"].status == 200
    assert got["GET /var/x"].headers["x-user"] == "alice"
    assert got["GET /var/x"].headers["x-from-sub"] == "set in the subrequest"


def test_subrequest_is_a_bodiless_get_with_the_clients_headers(gannet, apps):
    app, auth = apps(backend), apps(auth_service)
    srv = gannet.start(conf=config(app.port, auth.port), files=FILES)
    raw = srv.raw(req("/ok/y?q=1", "X-Client: c1", method="POST", body=b"secret body"))
    assert raw.startswith(b"HTTP/1.1 200"), raw
    # The auth service saw one GET without the body, the client's headers, the original URI.
    (_, head, body), = [r for r in auth.requests]
    assert head.startswith(b"GET /check HTTP/1.0\r\n"), head
    lines = head.split(b"\r\n")
    assert b"X-Client: c1" in lines and b"X-Original-URI: /ok/y?q=1" in lines
    assert body == b"" and b"Content-Length" not in head
    # The application got the POST with its body.
    (_, head, body), = app.requests
    assert head.startswith(b"POST /ok/y?q=1 ") and body == b"secret body"


def test_a_refusal_reaches_no_application(gannet, apps):
    app, auth = apps(backend), apps(auth_service)
    srv = gannet.start(conf=config(app.port, auth.port), files=FILES)
    for path, status in (("/u401/z", 401), ("/u403/z", 403), ("/u404/z", 500)):
        assert srv.raw(req(path)).startswith(f"HTTP/1.1 {status} ".encode())
    assert app.requests == []
    assert "auth request unexpected status: 404" in srv.error_log()


def curl_h2(port: int, path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["curl", "-s", "--http2-prior-knowledge", "-D", "-", *args, f"http://127.0.0.1:{port}{path}"],
        capture_output=True, timeout=30,
    )  # fmt: skip


@pytest.mark.skipif(subprocess.run(["which", "curl"], capture_output=True).returncode != 0, reason="needs curl")
def test_http2_goes_through_the_same_check(gannet, apps):
    app, auth = apps(backend), apps(auth_service)
    conf = config(app.port, auth.port).replace("server_name main.test;", "server_name main.test; http2 on;")
    srv = gannet.start(conf=conf, files=FILES)
    r = curl_h2(srv.port, "/h2/x")
    assert r.stdout.startswith(b"HTTP/2 200"), r.stdout
    assert r.stdout.endswith(b"app saw user=alice groups=[admins]\n")
    r = curl_h2(srv.port, "/u401/h2")
    assert r.stdout.startswith(b"HTTP/2 401"), r.stdout
    assert b'\r\nwww-authenticate: Bearer realm="t"\r\n' in r.stdout
    r = curl_h2(srv.port, "/u403/h2", "-d", "body")
    assert r.stdout.startswith(b"HTTP/2 403"), r.stdout
    assert curl_h2(srv.port, "/dead/h2").stdout.startswith(b"HTTP/2 500")


@pytest.mark.parametrize("body, message", [
    ("location / { auth_request auth; }", 'invalid value "auth" in "auth_request" directive'),
    ("location / { auth_request /a; auth_request /b; }", '"auth_request" directive is duplicate'),
    ("location / { auth_request_set user $upstream_http_x; }", 'invalid variable name "user"'),
    ("location / { auth_request_set $uri $upstream_http_x; }", 'the duplicate "uri" variable'),
    ("location / { auth_request_set $u $nonesuch; }", 'unknown "nonesuch" variable'),
    ("location / { auth_request /a /b; }", 'invalid number of arguments in "auth_request" directive'),
    ("location / { limit_except GET { auth_request /a; } }", '"auth_request" directive is not allowed here'),
])  # fmt: skip
def test_config_errors(gannet, body, message):
    r = gannet.check(server=body)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    assert re.search(r"\.conf:\d+", r.stderr), r.stderr


def sign_in_service(conn, head, body):
    """The auth check (200 for an X-Original-URI with `ok` in it, else 401 with a challenge)
    and the pages an `error_page` may show: a sign-in page answering 401 with a Location (as
    oauth2-proxy's /oauth2/sign_in does) and a page answering 404."""
    lines = head.decode("latin-1").split("\r\n")
    path = lines[0].split()[1]
    original = next((v.strip() for k, _, v in (line.partition(":") for line in lines[1:]) if k.lower() == "x-original-uri"), "")
    if path == "/check":
        if "ok" in original:
            conn.sendall(rawapps.http_answer(b""))
        else:
            conn.sendall(rawapps.http_answer(b"", "401 Unauthorized", 'WWW-Authenticate: Bearer realm="s"\r\n'))
    elif path.startswith("/signin/"):
        conn.sendall(rawapps.http_answer(b"sign in here\n", "401 Unauthorized", "Location: http://login.test/\r\n"))
    else:
        conn.sendall(rawapps.http_answer(b"gone page\n", "404 Not Found"))
    return "again"


ERROR_PAGE_CONF = PEER_MAIN + r"""
http {
    access_log {tmp}/access.log;
    server_tokens off;
    root {root};
    server {
        listen 127.0.0.1:{port};
        server_name main.test;

        location = /auth {
            internal;
            proxy_pass http://127.0.0.1:AUTHPORT/check;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
        }
        location /signin/ { proxy_pass http://127.0.0.1:AUTHPORT; }
        location /gone/ { proxy_pass http://127.0.0.1:AUTHPORT; }
        location = /bounce { return 302 /login.txt; }

        location /ep403/ { auth_request /auth; error_page 401 =403 /signin/x; }
        location /epkeep/ { auth_request /auth; error_page 401 /signin/x; }
        location /eppage/ { auth_request /auth; error_page 401 = /signin/x; }
        location /ep200/ { auth_request /auth; error_page 401 =200 /signin/x; }
        location /epgone/ { auth_request /auth; error_page 401 =403 /gone/x; }
        location /epfile/ { auth_request /auth; error_page 401 =403 /login.txt; }
        location /epbounce/ { auth_request /auth; error_page 401 =403 /bounce; }
        location /epmissing/ { auth_request /auth; error_page 401 =403 /nofile.txt; }
        location /notfound/ { error_page 404 =410 /gone/x; }
        location /notfound-keep/ { error_page 404 /signin/x; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_error_page_status_overrides_the_pages_own_like_nginx(tmp_path, apps):
    """`error_page 401 =403 /oauth2/sign_in` after an auth_request refusal: the `=403` (or the
    kept 401, or the page's own with `=`) is the answer's status whatever the page answered
    (a proxied 401 or 404, a file's 200), except where the page is itself one of nginx's
    own answers (a redirect, a missing file)."""
    auth = apps(sign_in_service)
    conf = ERROR_PAGE_CONF.replace("AUTHPORT", str(auth.port))
    paths = ["/ep403/x", "/ep403/ok", "/epkeep/x", "/eppage/x", "/ep200/x", "/epgone/x", "/epfile/x",
             "/epbounce/x", "/epmissing/x", "/notfound/x", "/notfound-keep/x"]  # fmt: skip
    sent = [req(p) for p in paths] + [req("/ep403/x", method="HEAD")]
    with side_by_side(tmp_path, conf, {"login.txt": "login page\n", "ep403/ok": "in\n"}) as (srv, nginx_port):
        answers = [(exchange(nginx_port, r), exchange(srv.port, r)) for r in sent]
    diffs = []
    for r, (a_n, a_g) in zip(sent, answers):
        n, g = view(a_n, nginx_port), view(a_g, srv.port)
        # A redirect names the server's own port.
        n[0]["location"] = (n[0]["location"] or "").replace(f":{nginx_port}/", ":PORT/")
        g[0]["location"] = (g[0]["location"] or "").replace(f":{srv.port}/", ":PORT/")
        if n != g:
            diffs.append(f"{r.split(b' HTTP')[0].decode()}: nginx {n}, gannet {g}")
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
    got = {r.split(b" HTTP")[0].decode(): a_g for r, (_, a_g) in zip(sent, answers)}
    assert got["GET /ep403/x"].status == 403 and got["GET /ep403/x"].body == b"sign in here\n"
    assert got["GET /ep403/ok"].status == 200
    assert got["GET /epgone/x"].status == 403 and got["GET /notfound/x"].status == 410
    assert got["GET /epbounce/x"].status == 302 and got["GET /epmissing/x"].status == 404
