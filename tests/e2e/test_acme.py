"""ACME (nginx's ngx_http_acme_module directives) against a real Pebble, Let's Encrypt's test
ACME server (installed by scripts/test-all.sh), validating for real: Pebble fetches
gannet's HTTP-01 answers from the test's plain-HTTP port (its `httpPort`) for `localhost`,
and every check is a TLS handshake verified against Pebble's root by openssl."""

from __future__ import annotations

import glob
import http.client
import os
import shutil
import signal
import socket
import ssl
import stat
import time
import subprocess
import json
import urllib.request
from pathlib import Path

import pytest

from conftest import free_port, wait_port, wait_until


def pebble_bin() -> str | None:
    found = shutil.which("pebble")
    home = os.path.expanduser("~/go/bin/pebble")
    return found or (home if os.access(home, os.X_OK) else None)


def pebble_certs() -> Path | None:
    """Pebble's own test certificates (its listener's and the minica that signed it), from
    the Go module cache `go install` filled."""
    try:
        cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    found = sorted(glob.glob(f"{cache}/github.com/letsencrypt/pebble/v2@*/test/certs"))
    return Path(found[-1]) if found else None


class Pebble:
    def __init__(self, tmp: Path, http_port: int, validity: int | None = None, port: int | None = None, extra: dict | None = None,
                 env: dict | None = None):
        certs = pebble_certs()
        self.port, self.mgmt = port or free_port(), free_port()
        self.minica = certs / "pebble.minica.pem"
        conf = {
            "pebble": {
                "listenAddress": f"127.0.0.1:{self.port}",
                "managementListenAddress": f"127.0.0.1:{self.mgmt}",
                "certificate": str(certs / "localhost/cert.pem"),
                "privateKey": str(certs / "localhost/key.pem"),
                "httpPort": http_port,
                "tlsPort": (extra or {}).pop("tlsPort", None) or free_port(),
                "ocspResponderURL": "",
                "externalAccountBindingRequired": False,
            }
        }
        if validity:
            conf["pebble"]["profiles"] = {"default": {"description": "short", "validityPeriod": validity}}
        conf["pebble"].update(extra or {})
        path = tmp / "pebble.json"
        path.write_text(json.dumps(conf))
        extra_env = env or {}
        env = {k: v for k, v in os.environ.items() if k != "PEBBLE_VA_ALWAYS_VALID"}
        # No random validation delay and no rejected nonces: the tests wait for states.
        env.update(PEBBLE_VA_NOSLEEP="1", PEBBLE_WFE_NONCEREJECT="0", **extra_env)
        self.log_path = tmp / "pebble.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([pebble_bin(), "-config", str(path)], stdout=self.log, stderr=subprocess.STDOUT, env=env)
        wait_port(self.port, self.proc)
        wait_port(self.mgmt, self.proc)
        self.root = tmp / "pebble-root.pem"
        self.root.write_bytes(self.fetch_root())

    @property
    def directory(self) -> str:
        return f"https://127.0.0.1:{self.port}/dir"

    def fetch_root(self, n: int = 0) -> bytes:
        ctx = ssl.create_default_context(cafile=str(self.minica))
        with urllib.request.urlopen(f"https://127.0.0.1:{self.mgmt}/roots/{n}", context=ctx, timeout=10) as r:
            return r.read()

    def set_renewal_window(self, cert_pem: str, start: str, end: str):
        """Pebble's management API: what its ARI endpoint says about this certificate."""
        body = json.dumps({"Certificate": cert_pem, "ARIResponse": json.dumps(
            {"suggestedWindow": {"start": start, "end": end}})}).encode()
        ctx = ssl.create_default_context(cafile=str(self.minica))
        req = urllib.request.Request(f"https://127.0.0.1:{self.mgmt}/set-renewal-info/", data=body, method="POST")
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            assert r.status == 200

    def orders(self) -> int:
        return self.log_path.read_text(errors="replace").count("Added order")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        self.log.close()


@pytest.fixture
def http_port():
    return free_port()


def need_pebble():
    if pebble_bin() is None or pebble_certs() is None:
        pytest.skip("pebble is not installed (scripts/test-all.sh installs it)")


@pytest.fixture
def pebble(tmp_path, http_port):
    need_pebble()
    p = Pebble(tmp_path, http_port)
    yield p
    p.stop()


