"""Process-level behaviour: `daemon on`, running out of file descriptors (EMFILE) without
failing the connections already open, the listening sockets' options, and where and at what
priority the workers run."""

import ctypes
import os
import signal
import socket
import subprocess

import pytest

from conftest import gannet_bin, read_head, wait_port, wait_until


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
    """(rb, tb) of the server side of the one established connection on `port`, from `ss`;
    None when the server has closed it already (a worker that a reload is retiring answers
    and closes)."""
    out = subprocess.run(["ss", "-tmnH", "state", "established", f"sport = :{port}"],
                         capture_output=True, text=True, check=True).stdout
    if "skmem:(" not in out:
        return None
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


def _gannet_socket(pid, port, state="0A"):
    """A duplicate (pidfd_getfd, Linux 5.6+) of gannet's listening socket on `port`, or with
    `state="01"` of a connection it accepted there, to read its options as the kernel has
    them."""
    inodes = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[3] == state and int(f[1].split(":")[1], 16) == port:  # 0A LISTEN, 01 ESTABLISHED
            inodes.add(f[9])
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            pidfd = os.pidfd_open(pid)
            try:
                dup = ctypes.CDLL(None).syscall(438, pidfd, int(fd), 0)  # SYS_pidfd_getfd
            finally:
                os.close(pidfd)
            if dup >= 0:  # else closed since the listing (a copy a reload let go)
                return socket.socket(fileno=dup)
    raise AssertionError(f"no socket in state {state} on {port} in {pid}")


def test_listen_keepalive_and_fastopen(gannet):
    """`so_keepalive=` and `fastopen=` set the listening socket's options, as nginx does;
    without them the system's defaults stay (no keepalive probes)."""
    port = gannet.render()[1]
    plain = f"listen 127.0.0.1:{port};"
    conf = gannet.render(port=port)[0]
    srv = gannet.start(conf=conf, files={"a.txt": "x"}, port=port)
    with _gannet_socket(srv.proc.pid, port) as s:
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_FASTOPEN) == 0
    srv.stop()
    srv = gannet.start(conf=conf.replace(plain, f"listen 127.0.0.1:{port} so_keepalive=10m::4 fastopen=64;"),
                       files={"a.txt": "x"}, port=port)
    with _gannet_socket(srv.proc.pid, port) as s:
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 600
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == int(open("/proc/sys/net/ipv4/tcp_keepalive_intvl").read())
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 4
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_FASTOPEN) == 64
    # An accepted connection inherits them (seen from its keepalive timer in `ss`).
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        assert c.recv(4096).startswith(b"HTTP/1.1 200")
        out = subprocess.run(["ss", "-tonH", "state", "established", f"sport = :{port}"],
                             capture_output=True, text=True, check=True).stdout
        assert "timer:(keepalive,9min" in out or "timer:(keepalive,10min" in out, out
    # Reloaded with so_keepalive=off: the kept socket has it off again.
    srv.conf_path.write_text(conf.replace(plain, f"listen 127.0.0.1:{port} so_keepalive=off;"))
    srv.proc.send_signal(signal.SIGHUP)

    def off():
        with _gannet_socket(srv.proc.pid, port) as s:
            return s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    wait_for(off, what="keepalive off after the reload")


def _unsent_limit(srv):
    """TCP_NOTSENT_LOWAT of gannet's side of the one connection on its port."""
    with _gannet_socket(srv.worker_pid(), srv.port, state="01") as conn:
        return conn.getsockopt(socket.IPPROTO_TCP, 25)  # TCP_NOTSENT_LOWAT


def test_kept_connections_keep_little_unsent(gannet):
    """A connection kept after its answer gets TCP_NOTSENT_LOWAT at 16 KiB (send.rs says
    why); one that closes after its answer does not; a large file arrives whole either way.
    12 MB: more than the kernel takes into the socket (4 MB at most) and the client's buffer
    while it reads nothing, so gannet's side is still sending when the test looks at it."""
    big = os.urandom(12 << 20)
    srv = gannet.start(files={"big.bin": big})
    with _gannet_socket(srv.proc.pid, srv.port) as s:
        system = s.getsockopt(socket.IPPROTO_TCP, 25)
    assert system != 16384
    for close, expected in ((True, system), (False, 16384)):
        with socket.create_connection(("127.0.0.1", srv.port)) as c:
            c.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n" + (b"Connection: close\r\n" if close else b"") + b"\r\n")
            f = c.makefile("rb")
            head = read_head(f)
            assert head.startswith(b"HTTP/1.1 200") and f"Content-Length: {len(big)}".encode() in head
            # The rest is still on its way: the connection is open on both sides.
            assert _unsent_limit(srv) == expected
            assert f.read(len(big)) == big


