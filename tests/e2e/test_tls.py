"""HTTPS: real TLS clients (curl, openssl s_client, Python's ssl) against `listen ... ssl`.

Every key and certificate is made at test time with the openssl CLI (a throwaway CA signs
the server and client certificates, so chains, serials and OCSP responses are real).
"""

from __future__ import annotations

import hashlib
import http.client
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import free_port, wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both


pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0
    or subprocess.run(["which", "curl"], capture_output=True).returncode != 0,
    reason="needs the openssl and curl command-line tools",
)

CA_CNF = """
[ ca ]
default_ca = test_ca
[ test_ca ]
dir = {dir}
database = {dir}/index.txt
new_certs_dir = {dir}
serial = {dir}/serial
crlnumber = {dir}/crlnumber
default_md = sha256
policy = any
unique_subject = no
copy_extensions = copy
[ any ]
commonName = supplied
organizationName = optional
[ leaf ]
basicConstraints = CA:FALSE
extendedKeyUsage = serverAuth, clientAuth
"""


def openssl(*args: str, cwd: Path) -> str:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"openssl {' '.join(args)}:\n{r.stderr}"
    return r.stdout


class Pki:
    """A throwaway CA and the certificates the tests need, all in one directory."""

    def __init__(self, d: Path):
        self.d = d
        (d / "index.txt").write_text("")
        (d / "serial").write_text("1000\n")
        (d / "crlnumber").write_text("01\n")
        (d / "ca.cnf").write_text(CA_CNF.format(dir=d))
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "ca.key", "-out", "ca.pem", "-days", "3", "-subj", "/CN=Gannet Test CA", cwd=d)

    def issue(self, name: str, cn: str, key: str = "ec", org: str | None = None,
              sans: tuple[str, ...] = (), dates: tuple[str, str] | None = None) -> tuple[Path, Path]:
        """A key and a CA-signed certificate: `name.key`, `name.pem`."""
        newkey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"] if key == "ec" else ["-newkey", "rsa:2048"]
        subj = f"/CN={cn}" + (f"/O={org}" if org else "")
        req = ["req", "-new", *newkey, "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj]
        if sans:
            req += ["-addext", "subjectAltName=" + ",".join(f"DNS:{s}" for s in sans)]
        openssl(*req, cwd=self.d)
        when = ["-startdate", dates[0], "-enddate", dates[1]] if dates else ["-days", "2"]
        openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-notext",
                "-extensions", "leaf", "-in", f"{name}.csr", "-out", f"{name}.pem", *when, cwd=self.d)
        return self.d / f"{name}.pem", self.d / f"{name}.key"

    def self_signed(self, name: str, cn: str) -> tuple[Path, Path]:
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={cn}", cwd=self.d)
        return self.d / f"{name}.pem", self.d / f"{name}.key"

    def path(self, name: str) -> Path:
        return self.d / name


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.issue("ec", "ec.test", sans=("ec.test", "localhost"))
    p.issue("rsa", "rsa.test", key="rsa", sans=("rsa.test",))
    p.issue("a", "a.test", sans=("a.test",))
    p.issue("b", "b.test", sans=("b.test",))
    p.issue("client", "client", org="Gannet Test")
    p.self_signed("stranger", "stranger")
    p.issue("expired", "expired.test", dates=("20200101000000Z", "20200102000000Z"))
    p.issue("future", "future.test", dates=("20990101000000Z", "20990102000000Z"))
    p.issue("revoked", "revoked")
    openssl("ca", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-revoke", "revoked.pem", cwd=p.d)
    openssl("ca", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-gencrl", "-crldays", "2",
            "-out", "crl.pem", cwd=p.d)
    return p


def pair(pki: Pki, name: str) -> str:
    return f"ssl_certificate {pki.path(name + '.pem')}; ssl_certificate_key {pki.path(name + '.key')};"


VARS = "return 200 \"$scheme|$https|$ssl_protocol|$ssl_cipher|$ssl_server_name|$server_name|$ssl_session_reused\\n\";"


def conf(servers: str, http: str = "") -> str:
    """A whole config; `{port}`, `{root}`, `{tmp}`, `{repo}` are filled in by the fixture."""
    return f"""
worker_processes 1;
pid {{tmp}}/gannet.pid;
error_log {{tmp}}/error.log info;
events {{ worker_connections 1024; }}
http {{
    include {{repo}}/conf/mime.types;
    default_type application/octet-stream;
    access_log {{tmp}}/access.log;
    {http}
    {servers}
}}
"""


def one_server(pki: Pki, body: str = "", certs: str | None = None, http: str = "") -> str:
    return conf(f"""
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name localhost;
        root {{root}};
        {certs if certs is not None else pair(pki, 'ec')}
        location = /v {{ {VARS} }}
        {body}
    }}""", http)


def unverified() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def https(port: int, ctx: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection(host, port, context=ctx or unverified(), timeout=10)


def curl(port: int, path: str, *args: str, host: str = "localhost") -> subprocess.CompletedProcess:
    return subprocess.run(
        ["curl", "-sk", "--resolve", f"{host}:{port}:127.0.0.1", *args, f"https://{host}:{port}{path}"],
        capture_output=True, text=True, timeout=30,
    )


def s_client(port: int, *args: str, request: bytes = b"GET /v HTTP/1.0\r\n\r\n") -> str:
    """openssl s_client with a request, read until the server closes; stdout and stderr."""
    r = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-ign_eof", *args],
        input=request, capture_output=True, timeout=30,
    )
    return r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")


def subject_cn(out: str) -> str:
    m = re.search(r"^subject=.*?CN ?= ?([^,\n/]+)", out, re.M)
    return m.group(1).strip() if m else ""


# --- serving over TLS ------------------------------------------------------------------------


def test_get_head_range_keepalive_and_bodies(gannet, pki):
    big = bytes(range(256)) * 1200  # 300 KB: many TLS records, more than rustls buffers at once
    srv = gannet.start(conf=one_server(pki, 'location = /c { return 200 "$connection $connection_requests\\n"; }'),
                       files={"index.html": "hello tls\n", "big.bin": big})
    c = https(srv.port)
    c.request("GET", "/")
    r = c.getresponse()
    assert (r.status, r.read()) == (200, b"hello tls\n")
    c.request("HEAD", "/big.bin")
    r = c.getresponse()
    assert r.status == 200 and r.getheader("content-length") == str(len(big)) and r.read() == b""
    c.request("GET", "/big.bin", headers={"Range": "bytes=1000-1999"})
    r = c.getresponse()
    assert r.status == 206 and r.read() == big[1000:2000]
    c.request("GET", "/big.bin")
    r = c.getresponse()
    assert r.status == 200 and r.read() == big
    # A request body is read through TLS too, and the connection goes on after it.
    c.request("PUT", "/v", body=b"x" * 70000)
    r = c.getresponse()
    assert r.status == 200 and r.read().startswith(b"https|on|TLSv1.3|")
    c.request("GET", "/c")
    conn_id, n = c.getresponse().read().split()
    assert n == b"6"  # all six requests on one kept-alive TLS connection
    c.close()
    # Pipelined requests in one TLS write are all answered, in order.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as raw:
        with unverified().wrap_socket(raw) as s:
            s.sendall(b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n" * 3 + b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    assert data.count(b"HTTP/1.1 200 OK") == 4
    assert [int(x.split()[1]) for x in re.findall(rb"\d+ \d+\n", data)] == [1, 2, 3, 4]


def test_big_file_to_a_slow_reader(gannet, pki):
    """The socket fills up: encrypted records wait in rustls, the rest follows as the
    client drains it, and every byte arrives."""
    big = hashlib.sha256(b"seed").digest() * (6 * 1024 * 1024 // 32)
    srv = gannet.start(conf=one_server(pki), files={"big.bin": big})
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.settimeout(20)
    raw.connect(("127.0.0.1", srv.port))
    with unverified().wrap_socket(raw) as s:
        s.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        got = hashlib.sha256()
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1024)
        head, rest = head.split(b"\r\n\r\n", 1)
        got.update(rest)
        n = len(rest)
        while chunk := s.recv(1024):
            got.update(chunk)
            n += len(chunk)
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert n == len(big) and got.digest() == hashlib.sha256(big).digest()


def test_idle_tls_connection_serves_again(gannet, pki):
    """Past a second of idleness a TLS connection gives its buffers back (it cannot park);
    the next request on it is served as usual."""
    srv = gannet.start(conf=one_server(pki), files={"index.html": "again\n"})
    c = https(srv.port)
    for pause in (0, 1.5, 1.5):
        time.sleep(pause)  # the idle time is what is tested
        c.request("GET", "/")
        assert c.getresponse().read() == b"again\n"
    c.close()


def test_cleartext_and_tls_on_one_server(gannet, pki):
    tls_port = free_port()
    srv = gannet.start(conf=conf(f"""
    server {{
        listen 127.0.0.1:{{port}};
        listen 127.0.0.1:{tls_port} ssl;
        server_name localhost;
        {pair(pki, 'ec')}
        location = /v {{ {VARS} }}
    }}"""))
    assert srv.get("/v")[2] == b"http|||||localhost|\n"
    r = curl(tls_port, "/v")
    assert r.stdout.startswith("https|on|TLSv1.3|TLS_") and "|localhost|localhost|.\n" in r.stdout


def test_directory_redirect_uses_https(gannet, pki):
    srv = gannet.start(conf=one_server(pki), files={"dir/index.html": "in dir"})
    c = https(srv.port)
    c.request("GET", "/dir", headers={"Host": "localhost"})
    r = c.getresponse()
    assert r.status == 301
    assert r.getheader("location") == f"https://localhost:{srv.port}/dir/"


# --- choosing the server and the certificate ------------------------------------------------


def test_sni_picks_the_server_and_falls_back_to_the_default(gannet, pki):
    srv = gannet.start(conf=conf(f"""
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name a.test;
        {pair(pki, 'a')}
        location = /v {{ {VARS} }}
    }}
    server {{
        listen 127.0.0.1:{{port}} ssl default_server;
        server_name b.test;
        {pair(pki, 'b')}
        location = /v {{ {VARS} }}
    }}"""))
    assert subject_cn(s_client(srv.port, "-servername", "a.test")) == "a.test"
    assert subject_cn(s_client(srv.port, "-servername", "b.test")) == "b.test"
    # Unknown name, or no SNI at all: the default_server's certificate (not the first's).
    assert subject_cn(s_client(srv.port, "-servername", "nobody.test")) == "b.test"
    assert subject_cn(s_client(srv.port, "-noservername")) == "b.test"
    r = curl(srv.port, "/v", host="a.test")
    assert r.stdout.split("|")[4:6] == ["a.test", "a.test"]


def test_ecdsa_and_rsa_pairs_follow_the_client(gannet, pki):
    srv = gannet.start(conf=one_server(pki, certs=pair(pki, "ec") + pair(pki, "rsa")))
    out = s_client(srv.port, "-sigalgs", "ECDSA+SHA256")
    assert subject_cn(out) == "ec.test" and "Peer signature type: ECDSA" in out
    out = s_client(srv.port, "-sigalgs", "RSA-PSS+SHA256:RSA+SHA256")
    assert subject_cn(out) == "rsa.test" and "Peer signature type: RSA" in out
    # TLS 1.2 with only RSA suites: the RSA certificate, even though ECDSA is verifiable.
    r = curl(srv.port, "/v", "--tls-max", "1.2", "--ciphers", "ECDHE-RSA-AES128-GCM-SHA256")
    assert r.stdout.split("|")[2:4] == ["TLSv1.2", "ECDHE-RSA-AES128-GCM-SHA256"], r
    r = curl(srv.port, "/v", "--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES256-GCM-SHA384")
    assert r.stdout.split("|")[2:4] == ["TLSv1.2", "ECDHE-ECDSA-AES256-GCM-SHA384"], r


def test_reload_picks_up_a_new_certificate(gannet, pki):
    srv = gannet.start(conf=one_server(pki, certs=pair(pki, "a")))
    assert subject_cn(s_client(srv.port)) == "a.test"
    text, _ = gannet.render(conf=one_server(pki, certs=pair(pki, "b")), port=srv.port)
    srv.conf_path.write_text(text)
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: subject_cn(s_client(srv.port)) == "b.test", deadline=10)
    # A new config whose certificate has expired is taken, with a warning, as nginx takes it.
    text, _ = gannet.render(conf=one_server(pki, certs=pair(pki, "expired")), port=srv.port)
    srv.conf_path.write_text(text)
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: subject_cn(s_client(srv.port)) == "expired.test", deadline=10)
    assert "[warn]" in srv.error_log() and "has expired" in srv.error_log(), srv.error_log()


