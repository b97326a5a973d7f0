"""Upstream answers and client addresses where gannet once answered differently from nginx,
checked side by side with Debian's nginx on the same config:

- `geo` without an address variable for a `listen unix:` client: no address, so the
  255.255.255.255 entry (or the default) applies, for net and `ranges` tables alike;
- `proxy_redirect` whose first argument holds variables;
- "no live upstreams": nginx lists the group's name in `$upstream_addr`, after the servers
  that were tried;
- `proxy_pass_header Server`/`Date`: the server's fields replace ours, and none is sent
  when the server sent none;
- an `X-Accel-Limit-Rate` given with an `X-Accel-Redirect` is the redirected request's
  rate, over the new location's `limit_rate`;
- an SCGI answer to HEAD is cached only if its body is as long as its Content-Length;
- the Location of a `/dir/` location's auto redirect is escaped as nginx 1.22 escapes URIs;
- `merge_slashes off`, from the default server of the address;
- `$upstream_response_time` is `-` for the answer being passed on (`add_header`), and a
  `down` server is not counted as a server to try.
"""

from __future__ import annotations

import re
import signal

import pytest

import rawapps
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")

GEO = PEER_MAIN + r"""
http {
    access_log off;
    root {root};
    geo $g { default default; 255.255.255.255 none; }
    geo $gr { ranges; 0.0.0.0-255.255.255.254 low; default none; }
    geo $remote_addr $ga { default default; 255.255.255.255 none; }
    server {
        listen unix:{tmp}/geo.sock;
        location / { return 200 "g=$g gr=$gr ga=$ga\n"; }
    }
    server {
        listen 127.0.0.1:{port};
        location / { proxy_pass http://unix:{tmp}/geo.sock; }
        location /tcp { return 200 "g=$g gr=$gr ga=$ga\n"; }
    }
}
"""


def test_geo_of_unix_client_is_the_no_address_entry(tmp_path):
    def ask(port):
        return [exchange(port, f"GET {u} HTTP/1.0\r\n\r\n".encode()).body for u in ("/", "/tcp")]

    with side_by_side(tmp_path, GEO) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    assert got == [b"g=none gr=none ga=none\n", b"g=default gr=low ga=default\n"]


REDIRECT = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location / {
            set $part var_here;
            proxy_pass http://127.0.0.1:{port}/answer;
            proxy_redirect http://127.0.0.1:{port}/$part/ /replaced/;
        }
        location /answer {
            add_header Refresh "7; url=http://127.0.0.1:{port}/$arg_to/page.html";
            return 302 http://127.0.0.1:{port}/$arg_to/page.html;
        }
    }
}
"""


def test_proxy_redirect_with_variables_in_the_first_argument(tmp_path):
    def ask(port):
        out = []
        for to in ("var_here", "elsewhere"):
            a = exchange(port, f"GET /x?to={to} HTTP/1.0\r\n\r\n".encode())
            out.append((a.status, a.headers.get("location", "").replace(str(port), "P"),
                        a.headers.get("refresh", "").replace(str(port), "P")))  # fmt: skip
        return out

    with side_by_side(tmp_path, REDIRECT) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    assert got[0] == (302, "http://127.0.0.1:P/replaced/page.html", "7; url=/replaced/page.html")
    assert got[1][1] == "http://127.0.0.1:P/elsewhere/page.html"


NO_LIVE = PEER_MAIN + r"""
http {
    access_log off;
    upstream bad {
        server 127.0.0.1:{port};
        server 127.0.0.1:1;
    }
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://bad/closes;
            add_header X-Addr $upstream_addr always;
            add_header X-Status $upstream_status always;
        }
        location /closes { return 444; }
    }
}
"""


def test_no_live_upstreams_names_the_group(tmp_path):
    def ask(port):
        out = []
        for _ in range(2):
            a = exchange(port, b"GET / HTTP/1.0\r\n\r\n")
            addr = re.sub(rf":{port}\b", ":P", a.headers.get("x-addr", ""))
            out.append((a.status, addr, a.headers.get("x-status")))
        return out

    with side_by_side(tmp_path, NO_LIVE) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    # Both servers failed the first time (and are down for fail_timeout): the second
    # request has no server to try.
    assert got[1] == (502, "bad", "502")


@pytest.fixture
def app():
    yield from rawapps.made(rawapps.HttpApp)


PASS_DATE = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location / {
            proxy_pass http://127.0.0.1:APP;
            proxy_pass_header Date;
            proxy_pass_header Server;
        }
        location /date-only/ {
            proxy_pass http://127.0.0.1:APP;
            proxy_pass_header Date;
        }
        location /plain/ { proxy_pass http://127.0.0.1:APP; }
    }
}
"""


