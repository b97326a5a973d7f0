"""Differential tests: Debian's nginx and gannet run the SAME config (only the listen port and
the pid/log paths differ) over one shared document root, get the same raw requests, and must
give the same answers and the same access-log lines.

Known, intended differences are normalised away, and only those: the server's name in the
built-in error pages (`<center>gannet</center>` vs `<center>nginx</center>`, which also
shifts Content-Length and the logged byte count), the multipart boundary, the port in
Location, the dates of autoindex entries and of log lines. Every other difference is
collected and reported at once.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from email.utils import formatdate

import pytest

from conftest import Gannet, free_port
from nginx_peer import PEER_MAIN, Answer, NginxPeer, exchange

CONF = PEER_MAIN + r"""
http {
    include {repo}/conf/mime.types;
    default_type application/octet-stream;
    access_log {tmp}/access.log;
    server_tokens off;

    map $http_x_kind $kind {
        default other;
        alpha first;
        ~^b(?<rest>.*)$ b-$rest;
        ~*^C(\d+)$ c$1;
        "" none;
    }
    map $host $host_class {
        hostnames;
        main.test main;
        .unknown.test unknown;
        default plain;
    }

    server {
        listen 127.0.0.1:{port} default_server;
        server_name main.test;
        root {root};
        index index.html;

        location /auto/ { autoindex on; }
        location /tf/ { try_files $uri $uri.html /tf/fallback.txt; }
        # `$uri/` on a directory named without its slash: the static module's 301 to it.
        location /tfd/ { try_files $uri $uri/ =404; }
        location /tfa/ { try_files $uri $uri/ =404; absolute_redirect off; }
        location /tfp/ { try_files $uri $uri/ /tf/fallback.txt; port_in_redirect off; }
        location /ep/ { error_page 404 /404.html; }
        location /ep200/ { error_page 404 =200 /404.html; }
        location = /ret { return 200 "ret uri=$uri args=$args host=$host\n"; }
        location /rw/ { rewrite ^/rw/(.*)$ /$1 last; }
        location /perm/ { rewrite ^/perm/(.*)$ /$1 permanent; }
        location /hdr/ { add_header X-Test yes; add_header X-Always on always; expires 1h; }
        location /exp-max/ { expires max; }
        location /exp-epoch/ { expires epoch; }
        location /exp-neg/ { expires -1; }
        location /set/ { set $a "A:$uri"; set $b "$a|$arg_x"; return 200 "a=$a b=$b\n"; }
        location /map/ { return 200 "kind=$kind class=$host_class\n"; }
        location /args/ { set $args "n=1&$args"; return 200 "args=$args n=$arg_n\n"; }
        location ~ ^/loc/(?<first>[^/]+)/(.*)$ { return 200 "first=$first rest=$2\n"; }
        location /named/ { rewrite ^/named/(?<word>\w+)$ /ret?w=$word last; }
        # A regex location without groups clears a rewrite's captures; a prefix one keeps them.
        location /cap/ { rewrite ^/cap/(\w+)/(.*)$ /$2 last; }
        location ~ \.cl$ { return 200 "cl [$1]\n"; }
        location /kept/ { return 200 "kept [$1]\n"; }
        location /if/ {
            add_header X-If location;
            if ($arg_r = 1) { return 403; }
            if ($arg_v ~* ^(x)(?<num>\d+)$) { set $m "$1-$num"; }
            if (-f $request_filename) { add_header X-If file; }
            if (!-e $request_filename) { return 200 "missing m=$m\n"; }
        }
    }
    server {
        listen 127.0.0.1:{port};
        server_name other.test *.wild.test;
        root {root}/other;
    }
}
"""

MTIME = 1704164645  # 2024-01-02 03:04:05 GMT: fixed, so validators are known in advance
BIG = bytes(range(256)) * 4  # 1024 bytes for ranges
FILES = {
    "index.html": "<h1>home</h1>\n",
    "a.txt": "hello text\n",
    "a b.txt": "space\n",
    "style.css": "body { color: red; }\n",
    "app.js": "console.log(1);\n",
    "data.json": '{"k": 1}\n',
    "pic.png": b"\x89PNG\r\n\x1a\n" + bytes(40),
    "noext": "no extension\n",
    "file.weird": "unknown type\n",
    "big.bin": BIG,
    "404.html": "<p>custom 404</p>\n",
    "dir/index.html": "<p>dir index</p>\n",
    "dir/page.html": "<p>page</p>\n",
    "auto/x.txt": "x\n",
    "auto/long-name-" + "n" * 60 + ".txt": "long\n",
    "auto/.hidden": "h\n",
    "auto/sub/y.txt": "yy\n",
    "noindex/f.txt": "f\n",
    "tf/page.html": "<p>tf page</p>\n",
    "tf/fallback.txt": "fallback\n",
    "tfd/sub/index.html": "<p>tfd sub</p>\n",
    "tfd/noidx/f.txt": "f\n",
    "tfd/file.txt": "file\n",
    "tfa/sub/index.html": "<p>tfa sub</p>\n",
    "tfp/sub/index.html": "<p>tfp sub</p>\n",
    "hdr/h.txt": "with headers\n",
    "exp-max/m.txt": "m\n",
    "exp-epoch/e.txt": "e\n",
    "exp-neg/n.txt": "n\n",
    "other/index.html": "<p>other host</p>\n",
    "if/present.txt": "present\n",
}

ETAG_BIG = f'"{MTIME:x}-{len(BIG):x}"'
LM = formatdate(MTIME, usegmt=True)
OLD = formatdate(MTIME - 86400, usegmt=True)


def req(target: str, method: str = "GET", host: str | None = "main.test", version: str = "HTTP/1.1", **headers) -> bytes:
    """A raw request with Connection: close; keyword headers use `_` for `-`."""
    lines = [f"{method} {target} {version}"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    lines += ["Connection: close", "", ""]
    return "\r\n".join(lines).encode()


REQUESTS = [
    # files of several types, index, HEAD, methods
    req("/"),
    req("/index.html", Referer="http://ref.test/"),
    req("/a.txt"),
    req("/style.css"),
    req("/app.js"),
    req("/data.json"),
    req("/pic.png"),
    req("/noext"),
    req("/file.weird"),
    req("/big.bin"),
    req("/a.txt", "HEAD"),
    req("/a.txt", version="HTTP/1.0"),
    req("/a.txt", "POST", Content_Length="0"),
    # directories
    req("/dir"),
    req("/dir?q=1"),
    req("/dir/"),
    req("/auto/"),
    req("/auto/sub/"),
    req("/auto"),
    req("/noindex/"),
    req("/missing.txt"),
    req("/nodir/missing/"),
    # ranges
    req("/big.bin", Range="bytes=0-9"),
    req("/big.bin", Range="bytes=-5"),
    req("/big.bin", Range="bytes=1000-"),
    req("/big.bin", Range="bytes=0-1,5-6"),
    req("/big.bin", Range="bytes=5000-"),
    req("/big.bin", Range="bytes=abc"),
    # conditionals
    req("/big.bin", If_None_Match=ETAG_BIG),
    req("/big.bin", If_None_Match="*"),
    req("/big.bin", If_Modified_Since=LM),
    req("/big.bin", If_Modified_Since=OLD),
    req("/big.bin", If_Match='"nope"'),
    req("/big.bin", If_Unmodified_Since=OLD),
    req("/big.bin", If_Range=ETAG_BIG, Range="bytes=0-3"),
    req("/big.bin", If_Range='"other"', Range="bytes=0-3"),
    req("/big.bin", If_Range=LM, Range="bytes=4-7"),
    # try_files, error_page, return, rewrite
    req("/tf/page"),
    req("/tf/nothing"),
    req("/tfd/sub"),
    req("/tfd/sub?q=1"),
    req("/tfd/sub/"),
    req("/tfd/sub/index.html"),
    req("/tfd/noidx"),
    req("/tfd/noidx/"),
    req("/tfd/file.txt"),
    req("/tfd/file.txt/"),
    req("/tfd/missing"),
    req("/tfa/sub"),
    req("/tfp/sub"),
    req("/tfp/sub", version="HTTP/1.0", host=None),
    req("/tfp/nothing/"),
    req("/ep/missing"),
    req("/ep200/missing"),
    req("/ret?x=1"),
    req("/rw/a.txt?k=v"),
    req("/perm/a.txt?k=v"),
    # set, map, if
    req("/set/p?x=9"),
    req("/map/", X_Kind="alpha"),
    req("/map/", X_Kind="bravo"),
    req("/map/", X_Kind="c42"),
    req("/map/", X_Kind="Bravo"),
    req("/map/"),
    req("/map/", host="unknown.test"),
    req("/map/", host="a.unknown.test"),
    req("/args/?q=1"),
    req("/named/hello"),
    req("/loc/a/b/c"),
    req("/cap/r/x.cl"),
    req("/cap/r/kept/y"),
    req("/if/?r=1"),
    req("/if/present.txt?v=X12"),
    req("/if/nothing?v=x7"),
    req("/if/"),
    # headers and expires
    req("/hdr/h.txt"),
    req("/hdr/missing"),
    req("/exp-max/m.txt"),
    req("/exp-epoch/e.txt"),
    req("/exp-neg/n.txt"),
    # server_name selection
    req("/", host="other.test"),
    req("/", host="x.wild.test"),
    req("/", host="unknown.test"),
    # percent-encoding and dot segments
    req("/a%2Etxt"),
    req("/a%20b.txt"),
    req("/dir/../a.txt"),
    req("/./a.txt"),
    req("//a.txt"),
    req("/dir/%2e%2e/a.txt"),
    req("/../a.txt"),
    # bad requests
    b"BLAH\r\n\r\n",
    req("/", host=None),
    req("/" + "x" * 9000),
    req("/", version="HTTP/2.0"),
    req("/", version="HTTP/1.1", Host="second.test"),
]


def tagged(i: int, request: bytes) -> bytes:
    """The request with a User-Agent naming its index, so log lines can be matched to it."""
    return request.replace(b"\r\n", f"\r\nUser-Agent: diff/1.0 #{i}\r\n".encode(), 1)


SENT = [tagged(i, r) for i, r in enumerate(REQUESTS)]

COMPARED = ["content-type", "content-length", "etag", "last-modified", "location", "content-range",
            "cache-control", "accept-ranges", "x-test", "x-always", "x-if"]  # fmt: skip
DATE_RE = re.compile(rb"\d{2}-[A-Z][a-z]{2}-\d{4} \d{2}:\d{2}")
LOG_DATE_RE = re.compile(r"\[\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4}\]")


@dataclass
class Normalised:
    fields: dict
    body: bytes
    log_delta: int  # how much normalising changed the body's length on the wire


def substitute(body: bytes, fields: dict, old: bytes, new: bytes) -> tuple[bytes, int]:
    """Replace `old` by `new` in the body, keeping Content-Length in step; the length change."""
    n = body.count(old)
    if not n or not old:
        return body, 0
    delta = n * (len(new) - len(old))
    if fields.get("content-length"):
        fields["content-length"] = str(int(fields["content-length"]) + delta)
    return body.replace(old, new), delta


def normalise(a: Answer, port: int) -> Normalised:
    fields = {"status": a.status} | {h: a.headers.get(h) for h in COMPARED}
    if fields["location"]:
        fields["location"] = fields["location"].replace(f":{port}", ":PORT")
    # Framing is not compared: a chunked body counts by its decoded length.
    wire = len(a.raw.partition(b"\r\n\r\n")[2])
    if fields["content-length"] is None and "chunked" in a.headers.get("transfer-encoding", ""):
        fields["content-length"] = str(len(a.body))
    body, _ = substitute(a.body, fields, b"<center>gannet</center>", b"<center>nginx</center>")
    if m := re.search(r"boundary=(\S+)", fields["content-type"] or ""):
        fields["content-type"] = fields["content-type"].replace(m[1], "BOUNDARY")
        body, _ = substitute(body, fields, m[1].encode(), b"BOUNDARY")
    delta = wire - len(body) if a.body else 0
    return Normalised(fields, DATE_RE.sub(b"DD-Mon-YYYY hh:mm", body), delta)


def describe(i: int, request: bytes) -> str:
    line = request.split(b"\r\n", 1)[0][:80].decode(errors="replace")
    return f"#{i} {line}"


def wait_log(path, n: int, deadline: float = 5.0) -> list[str]:
    end = time.monotonic() + deadline
    while True:
        got = path.read_text(errors="replace").splitlines() if path.exists() else []
        if len(got) >= n or time.monotonic() > end:
            return got
        time.sleep(0.02)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both servers started on the shared root, every request sent to each; yields
    (nginx answers, gannet answers, nginx log lines, gannet log lines, ports)."""
    tmp = tmp_path_factory.mktemp("diff")
    g = Gannet(tmp / "gannet")
    g.tmp.mkdir()
    root = g.write_files(FILES)
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            os.utime(os.path.join(dirpath, name), (MTIME, MTIME))
    nginx_port = free_port()
    nginx = NginxPeer(CONF, nginx_port, root, tmp / "nginx")
    try:
        srv = g.start(conf=CONF)
        answers = {name: [exchange(p, r) for r in SENT] for name, p in (("nginx", nginx_port), ("gannet", srv.port))}
        n_logged = sum(1 for a in answers["nginx"] if a.status)
        logs = {name: wait_log(t / "access.log", n_logged) for name, t in (("nginx", nginx.tmp), ("gannet", g.tmp))}
        yield answers, logs, {"nginx": nginx_port, "gannet": srv.port}
    finally:
        nginx.stop()
        g.close()