def test_reject_handshake_default_needs_no_certificate(gannet, pki):
    srv = gannet.start(conf=conf(f"""
    server {{
        listen 127.0.0.1:{{port}} ssl default_server;
        ssl_reject_handshake on;
    }}
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name a.test;
        {pair(pki, 'a')}
        location = /v {{ {VARS} }}
    }}"""))
    assert curl(srv.port, "/v", host="a.test").stdout.startswith("https|on|")
    r = curl(srv.port, "/v", host="nobody.test")
    assert r.returncode != 0 and r.stdout == ""


# --- protocols and ciphers --------------------------------------------------------------------


def test_protocols(gannet, pki):
    srv = gannet.start(conf=one_server(pki, http="ssl_protocols TLSv1.2;"))
    assert curl(srv.port, "/v").stdout.split("|")[2] == "TLSv1.2"
    r = curl(srv.port, "/v", "--tlsv1.3")
    assert r.returncode != 0 and r.stdout == ""
    srv.stop()
    srv = gannet.start(conf=one_server(pki, http="ssl_protocols TLSv1.3;"))
    r = curl(srv.port, "/v", "--tlsv1.2", "--tls-max", "1.2")
    assert r.returncode != 0 and r.stdout == ""
    ctx = unverified()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    c = https(srv.port, ctx)
    c.request("GET", "/v")
    assert c.getresponse().read().split(b"|")[2] == b"TLSv1.3"


