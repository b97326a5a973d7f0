"""`master_process off`, nginx's development mode: the process started serves from its own
worker threads and forks nothing; it still takes SIGHUP (reload), SIGUSR1 (reopen),
SIGQUIT (graceful stop) and SIGTERM itself; `daemon on` and `-g` work with it; `user` is
not applied, as in nginx. Everything is read from /proc of the real process or seen over
real sockets."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import free_port, gannet_bin, wait_port, wait_until
from test_privileges import threads as tasks

OFF = "master_process off;"


def children(pid: int) -> list[str]:
    """Every child process of every thread of `pid`."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out += open(f"/proc/{pid}/task/{tid}/children").read().split()
        except OSError:
            pass
    return out


def assert_single(pid: int, workers: int = 1):
    want = sorted(f"gannet-worker-{w}" for w in range(workers))
    got = wait_until(lambda: sorted(n for n in tasks(pid).values() if n.startswith("gannet-worker-")) == want)
    assert got, tasks(pid)
    assert children(pid) == [], "no worker process is forked"


def text(srv, path="/v"):
    status, _, body = srv.get(path)
    return status, body.decode()


def test_serves_from_its_own_threads_and_stops_on_sigterm(gannet):
    conf, port = gannet.render(main=OFF, server='location = /v { return 200 "one\\n"; }')
    srv = gannet.start(conf=conf.replace("worker_processes 1;", "worker_processes 2;"), port=port)
    assert text(srv) == (200, "one\n")
    assert_single(srv.proc.pid, 2)
    pid_file = gannet.tmp / "gannet.pid"
    assert int(pid_file.read_text()) == srv.proc.pid
    assert srv.stop(signal.SIGTERM) == 0
    assert not pid_file.exists()


def test_sighup_reloads_in_the_same_process(gannet):
    srv = gannet.start(main=OFF, server='location = /v { return 200 "one\\n"; }')
    assert text(srv) == (200, "one\n")
    conf, _ = gannet.render(main=OFF, server='location = /v { return 200 "two\\n"; }', port=srv.port)
    srv.conf_path.write_text(conf)
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: text(srv) == (200, "two\n")), srv.error_log()
    # The old generation's threads are gone, the new ones serve, still no child.
    assert_single(srv.proc.pid)
    # Named as what they are in the log: no process to look for.
    assert wait_until(lambda: "worker threads (thread " in srv.error_log() and "exited with code 0" in srv.error_log())
    assert "worker process" not in srv.error_log()
    assert "the master process is gone" not in srv.error_log()
    # A bad config is refused and the running one kept, as with a master.
    srv.conf_path.write_text(conf.replace("return 200", "frobnicate on; return 200"))
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "the running configuration is kept" in srv.error_log())
    assert text(srv) == (200, "two\n")
    assert srv.proc.poll() is None


def test_a_reload_does_not_switch_modes(gannet):
    srv = gannet.start(main=OFF, server='location = /v { return 200 "one\\n"; }')
    conf, _ = gannet.render(main="master_process on;", server='location = /v { return 200 "two\\n"; }', port=srv.port)
    srv.conf_path.write_text(conf)
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: text(srv) == (200, "two\n")), srv.error_log()
    assert 'changing "master_process" takes a restart; it stays off' in srv.error_log()
    assert_single(srv.proc.pid)


def test_sigusr1_reopens_the_moved_access_log(gannet):
    srv = gannet.start(main=OFF, files={"a.txt": "a", "b.txt": "b"})
    log = gannet.tmp / "access.log"
    assert srv.get("/a.txt")[0] == 200
    assert wait_until(lambda: "/a.txt" in srv.access_log())
    log.rename(gannet.tmp / "access.log.1")
    srv.proc.send_signal(signal.SIGUSR1)
    assert wait_until(lambda: log.exists()), "the access log was not created again"
    assert srv.get("/b.txt")[0] == 200
    assert wait_until(lambda: "/b.txt" in log.read_text())
    assert "/b.txt" not in (gannet.tmp / "access.log.1").read_text()


BIG = bytes(range(256)) * (64 * 1024)  # 16 MB: more than the socket buffers hold


