"""OCSP stapling queried from the certificate's responder (`ssl_stapling on` without
`ssl_stapling_file`): a real `openssl ocsp` responder, started by the test, answers from
the test CA's index; `openssl s_client -status` reads what the server staples."""
from __future__ import annotations

import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import free_port, wait_until
from test_tls import Pki, conf, openssl, s_client

GOOD = ("OCSP Response Status: successful", "Cert Status: good")
NONE = "OCSP response: no response sent"


class Responder:
    """`openssl ocsp` serving the CA's index.txt on a port, signing with the CA (or `signer`)."""

    def __init__(self, pki: Pki, port: int, signer: str = "ca"):
        self.pki, self.port, self.signer, self.proc = pki, port, signer, None
        self.log = pki.d / f"responder-{port}.log"

    def start(self):
        self.proc = subprocess.Popen(
            ["openssl", "ocsp", "-index", "index.txt", "-port", str(self.port), "-rsigner",
             f"{self.signer}.pem", "-rkey", f"{self.signer}.key", "-CA", "ca.pem", "-ndays", "1"],
            cwd=self.pki.d, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"))
        # Not probed with a connection: the responder serves one at a time, and a probe's
        # empty one would cost the server's first query.
        assert wait_until(lambda: "waiting for OCSP client" in self.log.read_text(), 10)

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture(scope="module")
def ocsp_pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("ocsppki"))
    p.port = free_port()
    url = f"http://127.0.0.1:{p.port}"
    for name in ("good", "revoked"):
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}.test",
                "-addext", f"authorityInfoAccess=OCSP;URI:{url}", cwd=p.d)
        openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-notext",
                "-extensions", "leaf", "-in", f"{name}.csr", "-out", f"{name}.pem", "-days", "2", cwd=p.d)
        # The served chain: leaf then CA, so the issuer is known.
        (p.d / f"{name}-chain.pem").write_text((p.d / f"{name}.pem").read_text() + (p.d / "ca.pem").read_text())
    openssl("ca", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-revoke", "revoked.pem", cwd=p.d)
    # Signers for the responder: one the CA delegated OCSP signing to, one it did not.
    for name, eku in (("delegate", "OCSPSigning"), ("plain", "serverAuth")):
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=p.d)
        (p.d / f"{name}.ext").write_text(f"extendedKeyUsage={eku}\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=p.d)
    # A CA of no relation, for a failing ssl_stapling_verify.
    (p.d / "other").mkdir()
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "other/ca.key", "-out", "other/ca.pem", "-days", "3", "-subj", "/CN=Other CA", cwd=p.d)
    return p


@contextmanager
def stopping(r: Responder):
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def responder(ocsp_pki):
    r = Responder(ocsp_pki, ocsp_pki.port)
    yield r
    r.stop()


def server(pki: Pki, name: str, extra: str = "") -> str:
    return conf(f"""
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name localhost;
        ssl_certificate {pki.d / (name + '-chain.pem')};
        ssl_certificate_key {pki.d / (name + '.key')};
        ssl_stapling on;
        {extra}
        location / {{ return 200 "ok\\n"; }}
    }}""")


def stapled(port: int) -> bool:
    out = s_client(port, "-status")
    return all(s in out for s in GOOD)


def test_staples_the_responders_good_answer(gannet, ocsp_pki, responder):
    responder.start()
    srv = gannet.start(conf=server(ocsp_pki, "good"))
    assert wait_until(lambda: stapled(srv.port), 15), s_client(srv.port, "-status")


def test_revoked_is_not_stapled(gannet, ocsp_pki, responder):
    responder.start()
    srv = gannet.start(conf=server(ocsp_pki, "revoked"))
    assert wait_until(lambda: 'certificate status "revoked" in the OCSP response' in srv.error_log(), 15)
    assert NONE in s_client(srv.port, "-status")


