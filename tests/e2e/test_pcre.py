"""Regexes are PCRE2's, as in nginx: the constructs the Rust `regex` crate refused
(lookarounds, backreferences, possessive quantifiers, atomic groups, `\\Q..\\E`) load and
match in location, rewrite, if, map and server_name; named captures in every spelling set
variables; `~*` folds case; a URI holding bytes that are not UTF-8 matches without harm; a
bad regex is refused at `gannet -t` with nginx's words. The same config runs on Debian's
nginx and must give the same answers.
"""

from __future__ import annotations

import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    default_type text/plain;
    access_log off;

    map $http_x_key $mapped {
        default none;
        ~^(?<head>a)(?=b) "lookahead-$head";
        ~*^Q\Qx.y\E$ quoted;
        ~^(\d)\1$ "double-$1";
        ~^\xff(.)$ "bytes";
        ~^\xef(.)\xbd$ "replaced";
    }

    server {
        listen 127.0.0.1:{port} default_server;
        server_name main.test;

        location / { return 200 "prefix\n"; }
        # Laravel's and many hardening guides' rule: dot-files, but not /.well-known.
        location ~ /\.(?!well-known) { return 403; }
        location ~ ^/dup/(\w+)/\1$ { return 200 "dup $1\n"; }
        location ~ ^/pos/a++b$ { return 200 "possessive\n"; }
        location ~ ^/atomic/(?>a+)ab$ { return 200 "atomic\n"; }
        location ~ ^/q/\Q(a+b)\E$ { return 200 "quoted\n"; }
        location ~* \.JPG$ { return 200 "image\n"; }
        location ~ ^/n/(?<a>\w+)/(?P<b>\w+)/(?'c'\w+)$ { return 200 "a=$a b=$b c=$c 1=$1 3=$3\n"; }
        location ~ ^/bytes/(.)(.)$ { return 200 "two bytes\n"; }
        location /rw/ {
            rewrite ^/rw/(?<word>[a-z]++)(?!\d) /done/$word last;
        }
        location /done/ { return 200 "done $uri word=$word\n"; }
        location /if/ {
            if ($arg_v ~ ^(\w)\1$) { return 200 "if double $1\n"; }
            if ($arg_v ~* ^(?<up>X)\Q.*\E$) { return 200 "if caseless $up\n"; }
            if ($arg_v !~ ^\d++$) { return 200 "if not digits\n"; }
            return 200 "if digits\n";
        }
        location /map/ { return 200 "map $mapped\n"; }
        # Catastrophic backtracking: PCRE2's match limit ends it, and nginx answers 500.
        location ~ ^/redos/(a+)+$ { return 200 "never\n"; }
    }
    server {
        listen 127.0.0.1:{port};
        # Not lowercased: \D stays "not a digit".
        server_name ~^(?!www\.)(?<sub>\D+)\.example\.test$;
        location / { return 200 "sub=$sub 1=$1 host=$host\n"; }
    }
    server {
        listen 127.0.0.1:{port};
        # An upper-case letter makes a server_name regex caseless, as nginx.
        server_name ~^CASE\d+\.test$;
        location / { return 200 "caseless name\n"; }
    }
}
"""

# (request target, Host, expected status, expected body)
CASES = [
    ("/.git/config", "main.test", 403, None),
    ("/.env", "main.test", 403, None),
    ("/.well-known/acme-challenge/t", "main.test", 200, b"prefix\n"),
    ("/dup/ab/ab", "main.test", 200, b"dup ab\n"),
    ("/dup/ab/ac", "main.test", 200, b"prefix\n"),
    ("/pos/aaab", "main.test", 200, b"possessive\n"),
    # `(?>a+)` keeps every a: nothing is left for the literal `a`.
    ("/atomic/aaab", "main.test", 200, b"prefix\n"),
    ("/q/(a+b)", "main.test", 200, b"quoted\n"),
    ("/q/aab", "main.test", 200, b"prefix\n"),
    ("/photo.jpg", "main.test", 200, b"image\n"),
    ("/photo.Jpg", "main.test", 200, b"image\n"),
    ("/n/x/y/z", "main.test", 200, b"a=x b=y c=z 1=x 3=z\n"),
    ("/bytes/%C3%A9", "main.test", 200, b"two bytes\n"),
    ("/rw/hello", "main.test", 200, b"done /done/hello word=hello\n"),
    ("/rw/hello1", "main.test", 404, None),
    ("/if/?v=qq", "main.test", 200, b"if double q\n"),
    ("/if/?v=x.*", "main.test", 200, b"if caseless x\n"),
    ("/if/?v=12", "main.test", 200, b"if digits\n"),
    ("/if/?v=1a", "main.test", 200, b"if not digits\n"),
    ("/map/", "main.test", 200, b"map none\n"),
    ("/map/", "main.test", 200, b"map lookahead-a\n", {"X-Key": "abc"}),
    ("/map/", "main.test", 200, b"map none\n", {"X-Key": "ac"}),
    ("/map/", "main.test", 200, b"map quoted\n", {"X-Key": "qx.y"}),
    ("/map/", "main.test", 200, b"map none\n", {"X-Key": "qxzy"}),
    ("/map/", "main.test", 200, b"map double-7\n", {"X-Key": "77"}),
    ("/", "shop.example.test", 200, b"sub=shop 1=shop host=shop.example.test\n"),
    ("/", "www.example.test", 200, b"prefix\n"),
    ("/", "shop1.example.test", 200, b"prefix\n"),
    ("/", "case12.test", 200, b"caseless name\n"),
    ("/redos/" + "a" * 40 + "b", "main.test", 500, None),
]


# Known differences, not compared with nginx: gannet's variables are text, so header bytes
# that are not UTF-8 reach a regex as U+FFFD (EF BF BD), where nginx matches the raw bytes
# (nginx answers "map bytes" here). What gannet must do is answer, not fail.
GANNET_ONLY = [
    ("/map/", "main.test", 200, b"map replaced\n", {"X-Key": "\xff"}),
]


def request(target: str, host: str, headers: dict | None = None) -> bytes:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode("latin-1")


def cases(extra=()):
    for c in [*CASES, *extra]:
        target, host, status, body, *rest = c
        yield target, host, status, body, (rest[0] if rest else None)


def test_pcre_constructs_everywhere_nginx_uses_pcre(gannet):
    srv = gannet.start(conf=CONF)
    wrong = []
    for target, host, status, body, headers in cases(GANNET_ONLY):
        a = exchange(srv.port, request(target, host, headers))
        if a.status != status or (body is not None and a.body != body):
            wrong.append((target, host, headers, a.status, a.body))
    assert not wrong, wrong
    # Only the one pattern built to fail did.
    assert srv.error_log().count("pcre2_match() failed") == 1


def test_a_match_pcre_cannot_finish_is_500_and_an_alert(gannet):
    srv = gannet.start(conf=CONF)
    target = "/redos/" + "a" * 40 + "b"
    assert exchange(srv.port, request(target, "main.test")).status == 500
    assert f'pcre2_match() failed: -47 on "{target}" using "^/redos/(a+)+$"' in srv.error_log()
    # The worker is unharmed.
    assert exchange(srv.port, request("/dup/x/x", "main.test")).body == b"dup x\n"


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_same_answers_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        diffs = []
        for target, host, _, _, headers in cases():
            req = request(target, host, headers)
            g, n = exchange(srv.port, req), exchange(nginx_port, req)
            if (g.status, g.body if g.status == 200 else b"") != (n.status, n.body if n.status == 200 else b""):
                diffs.append((target, host, headers, (g.status, g.body), (n.status, n.body)))
        assert not diffs, diffs


@pytest.mark.parametrize(
    "http, message",
    [
        ("server { location ~ ( { } }", 'pcre2_compile() failed: missing closing parenthesis in "("'),
        ("server { location ~ [z-a] { } }", 'pcre2_compile() failed: range out of order in character class in "[z-a]" at "a]"'),
        ('server { rewrite "a{2,1}" /x; }', 'pcre2_compile() failed: numbers out of order in {} quantifier in "a{2,1}" at "}"'),
        ('map $uri $m { "~(?<n>x" 1; }', 'pcre2_compile() failed: missing closing parenthesis in "(?<n>x"'),
        ("server { server_name ~^(a; }", 'pcre2_compile() failed: missing closing parenthesis in "^(a"'),
    ],
)
def test_bad_regex_is_refused_as_nginx_words_it(tmp_path, gannet, http, message):
    if NGINX is None:
        r = gannet.check(http=http)
        assert r.returncode != 0
        assert message in r.stderr, r.stderr
        return
    n, g = check_both(tmp_path, http)
    assert n.returncode != 0 and g.returncode != 0
    assert f"{message} in {tmp_path}/check.conf:" in n.stderr, n.stderr
    # gannet's form is FILE:LINE: MESSAGE; the line is nginx's.
    line = re.search(re.escape(f"{tmp_path}/check.conf:") + r"(\d+)", n.stderr).group(1)
    assert f"check.conf:{line}: {message}" in g.stderr, g.stderr
