"""Request routing as nginx does it: which virtual host answers (server_name forms and their
precedence, default_server), which location is chosen (=, prefix, ^~, regex order, nesting,
named and internal locations), the `return` and `rewrite` statements and the variables they
expand. Every location answers `return 200 "loc-NAME"` so the body names the winner.
"""

import re
import time

import pytest
import rawapps
from conftest import free_port
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side


def loc(name: str, match: str, extra: str = "") -> str:
    """A location that identifies itself in the body."""
    return f'location {match} {{ {extra} return 200 "loc-{name}"; }}\n'


def vhost(port: int, label: str, names: str, default: bool = False) -> str:
    """A server on the shared port answering `vh-<label>`."""
    flag = " default_server" if default else ""
    return f'server {{ listen 127.0.0.1:{port}{flag}; server_name {names}; return 200 "vh-{label}"; }}\n'


def start_vhosts(gannet, default: str | None = None, **names):
    """One server per keyword (label=server_name) on one port, before the harness's own
    server, which therefore only answers when it is the default; `default` names the label
    marked default_server."""
    port = free_port()
    blocks = "".join(vhost(port, label, n, default=(label == default)) for label, n in names.items())
    return gannet.start(http=blocks, server='server_name harness.invalid; return 200 "vh-harness";', port=port)


def body_for(srv, path: str = "/", host: str | None = None, headers: dict | None = None, method: str = "GET") -> str:
    """The body of a request that must be answered 200."""
    headers = dict(headers or {}, **({"Host": host} if host else {}))
    status, _, body = srv.request(method, path, headers)
    assert status == 200, (method, path, headers, status, body)
    return body.decode()


def poll_error_log(srv, needle: str, deadline: float = 5.0) -> str:
    """The error log once it contains `needle` (or at the deadline)."""
    end = time.monotonic() + deadline
    while needle not in srv.error_log() and time.monotonic() < end:
        time.sleep(0.02)
    return srv.error_log()


def raw_body(srv, request: bytes) -> bytes:
    head, _, body = srv.raw(request).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return body


# --- virtual hosts -----------------------------------------------------------------------


NAME_FORMS = dict(
    exact="www.example.com",
    leading="*.example.com",
    trailing="www.example.*",
    regex=r"~^api\d+\.example\.net$",
    named_regex=r"~^(?<sub>\w+)\.regex\.test$",
    dotted=".dot.test",
)


@pytest.mark.parametrize(
    "host, winner",
    [
        ("www.example.com", "exact"),
        ("a.example.com", "leading"),
        ("a.b.example.com", "leading"),
        ("www.example.org", "trailing"),
        ("api12.example.net", "regex"),
        ("shop.regex.test", "named_regex"),
        ("dot.test", "dotted"),
        ("x.dot.test", "dotted"),
        ("example.com", "exact"),  # `*.example.com` does not match it: the first server
    ],
)
def test_server_name_forms(gannet, host, winner):
    srv = start_vhosts(gannet, **NAME_FORMS)
    assert body_for(srv, host=host) == "vh-" + winner


PRECEDENCE = dict(
    regex_www=r"~^www\.",
    regex_full=r"~^www\.regex\.test$",
    trailing="www.example.*",
    leading="*.example.com",
    leading_long="*.deep.example.com",
    leading_net="*.example.net",
    exact="www.example.com",
)


@pytest.mark.parametrize(
    "host, winner",
    [
        ("www.example.com", "exact"),  # exact beats every wildcard and regex
        ("x.deep.example.com", "leading_long"),  # the longest leading wildcard, not the first
        ("www.example.net", "leading_net"),  # a leading wildcard beats a trailing one
        ("www.example.org", "trailing"),  # a trailing wildcard beats a regex
        ("www.regex.test", "regex_www"),  # regexes in config order: the first match wins
    ],
)
def test_server_name_precedence(gannet, host, winner):
    srv = start_vhosts(gannet, **PRECEDENCE)
    assert body_for(srv, host=host) == "vh-" + winner


def test_default_server_for_unknown_and_missing_host(gannet):
    srv = start_vhosts(gannet, default="chosen", first="first.test", chosen="chosen.test")
    assert body_for(srv, host="nobody.test") == "vh-chosen"
    assert raw_body(srv, b"GET / HTTP/1.0\r\n\r\n") == b"vh-chosen"


def test_first_server_is_default_without_default_server(gannet):
    srv = start_vhosts(gannet, first="first.test", second="second.test")
    assert body_for(srv, host="nobody.test") == "vh-first"