@pytest.fixture
def short_pebble(tmp_path, http_port):
    """Pebble issuing certificates valid 12 s: renewed at two thirds, 8 s."""
    need_pebble()
    p = Pebble(tmp_path, http_port, validity=12)
    yield p
    p.stop()


CONF = """
worker_processes 2;
pid {tmp}/gannet.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log off;
    acme_issuer pebble {{
        uri {directory};
        ssl_trusted_certificate {minica};
        contact admin@example.test;
        state_path {tmp}/acme;
        accept_terms_of_service;
    }}
    acme_shared_zone zone=ngx_acme_shared:1M;
    server {{
        listen 127.0.0.1:{tls_port} ssl;
        server_name localhost;
        acme_certificate pebble;
        ssl_certificate $acme_certificate;
        ssl_certificate_key $acme_certificate_key;
        location / {{ return 200 "secure\\n"; }}
    }}
    server {{
        listen 127.0.0.1:{port};
        server_name localhost;
        location / {{ return 404; }}
    }}
}}
"""


def render(pebble: Pebble, tls_port: int) -> str:
    return render_for(pebble.directory, pebble.minica, tls_port)


def render_for(directory: str, minica: Path, tls_port: int) -> str:
    return (CONF.replace("{directory}", directory).replace("{minica}", str(minica))
            .replace("{tls_port}", str(tls_port)).replace("{{", "{").replace("}}", "}"))


def s_client(port: int, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-servername", "localhost",
         "-CAfile", str(root), "-verify_return_error", "-verify_hostname", "localhost", "-showcerts"],
        input=b"", capture_output=True, timeout=20)


def served_leaf(port: int, root: Path) -> str | None:
    """The verified leaf certificate's PEM, or None if the handshake fails."""
    r = s_client(port, root)
    if r.returncode != 0:
        return None
    out = r.stdout.decode(errors="replace")
    start = out.find("-----BEGIN CERTIFICATE-----")
    end = out.find("-----END CERTIFICATE-----", start)
    return out[start:end] if start >= 0 else None


def test_certificate_obtained_over_http01_and_reused_after_restart(gannet, pebble, http_port):
    tls_port = free_port()
    srv = gannet.start(conf=render(pebble, tls_port), port=http_port)
    wait_port(tls_port, srv.proc)
    leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
    assert leaf, f"no certificate served\n{srv.error_log()}\n{pebble.log_path.read_text()}"
    # The certificate names the server and chains to Pebble's root (-verify_return_error).
    text = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"], input=(leaf + "-----END CERTIFICATE-----\n").encode(), capture_output=True).stdout.decode()
    assert "DNS:localhost" in text
    # Every worker thread serves it: several fresh handshakes all verify.
    for _ in range(4):
        assert served_leaf(tls_port, pebble.root) == leaf
    # curl, with Pebble's root, gets the page over it.
    out = subprocess.run(["curl", "-sS", "--cacert", str(pebble.root), "--resolve", f"localhost:{tls_port}:127.0.0.1",
                          f"https://localhost:{tls_port}/"], capture_output=True, timeout=20)
    assert out.stdout == b"secure\n", out.stderr
    # The state: account key and URL, certificate and key, all 0600 in a 0700 folder.
    state = srv.tmp / "acme"
    files = sorted(p.name for p in state.iterdir())
    assert "account.key" in files and "account.url" in files
    assert any(n.endswith(".crt") for n in files) and any(n.endswith(".key") and n != "account.key" for n in files)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for p in state.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert pebble.orders() == 1
    crt = next(p for p in state.iterdir() if p.name.endswith(".crt"))
    mtime = crt.stat().st_mtime_ns

    # A worker process killed and forked again by the master (from the config as loaded,
    # before the certificate existed) takes it from the state folder: no new order.
    old = srv.worker_pid()
    os.kill(old, signal.SIGKILL)
    assert wait_until(lambda: (p := srv.worker_pids()) and old not in p and len(p) == 1, deadline=15)
    wait_port(tls_port, srv.proc)
    assert wait_until(lambda: served_leaf(tls_port, pebble.root) == leaf, deadline=10)
    assert pebble.orders() == 1

    # A reload: the new worker generation serves the same certificate, no new order.
    old = srv.worker_pid()
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: (p := srv.worker_pids()) and old not in p and len(p) == 1, deadline=15)
    assert served_leaf(tls_port, pebble.root) == leaf
    assert pebble.orders() == 1

    # A restart serves the stored certificate at once, with no new order.
    srv.stop()
    srv = gannet.start(conf=render(pebble, tls_port), port=http_port)
    wait_port(tls_port, srv.proc)
    assert served_leaf(tls_port, pebble.root) == leaf
    assert crt.stat().st_mtime_ns == mtime
    assert pebble.orders() == 1


