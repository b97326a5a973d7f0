"""The command line and the process, as nginx's: `-t` (with file:line diagnostics), `-V`,
the zero-config mode (no arguments: serve the current directory), the pid file, signals
(SIGTERM, graceful SIGQUIT, `-s stop`) and start-up failures (port in use, missing include).
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import Gannet, free_port, gannet_bin, wait_port, wait_until

GOOD = "events {}\nhttp {\n    server {\n        listen 127.0.0.1:{port};\n        root {root};\n%s    }\n}\n"


def conf_with(line: str) -> str:
    """A minimal whole config with `line` inside the server block (on line 6)."""
    return GOOD % f"        {line}\n"


def check(gannet, conf: str, **kw) -> subprocess.CompletedProcess:
    """`gannet -t` on a whole config; returns the result with the config's path in `.conf`."""
    r = gannet.check(conf=conf, **kw)
    r.conf = str(gannet.tmp / "check.conf")
    return r


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(gannet_bin()), *args], capture_output=True, text=True, timeout=30, **kw)


def exits(proc: subprocess.Popen, deadline: float = 5.0) -> int | None:
    """The exit code if the process ends within the deadline, else None."""
    try:
        return proc.wait(deadline)
    except subprocess.TimeoutExpired:
        return None


def get(port: int, path: str, keep_alive: bool = False) -> tuple[socket.socket, bytes]:
    """Send a GET on a new connection and read one whole response (framed by Content-Length)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn = "keep-alive" if keep_alive else "close"
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: {conn}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, body = buf.split(b"\r\n\r\n", 1)
    length = int(next(l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += s.recv(65536)
    return s, head + b"\r\n\r\n" + body


def is_closed(s: socket.socket, within: float = 5.0) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


# --- gannet -t --------------------------------------------------------------------------------

def test_t_good_config(gannet):
    r = check(gannet, conf_with("index index.html;"))
    assert r.returncode == 0, r.stderr
    assert "syntax is ok" in r.stderr and "test is successful" in r.stderr


def test_t_unknown_directive_names_file_line(gannet):
    r = check(gannet, conf_with("bogus_directive on;"))
    assert r.returncode != 0
    assert f"{r.conf}:6:" in r.stderr
    assert '"bogus_directive"' in r.stderr and "unknown directive" in r.stderr
    assert "test failed" in r.stderr


def test_t_directive_in_wrong_context(gannet):
    r = check(gannet, "events {}\nhttp {\n    listen 127.0.0.1:{port};\n}\n")
    assert r.returncode != 0
    assert f"{r.conf}:3:" in r.stderr
    assert '"listen" directive is not allowed here' in r.stderr


def test_t_ignored_nginx_directive_is_a_notice(gannet):
    r = check(gannet, "events {}\nhttp {\n    types_hash_max_size 2048;\n}\n")
    assert r.returncode == 0, r.stderr
    assert "[notice]" in r.stderr and f"{r.conf}:3:" in r.stderr
    assert "types_hash_max_size" in r.stderr
    assert "syntax is ok" in r.stderr


def test_t_missing_include_names_file_line(gannet):
    r = check(gannet, "events {}\nhttp {\n\n    include {tmp}/missing.conf;\n}\n")
    assert r.returncode != 0
    assert f"{r.conf}:4:" in r.stderr
    assert "missing.conf" in r.stderr


def test_t_debian_stock_nginx_conf():
    stock = Path("/etc/nginx/nginx.conf")
    if not stock.exists():
        pytest.skip("no /etc/nginx/nginx.conf here")
    r = run("-t", "-c", str(stock))
    assert r.returncode == 0, r.stderr
    assert "syntax is ok" in r.stderr


def test_version_flag():
    r = run("-V")
    assert r.returncode == 0
    out = r.stdout + r.stderr
    assert "gannet/" in out
    version = out.split("gannet/", 1)[1].split()[0]
    assert version[0].isdigit() and "." in version


# --- zero-config mode ------------------------------------------------------------------------------

def test_no_arguments_serves_current_directory(tmp_path):
    (tmp_path / "hello.txt").write_text("hi there")
    (tmp_path / "sub").mkdir()
    port = free_port()
    # No /etc/gannet/gannet.conf stand-in, whatever the machine has.
    env = dict(os.environ, GANNET_LISTEN=f"127.0.0.1:{port}", GANNET_DEFAULT_CONF=str(tmp_path / "absent.conf"))
    proc = subprocess.Popen([str(gannet_bin())], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_port(port, proc)
        s, resp = get(port, "/hello.txt")
        s.close()
        assert resp.startswith(b"HTTP/1.1 200 ") and resp.endswith(b"\r\n\r\nhi there")
        s, resp = get(port, "/")
        s.close()
        assert resp.startswith(b"HTTP/1.1 200 ")
        assert b'<a href="hello.txt">' in resp and b'<a href="sub/">' in resp
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    assert f"http://127.0.0.1:{port}/" in err.decode()


# --- pid file and signals -----------------------------------------------------------------------------

def pid_file_content(srv) -> str | None:
    p = srv.tmp / "gannet.pid"
    return p.read_text().strip() if p.exists() else None


def test_pid_file_written_and_removed_on_sigterm(gannet):
    srv = gannet.start(files={"a.txt": "a"})
    assert wait_until(lambda: pid_file_content(srv)) == str(srv.proc.pid)
    srv.proc.send_signal(signal.SIGTERM)
    assert exits(srv.proc) == 0
    assert not (srv.tmp / "gannet.pid").exists()


BIG = bytes(range(256)) * (64 * 1024)  # 16 MB: more than the socket buffers hold


def test_sigquit_closes_idle_and_finishes_in_flight(gannet):
    srv = gannet.start(files={"a.txt": "a", "big.bin": BIG})
    idle, resp = get(srv.port, "/a.txt", keep_alive=True)
    assert resp.startswith(b"HTTP/1.1 200 ")
    # A response in flight: its head has arrived, the body is stuck behind our unread buffer.
    busy = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    busy.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    got = busy.recv(65536)
    assert got.startswith(b"HTTP/1.1 200 ")
    srv.proc.send_signal(signal.SIGQUIT)
    try:
        assert is_closed(idle), "the idle keep-alive connection was not closed"
        head, body = got.split(b"\r\n\r\n", 1)
        assert f"Content-Length: {len(BIG)}".encode() in head
        while len(body) < len(BIG) and (chunk := busy.recv(1 << 20)):
            body += chunk
        assert hashlib.sha256(body).digest() == hashlib.sha256(BIG).digest()
        assert is_closed(busy)
    finally:
        idle.close()
        busy.close()
    assert exits(srv.proc) == 0


def test_s_stop_stops_running_instance(gannet):
    srv = gannet.start(files={"a.txt": "a"})
    assert wait_until(lambda: pid_file_content(srv))
    r = run("-s", "stop", "-c", str(srv.conf_path))
    assert r.returncode == 0, r.stderr
    assert exits(srv.proc) == 0


# --- start-up failures --------------------------------------------------------------------------------

def test_port_in_use_by_another_program(gannet):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        srv = gannet.start(port=holder.getsockname()[1], wait=False)
        assert exits(srv.proc) not in (None, 0)
    assert "bind()" in srv.proc.stderr.read().decode()


def test_port_in_use_by_another_gannet(gannet, tmp_path_factory):
    first = gannet.start(files={"a.txt": "a"})
    other = Gannet(tmp_path_factory.mktemp("second"))
    try:
        second = other.start(port=first.port, wait=False)
        assert exits(second.proc) not in (None, 0)
        assert "bind()" in second.proc.stderr.read().decode()
    finally:
        other.close()
    assert first.proc.poll() is None
