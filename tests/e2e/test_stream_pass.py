"""Stream `pass` (nginx 1.25.5's ngx_stream_pass_module): a stream server hands its
client's connection to another listener of the config - http most often - chosen by SNI
(`ssl_preread` peeking at the ClientHello, or `listen ... ssl` terminating TLS) or by
variables. Debian's nginx 1.22 has no `pass` (it refuses the config), so what is checked
is nginx's handler read off its source: the passed connection is served by its new
listener with the pass address as its local one, the cases nginx refuses end with 500
(and 200 for an address no listen has), and a passed session has no access-log line.
"""

from __future__ import annotations

import socket
import ssl
import subprocess

import pytest

from conftest import free_port, wait_until
from nginx_peer import parse
from test_tls import Pki

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="needs the openssl command-line tool",
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.issue("site", "localhost", sans=("localhost", "sni.test", "other.test"))
    return p


def https_get(port: int, name: str | None, path: str = "/") -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname=name) as s:
                s.sendall(f"GET {path} HTTP/1.0\r\nHost: a\r\n\r\n".encode())
                return b"".join(iter(lambda: s.recv(65536), b""))
        except (ssl.SSLError, ConnectionResetError):
            return b""


def http_get(port: int, path: str = "/") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: a\r\n\r\n".encode())
        try:
            return b"".join(iter(lambda: s.recv(65536), b""))
        except ConnectionResetError:
            return b""


SHOW = r'"$server_addr:$server_port https=$https $ssl_server_name\n"'


def test_pass_by_sni_and_by_variable(gannet, pki):
    tls_port, plain, wild, var, lost, bad = (free_port() for _ in range(6))
    h_tls, h_plain = free_port(), free_port()
    srv = gannet.start(conf=f"""
        error_log {{tmp}}/error.log info;
        events {{}}
        stream {{
            log_format st "$server_port $status";
            access_log {{tmp}}/stream.log st;
            map $server_port $to {{
                {var} 127.0.0.1:{h_plain};
                {lost} 127.0.0.1:1;
                default "127.0.0.1";
            }}
            # Plain: the ClientHello (or an HTTP request) is peeked at, SNI chooses.
            server {{
                listen 127.0.0.1:{{port}};
                listen 127.0.0.1:{tls_port} ssl;
                ssl_preread on;
                ssl_certificate {pki.path("site.pem")};
                ssl_certificate_key {pki.path("site.key")};
                pass 127.0.0.1:{h_plain};
            }}
            server {{
                listen 127.0.0.1:{{port}};
                server_name sni.test;
                pass 127.0.0.1:{h_tls};
            }}
            # TLS terminated here, then passed to the cleartext listener.
            server {{
                listen 127.0.0.1:{tls_port} ssl;
                server_name sni.test;
                pass 127.0.0.1:{h_plain};
            }}
            # A wildcard http listen takes the address passed to; it is the local one.
            server {{ listen 127.0.0.1:{wild}; pass 127.0.0.2:{h_plain}; }}
            server {{ listen 127.0.0.1:{var}; pass $to; }}
            server {{ listen 127.0.0.1:{lost}; pass $to; }}
            server {{ listen 127.0.0.1:{bad}; pass $to; }}
        }}
        http {{
            log_format h "$server_port $status";
            access_log {{tmp}}/http.log h;
            server {{
                listen 127.0.0.1:{h_tls} ssl;
                listen *:{h_plain};
                ssl_certificate {pki.path("site.pem")};
                ssl_certificate_key {pki.path("site.key")};
                location / {{ return 200 {SHOW}; }}
            }}
        }}""")
    # Plain HTTP peeked at (not a ClientHello): the default server passes it on.
    assert parse(http_get(srv.port)).body == f"127.0.0.1:{h_plain} https= \n".encode()
    # TLS with SNI through the plain stream port: the http listener does the handshake.
    assert parse(https_get(srv.port, "sni.test")).body == f"127.0.0.1:{h_tls} https=on sni.test\n".encode()
    # Without SNI the default server passes the ClientHello to the cleartext listener.
    assert https_get(srv.port, None) == b""
    # TLS terminated by the stream server: http answers over that TLS session.
    assert parse(https_get(tls_port, "sni.test")).body == f"127.0.0.1:{h_plain} https=on sni.test\n".encode()
    # ssl_preread over a terminated session reads the request: it cannot be passed.
    assert https_get(tls_port, "other.test") == b""
    assert parse(http_get(wild)).body == f"127.0.0.2:{h_plain} https= \n".encode()
    assert parse(http_get(var)).body == f"127.0.0.1:{h_plain} https= \n".encode()
    assert http_get(lost) == b""
    assert http_get(bad) == b""
    wait_until(lambda: len((srv.tmp / "stream.log").read_text().splitlines()) == 4)
    srv.stop()
    # Only the sessions that were not passed are logged (the harness's connect, which
    # waited for the port and sent nothing, ends at the preread with 200).
    assert sorted((srv.tmp / "stream.log").read_text().splitlines()) == sorted([
        f"{srv.port} 200", f"{tls_port} 500", f"{lost} 200", f"{bad} 500"])
    # The ClientHello passed to the cleartext listener is a bad request there.
    assert sorted((srv.tmp / "http.log").read_text().splitlines()) == sorted(
        [f"{h_plain} 200"] * 4 + [f"{h_tls} 200", f"{h_plain} 400"])
    log = (srv.tmp / "error.log").read_text()
    assert "cannot pass connection with preread data while passing connection to port" in log
    assert 'port not found for "127.0.0.1:1"' in log
    assert 'no port in pass "127.0.0.1"' in log