def test_handshake_refused_until_the_certificate_exists(gannet, pebble, http_port, tmp_path):
    """An ACME server that cannot be reached: gannet starts, logs the failure with its
    retry, and refuses TLS handshakes for the server (no certificate to offer)."""
    tls_port = free_port()
    conf = render(pebble, tls_port).replace(pebble.directory, f"https://127.0.0.1:{free_port()}/dir")
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)
    assert wait_until(lambda: "acme: certificate for \"localhost\" from \"pebble\" failed" in srv.error_log(), deadline=20), srv.error_log()
    assert "retrying in 10s" in srv.error_log()
    r = s_client(tls_port, pebble.root)
    assert r.returncode != 0
    assert b"BEGIN CERTIFICATE" not in r.stdout
    # Plain HTTP is served meanwhile.
    assert srv.get("/")[0] == 404


def test_renewed_before_expiry_without_reload_or_dropped_connection(gannet, short_pebble, http_port):
    pebble = short_pebble
    tls_port = free_port()
    srv = gannet.start(conf=render(pebble, tls_port), port=http_port)
    wait_port(tls_port, srv.proc)
    leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.2)
    assert leaf, srv.error_log()
    worker = srv.worker_pid()
    # A keep-alive connection made with the first certificate.
    ctx = ssl.create_default_context(cafile=str(pebble.root))
    conn = http.client.HTTPSConnection("localhost", tls_port, context=ctx, timeout=10)
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"secure\n"
    # A new certificate is served before the first expires, by the same worker process.
    renewed = wait_until(lambda: (l := served_leaf(tls_port, pebble.root)) not in (None, leaf) and l, deadline=30, every=0.2)
    assert renewed, f"not renewed\n{srv.error_log()}"
    assert srv.worker_pids() == [worker]
    assert pebble.orders() >= 2
    # The old connection goes on.
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"secure\n"
    conn.close()


def test_failed_validation_is_logged_with_the_cas_reason(gannet, tmp_path, http_port):
    """Pebble validates on a port where gannet does not listen: the order fails, the log
    says why (Pebble's problem document), and the handshake stays refused."""
    need_pebble()
    pebble = Pebble(tmp_path, free_port())
    try:
        tls_port = free_port()
        srv = gannet.start(conf=render(pebble, tls_port), port=http_port)
        wait_port(tls_port, srv.proc)
        assert wait_until(lambda: "/.well-known/acme-challenge/" in srv.error_log() and "(urn:ietf:params:acme:error:connection)" in srv.error_log(), deadline=30), srv.error_log()
        assert "retrying in 10s" in srv.error_log()
        assert s_client(tls_port, pebble.root).returncode != 0
    finally:
        pebble.stop()


def test_rsa_key_and_no_state_path(gannet, pebble, http_port):
    """`key=rsa:2048` with explicit identifiers, and `state_path off`: the certificate is
    served with an RSA key, and nothing is written."""
    tls_port = free_port()
    conf = (render(pebble, tls_port).replace("state_path {tmp}/acme;", "state_path off;")
            .replace("acme_certificate pebble;", "acme_certificate pebble localhost key=rsa:2048;"))
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)
    leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
    assert leaf, srv.error_log()
    text = subprocess.run(["openssl", "x509", "-noout", "-text"], input=(leaf + "-----END CERTIFICATE-----\n").encode(), capture_output=True).stdout.decode()
    assert "rsaEncryption" in text and "2048 bit" in text
    assert not (srv.tmp / "acme").exists()
    assert not list(srv.tmp.glob("acme_*"))


def test_acme_server_down_at_start_then_back(gannet, tmp_path, http_port):
    """The CA is down when gannet starts: the failure is logged and retried, and once the
    CA is up the certificate is obtained and served, with no reload."""
    need_pebble()
    acme_port, tls_port = free_port(), free_port()
    conf = render_for(f"https://127.0.0.1:{acme_port}/dir", pebble_certs() / "pebble.minica.pem", tls_port)
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)
    assert wait_until(lambda: "retrying in 10s" in srv.error_log(), deadline=20), srv.error_log()
    worker = srv.worker_pid()
    pebble = Pebble(tmp_path, http_port, port=acme_port)
    try:
        assert wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=40, every=0.5), srv.error_log()
        assert srv.worker_pids() == [worker]
    finally:
        pebble.stop()


