"""The `stream {}` layer-4 proxy: TCP relayed to echo backends (round robin, failover,
`max_fails`), `allow`/`deny`, PROXY protocol v1 to the upstream, TLS routed by SNI with
`ssl_preread` (openssl s_server backends, openssl s_client), UDP DNS through the proxy to
dnsmasq (dig), a real MariaDB client through the proxy, the stream access log, and the same
configs side by side with Debian's nginx (its stream module loaded) for statuses, log
variables and routing.

Each config has a small http server on `{port}` so the harness knows when the process is up
without opening a stream session itself.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import free_port, wait_port, wait_until
from nginx_peer import NGINX, NginxPeer

STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"
DIG = shutil.which("dig")
DNSMASQ = shutil.which("dnsmasq") or ("/usr/sbin/dnsmasq" if os.path.exists("/usr/sbin/dnsmasq") else None)
MYSQLD = shutil.which("mariadbd") or shutil.which("mysqld") or ("/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None)
MARIADB = shutil.which("mariadb")


def conf(stream: str, load: bool = False) -> str:
    """A whole config: `stream { <stream> }` and the readiness server on {port}."""
    head = f"load_module {STREAM_MODULE};\n" if load else ""
    return head + """
worker_processes 1;
pid {tmp}/server.pid;
error_log {tmp}/error.log info;
events { worker_connections 64; }
http { access_log off; server { listen 127.0.0.1:{port}; return 204; } }
stream {
    log_format s '$remote_addr $protocol $status $bytes_sent $bytes_received "$upstream_addr" $upstream_bytes_sent $upstream_bytes_received';
    access_log {tmp}/stream.log s;
""" + stream + "\n}\n"


class Echo:
    """TCP backends that answer each read with their tag and the bytes read; `seen` keeps
    what each connection sent first (the PROXY line)."""

    def __init__(self, n: int):
        self.ports, self.first, self.socks = [], [], []
        for i in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen(16)
            self.socks.append(s)
            self.ports.append(s.getsockname()[1])
            threading.Thread(target=self._serve, args=(s, f"[{i}]".encode()), daemon=True).start()

    def _serve(self, s, tag):
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c, tag), daemon=True).start()

    def _conn(self, c, tag):
        with c:
            first = True
            while True:
                d = c.recv(4096)
                if not d:
                    return
                if first:
                    self.first.append(d)
                    first = False
                c.sendall(tag + d)

    def close(self):
        for s in self.socks:
            s.close()


@pytest.fixture
def echo():
    e = Echo(2)
    yield e
    e.close()


def talk(port: int, data: bytes = b"hello", timeout: float = 5.0) -> bytes:
    """Send, read one answer (b"" when the proxy closes at once), close."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        try:
            return s.recv(4096)
        except ConnectionResetError:
            return b""


def log_lines(tmp: Path, n: int) -> list[str]:
    p = tmp / "stream.log"
    read = lambda: p.read_text().splitlines() if p.exists() else []
    assert wait_until(lambda: len(read()) >= n), read()
    return read()


def dead_port() -> int:
    return free_port()


def test_tcp_round_robin_and_log(gannet, echo):
    p = free_port()
    a, b = echo.ports
    srv = gannet.start(conf=conf(f"upstream back {{ server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}\n"
                                 f"server {{ listen 127.0.0.1:{p}; proxy_pass back; }}"))
    assert [talk(p) for _ in range(4)] == [b"[0]hello", b"[1]hello", b"[0]hello", b"[1]hello"]
    lines = log_lines(srv.tmp, 4)
    assert lines[0] == f'127.0.0.1 TCP 200 8 5 "127.0.0.1:{a}" 5 8'
    assert lines[1] == f'127.0.0.1 TCP 200 8 5 "127.0.0.1:{b}" 5 8'


def test_weights_and_hash(gannet, echo):
    p, q = free_port(), free_port()
    a, b = echo.ports
    srv = gannet.start(conf=conf(
        f"upstream w {{ server 127.0.0.1:{a} weight=3; server 127.0.0.1:{b}; }}\n"
        f"upstream h {{ hash $remote_addr consistent; server 127.0.0.1:{a}; server 127.0.0.1:{b}; }}\n"
        f"server {{ listen 127.0.0.1:{p}; proxy_pass w; }}\n"
        f"server {{ listen 127.0.0.1:{q}; proxy_pass h; }}"))
    got = [talk(p)[:3] for _ in range(8)]
    assert got.count(b"[0]") == 6 and got.count(b"[1]") == 2, got
    # One client address: the same server every time.
    assert len({talk(q)[:3] for _ in range(4)}) == 1


def test_failover_skips_dead_server(gannet, echo):
    p, dead = free_port(), dead_port()
    a = echo.ports[0]
    srv = gannet.start(conf=conf(
        f"upstream back {{ server 127.0.0.1:{dead} max_fails=1 fail_timeout=30s; server 127.0.0.1:{a}; }}\n"
        f"server {{ listen 127.0.0.1:{p}; proxy_pass back; }}"))
    assert [talk(p) for _ in range(4)] == [b"[0]hello"] * 4
    lines = log_lines(srv.tmp, 4)
    # The first session tried the dead one first; after that it is left out for fail_timeout.
    assert f'"127.0.0.1:{dead}, 127.0.0.1:{a}"' in lines[0]
    assert all(f'"127.0.0.1:{a}"' in l for l in lines[1:]), lines
    assert srv.error_log().count("connect() failed (111: Connection refused)") == 1


def test_next_upstream_off_gives_502(gannet, echo):
    p, dead = free_port(), dead_port()
    srv = gannet.start(conf=conf(
        f"upstream back {{ server 127.0.0.1:{dead}; server 127.0.0.1:{echo.ports[0]}; }}\n"
        f"server {{ listen 127.0.0.1:{p}; proxy_next_upstream off; proxy_pass back; }}"))
    assert talk(p) == b""
    assert log_lines(srv.tmp, 1)[0] == f'127.0.0.1 TCP 502 0 0 "127.0.0.1:{dead}" 0 0'


def test_allow_deny(gannet, echo):
    p, q = free_port(), free_port()
    srv = gannet.start(conf=conf(
        "deny 127.0.0.1;\n"
        f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{echo.ports[0]}; }}\n"
        f"server {{ listen 127.0.0.1:{q}; allow 127.0.0.0/8; deny all; proxy_pass 127.0.0.1:{echo.ports[0]}; }}"))
    assert talk(p) == b""
    assert talk(q) == b"[0]hello"
    lines = log_lines(srv.tmp, 2)
    assert lines[0] == '127.0.0.1 TCP 403 0 0 "-" - -'
    assert "access forbidden by rule" in srv.error_log()