def test_passed_server_and_date_replace_our_own(tmp_path, app):
    def behave(conn, head, body):
        with_them = b" /with" in head or b"/with " in head
        extra = "Date: passed-date\r\nServer: passed-server\r\n" if with_them else ""
        conn.sendall(rawapps.http_answer(b"ok", headers=extra, keep=False))

    backend = app(behave)
    conf = PASS_DATE.replace("APP", str(backend.port))

    def fields(raw):
        head = raw.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")[1:]
        out = [line.split(":", 1) for line in head]
        # Our own Date is the time: only that one is there matters.
        return sorted((n.lower(), v.strip() if "passed" in v else "own") for n, v in out
                      if n.lower() in ("date", "server"))  # fmt: skip

    uris = ["/with", "/none", "/date-only/with", "/date-only/none", "/plain/with"]

    def ask(port):
        return [fields(exchange(port, f"GET {u} HTTP/1.0\r\n\r\n".encode()).raw) for u in uris]

    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    assert got[0] == [("date", "passed-date"), ("server", "passed-server")]
    assert got[1] == []
    assert got[3] == [("server", "own")]
    assert got[4] == [("date", "own"), ("server", "own")]


ACCEL_RATE = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        location /proxy/ { proxy_pass http://127.0.0.1:{port}/; }
        location /data {
            add_header X-Accel-Redirect /redirect;
            add_header X-Accel-Limit-Rate $arg_xal;
            return 204;
        }
        location /redirect {
            limit_rate 0;
            return 200 "rate=$limit_rate\n";
        }
    }
}
"""


def test_accel_limit_rate_outlives_accel_redirect(tmp_path):
    def ask(port):
        return [exchange(port, f"GET /proxy/data{q} HTTP/1.0\r\n\r\n".encode()).body for q in ("?xal=13000", "")]

    with side_by_side(tmp_path, ACCEL_RATE) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    assert got[0] == b"rate=13000\n"


class ScgiApp(rawapps.Listener):
    """An SCGI application: to HEAD, the answer its path names (a body that is short of
    or longer than its Content-Length); to GET, a fresh `FRESH` (so a GET answered from
    a cache entry shows what the entry kept)."""

    ANSWERS = {
        "/extra": b"Content-Length: 8\r\n\r\nSEE-THIS-BUT-NOT-THIS",
        "/short": b"Content-Length: 100\r\n\r\nSEE-THIS",
        "/empty": b"Content-Length: 8\r\n\r\n",
        "/matching": b"Content-Length: 8\r\n\r\nSEE-THIS",
    }

    def serve(self, conn):
        buf = b""
        while b":" not in buf or len(buf) < buf.index(b":") + 1 + int(buf[: buf.index(b":")]) + 1:
            got = conn.recv(65536)
            if not got:
                return
            buf += got
        n = int(buf[: buf.index(b":")])
        fields = buf[buf.index(b":") + 1 :][:n].split(b"\0")
        env = dict(zip(fields[::2], fields[1::2]))
        uri = env.get(b"REQUEST_URI", b"").decode()
        if env.get(b"REQUEST_METHOD") == b"HEAD":
            answer = self.ANSWERS.get(uri, b"Content-Length: 0\r\n\r\n")
        else:
            answer = b"Content-Length: 5\r\n\r\nFRESH"
        conn.sendall(b"Status: 200 OK\r\nContent-Type: text/plain\r\n" + answer)


@pytest.fixture
def scgi():
    yield from rawapps.made(ScgiApp)


HEAD_CACHE = PEER_MAIN + r"""
http {
    access_log off;
    scgi_cache_path {tmp}/cache keys_zone=one:1m;
    server {
        listen 127.0.0.1:{port};
        location / {
            scgi_pass 127.0.0.1:APP;
            scgi_param REQUEST_URI $request_uri;
            scgi_param REQUEST_METHOD $request_method;
            scgi_cache one;
            scgi_cache_key $request_uri;
            scgi_cache_valid any 1m;
        }
    }
}
"""


def test_head_answer_cached_only_whole_and_no_longer_than_its_length(tmp_path, scgi):
    app = scgi()
    conf = HEAD_CACHE.replace("APP", str(app.port))
    uris = list(ScgiApp.ANSWERS)

    def ask(port):
        heads = [exchange(port, f"HEAD {u} HTTP/1.0\r\n\r\n".encode()).status for u in uris]
        return heads, [exchange(port, f"GET {u} HTTP/1.0\r\n\r\n".encode()).body for u in uris]

    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    # Only the answer whose body matched its length was kept for the GET.
    assert got == ([200] * 4, [b"FRESH", b"FRESH", b"FRESH", b"SEE-THIS"])


AUTO = PEER_MAIN + r"""
http {
    access_log off;
    absolute_redirect off;
    server {
        listen 127.0.0.1:{port};
        location '/auto "#%<>?\^`{|}/' { proxy_pass http://127.0.0.1:{port}/x; }
        location /x { return 204; }
    }
}
"""


def test_auto_redirect_location_escapes_as_nginx(tmp_path):
    # The location's name, escaped as nginx 1.22's NGX_ESCAPE_URI (RFC 3986's unsafe set).
    target = "/auto%20%22%23%25%3C%3E%3F%5C%5E%60%7B%7C%7D"

    def ask(port):
        a = exchange(port, f"GET {target}?a=b HTTP/1.0\r\n\r\n".encode())
        return a.status, a.headers.get("location")

    with side_by_side(tmp_path, AUTO) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    assert got == (301, target + "/?a=b")


UNMERGED = PEER_MAIN + r"""
http {
    access_log off;
    server {
        listen 127.0.0.1:{port};
        merge_slashes off;
        location / { return 200 "uri=$uri\n"; }
        location /a//b { return 200 "double uri=$uri\n"; }
    }
    server {
        listen 127.0.0.1:{port};
        server_name merged;
        merge_slashes on;
        location / { return 200 "merged uri=$uri\n"; }
    }
}
"""


def test_merge_slashes_off_keeps_empty_segments(tmp_path):
    reqs = [("/foo//../bar", "x"), ("/foo///../bar", "x"), ("/a//b", "x"), ("//x//", "x"),
            ("/a//b", "merged")]  # fmt: skip

    def ask(port):
        return [exchange(port, f"GET {u} HTTP/1.0\r\nHost: {h}\r\n\r\n".encode()).body for u, h in reqs]

    with side_by_side(tmp_path, UNMERGED) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
    assert got == want
    # The second server is chosen after the URI was parsed with the default server's setting.
    assert got == [b"uri=/foo/bar\n", b"uri=/foo//bar\n", b"double uri=/a//b\n", b"uri=//x//\n", b"merged uri=/a//b\n"]


TIMES = PEER_MAIN + r"""
http {
    log_format t "$upstream_response_time";
    upstream with_down {
        server 127.0.0.1:{port};
        server 127.0.0.1:1 down;
    }
    server {
        listen 127.0.0.1:{port};
        location /t {
            access_log {tmp}/t.log t;
            proxy_pass http://127.0.0.1:{port}/answer;
            add_header X-RT $upstream_response_time;
        }
        location /answer { access_log off; return 200 "ok"; }
        location /down {
            access_log off;
            proxy_pass http://with_down/missing;
            proxy_next_upstream http_404;
        }
        location /missing { access_log off; return 404; }
    }
}
"""


def test_response_time_and_tries_as_nginx(tmp_path):
    def ask(port):
        t = exchange(port, b"GET /t HTTP/1.0\r\n\r\n")
        d = exchange(port, b"GET /down HTTP/1.0\r\n\r\n")
        return t.headers.get("x-rt"), d.status

    with side_by_side(tmp_path, TIMES) as (srv, nginx_port):
        got, want = ask(srv.port), ask(nginx_port)
        srv.stop(signal.SIGQUIT)
    assert got == want
    # While the answer is passed on its time is not known yet; a `down` server is no try,
    # so the one server's 404 is the answer (not "no live upstreams").
    assert got == ("-", 404)
    for side in ("gannet", "nginx"):
        assert re.fullmatch(r"\d+\.\d{3}\n", (tmp_path / side / "t.log").read_text()), side
