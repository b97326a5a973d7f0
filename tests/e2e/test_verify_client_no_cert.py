"""`ssl_verify_client` of a server with no certificate of its own: SNI picks it, the
address's default server does the handshake (nginx's SNI callback leaves it its context),
and the request is then judged by the chosen server's setting - `on` with no client
certificate is nginx's 400 ("No required SSL certificate was sent"). Side by side with
Debian's nginx; before, gannet skipped the check for such a server and answered 200.
"""

from __future__ import annotations

import socket
import ssl
import subprocess

import pytest

from nginx_peer import NGINX, PEER_MAIN, parse, side_by_side
from test_tls import Pki

pytestmark = pytest.mark.skipif(
    NGINX is None or subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="needs nginx and openssl")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    p.issue("site", "localhost", sans=("localhost", "on.test", "nocert.test", "open.test"))
    p.issue("client", "client")
    return p


def conf(pki: Pki) -> str:
    return PEER_MAIN + f"""
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name on.test;
        ssl_certificate {pki.path("site.pem")};
        ssl_certificate_key {pki.path("site.key")};
        ssl_verify_client on;
        ssl_client_certificate {pki.path("ca.pem")};
        location / {{ return 200 "on $ssl_client_verify\\n"; }}
    }}
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name nocert.test;
        ssl_verify_client on;
        location / {{ return 200 "nocert $ssl_client_verify\\n"; }}
    }}
    server {{
        listen 127.0.0.1:{{port}} ssl;
        server_name open.test;
        location / {{ return 200 "open $ssl_client_verify\\n"; }}
    }}
}}
"""


def get(port: int, name: str, pki: Pki, cert: bool) -> tuple[int, bytes]:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert:
        ctx.load_cert_chain(pki.path("client.pem"), pki.path("client.key"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=name) as s:
            s.sendall(f"GET / HTTP/1.0\r\nHost: {name}\r\n\r\n".encode())
            a = parse(b"".join(iter(lambda: s.recv(65536), b"")))
    return a.status, a.body if a.status == 200 else b""


def test_server_without_certificate_judges_clients(tmp_path, pki):
    with side_by_side(tmp_path, conf(pki)) as (srv, nginx_port):
        cases = [(name, cert) for name in ("on.test", "nocert.test", "open.test") for cert in (False, True)]
        ours = [get(srv.port, n, pki, c) for n, c in cases]
        assert ours == [get(nginx_port, n, pki, c) for n, c in cases]
        assert ours == [(400, b""), (200, b"on SUCCESS\n"), (400, b""), (200, b"nocert SUCCESS\n"),
                        (200, b"open NONE\n"), (200, b"open SUCCESS\n")]