def test_proxy_protocol_to_upstream(gannet, echo):
    p = free_port()
    gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p}; proxy_protocol on; proxy_pass 127.0.0.1:{echo.ports[0]}; }}"))
    with socket.create_connection(("127.0.0.1", p), timeout=5) as s:
        s.sendall(b"x")
        got = b""
        while b"x" not in got:
            got += s.recv(4096)
        port = s.getsockname()[1]
    assert echo.first[0].startswith(f"PROXY TCP4 127.0.0.1 127.0.0.1 {port} {p}\r\n".encode()), echo.first


def test_config_errors(gannet):
    cases = [
        ("server { listen 127.0.0.1; proxy_pass 127.0.0.1:1; }", 'no port in "127.0.0.1" of the "listen" directive'),
        ("server { listen 127.0.0.1:1; proxy_pass $nope; }", 'unknown "nope" variable'),
        ("access_log {tmp}/x.log;\nserver { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; }", "log format is not specified"),
        ("upstream u { ip_hash; server 127.0.0.1:2; }\nserver { listen 127.0.0.1:1; proxy_pass u; }", 'unknown directive "ip_hash"'),
        ("geo $ { default a; }\nserver { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; }", 'invalid variable name "$"'),
        ("map $x { default a; }\nserver { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; }", 'invalid number of arguments in "map" directive'),
        ("geo $g { proxy 10.0.0.1; }\nserver { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; }", 'invalid network "proxy"'),
    ]
    for body, msg in cases:
        r = gannet.check(conf=conf(body))
        assert r.returncode != 0 and msg in r.stderr, (body, r.stderr)
        assert "gannet.conf" in r.stderr or "check.conf" in r.stderr


