"""HTTP/3's TLS as the TCP listener's: the `$ssl_*` variables a request sees over QUIC equal
those the TLS listener of the same server gives the same client settings, and client
certificates (`ssl_verify_client`, `ssl_client_certificate`, `ssl_trusted_certificate`,
`ssl_crl`) are asked for, judged and refused (nginx's 400 pages for 495 and 496) as over
TCP. aioquic is the QUIC client, curl the TCP one; Debian's nginx 1.22 has no HTTP/3, so
the TCP listener is the reference."""

from __future__ import annotations

import subprocess

import pytest

from conftest import free_port, wait_until
from test_tls import Pki, client_args, conf, curl, openssl, pair

h3client = pytest.importorskip("h3client", reason="aioquic is installed by scripts/test-all.sh")
from aioquic.tls import CipherSuite  # noqa: E402  (after the skip)

TLS_VARS = "$ssl_protocol|$ssl_cipher|$ssl_curve|$ssl_server_name|$ssl_session_reused|$ssl_client_verify"
CERT_VARS = ("$ssl_client_verify|$ssl_client_s_dn|$ssl_client_i_dn|$ssl_client_serial|"
             "$ssl_client_fingerprint|$ssl_client_v_end|$ssl_client_escaped_cert")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki3s"))
    p.issue("ec", "ec.test", sans=("ec.test", "localhost"))
    p.issue("b", "b.test", sans=("b.test",))
    p.issue("client", "client", org="Gannet Test")
    p.self_signed("stranger", "stranger")
    p.issue("revoked", "revoked")
    openssl("ca", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-revoke", "revoked.pem", cwd=p.d)
    openssl("ca", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-gencrl", "-crldays", "2",
            "-out", "crl.pem", cwd=p.d)
    return p


def both(pki: Pki, body: str = "", extra_servers: str = "") -> tuple[str, int]:
    """One server on TCP (TLS) and QUIC at the same port; `@PORT@` in `extra_servers` is
    that port."""
    port = free_port()
    extra_servers = extra_servers.replace("@PORT@", str(port))
    return conf(f"""
    server {{
        listen 127.0.0.1:{port} ssl;
        listen 127.0.0.1:{port} quic reuseport;
        server_name localhost;
        {pair(pki, 'ec')}
        location = /tls {{ return 200 "{TLS_VARS}|$ssl_alpn_protocol\\n"; }}
        location = /cert {{ return 200 "{CERT_VARS}\\n"; }}
        {body}
    }}
    {extra_servers}"""), port


def cert(pki: Pki, name: str | None) -> tuple[str, str] | None:
    return (str(pki.path(name + ".pem")), str(pki.path(name + ".key"))) if name else None


def over_tcp(pki: Pki, port: int, path: str, name: str | None = None, *args: str) -> str:
    """The answer over TCP (HTTP/1.1), its status after a `|`."""
    extra = client_args(pki, name) if name else []
    r = curl(port, path, "--http1.1", "-w", "|%{http_code}", *extra, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


def over_quic(pki: Pki, port: int, path: str, name: str | None = None, **kw) -> str:
    """The same over HTTP/3, in the same form (with the newlines curl's text mode reads:
    the error pages have CRLF)."""
    a = h3client.fetch(port, path, sni="localhost", cert=cert(pki, name), **kw)
    return f"{a.body.decode()}|{a.status}".replace("\r\n", "\n")


@pytest.mark.parametrize("suite, name", [
    (CipherSuite.AES_256_GCM_SHA384, "TLS_AES_256_GCM_SHA384"),
    (CipherSuite.CHACHA20_POLY1305_SHA256, "TLS_CHACHA20_POLY1305_SHA256"),
])
def test_ssl_variables_equal_the_tcp_listeners(gannet, pki, suite, name):
    # A group other than the default one, so that the curve said is the one agreed.
    text, port = both(pki, "ssl_ecdh_curve secp384r1;")
    gannet.start(conf=text, port=port)
    tcp = over_tcp(pki, port, "/tls", None, "--tls13-ciphers", name)
    quic = over_quic(pki, port, "/tls", ciphers=[suite])
    # All but ALPN are the same; ALPN is each protocol's own.
    assert quic.replace("|h3\n|", "|http/1.1\n|") == tcp, (quic, tcp)
    assert tcp == f"TLSv1.3|{name}|secp384r1|localhost|.|NONE|http/1.1\n|200"


def test_session_reused_as_over_tcp(gannet, pki):
    text, port = both(pki, "ssl_session_cache shared:S:1m;")
    gannet.start(conf=text, port=port)
    tickets: list = []
    first = h3client.fetch(port, "/tls", sni="localhost", tickets=tickets)
    again = h3client.fetch(port, "/tls", sni="localhost", tickets=tickets)
    assert tickets, "the server sent no session ticket"
    reused = [a.body.decode().split("|")[4] for a in (first, again)]
    # curl resumes its session on its second connection (the first one was closed).
    url = f"https://localhost:{port}/tls"
    r = subprocess.run(["curl", "-sk", "--http1.1", "--resolve", f"localhost:{port}:127.0.0.1",
                        "-H", "Connection: close", url, url], capture_output=True, text=True, timeout=30)
    tcp = [line.split("|")[4] for line in r.stdout.splitlines()]
    assert reused == tcp == [".", "r"], (reused, r.stdout)


def test_client_certificate_verified_as_over_tcp(gannet, pki):
    text, port = both(pki, f"ssl_verify_client on; ssl_client_certificate {pki.path('ca.pem')};")
    srv = gannet.start(conf=text, port=port)
    info: dict = {}
    good = h3client.fetch(port, "/cert", sni="localhost", cert=cert(pki, "client"), info=info)
    assert info["cert_requested"]
    assert good.status == 200 and good.body.startswith(b"SUCCESS|O=Gannet Test,CN=client|CN=Gannet Test CA|")
    # None sent, or one no trusted CA signed: the 400 pages of 496 and 495, and nginx's
    # log lines, with OpenSSL's verify error.
    none = h3client.fetch(port, "/cert", sni="localhost")
    assert none.status == 400 and b"No required SSL certificate was sent" in none.body
    assert wait_until(lambda: "client sent no required SSL certificate" in srv.error_log())
    bad = h3client.fetch(port, "/cert", sni="localhost", cert=cert(pki, "stranger"))
    assert bad.status == 400 and b"The SSL certificate error" in bad.body
    assert wait_until(lambda: "client SSL certificate verify error: (18:self-signed certificate)" in srv.error_log())
    # Each answer, variables and pages alike, is the TCP listener's.
    for who in ("client", None, "stranger"):
        assert over_quic(pki, port, "/cert", who) == over_tcp(pki, port, "/cert", who), who


def test_optional_modes_crl_and_trusted_certificate(gannet, pki):
    text, port = both(pki, f"""ssl_verify_client optional;
        ssl_trusted_certificate {pki.path('ca.pem')};
        ssl_crl {pki.path('crl.pem')};""")
    srv = gannet.start(conf=text, port=port)
    answers = {who: over_quic(pki, port, "/cert", who) for who in (None, "client", "revoked")}
    assert answers[None].startswith("NONE|") and answers[None].endswith("|200")
    assert answers["client"].startswith("SUCCESS|O=Gannet Test,CN=client|")
    assert "The SSL certificate error" in answers["revoked"] and answers["revoked"].endswith("|400")
    for who, quic in answers.items():
        assert quic == over_tcp(pki, port, "/cert", who), who
    srv.stop()
    text, port = both(pki, "ssl_verify_client optional_no_ca;")
    gannet.start(conf=text, port=port)
    quic = over_quic(pki, port, "/cert", "stranger")
    assert quic.startswith("FAILED:self-signed certificate|CN=stranger|CN=stranger|") and quic.endswith("|200")
    assert quic == over_tcp(pki, port, "/cert", "stranger")


def test_only_a_verifying_server_asks_for_a_certificate(gannet, pki):
    """The SNI name picks the server whose `ssl_verify_client` decides whether the
    handshake asks for a certificate, as on TCP."""
    text, port = both(pki, f"ssl_verify_client optional; ssl_client_certificate {pki.path('ca.pem')};", f"""
    server {{
        listen 127.0.0.1:@PORT@ quic;
        server_name b.test;
        {pair(pki, 'b')}
        location = /cert {{ return 200 "{CERT_VARS}\\n"; }}
    }}""")
    gannet.start(conf=text, port=port)
    asked: dict = {}
    a = h3client.fetch(port, "/cert", sni="localhost", cert=cert(pki, "client"), info=asked)
    other: dict = {}
    b = h3client.fetch(port, "/cert", sni="b.test", cert=cert(pki, "client"), info=other)
    assert asked["cert_requested"] and a.body.startswith(b"SUCCESS|")
    assert not other["cert_requested"] and b.body.startswith(b"NONE|")