def test_ciphers_and_server_preference(gannet, pki):
    srv = gannet.start(conf=one_server(pki, http="ssl_ciphers ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES128-GCM-SHA256; ssl_prefer_server_ciphers on;"))
    # The client prefers AES, the server's order wins.
    r = curl(srv.port, "/v", "--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305")
    assert r.stdout.split("|")[3] == "ECDHE-ECDSA-CHACHA20-POLY1305", r
    r = curl(srv.port, "/v", "--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES256-GCM-SHA384")
    assert r.returncode != 0 and r.stdout == ""
    srv.stop()
    srv = gannet.start(conf=one_server(pki, http="ssl_ciphers ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES128-GCM-SHA256;"))
    r = curl(srv.port, "/v", "--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305")
    assert r.stdout.split("|")[3] == "ECDHE-ECDSA-AES128-GCM-SHA256", r


def test_ecdh_curve(gannet, pki):
    srv = gannet.start(conf=one_server(pki, 'location = /curve { return 200 "$ssl_curve\\n"; }', http="ssl_ecdh_curve secp384r1:prime256v1;"))
    # (The group is the first of the client's list that the server offers.)
    assert curl(srv.port, "/curve").stdout == "prime256v1\n"
    assert curl(srv.port, "/curve", "--curves", "X25519:secp384r1").stdout == "secp384r1\n"
    assert curl(srv.port, "/curve", "--curves", "prime256v1").stdout == "prime256v1\n"
    r = curl(srv.port, "/curve", "--curves", "X25519")
    assert r.returncode != 0 and r.stdout == ""
    srv.stop()
    srv = gannet.start(conf=one_server(pki, 'location = /curve { return 200 "$ssl_curve\\n"; }'))
    assert curl(srv.port, "/curve").stdout == "X25519\n"


# --- sessions ---------------------------------------------------------------------------------


def status_line(out: str) -> str:
    return next((line for line in out.splitlines() if line.startswith(("New,", "Reused,"))), out)


def resumed(port: int, tmp: Path, *args: str) -> tuple[str, str, str]:
    """The first and second handshake's status lines ("New, ..." / "Reused, ...") and
    the second's whole output."""
    sess = tmp / "s.sess"
    sess.unlink(missing_ok=True)
    first = s_client(port, *args, "-sess_out", str(sess))
    second = s_client(port, *args, "-sess_in", str(sess))
    return status_line(first), status_line(second), second


def test_session_tickets_and_cache(gannet, pki):
    srv = gannet.start(conf=one_server(pki, http="ssl_session_cache shared:SSL:1m;"))
    for args in (("-tls1_3",), ("-tls1_2",), ("-tls1_2", "-no_ticket"), ("-tls1_3", "-no_ticket")):
        first, second, out = resumed(srv.port, gannet.tmp, *args)
        assert first.startswith("New,") and second.startswith("Reused,"), (args, first, second)
        # The server knows it too ($ssl_session_reused).
        body = next(line for line in out.splitlines() if line.startswith("https|"))
        assert body.endswith("|r"), body


def test_no_cache_and_no_tickets_means_no_resumption(gannet, pki):
    srv = gannet.start(conf=one_server(pki, http="ssl_session_tickets off;"))
    for args in (("-tls1_3",), ("-tls1_2",)):
        first, second, _ = resumed(srv.port, gannet.tmp, *args)
        # (Over TLS 1.3 no ticket comes at all, so there is no session to offer.)
        assert first.startswith("New,") and not second.startswith("Reused,"), (args, first, second)
    srv.stop()
    # Tickets on, no cache: TLS 1.2 session ids are not remembered.
    srv = gannet.start(conf=one_server(pki))
    first, second, _ = resumed(srv.port, gannet.tmp, "-tls1_2", "-no_ticket")
    assert first.startswith("New,") and not second.startswith("Reused,"), second


