"""Compression as an nginx admin configures it (`gzip*`, `brotli*`, `zstd*`, `*_static`),
checked with independent decoders: Python's gzip, brotli and zstandard modules, and curl
--compressed. Covers negotiation by Accept-Encoding with q-values, what is never compressed
(other types, short bodies, HTTP/1.0, proxied requests, ranges, disabled user agents, answers
that are encoded already), HEAD and 304, large files and application answers compressed while
streamed, precompressed files, and config errors.
"""

import gzip
import http.client
import os
import socket
import subprocess
import threading
import zlib

import brotli
import pytest
import zstandard

from conftest import REPO, read_chunked, read_head, wait_until
from rawapps import FastCgiApp, HttpApp, end_request, http_answer, made, stdout

TEXT = "".join(f"User-agent: bot{i}\nDisallow: /private/{i}/\n" for i in range(40))
BIG = ("<p>" + " ".join(f"word{i % 977}" for i in range(60000)) + "</p>\n") * 2  # ~1 MB
FILES = {
    "robots.txt": TEXT,
    "page.html": BIG,
    "tiny.txt": "short\n",
    "pic.jpg": os.urandom(4000),
    "data.json": '{"a": [' + ",".join(str(i) for i in range(3000)) + "]}",
}

ALL_ON = """
    gzip on; gzip_types text/plain application/json; gzip_vary on;
    brotli on; brotli_types text/plain application/json;
    zstd on; zstd_types text/plain application/json;
"""


def decode(encoding, data):
    if encoding == "gzip":
        return gzip.decompress(data)
    if encoding == "br":
        return brotli.decompress(data)
    if encoding == "zstd":
        # A streamed frame carries no content size: decode as a stream.
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    assert encoding is None, encoding
    return data


def get(srv, path, ae=None, method="GET", headers=None, version11=True):
    h = dict(headers or {})
    if ae is not None:
        h["Accept-Encoding"] = ae
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    if not version11:
        c._http_vsn, c._http_vsn_str = 10, "HTTP/1.0"
    try:
        c.request(method, path, headers=h)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


@pytest.fixture
def srv(gannet):
    return gannet.start(files=FILES, server=ALL_ON)


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_each_encoding_decodes_to_the_original(srv, encoding):
    status, h, body = get(srv, "/robots.txt", encoding)
    assert status == 200
    assert h["content-encoding"] == encoding
    assert int(h["content-length"]) == len(body) < len(TEXT)
    assert h["vary"] == "Accept-Encoding"
    assert h["etag"].startswith('W/"')
    assert "accept-ranges" not in h
    assert decode(encoding, body) == TEXT.encode()
    # The same answer again (now from the worker's cache of compressed copies).
    assert get(srv, "/robots.txt", encoding)[2] == body


@pytest.mark.parametrize(
    "ae, expected",
    [
        ("gzip", "gzip"),
        ("gzip, deflate, br, zstd", "br"),
        ("br;q=0.5, gzip;q=0.8", "gzip"),
        ("br;q=1, gzip;q=0.8, *;q=0", "br"),
        ("zstd;q=0.9, br;q=0.1", "zstd"),
        ("*", "br"),
        ("*;q=0.2, br;q=0", "zstd"),
        ("x-gzip", "gzip"),
        ("identity", None),
        ("gzip;q=0, br;q=0, zstd;q=0", None),
        ("", None),
        ("gzip;q=high", None),
        ("gzip;q=1.5", None),
        (";;;, ,=,q=", None),
        ("\u00ff\u00fe, br", "br"),
    ],
)
def test_negotiation_by_accept_encoding(srv, ae, expected):
    status, h, body = get(srv, "/robots.txt", ae)
    assert status == 200
    assert h.get("content-encoding") == expected
    assert h["vary"] == "Accept-Encoding"
    assert decode(expected, body) == TEXT.encode()
    if expected is None:
        assert h["etag"].startswith('"') and h["accept-ranges"] == "bytes"