def test_host_with_port_upper_case_and_trailing_dot(gannet):
    srv = start_vhosts(gannet, first="first.test", www="www.example.com")
    assert body_for(srv, host="WWW.Example.COM:8080") == "vh-www"
    assert body_for(srv, host="www.example.com.") == "vh-www"


def test_absolute_form_target_beats_host_header(gannet):
    srv = start_vhosts(gannet, first="first.test", www="www.example.com")
    req = b"GET http://www.example.com/x HTTP/1.1\r\nHost: first.test\r\nConnection: close\r\n\r\n"
    assert raw_body(srv, req) == b"vh-www"


# --- locations ---------------------------------------------------------------------------

LOCATIONS = (
    loc("exact", "= /exact")
    + loc("exact-prefix", "/exact")
    + loc("a", "/a/")
    + loc("a-b", "/a/b/")
    + loc("static", "^~ /static/")
    + loc("img", "/img/")
    + loc("php-any", r"~ \.php$")
    + loc("php-x", r"~ ^/x/.*\.php$")
    + loc("jpg", r"~* \.jpg$")
    + loc("png", r"~ \.png$")
    + loc("css", r"~ \.css$")
    + 'location /n/ { return 200 "loc-n";\n'
    + "    " + loc("n-deep", "/n/deep/")
    + "    " + loc("n-txt", r"~ \.txt$")
    + "}\n"
    + loc("top-txt", r"~ \.txt$")
    + loc("root", "/")
)


@pytest.mark.parametrize(
    "path, winner",
    [
        ("/exact", "loc-exact"),
        ("/exact/more", "loc-exact-prefix"),
        ("/exactly", "loc-exact-prefix"),
        ("/a/x", "loc-a"),
        ("/a/b/c", "loc-a-b"),
        ("/static/site.css", "loc-static"),
        ("/other/site.css", "loc-css"),
        ("/x/a.php", "loc-php-any"),
        ("/photo.jpg", "loc-jpg"),
        ("/Photo.JpG", "loc-jpg"),
        ("/img/a.png", "loc-png"),
        ("/img/a.PNG", "loc-img"),
        ("/n/x", "loc-n"),
        ("/n/deep/x", "loc-n-deep"),
        ("/n/a.txt", "loc-n-txt"),
        ("/n/deep/a.txt", "loc-n-txt"),
        ("/elsewhere/a.txt", "loc-top-txt"),
        ("/nothing", "loc-root"),
    ],
)
def test_location_matching(gannet, path, winner):
    srv = gannet.start(server=LOCATIONS)
    assert body_for(srv, path) == winner


def test_named_location_only_via_try_files_and_error_page(gannet):
    srv = gannet.start(
        server=loc("named", "@fallback")
        + "location /tf/ { try_files $uri @fallback; }\n"
        + "location /ep/ { error_page 404 = @fallback; }\n"
        + "location /ep-keep/ { error_page 404 @fallback; }\n",
        files={"tf/real.txt": "real"},
    )
    assert body_for(srv, "/tf/real.txt") == "real"
    assert body_for(srv, "/tf/missing") == "loc-named"
    assert body_for(srv, "/ep/missing") == "loc-named"
    status, _, body = srv.get("/ep-keep/missing")
    assert (status, body) == (404, b"loc-named")
    status, _, body = srv.get("/@fallback")
    assert status == 404 and b"loc-named" not in body


def test_internal_location_is_404_when_requested_directly(gannet):
    srv = gannet.start(
        server=loc("int", "/int/", "internal;")
        + "location /go/ { error_page 404 = /int/page; }\n"
        + "location /tf/ { try_files $uri /int/tf; }\n"
    )
    status, _, body = srv.get("/int/page")
    assert status == 404 and b"<title>404 Not Found</title>" in body
    assert body_for(srv, "/go/missing") == "loc-int"
    assert body_for(srv, "/tf/missing") == "loc-int"


# --- return ------------------------------------------------------------------------------


def test_return_text_with_variables(gannet):
    srv = gannet.start(server='location /t { return 201 "uri=$uri args=$args"; }')
    status, h, body = srv.get("/text?k=v")
    assert (status, body) == (201, b"uri=/text args=k=v")
    assert h["content-type"] == "application/octet-stream"  # the default_type, as nginx
    assert h["content-length"] == str(len(body))


def test_return_301_relative_becomes_absolute_with_port(gannet):
    srv = gannet.start(server="location /old { return 301 /new/place; }")
    status, h, body = srv.get("/old", headers={"Host": "site.test"})
    assert status == 301
    assert h["location"] == f"http://site.test:{srv.port}/new/place"
    assert b"<title>301 Moved Permanently</title>" in body