def test_listen_keepalive_and_fastopen_values_are_checked(gannet):
    conf, port = gannet.render()
    line = conf.splitlines().index(f"        listen 127.0.0.1:{port};") + 1
    for bad, says in (("so_keepalive=::", 'invalid so_keepalive value: "::"'),
                      ("so_keepalive=1x", 'invalid so_keepalive value: "1x"'),
                      ("so_keepalive=::200", 'invalid so_keepalive value: "::200"'),
                      ("so_keepalive=yes", 'invalid so_keepalive value: "yes"'),
                      ("fastopen=-1", 'invalid fastopen "-1"'),
                      ("fastopen=", 'invalid fastopen ""')):
        r = gannet.check(conf=conf.replace(f"listen 127.0.0.1:{port};", f"listen 127.0.0.1:{port} {bad};"))
        assert r.returncode != 0
        assert f"check.conf:{line}: {says}" in r.stderr, r.stderr
    ok = gannet.check(conf=conf.replace(f"listen 127.0.0.1:{port};", f"listen 127.0.0.1:{port} so_keepalive=on;"))
    assert ok.returncode == 0, ok.stderr


def test_listen_socket_buffer_sizes_are_checked(gannet):
    conf, port = gannet.render()
    for bad in ("sndbuf=1x", "rcvbuf=", "sndbuf=4g"):
        r = gannet.check(conf=conf.replace(f"listen 127.0.0.1:{port};", f"listen 127.0.0.1:{port} {bad};"))
        key, value = bad.split("=")
        assert r.returncode != 0
        assert f'check.conf:{conf.splitlines().index(f"        listen 127.0.0.1:{port};") + 1}: invalid {key} "{value}"' in r.stderr, r.stderr


def _workers(pid):
    """{worker number: (CPUs it may run on, nice value)} of the worker threads of worker
    process `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
            status = open(f"/proc/{pid}/task/{tid}/status").read()
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
        except OSError:
            continue
        if name.startswith("gannet-worker-"):
            cpus = next(l.split()[1] for l in status.splitlines() if l.startswith("Cpus_allowed_list:"))
            nice = int(stat.rsplit(")", 1)[1].split()[16])  # field 19 of stat
            out[int(name.rsplit("-", 1)[1])] = (cpus, nice)
    return out


def test_worker_cpu_affinity_and_priority(gannet):
    """`worker_cpu_affinity` binds each worker thread (a mask per worker, or `auto`: one CPU
    each, round robin), `worker_priority` sets the workers' nice value; the workers serve."""
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    conf, port = gannet.render()
    two = conf.replace("worker_processes 1;", "worker_processes 2;")
    srv = gannet.start(conf=two.replace("worker_processes 2;", "worker_processes 2;\nworker_cpu_affinity 01 10;\nworker_priority 5;"),
                       files={"a.txt": "x"}, port=port)
    # Each worker thread binds itself and sets its nice value as it starts: wait for that
    # state, not only for the threads to exist.
    want = {0: ("0", 5), 1: ("1", 5)}
    assert wait_until(lambda: _workers(srv.worker_pid()) == want), _workers(srv.worker_pid())
    assert srv.get("/a.txt")[::2] == (200, b"x")
    srv.stop()
    srv = gannet.start(conf=two.replace("worker_processes 2;", "worker_processes 2;\nworker_cpu_affinity auto;"),
                       files={"a.txt": "x"}, port=port)
    def placed():
        w = _workers(srv.worker_pid())
        return len(w) == 2 and {w[0][0], w[1][0]} == {"0", "1"} and w
    workers = wait_until(placed) or _workers(srv.worker_pid())
    assert {workers[0][0], workers[1][0]} == {"0", "1"} and workers[0][1] == 0, workers
    assert srv.get("/a.txt")[::2] == (200, b"x")


def test_worker_cpu_affinity_and_priority_values_are_checked(gannet):
    conf, _ = gannet.render()
    for bad, says in (("worker_cpu_affinity 012;", 'invalid character "2" in "worker_cpu_affinity"'),
                      ("worker_cpu_affinity auto 01 10;", 'invalid number of arguments in "worker_cpu_affinity" directive'),
                      ("worker_priority high;", '"worker_priority" directive invalid number')):
        r = gannet.check(conf=conf.replace("worker_processes 1;", f"worker_processes 1;\n{bad}"))
        assert r.returncode != 0
        assert f"check.conf:3: {says}" in r.stderr, r.stderr