def test_renewal_window_from_ari_replaces_the_certificate(gannet, pebble, http_port):
    """The CA's renewal information (ARI, RFC 9773) says the stored certificate is due
    (a window in the past, as after a revocation incident): gannet renews it at start
    although it has months left, and tells the CA which certificate the order replaces."""
    tls_port = free_port()
    srv = gannet.start(conf=render(pebble, tls_port), port=http_port)
    wait_port(tls_port, srv.proc)
    leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
    assert leaf, srv.error_log()
    srv.stop()
    pebble.set_renewal_window(leaf + "-----END CERTIFICATE-----\n", "2020-01-01T00:00:00Z", "2020-01-02T00:00:00Z")
    srv = gannet.start(conf=render(pebble, tls_port), port=http_port)
    wait_port(tls_port, srv.proc)
    renewed = wait_until(lambda: (l := served_leaf(tls_port, pebble.root)) not in (None, leaf) and l, deadline=60, every=0.5)
    assert renewed, srv.error_log()
    assert "is a replacement of" in pebble.log_path.read_text()
    assert pebble.orders() == 2


EAB_KEY = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W"


def test_external_account_binding(gannet, tmp_path, http_port):
    """A CA that requires external account binding: the account is bound with
    `external_account_key KID data:KEY` (base64url MAC key) and the certificate comes."""
    need_pebble()
    pebble = Pebble(tmp_path, http_port, extra={"externalAccountBindingRequired": True,
                                                "externalAccountMACKeys": {"kid-1": EAB_KEY}})
    try:
        tls_port = free_port()
        conf = render(pebble, tls_port).replace("accept_terms_of_service;", f"accept_terms_of_service; external_account_key kid-1 data:{EAB_KEY};")
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        assert wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5), srv.error_log()
        assert 'newAccount Binding with CA using kid "kid-1"' in pebble.log_path.read_text()
    finally:
        pebble.stop()


def test_external_account_binding_missing_is_logged(gannet, tmp_path, http_port):
    need_pebble()
    pebble = Pebble(tmp_path, http_port, extra={"externalAccountBindingRequired": True,
                                                "externalAccountMACKeys": {"kid-1": EAB_KEY}})
    try:
        tls_port = free_port()
        srv = gannet.start(conf=render(pebble, tls_port), port=http_port)
        wait_port(tls_port, srv.proc)
        assert wait_until(lambda: "externalAccountRequired" in srv.error_log(), deadline=20), srv.error_log()
        assert s_client(tls_port, pebble.root).returncode != 0
    finally:
        pebble.stop()


def test_profile(gannet, tmp_path, http_port):
    """`profile NAME`: the CA's profile of that name (here one hour of validity) is asked
    for; `profile NAME require` with a profile the CA lacks fails the order, logged."""
    need_pebble()
    profiles = {"default": {"description": "long", "validityPeriod": 7776000},
                "hour": {"description": "one hour", "validityPeriod": 3600}}
    pebble = Pebble(tmp_path, http_port, extra={"profiles": profiles})
    try:
        tls_port = free_port()
        conf = render(pebble, tls_port).replace("accept_terms_of_service;", "accept_terms_of_service; profile hour;")
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
        assert leaf, srv.error_log()
        dates = subprocess.run(["openssl", "x509", "-noout", "-startdate", "-enddate"], input=(leaf + "-----END CERTIFICATE-----\n").encode(), capture_output=True).stdout.decode()
        start, end = (line.split("=", 1)[1] for line in dates.splitlines())
        parse = lambda s: time.mktime(time.strptime(s.replace(" GMT", ""), "%b %d %H:%M:%S %Y"))
        assert 3000 < parse(end) - parse(start) < 3700, dates
        srv.stop()

        conf = render(pebble, tls_port).replace("accept_terms_of_service;", "accept_terms_of_service; profile nope require;").replace("state_path {tmp}/acme;", "state_path {tmp}/acme2;")
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        assert wait_until(lambda: 'the ACME server has no profile "nope"' in srv.error_log(), deadline=20), srv.error_log()
    finally:
        pebble.stop()