# --- TLS routed by SNI without terminating it ---------------------------------------------


def make_cert(d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(crt), "-days", "2", "-subj", f"/CN={name}"],
                   check=True, capture_output=True, timeout=60)
    return crt, key


class TlsBackend:
    """`openssl s_server` with a certificate for `name`."""

    def __init__(self, d: Path, name: str):
        crt, key = make_cert(d, name)
        self.port = free_port()
        self.proc = subprocess.Popen(["openssl", "s_server", "-accept", f"127.0.0.1:{self.port}", "-cert", str(crt),
                                      "-key", str(key), "-www", "-quiet"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def subject_via(port: int, sni: str) -> str:
    r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", sni, "-alpn", "h2,http/1.1"],
                       input="", capture_output=True, text=True, timeout=30)
    return next((l for l in r.stdout.splitlines() if l.startswith("subject=")), "")


SNI_STREAM = """
    log_format sni '$ssl_preread_server_name $ssl_preread_alpn_protocols $upstream_addr $status';
    map $ssl_preread_server_name $backend {{
        a.test 127.0.0.1:{a};
        ~^b\\. 127.0.0.1:{b};
        default 127.0.0.1:{dead};
    }}
    server {{ listen 127.0.0.1:{p}; ssl_preread on; proxy_pass $backend; access_log {{tmp}}/sni.log sni; }}
"""


def test_sni_routing(gannet, tmp_path):
    a, b = TlsBackend(tmp_path, "a.test"), TlsBackend(tmp_path, "b.test")
    try:
        p, dead = free_port(), dead_port()
        srv = gannet.start(conf=conf(SNI_STREAM.format(a=a.port, b=b.port, dead=dead, p=p)))
        assert "CN = a.test" in subject_via(p, "a.test")
        assert "CN = b.test" in subject_via(p, "b.test")
        assert subject_via(p, "c.test") == ""
        # Lowercased as nginx 1.25.5+ does (Debian's 1.22 passes the name as sent).
        assert "CN = b.test" in subject_via(p, "B.Test")
        log = srv.tmp / "sni.log"
        assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 4)
        lines = log.read_text().splitlines()
        assert lines[0] == f"a.test h2,http/1.1 127.0.0.1:{a.port} 200"
        assert lines[1] == f"b.test h2,http/1.1 127.0.0.1:{b.port} 200"
        assert lines[2] == f"c.test h2,http/1.1 127.0.0.1:{dead} 502"
    finally:
        a.stop()
        b.stop()


# --- UDP: DNS through the proxy --------------------------------------------------------------


@pytest.mark.skipif(DNSMASQ is None or DIG is None, reason="needs dnsmasq and dig (scripts/test-all.sh)")
def test_udp_dns(gannet, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("192.0.2.7 web.test\n")
    dns_port = free_port()
    dns = subprocess.Popen([DNSMASQ, "-k", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", f"--addn-hosts={hosts}",
                            f"--port={dns_port}", "--listen-address=127.0.0.1", "--bind-interfaces", "--local=/test/",
                            "--user=root", "--group=root", "--pid-file="], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p = free_port()
        srv = gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p} udp; proxy_responses 1; proxy_timeout 5s; proxy_pass 127.0.0.1:{dns_port}; }}"))
        dig = lambda: subprocess.run([DIG, "@127.0.0.1", "-p", str(p), "+short", "+tries=1", "+time=2", "web.test"],
                                     capture_output=True, text=True, timeout=30).stdout.strip()
        assert wait_until(lambda: dig() == "192.0.2.7", deadline=10)
        line = log_lines(srv.tmp, 1)[-1]
        assert line.startswith("127.0.0.1 UDP 200 ") and f'"127.0.0.1:{dns_port}"' in line, line
    finally:
        dns.kill()
        dns.wait()