def test_session_timeout_is_enforced(gannet, pki):
    srv = gannet.start(conf=one_server(pki, http="ssl_session_cache builtin:100; ssl_session_timeout 1s;"))
    sess = gannet.tmp / "s.sess"
    for args in (("-tls1_3",), ("-tls1_2", "-no_ticket")):
        sess.unlink(missing_ok=True)
        assert "New," in s_client(srv.port, *args, "-sess_out", str(sess))
        assert "Reused," in s_client(srv.port, *args, "-sess_in", str(sess))
        # Time passing is what is tested: the stored session and the ticket expire at the
        # next whole second after their second of issue.
        time.sleep(2.2)
        out = s_client(srv.port, *args, "-sess_in", str(sess))
        assert "New," in out and "Reused," not in out, args


# --- client certificates ----------------------------------------------------------------------


MTLS_VARS = 'return 200 "$ssl_client_verify|$ssl_client_s_dn|$ssl_client_i_dn|$ssl_client_serial|$ssl_client_fingerprint|$ssl_client_v_remain\\n";'


def mtls_server(pki: Pki, mode: str, ca: bool = True) -> str:
    ca_line = f"ssl_client_certificate {pki.path('ca.pem')};" if ca else ""
    return one_server(pki, f"ssl_verify_client {mode}; {ca_line} location = /who {{ {MTLS_VARS} }}")


def client_args(pki: Pki, name: str) -> list[str]:
    return ["--cert", str(pki.path(name + ".pem")), "--key", str(pki.path(name + ".key"))]


def test_mtls_on(gannet, pki):
    srv = gannet.start(conf=mtls_server(pki, "on"))
    r = curl(srv.port, "/who", *client_args(pki, "client"))
    verify, s_dn, i_dn, serial, fp, remain = r.stdout.strip().split("|")
    assert (verify, s_dn, i_dn) == ("SUCCESS", "O=Gannet Test,CN=client", "CN=Gannet Test CA")
    cert = str(pki.path("client.pem"))
    assert serial == openssl("x509", "-in", cert, "-noout", "-serial", cwd=pki.d).strip().split("=")[1]
    want_fp = openssl("x509", "-in", cert, "-noout", "-fingerprint", "-sha1", cwd=pki.d).strip().split("=")[1]
    assert fp == want_fp.replace(":", "").lower()
    assert remain in ("1", "2")
    # No certificate, or one no trusted CA signed: nginx's 400 pages.
    r = curl(srv.port, "/who", "-w", "%{http_code}")
    assert r.stdout.endswith("400") and "No required SSL certificate was sent" in r.stdout
    r = curl(srv.port, "/who", "-w", "%{http_code}", *client_args(pki, "stranger"))
    assert r.stdout.endswith("400") and "The SSL certificate error" in r.stdout
    # nginx's log lines, with OpenSSL's verify error number and text.
    log = srv.error_log()
    assert "client sent no required SSL certificate" in log
    assert "client SSL certificate verify error: (18:self-signed certificate)" in log


def test_verifying_server_refuses_connections_other_servers_accepted(gannet, pki):
    srv = gannet.start(conf=conf(f"""
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name a.test;
        {pair(pki, 'a')}
        ssl_verify_client on;
        ssl_client_certificate {pki.path('ca.pem')};
        location = /who {{ {MTLS_VARS} }}
    }}
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name b.test;
        {pair(pki, 'b')}
        location = /who {{ {MTLS_VARS} }}
    }}"""))
    me = client_args(pki, "client")
    assert curl(srv.port, "/who", *me, host="a.test").stdout.startswith("SUCCESS|")
    # SNI b.test (no client certificate asked), Host a.test: 421, as nginx answers.
    r = curl(srv.port, "/who", "-w", "%{http_code}", "-H", "Host: a.test", *me, host="b.test")
    assert r.stdout.endswith("421"), r.stdout
    # The other way round, b.test verifies nothing and serves.
    r = curl(srv.port, "/who", "-w", "%{http_code}", "-H", "Host: b.test", *me, host="a.test")
    assert r.stdout.endswith("200"), r.stdout


def test_crl_and_trusted_certificate(gannet, pki):
    # The CA is trusted without being named to clients, and the CRL revokes one client.
    srv = gannet.start(conf=one_server(pki, f"""ssl_verify_client optional;
        ssl_trusted_certificate {pki.path('ca.pem')};
        ssl_crl {pki.path('crl.pem')};
        location = /who {{ {MTLS_VARS} }}"""))
    assert curl(srv.port, "/who", *client_args(pki, "client")).stdout.startswith("SUCCESS|O=Gannet Test,CN=client|")
    r = curl(srv.port, "/who", "-w", "%{http_code}", *client_args(pki, "revoked"))
    assert r.stdout.endswith("400") and "The SSL certificate error" in r.stdout
    out = s_client(srv.port)
    assert "No client certificate CA names sent" in out
    srv.stop()
    srv = gannet.start(conf=mtls_server(pki, "optional"))
    assert "Acceptable client certificate CA names\nCN = Gannet Test CA" in s_client(srv.port)
    assert curl(srv.port, "/who", *client_args(pki, "revoked")).stdout.startswith("SUCCESS|")
    err = check_error(gannet, one_server(pki, f"ssl_verify_client on; ssl_client_certificate {pki.path('ca.pem')}; ssl_crl {pki.path('ca.pem')};"))
    assert f'cannot load CRL "{pki.path("ca.pem")}": no PEM CRL in it' in err


def test_client_certificate_for_an_application(gannet, pki):
    srv = gannet.start(conf=one_server(pki, "ssl_verify_client optional_no_ca; location = /pem { return 200 \"$ssl_client_escaped_cert\"; }"))
    escaped = curl(srv.port, "/pem", *client_args(pki, "client")).stdout
    from urllib.parse import unquote
    assert unquote(escaped) == pki.path("client.pem").read_text()
    assert re.fullmatch(r"[A-Za-z0-9%._~-]+", escaped)


