"""Request bodies read whole for an application, held within a memory budget: up to
`client_body_buffer_size` in memory, a bigger one in a temporary file under
`client_body_temp_path` that has no name (nothing appears in the folder), then sent upstream
from the file. The upstreams are raw servers that hash what they get; the memory test polls
gannet's /proc status while big uploads run; the disk-full test mounts a small tmpfs."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import threading

import pytest

from conftest import wait_until
from rawapps import HttpApp, Listener, http_answer, made

BLOCK = hashlib.sha256(b"gannet").digest() * 32768  # 1 MiB, not all one byte


def upload_of(mib: int) -> tuple[int, str]:
    """The length and sha256 of `mib` MiB of BLOCK."""
    h = hashlib.sha256()
    for _ in range(mib):
        h.update(BLOCK)
    return mib * len(BLOCK), h.hexdigest()


def post(port: int, path: str, mib: int, headers: str = "") -> bytes:
    """POST `mib` MiB of BLOCK with a Content-Length; returns the raw answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {mib * len(BLOCK)}\r\n"
                  f"Connection: close\r\n{headers}\r\n".encode())
        for _ in range(mib):
            s.sendall(BLOCK)
        out = b""
        while got := s.recv(65536):
            out += got
        return out


class HashApp(Listener):
    """Reads each request's body as it comes (by its Content-Length) into a hash, then
    answers with the length and sha256 it got, and the X-Body header (for
    `$request_body`). `requests` keeps (head, length, sha256) of each."""

    def __init__(self):
        self.requests: list[tuple[bytes, int, str]] = []
        super().__init__()

    def serve(self, conn):
        buf = b""
        while b"\r\n\r\n" not in buf:
            got = conn.recv(65536)
            if not got:
                return
            buf += got
        head, rest = buf.split(b"\r\n\r\n", 1)
        length, x_body = 0, b""
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"x-body":
                x_body = value.strip()
        h, n = hashlib.sha256(rest), len(rest)
        while n < length:
            got = conn.recv(1 << 20)
            if not got:
                return
            h.update(got)
            n += len(got)
        self.requests.append((head, n, h.hexdigest()))
        text = f"{n} {h.hexdigest()} [".encode() + x_body + b"]"
        conn.sendall(http_answer(text, keep=False))
        conn.close()


@pytest.fixture
def app():
    yield from made(HashApp)


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def body_of(raw: bytes) -> bytes:
    return raw.partition(b"\r\n\r\n")[2]


def temp_fds(pid: int, folder) -> list[str]:
    """gannet's open files in `folder` (a nameless file shows as `folder/#N (deleted)`)."""
    out = []
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder) + "/"):
            out.append(target)
    return out