def test_responses_match_nginx(runs):
    answers, _, ports = runs
    diffs = []
    for i, (request, a_n, a_g) in enumerate(zip(SENT, answers["nginx"], answers["gannet"])):
        n, g = normalise(a_n, ports["nginx"]), normalise(a_g, ports["gannet"])
        for key in n.fields:
            if n.fields[key] != g.fields[key]:
                diffs.append(f"{describe(i, request)}: {key}: nginx {n.fields[key]!r}, gannet {g.fields[key]!r}")
        if n.body != g.body:
            diffs.append(f"{describe(i, request)}: body: nginx {n.body[:300]!r}, gannet {g.body[:300]!r}")
    assert len(REQUESTS) >= 40
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)


def by_request(lines: list[str]) -> dict[int, str]:
    """Log lines keyed by request index: from the tag in the User-Agent, or for a line
    without one (a request rejected before its headers were read) the next index."""
    out, nxt = {}, 0
    for line in lines:
        m = re.search(r'"diff/1\.0 #(\d+)"$', line)
        i = int(m[1]) if m else nxt
        out[i], nxt = line, i + 1
    return out


def log_line(line: str | None, delta: int) -> str | None:
    """The date replaced, and the byte count shifted by what normalising the body changed."""
    if line is None:
        return None
    line = LOG_DATE_RE.sub("[DATE]", line)
    return re.sub(r'(" \d{3} )(\d+)', lambda m: f"{m[1]}{int(m[2]) - delta}", line, count=1)


def test_access_logs_match_nginx(runs):
    answers, logs, ports = runs
    lines = {name: by_request(logs[name]) for name in logs}
    diffs = []
    for i, request in enumerate(SENT):
        n, g = (log_line(lines[name].get(i), normalise(answers[name][i], ports[name]).log_delta) for name in ("nginx", "gannet"))
        if n != g:
            diffs.append(f"{describe(i, request)}:\n   nginx  {str(n)[:200]}\n   gannet {str(g)[:200]}")
    assert len(logs["nginx"]) >= 40
    assert not diffs, f"{len(diffs)} access-log lines differ:\n" + "\n".join(diffs)