def test_mtls_optional_and_optional_no_ca(gannet, pki):
    srv = gannet.start(conf=mtls_server(pki, "optional"))
    assert curl(srv.port, "/who").stdout == "NONE|||||\n"
    assert curl(srv.port, "/who", *client_args(pki, "client")).stdout.startswith("SUCCESS|O=Gannet Test,CN=client|")
    assert "The SSL certificate error" in curl(srv.port, "/who", *client_args(pki, "stranger")).stdout
    srv.stop()
    srv = gannet.start(conf=mtls_server(pki, "optional_no_ca"))
    out = curl(srv.port, "/who", *client_args(pki, "stranger")).stdout
    assert out.startswith("FAILED:") and "|CN=stranger|CN=stranger|" in out
    assert curl(srv.port, "/who", *client_args(pki, "client")).stdout.startswith("SUCCESS|")


# --- OCSP stapling ----------------------------------------------------------------------------


def test_stapling_serves_the_file(gannet, pki):
    openssl("ocsp", "-issuer", "ca.pem", "-cert", "ec.pem", "-no_nonce", "-reqout", "ocsp.req", cwd=pki.d)
    openssl("ocsp", "-index", "index.txt", "-rsigner", "ca.pem", "-rkey", "ca.key", "-CA", "ca.pem",
            "-reqin", "ocsp.req", "-respout", "ocsp.der", "-ndays", "1", cwd=pki.d)
    srv = gannet.start(conf=one_server(pki, f"ssl_stapling on; ssl_stapling_file {pki.path('ocsp.der')};"))
    out = s_client(srv.port, "-status")
    assert "OCSP Response Status: successful" in out and "Cert Status: good" in out, out
    srv.stop()
    srv = gannet.start(conf=one_server(pki))
    assert "OCSP response: no response sent" in s_client(srv.port, "-status")


# --- bad clients ------------------------------------------------------------------------------


