"""TLS for the `--tls`, `--h2` and `--h3` variants of a run.

- The transports a run can use: cleartext HTTP/1.1 (the studies' own), HTTPS/1.1, HTTP/2
  over TLS and HTTP/3 over QUIC, with the ALPN protocol the arena's clients offer for each.
- The run's test certificate: self-signed for 127.0.0.1 and localhost, ECDSA P-256 (or
  RSA-2048 with `--cert rsa`), made once per run with the openssl CLI; every server gets the
  same two files.
- Client contexts for the arena's own connections (probes, the c10k idle holder); they verify
  the server's certificate against that file, so a server serving anything else fails the probe.
- What each server negotiates, read once per server at the start with `openssl s_client`
  (protocol, cipher, ALPN, key exchange, signature), and whether it resumes a session (two
  connections from Python, the second offering the first one's session).
"""

from __future__ import annotations

import re
import socket
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from arena.errors import ArenaError
from arena.tools import require

TRANSPORTS = ("http", "tls", "h2", "h3")
LABELS = {"http": "HTTP/1.1 (cleartext)", "tls": "HTTPS/1.1 (HTTP/1.1 over TLS)", "h2": "HTTP/2 over TLS",
          "h3": "HTTP/3 over QUIC"}
# The one protocol the load tools offer in ALPN for each TLS transport (wrk offers none, which
# servers answer with HTTP/1.1; h3load offers h3 over QUIC).
ALPN = {"tls": "http/1.1", "h2": "h2", "h3": "h3"}
# What openssl s_client offers on the TCP port. An HTTP/3 server serves the same certificate
# over TCP on the same port number (where a browser first meets it), and the arena probes and
# waits for it there with HTTP/1.1; its QUIC side is probed by h3load (arena/runner.py).
TCP_ALPN = {"tls": "http/1.1", "h2": "h2", "h3": "http/1.1"}
CERT_KINDS = {
    "ecdsa": ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
    "rsa": ["-newkey", "rsa:2048"],
}
SUBJECT = "/CN=localhost"
# A server certificate, not a CA (Apache warns about a CA certificate as a server's).
EXTENSIONS = ("subjectAltName=IP:127.0.0.1,DNS:localhost", "basicConstraints=critical,CA:FALSE",
              "keyUsage=critical,digitalSignature,keyEncipherment", "extendedKeyUsage=serverAuth")


@dataclass(frozen=True)
class Certificate:
    kind: str            # "ecdsa" or "rsa"
    cert: Path
    key: Path
    command: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "cert": str(self.cert), "key": str(self.key),
                "command": " ".join(self.command)}


def check_transport(transport: str) -> str:
    if transport not in TRANSPORTS:
        raise ArenaError(f"unknown transport '{transport}': choose from {', '.join(TRANSPORTS)}")
    return transport


def make_certificate(folder: Path, kind: str = "ecdsa") -> Certificate:
    """cert.pem and key.pem in `folder`, made by `openssl req -x509`."""
    if kind not in CERT_KINDS:
        raise ArenaError(f"unknown certificate kind '{kind}': choose from {', '.join(CERT_KINDS)}")
    openssl = require("openssl")
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    cert, key = folder / "cert.pem", folder / "key.pem"
    cmd = (openssl, "req", "-x509", "-nodes", *CERT_KINDS[kind], "-keyout", str(key), "-out", str(cert),
           "-days", "30", "-subj", SUBJECT, *(arg for ext in EXTENSIONS for arg in ("-addext", ext)))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise ArenaError("openssl did not make the test certificate within 60 s") from None
    if done.returncode != 0 or not cert.is_file() or not key.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ArenaError(f"openssl could not make the test certificate: {last}")
    # A throwaway key for loopback tests. Servers that drop privileges (lighttpd re-reads its
    # files when they change) must still read it.
    cert.chmod(0o644)
    key.chmod(0o644)
    return Certificate(kind, cert, key, cmd)


