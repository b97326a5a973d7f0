"""TLS as OpenSSL (and so nginx) takes it where rustls's defaults would not: X.509 v1
certificates (what `openssl req -x509` makes from a config without extensions) on an
upstream with `proxy_ssl_verify off`, as gannet's own client certificate (with an
encrypted key and `proxy_ssl_password_file`) and as a trusted client certificate;
`ssl_reject_handshake`'s unrecognized_name alert; uwsgi over TLS (`uwsgi_pass suwsgi://`
with `uwsgi_ssl_*`); and `add_header ... always` on the 400 for an unparsable request.
Real clients (curl, openssl s_client, Python's ssl module), differential against Debian's
nginx where the answer is observable."""

from __future__ import annotations

import ssl
import struct
import subprocess

import pytest

from conftest import free_port, wait_until
from nginx_peer import NGINX, NginxPeer, exchange
from rawapps import Listener, TlsHttpApp, http_answer, made
from test_tls import Pki, conf, curl, openssl, pair, s_client

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="needs the openssl command-line tool",
)

V1_CNF = "[req]\ndistinguished_name = dn\n[dn]\n"


def v1_cert(p: Pki, name: str, password: str | None = None) -> None:
    """A self-signed X.509 v1 certificate `name.pem` and its RSA key `name.key` (encrypted
    PKCS#8 with `password` if given), as the nginx test suite makes them."""
    (p.d / "v1.cnf").write_text(V1_CNF)
    openssl("req", "-x509", "-new", "-config", "v1.cnf", "-subj", f"/CN={name}", "-newkey", "rsa:2048",
            "-nodes", "-keyout", f"{name}.plain.key", "-out", f"{name}.pem", "-days", "2", cwd=p.d)
    assert "Version: 1 (0x0)" in openssl("x509", "-in", f"{name}.pem", "-noout", "-text", cwd=p.d)
    if password is None:
        (p.d / f"{name}.key").write_bytes((p.d / f"{name}.plain.key").read_bytes())
    else:
        openssl("pkcs8", "-topk8", "-v2", "aes-256-cbc", "-in", f"{name}.plain.key", "-out", f"{name}.key",
                "-passout", f"pass:{password}", cwd=p.d)


