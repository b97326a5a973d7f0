"""Client certificates checked with OCSP (`ssl_ocsp`, `ssl_ocsp_responder`,
`ssl_ocsp_cache`), against a real `openssl ocsp` responder serving the test CA's index, and
side by side with Debian's nginx on the same config: the same status and the same
`$ssl_client_verify` for each client certificate and responder."""
from __future__ import annotations

import subprocess

import pytest

from conftest import free_port, wait_until
from test_ocsp import Responder, ocsp_pki, stopping  # noqa: F401 (fixture)
from test_tls import conf


def server(pki, extra: str) -> str:
    return f"""
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name localhost;
        ssl_certificate {pki.d / 'good-chain.pem'};
        ssl_certificate_key {pki.d / 'good.key'};
        ssl_verify_client on;
        ssl_client_certificate {pki.d / 'ca.pem'};
        add_header X-Verify $ssl_client_verify always;
        {extra}
        location / {{ return 200 "ok\\n"; }}
    }}"""


def get(port: int, pki, cert: str) -> tuple[int, str]:
    """curl with the client certificate `cert`: the status and X-Verify."""
    r = subprocess.run(["curl", "-sk", "-o", "/dev/null", "-D", "-", "--cert", str(pki.d / f"{cert}.pem"),
                        "--key", str(pki.d / f"{cert}.key"), f"https://127.0.0.1:{port}/"],
                       capture_output=True, text=True, timeout=30)
    lines = r.stdout.splitlines()
    status = int(lines[0].split()[1]) if lines else 0
    verify = next((l.split(":", 1)[1].strip() for l in lines if l.lower().startswith("x-verify:")), "")
    return status, verify


OK = (200, "SUCCESS")
REVOKED = (400, "FAILED:certificate revoked")
FAILED = (400, "FAILED:certificate status request failed")


@pytest.mark.parametrize("cert,signer,extra,expect", [
    ("good", "ca", "ssl_ocsp on;", OK),
    ("revoked", "ca", "ssl_ocsp on;", REVOKED),
    ("revoked", "ca", "ssl_ocsp leaf;", REVOKED),
    ("revoked", "ca", "ssl_ocsp off;", OK),
    # The CA delegated OCSP signing to `delegate`, not to `plain`.
    ("good", "delegate", "ssl_ocsp on;", OK),
    ("good", "plain", "ssl_ocsp on;", FAILED),
])
def test_client_ocsp_as_nginx(tmp_path, ocsp_pki, cert, signer, extra, expect):
    from nginx_peer import NGINX, PEER_MAIN, side_by_side
    if NGINX is None:
        pytest.skip("Debian's nginx is installed by scripts/test-all.sh")
    responder = Responder(ocsp_pki, free_port(), signer=signer)
    extra += f" ssl_ocsp_responder http://127.0.0.1:{responder.port}/;"
    text = PEER_MAIN + "http {" + server(ocsp_pki, extra) + "}"
    responder.start()
    with stopping(responder), side_by_side(tmp_path, text) as (srv, nginx_port):
        assert get(nginx_port, ocsp_pki, cert) == expect
        assert get(srv.port, ocsp_pki, cert) == expect, srv.error_log()
        if expect == FAILED:
            assert "OCSP_basic_verify() failed while requesting certificate status" in srv.error_log()
            assert "client SSL certificate verify error: certificate status request failed" in srv.error_log()


def test_responder_from_the_certificate_down_then_cached(gannet, ocsp_pki):
    """Without `ssl_ocsp_responder` the certificate's own responder (an address, so no
    `resolver` is needed) is asked; while it is down every request fails; with
    `ssl_ocsp_cache` a good answer is kept, and served once the responder is gone."""
    srv = gannet.start(conf=conf(server(ocsp_pki, "ssl_ocsp on; ssl_ocsp_cache shared:OCSP:1m;")))
    assert get(srv.port, ocsp_pki, "good") == FAILED
    assert f"connect() failed (111: Connection refused) while requesting certificate status, responder: 127.0.0.1, peer: 127.0.0.1:{ocsp_pki.port}" in srv.error_log()
    with stopping(Responder(ocsp_pki, ocsp_pki.port)) as r:
        r.start()
        assert get(srv.port, ocsp_pki, "good") == OK
        assert get(srv.port, ocsp_pki, "revoked") == REVOKED
    # The responder is gone: the cached answers still hold.
    assert get(srv.port, ocsp_pki, "good") == OK
    assert get(srv.port, ocsp_pki, "revoked") == REVOKED


def test_no_cache_asks_every_time(gannet, ocsp_pki):
    srv = gannet.start(conf=conf(server(ocsp_pki, "ssl_ocsp on;")))
    with stopping(Responder(ocsp_pki, ocsp_pki.port)) as r:
        r.start()
        assert get(srv.port, ocsp_pki, "good") == OK
    assert get(srv.port, ocsp_pki, "good") == FAILED


def test_named_responder_needs_no_resolver_but_the_certificates_does(gannet, ocsp_pki):
    """A responder named in a certificate is resolved only with `resolver`, as nginx's
    ("no resolver defined to resolve localhost"); `ssl_ocsp_responder`'s name is resolved
    when the configuration loads."""
    with stopping(Responder(ocsp_pki, ocsp_pki.port)) as r:
        r.start()
        srv = gannet.start(conf=conf(server(ocsp_pki, f"ssl_ocsp on; ssl_ocsp_responder http://localhost:{ocsp_pki.port};")))
        assert get(srv.port, ocsp_pki, "good") == OK


@pytest.mark.parametrize("extra,error", [
    ("ssl_ocsp maybe;", 'invalid value "maybe" in "ssl_ocsp" directive'),
    ("ssl_ocsp_cache shared:X:1k;", 'OCSP cache "shared:X:1k" is too small'),
    ("ssl_ocsp_cache builtin;", 'invalid OCSP cache "builtin"'),
    ("ssl_ocsp_cache off; ssl_ocsp_cache off;", '"ssl_ocsp_cache" directive is duplicate'),
    ("ssl_ocsp on; ssl_ocsp_responder https://127.0.0.1/;",
     'invalid URL prefix in OCSP responder "https://127.0.0.1/" in "ssl_ocsp_responder"'),
])
def test_config_errors(gannet, ocsp_pki, extra, error):
    r = gannet.check(conf=conf(server(ocsp_pki, extra)))
    assert r.returncode != 0 and error in r.stderr and ".conf:" in r.stderr, r.stderr


def test_optional_no_ca_is_refused(gannet, ocsp_pki):
    text = conf(server(ocsp_pki, "ssl_ocsp on;").replace("ssl_verify_client on;", "ssl_verify_client optional_no_ca;"))
    r = gannet.check(conf=text)
    assert r.returncode != 0 and '"ssl_ocsp" is incompatible with "ssl_verify_client optional_no_ca"' in r.stderr, r.stderr
