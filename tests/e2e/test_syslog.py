"""`error_log` and `access_log` to syslog, against Debian's nginx: UDP and unix-datagram
receivers written here take what each server sends for the same config and requests, and
the datagrams must be the same bytes once the clock, pids and ports are masked. Also: several
error logs each with its level, a location's own error log, `access_log ... if=`, and the
`-t` errors for bad syslog parameters.
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from conftest import Gannet, free_port, wait_until
from nginx_peer import NGINX, NginxPeer

CONF = """
user root;
worker_processes 1;
pid {tmp}/server.pid;
error_log {tmp}/error.log info;
error_log syslog:server=127.0.0.1:{udp},tag=main_err warn;
events { worker_connections 64; }
http {
    log_format sys '$remote_addr - $remote_user "$request" $status "$http_user_agent"';
    access_log syslog:server=unix:{sock},facility=local0,severity=notice,tag=acc sys;
    access_log syslog:server=127.0.0.1:{udp},nohostname,tag=acc2 sys if=$arg_log;
    server {
        listen 127.0.0.1:{port};
        server_name syslog.test;
        root {root};
        location /loud/ {
            error_log syslog:server=127.0.0.1:{udp},facility=daemon,tag=loc error;
        }
    }
}
"""

REQUESTS = [
    b"GET /missing?log=1 HTTP/1.1\r\nHost: syslog.test\r\nUser-Agent: t/1\r\nConnection: close\r\n\r\n",
    b"GET /loud/missing HTTP/1.1\r\nHost: syslog.test\r\nUser-Agent: t/2\r\nConnection: close\r\n\r\n",
    b"GET /here HTTP/1.1\r\nHost: syslog.test\r\nUser-Agent: t/3\r\nConnection: close\r\n\r\n",
]

# (receiver, count): main_err + loc + acc2 on UDP; three access lines on the unix socket.
EXPECTED = {"udp": 3, "unix": 3}

MASKS = [
    (re.compile(rb"^(<\d+>)[A-Z][a-z]{2} [ 123]\d \d\d:\d\d:\d\d "), rb"\1TIME "),
    (re.compile(rb"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[(\w+)\] \d+#\d+: \*\d+ "), rb"STAMP [\1] PID#TID: *N "),
]


def mask(datagram: bytes) -> bytes:
    for pat, rep in MASKS:
        datagram = pat.sub(rep, datagram)
    return datagram


class Receivers:
    """A UDP and a unix-datagram socket collecting what a server sends."""

    def __init__(self, tmp: Path):
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.path = tmp / "syslog.sock"
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.unix.bind(str(self.path))
        self.got = {"udp": [], "unix": []}
        for s in (self.udp, self.unix):
            s.setblocking(False)

    def drain(self) -> dict:
        for name, s in (("udp", self.udp), ("unix", self.unix)):
            while True:
                try:
                    self.got[name].append(s.recv(65536))
                except BlockingIOError:
                    break
        return self.got

    def close(self):
        self.udp.close()
        self.unix.close()


def fill(tmp: Path, rx: Receivers) -> str:
    return CONF.replace("{udp}", str(rx.udp.getsockname()[1])).replace("{sock}", str(rx.path))


def run_requests(port: int, rx: Receivers) -> dict:
    for r in REQUESTS:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(r)
            while s.recv(65536):
                pass
    got = wait_until(lambda: all(len(rx.drain()[k]) >= n for k, n in EXPECTED.items()) and rx.got)
    return {k: sorted(mask(d) for d in v) for k, v in (got or rx.got).items()}


def gannet_datagrams(tmp: Path) -> tuple[dict, Path]:
    g = Gannet(tmp)
    g.write_files({"here": "hello\n", "loud/": None})
    rx = Receivers(tmp)
    try:
        srv = g.start(conf=fill(tmp, rx))
        return run_requests(srv.port, rx), srv.root
    finally:
        g.close()
        rx.close()


def test_syslog_datagrams_match_nginx(tmp_path):
    if NGINX is None:
        pytest.skip("nginx is not installed")
    (tmp_path / "g").mkdir()
    got, root = gannet_datagrams(tmp_path / "g")
    rx = Receivers(tmp_path)
    port = free_port()
    peer = NginxPeer(fill(tmp_path / "n", rx), port, root, tmp_path / "n")
    try:
        want = run_requests(port, rx)
    finally:
        peer.stop()
        rx.close()
    # The Host header is the same for both, and paths are under the same root, so after the
    # masks only gannet-vs-nginx differences remain.
    assert got == want
    host = socket.gethostname().lower().encode()
    udp = got["udp"]
    assert any(d.startswith(b"<187>TIME " + host + b" main_err: STAMP [error] PID#TID: *N open() ") and b"/missing" in d for d in udp), udp
    assert any(d.startswith(b"<27>TIME " + host + b" loc: ") and b"/loud/missing" in d for d in udp), udp
    assert b'<190>TIME acc2: 127.0.0.1 - - "GET /missing?log=1 HTTP/1.1" 404 "t/1"' in udp
    assert got["unix"][0].startswith(b"<133>TIME " + host + b" acc: 127.0.0.1 - - ")


def test_request_errors_go_to_the_location_logs_and_levels_filter(tmp_path):
    """Each error log takes the lines its level admits; a location's log replaces the main
    ones for that location's requests."""
    got, _ = gannet_datagrams(tmp_path)
    udp = got["udp"]
    assert not any(b"main_err" in d and b"/loud/" in d for d in udp), udp
    assert sum(b" loc: " in d for d in udp) == 1
    text = (tmp_path / "error.log").read_text()
    assert "/loud/missing" not in text and re.search(r"\[error\] .*open\(\) \".*/missing\" failed", text), text


@pytest.mark.parametrize(
    "directive, message",
    [
        ("error_log syslog:server=127.0.0.1,facility=local9;", 'unknown syslog facility "local9"'),
        ("error_log syslog:facility=local0;", "no syslog server specified"),
        ("error_log syslog:server=127.0.0.1,tag=a-b;", 'syslog "tag" only allows alphanumeric characters and underscore'),
        ("error_log syslog:server=127.0.0.1:70000;", 'invalid port in syslog server "127.0.0.1:70000"'),
        ("error_log syslog:server=127.0.0.1 loud;", 'invalid log level "loud"'),
        ("access_log syslog:server=127.0.0.1,severity=err;", 'unknown syslog severity "err"'),
        ("access_log syslog:server=127.0.0.1 combined buffer=4k;", "logs to syslog cannot be buffered"),
    ],
)
def test_t_rejects_bad_syslog_targets_with_file_line(gannet, directive, message):
    conf = "events {}\nhttp {\n    server {\n        listen 127.0.0.1:{port};\n        %s\n    }\n}\n" % directive
    r = gannet.check(conf=conf)
    assert r.returncode == 1
    assert f"{gannet.tmp / 'check.conf'}:5: {message}" in r.stderr, r.stderr
    if NGINX:
        (gannet.tmp / "n").mkdir(exist_ok=True)
        n = subprocess.run([NGINX, "-t", "-p", f"{gannet.tmp}/n/", "-c", str(gannet.tmp / "check.conf")],
                           capture_output=True, text=True, timeout=30)
        assert n.returncode == 1 and message in n.stderr, n.stderr