def client_context(cafile: Path | None, alpn: list[str]) -> ssl.SSLContext:
    """A client context offering `alpn`; it verifies against `cafile` (the run's certificate)
    when given, else verifies nothing."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if cafile is not None:
        ctx.load_verify_locations(cafile=str(cafile))
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(alpn)
    return ctx


def connect(host: str, port: int, timeout: float, context: ssl.SSLContext | None = None) -> socket.socket:
    """A connected socket, wrapped in TLS (handshake done) when `context` is given."""
    raw = socket.create_connection((host, port), timeout=timeout)
    if context is None:
        return raw
    try:
        return context.wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise


def parse_s_client(text: str) -> dict:
    """What `openssl s_client` reports about a handshake."""
    out: dict = {"protocol": None, "cipher": None, "alpn": None, "key_exchange": None,
                 "signature": None, "server_key_bits": None, "verified": None}
    m = re.search(r"^(?:New|Reused), (TLSv[\d.]+|SSLv3), Cipher is (\S+)", text, re.MULTILINE)
    if m:
        out["protocol"], out["cipher"] = m.group(1), m.group(2)
    m = re.search(r"^ALPN protocol: (\S+)", text, re.MULTILINE)
    if m:
        out["alpn"] = m.group(1)
    m = re.search(r"^Server Temp Key: (.+)$", text, re.MULTILINE)
    if m:
        out["key_exchange"] = m.group(1).strip()
    m = re.search(r"^Peer signature type: (\S+)", text, re.MULTILINE)
    if m:
        out["signature"] = m.group(1)
    m = re.search(r"^Server public key is (\d+) bit", text, re.MULTILINE)
    if m:
        out["server_key_bits"] = int(m.group(1))
    m = re.search(r"Verify return code: (\d+) \(([^)]*)\)", text)
    if m:
        out["verified"] = m.group(1) == "0"
        out["verify_result"] = m.group(2)
    return out


def s_client(host: str, port: int, alpn: str, cafile: Path, timeout: float = 15) -> dict:
    """One handshake by `openssl s_client`, offering `alpn`, verifying against `cafile`."""
    cmd = [require("openssl"), "s_client", "-connect", f"{host}:{port}", "-alpn", alpn,
           "-CAfile", str(cafile), "-verify_ip", host]
    try:
        # stdin at EOF: s_client shakes hands, reads what the server sends at once (TLS 1.3
        # tickets), and quits.
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"openssl s_client did not finish within {timeout:.0f} s"}
    info = parse_s_client(done.stdout)
    if info["protocol"] is None:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        info["error"] = f"no handshake: {last[0]}"
    return info


def _fetch(host: str, port: int, ctx: ssl.SSLContext, session, timeout: float):
    """GET /robots.txt over a new TLS connection, read to the end: (its session, reused?)."""
    request = f"GET /robots.txt HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
    raw = socket.create_connection((host, port), timeout=timeout)
    try:
        sock = ctx.wrap_socket(raw, server_hostname=host, session=session)
    except BaseException:
        raw.close()
        raise
    with sock:
        sock.sendall(request)
        try:
            while sock.recv(65536):
                pass
        except ssl.SSLEOFError:
            pass  # a close without close_notify ends the reply as well
        # Taken after the reply: a TLS 1.3 server sends its tickets after the handshake.
        return sock.session, sock.session_reused


def resumes(host: str, port: int, cafile: Path, timeout: float = 10) -> bool | None:
    """Whether a second connection offering the first one's session is resumed; None if the
    probe itself failed."""
    ctx = client_context(cafile, ["http/1.1"])
    try:
        session, _ = _fetch(host, port, ctx, None, timeout)
        _, reused = _fetch(host, port, ctx, session, timeout)
    except OSError:
        return None
    return bool(reused)


def server_record(host: str, port: int, transport: str, cafile: Path) -> dict:
    """What one server negotiates over TCP with a client offering the transport's ALPN, and
    whether it resumes sessions."""
    info = s_client(host, port, TCP_ALPN[transport], cafile)
    info["alpn_offered"] = TCP_ALPN[transport]
    info["resumes_sessions"] = resumes(host, port, cafile)
    return info