def test_responder_down_then_up_without_reload(gannet, ocsp_pki, responder):
    srv = gannet.start(conf=server(ocsp_pki, "good"))
    assert wait_until(lambda: "connect() failed (111: Connection refused) while requesting certificate status"
                      in srv.error_log(), 15), srv.error_log()
    cert = ocsp_pki.d / "good-chain.pem"
    assert f'responder: 127.0.0.1, peer: 127.0.0.1:{ocsp_pki.port}, certificate: "{cert}"' in srv.error_log()
    assert NONE in s_client(srv.port, "-status")
    responder.start()
    assert wait_until(lambda: stapled(srv.port), 30), srv.error_log()


def test_stapling_responder_overrides_the_certificates(gannet, ocsp_pki):
    other = Responder(ocsp_pki, free_port())
    other.start()
    try:
        srv = gannet.start(conf=server(ocsp_pki, "good", f"ssl_stapling_responder http://127.0.0.1:{other.port}/;"))
        assert wait_until(lambda: stapled(srv.port), 15), srv.error_log()
    finally:
        other.stop()


def test_bad_responder_url_is_a_warning(gannet, ocsp_pki):
    r = gannet.check(conf=server(ocsp_pki, "good", "ssl_stapling_responder https://127.0.0.1/;"))
    assert r.returncode == 0, r.stderr
    assert '"ssl_stapling" ignored, invalid URL prefix in OCSP responder "https://127.0.0.1/"' in r.stderr


def test_verify_with_wrong_trusted_ca(gannet, ocsp_pki):
    """A delegated responder's certificate must chain up to `ssl_trusted_certificate`."""
    r = Responder(ocsp_pki, free_port(), signer="delegate")
    r.start()
    try:
        srv = gannet.start(conf=server(ocsp_pki, "good", f"""ssl_stapling_verify on;
            ssl_stapling_responder http://127.0.0.1:{r.port}/;
            ssl_trusted_certificate {ocsp_pki.d / 'other/ca.pem'};"""))
        assert wait_until(lambda: "OCSP_basic_verify() failed" in srv.error_log(), 15), srv.error_log()
        assert NONE in s_client(srv.port, "-status")
    finally:
        r.stop()


def test_verify_trusts_a_signer_served_in_the_chain(gannet, ocsp_pki, responder):
    """As nginx (OCSP_TRUSTOTHER): the CA served after the certificate signed the response,
    which is enough whatever `ssl_trusted_certificate` holds."""
    responder.start()
    srv = gannet.start(conf=server(ocsp_pki, "good", f"""ssl_stapling_verify on;
        ssl_trusted_certificate {ocsp_pki.d / 'other/ca.pem'};"""))
    assert wait_until(lambda: stapled(srv.port), 15), srv.error_log()


def test_verify_with_right_trusted_ca(gannet, ocsp_pki, responder):
    responder.start()
    srv = gannet.start(conf=server(ocsp_pki, "good", f"""ssl_stapling_verify on;
        ssl_trusted_certificate {ocsp_pki.d / 'ca.pem'};"""))
    assert wait_until(lambda: stapled(srv.port), 15), srv.error_log()


def test_responder_name_through_the_resolver(gannet, ocsp_pki, tmp_path):
    """`resolver` at http level looks up the responder's name (`ocsp.test`, which only the
    test's DNS server knows)."""
    from test_resolver import DNSMASQ, Dns
    if DNSMASQ is None:
        pytest.skip("dnsmasq is not installed")
    dns = Dns(tmp_path)
    other = Responder(ocsp_pki, free_port())
    try:
        dns.set({"ocsp.test": ["127.0.0.1"]})
        assert wait_until(lambda: dns.address("ocsp.test") == "127.0.0.1")
        other.start()
        srv = gannet.start(conf=conf(f"""
    resolver 127.0.0.1:{dns.port};
    server {{
        listen 127.0.0.1:{{port}} ssl;
        ssl_certificate {ocsp_pki.d / 'good-chain.pem'};
        ssl_certificate_key {ocsp_pki.d / 'good.key'};
        ssl_stapling on;
        ssl_stapling_responder http://ocsp.test:{other.port}/;
    }}"""))
        assert wait_until(lambda: stapled(srv.port), 15), srv.error_log()
    finally:
        other.stop()
        dns.stop()