def test_tls_alpn_01(gannet, tmp_path, http_port):
    """`challenge tls-alpn-01`: Pebble validates with an `acme-tls/1` handshake on gannet's
    TLS port (its HTTP-01 port leads nowhere), which gets RFC 8737's validation
    certificate; then the real certificate is served to ordinary clients."""
    need_pebble()
    tls_port = free_port()
    pebble = Pebble(tmp_path, free_port(), extra={"tlsPort": tls_port})
    try:
        conf = render(pebble, tls_port).replace("accept_terms_of_service;", "accept_terms_of_service; challenge tls-alpn-01;")
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
        assert leaf, srv.error_log() + pebble.log_path.read_text()
        log = pebble.log_path.read_text()
        assert "set VALID by completed challenge" in log and "validate w/ HTTP" not in log
        # Outside a validation, an `acme-tls/1` handshake gets no certificate.
        r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{tls_port}", "-servername", "localhost",
                            "-alpn", "acme-tls/1"], input=b"", capture_output=True, timeout=20)
        assert b"BEGIN CERTIFICATE" not in r.stdout
    finally:
        pebble.stop()


def test_ip_identifier(gannet, pebble, http_port):
    """An IP address identifier (RFC 8738): validated over HTTP-01 at that address, the
    certificate names it (and a client without SNI, connecting by address, verifies it)."""
    tls_port = free_port()
    conf = render(pebble, tls_port).replace("acme_certificate pebble;", "acme_certificate pebble 127.0.0.1;")
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)

    def by_address():
        r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{tls_port}", "-noservername",
                            "-CAfile", str(pebble.root), "-verify_return_error", "-verify_ip", "127.0.0.1"],
                           input=b"", capture_output=True, timeout=20)
        return r.returncode == 0 and r.stdout

    out = wait_until(by_address, deadline=60, every=0.5)
    assert out, srv.error_log()
    assert b"Verify return code: 0 (ok)" in out


def test_static_certificate_beside_acme_certificate(gannet, tmp_path, http_port):
    """`acme_certificate` with an ordinary `ssl_certificate` file (not the variable): the
    file's certificate is served, as in nginx, whatever ACME is doing."""
    tls_port = free_port()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(tmp_path / "s.key"), "-out", str(tmp_path / "s.crt"), "-days", "1",
                    "-subj", "/CN=static.test"], check=True, capture_output=True)
    conf = (render_for(f"https://127.0.0.1:{free_port()}/dir", tmp_path / "s.crt", tls_port)
            .replace("ssl_certificate $acme_certificate;", f"ssl_certificate {tmp_path}/s.crt;")
            .replace("ssl_certificate_key $acme_certificate_key;", f"ssl_certificate_key {tmp_path}/s.key;"))
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)
    r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{tls_port}", "-servername", "localhost"],
                       input=b"", capture_output=True, timeout=20)
    assert b"CN = static.test" in r.stdout or b"CN=static.test" in r.stdout, r.stdout[-500:]


def test_challenge_answered_whatever_the_locations_say(gannet, pebble, http_port):
    """The HTTP-01 answer comes from gannet itself: the plain-HTTP server's only location
    says 404, and Pebble's validation still succeeds (it would fail otherwise)."""
    tls_port = free_port()
    srv = gannet.start(conf=render(pebble, tls_port), port=http_port)
    wait_port(tls_port, srv.proc)
    assert wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
    # Unknown tokens fall through to the locations.
    status, _, _ = srv.get("/.well-known/acme-challenge/nope")
    assert status == 404


