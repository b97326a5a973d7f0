"""`listen ... proxy_protocol`: a load balancer's PROXY protocol header (v1 text, v2 binary)
ahead of the client's request. One config on gannet and Debian's nginx, the same header
bytes sent to both, and every answer compared - `$proxy_protocol_addr`, `_port`,
`_server_addr`, `_server_port`, `$remote_addr` / `$remote_port` with and without
`real_ip_header proxy_protocol`, `deny` by the header's client - plus the access logs;
broken headers close the connection unanswered with nginx's error-log line. Over TLS,
HTTP/2 and h2c curl's own `--haproxy-protocol` is the load balancer.
"""

from __future__ import annotations

import re
import socket
import struct
import subprocess

import pytest

from conftest import free_port
from nginx_peer import NGINX, PEER_MAIN, check_both, exchange_from, parse, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

SHOW = (r'"$remote_addr|$remote_port|$proxy_protocol_addr|$proxy_protocol_port|'
        r'$proxy_protocol_server_addr|$proxy_protocol_server_port|$realip_remote_addr\n"')

CONF = PEER_MAIN + r"""
http {
    log_format pp '$remote_addr $proxy_protocol_addr:$proxy_protocol_port $status $request_uri';
    access_log {tmp}/access.log pp;
    server {
        listen 127.0.0.1:{port} proxy_protocol;
        location / { return 200 SHOW; }
        # The location's realip runs after the rewrite phase, where `return` answers: a
        # file is served, the variables shown in a header.
        location /real/ {
            set_real_ip_from 127.0.0.2;
            real_ip_header proxy_protocol;
            root {root};
            add_header X-Show SHOW_H;
        }
        # `return` would answer before the access phase: a file is served instead.
        location /deny/ {
            set_real_ip_from 127.0.0.0/8;
            real_ip_header proxy_protocol;
            deny 192.0.2.0/24;
            root {root};
        }
    }
}
""".replace("SHOW_H", SHOW.replace(r"\n", "")).replace("SHOW", SHOW)

V2_SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def v2(command: int, family_transport: int, body: bytes) -> bytes:
    return V2_SIG + bytes([0x20 | command, family_transport]) + struct.pack("!H", len(body)) + body