def as_root(text: str) -> str:
    """The same config for nginx, whose workers must read the test's private files."""
    return "user root;\n" + text


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.issue("ec", "ec.test", sans=("ec.test", "localhost"))
    v1_cert(p, "v1server")
    v1_cert(p, "v1client", password="secret")
    (p.d / "password").write_text("wrong\nsecret\n")
    v1_cert(p, "v1other")
    # A v1 CRL (no crlnumber, as `openssl ca -gencrl` writes without one) revoking a client
    # and a server certificate.
    p.issue("client", "client")
    p.issue("revoked", "revoked")
    p.issue("revokedsrv", "localhost", sans=("localhost",))
    for name in ("revoked", "revokedsrv"):
        openssl("ca", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-revoke", f"{name}.pem", cwd=p.d)
    v1_cnf = (p.d / "ca.cnf").read_text().replace(f"crlnumber = {p.d}/crlnumber\n", "")
    (p.d / "ca-v1.cnf").write_text(v1_cnf)
    openssl("ca", "-config", "ca-v1.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-gencrl", "-crldays", "2",
            "-out", "crl1.pem", cwd=p.d)
    assert "Version 1 (0x0)" in openssl("crl", "-in", "crl1.pem", "-noout", "-text", cwd=p.d)
    return p


@pytest.fixture
def app():
    yield from made(TlsHttpApp)


def echo(conn, head, body):
    conn.sendall(http_answer(head + b"\r\n\r\n" + body))
    return "again"


def v1_server_ctx(pki, client_ca: str | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.path("v1server.pem"), pki.path("v1server.key"))
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(pki.path(client_ca))
    return ctx


def test_v1_upstream_certificate_is_taken_without_verification(gannet, app, pki):
    a = app(echo, v1_server_ctx(pki))
    srv = gannet.start(server=f"""
        location / {{ proxy_pass https://127.0.0.1:{a.port}; }}
        location /tls12/ {{ proxy_pass https://127.0.0.1:{a.port}; proxy_ssl_protocols TLSv1.2; }}
    """)
    status, _, body = srv.get("/x")
    assert status == 200 and body.startswith(b"GET /x HTTP/1.0\r\n")
    # TLS 1.2's signed key exchange is checked against the v1 certificate's key too.
    status, _, body = srv.get("/tls12/y")
    assert status == 200 and body.startswith(b"GET /tls12/y ")
    assert [h["version"] for h in a.handshakes] == ["TLSv1.3", "TLSv1.2"]


def test_v1_client_certificate_with_an_encrypted_key(gannet, app, pki):
    a = app(echo, v1_server_ctx(pki, client_ca="v1client.pem"))
    cert, key, pw = pki.path("v1client.pem"), pki.path("v1client.key"), pki.path("password")
    srv = gannet.start(server=f"""
        location /with/ {{
            proxy_pass https://127.0.0.1:{a.port};
            proxy_ssl_certificate {cert}; proxy_ssl_certificate_key {key}; proxy_ssl_password_file {pw};
        }}
        location /without/ {{ proxy_pass https://127.0.0.1:{a.port}; }}
    """)
    status, _, body = srv.get("/with/")
    assert status == 200 and body.startswith(b"GET /with/ ")
    assert a.handshakes[-1]["subject"]["commonName"] == "v1client"
    assert srv.get("/without/")[0] == 502


def test_client_certificate_named_by_variables(gannet, app, pki):
    ctx = v1_server_ctx(pki, client_ca="v1client.pem")
    ctx.verify_mode = ssl.CERT_OPTIONAL
    a = app(echo, ctx)
    srv = gannet.start(server=f"""
        location / {{
            proxy_pass https://127.0.0.1:{a.port};
            proxy_ssl_certificate {pki.d}/$arg_c.pem; proxy_ssl_certificate_key {pki.d}/$arg_c.key;
            proxy_ssl_password_file {pki.path('password')};
        }}
        location /none/ {{
            proxy_pass https://127.0.0.1:{a.port};
            proxy_ssl_certificate $arg_c; proxy_ssl_certificate_key $arg_c;
        }}
    """)
    assert srv.get("/?c=v1client")[0] == 200
    assert a.handshakes[-1]["subject"] == {"commonName": "v1client"}
    # An empty value: no certificate.
    assert srv.get("/none/")[0] == 200
    assert a.handshakes[-1]["subject"] == {}
    assert srv.get("/?c=missing")[0] == 502
    log = wait_until(lambda: "missing.pem" in srv.error_log() and srv.error_log())
    assert f'cannot load certificate "{pki.d}/missing.pem"' in log
    assert len(a.handshakes) == 2


def test_a_v1_client_key_that_is_not_the_certificates_is_refused(gannet, pki):
    r = gannet.check(server=f"""
        location / {{
            proxy_pass https://127.0.0.1:1;
            proxy_ssl_certificate {pki.path('v1client.pem')};
            proxy_ssl_certificate_key {pki.path('v1other.key')};
        }}
    """)
    assert r.returncode != 0
    assert "does not match certificate" in r.stderr and "check.conf:" in r.stderr


TRUSTED_V1 = """
    server {
        listen 127.0.0.1:{port} ssl;
        server_name localhost;
        %(pair)s
        ssl_verify_client optional_no_ca;
        ssl_trusted_certificate %(trusted)s;
        location / { return 200 "$ssl_client_verify $ssl_client_s_dn\\n"; }
    }
"""


def test_a_trusted_v1_client_certificate_is_verified_as_nginx_does(gannet, pki, tmp_path):
    text = TRUSTED_V1 % {"pair": pair(pki, "ec"), "trusted": pki.path("v1client.pem")}
    key = pki.path("v1client.plain.key")
    args = ["--cert", str(pki.path("v1client.pem")), "--key", str(key)]
    other = ["--cert", str(pki.path("v1other.pem")), "--key", str(pki.path("v1other.key"))]
    srv = gannet.start(conf=conf(text))
    got = (curl(srv.port, "/", *args).stdout, curl(srv.port, "/", *other).stdout)
    assert got[0] == "SUCCESS CN=v1client\n"
    assert got[1] == "FAILED:self-signed certificate CN=v1other\n"
    if NGINX is None:
        return
    nginx = NginxPeer(as_root(conf(text)), free_port(), tmp_path, tmp_path / "nginx")
    try:
        assert (curl(nginx.port, "/", *args).stdout, curl(nginx.port, "/", *other).stdout) == got
    finally:
        nginx.stop()


REJECT = """
    server {
        listen 127.0.0.1:{port} ssl default_server;
        ssl_reject_handshake on;
    }
    server {
        listen 127.0.0.1:{port} ssl;
        server_name a.test;
        %(pair)s
        location / { return 200 "in\\n"; }
    }
"""


def test_reject_handshake_answers_unrecognized_name_as_nginx(gannet, pki, tmp_path):
    text = conf(REJECT % {"pair": pair(pki, "ec")})
    srv = gannet.start(conf=text)
    ports = [srv.port]
    nginx = None
    if NGINX is not None:
        nginx = NginxPeer(as_root(text),
                          free_port(), tmp_path, tmp_path / "nginx")
        ports.append(nginx.port)
    try:
        for port in ports:
            for args in (["-servername", "nobody.test"], ["-noservername"]):
                out = s_client(port, *args)
                assert "unrecognized name" in out, out
            assert "in\n" in s_client(port, "-servername", "a.test", request=b"GET / HTTP/1.0\r\n\r\n")
    finally:
        if nginx:
            nginx.stop()


class TlsUwsgiApp(Listener):
    """A uWSGI application over TLS: reads one uwsgi packet (4-byte header, then the
    variables) and answers with the SNI name the client sent and the request's URI."""

    def __init__(self, ctx: ssl.SSLContext):
        self.ctx = ctx
        self.snis: list[str | None] = []
        self.reused: list[bool] = []
        ctx.sni_callback = lambda _sock, name, _ctx: self.snis.append(name)
        super().__init__()

    def serve(self, conn):
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            return
        self.reused.append(tls.session_reused)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack("<H", data[1:3])[0]:
            chunk = tls.recv(65536)
            if not chunk:
                return
            data += chunk
        size = struct.unpack("<H", data[1:3])[0]
        params, i = {}, 4
        while i < 4 + size:
            (kl,) = struct.unpack("<H", data[i:i + 2])
            key = data[i + 2:i + 2 + kl].decode()
            i += 2 + kl
            (vl,) = struct.unpack("<H", data[i:i + 2])
            params[key] = data[i + 2:i + 2 + vl].decode()
            i += 2 + vl
        body = f"sni={self.snis[-1] if self.snis else None} uri={params.get('REQUEST_URI')}\n".encode()
        tls.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + body)
        tls.close()