@pytest.mark.parametrize("signer,staples", [("delegate", True), ("plain", False)])
def test_verify_accepts_only_the_issuer_or_its_delegate(gannet, ocsp_pki, signer, staples):
    """A response signed by a certificate of the CA's is trusted only if the CA gave it
    OCSP signing (RFC 6960 4.2.2.2), as OpenSSL's OCSP_basic_verify."""
    r = Responder(ocsp_pki, free_port(), signer=signer)
    r.start()
    try:
        srv = gannet.start(conf=server(ocsp_pki, "good", f"""ssl_stapling_verify on;
            ssl_stapling_responder http://127.0.0.1:{r.port}/;
            ssl_trusted_certificate {ocsp_pki.d / 'ca.pem'};"""))
        if staples:
            assert wait_until(lambda: stapled(srv.port), 15), srv.error_log()
        else:
            assert wait_until(lambda: "OCSP_basic_verify() failed" in srv.error_log(), 15), srv.error_log()
            assert NONE in s_client(srv.port, "-status")
    finally:
        r.stop()


@pytest.mark.parametrize("cert,signer,extra,good,logged", [
    ("good", "ca", "", True, None),
    ("revoked", "ca", "", False, 'certificate status "revoked" in the OCSP response'),
    ("good", "ca", "ssl_stapling_verify on; ssl_trusted_certificate {other};", True, None),
    ("good", "delegate", "ssl_stapling_verify on; ssl_trusted_certificate {other};", False,
     "OCSP_basic_verify() failed"),
    ("good", "delegate", "ssl_stapling_verify on; ssl_trusted_certificate {ca};", True, None),
    ("good", "plain", "ssl_stapling_verify on; ssl_trusted_certificate {ca};", False, "OCSP_basic_verify() failed"),
])
def test_stapled_status_as_nginx(tmp_path, ocsp_pki, cert, signer, extra, good, logged):
    """Debian's nginx on the same config against the same responder: the same staple (nginx
    asks on the first handshake, gannet at start; both are waited for) and the same log line."""
    from nginx_peer import NGINX, PEER_MAIN, side_by_side
    if NGINX is None:
        pytest.skip("Debian's nginx is installed by scripts/test-all.sh")
    responder = Responder(ocsp_pki, free_port(), signer=signer)
    extra = extra.format(other=ocsp_pki.d / "other/ca.pem", ca=ocsp_pki.d / "ca.pem")
    extra += f" ssl_stapling_responder http://127.0.0.1:{responder.port}/;"
    text = PEER_MAIN + f"""
http {{
    server {{
        listen 127.0.0.1:{{port}} ssl;
        ssl_certificate {ocsp_pki.d / (cert + '-chain.pem')};
        ssl_certificate_key {ocsp_pki.d / (cert + '.key')};
        ssl_stapling on;
        {extra}
        location / {{ return 200 "ok\\n"; }}
    }}
}}"""
    responder.start()
    with stopping(responder), side_by_side(tmp_path, text) as (srv, nginx_port):
        for port, log in ((srv.port, tmp_path / "gannet/error.log"), (nginx_port, tmp_path / "nginx/error.log")):
            if good:
                assert wait_until(lambda: stapled(port), 15), log.read_text()
            else:
                # A handshake makes nginx ask; then its answer is judged and logged.
                assert wait_until(lambda: NONE in s_client(port, "-status") and logged in log.read_text(), 15), \
                    log.read_text()


def test_stream_server_staples(gannet, ocsp_pki, responder):
    """The stream module's TLS servers staple the same way."""
    responder.start()
    srv = gannet.start(conf=f"""
worker_processes 1;
pid {{tmp}}/gannet.pid;
error_log {{tmp}}/error.log info;
events {{ }}
stream {{
    server {{
        listen 127.0.0.1:{{port}} ssl;
        ssl_certificate {ocsp_pki.d / 'good-chain.pem'};
        ssl_certificate_key {ocsp_pki.d / 'good.key'};
        ssl_stapling on;
        return "ok\\n";
    }}
}}""")
    out = lambda: s_client(srv.port, "-status", request=b"")
    assert wait_until(lambda: all(s in out() for s in GOOD), 15), srv.error_log()
