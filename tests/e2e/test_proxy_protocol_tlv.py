"""`$proxy_protocol_tlv_NAME` (nginx 1.23.2, http and stream): the TLVs of a PROXY protocol
version 2 header, by name (`alpn`, `authority`, `unique_id`, `netns`, `ssl`, and inside the
SSL TLV `ssl_version`, `ssl_cn`, `ssl_cipher`, `ssl_sig_alg`, `ssl_key_alg`, `ssl_verify`) or
by number (`0x..`, `ssl_0x..`). Debian's nginx 1.22 predates the variables (it refuses the
config), so the values expected are those of nginx's ngx_proxy_protocol_get_tlv, read off
its source: the TLV's bytes as sent, the first of a type, "not found" (empty, `-` in a log)
without one.
"""

from __future__ import annotations

import socket
import struct

from conftest import free_port
from nginx_peer import parse

V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def tlv(t: int, value: bytes) -> bytes:
    return bytes([t]) + struct.pack("!H", len(value)) + value


def header(tlvs: bytes) -> bytes:
    body = socket.inet_aton("192.0.2.1") + socket.inet_aton("192.0.2.2") + struct.pack("!HH", 123, 5678) + tlvs
    return V2_SIG + bytes([0x21, 0x11]) + struct.pack("!H", len(body)) + body


def ssl_tlv(verify: int, sub: bytes) -> bytes:
    return tlv(0x20, struct.pack("!BI", 0x01, verify) + sub)


SUB = (tlv(0x21, b"TLSv1.3") + tlv(0x22, b"client.example") + tlv(0x23, b"TLS_AES_128_GCM_SHA256")
       + tlv(0x24, b"ECDSA-SHA256") + tlv(0x25, b"EC256"))
FULL = (tlv(0x01, b"h2") + tlv(0x02, b"api.example") + tlv(0x03, b"\x01\x02\x03\x04") + tlv(0x05, b"req-42")
        + tlv(0x01, b"second-alpn") + ssl_tlv(7, SUB) + tlv(0x30, b"ns1") + tlv(0xae, b"custom")
        + tlv(0xe0, b""))

# (header line name, variable expression, value with FULL, value with no TLVs)
SHOWN = [
    ("alpn", "$proxy_protocol_tlv_alpn-$proxy_protocol_tlv_0x01-$proxy_protocol_tlv_0x1", "h2-h2-h2", "--"),
    ("authority", "$proxy_protocol_tlv_authority-$proxy_protocol_tlv_0x02", "api.example-api.example", "-"),
    ("unique", "$proxy_protocol_tlv_unique_id-$proxy_protocol_tlv_0x05", "req-42-req-42", "-"),
    ("netns", "$proxy_protocol_tlv_netns-$proxy_protocol_tlv_0x30", "ns1-ns1", "-"),
    ("verify", "$proxy_protocol_tlv_ssl_verify", "7", ""),
    ("version", "$proxy_protocol_tlv_ssl_version-$proxy_protocol_tlv_ssl_0x21", "TLSv1.3-TLSv1.3", "-"),
    ("cn", "$proxy_protocol_tlv_ssl_cn", "client.example", ""),
    ("cipher", "$proxy_protocol_tlv_ssl_cipher", "TLS_AES_128_GCM_SHA256", ""),
    ("sigalg", "$proxy_protocol_tlv_ssl_sig_alg", "ECDSA-SHA256", ""),
    ("keyalg", "$proxy_protocol_tlv_ssl_key_alg", "EC256", ""),
    # Numbers take any count of hex digits, either case.
    ("custom", "$proxy_protocol_tlv_0x000ae-$proxy_protocol_tlv_0xAE", "custom-custom", "-"),
    # None of these is there: an absent type, one beyond a byte, a top-level name inside
    # the SSL TLV, and names nginx does not know (logged).
    ("absent", "[$proxy_protocol_tlv_0x0e|$proxy_protocol_tlv_0x120|$proxy_protocol_tlv_ssl_alpn"
               "|$proxy_protocol_tlv_bogus|$proxy_protocol_tlv_0x]", "[||||]", "[||||]"),
]


def http_conf() -> str:
    headers = "\n".join(f'add_header X-{name} "{expr}";' for name, expr, _, _ in SHOWN)
    return f"""
        error_log {{tmp}}/error.log info;
        events {{}}
        http {{
            log_format tlv '"$proxy_protocol_tlv_alpn" "$proxy_protocol_tlv_ssl_cn" "$proxy_protocol_tlv_0xe0"';
            access_log {{tmp}}/access.log tlv;
            map $proxy_protocol_tlv_ssl $ssl_binary {{
                "~^\\x01\\x00\\x00\\x00" "flags-and-verify";
                default "none";
            }}
            server {{
                listen 127.0.0.1:{{port}} proxy_protocol;
                location / {{
                    {headers}
                    add_header X-binary $ssl_binary;
                    return 204;
                }}
            }}
        }}"""


