"""ngx_http_dav_module: PUT, DELETE, MKCOL, COPY and MOVE against Debian's nginx on the same
config (each server with its own document root), the resulting files and modes compared;
big bodies over HTTP/1.1 and HTTP/2; concurrent PUTs never leaving a torn file; curl -T."""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import Gannet, free_port
from nginx_peer import NGINX, PEER_MAIN, NginxPeer, exchange

CONF = PEER_MAIN + r"""
http {
    access_log off;
    client_body_temp_path {tmp}/cbt;
    client_max_body_size 20m;
    server {
        listen 127.0.0.1:{port};
        root {root};
        location / {
            dav_methods PUT DELETE MKCOL COPY MOVE;
            dav_access group:rw all:r;
        }
        location /full/ { dav_methods PUT; create_full_put_path on; }
        location /deep/ { dav_methods DELETE; min_delete_depth 3; }
        location /ro/ { dav_methods PUT; limit_except GET { deny all; } }
        location /small/ { dav_methods PUT; client_max_body_size 10; }
        location /off/ { dav_methods off; }
    }
}
"""

# Each step: method, path, headers, body.
STEPS = [
    ("PUT", "/a.txt", {}, b"hello"),
    ("PUT", "/a.txt", {}, b"hello again"),
    ("PUT", "/dated.txt", {"Date": "Sun, 06 Nov 1994 08:49:37 GMT"}, b"old"),
    ("PUT", "/nodir/a.txt", {}, b"x"),
    ("PUT", "/full/x/y/a.txt", {}, b"deep"),
    ("PUT", "/coll/", {}, b"x"),
    ("PUT", "/range.txt", {"Content-Range": "bytes 0-0/1"}, b"x"),
    ("PUT", "/empty.txt", {}, b""),
    ("PUT", "/small/big.txt", {}, b"x" * 100),
    ("PUT", "/ro/a.txt", {}, b"x"),
    ("PUT", "/off/a.txt", {}, b"x"),
    ("MKCOL", "/d/", {}, None),
    ("MKCOL", "/d/", {}, None),
    ("MKCOL", "/d2", {}, None),
    ("MKCOL", "/no/such/", {}, None),
    ("MKCOL", "/d3/", {}, b"body"),
    ("PUT", "/d/", {}, b"x"),
    ("PUT", "/d", {}, b"x"),
    ("PUT", "/d/in.txt", {}, b"inside"),
    ("COPY", "/a.txt", {"Destination": "/b.txt"}, None),
    ("COPY", "/a.txt", {"Destination": "/b.txt", "Overwrite": "F"}, None),
    ("COPY", "/a.txt", {"Destination": "/b.txt", "Overwrite": "x"}, None),
    ("COPY", "/a.txt", {}, None),
    ("COPY", "/a.txt", {"Destination": "http://elsewhere/c.txt"}, None),
    ("COPY", "/a.txt", {"Destination": "http://127.0.0.1/c.txt"}, None),
    ("COPY", "/a.txt", {"Destination": "/x/../c.txt"}, None),
    ("COPY", "/a.txt", {"Destination": "/c/"}, None),
    ("COPY", "/a.txt", {"Destination": "/d"}, None),
    ("COPY", "/a.txt", {"Destination": "/e.txt", "Depth": "1"}, None),
    ("COPY", "/missing.txt", {"Destination": "/f.txt"}, None),
    ("COPY", "/d/", {"Destination": "/e/"}, None),
    ("COPY", "/d", {"Destination": "/e2"}, None),
    ("MOVE", "/b.txt", {"Destination": "/moved/deeper/b.txt"}, None),
    ("MOVE", "/e/", {"Destination": "/e3/", "Depth": "0"}, None),
    ("MOVE", "/e/", {"Destination": "/e3/"}, None),
    ("COPY", "/e3/", {"Destination": "/d/"}, None),
    ("DELETE", "/d", {}, None),
    ("DELETE", "/d/", {"Depth": "0"}, None),
    ("DELETE", "/d/", {}, None),
    ("DELETE", "/missing.txt", {}, None),
    ("DELETE", "/a.txt/x", {}, None),
    ("DELETE", "/a.txt", {"Depth": "1"}, None),
    ("DELETE", "/a.txt", {}, b"body"),
    ("DELETE", "/a.txt", {}, None),
    ("DELETE", "/deep/x", {}, None),
]


def request(port: int, method: str, path: str, headers: dict, body: bytes | None):
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    for k, v in headers.items():
        head += f"{k}: {v}\r\n"
    if body is not None:
        head += f"Content-Length: {len(body)}\r\n"
    return exchange(port, head.encode() + b"\r\n" + (body or b""))