def vm(pid: int, key: str) -> int:
    """A /proc/PID/status figure (VmRSS, VmHWM) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key}")


def test_big_uploads_stay_out_of_memory_and_arrive_whole(gannet, app):
    """Two clients send 200 MiB each at once through a proxied location with a 16k buffer:
    gannet's peak RSS grows by far less than one body, the upstream gets every byte, and
    the temp folder stays empty while the files are in use (they have no name)."""
    upstream = app()
    temp = gannet.tmp / "bodies"
    srv = gannet.start(http="client_max_body_size 0;", server=f"""
        client_body_buffer_size 16k;
        client_body_temp_path {temp} 1 2;
        location / {{ proxy_pass http://127.0.0.1:{upstream.port}; }}
    """)
    pid = srv.worker_pid()
    # A first body through a file, so the folder and the code paths are warm.
    assert body_of(post(srv.port, "/warm", 1)).startswith(f"{len(BLOCK)} ".encode())
    base = vm(pid, "VmRSS")
    mib = 200
    length, digest = upload_of(mib)
    results: list[bytes] = []
    seen_files, listed, peak = set(), set(), [base]
    clients = [threading.Thread(target=lambda: results.append(post(srv.port, "/up", mib))) for _ in range(2)]
    for c in clients:
        c.start()

    def watch():
        peak[0] = max(peak[0], vm(pid, "VmRSS"))
        seen_files.update(temp_fds(pid, temp))
        listed.update(os.listdir(temp))
        return len(results) == 2

    assert wait_until(watch, deadline=300, every=0.02), "uploads did not finish"
    for c in clients:
        c.join()
    for raw in results:
        assert status_of(raw) == 200, raw[:300]
        assert body_of(raw) == f"{length} {digest} []".encode()
    assert seen_files, "the bodies were never in temporary files"
    assert all(f.endswith("(deleted)") for f in seen_files), seen_files
    assert listed == set(), f"files appeared in the temp folder: {listed}"
    assert os.listdir(temp) == []
    assert temp_fds(pid, temp) == [], "temporary files still open after the requests"
    assert f"[warn] " in srv.error_log() and f"a client request body is buffered to a temporary file {temp}" in srv.error_log()
    growth = max(peak[0], vm(pid, "VmHWM")) - base
    assert growth < 32 * 1024 * 1024, f"RSS grew by {growth >> 20} MiB for two {mib} MiB bodies"


def test_request_body_variable_is_the_body_in_memory_only(gannet, app):
    """`$request_body` as nginx: the body while it is in memory, empty once it is in a
    file (over the buffer, or with `client_body_in_file_only`), whose bytes still go."""
    upstream = app()
    srv = gannet.start(server=f"""
        client_body_buffer_size 1k;
        client_body_temp_path {gannet.tmp}/bodies;
        location / {{
            proxy_set_header X-Body $request_body;
            proxy_pass http://127.0.0.1:{upstream.port};
        }}
        location /file/ {{
            client_body_in_file_only clean;
            proxy_set_header X-Body $request_body;
            proxy_pass http://127.0.0.1:{upstream.port};
        }}
    """)
    small = b"name=value&x=1"
    status, _, body = srv.request("POST", "/m", {}, small)
    assert (status, body) == (200, f"{len(small)} {hashlib.sha256(small).hexdigest()} [".encode() + small + b"]")
    for path, data in (("/m", b"y" * 1025), ("/file/f", small)):
        status, _, body = srv.request("POST", path, {}, data)
        assert (status, body) == (200, f"{len(data)} {hashlib.sha256(data).hexdigest()} []".encode()), path
    # Exactly the buffer size stays in memory, as in nginx.
    edge = b"z" * 1024
    status, _, body = srv.request("POST", "/m", {}, edge)
    assert body.endswith(b"[" + edge + b"]")


def test_chunked_body_over_http2_goes_through_a_file(gannet, app):
    """HTTP/2 bodies take the same path: a chunked-like body (no content-length) of 3 MiB
    over h2c arrives whole, with nothing left in the folder."""
    upstream = app()
    temp = gannet.tmp / "bodies"
    # h2c next to HTTP/1.1 on the same address: `http2 on`.
    srv = gannet.start(server=f"""
        http2 on;
        client_body_temp_path {temp};
        client_max_body_size 10m;
        location / {{ proxy_pass http://127.0.0.1:{upstream.port}; }}
    """)
    data_file = gannet.tmp / "upload.bin"
    data = BLOCK * 3
    data_file.write_bytes(data)
    r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-H", "Transfer-Encoding:", "-H", "Content-Length:",
                        "--data-binary", f"@{data_file}", "-w", "|%{http_version}", f"http://127.0.0.1:{srv.port}/h2"],
                       capture_output=True, timeout=60)
    assert r.stdout == f"{len(data)} {hashlib.sha256(data).hexdigest()} []|2".encode(), r.stdout[:300]
    assert os.listdir(temp) == []


def test_mirrored_copy_reads_the_file_too(gannet, app):
    """A mirrored request takes the body from the same file, from its start."""
    main, shadow = app(), app()
    srv = gannet.start(server=f"""
        client_body_temp_path {gannet.tmp}/bodies;
        client_max_body_size 10m;
        location / {{ mirror /copy; proxy_pass http://127.0.0.1:{main.port}; }}
        location /copy {{ internal; proxy_pass http://127.0.0.1:{shadow.port}; }}
    """)
    length, digest = upload_of(2)
    raw = post(srv.port, "/m", 2)
    assert body_of(raw) == f"{length} {digest} []".encode()
    assert wait_until(lambda: len(shadow.requests) == 1)
    assert shadow.requests[0][1:] == (length, digest)


def test_next_server_gets_the_body_again_from_the_file(gannet, app):
    """A server that fails after taking the body: the next one of the group gets all of
    it, read again from the file's start."""
    good = app()
    dead = HttpApp(lambda conn, head, body: None)  # takes the body, closes without answer
    try:
        srv = gannet.start(http=f"""
            upstream both {{ server 127.0.0.1:{dead.port}; server 127.0.0.1:{good.port}; }}
        """, server=f"""
            client_body_temp_path {gannet.tmp}/bodies;
            client_max_body_size 10m;
            location / {{ proxy_next_upstream error non_idempotent; proxy_pass http://both; }}
        """)
        length, digest = upload_of(2)
        raw = post(srv.port, "/r", 2)
        assert body_of(raw) == f"{length} {digest} []".encode(), raw[:300]
        assert len(dead.requests) == 1 and len(dead.requests[0][2]) == length
    finally:
        dead.close()


def test_full_disk_is_a_500_for_that_request_only(gannet, app, tmp_path):
    """A temp folder on a 1 MiB tmpfs: a 4 MiB body fails with a 500 and nginx's `pwrite()`
    line; a small body and another that fits still go, and nothing is left on the disk."""
    temp = tmp_path / "small-disk"
    temp.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(temp)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        upstream = app()
        srv = gannet.start(server=f"""
            client_body_temp_path {temp};
            client_max_body_size 10m;
            location / {{ proxy_pass http://127.0.0.1:{upstream.port}; }}
        """)
        raw = post(srv.port, "/big", 4)
        assert status_of(raw) == 500, raw[:300]
        assert upstream.requests == []
        logged = r"\[crit\] .*" + re.escape(f'pwrite() "{temp}" failed (28: No space left on device)')
        assert wait_until(lambda: re.search(logged, srv.error_log())), srv.error_log()
        status, _, body = srv.request("POST", "/small", {}, b"ok")
        assert (status, body) == (200, f"2 {hashlib.sha256(b'ok').hexdigest()} []".encode())
        half = BLOCK[: 512 * 1024]
        status, _, body = srv.request("POST", "/half", {}, half)
        assert (status, body) == (200, f"{len(half)} {hashlib.sha256(half).hexdigest()} []".encode())
        assert os.listdir(temp) == []
        srv.stop()
    finally:
        subprocess.run(["umount", str(temp)], capture_output=True)


def test_unusable_temp_path_is_a_500_with_the_reason(gannet, app):
    """A temp folder that became a plain file after the start: a body over the buffer gets
    a 500 and nginx's line with the call and errno; a body in memory does not need the
    folder."""
    upstream = app()
    bodies = gannet.tmp / "bodies"
    srv = gannet.start(server=f"""
        client_body_temp_path {bodies};
        location / {{ proxy_pass http://127.0.0.1:{upstream.port}; }}
    """)
    bodies.rmdir()
    bodies.write_text("not a folder")
    status, _, _ = srv.request("POST", "/big", {}, b"x" * 100_000)
    assert status == 500
    assert wait_until(lambda: f'"{bodies}" failed (20: Not a directory)' in srv.error_log()), srv.error_log()
    status, _, body = srv.request("POST", "/small", {}, b"ok")
    assert status == 200 and body.startswith(b"2 ")


@pytest.mark.parametrize("line, message", [
    ("client_body_temp_path t 0;", '"client_body_temp_path" directive invalid value'),
    ("client_body_temp_path t 11;", '"client_body_temp_path" directive invalid value'),
    ("client_body_temp_path t x;", '"client_body_temp_path" directive invalid value'),
    ("client_body_temp_path t 1 2 3 4;", 'invalid number of arguments in "client_body_temp_path" directive'),
    ("client_body_buffer_size abc;", '"client_body_buffer_size" directive invalid value'),
    ("client_body_in_file_only maybe;", 'invalid value "maybe"'),
    ("client_body_in_single_buffer yes;", 'invalid value "yes" in "client_body_in_single_buffer" directive'),
])
def test_bad_values_are_named_with_their_line(gannet, line, message):
    r = gannet.check(server=f"location / {{\n{line}\n}}")
    assert r.returncode != 0
    lines = (gannet.tmp / "check.conf").read_text().splitlines()
    lineno = next(i for i, text in enumerate(lines, 1) if text.strip() == line)
    assert f"check.conf:{lineno}: {message}" in r.stderr, r.stderr


def test_nginx_syntax_loads(gannet):
    r = gannet.check(server="""
        client_body_buffer_size 128k;
        client_body_temp_path /var/tmp/gannet-bodies 1 2 3;
        client_body_in_file_only off;
        client_body_in_single_buffer on;
        location /up { client_body_in_file_only on; client_body_temp_path t 10; }
    """)
    assert r.returncode == 0, r.stderr
    assert "client_body" not in r.stderr, r.stderr