@pytest.fixture
def uwsgi_app(pki):
    apps = []

    def make():
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pki.path("ec.pem"), pki.path("ec.key"))
        apps.append(TlsUwsgiApp(ctx))
        return apps[-1]

    yield make
    for a in apps:
        a.close()


def test_uwsgi_over_tls_with_its_name_and_session_reuse(gannet, uwsgi_app, pki):
    a = uwsgi_app()
    srv = gannet.start(
        http=f"upstream apps {{ server 127.0.0.1:{a.port}; }} uwsgi_param REQUEST_URI $request_uri;",
        server=f"""
        location /addr/ {{ uwsgi_pass suwsgi://127.0.0.1:{a.port}; uwsgi_ssl_session_reuse off; }}
        location /named/ {{
            uwsgi_pass suwsgi://127.0.0.1:{a.port};
            uwsgi_ssl_server_name on; uwsgi_ssl_name app.test;
        }}
        location /group/ {{ uwsgi_pass suwsgi://apps; uwsgi_ssl_server_name on; }}
        location /verified/ {{
            uwsgi_pass suwsgi://apps; uwsgi_ssl_name localhost;
            uwsgi_ssl_verify on; uwsgi_ssl_trusted_certificate {pki.path('ca.pem')};
        }}
        location /wrong/ {{
            uwsgi_pass suwsgi://apps; uwsgi_ssl_name other.test;
            uwsgi_ssl_verify on; uwsgi_ssl_trusted_certificate {pki.path('ca.pem')};
        }}
        location /vars/ {{ set $b 127.0.0.1:{a.port}; uwsgi_pass suwsgi://$b; }}
    """)
    status, _, body = srv.get("/addr/1")
    assert (status, body) == (200, b"sni=None uri=/addr/1\n")
    assert srv.get("/named/2")[::2] == (200, b"sni=app.test uri=/named/2\n")
    # The default name is the pass's host: the group's name.
    assert srv.get("/group/3")[::2] == (200, b"sni=apps uri=/group/3\n")
    assert srv.get("/verified/4")[::2] == (200, b"sni=None uri=/verified/4\n")
    assert srv.get("/wrong/5")[0] == 502
    log = wait_until(lambda: "does not match" in srv.error_log() and srv.error_log())
    assert 'upstream SSL certificate does not match "other.test"' in log
    assert srv.get("/vars/6")[::2] == (200, b"sni=None uri=/vars/6\n")
    # Sessions are reused by default (not with uwsgi_ssl_session_reuse off).
    srv.get("/vars/7")
    assert a.reused[-1] is True
    srv.get("/addr/8")
    assert a.reused[-1] is False