def test_return_bare_url_is_302(gannet):
    srv = gannet.start(server="location /ext { return https://example.org/x?y=1; }")
    status, h, _ = srv.get("/ext")
    assert status == 302 and h["location"] == "https://example.org/x?y=1"


def test_return_404_gives_builtin_page(gannet):
    srv = gannet.start(server="location /gone { return 404; }")
    status, h, body = srv.get("/gone")
    assert status == 404 and h["content-type"] == "text/html"
    assert b"<title>404 Not Found</title>" in body and b"<h1>404 Not Found</h1>" in body


def test_return_444_closes_without_answer(gannet):
    srv = gannet.start(server="location /drop { return 444; }")
    assert srv.raw(b"GET /drop HTTP/1.1\r\nHost: x\r\n\r\n") == b""


# --- rewrite -----------------------------------------------------------------------------

REWRITES = r"""
    rewrite ^/srv/(.*)$ /new/srv-$1;
    location /srv/ { return 200 "loc-srv"; }
    location /new/ { return 200 "loc-new $uri"; }
    location = /show { return 200 "uri=$uri args=$args"; }
    location /files/ { return 200 "loc-files"; }
    location /old/ { rewrite ^/old/(\w+)/(\w+)$ /new/$2-$1 last; return 200 "loc-old"; }
    location /brk/ { rewrite ^/brk/(.*)$ /files/$1 break; return 200 "not-reached"; }
    location /r302/ { rewrite ^/r302/(.*)$ /target/$1 redirect; }
    location /r301/ { rewrite ^/r301/(.*)$ /target/$1 permanent; }
    location /rq/ { rewrite ^/rq/(.*)$ /target/$1? redirect; }
    location /args/ {
        rewrite ^/args/replace$ /show?a=1 last;
        rewrite ^/args/keep$ /show last;
        rewrite ^/args/drop$ /show? last;
        rewrite ^/args/only$ /show?a=1? last;
    }
    location /loop/ { rewrite ^/loop/(.*)$ /loop/$1 last; }
"""


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/old/one/two", "loc-new /new/two-one"),
        ("/srv/x", "loc-new /new/srv-x"),
        ("/args/replace?b=2", "uri=/show args=a=1&b=2"),
        ("/args/keep?b=2", "uri=/show args=b=2"),
        ("/args/drop?b=2", "uri=/show args="),
        ("/args/only?b=2", "uri=/show args=a=1"),
    ],
)
def test_rewrite_internal(gannet, path, expected):
    srv = gannet.start(server=REWRITES)
    assert body_for(srv, path) == expected


def test_rewrite_break_stays_in_location(gannet):
    srv = gannet.start(server=REWRITES, files={"files/doc.txt": "file-body"})
    assert body_for(srv, "/brk/doc.txt") == "file-body"


@pytest.mark.parametrize(
    "path, code, target",
    [
        ("/r302/a?q=1", 302, "/target/a?q=1"),
        ("/r301/b", 301, "/target/b"),
        ("/rq/c?q=1", 302, "/target/c"),
    ],
)
def test_rewrite_redirects(gannet, path, code, target):
    srv = gannet.start(server=REWRITES)
    status, h, _ = srv.get(path, headers={"Host": "site.test"})
    assert status == code
    assert h["location"] == f"http://site.test:{srv.port}{target}"


def test_rewrite_loop_ends_in_500(gannet):
    srv = gannet.start(server=REWRITES)
    status, _, body = srv.get("/loop/x")
    assert status == 500 and b"500 Internal Server Error" in body
    assert "rewrite or internal redirection cycle" in poll_error_log(srv, "redirection cycle")


# --- variables ---------------------------------------------------------------------------

VARS = (
    "uri=$uri|request_uri=$request_uri|args=$args|arg_a=$arg_a|host=$host|remote_addr=$remote_addr"
    "|scheme=$scheme|ua=$http_user_agent|method=$request_method|port=$server_port"
    "|root=$document_root|is_args=$is_args|c1=$1"
)


