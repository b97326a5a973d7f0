"""Upstream `server NAME resolve` as nginx 1.27.3's zone module keeps it: the name is looked
up when the workers start and again each time its answer expires, whether requests come or
not; each address is a peer of its own (a request that fails tries them all, as
`$upstream_addr` shows); a server whose name has one address is nginx's single peer, never
taken out for failing. Debian's nginx (1.22) has no `resolve`, so these check gannet alone,
against a scripted name server that counts the questions it is asked.
"""

from __future__ import annotations

import socket

from conftest import free_port, wait_until
from test_resolver_answers import RecordDns


def get(port: int, path: str = "/") -> tuple[int, str]:
    """The status and `X-IP` (the addresses tried) of a GET."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head = data.partition(b"\r\n\r\n")[0].decode()
    ip = next((line[6:] for line in head.split("\r\n") if line.startswith("X-IP: ")), "")
    return int(head.split()[1]), ip


def start(gannet, dns: RecordDns, servers: str, extra: str = ""):
    return gannet.start(http=f"""
        resolver 127.0.0.1:{dns.port} valid=1s;
        resolver_timeout 1s;
        upstream u {{ zone u 64k; {servers} }}
    """, server=f"""
        location / {{
            proxy_pass http://u;
            proxy_connect_timeout 1s;
            add_header X-IP $upstream_addr always;
            {extra}
        }}
    """)


def asked(dns: RecordDns, name: str) -> int:
    return sum(1 for n, kind, _ in dns.asked if n == name and kind == "A")


def test_name_is_looked_up_again_without_requests(gannet):
    dns = RecordDns({("svc.test", "A"): [("svc.test", "A", "127.0.0.2")], ("svc.test", "AAAA"): []})
    try:
        port = free_port()
        start(gannet, dns, f"server svc.test:{port} resolve;")
        # Asked when the worker starts, and again once `valid=1s` has passed: no request
        # is made meanwhile.
        assert wait_until(lambda: asked(dns, "svc.test") >= 3, deadline=6), dns.asked
    finally:
        dns.stop()


def test_every_address_is_a_peer_tried_in_turn(gannet):
    port = free_port()  # nothing listens there: every attempt fails
    dns = RecordDns({("svc.test", "A"): [("svc.test", "A", "127.0.0.2"), ("svc.test", "A", "127.0.0.3")],
                     ("svc.test", "AAAA"): []})
    try:
        srv = start(gannet, dns, f"server svc.test:{port} resolve max_fails=0;")
        want = [f"127.0.0.2:{port}", f"127.0.0.3:{port}"]
        for _ in range(3):
            status, ip = get(srv.port)
            assert status == 502
            assert sorted(ip.split(", ")) == want
        # Along with a static server: three peers, each tried once.
        srv.stop()
        srv = start(gannet, dns, f"server 127.0.0.4:{port} max_fails=0; server svc.test:{port} resolve max_fails=0;")
        status, ip = get(srv.port)
        assert (status, sorted(ip.split(", "))) == (502, [*want, f"127.0.0.4:{port}"])
        # `proxy_next_upstream_tries` counts addresses.
        srv.stop()
        srv = start(gannet, dns, f"server svc.test:{port} resolve max_fails=0;", "proxy_next_upstream_tries 1;")
        status, ip = get(srv.port)
        assert status == 502 and ip in want
    finally:
        dns.stop()


def test_name_with_one_address_is_a_single_peer(gannet):
    port = free_port()
    dns = RecordDns({("svc.test", "A"): [("svc.test", "A", "127.0.0.2")], ("svc.test", "AAAA"): []})
    try:
        srv = start(gannet, dns, f"server svc.test:{port} resolve;")
        # max_fails=1, but one peer is never taken out: each request tries it again.
        for _ in range(3):
            assert get(srv.port) == (502, f"127.0.0.2:{port}")
        assert "no live upstreams" not in srv.error_log()
    finally:
        dns.stop()


def test_reload_starts_from_the_addresses_resolved_before(gannet):
    import signal

    from test_resolver import Backend

    port = free_port()
    backend = Backend("127.0.0.2", port)
    dns = RecordDns({("svc.test", "A"): [("svc.test", "A", "127.0.0.2")], ("svc.test", "AAAA"): []})
    try:
        srv = start(gannet, dns, f"server svc.test:{port} resolve;")
        assert get(srv.port) == (200, f"127.0.0.2:{port}")
        # The name server fails from now on; a reload (to a config with another header)
        # keeps serving from the addresses the name had.
        dns.zone[("svc.test", "A")] = 2
        dns.zone[("svc.test", "AAAA")] = 2
        srv.conf_path.write_text(srv.conf_path.read_text().replace("X-IP", "X-IQ"))
        srv.proc.send_signal(signal.SIGHUP)

        def answer():
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                s.sendall(b"GET / HTTP/1.0\r\nHost: localhost\r\n\r\n")
                return s.makefile("rb").read().decode()

        # Once the new config answers (the old one's worker may still take a request).
        got = wait_until(lambda: (a := answer()) and "X-IQ" in a and a, 10)
        assert got.startswith("HTTP/1.1 200") and f"X-IQ: 127.0.0.2:{port}" in got, got
    finally:
        dns.stop()
        backend.stop()
