"""systemd's protocols, spoken with the real binary: sd_notify (`Type=notify`) to a
NOTIFY_SOCKET the test binds, a path or an abstract `@name`, and socket activation with
listening sockets the test passes as descriptors 3, 4, ... with LISTEN_FDS / LISTEN_PID /
LISTEN_FDNAMES, as systemd starts a service behind a `.socket` unit.
"""

import fcntl
import os
import signal
import socket
import subprocess
import time

import pytest

from conftest import DEFAULT_CONF, REPO, free_port, gannet_bin, wait_until, worker_pids

RECV_TIMEOUT = 10.0


class Notify:
    """A datagram socket standing for systemd's notification socket."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        # Python writes an abstract name with a leading NUL; systemd's variable with `@`.
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(RECV_TIMEOUT)
        self.env = address

    def next(self) -> dict[str, str]:
        """The next message, as its KEY=value lines."""
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines() if line)

    def close(self):
        self.sock.close()


def write_conf(tmp, port, main="user root;", listen=None):
    root = tmp / "www"
    root.mkdir(exist_ok=True)
    (root / "index.html").write_text("hello\n")
    text = DEFAULT_CONF.format(tmp=tmp, repo=REPO, port=port, root=root, server="", http="", main=main)
    if listen is not None:
        text = text.replace(f"listen 127.0.0.1:{port};", listen)
    path = tmp / "gannet.conf"
    path.write_text(text)
    return path


def get(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_ready_reloading_and_stopping_are_reported(tmp_path, procs, kind):
    address = str(tmp_path / "notify") if kind == "path" else f"@gannet-test-{os.getpid()}-{tmp_path.name}"
    n = Notify(address)
    try:
        port = free_port()
        conf = write_conf(tmp_path, port)
        env = dict(os.environ, NOTIFY_SOCKET=n.env)
        p = subprocess.Popen([str(gannet_bin()), "-c", str(conf)], env=env, stderr=subprocess.PIPE)
        procs.append(p)
        ready = n.next()
        assert ready["READY"] == "1" and ready["MAINPID"] == str(p.pid), ready
        assert ready["STATUS"] == f"serving on 127.0.0.1:{port}"
        # READY means serving: the first request needs no waiting.
        assert get(port).startswith(b"HTTP/1.1 200 ")
        assert len(worker_pids(p.pid)) == 1

        p.send_signal(signal.SIGHUP)
        reloading = n.next()
        assert reloading["RELOADING"] == "1", reloading
        assert int(reloading["MONOTONIC_USEC"]) > 0
        # The kernel's CLOCK_MONOTONIC, as systemd compares it.
        assert abs(int(reloading["MONOTONIC_USEC"]) / 1e6 - time.monotonic()) < 5
        again = n.next()
        assert again["READY"] == "1" and again["STATUS"] == f"serving on 127.0.0.1:{port}", again

        # A broken config: the reload fails, and says so, but the master is ready again.
        conf.write_text(conf.read_text() + "\nfrobnicate on;\n")
        p.send_signal(signal.SIGHUP)
        assert n.next()["RELOADING"] == "1"
        failed = n.next()
        assert failed["READY"] == "1" and "reload failed" in failed["STATUS"], failed
        assert get(port).startswith(b"HTTP/1.1 200 ")

        p.send_signal(signal.SIGQUIT)
        stopping = n.next()
        assert stopping["STOPPING"] == "1" and stopping["STATUS"] == "gracefully shutting down"
        assert p.wait(10) == 0
    finally:
        n.close()


def test_sigterm_reports_stopping(tmp_path, procs):
    n = Notify(str(tmp_path / "notify"))
    try:
        conf = write_conf(tmp_path, free_port())
        p = subprocess.Popen([str(gannet_bin()), "-c", str(conf)], env=dict(os.environ, NOTIFY_SOCKET=n.env))
        procs.append(p)
        assert n.next()["READY"] == "1"
        p.terminate()
        assert n.next() == {"STOPPING": "1", "STATUS": "stopping"}
        assert p.wait(10) == 0
    finally:
        n.close()


def test_a_notify_socket_nobody_reads_is_logged_and_serving_goes_on(tmp_path, procs):
    port = free_port()
    conf = write_conf(tmp_path, port)
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "nobody-listens-here"))
    p = subprocess.Popen([str(gannet_bin()), "-c", str(conf)], env=env)
    procs.append(p)
    assert wait_until(lambda: b"200" in _try_get(port)), "not serving"
    assert wait_until(lambda: "sd_notify \"READY=1\" failed" in (tmp_path / "error.log").read_text())


def _try_get(port):
    try:
        return get(port)
    except OSError:
        return b""


def listening(port, host="127.0.0.1"):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.bind((host, port))
    s.listen(16)
    return s


def activated(args, socks, names=None, pid_ok=True):
    """Start gannet with `socks` as descriptors 3, 4, ... and LISTEN_PID its own pid (the
    shell exports its $$ and execs gannet in its place), or another pid."""
    env = dict(os.environ, LISTEN_FDS=str(len(socks)))
    if names:
        env["LISTEN_FDNAMES"] = ":".join(names)
    targets = list(range(3, 3 + len(socks)))

    def to_three():
        # Descriptors to 3.. in the child (pass_fds keeps those numbers open), by way of
        # copies at 100 and up, so that moving one never overwrites another still to move.
        tmp = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD, 100) for s in socks]
        for fd, target in zip(tmp, targets):
            os.dup2(fd, target, inheritable=True)

    pid = "$$" if pid_ok else "1"
    script = f'LISTEN_PID={pid}; export LISTEN_PID; exec "$@"'
    return subprocess.Popen(["/bin/sh", "-c", script, "sh", str(gannet_bin()), *args], env=env,
                            pass_fds=targets, preexec_fn=to_three, stderr=subprocess.PIPE)


def socket_inodes(pid):
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


def test_passed_sockets_are_served_on_instead_of_binding(tmp_path, procs):
    port, unused = free_port(), free_port()
    conf = write_conf(tmp_path, port, listen=f"listen 127.0.0.1:{port};")
    conf.write_text(conf.read_text().replace("worker_processes 1;", "worker_processes 2;"))
    # One socket the config listens on, one it does not. Had gannet bound the address
    # itself, the test's socket (no SO_REUSEPORT) would make that fail.
    mine, other = listening(port), listening(unused)
    p = activated(["-c", str(conf)], [mine, other], names=["web", "spare"])
    procs.append(p)
    inode = os.fstat(mine.fileno()).st_ino
    mine.close()
    other_inode = os.fstat(other.fileno()).st_ino
    assert wait_until(lambda: b"200" in _try_get(port), 10), p.stderr.read1().decode() if p.poll() is not None else ""
    # The worker process serves on that very socket (both threads share it), and the
    # unmatched one was closed, not kept.
    worker = wait_until(lambda: worker_pids(p.pid), 5)
    assert worker, "no worker process"
    assert inode in socket_inodes(worker[0])
    assert other_inode not in socket_inodes(p.pid) | socket_inodes(worker[0])
    log = (tmp_path / "error.log").read_text()
    assert f'using socket 3 ("web") passed for 127.0.0.1:{port}' in log, log
    assert f'socket 4 ("spare") passed for 127.0.0.1:{unused} matches no "listen" address; closed' in log
    # A reload keeps the passed socket: still served, and still the only one.
    p.send_signal(signal.SIGHUP)
    assert wait_until(lambda: len(worker_pids(p.pid)) == 1 and inode in socket_inodes(worker_pids(p.pid)[0])
                      and b"200" in _try_get(port), 10)
    other.close()


def test_sockets_for_another_pid_are_not_taken(tmp_path, procs):
    port = free_port()
    conf = write_conf(tmp_path, port)
    held = listening(port)
    try:
        # LISTEN_PID names another process: the descriptor is not gannet's to use, so it
        # binds the address itself, which the test's socket holds.
        p = activated(["-c", str(conf)], [held], pid_ok=False)
        procs.append(p)
        assert p.wait(10) == 1
        assert f"bind() to 127.0.0.1:{port} failed" in p.stderr.read().decode()
    finally:
        held.close()


def test_binary_upgrade_hands_the_main_pid_to_the_new_master(tmp_path, procs):
    """USR2 starts the new binary (its READY names itself, which systemd drops while it is
    not the main process); the old master's QUIT then names the new master as the main
    process instead of saying the service stops, so systemd keeps it; the new master's own
    stop is a stop."""
    n = Notify(str(tmp_path / "notify"))
    new = None
    try:
        port = free_port()
        conf = write_conf(tmp_path, port)
        env = dict(os.environ, NOTIFY_SOCKET=n.env)
        p = subprocess.Popen([str(gannet_bin()), "-c", str(conf)], env=env, stderr=subprocess.PIPE)
        procs.append(p)
        assert n.next()["MAINPID"] == str(p.pid)
        p.send_signal(signal.SIGUSR2)
        ready = n.next()
        new = int(ready["MAINPID"])
        assert ready["READY"] == "1" and new != p.pid, ready
        p.send_signal(signal.SIGQUIT)
        handover = n.next()
        assert handover["MAINPID"] == str(new) and "STOPPING" not in handover, handover
        assert p.wait(10) == 0
        assert get(port).startswith(b"HTTP/1.1 200 ")
        os.kill(new, signal.SIGQUIT)
        assert n.next()["STOPPING"] == "1"
        assert wait_until(lambda: not os.path.exists(f"/proc/{new}") or open(f"/proc/{new}/stat").read().split(")")[1].split()[0] == "Z", 10)
        new = None
    finally:
        if new is not None:
            os.kill(new, signal.SIGKILL)
        n.close()