def tree(root: Path) -> dict:
    """Every file and folder under root: kind, mode, contents (files), mtime if it was set."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rel = str(p.relative_to(root))
        if stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", oct(st.st_mode & 0o7777))
        else:
            mtime = int(st.st_mtime) if st.st_mtime < 10**9 else None
            out[rel] = ("file", oct(st.st_mode & 0o7777), p.read_bytes(), mtime)
    return out


@pytest.mark.skipif(NGINX is None, reason="nginx not installed")
def test_every_method_and_error_as_nginx(tmp_path):
    g = Gannet(tmp_path / "gannet")
    g.tmp.mkdir()
    groot = g.write_files({"keep.txt": "k"})
    nroot = tmp_path / "nroot"
    nroot.mkdir()
    (nroot / "keep.txt").write_text("k")
    nport = free_port()
    nginx = NginxPeer(CONF, nport, nroot, tmp_path / "nginx")
    try:
        srv = g.start(conf=CONF)
        for method, path, headers, body in STEPS:
            a = request(srv.port, method, path, headers, body)
            b = request(nport, method, path, headers, body)
            what = f"{method} {path} {headers}"
            assert a.status == b.status, what
            for h in ("location", "content-length"):
                want = b.headers.get(h, "").replace(str(nport), str(srv.port))
                assert a.headers.get(h, "") == want, (what, h)
            assert tree(groot) == tree(nroot), what
        # nginx since 1.23 refuses a copy onto itself or into itself (1.22 truncates the
        # file, or recurses): checked on gannet alone.
        for path, dest in (("/keep.txt", "/keep.txt"), ("/e3/", "/e3/sub/")):
            assert request(srv.port, "COPY", path, {"Destination": dest}, None).status == 403
        assert (groot / "keep.txt").read_text() == "k"
        # The bodies went through the temp folder and left nothing there.
        assert list((g.tmp / "cbt").rglob("*")) == []
        log = (g.tmp / "error.log").read_text()
        for line in ("cannot PUT to a collection", "MKCOL can create a collection only",
                     "could not be created (17: File exists)", "\"Depth\" header must be infinity",
                     "insufficient URI depth:2 to DELETE", "is handled by different repository"):
            assert line in log
    finally:
        nginx.stop()
        g.close()


BIG = os.urandom(5 * 1024 * 1024 + 123)


def curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("h2", [False, True])
@pytest.mark.parametrize("chunked", [False, True])
def test_big_put_bodies(gannet, tmp_path, h2, chunked):
    src = tmp_path / "big.bin"
    src.write_bytes(BIG)
    listen = "listen 127.0.0.1:{port} http2;" if h2 else "listen 127.0.0.1:{port};"
    conf = PEER_MAIN + """
http { client_body_temp_path {tmp}/cbt; client_max_body_size 20m;
  server { %s root {root}; location / { dav_methods PUT; } } }
""" % listen
    srv = gannet.start(conf=conf)
    args = ["-X", "PUT", "--data-binary", f"@{src}"]
    if chunked:
        args += ["-H", "Transfer-Encoding: chunked"]
    args += ["--http2-prior-knowledge"] if h2 else ["--http1.1"]
    r = curl(*args, f"{srv.base}/big.bin")
    assert r.stdout == ("201 2" if h2 else "201 1.1")
    assert (srv.root / "big.bin").read_bytes() == BIG
    r = curl(*args, f"{srv.base}/big.bin")
    assert r.stdout.startswith("204")
    assert list((srv.tmp / "cbt").rglob("*")) == []


def test_concurrent_puts_never_tear_the_file(gannet, tmp_path):
    srv = gannet.start(server=f"client_body_temp_path {gannet.tmp}/cbt; client_max_body_size 20m;"
                              " location / { dav_methods PUT; }")
    bodies = [bytes([65 + i]) * (2 * 1024 * 1024) for i in range(6)]
    for i, b in enumerate(bodies):
        (tmp_path / f"b{i}").write_bytes(b)
    target = srv.root / "same.bin"
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.append(target.read_bytes())
            except FileNotFoundError:
                pass

    t = threading.Thread(target=reader)
    t.start()
    procs = [subprocess.Popen(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-T", str(tmp_path / f"b{i}"),
                               f"{srv.base}/same.bin"], stdout=subprocess.PIPE, text=True) for i in range(len(bodies))]
    codes = [p.communicate(timeout=60)[0] for p in procs]
    stop.set()
    t.join()
    assert sorted(codes) and all(c in ("201", "204") for c in codes)
    assert target.read_bytes() in bodies
    assert all(s in bodies for s in seen)
    assert list((srv.tmp / "cbt").rglob("*")) == []


def test_curl_upload_and_refusals(gannet, tmp_path):
    src = tmp_path / "up.txt"
    src.write_text("uploaded\n")
    srv = gannet.start(server=f"client_body_temp_path {gannet.tmp}/cbt; location / {{ dav_methods PUT DELETE; }}"
                              " location /x/ { }")
    assert curl("-T", str(src), f"{srv.base}/up.txt").stdout.startswith("201")
    assert (srv.root / "up.txt").read_text() == "uploaded\n"
    assert stat.S_IMODE((srv.root / "up.txt").stat().st_mode) == 0o600
    # Without dav_methods, PUT is the static module's 405.
    assert curl("-T", str(src), f"{srv.base}/x/up.txt").stdout.startswith("405")
    assert curl("-X", "DELETE", f"{srv.base}/up.txt").stdout.startswith("204")
    assert not (srv.root / "up.txt").exists()


def test_config_errors(gannet):
    for bad, msg in (("dav_methods PUT GET;", 'invalid value "GET"'),
                     ("dav_access user:rwx;", 'invalid value "user:rwx"'),
                     ("dav_access all:r; dav_access all:r;", '"dav_access" directive is duplicate'),
                     ("min_delete_depth x;", '"min_delete_depth" directive invalid number'),
                     ("create_full_put_path yes;", 'it must be "on" or "off"')):
        r = gannet.check(server=bad)
        assert r.returncode != 0 and msg in r.stderr and "check.conf:" in r.stderr, (bad, r.stderr)
