"""HTTP Basic authentication: `auth_basic` / `auth_basic_user_file` with every password
scheme nginx reads (hashes made at test time by openssl and hashlib), `satisfy any | all`
with `allow` / `deny`, `limit_except`, `error_page 401`, `auth_basic off`, a missing user
file, and `$remote_user` in the access log. The same config runs on Debian's nginx, and
every answer and log line must be the same.
"""

from __future__ import annotations

import base64
import hashlib
import re
import subprocess

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    log_format auth '$uri $status $remote_user';
    access_log {tmp}/access.log auth;
    root {root};
    auth_basic "Members";
    auth_basic_user_file {root}/../users;

    server {
        listen 127.0.0.1:{port};
        location / { }
        location /off/ { auth_basic off; }
        location /any/ { satisfy any; allow 127.0.0.1; deny all; }
        location /any-deny/ { satisfy any; deny all; }
        location /all-deny/ { deny all; }
        location /ep/ { error_page 401 /401.html; }
        location = /401.html { auth_basic off; }
        location /le/ { auth_basic off; limit_except GET { auth_basic "Writers"; } }
        location /nofile/ { auth_basic_user_file {root}/../absent; }
        location /realm/ { auth_basic "host $host"; }
    }
}
"""

PATHS = ["/f.txt", "/off/f.txt", "/any/f.txt", "/any-deny/f.txt", "/all-deny/f.txt", "/ep/f.txt", "/le/f.txt", "/nofile/f.txt", "/realm/f.txt"]
FILES = {"f.txt": "top\n", "401.html": "<p>who are you?</p>\n", **{f"{p.split('/')[1]}/f.txt": "in\n" for p in PATHS[1:]}}


def openssl_passwd(flag: str, password: str) -> str:
    return subprocess.run(["openssl", "passwd", flag, password], capture_output=True, text=True, check=True).stdout.strip()


def users_file() -> str:
    salt = b"s4lt"
    ssha = base64.b64encode(hashlib.sha1(b"pw-ssha" + salt).digest() + salt).decode()
    sha = base64.b64encode(hashlib.sha1(b"pw-sha").digest()).decode()
    return "\n".join([
        "# one user per scheme",
        f"apr1:{openssl_passwd('-apr1', 'pw-apr1')}",
        f"md5:{openssl_passwd('-1', 'pw-md5')}",
        f"sha256:{openssl_passwd('-5', 'pw-sha256')}",
        f"sha512:{openssl_passwd('-6', 'pw-sha512')}:a comment after the password",
        f"sha:{{SHA}}{sha}",
        f"ssha:{{SSHA}}{ssha}",
        "plain:{PLAIN}pw-plain",
        "#hidden:{PLAIN}pw-hidden",
        "last:{PLAIN}pw-last",  # no line end after it
    ])


CREDENTIALS = [None, ("apr1", "pw-apr1"), ("md5", "pw-md5"), ("sha256", "pw-sha256"), ("sha512", "pw-sha512"),
               ("sha", "pw-sha"), ("ssha", "pw-ssha"), ("plain", "pw-plain"), ("last", "pw-last"),
               ("apr1", "wrong"), ("nobody", "pw-apr1"), ("#hidden", "pw-hidden")]  # fmt: skip


def request(path: str, cred: tuple[str, str] | None, method: str = "GET") -> bytes:
    auth = ""
    if cred:
        auth = "Authorization: Basic " + base64.b64encode(f"{cred[0]}:{cred[1]}".encode()).decode() + "\r\n"
    body = "Content-Length: 0\r\n" if method == "POST" else ""
    return f"{method} {path} HTTP/1.1\r\nHost: auth.test\r\n{auth}{body}Connection: close\r\n\r\n".encode()


SENT = [request("/f.txt", c) for c in CREDENTIALS] + [
    request(p, c, m) for p in PATHS[1:] for c in (None, ("plain", "pw-plain"), ("plain", "bad")) for m in ("GET", "POST")
]


def test_basic_authentication(gannet):
    root = gannet.write_files(FILES)
    (root.parent / "users").write_text(users_file())
    srv = gannet.start(conf=CONF)
    answers = {c: exchange(srv.port, request("/f.txt", c)) for c in CREDENTIALS}
    for c, a in answers.items():
        good = c is not None and c[0] not in ("nobody", "#hidden") and c[1] != "wrong"
        assert a.status == (200 if good else 401), (c, a.status)
        if not good:
            assert a.headers["www-authenticate"] == 'Basic realm="Members"'
    status = lambda path, cred=None, method="GET": exchange(srv.port, request(path, cred, method)).status  # noqa: E731
    good = ("plain", "pw-plain")
    assert status("/off/f.txt") == 200
    assert status("/any/f.txt") == 200  # allowed by address, no credentials needed
    assert (status("/any-deny/f.txt"), status("/any-deny/f.txt", good)) == (401, 200)
    assert (status("/all-deny/f.txt"), status("/all-deny/f.txt", good)) == (403, 403)
    a = exchange(srv.port, request("/ep/f.txt", None))
    assert (a.status, a.body, a.headers["www-authenticate"]) == (401, b"<p>who are you?</p>\n", 'Basic realm="Members"')
    assert (status("/le/f.txt"), status("/le/f.txt", None, "POST"), status("/le/f.txt", good, "POST")) == (200, 401, 405)
    assert exchange(srv.port, request("/le/f.txt", None, "POST")).headers["www-authenticate"] == 'Basic realm="Writers"'
    assert status("/nofile/f.txt", good) == 403
    assert exchange(srv.port, request("/realm/f.txt", None)).headers["www-authenticate"] == 'Basic realm="host auth.test"'
    err = srv.error_log()
    assert re.search(r'\[error\] .*user "apr1": password mismatch, client: 127\.0\.0\.1', err), err
    assert re.search(r'user "nobody" was not found in "[^"]*users"', err), err
    assert re.search(r'open\(\) "[^"]*absent" failed', err), err
    log = wait_until(lambda: "/realm/f.txt" in srv.access_log() and srv.access_log())
    assert "/f.txt 200 sha512\n" in log and "/f.txt 401 nobody\n" in log and "/off/f.txt 200 -\n" in log


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_same_answers_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        # Both read the user file on each request.
        (srv.root.parent / "users").write_text(users_file())
        answers = [(exchange(nginx_port, r), exchange(srv.port, r)) for r in SENT]
        n_log = wait_until(lambda: len((tmp_path / "nginx" / "access.log").read_text().splitlines()) >= len(SENT))
        g_log = wait_until(lambda: len(srv.access_log().splitlines()) >= len(SENT))
        assert n_log and g_log
        logs = ((tmp_path / "nginx" / "access.log").read_text(), srv.access_log())
    diffs = []
    for r, (n, got) in zip(SENT, answers):
        fields = lambda a: (a.status, a.headers.get("www-authenticate"), a.body.replace(b"nginx/1.22.1", b"SERVER").replace(b"gannet/0.1.0", b"SERVER"))  # noqa: E731
        if fields(n) != fields(got):
            line = r.split(b"\r\n")[0].decode()
            diffs.append(f"{line} {r.count(b'Authorization')}: nginx {fields(n)!r}, gannet {fields(got)!r}")
    assert {a.status for a, _ in answers} >= {200, 401, 403}
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
    assert logs[0] == logs[1]


@pytest.mark.parametrize(
    "server, message",
    [
        ("satisfy some;", 'invalid value "some" in "satisfy" directive'),
        ("auth_basic_user_file $nope;", 'unknown "nope" variable'),
        ('auth_basic "a" "b";', 'invalid number of arguments in "auth_basic" directive'),
        ('location /x/ { if ($uri) { auth_basic "a"; } }', '"auth_basic" directive is not allowed here'),
    ],
)
def test_bad_auth_config_is_an_error_with_its_line(gannet, server, message):
    r = gannet.check(server=server)
    assert r.returncode != 0
    assert re.search(r"check\.conf:\d+: .*" + re.escape(message), r.stderr), r.stderr


VAR_CONF = PEER_MAIN + r"""
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        location / { auth_basic "team"; auth_basic_user_file {root}/../users_$arg_team; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_user_file_with_variables_as_nginx(tmp_path):
    """`auth_basic_user_file` with a variable: the file is chosen per request."""
    with side_by_side(tmp_path, VAR_CONF, {"f.txt": "in\n"}) as (srv, nginx_port):
        (srv.root.parent / "users_red").write_text("alice:{PLAIN}a\n")
        (srv.root.parent / "users_blue").write_text("bob:{PLAIN}b\n")
        cases = [(t, c) for t in ("red", "blue", "none", "") for c in (("alice", "a"), ("bob", "b"), None)]
        got = [(exchange(srv.port, request(f"/f.txt?team={t}", c)).status, exchange(nginx_port, request(f"/f.txt?team={t}", c)).status) for t, c in cases]
    assert [g for g, _ in got] == [n for _, n in got], list(zip(cases, got))
    assert [g for g, _ in got][:6] == [200, 401, 401, 401, 200, 401]