def test_variables_in_return_text(gannet):
    srv = gannet.start(server=rf'location ~ ^/vars/(\w+)$ {{ return 200 "{VARS}"; }}')
    got = body_for(srv, "/vars/a%62c?a=1&b=%20", headers={"Host": "Example.COM:123", "User-Agent": "probe/1.0"})
    assert dict(kv.split("=", 1) for kv in got.split("|")) == {
        "uri": "/vars/abc",
        "request_uri": "/vars/a%62c?a=1&b=%20",
        "args": "a=1&b=%20",
        "arg_a": "1",
        "host": "example.com",
        "remote_addr": "127.0.0.1",
        "scheme": "http",
        "ua": "probe/1.0",
        "method": "GET",
        "port": str(srv.port),
        "root": str(srv.root),
        "is_args": "?",
        "c1": "abc",
    }
    plain = body_for(srv, "/vars/x", host="h", method="POST")
    assert re.search(r"\|args=\|arg_a=\|host=h\|.*\|method=POST\|.*\|is_args=\|c1=x$", plain), plain



AUTO_REDIRECT_CONF = PEER_MAIN + r"""
http {
    server_tokens off;
    root {root};
    server {
        listen 127.0.0.1:{port};
        server_name main.test;

        location /px/ { proxy_pass http://127.0.0.1:APP; }
        location /fc/ { fastcgi_pass 127.0.0.1:APP; }
        location = /ex/ { proxy_pass http://127.0.0.1:APP; }
        location /both/ { proxy_pass http://127.0.0.1:APP; }
        location = /both { return 200 "exact both\n"; }
        location /named { return 200 "prefix named\n"; }
        location /named/ { proxy_pass http://127.0.0.1:APP; }
        location "/sp ace/" { proxy_pass http://127.0.0.1:APP; }
        location ~ ^/rx { return 200 "regex\n"; }
        location /rxp/ { proxy_pass http://127.0.0.1:APP; }
        location /st/ { }
        location /int/ { internal; proxy_pass http://127.0.0.1:APP; }
        location /outer/ { location /outer/in/ { proxy_pass http://127.0.0.1:APP; } }
        location /ifp/ { if ($arg_x) { proxy_pass http://127.0.0.1:APP; } }
        location /lim/ { client_max_body_size 1; proxy_pass http://127.0.0.1:APP; }
        location /sub/ { proxy_pass http://127.0.0.1:APP; }
        location = /go { rewrite ^ /sub last; }
        location /ep/ { error_page 301 =200 /st/page.txt; proxy_pass http://127.0.0.1:APP; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_slash_location_of_an_application_redirects_its_name_without_slash(tmp_path):
    """nginx's auto_redirect: `location /grafana/ { proxy_pass ...; }` answers `/grafana` with
    a 301 to `/grafana/` (arguments kept), before regexes, unless a location is named
    `/grafana` itself; only for the pass directives in the location's own block."""
    app = rawapps.HttpApp(lambda conn, head, body: conn.sendall(rawapps.http_answer(b"app\n")))
    try:
        conf = AUTO_REDIRECT_CONF.replace("APP", str(app.port))
        paths = ["/px", "/px?a=1&b=%20", "/px/", "/fc", "/ex", "/both", "/named", "/sp%20ace", "/rxp", "/rx",
                 "/st", "/int", "/outer/in", "/ifp", "/ifp?x=1", "/go", "/ep", "/pxx"]  # fmt: skip
        sent = [f"GET {p} HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n".encode() for p in paths]
        sent.append(b"HEAD /px HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n")
        sent.append(b"POST /lim HTTP/1.1\r\nHost: main.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        with side_by_side(tmp_path, conf, {"st/page.txt": "page\n"}) as (srv, nginx_port):
            answers = [(exchange(nginx_port, r), exchange(srv.port, r)) for r in sent]
    finally:
        app.close()

    def view(a, port):
        body = a.body.replace(b"<center>gannet</center>", b"<center>nginx</center>")
        return a.status, (a.headers.get("location") or "").replace(f":{port}/", ":PORT/"), body

    names = [r.split(b" HTTP")[0].decode() for r in sent]
    diffs = [f"{name}: nginx {view(n, nginx_port)}, gannet {view(g, srv.port)}"
             for name, (n, g) in zip(names, answers) if view(n, nginx_port) != view(g, srv.port)]  # fmt: skip
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
    got = dict(zip(names, (g for _, g in answers)))
    assert got["GET /px?a=1&b=%20"].status == 301
    assert got["GET /px?a=1&b=%20"].headers["location"] == f"http://main.test:{srv.port}/px/?a=1&b=%20"
    assert got["GET /sp%20ace"].headers["location"] == f"http://main.test:{srv.port}/sp%20ace/"
    assert got["GET /both"].body == b"exact both\n" and got["GET /rx"].body == b"regex\n"
