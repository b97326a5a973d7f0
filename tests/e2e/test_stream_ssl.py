"""TLS in the `stream {}` proxy: `proxy_ssl` to TLS backends (Python's ssl module recording
the SNI and client certificate of each handshake, and `openssl s_server -Verify`), with
verification on and off and a name that does not match; `$ssl_preread_protocol` routing
with `openssl s_client -tls1_2`/`-tls1_3`; TLS terminated with `ssl_verify_client` and the
`$ssl_*` variables in the access log. The routing and the variables are compared with
Debian's nginx (its stream module loaded) running the same config."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import free_port, wait_port, wait_until
from nginx_peer import NGINX, NginxPeer
from test_stream import STREAM_MODULE, TlsBackend, conf, dead_port
from test_tls import Pki

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="needs the openssl command-line tool",
)
WITH_NGINX = pytest.mark.skipif(NGINX is None or not os.path.exists(STREAM_MODULE),
                                reason="needs nginx and libnginx-mod-stream")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.issue("backend", "localhost", sans=("localhost", "backend.test"))
    p.issue("client", "gannet-client", org="Gannet Test")
    p.issue("cnonly", "cn.test")  # no subjectAltName: its name is in the CN only
    p.self_signed("stranger", "stranger")
    return p


class TlsEcho:
    """A TLS server answering each connection's first read with `ok:` and the bytes; it
    keeps each handshake's SNI name and the client certificate's subject (its CN)."""

    def __init__(self, pki: Pki, name: str = "backend"):
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(pki.path(f"{name}.pem"), pki.path(f"{name}.key"))
        self.ctx.verify_mode = ssl.CERT_OPTIONAL
        self.ctx.load_verify_locations(pki.path("ca.pem"))
        self.sni: list = []
        self.ctx.sni_callback = lambda sock, name, ctx: self.sni.append(name) and None
        self.clients: list = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        try:
            with self.ctx.wrap_socket(c, server_side=True) as t:
                cert = t.getpeercert() or {}
                cn = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
                self.clients.append(cn[0] if cn else None)
                data = t.recv(100)
                t.sendall(b"ok:" + data)
        except (OSError, ssl.SSLError):
            pass

    def close(self):
        self.sock.close()


@pytest.fixture
def backend(pki):
    b = TlsEcho(pki)
    yield b
    b.close()


def talk(port: int, data: bytes = b"hello") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        try:
            return s.recv(100)
        except ConnectionResetError:
            return b""


def test_proxy_ssl_verify_name_sni_and_client_certificate(gannet, pki, backend):
    ca, p = pki.path("ca.pem"), [free_port() for _ in range(5)]
    up = f"127.0.0.1:{backend.port}"
    srv = gannet.start(conf=conf(f"""
        log_format st '$server_port $status $upstream_addr';
        access_log {{tmp}}/st.log st;
        proxy_ssl on;
        server {{ listen 127.0.0.1:{p[0]}; proxy_pass {up}; }}
        server {{ listen 127.0.0.1:{p[1]}; proxy_pass {up}; proxy_ssl_verify on;
                 proxy_ssl_trusted_certificate {ca}; proxy_ssl_name localhost; }}
        server {{ listen 127.0.0.1:{p[2]}; proxy_pass {up}; proxy_ssl_verify on;
                 proxy_ssl_trusted_certificate {ca}; proxy_ssl_name wrong.test; }}
        server {{ listen 127.0.0.1:{p[3]}; proxy_pass {up}; proxy_ssl_server_name on;
                 proxy_ssl_name backend.test:443; }}
        server {{ listen 127.0.0.1:{p[4]}; proxy_pass {up};
                 proxy_ssl_certificate {pki.path('client.pem')};
                 proxy_ssl_certificate_key {pki.path('client.key')}; }}
    """))
    # verify off (the default): the unknown CA does not matter; no SNI by default.
    assert talk(p[0]) == b"ok:hello"
    assert backend.sni == [None] and backend.clients == [None]
    assert talk(p[1]) == b"ok:hello"
    # A certificate not for the name: refused as nginx, the client sees a close.
    assert talk(p[2]) == b""
    errors = srv.tmp / "error.log"
    assert wait_until(lambda: 'upstream SSL certificate does not match "wrong.test"' in errors.read_text())
    assert talk(p[3]) == b"ok:hello"
    assert backend.sni[-1] == "backend.test"
    assert talk(p[4]) == b"ok:hello"
    assert backend.clients[-1] == "gannet-client"
    log = srv.tmp / "st.log"
    assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 5)
    statuses = [line.split()[1] for line in log.read_text().splitlines()]
    assert statuses == ["200", "200", "502", "200", "200"]


def test_proxy_ssl_certificate_with_variables(gannet, pki, backend):
    """nginx 1.21+: the certificate's file named per session; an empty name sends none."""
    p = [free_port(), free_port()]
    d = pki.path("")
    srv = gannet.start(conf=conf(f"""
        map $server_port $who {{ {p[0]} client; default ""; }}
        proxy_ssl on;
        proxy_ssl_certificate {d}/$who.pem;
        proxy_ssl_certificate_key {d}/$who.key;
        server {{ listen 127.0.0.1:{p[0]}; proxy_pass 127.0.0.1:{backend.port}; }}
        server {{ listen 127.0.0.1:{p[1]}; proxy_pass 127.0.0.1:{backend.port};
                 proxy_ssl_certificate $who; proxy_ssl_certificate_key $who; }}
    """))
    # The first session once the listener is up (a refused connection never reaches the
    # backend, whose list of client certificates the test reads).
    first = []

    def up():
        try:
            first.append(talk(p[0]))
        except ConnectionRefusedError:
            return False
        return True

    assert wait_until(up) and first == [b"ok:hello"]
    assert backend.clients == ["gannet-client"]
    assert talk(p[1]) == b"ok:hello"
    assert backend.clients == ["gannet-client", None]
    r = gannet.check(conf=conf(
        "server { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; proxy_ssl on; proxy_ssl_certificate $remote_addr; }"))
    assert 'no "proxy_ssl_certificate_key" is defined' in r.stderr
    assert srv


