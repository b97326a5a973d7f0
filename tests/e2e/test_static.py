"""Static content as nginx serves it: index, autoindex (html and json), try_files, MIME
types, validators and conditional requests, byte ranges, directory redirects, error
statuses and error_page, add_header / expires, large files with and without sendfile,
alias / root, and a file changed on disk. nginx 1.22 is the reference for each answer.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import re
import time

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

DIGITS = "0123456789abcdefghij"  # 20 bytes, so every byte's offset is visible


def put(gannet, rel: str, content: str | bytes) -> str:
    """Write a file under the test's temp dir (outside the document root); return its path."""
    p = gannet.tmp / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(p)


def etag_of(path) -> str:
    """nginx's ETag: hex mtime and hex size, quoted."""
    st = os.stat(path)
    return f'"{int(st.st_mtime):x}-{st.st_size:x}"'


def http_date(value: str) -> float:
    return email.utils.parsedate_to_datetime(value).timestamp()


def no_body_on_wire(srv, request_head: str) -> bytes:
    """Send `request_head` then a GET of /next.txt on one connection: the second status line
    must follow the first head directly (no body bytes in between). Returns the first head."""
    out = srv.raw(f"{request_head}\r\nHost: x\r\n\r\nGET /next.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    first, rest = out.split(b"\r\n\r\n", 1)
    assert rest.startswith(b"HTTP/1.1 200 "), f"bytes after the first head: {rest[:100]!r}"
    assert rest.endswith(b"\r\n\r\nnext"), rest[-100:]
    return first


def multipart_parts(body: bytes, content_type: str) -> list[tuple[str, bytes]]:
    """(Content-Range, data) of each part of a multipart/byteranges body."""
    m = re.fullmatch(r"multipart/byteranges; boundary=(\S+)", content_type)
    assert m, content_type
    delim = b"--" + m.group(1).encode()
    sections = body.split(b"\r\n" + delim)
    assert sections[-1].strip() == b"--", f"no closing delimiter: {sections[-1]!r}"
    parts = []
    for sec in sections[1:-1]:
        head, data = sec.split(b"\r\n\r\n", 1)
        headers = dict(line.split(": ", 1) for line in head.decode().strip().split("\r\n"))
        parts.append((headers["Content-Range"], data))
    return parts


def autoindex_hrefs(body: bytes) -> list[str]:
    return re.findall(r'<a href="([^"]+)">', body.decode())


@pytest.fixture
def srv(gannet):
    """A plain server with a few files."""
    return gannet.start(files={"r.txt": DIGITS, "next.txt": "next", "dir/index.html": "dir index", "empty": None})


# --- index and autoindex ---------------------------------------------------------------------

def test_index_serves_index_html(srv):
    status, h, body = srv.get("/dir/")
    assert (status, body) == (200, b"dir index")
    assert h["content-type"] == "text/html"


@pytest.mark.parametrize("present, served", [(["one.html", "two.html"], b"one.html"), (["two.html"], b"two.html")])
def test_index_order(gannet, present, served):
    srv = gannet.start(server="index one.html two.html;", files={f"d/{n}": n for n in present})
    assert srv.get("/d/")[::2] == (200, served)


AUTOINDEX_FILES = {"auto/a.txt": "", "auto/b c.txt": "12345", "auto/.hidden": "x", "auto/é&.txt": "",
                   "auto/zdir": None, "auto/sub": None}


def test_autoindex_html(gannet):
    srv = gannet.start(server="location /auto/ { autoindex on; }", files=AUTOINDEX_FILES)
    status, h, body = srv.get("/auto/")
    assert status == 200 and h["content-type"] == "text/html"
    assert b"<title>Index of /auto/</title>" in body
    # Parent link, directories first, then files, each by name; hidden left out; encoded hrefs.
    assert autoindex_hrefs(body) == ["../", "sub/", "zdir/", "a.txt", "b%20c.txt", "%C3%A9%26.txt"]
    assert ">é&amp;.txt</a>" in body.decode()
    assert b"hidden" not in body


def test_autoindex_json(gannet):
    srv = gannet.start(server="location /auto/ { autoindex on; autoindex_format json; }", files=AUTOINDEX_FILES)
    status, h, body = srv.get("/auto/")
    assert status == 200 and h["content-type"] == "application/json"
    entries = json.loads(body)
    assert [(e["name"], e["type"]) for e in entries] == [
        ("sub", "directory"), ("zdir", "directory"), ("a.txt", "file"), ("b c.txt", "file"), ("é&.txt", "file")]
    assert entries[3]["size"] == 5 and "size" not in entries[0]
    assert abs(http_date(entries[3]["mtime"]) - os.stat(srv.root / "auto/b c.txt").st_mtime) < 1


def test_directory_without_index_and_autoindex_off_is_403(srv):
    assert srv.get("/empty/")[0] == 403


# --- try_files -------------------------------------------------------------------------------

TRY_FILES = {"a.txt": "A", "d/index.html": "D", "fallback.html": "FB"}


def test_try_files_uri_dir_or_404(gannet):
    srv = gannet.start(server="location / { try_files $uri $uri/ =404; }", files=TRY_FILES)
    assert srv.get("/a.txt")[::2] == (200, b"A")
    # `$uri/` matched `/d`: the URI stays `/d`, a directory, so the 301 to `/d/` (nginx's
    # way: the index at `/d` would break every relative link in it).
    status, headers, _ = srv.get("/d")
    assert status == 301 and headers["location"] == f"http://127.0.0.1:{srv.port}/d/"
    assert srv.get("/d/")[::2] == (200, b"D")
    assert srv.get("/nope")[0] == 404


def test_try_files_fallback_uri(gannet):
    srv = gannet.start(server="location / { try_files $uri /fallback.html; }", files=TRY_FILES)
    assert srv.get("/a.txt")[::2] == (200, b"A")
    status, h, body = srv.get("/nope/deeper")
    assert (status, body, h["content-type"]) == (200, b"FB", "text/html")


def test_try_files_named_location(gannet):
    srv = gannet.start(server='location / { try_files $uri @app; } location @app { return 200 "app:$uri"; }', files=TRY_FILES)
    assert srv.get("/a.txt")[::2] == (200, b"A")
    assert srv.get("/nope")[::2] == (200, b"app:/nope")


# --- MIME types --------------------------------------------------------------------------------

def test_types_block_and_default_type(gannet):
    srv = gannet.start(
        server="location /t/ { types { text/x-foo foo; } default_type text/x-dflt; }",
        files={"t/a.foo": "f", "t/a.html": "h", "t/a.zzz": "z", "b.zzz": "z", "b.css": "c"},
    )
    assert srv.get("/t/a.foo")[1]["content-type"] == "text/x-foo"
    # A types block replaces the inherited table: html is no longer known there.
    assert srv.get("/t/a.html")[1]["content-type"] == "text/x-dflt"
    assert srv.get("/t/a.zzz")[1]["content-type"] == "text/x-dflt"
    assert srv.get("/b.zzz")[1]["content-type"] == "application/octet-stream"
    assert srv.get("/b.css")[1]["content-type"] == "text/css"


# --- validators and conditional requests -------------------------------------------------------

def test_etag_and_last_modified(srv):
    _, h, _ = srv.get("/r.txt")
    assert h["etag"] == etag_of(srv.root / "r.txt")
    assert http_date(h["last-modified"]) == int(os.stat(srv.root / "r.txt").st_mtime)


def test_if_none_match_gives_304_without_body(srv):
    etag = srv.get("/r.txt")[1]["etag"]
    head = no_body_on_wire(srv, f"GET /r.txt HTTP/1.1\r\nIf-None-Match: {etag}")
    assert head.startswith(b"HTTP/1.1 304 ")
    assert f"ETag: {etag}".encode() in head


def test_if_modified_since_exact_gives_304(srv):
    lm = srv.get("/r.txt")[1]["last-modified"]
    status, _, body = srv.get("/r.txt", {"If-Modified-Since": lm})
    assert (status, body) == (304, b"")


def test_if_modified_since_other_date_gives_200(srv):
    lm = http_date(srv.get("/r.txt")[1]["last-modified"])
    other = email.utils.formatdate(lm - 60, usegmt=True)
    assert srv.get("/r.txt", {"If-Modified-Since": other})[::2] == (200, DIGITS.encode())


# --- ranges --------------------------------------------------------------------------------------

def test_single_range(srv):
    status, h, body = srv.get("/r.txt", {"Range": "bytes=2-5"})
    assert (status, body) == (206, b"2345")
    assert h["content-range"] == "bytes 2-5/20" and h["content-length"] == "4"


def test_suffix_range(srv):
    status, h, body = srv.get("/r.txt", {"Range": "bytes=-3"})
    assert (status, body, h["content-range"]) == (206, b"hij", "bytes 17-19/20")


def test_multiple_ranges_are_multipart(srv):
    status, h, body = srv.get("/r.txt", {"Range": "bytes=0-1,5-6,-2"})
    assert status == 206 and int(h["content-length"]) == len(body)
    parts = multipart_parts(body, h["content-type"])
    assert parts == [("bytes 0-1/20", b"01"), ("bytes 5-6/20", b"56"), ("bytes 18-19/20", b"ij")]


def test_unsatisfiable_range_is_416(srv):
    status, h, _ = srv.get("/r.txt", {"Range": "bytes=30-40"})
    assert status == 416 and h["content-range"] == "bytes */20"


def test_if_range_matching_etag_gives_206(srv):
    etag = srv.get("/r.txt")[1]["etag"]
    assert srv.get("/r.txt", {"Range": "bytes=0-2", "If-Range": etag})[::2] == (206, b"012")


def test_if_range_stale_etag_gives_full_200(srv):
    status, h, body = srv.get("/r.txt", {"Range": "bytes=0-2", "If-Range": '"1-2"'})
    assert (status, body) == (200, DIGITS.encode())
    assert "content-range" not in h


# --- redirects and error statuses ----------------------------------------------------------------

@pytest.mark.parametrize("query", ["", "?q=1&r=2"])
def test_directory_without_slash_redirects(srv, query):
    status, h, _ = srv.get("/dir" + query)
    assert status == 301
    assert h["location"] == f"http://127.0.0.1:{srv.port}/dir/{query}"


def test_missing_file_is_404(srv):
    status, h, body = srv.get("/nope.txt")
    assert status == 404 and b"<title>404 Not Found</title>" in body and h["content-type"] == "text/html"


def test_post_to_file_is_405(srv):
    assert srv.request("POST", "/r.txt", body=b"x")[0] == 405


ERROR_PAGES = """
location /ep1/ { error_page 404 /custom.html; }
location /ep2/ { error_page 404 =200 /x.html; }
location /ep3/ { error_page 404 @nf; }
location @nf { try_files /nf.html =500; }
"""


@pytest.mark.parametrize("path, status, body", [
    ("/ep1/nope", 404, b"custom"),
    ("/ep2/nope", 200, b"xpage"),
    ("/ep3/nope", 404, b"named"),
])
def test_error_page(gannet, path, status, body):
    srv = gannet.start(server=ERROR_PAGES, files={"custom.html": "custom", "x.html": "xpage", "nf.html": "named"})
    got_status, h, got_body = srv.get(path)
    assert (got_status, got_body) == (status, body)
    assert h["content-type"] == "text/html"


# --- add_header and expires ------------------------------------------------------------------------

HEADERS_CONF = """
add_header X-Srv s;
location /own/ { add_header X-Own o; }
location /alw/ { add_header X-A a always; add_header X-B b; }
"""


@pytest.fixture
def hsrv(gannet):
    return gannet.start(server=HEADERS_CONF, files={"f.txt": "f", "own/f.txt": "f", "alw/f.txt": "f"})


def test_add_header_only_on_success(hsrv):
    assert hsrv.get("/f.txt")[1].get("x-srv") == "s"
    assert "x-srv" not in hsrv.get("/nope")[1]


def test_add_header_always_also_on_404(hsrv):
    _, h, _ = hsrv.get("/alw/f.txt")
    assert (h.get("x-a"), h.get("x-b")) == ("a", "b")
    status, h, _ = hsrv.get("/alw/nope")
    assert status == 404 and h.get("x-a") == "a" and "x-b" not in h


def test_add_header_not_inherited_by_level_with_its_own(hsrv):
    _, h, _ = hsrv.get("/own/f.txt")
    assert h.get("x-own") == "o" and "x-srv" not in h


def test_expires_1h(gannet):
    srv = gannet.start(server="expires 1h;", files={"f.txt": "f"})
    _, h, _ = srv.get("/f.txt")
    assert h["cache-control"] == "max-age=3600"
    assert abs(http_date(h["expires"]) - (time.time() + 3600)) < 5
    assert "expires" not in srv.get("/nope")[1]


@pytest.mark.parametrize("value, expires, cache_control", [
    ("epoch", "Thu, 01 Jan 1970 00:00:01 GMT", "no-cache"),
    ("max", "Thu, 31 Dec 2037 23:55:55 GMT", "max-age=315360000"),
    ("off", None, None),
])
def test_expires_keywords(gannet, value, expires, cache_control):
    srv = gannet.start(server=f"expires {value};", files={"f.txt": "f"})
    _, h, _ = srv.get("/f.txt")
    assert (h.get("expires"), h.get("cache-control")) == (expires, cache_control)


# --- file bodies, alias and root ---------------------------------------------------------------------

@pytest.mark.parametrize("nopush", ["on", "off"])
@pytest.mark.parametrize("sendfile", ["on", "off"])
def test_large_file_intact(gannet, sendfile, nopush):
    # tcp_nopush is accepted either way: the head always goes with MSG_MORE ahead of a file.
    data = os.urandom(2 * 1024 * 1024 + 17)
    srv = gannet.start(http=f"sendfile {sendfile}; tcp_nopush {nopush};", files={"big.bin": data})
    status, h, body = srv.get("/big.bin")
    assert status == 200 and int(h["content-length"]) == len(data)
    assert hashlib.sha256(body).hexdigest() == hashlib.sha256(data).hexdigest()
    # A range from the middle of it, too.
    status, _, body = srv.get("/big.bin", {"Range": "bytes=1000000-1000099"})
    assert (status, body) == (206, data[1000000:1000100])


def test_tcp_nopush_takes_only_on_or_off(gannet):
    r = gannet.check(http="tcp_nopush maybe;")
    assert r.returncode != 0
    assert 'invalid value "maybe" in "tcp_nopush" directive, it must be "on" or "off"' in r.stderr


def test_alias_in_prefix_location(gannet):
    data_dir = os.path.dirname(put(gannet, "data/x.txt", "aliased"))
    srv = gannet.start(server=f"location /files/ {{ alias {data_dir}/; }}", files={"files/x.txt": "from root"})
    assert srv.get("/files/x.txt")[::2] == (200, b"aliased")


def test_root_inside_location(gannet):
    put(gannet, "other/r/y.txt", "other root")
    srv = gannet.start(server=f"location /r/ {{ root {gannet.tmp}/other; }}", files={"r/y.txt": "main root"})
    assert srv.get("/r/y.txt")[::2] == (200, b"other root")


def test_changed_file_is_served_new(srv):
    (srv.root / "v.txt").write_text("version-1")
    assert srv.get("/v.txt")[2] == b"version-1"
    assert srv.get("/v.txt")[2] == b"version-1"  # now cached
    (srv.root / "v.txt").write_text("version-two")
    started = time.monotonic()
    assert wait_until(lambda: srv.get("/v.txt")[2] == b"version-two", deadline=3.0)
    assert time.monotonic() - started < 2.5


REWRITE_CONF = r"""
http {
    access_log off;
    server { listen 127.0.0.1:{port}; root {root}; }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_file_rewritten_in_place_is_served_new_at_once(tmp_path):
    # Without open_file_cache nginx opens the file for each request: a file rewritten in
    # place (same inode, same size, within the second) is served new by the next request.
    # gannet's always-on cache served the old bytes until its 1 s check.
    with side_by_side(tmp_path, PEER_MAIN + REWRITE_CONF, files={"v.txt": "SEE-THIS"}) as (srv, nginx_port):
        page = srv.root / "v.txt"
        for port in (srv.port, nginx_port):
            assert exchange(port, b"GET /v.txt HTTP/1.0\r\n\r\n").body == b"SEE-THIS"
        with open(page, "r+b") as f:  # the same inode, rewritten
            f.write(b"SEE-THAT")
        got = [exchange(port, b"GET /v.txt HTTP/1.0\r\n\r\n").body for port in (srv.port, nginx_port)]
    assert got == [b"SEE-THAT", b"SEE-THAT"]