def test_plain_http_to_tls_port(gannet, pki):
    srv = gannet.start(conf=one_server(pki, http="http2 on;"))
    reply = srv.raw(b"GET /v HTTP/1.1\r\nHost: localhost\r\n\r\nGET /v HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"<title>400 The plain HTTP request was sent to HTTPS port</title>" in reply
    # One answer, then the connection is closed, the second request unanswered.
    assert b"Connection: close" in reply and reply.count(b"HTTP/1.1") == 1
    assert " 400 " in srv.access_log()
    assert "client sent plain HTTP request to HTTPS port" in srv.error_log()
    # Bytes that are neither TLS nor a request: the parser's own 400, as nginx.
    reply = srv.raw(b"\x01\x02 junk\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"HTTPS port" not in reply
    # The HTTP/2 preface in clear text is no way around TLS, even with http2 on.
    reply = srv.raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 ") and b"\x00\x00" not in reply[:9]


def test_error_page_497(gannet, pki):
    """`error_page 497` at server level redirects plain HTTP (the admin's idiom); in a
    location it is never reached, since nginx refuses before choosing a location."""
    names = {"redirect": "error_page 497 =301 https://$host:$server_port$request_uri;",
             "page": "error_page 497 /page.html;",
             "url": "error_page 497 https://example.test$request_uri;",
             "inloc": "location /in/ { error_page 497 =301 https://in.test/; }"}
    servers = "".join(f"""
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name {name}.test;
        root {{root}};
        {pair(pki, 'ec')}
        {line}
    }}""" for name, line in names.items())
    srv = gannet.start(conf=conf(servers), files={"page.html": "the page\n"})

    def plain(host: str, method: str = "GET", path: str = "/in/a?b=1", extra: bytes = b"") -> bytes:
        return srv.raw(f"{method} {path} HTTP/1.1\r\nHost: {host}:{srv.port}\r\n".encode() + extra + b"\r\n")

    reply = plain("redirect.test")
    assert reply.startswith(b"HTTP/1.1 301 Moved Permanently\r\n"), reply
    assert f"Location: https://redirect.test:{srv.port}/in/a?b=1\r\n".encode() in reply
    assert b"Connection: close" in reply
    # POST with a body: the same redirect, and the body is not taken for another request.
    reply = srv.raw("POST /form HTTP/1.1\r\nHost: redirect.test\r\nContent-Length: 5\r\n\r\nhello".encode())
    assert reply.startswith(b"HTTP/1.1 301 ") and reply.count(b"HTTP/1.1") == 1
    # A page without `=code` is answered 400, as nginx does for its own codes.
    reply = plain("page.test")
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n") and reply.endswith(b"\r\n\r\nthe page\n")
    reply = plain("page.test", "HEAD")
    assert reply.startswith(b"HTTP/1.1 400 ") and reply.endswith(b"\r\n\r\n")
    # A full URL without `=30x` is a 302.
    reply = plain("url.test")
    assert reply.startswith(b"HTTP/1.1 302 Moved Temporarily\r\n")
    assert b"Location: https://example.test/in/a?b=1\r\n" in reply and b"<title>302 Found</title>" in reply
    reply = plain("inloc.test")
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"HTTPS port" in reply
    # TLS clients are served as usual.
    assert curl(srv.port, "/page.html", host="page.test").stdout == "the page\n"
    assert "301" in srv.access_log() and "302" in srv.access_log()


def test_error_page_495_496(gannet, pki):
    """A missing (496) or failed (495) client certificate goes through `error_page` like
    any status, over HTTP/1.1 and HTTP/2, and `$ssl_client_verify` says why."""
    srv = gannet.start(conf=one_server(pki, f"""
        ssl_verify_client on;
        ssl_client_certificate {pki.path('ca.pem')};
        error_page 495 /bad-cert;
        error_page 496 =403 /no-cert;
        location = /who {{ return 200 "ok $ssl_client_verify\\n"; }}
        location = /bad-cert {{ return 200 "bad $ssl_client_verify\\n"; }}
        location = /no-cert {{ return 200 "none $ssl_client_verify\\n"; }}""", http="http2 on;"))
    for proto in ("--http1.1", "--http2"):
        version = "2" if proto == "--http2" else "1.1"
        r = curl(srv.port, "/who", proto, "-w", "|%{http_code}|%{http_version}")
        assert r.stdout == f"none NONE\n|403|{version}", r.stdout
        r = curl(srv.port, "/who", proto, "-w", "|%{http_code}", *client_args(pki, "stranger"))
        assert r.stdout == "bad FAILED:self-signed certificate\n|400", r.stdout
        r = curl(srv.port, "/who", proto, "-w", "|%{http_code}", *client_args(pki, "client"))
        assert r.stdout == "ok SUCCESS\n|200", r.stdout
    # The keep-alive connection is closed after a refusal (HTTP/1.1).
    r = curl(srv.port, "/who", "--http1.1", "-v", *client_args(pki, "stranger"))
    assert "Connection: close" in r.stderr
    srv.stop()
    # optional_no_ca lets an unknown issuer through, but not a certificate that is bad in
    # another way (nginx's rule): the expired one from the trusted CA is refused.
    srv = gannet.start(conf=mtls_server(pki, "optional_no_ca"))
    assert curl(srv.port, "/who", *client_args(pki, "stranger")).stdout.startswith("FAILED:self-signed certificate|")
    r = curl(srv.port, "/who", "-w", "|%{http_code}", *client_args(pki, "expired"))
    assert r.stdout.endswith("|400") and "The SSL certificate error" in r.stdout
    assert "client SSL certificate verify error: (10:certificate has expired)" in srv.error_log()



REFUSALS = PEER_MAIN + """
http {
    access_log {tmp}/access.log;
    server_tokens off;
    root {root};
    server {
        listen 127.0.0.1:{port} ssl default_server;
        server_name plain.test;
        %(pair)s
        location /in/ { error_page 497 =200 /page.html; }
    }
    server {
        listen 127.0.0.1:{port} ssl;
        server_name redirect.test;
        %(pair)s
        error_page 497 =301 https://$host:$server_port$request_uri;
    }
    server {
        listen 127.0.0.1:{port} ssl;
        server_name page.test;
        %(pair)s
        error_page 497 /page.html;
    }
    server {
        listen 127.0.0.1:{port} ssl;
        server_name named.test;
        %(pair)s
        error_page 404 497 @fallback;
        location @fallback { return 200 "fallback $request_method $uri $args\\n"; }
    }
    server {
        listen 127.0.0.1:{port} ssl;
        server_name url.test;
        %(pair)s
        error_page 497 https://example.test$request_uri;
    }
    server {
        listen 127.0.0.1:{mport} ssl;
        server_name pages.test;
        %(pair)s
        ssl_verify_client on;
        ssl_client_certificate %(ca)s;
        error_page 495 /bad-cert;
        error_page 496 =403 /no-cert;
        location / { return 200 "ok $ssl_client_verify\\n"; }
        location = /bad-cert { return 200 "bad $ssl_client_verify\\n"; }
        location = /no-cert { return 200 "none $ssl_client_verify\\n"; }
    }
    server {
        listen 127.0.0.1:{mport} ssl;
        server_name on.test;
        %(pair)s
        ssl_verify_client on;
        ssl_client_certificate %(ca)s;
        location / { return 200 "ok $ssl_client_verify\\n"; }
    }
    server {
        listen 127.0.0.1:{mport} ssl;
        server_name noca.test;
        %(pair)s
        ssl_verify_client optional_no_ca;
        ssl_client_certificate %(ca)s;
        location / { return 200 "ok $ssl_client_verify\\n"; }
    }
}
"""


def normalised(a, port: int) -> tuple:
    body = a.body.replace(b"<center>gannet</center>", b"<center>nginx</center>")
    location = a.headers.get("location", "").replace(f":{port}/", ":PORT/")
    return a.status, a.headers.get("connection"), a.headers.get("content-type"), location, body


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_refusals_match_nginx(gannet, pki, tmp_path):
    """Plain HTTP to a TLS port (497) and client certificates missing (496) or failed (495),
    with and without `error_page`: the same answers from nginx and gannet."""
    from nginx_peer import NginxPeer, exchange

    text = REFUSALS % {"pair": pair(pki, "ec"), "ca": pki.path("ca.pem")}
    root = tmp_path / "www"
    root.mkdir()
    (root / "page.html").write_text("the page\n")
    nginx_port, nginx_mport, gannet_mport = free_port(), free_port(), free_port()
    nginx = NginxPeer(text.replace("{mport}", str(nginx_mport)), nginx_port, root, tmp_path / "nginx")
    try:
        srv = gannet.start(conf=text.replace("{mport}", str(gannet_mport)).replace("{root}", str(root)))
        plain = []
        for host in ("plain.test", "redirect.test", "page.test", "named.test", "url.test", "nowhere.test"):
            for method in ("GET", "HEAD", "POST"):
                body = b"Content-Length: 3\r\n\r\nabc" if method == "POST" else b"\r\n"
                plain.append(f"{method} /in/x?y=1 HTTP/1.1\r\nHost: {host}\r\n".encode() + body)
        plain.append(b"GET /in/x HTTP/1.0\r\n\r\n")
        plain.append(b"\x01\x02junk\r\n\r\n")
        diffs, statuses = [], set()
        for req in plain:
            want = normalised(exchange(nginx_port, req), nginx_port)
            got = normalised(exchange(srv.port, req), srv.port)
            statuses.add(want[0])
            if want != got:
                diffs.append((req, want, got))
        for host in ("pages.test", "on.test", "noca.test"):
            for who in (None, "client", "stranger", "expired"):
                args = ["-w", "|%{http_code}"] + (client_args(pki, who) if who else [])
                want = curl(nginx_mport, "/x", *args, host=host).stdout.replace("<center>nginx</center>", "")
                got = curl(gannet_mport, "/x", *args, host=host).stdout.replace("<center>gannet</center>", "")
                statuses.add(int(want[-3:]))
                if want != got:
                    diffs.append((host, who, want, got))
    finally:
        nginx.stop()
    assert not diffs, "\n".join(map(repr, diffs))
    assert statuses == {200, 301, 302, 400, 403}, "every kind of answer was compared"

def test_bad_handshakes_never_hurt_other_clients(gannet, pki):
    srv = gannet.start(conf=one_server(pki, http="client_header_timeout 2s;"), files={"index.html": "fine\n"})
    # A client that connects and says nothing, one that stops half-way through a
    # ClientHello: both hold a handshake open while others are served.
    silent = socket.create_connection(("127.0.0.1", srv.port))
    partial = socket.create_connection(("127.0.0.1", srv.port))
    partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")
    garbage = [b"\x00" * 64, b"\x16\x03\x01\x00\x05hello", b"\x16\x03\x03\xff\xff" + b"A" * 512,
               b"\x80\x80\x01\x03\x01", bytes(range(256)) * 8]

    def send_garbage(data: bytes) -> None:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            try:
                s.sendall(data)
                while s.recv(4096):
                    pass
            except OSError:
                pass

    threads = [threading.Thread(target=send_garbage, args=(g,)) for g in garbage * 4]
    for t in threads:
        t.start()
    for _ in range(5):
        c = https(srv.port)
        c.request("GET", "/")
        assert c.getresponse().read() == b"fine\n"
        c.close()
    for t in threads:
        t.join(10)
    # The stalled handshakes are closed by the deadline, not left open.
    for s in (silent, partial):
        s.settimeout(10)
        start = time.monotonic()
        try:
            while s.recv(4096):
                pass
        except ConnectionResetError:
            pass
        assert time.monotonic() - start < 9
        s.close()
    assert srv.proc.poll() is None
    assert "while SSL handshaking" in srv.error_log()
    c = https(srv.port)
    c.request("GET", "/")
    assert c.getresponse().read() == b"fine\n"


# --- configuration errors ---------------------------------------------------------------------


def check_error(gannet, text: str) -> str:
    r = gannet.check(conf=text)
    assert r.returncode != 0, r.stderr
    return r.stderr


def test_expired_or_future_certificate_is_served_with_a_warning(gannet, pki):
    """A certificate out of its validity period does not stop the server (nginx serves it:
    a restart on the day a renewal failed must not take every site down); the error log
    and `gannet -t` say so."""
    certs = pair(pki, "expired")
    other = f"server {{ listen 127.0.0.1:{{port}} ssl; server_name future.test; {pair(pki, 'future')} }}"
    r = gannet.check(conf=one_server(pki, certs=certs, http=other))
    assert r.returncode == 0, r.stderr
    assert '[notice] ' in r.stderr and f'certificate "{pki.path("expired.pem")}" has expired (not valid after' in r.stderr
    assert f'certificate "{pki.path("future.pem")}" is not valid yet (not before' in r.stderr
    srv = gannet.start(conf=one_server(pki, certs=certs, http=other))
    assert subject_cn(s_client(srv.port, "-servername", "localhost")) == "expired.test"
    assert curl(srv.port, "/v", "-w", "|%{http_code}").stdout.endswith("|200")
    assert subject_cn(s_client(srv.port, "-servername", "future.test")) == "future.test"
    log = srv.error_log()
    assert '[warn]' in log and f'certificate "{pki.path("expired.pem")}" has expired' in log, log
    assert f'certificate "{pki.path("future.pem")}" is not valid yet' in log, log
    if NGINX:
        # nginx takes the same certificate without a word.
        n, _ = check_both(gannet.tmp, f"server {{ listen 127.0.0.1:1 ssl; {certs} }}")
        assert n.returncode == 0, n.stderr


def test_certificate_errors_name_the_file(gannet, pki):
    mismatched = f"ssl_certificate {pki.path('a.pem')}; ssl_certificate_key {pki.path('b.key')};"
    err = check_error(gannet, one_server(pki, certs=mismatched))
    assert f'"{pki.path("b.key")}" does not match certificate "{pki.path("a.pem")}"' in err
    missing = f"ssl_certificate {pki.path('nope.pem')}; ssl_certificate_key {pki.path('a.key')};"
    err = check_error(gannet, one_server(pki, certs=missing))
    assert f'cannot load certificate "{pki.path("nope.pem")}"' in err and "No such file" in err
    not_pem = f"ssl_certificate {pki.path('a.key')}; ssl_certificate_key {pki.path('a.key')};"
    err = check_error(gannet, one_server(pki, certs=not_pem))
    assert f'cannot load certificate "{pki.path("a.key")}": no PEM certificate' in err
    no_key = f"ssl_certificate {pki.path('a.pem')}; ssl_certificate_key {pki.path('a.pem')};"
    err = check_error(gannet, one_server(pki, certs=no_key))
    assert f'cannot load certificate key "{pki.path("a.pem")}"' in err
    # The line is named too.
    assert re.search(r"check\.conf:\d+: ", err)


def test_ssl_password_file(gannet, pki):
    """An encrypted PKCS#8 key (as `openssl pkcs8 -topk8 -v2 aes-256-cbc` writes it) is
    opened with the passphrases of `ssl_password_file`, tried line by line."""
    openssl("pkcs8", "-topk8", "-v2", "aes-256-cbc", "-in", "ec.key", "-out", "ec-enc.key",
            "-passout", "pass:right one", cwd=pki.d)
    openssl("pkcs8", "-topk8", "-v2", "aes-128-cbc", "-v2prf", "hmacWithSHA1", "-in", "rsa.key",
            "-out", "rsa-enc.key", "-passout", "pass:right one", cwd=pki.d)
    assert pki.path("ec-enc.key").read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    pki.path("pw.txt").write_bytes(b"wrong\r\n\nright one\r\n")
    pki.path("wrong.txt").write_text("wrong\nalso wrong\n")
    certs = (f"ssl_certificate {pki.path('ec.pem')}; ssl_certificate_key {pki.path('ec-enc.key')};"
             f"ssl_certificate {pki.path('rsa.pem')}; ssl_certificate_key {pki.path('rsa-enc.key')};")
    srv = gannet.start(conf=one_server(pki, certs=certs, http=f"ssl_password_file {pki.path('pw.txt')};"))
    for sigalgs, cn in (("ECDSA+SHA256", "ec.test"), ("RSA-PSS+SHA256:RSA+SHA256", "rsa.test")):
        out = s_client(srv.port, "-tls1_2", "-sigalgs", sigalgs)
        assert subject_cn(out) == cn and "HTTP/1.1 200 OK" in out, out
    srv.stop()
    # A wrong or missing passphrase is an error naming the key file at its directive's line.
    text = one_server(pki, certs=certs, body=f"ssl_password_file {pki.path('wrong.txt')};")
    err = check_error(gannet, text)
    line = next(i for i, l in enumerate(gannet.render(text)[0].splitlines(), 1) if "ec-enc.key" in l)
    assert f'check.conf:{line}: cannot load certificate key "{pki.path("ec-enc.key")}": none of the passphrases in "{pki.path("wrong.txt")}" decrypts it' in err, err
    err = check_error(gannet, one_server(pki, certs=certs))
    assert f'"{pki.path("ec-enc.key")}": it is encrypted and no "ssl_password_file" is set' in err
    err = check_error(gannet, one_server(pki, certs=certs, body=f"ssl_password_file {pki.path('nope.txt')};"))
    assert f'cannot open password file "{pki.path("nope.txt")}"' in err
    # The legacy PEM encryption: an error that says how to convert the key.
    openssl("ec", "-in", "a.key", "-aes256", "-passout", "pass:right one", "-out", "a-legacy.key", cwd=pki.d)
    assert "Proc-Type: 4,ENCRYPTED" in pki.path("a-legacy.key").read_text()
    legacy = f"ssl_certificate {pki.path('a.pem')}; ssl_certificate_key {pki.path('a-legacy.key')};"
    err = check_error(gannet, one_server(pki, certs=legacy, http=f"ssl_password_file {pki.path('pw.txt')};"))
    assert "legacy PEM form" in err and "openssl pkcs8 -topk8 -v2 aes-256-cbc" in err

def test_listen_ssl_without_certificate(gannet, pki):
    err = check_error(gannet, one_server(pki, certs=""))
    assert 'no "ssl_certificate" is defined for the "listen ... ssl" directive' in err
    err = check_error(gannet, one_server(pki, "ssl_verify_client on;"))
    assert "no ssl_client_certificate or ssl_trusted_certificate for ssl_verify_client" in err


def test_cipher_and_protocol_notices(gannet, pki):
    r = gannet.check(conf=one_server(pki, http="ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3; ssl_prefer_server_ciphers on; ssl_ciphers HIGH:DHE-RSA-AES128-GCM-SHA256:!aNULL;"))
    assert r.returncode == 0, r.stderr
    assert '"TLSv1" in "ssl_protocols" is not offered' in r.stderr
    assert 'cipher "DHE-RSA-AES128-GCM-SHA256" in "ssl_ciphers" is not one gannet offers' in r.stderr
    err = check_error(gannet, one_server(pki, http="ssl_ciphers DHE-RSA-AES128-GCM-SHA256:RC4;"))
    assert '"ssl_ciphers" selects no cipher gannet offers' in err
    err = check_error(gannet, one_server(pki, http="ssl_protocols TLSv1 TLSv1.1;"))
    assert '"ssl_protocols" names no protocol gannet offers' in err


# --- the rest of the pipeline over TLS --------------------------------------------------------


@pytest.fixture
def fcgi():
    import rawapps

    yield from rawapps.made(rawapps.FastCgiApp)


def test_fastcgi_body_and_streamed_answer_over_tls(gannet, pki, fcgi):
    import rawapps

    piece = bytes(range(256)) * 256  # 64 KB, sent as separate records so the answer streams

    def behave(conn):
        conn.sendall(rawapps.stdout(b"Content-Type: application/octet-stream\r\n\r\n"))
        for _ in range(4):
            conn.sendall(rawapps.stdout(piece))
        conn.sendall(rawapps.end_request())

    app = fcgi(behave)
    srv = gannet.start(conf=one_server(pki, f"""
        location ~ \\.php$ {{
            include {{repo}}/conf/fastcgi.conf;
            fastcgi_pass 127.0.0.1:{app.port};
        }}"""), files={"x.php": "unused"})
    c = https(srv.port)
    for _ in range(2):  # and the connection stays usable after a request body and a stream
        c.request("POST", "/x.php", body=b"b" * 100_000, headers={"Content-Type": "text/plain"})
        r = c.getresponse()
        assert r.status == 200 and r.read() == piece * 4


def test_gzip_while_sending_over_tls(gannet, pki):
    import gzip

    text = b"".join(b"line %d of a compressible text file\n" % i for i in range(40000))
    srv = gannet.start(conf=one_server(pki, http="gzip on; gzip_types text/plain;"), files={"big.txt": text})
    c = https(srv.port)
    c.request("GET", "/big.txt", headers={"Accept-Encoding": "gzip"})
    r = c.getresponse()
    assert r.getheader("content-encoding") == "gzip"
    assert gzip.decompress(r.read()) == text


def test_graceful_stop_closes_idle_tls_connections(gannet, pki):
    srv = gannet.start(conf=one_server(pki))
    c = https(srv.port)
    c.request("GET", "/v")
    assert c.getresponse().read().startswith(b"https|")
    srv.proc.send_signal(signal.SIGQUIT)
    assert srv.proc.wait(10) == 0
    c.close()


def test_certbot_style_config_loads(gannet, pki):
    """What certbot's options-ssl-nginx.conf and a typical site add: loads, with notices
    for what rustls does not have."""
    r = gannet.check(conf=conf(f"""
    server {{
        listen 127.0.0.1:{{port}} ssl http2;
        listen [::1]:{{port}} ssl http2;
        server_name example.org;
        {pair(pki, 'ec')}
        add_header Strict-Transport-Security "max-age=31536000" always;
        ssl_stapling on;
        ssl_stapling_verify on;
    }}""", http="""
    ssl_session_cache shared:le_nginx_SSL:10m;
    ssl_session_timeout 1440m;
    ssl_session_tickets off;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_prefer_server_ciphers off;
    ssl_ciphers "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384";
    ssl_dhparam /etc/letsencrypt/ssl-dhparams.pem;
    """))
    assert r.returncode == 0, r.stderr
    assert '"ssl_dhparam" has no effect' in r.stderr
    assert 'cipher "DHE-RSA-AES128-GCM-SHA256" in "ssl_ciphers" is not one gannet offers' in r.stderr
    assert '"ssl_stapling" ignored, issuer certificate not found' in r.stderr