@pytest.mark.parametrize("directive,error", [
    ("acme_issuer x { }", '"acme_issuer" directive "uri" is missing'),
    ("acme_issuer x { uri https://a.test/d; uri; }", 'invalid number of arguments in "uri"'),
    ("acme_issuer x { uri https://a.test/d; challenge dns-01; }", "unsupported challenge: dns-01"),
    ("acme_issuer x { uri https://a.test/d; bogus 1; }", 'unknown directive "bogus"'),
    ("acme_shared_zone ngx_acme_shared:1M;", '"acme_shared_zone" must have "zone" parameter'),
    ("acme_issuer x { uri https://a.test/d; } acme_issuer x { uri https://b.test/d; }", '"acme_issuer" directive is duplicate'),
    ("acme_issuer x { uri https://a.test/d; external_account_key k data:!!; }", '"external_account_key" directive invalid base64url encoded value'),
    ("acme_issuer x { uri https://a.test/d; profile p maybe; }", 'invalid parameter "maybe"'),
    ("acme_issuer x { uri https://a.test/d; common_name_in_csr yes; }", 'it must be "on" or "off"'),
    ("acme_issuer x { uri https://a.test/d; ssl_verify maybe; }", 'invalid value "maybe" in "ssl_verify" directive'),
    ("acme_certificate x;", '"acme_certificate" directive is not allowed here'),
    ("acme_issuer x { uri https://a.test/d; renewal_check 500ms; }", '"renewal_check" directive invalid value'),
    ("acme_issuer x { uri https://a.test/d; renewal_check soon; }", '"renewal_check" directive invalid value'),
    ("acme_issuer x { uri https://a.test/d; state_path redis:nope; }", 'unknown redis_server "nope"'),
])
def test_issuer_config_errors(gannet, directive, error):
    r = gannet.check(http=directive)
    assert r.returncode != 0
    err = r.stderr
    assert error in err and "check.conf:" in err, err


def test_certificate_config_errors(gannet):
    # A valid config checks fine with `-t`, which orders nothing.
    r = gannet.check(http=f"acme_issuer a {{ uri https://a.test/d; state_path {gannet.tmp}/st; }}",
                     server="server_name example.test; acme_certificate a; ssl_certificate $acme_certificate; ssl_certificate_key $acme_certificate_key;")
    assert r.returncode == 0, r.stderr
    r = gannet.check(http="acme_issuer a { uri https://a.test/d; }",
                     server="server_name example.test; acme_certificate b;")
    assert r.returncode != 0 and 'issuer "b" is missing' in r.stderr, r.stderr
    r = gannet.check(http="acme_issuer a { uri https://a.test/d; }",
                     server="acme_certificate a key=dsa;")
    assert r.returncode != 0 and 'invalid "key" value' in r.stderr, r.stderr
    r = gannet.check(http="acme_issuer a { uri https://a.test/d; }",
                     server='server_name ""; acme_certificate a;')
    assert r.returncode != 0 and 'no identifiers found in "server_name"' in r.stderr, r.stderr


def test_ssl_verify_off_and_ecdsa_384_key(gannet, pebble, http_port):
    """`ssl_verify off`: the CA's HTTPS certificate (Pebble's, signed by its minica) is not
    checked, so no `ssl_trusted_certificate` is needed; with the default `ssl_verify on`
    and only the system's CAs, the same CA is refused and the failure logged. The
    certificate's key is `key=ecdsa:384`."""
    tls_port = free_port()
    base = render(pebble, tls_port).replace(f"ssl_trusted_certificate {pebble.minica};", "")
    srv = gannet.start(conf=base, port=http_port)
    wait_port(tls_port, srv.proc)
    assert wait_until(lambda: "retrying in 10s" in srv.error_log(), deadline=30), srv.error_log()
    assert s_client(tls_port, pebble.root).returncode != 0
    srv.stop()
    conf = (base.replace("accept_terms_of_service;", "accept_terms_of_service; ssl_verify off;")
            .replace("acme_certificate pebble;", "acme_certificate pebble key=ecdsa:384;"))
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)
    leaf = wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5)
    assert leaf, srv.error_log()
    text = subprocess.run(["openssl", "x509", "-noout", "-text"], input=(leaf + "-----END CERTIFICATE-----\n").encode(),
                          capture_output=True).stdout.decode()
    assert "secp384r1" in text or "P-384" in text, text


def test_preferred_chain(gannet, tmp_path, http_port):
    """Pebble with an alternate root offers two chains for each certificate: with
    `preferred_chain` naming the alternate root's common name, the chain served verifies
    against that root and not against the default one; without it, the default chain."""
    need_pebble()
    pebble = Pebble(tmp_path, http_port, env={"PEBBLE_ALTERNATE_ROOTS": "1"})
    try:
        alt_root = tmp_path / "alt-root.pem"
        alt_root.write_bytes(pebble.fetch_root(1))
        subject = subprocess.run(["openssl", "x509", "-noout", "-subject", "-nameopt", "multiline"], input=alt_root.read_bytes(),
                                 capture_output=True).stdout.decode()
        cn = next(l.split("=", 1)[1].strip() for l in subject.splitlines() if "commonName" in l)
        tls_port = free_port()
        conf = render(pebble, tls_port).replace("accept_terms_of_service;", f'accept_terms_of_service; preferred_chain "{cn}";')
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        assert wait_until(lambda: served_leaf(tls_port, alt_root), deadline=60, every=0.5), srv.error_log()
        assert served_leaf(tls_port, pebble.root) is None
        srv.stop()
        # The same CA without the directive: the default chain.
        conf = render(pebble, tls_port).replace("state_path {tmp}/acme;", "state_path {tmp}/acme2;")
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        assert wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5), srv.error_log()
        assert served_leaf(tls_port, alt_root) is None
    finally:
        pebble.stop()