def test_uwsgi_ssl_verify_needs_a_trusted_certificate(gannet):
    r = gannet.check(server="location / { uwsgi_pass suwsgi://127.0.0.1:1; uwsgi_ssl_verify on; }")
    assert r.returncode != 0
    assert "no uwsgi_ssl_trusted_certificate for uwsgi_ssl_verify" in r.stderr


ADD_HEADER = """
    server {
        listen 127.0.0.1:{port};
        server_name localhost;
        add_header X-Always yes always;
        add_header X-Not no;
        location / { return 200 "ok\\n"; }
    }
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_unparsable_request_gets_add_header_always_as_in_nginx(gannet, tmp_path):
    text = conf(ADD_HEADER)
    srv = gannet.start(conf=text)
    nginx = NginxPeer(as_root(text),
                      free_port(), tmp_path, tmp_path / "nginx")
    try:
        for port in (srv.port, nginx.port):
            a = exchange(port, b"\x01\x02 junk HTTP/1.0\r\n\r\n")
            assert a.status == 400
            assert a.headers.get("x-always") == "yes" and "x-not" not in a.headers
    finally:
        nginx.stop()


# A TLS 1.2 client that asks to renegotiate in the middle of its request (Perl's
# IO::Socket::SSL over OpenSSL, the one client at hand that can): it prints how many bytes
# came back, or HANG if the server neither answered nor closed.
RENEGOTIATE = r"""
use IO::Socket::SSL; use Net::SSLeay;
my $s = IO::Socket::SSL->new(PeerAddr => "127.0.0.1:$ARGV[0]", SSL_verify_mode => 0, Timeout => 5)
    or die "connect: $SSL_ERROR";