@pytest.mark.parametrize(
    "path, headers, why",
    [
        ("/pic.jpg", {}, "type not listed"),
        ("/tiny.txt", {}, "under gzip_min_length"),
        ("/robots.txt", {"Via": "1.1 proxy"}, "proxied, gzip_proxied off"),
        ("/robots.txt", {"User-Agent": "Mozilla/4.0 (compatible; MSIE 6.0; Windows NT 5.0)"}, "gzip_disable msie6"),
        ("/robots.txt", {"User-Agent": "OldBot/1.0"}, "gzip_disable regex"),
    ],
)
def test_not_compressed(gannet, path, headers, why):
    srv = gannet.start(files=FILES, server=ALL_ON + "gzip_min_length 100; brotli_min_length 100; zstd_min_length 100; gzip_disable msie6 oldbot;")
    status, h, body = get(srv, path, "gzip, br, zstd", headers=headers)
    assert status == 200, why
    assert "content-encoding" not in h, why
    assert body == (FILES[path[1:]] if isinstance(FILES[path[1:]], bytes) else FILES[path[1:]].encode())


def test_proxied_requests_with_gzip_proxied_any(gannet):
    srv = gannet.start(files=FILES, server="gzip on; gzip_types text/plain; gzip_proxied any;")
    status, h, body = get(srv, "/robots.txt", "gzip", headers={"Via": "1.1 proxy"})
    assert h["content-encoding"] == "gzip" and gzip.decompress(body) == TEXT.encode()
    # Without gzip_vary there is no Vary header.
    assert "vary" not in h


def test_http10_only_with_gzip_http_version_1_0(gannet):
    srv = gannet.start(files=FILES, server=ALL_ON)
    status, h, body = get(srv, "/robots.txt", "gzip", version11=False)
    assert "content-encoding" not in h and body == TEXT.encode()
    srv2 = gannet.start(files=FILES, server=ALL_ON + "gzip_http_version 1.0;")
    for path, want in (("/robots.txt", TEXT), ("/page.html", BIG)):
        raw = srv2.raw(f"GET {path} HTTP/1.0\r\nAccept-Encoding: gzip\r\n\r\n".encode(), timeout=10)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert b"Content-Encoding: gzip" in head
        # The big file is compressed while sent: close-delimited to an HTTP/1.0 client.
        assert b"Transfer-Encoding" not in head
        assert gzip.decompress(body) == want.encode()


def test_ranges_are_answered_from_the_identity_representation(srv):
    status, h, body = get(srv, "/robots.txt", "gzip", headers={"Range": "bytes=0-9"})
    assert status == 206
    assert "content-encoding" not in h
    assert body == TEXT.encode()[:10]
    assert h["vary"] == "Accept-Encoding"


def test_error_pages_are_compressed_too(srv):
    status, h, body = get(srv, "/missing.html", "gzip")
    assert status == 404 and h["content-encoding"] == "gzip"
    assert b"404 Not Found" in gzip.decompress(body)
    status, h, body = get(srv, "/robots.txt", "gzip", method="DELETE")
    assert status == 405 and "content-encoding" not in h


def test_head_has_the_get_headers(srv):
    _, g, gbody = get(srv, "/robots.txt", "br")
    status, h, body = get(srv, "/robots.txt", "br", method="HEAD")
    assert status == 200 and body == b""
    assert h["content-encoding"] == "br"
    assert h["content-length"] == g["content-length"] == str(len(gbody))
    # A large file is compressed only when sent: its HEAD says the encoding, and no length.
    status, h, _ = get(srv, "/page.html", "gzip", method="HEAD")
    assert h["content-encoding"] == "gzip" and "content-length" not in h
    assert "transfer-encoding" not in h


def test_304_for_the_weak_etag_keeps_vary(srv):
    _, h, _ = get(srv, "/robots.txt", "gzip")
    status, h2, body = get(srv, "/robots.txt", "gzip", headers={"If-None-Match": h["etag"]})
    assert status == 304 and body == b""
    assert h2["vary"] == "Accept-Encoding"
    assert "content-encoding" not in h2