def v2_inet(src: str, dst: str, sport: int, dport: int, tlvs: bytes = b"") -> bytes:
    return v2(1, 0x11, socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!HH", sport, dport) + tlvs)


def v2_inet6(src: str, dst: str, sport: int, dport: int) -> bytes:
    addrs = socket.inet_pton(socket.AF_INET6, src) + socket.inet_pton(socket.AF_INET6, dst)
    return v2(1, 0x21, addrs + struct.pack("!HH", sport, dport))


def unanswered(s: socket.socket) -> bool:
    """The server closed the connection without a byte (a reset when it left ours unread)."""
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True


def get(port: int, header: bytes, path: str = "/", source: str = "127.0.0.1") -> bytes:
    """The answer to one GET behind `header`: its body (our port shown as PEER) or status."""
    raw, own = exchange_from(port, header + f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode(), source)
    if not raw:
        return b"closed"
    a = parse(raw)
    if a.status != 200:
        return str(a.status).encode()
    shown = a.headers["x-show"].encode() + b"\n" if "x-show" in a.headers else a.body
    return re.sub(rb"\b%d\b" % own, b"PEER", shown)


CASES = [
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n", "/", "127.0.0.1"),
    # The text is kept as written (nginx checks only its characters).
    (b"PROXY TCP6 2001:DB8:0:0:0:0:0:1 ::1 1 8443\r\n", "/", "127.0.0.1"),
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 0 65535\r\n", "/", "127.0.0.1"),
    (b"PROXY UNKNOWN\r\n", "/", "127.0.0.1"),
    (b"PROXY UNKNOWN TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "/", "127.0.0.1"),
    (v2_inet("203.0.113.9", "198.51.100.2", 40000, 80), "/", "127.0.0.1"),
    (v2_inet6("2001:db8::77", "2001:db8:0:1::1", 40001, 443), "/", "127.0.0.1"),
    (v2_inet("203.0.113.9", "198.51.100.2", 40000, 80, tlvs=b"\x04\x00\x03abc\x05\x00\x02id"), "/", "127.0.0.1"),
    (v2(0, 0x00, b""), "/", "127.0.0.1"),  # LOCAL: the proxy's own health check
    (v2(1, 0x12, socket.inet_aton("1.1.1.1") * 2 + b"\0\1\0\2"), "/", "127.0.0.1"),  # UDP
    # real_ip_header proxy_protocol: trusted (127.0.0.2) or not (127.0.0.1).
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n", "/real/f.txt", "127.0.0.2"),
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n", "/real/f.txt", "127.0.0.1"),
    (v2_inet6("2001:db8::77", "2001:db8:0:1::1", 40001, 443), "/real/f.txt", "127.0.0.2"),
    (b"PROXY UNKNOWN\r\n", "/real/f.txt", "127.0.0.2"),
    (b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n", "/deny/f.txt", "127.0.0.1"),
    (b"PROXY TCP4 203.0.113.7 198.51.100.1 56324 443\r\n", "/deny/f.txt", "127.0.0.1"),
]

BROKEN = [
    b"",  # a plain request where a header must come first
    b"PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n",
    b"PROXY TCP4 host.example 5.6.7.8 1 2\r\n",
    b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n",
]


def test_proxy_protocol_is_nginx_proxy_protocol(tmp_path):
    with side_by_side(tmp_path, CONF, {"deny/f.txt": "let in\n", "real/f.txt": "real\n"}) as (srv, nginx_port):
        answers = []
        for header, path, source in CASES:
            ours = get(srv.port, header, path, source)
            assert ours == get(nginx_port, header, path, source), (header, path, source)
            answers.append(ours)
        assert answers[0] == b"127.0.0.1|PEER|192.0.2.7|56324|198.51.100.1|443|127.0.0.1\n"
        assert answers[3] == b"127.0.0.1|PEER|||||127.0.0.1\n"
        assert answers[10] == b"192.0.2.7|56324|192.0.2.7|56324|198.51.100.1|443|127.0.0.2\n"
        assert answers[14] == b"403" and answers[15] == b"let in\n"
        assert len(set(answers)) == 11, answers  # UNKNOWN, LOCAL, UDP alike; TLVs change nothing
        for header in BROKEN:
            ours = get(srv.port, header)
            assert ours == get(nginx_port, header) == b"closed", header
        srv.stop()
        ours = (srv.tmp / "access.log").read_text().splitlines()
        theirs = (tmp_path / "nginx" / "access.log").read_text().splitlines()
        assert len(ours) == len(theirs) == len(CASES)
        # One known difference: a port of 0 is an empty value to both, which nginx logs as
        # nothing and gannet, as for every empty value, as "-".
        assert ours[2] == "127.0.0.1 192.0.2.7:- 200 /" and theirs[2] == "127.0.0.1 192.0.2.7: 200 /"
        assert ours[:2] + ours[3:] == theirs[:2] + theirs[3:]

        def broken(path):
            """(what the line shows up to its first CR or LF, client, server) per broken
            header: nginx 1.22 logs all it read, CRLFs included; gannet, as later nginx
            versions, the first line only (no raw line breaks in the error log)."""
            found = re.findall(r'\[error\] \d+#\d+: \*\d+ broken header: "([^\r\n]*)[^"]*" '
                               r"while reading PROXY protocol, client: (\S+), server: (\S+)", path.read_text())
            return [(shown, client, server.rsplit(":", 1)[0]) for shown, client, server in found]

        ours = broken(srv.tmp / "error.log")
        assert ours == broken(tmp_path / "nginx" / "error.log")
        assert ours[1] == ("PROXY TCP5 1.2.3.4 5.6.7.8 1 2", "127.0.0.1", "127.0.0.1")
        assert len(ours) == len(BROKEN)


def test_header_in_pieces_and_a_slow_proxy(gannet):
    """nginx 1.22 parses only its first read (a header split across segments is "broken"
    there); gannet waits for the rest, and closes a connection whose header never comes."""
    srv = gannet.start(conf=f"""
        error_log {{tmp}}/error.log info;
        events {{}}
        http {{
            client_header_timeout 1s;
            server {{ listen 127.0.0.1:{{port}} proxy_protocol; location / {{ return 200 "$proxy_protocol_addr\\n"; }} }}
        }}""")
    for header in (b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n", v2_inet("203.0.113.9", "198.51.100.2", 1, 2)):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(0, len(header), 7):
                s.sendall(header[i:i + 7])
            s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            raw = b"".join(iter(lambda: s.recv(65536), b""))
        assert parse(raw).body in (b"192.0.2.7\n", b"203.0.113.9\n")
    # A header that stops half-way: closed at client_header_timeout, nothing answered.
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
        s.sendall(b"PROXY TCP4 192.0.2.7")
        assert unanswered(s)
    assert "client timed out while reading PROXY protocol" in (srv.tmp / "error.log").read_text()


def test_client_that_stops_mid_header(gannet):
    """A half header, then the client's FIN: the header can never complete, so the
    connection is closed at once as broken - not at client_header_timeout (a minute here),
    and without spinning on the socket's lasting read-closed readiness meanwhile."""
    srv = gannet.start(conf="""
        error_log {tmp}/error.log info;
        events {}
        http { server { listen 127.0.0.1:{port} proxy_protocol; location / { return 200; } } }""")
    for partial in (b"PROXY TCP4 1.2", v2_inet("203.0.113.9", "198.51.100.2", 1, 2)[:20]):
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(partial)
            s.shutdown(socket.SHUT_WR)
            # Within the 5 s socket timeout, not the 60 s one; unread bytes make it a reset.
            assert unanswered(s)
    log = (srv.tmp / "error.log").read_text()
    assert 'broken header: "PROXY TCP4 1.2" while reading PROXY protocol, client: 127.0.0.1' in log
    assert log.count("broken header: ") == 2


def test_tls_http2_and_h2c_behind_a_proxy(gannet, tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem"), "-days", "2",
                    "-subj", "/CN=localhost"], check=True, capture_output=True)
    show = r'"$proxy_protocol_addr $proxy_protocol_port $server_protocol $https\n"'
    h2c = free_port()
    srv = gannet.start(conf=f"""
        error_log {{tmp}}/error.log;
        events {{}}
        http {{
            server {{
                listen 127.0.0.1:{{port}} ssl proxy_protocol;
                listen 127.0.0.1:{h2c} http2 proxy_protocol;
                http2 on;
                ssl_certificate {tmp_path}/c.pem; ssl_certificate_key {tmp_path}/k.pem;
                location / {{ return 200 {show}; }}
            }}
        }}""")
    for args, url, protocol in ((["--http1.1"], f"https://localhost:{srv.port}/", "HTTP/1.1 on"),
                                (["--http2"], f"https://localhost:{srv.port}/", "HTTP/2.0 on"),
                                (["--http2-prior-knowledge"], f"http://localhost:{h2c}/", "HTTP/2.0 ")):
        out = subprocess.run(["curl", "-sk", "--haproxy-protocol", *args, "-w", " %{local_port}", url],
                             capture_output=True, text=True, timeout=10)
        body, local_port = out.stdout.rsplit(" ", 1)
        assert body == f"127.0.0.1 {local_port} {protocol}\n", out
    # Without the header, the ClientHello is a broken header: no handshake, no answer.
    out = subprocess.run(["curl", "-sk", f"https://localhost:{srv.port}/"], capture_output=True, timeout=10)
    assert out.returncode == 35, out  # curl's "SSL connect error"
    assert "broken header: " in (srv.tmp / "error.log").read_text()


def test_listen_flags_and_config(tmp_path):
    n, g = check_both(tmp_path, """
        server { listen 127.0.0.1:3 proxy_protocol; real_ip_header proxy_protocol; set_real_ip_from 10.0.0.0/8; }
        server { listen 127.0.0.1:3; }""")
    assert n.returncode == 0 and g.returncode == 0, (n.stderr, g.stderr)
    n, g = check_both(tmp_path, "server { listen 127.0.0.1:3 proxy_protocol=on; }")
    assert n.returncode != 0 and 'invalid parameter "proxy_protocol=on"' in n.stderr, n.stderr
    assert g.returncode != 0 and re.search(r'check\.conf:\d+: invalid parameter "proxy_protocol=on"', g.stderr), g.stderr