def test_account_key_file(gannet, pebble, http_port, tmp_path):
    """`account_key FILE`: the account is made with that (PKCS#8 P-256) key, read as the
    config loads; no key of gannet's own is generated into the state folder."""
    key = tmp_path / "account.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
                   check=True, capture_output=True)
    tls_port = free_port()
    conf = render(pebble, tls_port).replace("accept_terms_of_service;", f"accept_terms_of_service; account_key {key};")
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)
    assert wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5), srv.error_log()
    assert not (srv.tmp / "acme" / "account.key").exists()


@pytest.mark.parametrize("directive,stored", [
    ("account_key ecdsa:384;", "ASN1 OID: secp384r1"),
    ("account_key rsa:2048;", "Private-Key: (2048 bit"),
])
def test_account_key_types(gannet, pebble, http_port, directive, stored):
    """`account_key ecdsa:384` / `rsa:2048`: the account is made with a key of that type
    (JWS ES384 / RS256, Pebble checking every signature), kept in the state folder and
    used again after a restart."""
    tls_port = free_port()
    conf = render(pebble, tls_port).replace("accept_terms_of_service;", f"accept_terms_of_service; {directive}")
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)
    assert wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5), srv.error_log()
    key = srv.tmp / "acme" / "account.key"
    text = subprocess.run(["openssl", "pkey", "-in", str(key), "-noout", "-text"], capture_output=True, text=True).stdout
    assert stored in text, text
    url = (srv.tmp / "acme" / "account.url").read_text()
    srv.stop()
    # A new certificate (another key type) after a restart is ordered with the same account.
    conf = conf.replace("acme_certificate pebble;", "acme_certificate pebble key=rsa:2048;")
    srv = gannet.start(conf=conf, port=http_port)
    wait_port(tls_port, srv.proc)
    assert wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5), srv.error_log()
    assert (srv.tmp / "acme" / "account.url").read_text() == url
    assert pebble.orders() == 2


def test_account_key_rsa_file_with_external_account_binding(gannet, tmp_path, http_port):
    """An RSA key file as the account key, at a CA that requires external account binding:
    the binding names the RSA key (Pebble checks it), and the certificate comes."""
    need_pebble()
    pebble = Pebble(tmp_path, http_port, extra={"externalAccountBindingRequired": True,
                                                "externalAccountMACKeys": {"kid-1": EAB_KEY}})
    try:
        key = tmp_path / "account.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(key)],
                       check=True, capture_output=True)
        tls_port = free_port()
        conf = render(pebble, tls_port).replace(
            "accept_terms_of_service;", f"accept_terms_of_service; account_key {key}; external_account_key kid-1 data:{EAB_KEY};")
        srv = gannet.start(conf=conf, port=http_port)
        wait_port(tls_port, srv.proc)
        assert wait_until(lambda: served_leaf(tls_port, pebble.root), deadline=60, every=0.5), \
            srv.error_log() + pebble.log_path.read_text()[-3000:]
    finally:
        pebble.stop()


def test_account_key_config_errors(gannet, tmp_path):
    dsa = tmp_path / "dsa.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ED25519", "-out", str(dsa)], check=True, capture_output=True)
    for directive, error in [
        (f"account_key {dsa};", f'cannot load account key "{dsa}": unsupported account key type'),
        ("account_key ecdsa:512;", f'cannot load account key "{tmp_path}'),
        (f"account_key {tmp_path}/nope.pem;", f'cannot load account key "{tmp_path}/nope.pem"'),
        (f"ssl_trusted_certificate {tmp_path}/nope.pem;", "trusted certificate"),
        ("preferred_chain;", 'invalid number of arguments in "preferred_chain"'),
    ]:
        r = gannet.check(http=f"acme_issuer x {{ uri https://a.test/d; {directive} }}")
        assert r.returncode != 0 and error in r.stderr and "check.conf:" in r.stderr, (directive, r.stderr)
