"""`subrequest_output_buffer_size` on gannet and Debian's nginx with one config: SSI's
`include ... set=` keeps a subrequest's answer up to the size of the subrequest's location;
a longer one is an error that ends the page (nginx sends no page at all; gannet, which has
sent the head already, cuts it).
"""

from __future__ import annotations

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    root {root};
    server {
        listen 127.0.0.1:{port};
        location /p/ { proxy_pass http://127.0.0.1:{port}/f/; subrequest_output_buffer_size 42; }
        location /big/ { proxy_pass http://127.0.0.1:{port}/f/; }
        location /ssi/ { ssi on; }
    }
}
"""

FILES = {"ssi/page.html": '<!--#include virtual="$arg_c" set="x" -->set: <!--#echo var="x" -->',
         "f/short": "TEST-OK", "f/long": "x" * 400}  # fmt: skip


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_subrequest_output_buffer_size_as_nginx(tmp_path):
    with side_by_side(tmp_path, CONF, FILES) as (srv, nginx_port):
        for port in (srv.port, nginx_port):
            def page(c):
                return exchange(port, f"GET /ssi/page.html?c={c} HTTP/1.0\r\n\r\n".encode()).body
            assert page("/p/short") == b"set: TEST-OK", port
            assert page("/big/long") == b"set: " + b"x" * 400, port
            assert b"set:" not in page("/p/long"), port