# --- MariaDB through the proxy ---------------------------------------------------------------


@pytest.mark.skipif(MYSQLD is None or MARIADB is None, reason="needs mariadb-server and mariadb-client (scripts/test-all.sh)")
def test_mariadb_client(gannet, tmp_path):
    data, sock, db_port = tmp_path / "db", tmp_path / "db.sock", free_port()
    r = subprocess.run(["mariadb-install-db", f"--datadir={data}", "--user=root", "--auth-root-authentication-method=normal",
                        "--skip-test-db"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    db = subprocess.Popen([MYSQLD, "--no-defaults", f"--datadir={data}", f"--socket={sock}", f"--port={db_port}",
                           "--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables", f"--pid-file={tmp_path}/db.pid",
                           f"--log-error={tmp_path}/db.err"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(db_port, db, deadline=60)
        p = free_port()
        srv = gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{db_port}; }}"))
        q = subprocess.run([MARIADB, "-h", "127.0.0.1", "-P", str(p), "--protocol=TCP", "-u", "root", "-N", "-e",
                            "SELECT 6*7, @@port"], capture_output=True, text=True, timeout=60)
        assert q.returncode == 0, q.stderr
        assert q.stdout.split() == ["42", str(db_port)]
        line = log_lines(srv.tmp, 1)[-1]
        assert line.startswith("127.0.0.1 TCP 200 ") and f'"127.0.0.1:{db_port}"' in line, line
    finally:
        db.terminate()
        db.wait(60)


# --- side by side with Debian's nginx --------------------------------------------------------


@pytest.mark.skipif(NGINX is None or not os.path.exists(STREAM_MODULE), reason="needs nginx and libnginx-mod-stream")
def test_differential_statuses_and_log(gannet, tmp_path, echo):
    """The same stream config in both: answers, `$status`, `$upstream_addr` and the byte
    counters of an answered session, a refused one (403), a dead upstream (502) and a
    failover; the log lines must be the same but for the ports of each side."""
    a = echo.ports[0]
    dead = dead_port()
    ports = {}

    def body(side: str) -> str:
        p = ports.setdefault(side, [free_port() for _ in range(4)])
        return (f"upstream fo {{ server 127.0.0.1:{dead}; server 127.0.0.1:{a}; }}\n"
                f"server {{ listen 127.0.0.1:{p[0]}; proxy_pass 127.0.0.1:{a}; }}\n"
                f"server {{ listen 127.0.0.1:{p[1]}; deny all; proxy_pass 127.0.0.1:{a}; }}\n"
                f"server {{ listen 127.0.0.1:{p[2]}; proxy_pass 127.0.0.1:{dead}; }}\n"
                f"server {{ listen 127.0.0.1:{p[3]}; proxy_pass fo; }}")

    srv = gannet.start(conf=conf(body("g"), load=True))
    ng_tmp = tmp_path / "nginx"
    nginx = NginxPeer(conf(body("n"), load=True), free_port(), tmp_path, ng_tmp)
    try:
        results = {}
        for side, tmp in (("g", srv.tmp), ("n", ng_tmp)):
            answers = [talk(port) for port in ports[side]]
            lines = log_lines(tmp, 4)
            results[side] = (answers, lines)
        assert results["g"][0] == results["n"][0] == [b"[0]hello", b"", b"", b"[0]hello"]
        assert results["g"][1] == results["n"][1]
        assert results["g"][1][2] == f'127.0.0.1 TCP 502 0 0 "127.0.0.1:{dead}" 0 0'
    finally:
        nginx.stop()


def test_limit_conn(gannet, echo):
    p = free_port()
    srv = gannet.start(conf=conf(
        "limit_conn_zone $binary_remote_addr zone=addr:1m;\n"
        f"server {{ listen 127.0.0.1:{p}; limit_conn addr 1; proxy_pass 127.0.0.1:{echo.ports[0]}; }}"))
    with socket.create_connection(("127.0.0.1", p), timeout=5) as first:
        first.sendall(b"a")
        assert first.recv(100) == b"[0]a"
        assert talk(p) == b""
        assert log_lines(srv.tmp, 1)[0] == '127.0.0.1 TCP 503 0 0 "-" - -'
        assert 'limiting connections by zone "addr"' in srv.error_log()
    # The first session's place is given back when it ends.
    assert wait_until(lambda: len(log_lines(srv.tmp, 2)) == 2)
    assert talk(p) == b"[0]hello"


def test_tls_termination(gannet, echo, tmp_path):
    import ssl
    crt, key = make_cert(tmp_path, "t.test")
    p = free_port()
    srv = gannet.start(conf=conf(
        "log_format tls '$ssl_protocol $ssl_server_name $status $bytes_received';\n"
        f"server {{ listen 127.0.0.1:{p} ssl; ssl_certificate {crt}; ssl_certificate_key {key};\n"
        f"  access_log {{tmp}}/tls.log tls; proxy_pass 127.0.0.1:{echo.ports[0]}; }}"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(crt)
    with socket.create_connection(("127.0.0.1", p), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="t.test") as s:
            assert s.getpeercert()["subject"] == ((("commonName", "t.test"),),)
            s.sendall(b"secret")
            assert s.recv(100) == b"[0]secret"
    # Plain bytes on the TLS port: the handshake fails, 500 as nginx.
    answer = talk(p, b"GET / HTTP/1.0\r\n\r\n")
    assert answer == b"" or answer[0] == 0x15, answer  # nothing, or a TLS alert
    log = srv.tmp / "tls.log"
    assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 2)
    assert log.read_text().splitlines() == ["TLSv1.3 t.test 200 6", "- - 500 0"]
    r = gannet.check(conf=conf(f"server {{ listen 127.0.0.1:{p} ssl; proxy_pass 127.0.0.1:1; }}"))
    assert 'no "ssl_certificate" is defined for the "listen ... ssl" directive in' in r.stderr, r.stderr


def test_reload_keeps_sessions_and_listener(gannet, echo):
    import signal
    p = free_port()
    a, b = echo.ports
    srv = gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{a}; }}"))
    with socket.create_connection(("127.0.0.1", p), timeout=5) as old:
        old.sendall(b"1")
        assert old.recv(100) == b"[0]1"
        srv.conf_path.write_text(srv.conf_path.read_text().replace(f"127.0.0.1:{a}", f"127.0.0.1:{b}"))
        srv.proc.send_signal(signal.SIGHUP)
        # New sessions go where the new config says; the one open keeps its upstream.
        assert wait_until(lambda: talk(p) == b"[1]hello")
        old.sendall(b"2")
        assert old.recv(100) == b"[0]2"


@pytest.mark.skipif(NGINX is None or not os.path.exists(STREAM_MODULE), reason="needs nginx and libnginx-mod-stream")
def test_differential_sni_routing(gannet, tmp_path):
    """SNI routing through `map $ssl_preread_server_name` in both: the same certificate
    reached for each name and the same log lines (names, ALPN list, upstream, status)."""
    a, b = TlsBackend(tmp_path, "a.test"), TlsBackend(tmp_path, "b.test")
    dead = dead_port()
    try:
        ports = {"g": free_port(), "n": free_port()}
        body = lambda side: SNI_STREAM.format(a=a.port, b=b.port, dead=dead, p=ports[side])
        srv = gannet.start(conf=conf(body("g"), load=True))
        ng_tmp = tmp_path / "nginx"
        nginx = NginxPeer(conf(body("n"), load=True), free_port(), tmp_path, ng_tmp)
        try:
            logs = {}
            for side, tmp in (("g", srv.tmp), ("n", ng_tmp)):
                subjects = [subject_via(ports[side], name) for name in ("a.test", "b.test", "c.test")]
                assert "CN = a.test" in subjects[0] and "CN = b.test" in subjects[1] and subjects[2] == "", (side, subjects)
                log = tmp / "sni.log"
                assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 3), side
                logs[side] = log.read_text().splitlines()
            assert logs["g"] == logs["n"]
        finally:
            nginx.stop()
    finally:
        a.stop()
        b.stop()