@pytest.mark.parametrize("encoding", ["gzip", "br", "zstd"])
def test_large_file_is_compressed_while_sent_chunked(srv, encoding):
    """Over the in-memory size the file is read, compressed and sent in chunks, and the
    connection stays usable for the next request."""
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(f"GET /page.html HTTP/1.1\r\nHost: t\r\nAccept-Encoding: {encoding}\r\n\r\n".encode())
        f = s.makefile("rb")
        head = read_head(f)
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"Transfer-Encoding: chunked" in head and b"Content-Length" not in head
        assert f"Content-Encoding: {encoding}".encode() in head
        body = read_chunked(f)
        assert decode(encoding, body) == BIG.encode()
        assert len(body) < len(BIG) // 3
        s.sendall(b"GET /tiny.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        assert f.readline().startswith(b"HTTP/1.1 200 ")


def test_curl_compressed(srv):
    for path, want in (("/robots.txt", TEXT), ("/page.html", BIG), ("/data.json", FILES["data.json"])):
        out = subprocess.run(["curl", "-s", "--compressed", "-D", "-", "-o", "-", srv.base + path],
                             capture_output=True, timeout=30, check=True).stdout
        head, _, body = out.partition(b"\r\n\r\n")
        assert b"Content-Encoding: " in head
        assert body == want.encode()


def test_changed_file_gets_a_new_compressed_copy(gannet):
    srv = gannet.start(files=FILES, server="gzip on; gzip_types text/plain; open_file_cache_valid 1s;")
    assert gzip.decompress(get(srv, "/robots.txt", "gzip")[2]) == TEXT.encode()
    (srv.root / "robots.txt").write_text(TEXT + "Disallow: /new/\n")
    # Re-validated once open_file_cache_valid is over.
    assert wait_until(lambda: gzip.decompress(get(srv, "/robots.txt", "gzip")[2]).endswith(b"/new/\n"))


def test_access_log_counts_compressed_bytes(gannet):
    srv = gannet.start(files=FILES, server="gzip on; gzip_types text/plain;",
                       http='log_format sizes "$status $body_bytes_sent"; access_log {tmp}/sizes.log sizes;'.replace("{tmp}", str(gannet.tmp)))
    _, _, body = get(srv, "/robots.txt", "gzip")
    assert wait_until(lambda: (gannet.tmp / "sizes.log").exists() and (gannet.tmp / "sizes.log").read_text().strip())
    assert (gannet.tmp / "sizes.log").read_text().split() == ["200", str(len(body))]


# Precompressed files.

STATIC_FILES = {
    "app.js": "console.log('identity');\n" * 20,
    "app.js.gz": gzip.compress(b"console.log('gzip');\n" * 20),
    "app.js.br": brotli.compress(b"console.log('br');\n" * 20),
    "only.css.gz": gzip.compress(b"body { color: red }\n"),
    "style.css": "body { color: blue }\n" * 30,
}


def test_gzip_static_and_friends(gannet):
    srv = gannet.start(files=STATIC_FILES, server="gzip_static on; brotli_static on; zstd_static on; gzip_vary on;")
    status, h, body = get(srv, "/app.js", "gzip, br, zstd")
    assert h["content-encoding"] == "br" and brotli.decompress(body) == b"console.log('br');\n" * 20
    assert h["content-type"] == "application/javascript" and h["vary"] == "Accept-Encoding"
    assert h["etag"].startswith('"')  # the precompressed file's own, strong ETag
    status, h, body = get(srv, "/app.js", "gzip")
    assert h["content-encoding"] == "gzip" and gzip.decompress(body) == b"console.log('gzip');\n" * 20
    # zstd accepted but there is no .zst: the next accepted one.
    status, h, body = get(srv, "/app.js", "zstd, gzip;q=0.5")
    assert h["content-encoding"] == "gzip"
    # Not accepted: the plain file, still marked as varying.
    status, h, body = get(srv, "/app.js")
    assert "content-encoding" not in h and body == STATIC_FILES["app.js"].encode()
    assert h["vary"] == "Accept-Encoding"
    # No precompressed copy: the plain file, no Vary.
    status, h, body = get(srv, "/style.css", "gzip")
    assert "content-encoding" not in h and "vary" not in h
    # As nginx: the .gz is served even without the plain file, whole even if a range is asked.
    status, h, body = get(srv, "/only.css", "gzip", headers={"Range": "bytes=0-3"})
    assert status == 200 and h["content-encoding"] == "gzip" and "accept-ranges" not in h
    assert body == STATIC_FILES["only.css.gz"]
    assert get(srv, "/only.css")[0] == 404


def test_gzip_static_always(gannet):
    srv = gannet.start(files=STATIC_FILES, server="gzip_static always;")
    status, h, body = get(srv, "/only.css")
    assert status == 200 and h["content-encoding"] == "gzip"
    assert gzip.decompress(body) == b"body { color: red }\n"


# Application answers: a FastCGI application on a raw socket (rawapps), whose answers the
# tests control (pieces, pauses, its own Content-Encoding).

@pytest.fixture
def app():
    yield from made(FastCgiApp)


def app_server(gannet, port):
    return gannet.start(files={"x.php": "unused"}, server=f"""
        gzip on; gzip_types text/plain; brotli on; brotli_types text/plain;
        location ~ \\.php$ {{
            include {REPO}/conf/fastcgi.conf;
            fastcgi_pass 127.0.0.1:{port};
        }}
    """)


def test_application_answers_are_compressed(gannet, app):
    small = b"hello from the app\n" * 50
    big = b"".join(b"line %d of a long answer\n" % i for i in range(80000))  # > 1 MiB: streamed
    a = app(lambda c: c.sendall(stdout(b"Content-Type: text/plain\r\n\r\n" + small) + end_request()))
    srv = app_server(gannet, a.port)
    status, h, body = get(srv, "/x.php", "gzip")
    assert status == 200 and h["content-encoding"] == "gzip"
    assert int(h["content-length"]) == len(body)
    assert gzip.decompress(body) == small

    b = app(lambda c: c.sendall(stdout(b"Content-Type: text/plain\r\n\r\n" + big) + end_request()))
    srv2 = app_server(gannet, b.port)
    status, h, body = get(srv2, "/x.php", "br")
    assert h["content-encoding"] == "br" and h.get("transfer-encoding") == "chunked"
    assert brotli.decompress(body) == big


def test_application_encoded_answers_are_left_alone(gannet, app):
    packed = gzip.compress(b"already compressed\n" * 20)
    a = app(lambda c: c.sendall(stdout(b"Content-Type: text/plain\r\nContent-Encoding: gzip\r\n\r\n" + packed)
                               + end_request()))
    srv = app_server(gannet, a.port)
    status, h, body = get(srv, "/x.php", "gzip, br")
    assert h["content-encoding"] == "gzip" and body == packed


@pytest.fixture
def upstream():
    yield from made(HttpApp)


def proxy_server(gannet, port):
    return gannet.start(server=f"""
        gzip on; gzip_types text/plain; gzip_vary on; zstd on; zstd_types text/plain;
        location / {{ proxy_pass http://127.0.0.1:{port}; }}
    """)


def test_proxied_answers_are_compressed_with_weak_validators(gannet, upstream):
    """As nginx's gzip filter on a proxied answer: compressed in memory or while streamed
    (over 1 MiB), the upstream's ETag made weak and its Accept-Ranges dropped; an answer
    the upstream encoded itself goes through untouched."""
    small = b"a proxied line\n" * 100
    big = b"".join(b"line %d of a long proxied answer\n" % i for i in range(60000))
    validators = 'Content-Type: text/plain\r\nETag: "abc"\r\nAccept-Ranges: bytes\r\n'
    packed = gzip.compress(b"packed upstream\n" * 20)
    answers = {b"/small": http_answer(small, headers=validators),
               b"/big": http_answer(big, headers=validators),
               b"/packed": http_answer(packed, headers="Content-Type: text/plain\r\nContent-Encoding: gzip\r\n")}
    up = upstream(lambda c, head, body: c.sendall(answers[head.split(b" ")[1]]))
    srv = proxy_server(gannet, up.port)

    status, h, body = get(srv, "/small", "gzip")
    assert status == 200 and h["content-encoding"] == "gzip" and gzip.decompress(body) == small
    assert h["etag"] == 'W/"abc"' and "accept-ranges" not in h and h["vary"] == "Accept-Encoding"

    status, h, body = get(srv, "/big", "zstd")
    assert h["content-encoding"] == "zstd" and h.get("transfer-encoding") == "chunked"
    assert zstandard.ZstdDecompressor().decompressobj().decompress(body) == big
    assert h["etag"] == 'W/"abc"' and "accept-ranges" not in h

    status, h, body = get(srv, "/small")  # identity: the upstream's validators as they were
    assert body == small and h["etag"] == '"abc"' and h["accept-ranges"] == "bytes"

    status, h, body = get(srv, "/packed", "gzip, zstd")
    assert h["content-encoding"] == "gzip" and body == packed


@pytest.mark.parametrize("via", ["fastcgi", "proxy"])
def test_streamed_answer_is_flushed_as_the_application_pauses(gannet, app, upstream, via):
    """What the application (or proxied server) said before a pause reaches the client,
    decodable, during the pause (the client's reading is what lets the application go on)."""
    go_on = threading.Event()
    first = b"first part " * 120000  # > 1 MiB, so the answer is streamed

    if via == "fastcgi":
        def script(c):
            c.sendall(stdout(b"Content-Type: text/plain\r\n\r\n" + first))
            assert go_on.wait(10)
            c.sendall(stdout(b"the end\n") + end_request())

        srv = app_server(gannet, app(script).port)
    else:
        def behave(c, head, body):
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + first)
            assert go_on.wait(10)
            c.sendall(b"the end\n")

        srv = proxy_server(gannet, upstream(behave).port)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall(b"GET /x.php HTTP/1.1\r\nHost: t\r\nAccept-Encoding: gzip\r\n\r\n")
        f = s.makefile("rb")
        head = read_head(f)
        assert b"Content-Encoding: gzip" in head
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        got = b""
        while len(got) < len(first):
            n = int(f.readline().strip(), 16)
            assert n > 0, "the answer ended early"
            got += d.decompress(f.read(n + 2)[:-2])
        assert got == first
        go_on.set()
        while True:
            n = int(f.readline().strip(), 16)
            chunk = f.read(n + 2)[:-2]
            if n == 0:
                break
            got += d.decompress(chunk)
        assert got == first + b"the end\n"


