"""Process-level behaviour: `daemon on`, and running out of file descriptors (EMFILE)
without failing the connections already open."""

import os
import signal
import socket
import subprocess

from conftest import gannet_bin, wait_port, wait_until


def wait_for(predicate, deadline: float = 10.0, what: str = "condition"):
    value = wait_until(predicate, deadline)
    assert value, f"timed out waiting for {what}"
    return value


def test_daemon_on_detaches_and_serves(gannet):
    text, port = gannet.render(main="daemon on;")
    gannet.write_files({"a.txt": "daemon"})
    conf = gannet.tmp / "daemon.conf"
    conf.write_text(text)
    # The foreground process returns at once; the daemon lives on.
    done = subprocess.run([str(gannet_bin()), "-c", str(conf)], capture_output=True, timeout=10)
    assert done.returncode == 0, done.stderr
    pid_file = gannet.tmp / "gannet.pid"
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="pid file"))
    try:
        wait_port(port)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /a.txt HTTP/1.0\r\n\r\n")
            out = b""
            while chunk := s.recv(4096):
                out += chunk
        assert out.startswith(b"HTTP/1.1 200 OK") and out.endswith(b"daemon")
        # A daemon is not the child of the process that started it.
        assert os.getsid(pid) == pid
    finally:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not pid_file.exists(), what="pid file removal after SIGTERM")


def test_out_of_descriptors_keeps_serving(gannet):
    # A descriptor limit of 64 leaves room for about 50 client connections.
    srv = gannet.start(main="worker_rlimit_nofile 64;", files={"a.txt": "x"}, http="keepalive_timeout 30s;")
    # Served once first, so the file is in the worker's cache and needs no descriptor.
    assert srv.get("/a.txt")[0] == 200
    held = []
    try:
        for _ in range(80):
            held.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
        # The first connections were accepted and work, even while the server is out of
        # descriptors for the later ones.
        for s in held[:20]:
            s.sendall(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200 OK")
        wait_for(lambda: "accept() failed" in srv.error_log(), what="the EMFILE log line")
        assert srv.error_log().count("accept() failed") == 1, "EMFILE must be logged once"
    finally:
        for s in held:
            s.close()
    # With the descriptors back, new connections are served again.
    status, _, body = wait_for(lambda: _try_get(srv), what="service after EMFILE")
    assert (status, body) == (200, b"x")
    assert srv.proc.poll() is None


def _try_get(srv):
    try:
        return srv.get("/a.txt")
    except OSError:
        return None


def test_listen_deferred_serves(gannet):
    port = gannet.render()[1]
    srv = gannet.start(
        conf=gannet.render(port=port)[0].replace(f"listen 127.0.0.1:{port};", f"listen 127.0.0.1:{port} deferred;"),
        files={"a.txt": "deferred"},
        port=port,
    )
    assert "deferred" in srv.conf_path.read_text()
    assert srv.get("/a.txt")[::2] == (200, b"deferred")


def _buffers(port):
    """(rb, tb) of the server side of the one established connection on `port`, from `ss`."""
    out = subprocess.run(["ss", "-tmnH", "state", "established", f"sport = :{port}"],
                         capture_output=True, text=True, check=True).stdout
    mem = out.split("skmem:(", 1)[1].split(")", 1)[0].split(",")
    fields = {f.rstrip("0123456789"): int(f.lstrip("abcdefghijklmnopqrstuvwxyz")) for f in mem}
    return fields["rb"], fields["tb"]


def _connected_buffers(srv):
    with socket.create_connection(("127.0.0.1", srv.port)) as c:
        c.sendall(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.recv(4096).startswith(b"HTTP/1.1 200")
        return _buffers(srv.port)


def test_listen_socket_buffers(gannet):
    """`rcvbuf=` / `sndbuf=` set SO_RCVBUF / SO_SNDBUF on the listening socket, which its
    connections inherit (Linux stores twice the size asked for); a reload that changes them
    applies the new sizes to the kept socket, as nginx does."""
    port = gannet.render()[1]
    plain = f"listen 127.0.0.1:{port};"
    conf = gannet.render(port=port)[0]
    srv = gannet.start(conf=conf.replace(plain, f"listen 127.0.0.1:{port} rcvbuf=32k sndbuf=64k;"),
                       files={"a.txt": "x"}, port=port)
    assert _connected_buffers(srv) == (65536, 131072)
    srv.conf_path.write_text(conf.replace(plain, f"listen 127.0.0.1:{port} rcvbuf=48k sndbuf=96k;"))
    srv.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: _connected_buffers(srv) == (98304, 196608), what="the reloaded sizes")
    assert srv.proc.poll() is None


def test_listen_socket_buffer_sizes_are_checked(gannet):
    conf, port = gannet.render()
    for bad in ("sndbuf=1x", "rcvbuf=", "sndbuf=4g"):
        r = gannet.check(conf=conf.replace(f"listen 127.0.0.1:{port};", f"listen 127.0.0.1:{port} {bad};"))
        key, value = bad.split("=")
        assert r.returncode != 0
        assert f'check.conf:{conf.splitlines().index(f"        listen 127.0.0.1:{port};") + 1}: invalid {key} "{value}"' in r.stderr, r.stderr
