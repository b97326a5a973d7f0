"""image_filter: images made here with Pillow (JPEG, PNG, GIF, WebP) served from files and
through a proxy; `size`'s JSON, `test`'s 415, resize/crop/rotate geometry read back by
decoding the answer, image_filter_buffer's 415; side by side with Debian's nginx and its
dynamic ngx_http_image_filter_module where that is installed."""

import io
import os
import re
import subprocess

import pytest

from conftest import gannet_bin
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

PIL = pytest.importorskip("PIL.Image")

MODULE = "/usr/lib/nginx/modules/ngx_http_image_filter_module.so"

CONF = PEER_MAIN + """
http {
    types { image/jpeg jpg; image/png png; image/gif gif; image/webp webp; text/plain txt; }
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /size/ { alias {root}/; image_filter size; }
        location /test/ { alias {root}/; image_filter test; }
        location /resize/ { alias {root}/; image_filter resize 40 -; }
        location /fit/ { alias {root}/; image_filter resize 50 50; }
        location /crop/ { alias {root}/; image_filter crop 30 30; }
        location /wide/ { alias {root}/; image_filter crop 200 10; }
        location /opaque/ { alias {root}/; image_filter resize 60 60; image_filter_transparency off; }
        location /rotate/ { alias {root}/; image_filter rotate 90; }
        location /rot180/ { alias {root}/; image_filter rotate 180; }
        location /both/ { alias {root}/; image_filter resize 60 60; image_filter rotate 270; }
        location /var/ { alias {root}/; image_filter resize $arg_w $arg_h; }
        location /small/ { alias {root}/; image_filter_buffer TINY; image_filter test; }
        location /proxied/ { proxy_pass http://127.0.0.1:{port}/plain/; image_filter resize 25 25; }
        location /proxsize/ { proxy_pass http://127.0.0.1:{port}/plain/; image_filter size; }
        location /plain/ { alias {root}/; }
    }
}
"""


