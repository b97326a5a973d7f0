"""Variables of the response in its header filter, against Debian's nginx: the common
`map $sent_http_content_type $cache_control {...}` + `add_header Cache-Control $cache_control`
pattern picks its branch from the type being sent, `expires $var` takes what the variable
says (epoch, max, off, times, @time, `modified`), and each `add_header` sees the headers
set before it.
"""

from __future__ import annotations

import os
from email.utils import parsedate_to_datetime

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

CONF = PEER_MAIN + r"""
http {
    include {repo}/conf/mime.types;
    default_type application/octet-stream;
    map $sent_http_content_type $cache_control {
        default "no-store";
        ~image/ "max-age=86400";
        text/css "public";
    }
    map $sent_http_content_type $expires {
        default off;
        text/html epoch;
        text/css max;
        ~image/ 1h;
        text/plain -1;
        application/json @3h30m;
        application/javascript "not a time";
        application/xml 0;
    }
    map $uri $modexp {
        default +1d;
        ~past -1h;
        ~zero 0;
    }
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /m/ {
            add_header Cache-Control $cache_control;
            expires $expires;
            add_header X-Type $sent_http_content_type;
            add_header X-Seen "$sent_http_x_type|$sent_http_expires";
        }
        location /cc/ { expires 1h; add_header X-CC $sent_http_cache_control; }
        location /mod/ { expires modified $modexp; }
        location /daily/ { expires @23h59m; }
        location = /ret { default_type text/plain; add_header X-Type "[$sent_http_content_type] $status"; return 200 "r\n"; }
        location = /redir { add_header X-Loc $sent_http_location; return 302 /elsewhere; }
    }
}
"""

MTIME = 1704164645  # fixed, so `expires modified` gives known dates
FILES = {name: "x\n" for name in (
    "m/a.html", "m/b.css", "m/c.png", "m/d.txt", "m/e.json", "m/f.js", "m/g.xml", "m/h.bin",
    "cc/a.txt", "mod/a.txt", "mod/past.txt", "mod/zero.txt", "daily/a.txt",
)}  # fmt: skip
PATHS = ["/m/a.html", "/m/b.css", "/m/c.png", "/m/d.txt", "/m/e.json", "/m/f.js", "/m/g.xml", "/m/h.bin",
         "/m/missing.png", "/cc/a.txt", "/mod/a.txt", "/mod/past.txt", "/mod/zero.txt", "/daily/a.txt",
         "/ret", "/redir"]  # fmt: skip
DAILY = {"/daily/a.txt", "/m/e.json"}  # `@time`: a fixed moment, max-age counting down to it
SHOWN = ["content-type", "cache-control", "x-type", "x-seen", "x-cc", "x-loc"]


def seconds(date: str) -> int:
    return int(parsedate_to_datetime(date).timestamp())


def view(port: int, path: str) -> dict:
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n".encode())
    out = {"status": a.status} | {h: a.headers.get(h) for h in SHOWN}
    out["x-loc"] = (out["x-loc"] or "").replace(f":{port}", ":PORT")
    exp = a.headers.get("expires")
    if exp is None:
        out["expires"] = None
    elif abs(seconds(exp) - seconds(a.headers["date"])) <= 2 * 86400 and path not in DAILY:
        # Relative to now: as an offset from the answer's Date, which both servers read from
        # their own clocks a moment apart.
        out["expires"] = f"Date{seconds(exp) - seconds(a.headers['date']):+d}"
    else:
        out["expires"] = exp
    if path in DAILY:
        # max-age counts down from the moment of the answer: check it against Date and
        # Expires instead of the other server.
        cc = out["cache-control"]
        if cc.startswith("max-age="):
            left = seconds(exp) - seconds(a.headers["date"])
            age, sep, rest = cc[8:].partition(",")
            assert abs(int(age) - left) <= 1, (path, cc, exp, a.headers["date"])
            out["cache-control"] = "max-age=LEFT" + sep + rest
    return out


def test_header_filter_variables_match_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        for dirpath, dirs, files in os.walk(srv.root):
            for name in dirs + files:
                os.utime(os.path.join(dirpath, name), (MTIME, MTIME))
        diffs = []
        seen = {}
        for path in PATHS:
            n, g = view(nginx_port, path), view(srv.port, path)
            seen[path] = n
            for key in n:
                if n[key] != g[key]:
                    diffs.append(f"{path}: {key}: nginx {n[key]!r}, gannet {g[key]!r}")
        assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
    # Not vacuous: the map took branches other than its default.
    assert seen["/m/c.png"]["cache-control"] == "max-age=3600, max-age=86400"  # expires, then add_header
    assert seen["/m/a.html"]["cache-control"] == "no-cache, no-store"
    assert seen["/m/h.bin"]["cache-control"] == "no-store"
    assert seen["/m/e.json"]["expires"] and seen["/m/e.json"]["expires"].endswith("GMT")