def request(port: int, pp: bytes, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(pp + data)
        return b"".join(iter(lambda: s.recv(65536), b""))


def test_http_variables(gannet):
    srv = gannet.start(conf=http_conf())
    get = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    full = parse(request(srv.port, header(FULL), get))
    assert full.status == 204
    for name, _, want, _ in SHOWN:
        assert full.headers[f"x-{name}"] == want, name
    assert full.headers["x-binary"] == "flags-and-verify"
    # A version 2 header without TLVs, and a version 1 header (which has none).
    for pp in (header(b""), b"PROXY TCP4 192.0.2.1 192.0.2.2 123 5678\r\n"):
        empty = parse(request(srv.port, pp, get))
        for name, _, _, want in SHOWN:
            assert empty.headers.get(f"x-{name}", "") == want, (name, pp)
        assert empty.headers["x-binary"] == "none"
    srv.stop()
    # Found but empty (0xe0) is "", not found is "-".
    assert (srv.tmp / "access.log").read_text().splitlines() == [
        '"h2" "client.example" ""', '"-" "-" "-"', '"-" "-" "-"']
    log = (srv.tmp / "error.log").read_text()
    assert 'unknown PROXY protocol TLV "bogus"' in log
    assert 'invalid PROXY protocol TLV "0x"' in log


def test_http_broken_tlv_list(gannet):
    """A TLV list cut short: a TLV before the break is found, one after is not (logged)."""
    srv = gannet.start(conf="""
        error_log {tmp}/error.log info;
        events {}
        http { server { listen 127.0.0.1:{port} proxy_protocol;
            location / { return 200 "[$proxy_protocol_tlv_alpn|$proxy_protocol_tlv_authority]"; } } }""")
    cut = tlv(0x01, b"h2") + b"\x02\x00\x09abc"
    raw = request(srv.port, header(cut), b"GET / HTTP/1.0\r\n\r\n")
    assert parse(raw).body == b"[h2|]"
    assert "broken PROXY protocol TLV" in (srv.tmp / "error.log").read_text()


def test_stream_variables(gannet):
    exprs = "\n".join(f"{name}:{expr}" for name, expr, _, _ in SHOWN)
    srv = gannet.start(conf=f"""
        error_log {{tmp}}/error.log info;
        events {{}}
        stream {{
            log_format tlv "$proxy_protocol_tlv_authority $proxy_protocol_tlv_0x05";
            access_log {{tmp}}/stream.log tlv;
            map $proxy_protocol_tlv_ssl $ssl_binary {{
                "~^\\x01\\x00\\x00\\x00" "flags-and-verify";
                default "none";
            }}
            server {{
                listen 127.0.0.1:{{port}} proxy_protocol;
                return "{exprs}
binary:$ssl_binary
";
            }}
        }}""")
    lines = request(srv.port, header(FULL), b"").decode().splitlines()
    assert lines == [f"{name}:{want}" for name, _, want, _ in SHOWN] + ["binary:flags-and-verify"]
    lines = request(srv.port, header(b""), b"").decode().splitlines()
    assert lines == [f"{name}:{want}" for name, _, _, want in SHOWN] + ["binary:none"]
    srv.stop()
    # (The harness's own connect, waiting for the port, is logged first.)
    assert (srv.tmp / "stream.log").read_text().splitlines()[-2:] == ["api.example req-42", "- -"]


def test_stream_big_header(gannet):
    """A header of a few KB of TLVs (nginx's test sends one near a kilobyte) is read whole."""
    srv = gannet.start(conf="""
        events {}
        stream { server { listen 127.0.0.1:{port} proxy_protocol; return "$proxy_protocol_tlv_0x99"; } }""")
    big = b"".join(tlv(0xe1, b"p" * 200) for _ in range(15)) + tlv(0x99, b"last")
    assert request(srv.port, header(big), b"") == b"last"


def test_names_are_not_config_errors(gannet):
    """Any NAME loads (nginx resolves it per connection); outside a PROXY listener the
    variables are simply not found."""
    plain = free_port()
    srv = gannet.start(conf=f"""
        events {{}}
        http {{ server {{ listen 127.0.0.1:{{port}}; listen 127.0.0.1:{plain};
            location / {{ return 200 "[$proxy_protocol_tlv_whatever$proxy_protocol_tlv_alpn]"; }} }} }}""")
    assert parse(request(plain, b"", b"GET / HTTP/1.0\r\n\r\n")).body == b"[]"