def make(fmt, size=(120, 80)):
    img = PIL.new("RGB", size, (200, 30, 40))
    for x in range(size[0] // 2):
        img.putpixel((x, size[1] // 2), (0, 0, 255))
    out = io.BytesIO()
    img.save(out, fmt)
    return out.getvalue()


def transparent_gif():
    img = PIL.new("P", (120, 80), 1)
    img.putpalette([255, 255, 255, 10, 200, 30] + [0] * 762)
    for x in range(60):
        img.putpixel((x, 40), 0)
    out = io.BytesIO()
    img.save(out, "GIF", transparency=1)
    return out.getvalue()


FILES = {
    "t.gif": transparent_gif(),
    "a.jpg": make("JPEG"),
    "a.png": make("PNG"),
    "a.gif": make("GIF"),
    "a.webp": make("WEBP"),
    "tall.png": make("PNG", (40, 100)),
    "tiny.png": make("PNG", (10, 10)),
    "a.txt": b"not an image at all, only some text\n",
}

# image_filter_buffer the size of tiny.png: it passes, the larger a.png is a 415.
CONF = CONF.replace("TINY", str(len(FILES["tiny.png"])))
assert len(FILES["a.png"]) > len(FILES["tiny.png"])

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx not installed")


def get(port, path):
    return exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())


def dims(a):
    """The answer's status, type and, for an image, its format and dimensions."""
    if a.status != 200 or not a.headers.get("content-type", "").startswith("image/"):
        return a.status, a.headers.get("content-type")
    img = PIL.open(io.BytesIO(a.body))
    return a.status, a.headers["content-type"], img.format, img.size


def conf_for(peer):
    # nginx's module is dynamic in Debian: loaded on the nginx side only (gannet has it built in
    # and ignores load_module).
    return (f"load_module {MODULE};\n" if peer else "") + CONF


@pytest.fixture
def servers(tmp_path):
    conf = conf_for(os.path.exists(MODULE))
    with side_by_side(tmp_path, conf, FILES) as (srv, nginx_port):
        yield srv.port, (nginx_port if os.path.exists(MODULE) else None)


def test_size_json(servers):
    port, _ = servers
    for name, ty in (("a.jpg", "jpeg"), ("a.png", "png"), ("a.gif", "gif"), ("a.webp", "webp")):
        a = get(port, f"/size/{name}")
        assert a.status == 200 and a.headers["content-type"] == "application/json"
        assert a.body == ('{ "img" : { "width": 120, "height": 80, "type": "%s" } }\r\n' % ty).encode()
        assert a.headers["content-length"] == str(len(a.body))
    a = get(port, "/size/a.txt")
    assert (a.status, a.body) == (200, b"{}\r\n")


def test_test_and_buffer(servers):
    port, _ = servers
    assert get(port, "/test/a.txt").status == 415
    a = get(port, "/test/a.png")
    assert a.status == 200 and a.body == FILES["a.png"] and a.headers["content-type"] == "image/png"
    assert get(port, "/small/a.png").status == 415
    assert get(port, "/small/tiny.png").status == 200


@pytest.mark.parametrize("name", ["a.jpg", "a.png", "a.gif", "a.webp"])
def test_geometry(servers, name):
    port, _ = servers
    fmt = {"jpg": "JPEG", "png": "PNG", "gif": "GIF", "webp": "WEBP"}[name.rsplit(".", 1)[1]]
    ct = "image/" + {"JPEG": "jpeg"}.get(fmt, fmt.lower())
    # resize 40 -: 120x80 -> 40x26 (aspect kept, integer arithmetic as nginx's).
    assert dims(get(port, f"/resize/{name}")) == (200, ct, fmt, (40, 26))
    assert dims(get(port, f"/fit/{name}")) == (200, ct, fmt, (50, 33))
    # crop 30 30: reduced to 45x30, then the centre 30x30.
    assert dims(get(port, f"/crop/{name}")) == (200, ct, fmt, (30, 30))
    assert dims(get(port, f"/wide/{name}")) == (200, ct, fmt, (120, 10))
    assert dims(get(port, f"/rotate/{name}")) == (200, ct, fmt, (80, 120))
    assert dims(get(port, f"/rot180/{name}")) == (200, ct, fmt, (120, 80))
    assert dims(get(port, f"/both/{name}")) == (200, ct, fmt, (40, 60))
    assert dims(get(port, f"/var/{name}?w=60&h=-")) == (200, ct, fmt, (60, 40))
    assert get(port, f"/var/{name}?w=x&h=10").status == 415


def test_small_enough_passed_unchanged(servers):
    port, _ = servers
    a = get(port, "/fit/tiny.png")
    assert a.status == 200 and a.body == FILES["tiny.png"]
    assert a.headers["content-length"] == str(len(FILES["tiny.png"]))
    assert dims(get(port, "/crop/tall.png")) == (200, "image/png", "PNG", (30, 30))


def test_proxied(servers):
    port, _ = servers
    a = get(port, "/proxied/a.png")
    assert dims(a) == (200, "image/png", "PNG", (25, 16))
    assert a.headers["content-length"] == str(len(a.body))
    assert get(port, "/proxied/a.txt").status == 415
    assert get(port, "/proxsize/a.gif").body == b'{ "img" : { "width": 120, "height": 80, "type": "gif" } }\r\n'


def test_gif_transparency(servers):
    port, nginx_port = servers

    def read(p, loc):
        img = PIL.open(io.BytesIO(get(p, f"/{loc}/t.gif").body))
        return img.size, "transparency" in img.info

    assert read(port, "fit") == ((50, 33), True)
    assert read(port, "opaque") == ((60, 40), False)
    if nginx_port:
        # libgd keeps the transparent colour only if it survives the resampling exactly
        # (here it does not): only the sizes, and the loss when off, are compared.
        assert read(nginx_port, "fit")[0] == (50, 33)
        assert read(nginx_port, "opaque") == ((60, 40), False)


def test_http2_same(gannet):
    # nginx 1.22 has no `http2 on` (h2c and HTTP/1 on one port): gannet alone.
    conf = CONF.replace("listen 127.0.0.1:{port};", "listen 127.0.0.1:{port}; http2 on;")
    port = gannet.start(conf=conf, files=FILES).port
    for path, size in (("/resize/a.jpg", (40, 26)), ("/proxied/a.webp", (25, 16))):
        r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", f"http://127.0.0.1:{port}{path}"],
                           capture_output=True, timeout=30)
        assert PIL.open(io.BytesIO(r.stdout)).size == size, path
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", "--http2-prior-knowledge",
                        f"http://127.0.0.1:{port}/test/a.txt"], capture_output=True, text=True, timeout=30)
    assert r.stdout == "415 2"


PATHS = [f"/{loc}/{name}" for loc in ("size", "test", "resize", "fit", "crop", "wide", "rotate", "both", "small", "proxied", "proxsize")
         for name in ("a.jpg", "a.png", "a.gif", "a.webp", "tall.png", "tiny.png", "a.txt", "missing.png")]


