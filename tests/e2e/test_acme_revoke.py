"""ACME certificates revoked at the CA and certificates for several names, against a real
Pebble: a certificate revoked through the CA's revokeCert endpoint (signed with gannet's
own account key from its state_path) is noticed through the CA's renewal information
(Pebble moves a revoked certificate's ARI window into the past) and replaced without a
reload; every check is a TLS handshake verified against Pebble's root by openssl."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import urllib.request
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from conftest import free_port, wait_port, wait_until
from test_acme import Pebble, http_port, need_pebble, render, served_leaf  # noqa: F401 (fixture)


def b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def revoke(pebble: Pebble, state: Path, leaf_pem: str):
    """POST revokeCert (RFC 8555 7.6) for `leaf_pem`, signed ES256 with the account key and
    URL gannet keeps in `state`."""
    revoke_with(pebble, (state / "account.key").read_bytes(), (state / "account.url").read_text(), leaf_pem)


def revoke_with(pebble: Pebble, key_pem: bytes, kid: str, leaf_pem: str):
    """revokeCert signed with this account key (PEM) and account URL."""
    ctx = ssl.create_default_context(cafile=str(pebble.minica))
    with urllib.request.urlopen(pebble.directory, context=ctx, timeout=10) as r:
        directory = json.load(r)
    req = urllib.request.Request(directory["newNonce"], method="HEAD")
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        nonce = r.headers["Replay-Nonce"]
    key = serialization.load_pem_private_key(key_pem, None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    kid = kid.strip()
    der = x509.load_pem_x509_certificate(leaf_pem.encode()).public_bytes(serialization.Encoding.DER)
    protected = b64(json.dumps({"alg": "ES256", "kid": kid, "nonce": nonce, "url": directory["revokeCert"]}).encode())
    payload = b64(json.dumps({"certificate": b64(der)}).encode())
    r_, s_ = decode_dss_signature(key.sign(f"{protected}.{payload}".encode(), ec.ECDSA(hashes.SHA256())))
    sig = b64(r_.to_bytes(32, "big") + s_.to_bytes(32, "big"))
    body = json.dumps({"protected": protected, "payload": payload, "signature": sig}).encode()
    req = urllib.request.Request(directory["revokeCert"], data=body, method="POST",
                                 headers={"Content-Type": "application/jose+json"})
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        assert r.status == 200


def serial(leaf_pem: str) -> int:
    return x509.load_pem_x509_certificate(leaf_pem.encode()).serial_number


def full(leaf: str) -> str:
    return leaf + "-----END CERTIFICATE-----\n"


def test_revoked_certificate_is_replaced_without_reload(gannet, tmp_path, http_port):
    need_pebble()
    pebble = Pebble(tmp_path, http_port)
    try:
        tls_port = free_port()
        conf = render(pebble, tls_port).replace("accept_terms_of_service;", "accept_terms_of_service;\n        renewal_check 1s;")
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
        assert leaf, srv.error_log()
        worker = srv.worker_pid()
        first = serial(full(leaf))
        assert pebble.orders() == 1
        revoke(pebble, srv.tmp / "acme", full(leaf))
        renewed = wait_until(lambda: (l := served_leaf(tls_port, pebble.root)) and serial(full(l)) != first and l,
                             deadline=60, every=0.5)
        assert renewed, f"not replaced\n{srv.error_log()}\n{pebble.log_path.read_text()}"
        assert srv.worker_pids() == [worker]
        assert pebble.orders() == 2
        assert "is a replacement of" in pebble.log_path.read_text()
    finally:
        pebble.stop()


def s_client_name(port: int, root: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", name,
         "-CAfile", str(root), "-verify_return_error", "-verify_hostname", name],
        input=b"", capture_output=True, timeout=20)


def test_several_names_in_one_certificate(gannet, tmp_path, http_port):
    """`acme_certificate pebble NAME...`: one certificate naming all of them, each name's
    handshake verified. Pebble validates with PEBBLE_VA_ALWAYS_VALID here, the made-up
    names resolving nowhere (the real HTTP-01 exchange is test_acme's)."""
    need_pebble()
    pebble = Pebble(tmp_path, http_port, env={"PEBBLE_VA_ALWAYS_VALID": "1"})
    try:
        tls_port = free_port()
        names = ["localhost", "a.example.test", "b.example.test", "www.example.test"]
        conf = (render(pebble, tls_port)
                .replace("acme_certificate pebble;", f"acme_certificate pebble {' '.join(names)};")
                .replace("server_name localhost;\n        acme", f"server_name {' '.join(names)};\n        acme"))
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
        assert leaf, srv.error_log()
        cert = x509.load_pem_x509_certificate(full(leaf).encode())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        assert sorted(sans) == sorted(names)
        for name in names:
            r = s_client_name(tls_port, pebble.root, name)
            assert r.returncode == 0, (name, r.stdout.decode(errors="replace")[-600:])
            assert b"Verify return code: 0 (ok)" in r.stdout
        # A name the certificate does not hold fails verification.
        assert s_client_name(tls_port, pebble.root, "c.example.test").returncode != 0
        assert pebble.orders() == 1
    finally:
        pebble.stop()