@pytest.mark.skipif(NGINX is None or not os.path.exists(STREAM_MODULE) or DNSMASQ is None or DIG is None,
                    reason="needs nginx, libnginx-mod-stream, dnsmasq and dig")
def test_differential_udp(gannet, tmp_path):
    """DNS over UDP through both proxies: the same answer and log line (protocol, status,
    byte counts, upstream), and with a dead upstream and `proxy_responses 1` a 502."""
    hosts = tmp_path / "hosts"
    hosts.write_text("192.0.2.9 db.test\n")
    dns_port, dead = free_port(), dead_port()
    dns = subprocess.Popen([DNSMASQ, "-k", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", f"--addn-hosts={hosts}",
                            f"--port={dns_port}", "--listen-address=127.0.0.1", "--bind-interfaces", "--local=/test/",
                            "--user=root", "--group=root", "--pid-file="], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ports = {"g": (free_port(), free_port()), "n": (free_port(), free_port())}
    body = lambda side: (f"server {{ listen 127.0.0.1:{ports[side][0]} udp; proxy_responses 1; proxy_timeout 1s; proxy_pass 127.0.0.1:{dns_port}; }}\n"
                         f"server {{ listen 127.0.0.1:{ports[side][1]} udp; proxy_responses 1; proxy_timeout 1s; proxy_pass 127.0.0.1:{dead}; }}")
    try:
        srv = gannet.start(conf=conf(body("g"), load=True))
        ng_tmp = tmp_path / "nginx"
        nginx = NginxPeer(conf(body("n"), load=True), free_port(), tmp_path, ng_tmp)
        try:
            logs = {}
            for side, tmp in (("g", srv.tmp), ("n", ng_tmp)):
                dig = lambda port: subprocess.run([DIG, "@127.0.0.1", "-p", str(port), "+short", "+tries=1", "+time=3", "+noedns", "db.test"],
                                                  capture_output=True, text=True, timeout=30).stdout.strip()
                assert wait_until(lambda: dig(ports[side][0]) == "192.0.2.9", deadline=10), side
                assert dig(ports[side][1]) != "192.0.2.9"
                lines = log_lines(tmp, 2)
                logs[side] = sorted(l.split(" ", 2)[2].rsplit('"', 1)[0] for l in lines)
            assert logs["g"] == logs["n"], logs
        finally:
            nginx.stop()
    finally:
        dns.kill()
        dns.wait()


@pytest.mark.skipif(NGINX is None or not os.path.exists(STREAM_MODULE), reason="needs nginx and libnginx-mod-stream")
def test_differential_proxy_protocol_listen_and_realip(gannet, tmp_path, echo):
    """`listen ... proxy_protocol` with `set_real_ip_from`: the header's address decides
    `allow`/`deny` and is logged; a broken header is a 400; the same in both servers."""
    ports = {"g": free_port(), "n": free_port()}
    body = lambda side: (
        "log_format pp '$remote_addr:$remote_port $proxy_protocol_addr $proxy_protocol_server_port $realip_remote_addr $status $bytes_received';\n"
        f"server {{ listen 127.0.0.1:{ports[side]} proxy_protocol; set_real_ip_from 127.0.0.1; allow 203.0.113.0/24; deny all;\n"
        f"  access_log {{tmp}}/pp.log pp; proxy_pass 127.0.0.1:{echo.ports[0]}; }}")
    srv = gannet.start(conf=conf(body("g"), load=True))
    ng_tmp = tmp_path / "nginx"
    nginx = NginxPeer(conf(body("n"), load=True), free_port(), tmp_path, ng_tmp)
    try:
        logs = {}
        for side, tmp in (("g", srv.tmp), ("n", ng_tmp)):
            p = ports[side]
            assert talk(p, b"PROXY TCP4 203.0.113.5 192.0.2.1 5555 443\r\nhi") == b"[0]hi"
            assert talk(p, b"PROXY TCP4 198.51.100.1 192.0.2.1 5555 443\r\nhi") == b""
            assert talk(p, b"PROXY garbage\r\nhi") == b""
            log = tmp / "pp.log"
            assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 3), side
            # The client's own port differs from run to run.
            logs[side] = [re.sub(r"^127\.0\.0\.1:\d+", "127.0.0.1:P", l) for l in log.read_text().splitlines()]
        assert logs["g"] == logs["n"]
        assert logs["g"][2] == "127.0.0.1:P - - 127.0.0.1 400 0"
        assert logs["g"][:2] == ["203.0.113.5:5555 203.0.113.5 443 127.0.0.1 200 2",
                                 "198.51.100.1:5555 198.51.100.1 443 127.0.0.1 403 0"]
    finally:
        nginx.stop()