$s->print("GET / HTTP/1.0\r\n");
my $ssl = $s->_get_ssl_object();
Net::SSLeay::renegotiate($ssl) or die "renegotiate";
$s->print("Host: localhost\r\n\r\n");
local $/;
my $got = $s->getline();
print "GOT:", length($got // ''), "\n";
"""

RENEG_CONF = """
    server {
        listen 127.0.0.1:{port} ssl;
        server_name localhost;
        ssl_protocols TLSv1.2;
        %(pair)s
        location / { return 200 "in\\n"; }
    }
"""


def renegotiate(port: int) -> str:
    try:
        r = subprocess.run(["perl", "-e", RENEGOTIATE, str(port)], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return "HANG"
    return r.stdout.strip() or r.stderr.strip()


@pytest.mark.skipif(subprocess.run(["perl", "-MIO::Socket::SSL", "-e", "1"], capture_output=True).returncode != 0,
                    reason="needs Perl's IO::Socket::SSL (scripts/test-all.sh installs it)")
def test_renegotiation_closes_the_connection_as_nginx(gannet, pki, tmp_path):
    text = conf(RENEG_CONF % {"pair": pair(pki, "ec")})
    srv = gannet.start(conf=text)
    assert renegotiate(srv.port) == "GOT:0"
    # The connection was closed, not the server: the next client is served.
    assert curl(srv.port, "/").stdout == "in\n"
    if NGINX is not None:
        nginx = NginxPeer(as_root(text), free_port(), tmp_path, tmp_path / "nginx")
        try:
            assert renegotiate(nginx.port) == "GOT:0"
        finally:
            nginx.stop()


CRL_SERVER = """
    server {
        listen 127.0.0.1:{port} ssl;
        server_name localhost;
        %(pair)s
        ssl_verify_client optional;
        ssl_client_certificate %(ca)s;
        ssl_crl %(crl)s;
        server_tokens off;
        location / { return 200 "$ssl_client_verify\\n"; }
    }
"""


def test_a_v1_crl_revokes_client_certificates_as_in_nginx(gannet, pki, tmp_path):
    text = conf(CRL_SERVER % {"pair": pair(pki, "ec"), "ca": pki.path("ca.pem"), "crl": pki.path("crl1.pem")})
    srv = gannet.start(conf=text)

    def verdicts(port):
        return [curl(port, "/", "--cert", str(pki.path(f"{n}.pem")), "--key", str(pki.path(f"{n}.key"))).stdout
                for n in ("client", "revoked")]

    got = verdicts(srv.port)
    assert got[0] == "SUCCESS\n"
    assert "The SSL certificate error" in got[1]
    assert "client SSL certificate verify error: (23:certificate revoked)" in wait_until(
        lambda: "revoked" in srv.error_log() and srv.error_log())
    if NGINX is not None:
        nginx = NginxPeer(as_root(text), free_port(), tmp_path, tmp_path / "nginx")
        try:
            # The pages differ only in the server's name (server_tokens off).
            assert verdicts(nginx.port) == [g.replace("<center>gannet</center>", "<center>nginx</center>") for g in got]
        finally:
            nginx.stop()


def test_a_v1_crl_revokes_upstream_certificates(gannet, app, pki):
    def ctx(name):
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        c.load_cert_chain(pki.path(f"{name}.pem"), pki.path(f"{name}.key"))
        return c

    good, bad = app(echo, ctx("ec")), app(echo, ctx("revokedsrv"))
    verify = f"proxy_ssl_verify on; proxy_ssl_name localhost; proxy_ssl_trusted_certificate {pki.path('ca.pem')};"
    srv = gannet.start(server=f"""
        location /good/ {{ proxy_pass https://127.0.0.1:{good.port}; {verify} proxy_ssl_crl {pki.path('crl1.pem')}; }}
        location /bad/ {{ proxy_pass https://127.0.0.1:{bad.port}; {verify} proxy_ssl_crl {pki.path('crl1.pem')}; }}
    """)
    assert srv.get("/good/")[0] == 200
    assert srv.get("/bad/")[0] == 502
    log = wait_until(lambda: "Revoked" in srv.error_log() and srv.error_log())
    assert "upstream SSL certificate verify error: (Revoked)" in log


CA_EXT_CNF = """
[ ca ]
default_ca = myca
[ myca ]
new_certs_dir = {d}
database = {d}/certindex
default_md = sha256
policy = myca_policy
serial = {d}/certserial
default_days = 1
x509_extensions = myca_extensions
[ myca_policy ]
commonName = supplied
[ myca_extensions ]
basicConstraints = critical,CA:TRUE
[ req ]
distinguished_name = dn
x509_extensions = myca_extensions
[ dn ]
"""


@pytest.fixture(scope="module")
def ca_chain(tmp_path_factory):
    """root -> int -> end, every one of them `CA:TRUE` (as OpenSSL's `openssl ca` makes them
    from one extensions section, and as clients present them to nginx)."""
    d = tmp_path_factory.mktemp("chain")
    (d / "ca.cnf").write_text(CA_EXT_CNF.format(d=d))
    (d / "certindex").write_text("")
    (d / "certserial").write_text("1000\n")
    openssl("req", "-x509", "-new", "-config", "ca.cnf", "-subj", "/CN=root", "-newkey", "rsa:2048", "-nodes",
            "-keyout", "root.key", "-out", "root.pem", cwd=d)
    for name, issuer in (("int", "root"), ("end", "int")):
        openssl("req", "-new", "-config", "ca.cnf", "-subj", f"/CN={name}", "-newkey", "rsa:2048", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
        openssl("ca", "-batch", "-config", "ca.cnf", "-keyfile", f"{issuer}.key", "-cert", f"{issuer}.pem",
                "-subj", f"/CN={name}", "-in", f"{name}.csr", "-out", f"{name}.pem", cwd=d)
    (d / "root-int.pem").write_text((d / "root.pem").read_text() + (d / "int.pem").read_text())
    return d


DEPTHS = """
    server {
        listen 127.0.0.1:{port} ssl;
        server_name d0;
        %(pair)s
        ssl_verify_client optional;
        ssl_client_certificate %(cas)s;
        server_tokens off;
        ssl_verify_depth 0;
        location / { return 200 "$ssl_client_verify\\n"; }
    }
    server {
        listen 127.0.0.1:{port} ssl;
        server_name d1;
        %(pair)s
        ssl_verify_client optional;
        ssl_client_certificate %(cas)s;
        server_tokens off;
        location / { return 200 "$ssl_client_verify\\n"; }
    }
    server {
        listen 127.0.0.1:{port} ssl;
        server_name d2;
        %(pair)s
        ssl_verify_client optional;
        ssl_client_certificate %(cas)s;
        server_tokens off;
        ssl_verify_depth 2;
        location / { return 200 "$ssl_client_verify\\n"; }
    }
"""


def test_ca_client_certificates_and_verify_depth_as_in_nginx(gannet, pki, ca_chain, tmp_path):
    text = conf(DEPTHS % {"pair": pair(pki, "ec"), "cas": ca_chain / "root-int.pem"})

    def verdicts(port):
        return {(host, name): curl(port, "/", "--cert", str(ca_chain / f"{name}.pem"),
                                   "--key", str(ca_chain / f"{name}.key"), host=host).stdout
                .strip().replace("<center>gannet</center>", "<center>nginx</center>")
                for host in ("d0", "d1", "d2") for name in ("root", "int", "end")}

    srv = gannet.start(conf=text)
    got = verdicts(srv.port)
    # A CA:TRUE certificate is a client's own as OpenSSL takes it; the depth counts the
    # intermediates up to the self-signed root.
    assert got[("d2", "end")] == "SUCCESS" and got[("d1", "int")] == "SUCCESS" and got[("d0", "root")] == "SUCCESS"
    assert "The SSL certificate error" in got[("d0", "end")]
    assert "client SSL certificate verify error: (22:certificate chain too long)" in srv.error_log()
    if NGINX is not None:
        nginx = NginxPeer(as_root(text), free_port(), tmp_path, tmp_path / "nginx")
        try:
            assert verdicts(nginx.port) == got
        finally:
            nginx.stop()