def test_as_nginx(servers):
    port, nginx_port = servers
    if nginx_port is None:
        pytest.skip("libnginx-mod-http-image-filter not installed")
    for path in PATHS:
        g, n = get(port, path), get(nginx_port, path)
        if path.startswith(("/size/", "/proxsize/")):
            assert (g.status, g.body, g.headers.get("content-type")) == (n.status, n.body, n.headers.get("content-type")), path
        else:
            assert dims(g) == dims(n), path


BAD = [
    "location / { image_filter bogus; }",
    "location / { image_filter rotate 45; }",
    "location / { image_filter resize 0 10; }",
    "location / { image_filter crop 10 x; }",
    "location / { image_filter resize 10; }",
    "image_filter_jpeg_quality 0;",
    "image_filter_buffer 1x;",
    "image_filter_transparency maybe;",
    "image_filter test;",
]


def check(tmp_path, server, peer):
    """`nginx -t` (with Debian's module loaded) and `gannet -t` on one server block."""
    conf = tmp_path / "check.conf"
    main = PEER_MAIN.replace("{tmp}", str(tmp_path))
    conf.write_text((f"load_module {MODULE};\n" if peer else "") + main + "http {\nserver {\nlisten 127.0.0.1:1;\n" + server + "\n}\n}\n")
    run = lambda *cmd: subprocess.run([*cmd, "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30)
    return run(NGINX, "-p", f"{tmp_path}/"), run(str(gannet_bin()))


def test_config_errors_as_nginx(tmp_path):
    if not os.path.exists(MODULE):
        pytest.skip("libnginx-mod-http-image-filter not installed")
    for server in BAD:
        n, g = check(tmp_path, server, True)
        assert n.returncode != 0 and g.returncode != 0, (server, n.stderr, g.stderr)
        msg, line = re.search(r"\] \d+#\d+: (.*) in \S+:(\d+)", n.stderr).groups()
        assert f":{line}: {msg}" in g.stderr or (msg in g.stderr and f":{line}" in g.stderr), (n.stderr, g.stderr)
    good = "image_filter_buffer 2m; image_filter_jpeg_quality $arg_q; image_filter_sharpen 10;" \
           " location / { image_filter resize - 20; image_filter rotate $arg_a; }"
    n, g = check(tmp_path, good, True)
    assert n.returncode == 0 and g.returncode == 0, (n.stderr, g.stderr)


def test_head_as_nginx(servers):
    port, nginx_port = servers
    if nginx_port is None:
        pytest.skip("libnginx-mod-http-image-filter not installed")
    for path in ("/test/a.gif", "/test/a.txt", "/size/a.txt", "/size/a.png", "/resize/a.png", "/proxied/a.png"):
        head = f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        g, n = exchange(port, head), exchange(nginx_port, head)
        assert (g.status, g.headers.get("content-type")) == (n.status, n.headers.get("content-type")), path
        if path.startswith("/size/"):
            assert g.headers.get("content-length") == n.headers.get("content-length"), path


def gif_interlaced(data: bytes) -> bool:
    """The interlace flag of a GIF's first image descriptor."""
    at = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
    while data[at] == 0x21:  # extensions: label, then sub-blocks up to a zero length
        at += 2
        while data[at]:
            at += data[at] + 1
        at += 1
    assert data[at] == 0x2C
    return bool(data[at + 9] & 0x40)


def test_interlace_and_quality_comment(gannet):
    # `image_filter_interlace on` makes an interlaced GIF (rows in GIF's four passes, so it
    # decodes to the same picture); a JPEG names its quality in a comment, as libgd's do.
    conf = CONF.replace("        location /plain/", """        location /flat/ { alias {root}/; image_filter resize 60 60; }
        location /inter/ { alias {root}/; image_filter resize 60 60; image_filter_interlace on; }
        location /q/ { alias {root}/; image_filter resize 60 60; image_filter_jpeg_quality 40; }
        location /plain/""")
    srv = gannet.start(conf=conf, files=FILES)
    flat = exchange(srv.port, b"GET /flat/a.gif HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").body
    inter = exchange(srv.port, b"GET /inter/a.gif HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").body
    assert not gif_interlaced(flat) and gif_interlaced(inter)
    a, b = PIL.open(io.BytesIO(flat)).convert("RGB"), PIL.open(io.BytesIO(inter)).convert("RGB")
    assert a.size == b.size == (60, 40) and a.tobytes() == b.tobytes()
    jpeg = exchange(srv.port, b"GET /resize/a.jpg HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").body
    assert b"quality = 75\n" in jpeg and PIL.open(io.BytesIO(jpeg)).size == (40, 26)
    assert b"quality = 40\n" in exchange(srv.port, b"GET /q/a.jpg HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").body