@pytest.mark.skipif(NGINX is None or not os.path.exists(STREAM_MODULE), reason="needs nginx and libnginx-mod-stream")
def test_differential_return_and_split_clients(gannet, tmp_path):
    """`return` with `split_clients`, `geo` and `map` values, over TCP and UDP: the same text from
    both servers (the shares hash as nginx's MurmurHash2), and the same log line."""
    ports = {"g": (free_port(), free_port()), "n": (free_port(), free_port())}
    body = lambda side: (
        'split_clients "$remote_addr" $a { 33.3% one; 33.3% two; * three; }\n'
        'split_clients "${remote_addr}x$protocol" $b { 0.5% one; 70% two; }\n'
        "map $b $c { two deux; default autre; }\n"
        "geo $g { default none; 10.0.0.0/8 ten; 127.0.0.0/8 local; 127.0.0.1/32 me; }\n"
        "geo $remote_addr $r { ranges; default out; 127.0.0.0-127.0.0.5 low; }\n"
        f"server {{ listen 127.0.0.1:{ports[side][0]}; return \"$a $b $c $g $r $protocol\\n\"; }}\n"
        f"server {{ listen 127.0.0.1:{ports[side][1]} udp; return \"$a $b $c $g $r $protocol\\n\"; }}")
    srv = gannet.start(conf=conf(body("g"), load=True))
    ng_tmp = tmp_path / "nginx"
    nginx = NginxPeer(conf(body("n"), load=True), free_port(), tmp_path, ng_tmp)
    try:
        got = {}
        for side, tmp in (("g", srv.tmp), ("n", ng_tmp)):
            tcp = talk(ports[side][0], b"")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                u.settimeout(5)
                u.sendto(b"ping", ("127.0.0.1", ports[side][1]))
                udp = u.recv(100)
            got[side] = (tcp, udp, sorted(l.split(" ", 1)[1] for l in log_lines(tmp, 2)))
        assert got["g"] == got["n"], got
        assert got["g"][0].decode().split(" ")[3:] == ["me", "low", "TCP\n"], got
        assert got["g"][1].decode().split(" ")[5] == "UDP\n", got
    finally:
        nginx.stop()