def test_proxy_ssl_verify_takes_the_cn_without_alt_names(gannet, pki):
    """As OpenSSL: a certificate naming its host only in the CN verifies for that name."""
    b = TlsEcho(pki, "cnonly")
    try:
        ca, p = pki.path("ca.pem"), [free_port(), free_port()]
        verify = f"proxy_ssl on; proxy_ssl_verify on; proxy_ssl_trusted_certificate {ca};"
        gannet.start(conf=conf(f"""
            server {{ listen 127.0.0.1:{p[0]}; proxy_pass 127.0.0.1:{b.port}; {verify} proxy_ssl_name cn.test; }}
            server {{ listen 127.0.0.1:{p[1]}; proxy_pass 127.0.0.1:{b.port}; {verify} proxy_ssl_name other.test; }}
        """))
        assert talk(p[0]) == b"ok:hello"
        assert talk(p[1]) == b""
    finally:
        b.close()


def test_client_certificate_seen_by_s_server(gannet, pki, tmp_path):
    """`openssl s_server -Verify 1` requires and checks the certificate gannet presents."""
    port, p = free_port(), free_port()
    out = tmp_path / "s_server.out"
    with out.open("w") as f:
        proc = subprocess.Popen(["openssl", "s_server", "-accept", f"127.0.0.1:{port}",
                                 "-cert", str(pki.path("backend.pem")), "-key", str(pki.path("backend.key")),
                                 "-Verify", "1", "-CAfile", str(pki.path("ca.pem"))],
                                stdin=subprocess.PIPE, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_port(port, proc)  # (a connection s_server sees fail, before gannet's)
        gannet.start(conf=conf(f"""
            server {{ listen 127.0.0.1:{p}; proxy_pass 127.0.0.1:{port}; proxy_ssl on;
                     proxy_ssl_certificate {pki.path('client.pem')};
                     proxy_ssl_certificate_key {pki.path('client.key')}; }}
        """))
        with socket.create_connection(("127.0.0.1", p), timeout=5) as s:
            s.sendall(b"through-tls\n")
            assert wait_until(lambda: "through-tls" in out.read_text(), deadline=10), out.read_text()
        text = out.read_text().split("through-tls")[0]
        assert "CN = gannet-client" in text and "verify return:1" in text, text
    finally:
        proc.kill()
        proc.wait()


def test_proxy_ssl_config_errors(gannet, pki):
    r = gannet.check(conf=conf(
        "server { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; proxy_ssl on; proxy_ssl_verify on; }"))
    assert "no proxy_ssl_trusted_certificate for proxy_ssl_verify" in r.stderr
    r = gannet.check(conf=conf(
        "server { listen 127.0.0.1:1; proxy_pass 127.0.0.1:2; proxy_ssl maybe; }"))
    assert "proxy_ssl" in r.stderr and r.returncode != 0


def s_client(port: int, *args: str, data: str = "") -> str:
    r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", *args],
                       input=data, capture_output=True, text=True, timeout=30)
    return r.stdout


PROTO_STREAM = """
    log_format proto '$ssl_preread_protocol $upstream_addr $status';
    map $ssl_preread_protocol $by_proto {{
        TLSv1.3 127.0.0.1:{a};
        TLSv1.2 127.0.0.1:{b};
        default 127.0.0.1:{dead};
    }}
    server {{ listen 127.0.0.1:{p}; ssl_preread on; proxy_pass $by_proto; access_log {{tmp}}/proto.log proto; }}
"""