def test_sigquit_finishes_the_response_in_flight_then_exits(gannet):
    srv = gannet.start(main=OFF, files={"big.bin": BIG})
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as busy:
        busy.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        got = busy.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ")
        srv.proc.send_signal(signal.SIGQUIT)
        assert wait_until(lambda: "gracefully shutting down" in srv.error_log())
        body = got.split(b"\r\n\r\n", 1)[1]
        while len(body) < len(BIG) and (chunk := busy.recv(1 << 20)):
            body += chunk
        assert body == BIG
    assert srv.proc.wait(10) == 0
    assert not (gannet.tmp / "gannet.pid").exists()


def test_usr2_and_winch_are_ignored(gannet):
    srv = gannet.start(main=OFF + "\ndaemon off;", server='location = /v { return 200 "one\\n"; }')
    srv.proc.send_signal(signal.SIGUSR2)
    srv.proc.send_signal(signal.SIGWINCH)
    assert wait_until(lambda: "the changing binary signal is ignored: master_process is off" in srv.error_log())
    assert text(srv) == (200, "one\n")
    assert not (gannet.tmp / "gannet.pid.oldbin").exists()
    assert_single(srv.proc.pid)


def test_g_flag_turns_the_master_off(gannet):
    gannet.write_files({"a.txt": "g"})
    conf, port = gannet.render()
    path = gannet.tmp / "g.conf"
    path.write_text(conf)
    proc = subprocess.Popen([str(gannet_bin()), "-c", str(path), "-g", OFF], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_port(port, proc)
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        c.sendall(b"GET /a.txt HTTP/1.0\r\n\r\n")
        assert c.makefile("rb").read().endswith(b"\r\n\r\ng")
        c.close()
        assert_single(proc.pid)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_daemon_on_with_the_master_off(gannet):
    gannet.write_files({"a.txt": "daemon"})
    conf, port = gannet.render(main="daemon on;\n" + OFF)
    path = gannet.tmp / "daemon.conf"
    path.write_text(conf)
    done = subprocess.run([str(gannet_bin()), "-c", str(path)], capture_output=True, timeout=10)
    assert done.returncode == 0, done.stderr
    pid_file = gannet.tmp / "gannet.pid"
    pid = int(wait_until(lambda: pid_file.exists() and pid_file.read_text().strip()))
    try:
        wait_port(port)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /a.txt HTTP/1.0\r\n\r\n")
            assert s.makefile("rb").read().endswith(b"daemon")
        assert os.getsid(pid) == pid
        assert_single(pid)
    finally:
        os.kill(pid, signal.SIGTERM)
    assert wait_until(lambda: not pid_file.exists(), 10)


try:
    WWW = pwd.getpwnam("www-data")
except KeyError:
    WWW = None

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def uids(pid: int) -> set[int]:
    """Every uid (real, effective, saved, fs) of every thread of `pid`."""
    out = set()
    for tid in tasks(pid):
        for line in open(f"/proc/{pid}/task/{tid}/status"):
            if line.startswith("Uid:"):
                out |= {int(v) for v in line.split()[1:]}
    return out


@pytest.mark.skipif(os.geteuid() != 0 or WWW is None, reason="needs root and the www-data user")
def test_user_is_not_applied_as_in_nginx(gannet):
    """nginx applies `user` in its worker processes only: its single process stays root,
    and says nothing about it. So does gannet."""
    srv = gannet.start(main="user www-data;\n" + OFF, files={"a.txt": "a"})
    assert srv.get("/a.txt")[0] == 200
    assert_single(srv.proc.pid)
    assert uids(srv.proc.pid) == {0}
    assert "user" not in srv.error_log()
    if NGINX is None:
        return
    d = Path(tempfile.mkdtemp(prefix="gannet-sp-nginx-"))
    try:
        port = free_port()
        (d / "nginx.conf").write_text(f"""
user www-data;
master_process off;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {d}/cb; proxy_temp_path {d}/pt; fastcgi_temp_path {d}/ft;
    uwsgi_temp_path {d}/ut; scgi_temp_path {d}/st;
    server {{ listen 127.0.0.1:{port}; return 200 "x"; }}
}}
""")
        ng = subprocess.Popen([NGINX, "-p", str(d), "-c", str(d / "nginx.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port, ng)
            assert uids(ng.pid) == {0}
            assert children(ng.pid) == []
            assert "user" not in (d / "error.log").read_text()
        finally:
            ng.terminate()
            ng.wait(10)
    finally:
        shutil.rmtree(d)