def test_sigusr1_reopens_the_stream_log(gannet, echo):
    import signal
    p = free_port()
    srv = gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{echo.ports[0]}; }}"))
    assert talk(p) == b"[0]hello"
    log_lines(srv.tmp, 1)
    (srv.tmp / "stream.log").rename(srv.tmp / "stream.log.1")
    srv.proc.send_signal(signal.SIGUSR1)
    assert wait_until(lambda: (srv.tmp / "stream.log").exists())
    assert talk(p) == b"[0]hello"
    assert len(log_lines(srv.tmp, 1)) == 1
    assert len((srv.tmp / "stream.log.1").read_text().splitlines()) == 1


def test_download_rate(gannet):
    """`proxy_download_rate 2k`: 6 KiB from the upstream take about two seconds more than
    the first second's budget lets through at once."""
    big = socket.socket()
    big.bind(("127.0.0.1", 0))
    big.listen(1)

    def serve():
        c, _ = big.accept()
        with c:
            c.sendall(b"x" * 6144)

    threading.Thread(target=serve, daemon=True).start()
    p = free_port()
    gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{p}; proxy_download_rate 2k; proxy_pass 127.0.0.1:{big.getsockname()[1]}; }}"))
    start = time.monotonic()
    got = b""
    with socket.create_connection(("127.0.0.1", p), timeout=10) as s:
        while chunk := s.recv(65536):
            got += chunk
    took = time.monotonic() - start
    big.close()
    assert got == b"x" * 6144
    # nginx's budget: rate * (seconds + 1), so 6k at 2k/s is done after about 2 s.
    assert 1.5 <= took < 5, took