@WITH_NGINX
def test_differential_preread_protocol_routing(gannet, tmp_path):
    a, b = TlsBackend(tmp_path, "a.test"), TlsBackend(tmp_path, "b.test")
    dead = dead_port()
    try:
        ports = {"g": free_port(), "n": free_port()}
        body = lambda side: PROTO_STREAM.format(a=a.port, b=b.port, dead=dead, p=ports[side])
        srv = gannet.start(conf=conf(body("g"), load=True))
        ng_tmp = tmp_path / "nginx"
        nginx = NginxPeer(conf(body("n"), load=True), free_port(), tmp_path, ng_tmp)
        try:
            logs = {}
            for side, tmp in (("g", srv.tmp), ("n", ng_tmp)):
                port = ports[side]
                assert "CN = a.test" in s_client(port, "-tls1_3"), side
                assert "CN = b.test" in s_client(port, "-tls1_2"), side
                assert talk(port, b"plain\r\n") == b"", side
                log = tmp / "proto.log"
                assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 3), side
                logs[side] = log.read_text().splitlines()
            assert logs["g"] == logs["n"]
            assert logs["g"] == [f"TLSv1.3 127.0.0.1:{a.port} 200", f"TLSv1.2 127.0.0.1:{b.port} 200",
                                 f"- 127.0.0.1:{dead} 502"]
        finally:
            nginx.stop()
    finally:
        a.stop()
        b.stop()


VARS = ("$ssl_protocol|$ssl_cipher|$ssl_server_name|$ssl_alpn_protocol|$ssl_session_reused|"
        "$ssl_client_verify|$ssl_client_s_dn|$ssl_client_i_dn|$ssl_client_serial|$ssl_client_fingerprint|"
        "$ssl_client_v_start|$ssl_client_v_end|$ssl_client_v_remain|$ssl_curves|$status")

TERM_STREAM = """
    log_format vars '{vars}';
    ssl_certificate {crt};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;  # Debian's 1.22 has no TLSv1.3 by default
    server {{ listen 127.0.0.1:{p0} ssl; ssl_verify_client optional; ssl_client_certificate {ca};
             ssl_alpn x-one x-two;
             return "$ssl_client_verify:$ssl_alpn_protocol\\n"; access_log {{tmp}}/vars.log vars; }}
    server {{ listen 127.0.0.1:{p1} ssl; ssl_verify_client on; ssl_client_certificate {ca};
             return "$ssl_client_s_dn\\n"; access_log {{tmp}}/vars.log vars; }}
"""


def not_after(pem) -> float:
    """A certificate's end of validity, in seconds since the epoch."""
    out = subprocess.run(["openssl", "x509", "-enddate", "-noout", "-in", str(pem)], capture_output=True,
                         text=True, check=True).stdout
    return ssl.cert_time_to_seconds(out.strip().split("=", 1)[1])


@WITH_NGINX
def test_differential_termination_client_certificates_and_variables(gannet, pki, tmp_path):
    ports = {"g": (free_port(), free_port()), "n": (free_port(), free_port())}

    def body(side):
        p0, p1 = ports[side]
        return TERM_STREAM.format(vars=VARS, crt=pki.path("backend.pem"), key=pki.path("backend.key"),
                                  ca=pki.path("ca.pem"), p0=p0, p1=p1)

    cert = ["-cert", str(pki.path("client.pem")), "-key", str(pki.path("client.key"))]
    stranger = ["-cert", str(pki.path("stranger.pem")), "-key", str(pki.path("stranger.key"))]
    srv = gannet.start(conf=conf(body("g"), load=True))
    ng_tmp = tmp_path / "nginx"
    nginx = NginxPeer(conf(body("n"), load=True), free_port(), tmp_path, ng_tmp)
    began = time.time()
    try:
        logs = {}
        for side, tmp in (("g", srv.tmp), ("n", ng_tmp)):
            p0, p1 = ports[side]
            base = ["-servername", "backend.test", "-ign_eof"]
            assert "SUCCESS:x-two" in s_client(p0, *base, *cert, "-alpn", "x-two"), side
            assert "NONE:" in s_client(p0, *base), side
            assert "O=Gannet Test,CN=gannet-client" in s_client(p1, *base, *cert), side
            # Required and not sent, or sent and not trusted: the session ends, 500.
            assert "gannet-client" not in s_client(p1, *base), side
            s_client(p1, *base, *stranger)
            log = tmp / "vars.log"
            assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 5), side
            logs[side] = log.read_text().splitlines()
        # $ssl_client_v_remain is whole days left at the second each server logged: the two
        # may straddle a day boundary of the certificate's end, so each is checked against
        # the certificate, then left out of the comparison.
        end = not_after(pki.path("client.pem"))
        # Whole seconds, as both servers count (nginx's cached ngx_time()).
        allowed = {str(max(0, (int(end) - int(t)) // 86400)) for t in (began, time.time() + 1)}
        remain = VARS.split("|").index("$ssl_client_v_remain")
        for side in logs:
            fields = [line.split("|") for line in logs[side]]
            assert all(f[remain] in allowed | {"-"} for f in fields), (side, [f[remain] for f in fields], allowed)
            logs[side] = ["|".join(f[:remain] + f[remain + 1:]) for f in fields]
        assert logs["g"] == logs["n"], (logs["g"], logs["n"])
        assert [line.split("|")[-1] for line in logs["g"]] == ["200", "200", "200", "500", "500"]
    finally:
        nginx.stop()
    errors = (srv.tmp / "error.log").read_text()
    assert "client sent no required SSL certificate" in errors
    assert "client SSL certificate verify error" in errors
