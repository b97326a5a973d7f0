"""`quic_bpf on`: a QUIC connection's packets reach the worker thread that owns it, whatever
port the client moves to. Each worker has its own SO_REUSEPORT socket for the address and
the kernel picks one by the 4-tuple hash, so a client moving to a new port lands on either
worker's socket; the program steers it back by connection ID (`conn::quic_bpf`).

The client moves MOVES times (each a new local port: a NAT rebinding, or with a new
connection ID, a migration) and must be answered on the same connection after every move.
With two workers, the chance that the hash alone keeps sending every one of those ports to
the owner is 2^-MOVES: without the program the connection cannot survive them."""

from __future__ import annotations

import ctypes
import os
import signal
import socket

import pytest

from conftest import free_port, wait_until
from test_http3 import pki, quic_conf  # noqa: F401  (fixture)
from test_tls import conf, pair

h3client = pytest.importorskip("h3client", reason="aioquic is installed by scripts/test-all.sh")

MOVES = 16

# pidfd_getfd(2) (the same number on x86-64 and arm64) and the socket option to take a
# reuseport program off.
SYS_PIDFD_GETFD = 438
SO_DETACH_REUSEPORT_BPF = 68

LOG = "log_format moved '$connection $remote_port $request $status'; access_log {tmp}/moved.log moved;"


def start(gannet, pki, workers: int, main: str = ""):  # noqa: F811
    text, port = quic_conf(pki, http=LOG)
    text = text.replace("worker_processes 1;", f"worker_processes {workers};\n{main}", 1)
    srv = gannet.start(conf=text, port=port)
    return srv, port


def run_moves(port: int) -> tuple[list, list[int]]:
    """The answers to one request from the first port, then to one after each move (a NAT
    rebinding and a migration to a new ID in turn), up to the first one not answered; and
    the client ports used."""
    c = h3client.Moving(port)
    answers = []
    try:
        for i in range(MOVES + 1):
            if i:
                c.move(new_id=i % 2 == 0)
            a = c.get("/v", timeout=5 if i else 10)
            if a is None:
                break
            answers.append(a)
    finally:
        c.close()
    return answers, c.ports


def logged(srv) -> list[str]:
    p = srv.tmp / "moved.log"
    return p.read_text().splitlines() if p.exists() else []


def test_connection_follows_its_client_across_workers_with_quic_bpf(gannet, pki):  # noqa: F811
    srv, port = start(gannet, pki, 2, "quic_bpf on;")
    answers, ports = run_moves(port)
    assert len(answers) == MOVES + 1, f"answered {len(answers)} of {MOVES + 1} (ports {ports})"
    assert all(a.status == 200 and a.body.startswith(b"HTTP/3.0|h3|GET /v HTTP/3.0|") for a in answers)
    assert len(set(ports)) == MOVES + 1
    # One connection answered them all, on the server's side too.
    assert wait_until(lambda: len(logged(srv)) == MOVES + 1)
    assert len({line.split()[0] for line in logged(srv)}) == 1, logged(srv)
    # ... each request from the port the client had moved to ($remote_addr follows it).
    assert [int(line.split()[1]) for line in logged(srv)] == ports, logged(srv)


def detach_program(pid: int, port: int) -> None:
    """Take the program off the address's reuseport group from outside, through a copy of
    one of gannet's sockets (pidfd_getfd): everything else stays as `quic_bpf on` made it
    (IDs with the socket's index, migration allowed)."""
    inodes = set()
    for line in open("/proc/net/udp").read().splitlines()[1:]:
        f = line.split()
        if f[1] == f"0100007F:{port:04X}":
            inodes.add(f[9])
    assert inodes, f"no UDP socket on port {port}"
    target = None
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            target = int(fd)
            break
    assert target is not None
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        copy = libc.syscall(SYS_PIDFD_GETFD, pidfd, target, 0)
        if copy < 0:
            pytest.skip(f"pidfd_getfd: {os.strerror(ctypes.get_errno())}")
        with socket.socket(fileno=copy) as s:
            s.setsockopt(socket.SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, 0)
    finally:
        os.close(pidfd)


def test_the_program_is_what_keeps_the_connection(gannet, pki):  # noqa: F811
    srv, port = start(gannet, pki, 2, "quic_bpf on;")
    assert len(run_moves(port)[0]) == MOVES + 1
    detach_program(srv.proc.pid, port)
    answers, ports = run_moves(port)
    assert answers and len(answers) < MOVES + 1, f"answered {len(answers)} of {MOVES + 1} (ports {ports})"


def test_without_quic_bpf_a_moved_client_is_lost_with_two_workers(gannet, pki):  # noqa: F811
    # The same run as above fails: clients are told not to migrate (its packets may reach
    # the other worker), and the owner ignores packets from a new address.
    srv, port = start(gannet, pki, 2)
    answers, _ = run_moves(port)
    assert len(answers) == 1 and answers[0].status == 200


def test_a_single_worker_follows_its_client_without_quic_bpf(gannet, pki):  # noqa: F811
    # One socket for the address: every packet reaches it, so migration is allowed.
    srv, port = start(gannet, pki, 1)
    answers, ports = run_moves(port)
    assert len(answers) == MOVES + 1, f"answered {len(answers)} of {MOVES + 1} (ports {ports})"
    assert wait_until(lambda: len(logged(srv)) == MOVES + 1)
    assert len({line.split()[0] for line in logged(srv)}) == 1


def test_quic_bpf_on_by_reload_steers_the_sockets_kept(gannet, pki):  # noqa: F811
    # A reload keeps the address's sockets (their group, their order) and attaches the
    # program to them; the new workers' connections follow their clients.
    # (The connection lost below would keep the old worker for its idle timeout.)
    srv, port = start(gannet, pki, 2, "worker_shutdown_timeout 1s;")
    assert len(run_moves(port)[0]) == 1
    old = srv.worker_pid()
    srv.conf_path.write_text(srv.conf_path.read_text().replace("worker_processes 2;", "worker_processes 2; quic_bpf on;", 1))
    srv.proc.send_signal(signal.SIGHUP)
    # The old worker process gone, only the new one reads the sockets.
    assert wait_until(lambda: srv.worker_pids() and old not in srv.worker_pids(), 15), srv.error_log()
    answers, ports = run_moves(port)
    assert len(answers) == MOVES + 1, f"answered {len(answers)} of {MOVES + 1} (ports {ports})"


@pytest.mark.parametrize("where, line, message", [
    ("main", "quic_bpf maybe;", 'invalid value "maybe" in "quic_bpf" directive, it must be "on" or "off"'),
    ("main", "quic_bpf on; quic_bpf off;", '"quic_bpf" directive is duplicate'),
    ("http", "quic_bpf on;", '"quic_bpf" directive is not allowed here'),
])
def test_quic_bpf_bad_values_and_places_are_config_errors(gannet, pki, where, line, message):  # noqa: F811
    port = free_port()
    servers = f"server {{ listen 127.0.0.1:{port} quic; {pair(pki, 'ec')} }} server {{ listen 127.0.0.1:{{port}}; }}"
    text = conf(servers, http=line if where == "http" else "")
    if where == "main":
        text = text.replace("worker_processes 1;", f"worker_processes 1;\n{line}", 1)
    r = gannet.check(conf=text)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    want = next(i for i, x in enumerate(text.splitlines(), 1) if "quic_bpf" in x)
    assert f"check.conf:{want}" in r.stderr, r.stderr
