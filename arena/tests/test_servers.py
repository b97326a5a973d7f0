"""Server adapters against the real servers: start pinned on a free port, answer, process tree,
stop by pid; and the failures: a server that cannot start, a port in use, a missing binary."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from arena import ports, probe
from arena.errors import ArenaError
from arena.measure import Sampler, TreeSample, tree_memory
from arena.procs import alive
from arena.servers import SERVERS, WEB_SERVERS, Site, SiteOptions, get, parse_list
from arena.servers.nginx import Nginx

PEERS = [name for name in WEB_SERVERS if name != "gannet"]


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]
    return ""


@pytest.mark.parametrize("name", PEERS)
def test_peer_starts_pinned_serves_and_stops(name, workdir, docroot):
    site = Site(docroot[0], ports.free_port(), SiteOptions(connections=256))
    server = SERVERS[name].start(site, workdir / name, "tuned", "0")
    try:
        tree = server.tree()
        assert tree and tree[0] == server.pid
        assert all(cpus_allowed(pid) == "0" for pid in tree)
        reply = probe.get(site.host, site.port, "/img.jpg", close=True)
        assert reply.status == 200 and reply.body_bytes == docroot[1]["img.jpg"]
        assert tree_memory(server.pid).pss_kib > 0
    finally:
        server.stop()
    assert not any(alive(pid) for pid in tree)
    assert not ports.is_listening(site.port)


def test_sampler_sees_cpu_and_memory_of_the_tree(nginx):
    sampler = Sampler(nginx.pid, interval=0.02).start()
    for _ in range(300):
        probe.get(nginx.site.host, nginx.site.port, "/img.jpg", close=True)
    sample = sampler.stop()
    assert sample.cpu_seconds > 0
    assert sample.peak_rss_kib > 0 and sample.peak_pss_kib > 0
    assert sample.peak_processes == 2  # master + one worker
    assert sample.samples >= 2


def test_sampler_counts_cpu_finer_than_a_clock_tick():
    """A PHP-FPM child serving a few requests runs for milliseconds: /proc/PID/stat's 10 ms
    ticks truncate that to nothing, so the sampler reads the threads' nanosecond run time."""
    spin = "import sys,time\nfor _ in sys.stdin:\n    t=time.process_time()\n    while time.process_time()-t<0.003: pass\n    print(flush=True)\n"
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child.stdin.write("go\n")
        child.stdin.flush()
        child.stdout.readline()  # started: interpreter start-up stays out of the sample
        sampler = Sampler(child.pid, interval=10).start()
        child.stdin.write("go\n")
        child.stdin.flush()
        child.stdout.readline()
        sample = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert 0.003 <= sample.cpu_seconds < 0.5


def _sampled(program: str) -> TreeSample:
    """What the sampler saw of a child running `program` once (start-up left out)."""
    child = subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        sampler = Sampler(child.pid, interval=10).start()
        child.stdin.write("go\n")
        child.stdin.flush()
        child.stdout.readline()
        return sampler.stop()
    finally:
        child.kill()
        child.wait()


def test_sampler_tells_the_kernels_part_of_the_cpu():
    """User-space work shows as CPU with next to nothing in the kernel; system calls (64 KB
    read from /dev/zero again and again) show as mostly the kernel's."""
    # (time.monotonic is read without a system call; process_time is one.)
    spin = "import sys,time\nprint(flush=True)\nsys.stdin.readline()\nt=time.monotonic()\n" \
        "while time.monotonic()-t<0.3: sum(range(1000))\nprint(flush=True)\n"
    calls = "import os,sys,time\nprint(flush=True)\nsys.stdin.readline()\nfd=os.open('/dev/zero',os.O_RDONLY)\n" \
        "t=time.monotonic()\nwhile time.monotonic()-t<0.3:\n    for _ in range(100): os.pread(fd, 65536, 0)\n" \
        "print(flush=True)\n"
    user, kernel = _sampled(spin), _sampled(calls)
    assert user.cpu_seconds >= 0.1 and user.kernel_seconds <= user.cpu_seconds / 3
    assert kernel.cpu_seconds >= 0.1 and kernel.kernel_seconds >= kernel.cpu_seconds / 2


class BrokenNginx(Nginx):
    """nginx told to load a directive that does not exist: it exits at start-up."""

    def command(self, binary, rundir):
        return super().command(binary, rundir)[:-1] + ["daemon off; no_such_directive on;"]


def test_failed_start_shows_the_error_log(workdir, docroot):
    site = Site(docroot[0], ports.free_port(), SiteOptions())
    with pytest.raises(ArenaError) as info:
        BrokenNginx().start(site, workdir / "broken", "tuned", "0")
    message = str(info.value)
    assert message.splitlines()[0].startswith("nginx failed to start (exit code 1)")
    assert "no_such_directive" in message


def test_port_in_use_is_reported(workdir, docroot):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        site = Site(docroot[0], port, SiteOptions())
        with pytest.raises(ArenaError, match=rf"port 127.0.0.1:{port} is in use"):
            SERVERS["nginx"].start(site, workdir / "nginx", "tuned", "0")


def test_missing_gannet_binary_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("GANNET_BIN", "/nonexistent/gannet")
    with pytest.raises(ArenaError, match=r"gannet binary not found at /nonexistent/gannet \(GANNET_BIN\)"):
        SERVERS["gannet"].binary()


def test_gannet_binary_defaults_to_the_repository_build(monkeypatch):
    monkeypatch.delenv("GANNET_BIN", raising=False)
    from arena.servers.gannet import REPO_ROOT, gannet_binary
    assert gannet_binary() == REPO_ROOT / "target" / "release" / "gannet"
    assert (REPO_ROOT / "arena" / "pyproject.toml").exists()


def test_server_names():
    assert [s.name for s in parse_list("nginx, lighttpd,nginx")] == ["nginx", "lighttpd"]
    with pytest.raises(ArenaError, match="unknown server 'iis'"):
        get("iis")
    assert os.path.basename(SERVERS["apache-event"].binary()) == "apache2"
