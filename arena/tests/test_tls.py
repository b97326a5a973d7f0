"""The TLS pieces of the arena: h2load's report of a TLS run (HTTPS/1.1 and HTTP/2, captured
from nginx by tests/capture_fixtures.py), its command line for each variant, openssl
s_client's report, and the c10k holder's bit of HTTP/2 - checked on its own and against
Caddy, whose Go HPACK encoder Huffman-codes a 301."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from arena import ports, tls
from arena.clients import h2load, idle
from conftest import fixture_text

IMAGE = 403456


def test_h2load_https_new_connection_run():
    res = h2load.parse(fixture_text("h2load_tls_close.txt"), fixture_text("h2load_tls_close.log"))
    assert res.requests == 200 and res.sent == 200
    assert res.failures == 0 and res.socket_errors == 0
    assert res.body_bytes == 200 * IMAGE
    assert res.header_bytes == 37600
    assert res.rps == pytest.approx(376.08)
    assert res.extra["tls_protocol"] == "TLSv1.3"
    assert res.extra["tls_cipher"] == "TLS_AES_128_GCM_SHA256"
    assert res.extra["tls_key_exchange"] == "X25519 253 bits"
    assert res.extra["application_protocol"] == "http/1.1"
    # From the per-request log, in microseconds (the summary rounds to 25.43ms).
    assert res.latency_ms["max"] == pytest.approx(25.43, abs=0.01)
    assert 2.98 <= res.latency_ms["p50"] <= res.latency_ms["p99"] <= res.latency_ms["max"]


def test_h2load_http2_run():
    res = h2load.parse(fixture_text("h2load_h2.txt"))
    assert res.requests == 300 and res.failures == 0
    assert res.extra["application_protocol"] == "h2"
    assert res.extra["tls_protocol"] == "TLSv1.3"
    # HTTP/2: the body bytes are the DATA frames' payload, exact; headers are HPACK-compressed.
    assert res.body_bytes == 300 * IMAGE
    assert res.header_bytes == 33900
    assert res.latency_ms["mean"] == pytest.approx(57.22)


def test_h2load_cleartext_run_reports_no_tls():
    res = h2load.parse(fixture_text("h2load_close.txt"))
    assert res.extra["application_protocol"] == "http/1.1"
    assert "tls_protocol" not in res.extra and "tls_cipher" not in res.extra


def test_h2load_command_per_variant():
    plain = h2load.command("https://127.0.0.1:8443/img.jpg", 10, 500, close=True)
    assert "--h1" in plain and "-m" not in plain and plain[-1] == "https://127.0.0.1:8443/img.jpg"
    assert plain[plain.index("-H") + 1] == "Connection: close"
    h2 = h2load.command("https://127.0.0.1:8443/img.jpg", 10, 500, http2=True, streams=10)
    assert "--npn-list=h2" in h2 and "--h1" not in h2
    assert h2[h2.index("-m") + 1] == "10"
    one = h2load.command("https://127.0.0.1:8443/img.jpg", 10, 500, http2=True)
    assert "-m" not in one  # h2load's default: one stream at a time


def test_s_client_report():
    info = tls.parse_s_client(fixture_text("s_client_h2.txt"))
    assert info == {"protocol": "TLSv1.3", "cipher": "TLS_AES_256_GCM_SHA384", "alpn": "h2",
                    "key_exchange": "X25519, 253 bits", "signature": "ECDSA", "server_key_bits": 256,
                    "verified": True, "verify_result": "ok"}


def test_s_client_report_without_a_handshake():
    info = tls.parse_s_client("CONNECTED(00000003)\n---\nno peer certificate available\n")
    assert info["protocol"] is None and info["alpn"] is None and info["verified"] is None


@pytest.mark.parametrize("block, status", [
    (b"\x88", 200),                          # indexed, static table
    (b"\x8d\x5f\x8b", 404),                  # indexed 404, then more fields
    (b"\x3f\xe1\x1f\x88", 200),              # a dynamic table size update first
    (b"\x08\x03403", 403),                   # literal without indexing, name :status, raw value
    (b"\x48\x03302", 302),                   # literal with incremental indexing, raw value
    (b"\x48\x82\x10\x01", 200),              # Huffman-coded "200": 00010 00000 00000 + 1 bit of padding
    (b"\x18\x83\x68\x0d\x7f", 404),          # never indexed; Huffman "404": 011010 00000 011010 + padding
])
def test_hpack_status(block, status):
    assert idle.response_status(block) == status


@pytest.mark.parametrize("block", [b"\x82", b"\x04\x01/", b"\x48\x82\xff\xff"])
def test_hpack_status_refuses_what_is_not_a_status(block):
    with pytest.raises(ValueError):
        idle.response_status(block)


def test_request_headers_encoding():
    block = idle.request_headers("127.0.0.1:8443", "/index.html")
    assert block == b"\x82\x87\x04\x0b/index.html\x01\x0e127.0.0.1:8443"
    long = idle.request_headers("h", "/" + "a" * 200)
    assert long[2:5] == b"\x04\x7f\x4a"  # 201 = 127 + 74: the 7-bit prefix full, then 74


def test_h2_exchange_against_caddy_huffman_status(tmp_path):
    """Caddy (Go's HPACK) sends a 301's :status as a Huffman-coded literal."""
    folder = tmp_path / "caddy"
    folder.mkdir()
    cert = tls.make_certificate(folder / "tls")
    port = ports.free_port()
    (folder / "Caddyfile").write_text(
        "{\n\tadmin off\n\tauto_https off\n\tstorage file_system %s/data\n\tservers {\n\t\tprotocols h1 h2\n\t}\n}\n"
        "https://127.0.0.1:%d {\n\tbind 127.0.0.1\n\ttls %s %s\n\tredir /moved /index.html 301\n"
        "\trespond /hello \"hello\" 200\n}\n" % (folder, port, cert.cert, cert.key))
    proc = subprocess.Popen(["caddy", "run", "--config", str(folder / "Caddyfile"), "--adapter", "caddyfile"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={"HOME": str(folder)})
    try:
        deadline = time.monotonic() + 20
        while not ports.is_listening(port):
            assert proc.poll() is None and time.monotonic() < deadline, "caddy did not start"
            time.sleep(0.05)  # poll interval under a deadline

        async def get(path):
            context = tls.client_context(cert.cert, ["h2"])
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                           server_hostname="127.0.0.1")
            try:
                return await asyncio.wait_for(idle.h2_exchange(reader, writer, f"127.0.0.1:{port}", path), 10)
            finally:
                writer.close()

        assert asyncio.run(get("/moved")) == (301, 0)
        assert asyncio.run(get("/hello")) == (200, 5)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