@pytest.mark.skipif(NGINX is None or not os.path.exists(STREAM_MODULE), reason="needs nginx and libnginx-mod-stream")
def test_differential_variable_pass(gannet, tmp_path, echo):
    """`proxy_pass $var`: a group's name, an address, and a host name (502 without a
    `resolver`, nginx's "no resolver defined") give the same answers and lines in both."""
    a = echo.ports[0]
    ports = {"g": [free_port() for _ in range(3)], "n": [free_port() for _ in range(3)]}
    body = lambda side: (
        f"upstream grp {{ server 127.0.0.1:{a}; }}\n"
        "map $server_port $to {\n" +
        f"  {ports[side][0]} grp; {ports[side][1]} 127.0.0.1:{a}; default localhost:{a};\n" + "}\n" +
        "".join(f"server {{ listen 127.0.0.1:{p}; proxy_pass $to; }}\n" for p in ports[side]))
    srv = gannet.start(conf=conf(body("g"), load=True))
    ng_tmp = tmp_path / "nginx"
    nginx = NginxPeer(conf(body("n"), load=True), free_port(), tmp_path, ng_tmp)
    try:
        got = {}
        for side, tmp in (("g", srv.tmp), ("n", ng_tmp)):
            answers = [talk(p) for p in ports[side]]
            got[side] = (answers, log_lines(tmp, 3))
            assert "no resolver defined to resolve localhost" in (tmp / "error.log").read_text(), side
        assert got["g"] == got["n"], got
        assert got["g"][0] == [b"[0]hello", b"[0]hello", b""]
    finally:
        nginx.stop()


def test_binary_upgrade_hands_over_tcp_and_udp_listeners(gannet, echo):
    """USR2 then QUIT to the old master: the new one serves the stream addresses (a TCP and
    a UDP socket on one port) with the sockets it inherited, none refused or ignored."""
    import signal
    p = free_port()
    srv = gannet.start(conf=conf(
        f"server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{echo.ports[0]}; }}\n"
        f"server {{ listen 127.0.0.1:{p} udp; return \"udp $protocol\"; }}"))

    def udp():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.settimeout(2)
            u.sendto(b"x", ("127.0.0.1", p))
            return u.recv(100)

    assert talk(p) == b"[0]hello" and udp() == b"udp UDP"
    pid_file = srv.tmp / "server.pid"

    def read():
        # The old master renames the file to .oldbin before the new one writes its own.
        try:
            text = pid_file.read_text().strip()
        except OSError:
            return None
        return int(text) if text else None

    old = srv.proc.pid
    srv.proc.send_signal(signal.SIGUSR2)
    new = wait_until(lambda: (pid := read()) not in (None, old) and pid, 15)
    assert new, srv.error_log()[-2000:]
    try:
        srv.proc.send_signal(signal.SIGQUIT)
        srv.proc.wait(15)
        assert talk(p) == b"[0]hello" and udp() == b"udp UDP"
        assert "inherited socket" not in srv.error_log()
    finally:
        os.kill(new, signal.SIGTERM)