def test_pass_to_stream_and_cycles(gannet):
    loop, to_stream, udp = free_port(), free_port(), free_port()
    srv = gannet.start(conf=f"""
        error_log {{tmp}}/error.log info;
        events {{}}
        stream {{
            log_format st "$server_addr:$server_port $status";
            access_log {{tmp}}/stream.log st;
            server {{ listen 127.0.0.1:{{port}}; return "stream:$server_addr:$server_port\\n"; }}
            server {{ listen 127.0.0.1:{to_stream}; pass 127.0.0.1:{{port}}; }}
            server {{ listen 127.0.0.1:{loop}; pass 127.0.0.1:{loop}; }}
            server {{ listen 127.0.0.1:{udp} udp; pass 127.0.0.1:{{port}}; }}
        }}""")
    assert http_get(to_stream) == f"stream:127.0.0.1:{srv.port}\n".encode()
    assert http_get(loop) == b""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.sendto(b"x", ("127.0.0.1", udp))
    wait_until(lambda: len((srv.tmp / "stream.log").read_text().splitlines()) == 4)
    srv.stop()
    lines = (srv.tmp / "stream.log").read_text().splitlines()
    # The harness's connect and the passed session's `return`, the 11th pass of the loop
    # (10 passed without a line), UDP.
    assert sorted(lines) == sorted([f"127.0.0.1:{srv.port} 200"] * 2 + [f"127.0.0.1:{loop} 500",
                                    f"127.0.0.1:{udp} 500"])
    log = (srv.tmp / "error.log").read_text()
    assert log.count("stream pass cycle") == 1
    assert "cannot pass udp connection" in log


@pytest.mark.parametrize("directive, message", [
    ("pass localhost:80;", '"pass" directive has no addresses'),
    ("pass 127.0.0.1;", '"pass" directive has no port'),
    ("pass 127.0.0.1:0;", 'invalid port in "127.0.0.1:0" of the "pass" directive'),
    ("pass 127.0.0.1:1; pass 127.0.0.1:2;", '"pass" directive is duplicate'),
    ("pass;", 'invalid number of arguments in "pass" directive'),
])
def test_config_errors(gannet, directive, message):
    out = gannet.check(conf=f"events {{}} stream {{ server {{ listen 127.0.0.1:1; {directive} }} }}")
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert "check.conf:1" in out.stderr


def test_not_at_stream_level(gannet):
    out = gannet.check(conf="events {} stream { pass 127.0.0.1:1; server { listen 127.0.0.1:1; return x; } }")
    assert out.returncode != 0 and '"pass" directive is not allowed here' in out.stderr, out.stderr