# Config errors name the file and line.

@pytest.mark.parametrize(
    "directive, message",
    [
        ("gzip_comp_level 10;", 'the "gzip_comp_level" level must be between 1 and 9'),
        ("brotli_comp_level 12;", 'the "brotli_comp_level" level must be between 0 and 11'),
        ("zstd_comp_level 0;", 'the "zstd_comp_level" level must be between 1 and 22'),
        ("gzip maybe;", 'it must be "on" or "off"'),
        ("gzip_static sometimes;", 'invalid value "sometimes"'),
        ("gzip_proxied everything;", 'invalid value "everything"'),
        ("gzip_http_version 2.0;", 'invalid value "2.0"'),
        ("gzip_disable \"(unclosed\";", 'pcre2_compile() failed: missing closing parenthesis in "(unclosed"'),
        ("gzip_min_length lots;", '"gzip_min_length" directive invalid value'),
        ("gzip_buffers 16;", "invalid number of arguments"),
    ],
)
def test_config_errors(gannet, directive, message):
    r = gannet.check(server=directive)
    assert r.returncode != 0
    assert message in r.stderr
    assert "check.conf:" in r.stderr


def test_accepted_tuning_directives(gannet):
    r = gannet.check(http="gzip_buffers 16 8k; brotli_buffers 16 8k; zstd_buffers 16 8k; brotli_window 512k;")
    assert r.returncode == 0, r.stderr


def test_gzip_level_1_sends_no_more_bytes_than_zlib_level_1(gannet):
    """nginx compresses with zlib; at the same gzip_comp_level gannet's answer is no bigger
    (bytes per reply is one of the studies' columns)."""
    srv = gannet.start(files=FILES, server="gzip on; gzip_types text/plain;")
    for path, text in (("/page.html", BIG), ("/robots.txt", TEXT)):
        _, h, body = get(srv, path, "gzip")
        assert gzip.decompress(body) == text.encode()
        assert len(body) <= len(gzip.compress(text.encode(), 1)) * 1.02, path


def test_gzip_switched_inside_if(gannet):
    srv = gannet.start(files=FILES, server="""
        gzip on; gzip_types text/plain;
        location / { if ($arg_plain) { gzip off; } }
    """)
    _, h, body = get(srv, "/robots.txt", "gzip")
    assert h["content-encoding"] == "gzip" and gzip.decompress(body) == TEXT.encode()
    _, h, body = get(srv, "/robots.txt?plain=1", "gzip")
    assert "content-encoding" not in h and body == TEXT.encode()
