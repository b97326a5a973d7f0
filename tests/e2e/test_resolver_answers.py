"""How `resolver` reads a name server's answers, side by side with Debian's nginx: the A and
AAAA answers of a name taken together (addresses, empty answers, errors, CNAMEs in either or
both), a CNAME chain, a truncated UDP answer asked again over TCP, and answers that are
ignored (a format error, a wrong id) until the query goes to the next server.

The name server is scripted here (UDP and TCP on one port) so that each answer is exactly
the one under test; it answers in the order the questions come, as the suite's does.
"""

from __future__ import annotations

import ipaddress
import socket
import threading

import pytest

from conftest import free_port
from nginx_peer import NGINX, PEER_MAIN, side_by_side

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed")

A, CNAME, AAAA = 1, 5, 28
TYPES = {"A": A, "AAAA": AAAA, "CNAME": CNAME}


def wire(name: str) -> bytes:
    return b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p) + b"\x00"


def record(owner: str, kind: str, value: str, ttl: int = 3600) -> bytes:
    if kind == "A":
        data = socket.inet_aton(value)
    elif kind == "AAAA":
        data = ipaddress.IPv6Address(value).packed
    else:
        data = wire(value)
    return wire(owner) + TYPES[kind].to_bytes(2, "big") + b"\x00\x01" + ttl.to_bytes(4, "big") \
        + len(data).to_bytes(2, "big") + data


class RecordDns:
    """Answers (name, "A"|"AAAA") from `zone`: a list of (owner, type, value) records (empty:
    NOERROR without records), an rcode (int), or a dict with "udp" and "tcp" answers for a
    name whose UDP answer is truncated. Other questions: NXDOMAIN. `wrong_id` questions are
    answered with another id."""

    def __init__(self, zone: dict, wrong_id=()):
        self.zone, self.wrong_id, self.asked = zone, set(wrong_id), []
        self.port = free_port()
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", self.port))
        self.tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.tcp.bind(("127.0.0.1", self.port))
        self.tcp.listen(8)
        threading.Thread(target=self.serve_udp, daemon=True).start()
        threading.Thread(target=self.serve_tcp, daemon=True).start()

    def answer(self, q: bytes, tcp: bool) -> bytes:
        at, labels = 12, []
        while q[at]:
            labels.append(q[at + 1:at + 1 + q[at]].decode())
            at += 1 + q[at]
        name = ".".join(labels).lower()
        kind = {A: "A", AAAA: "AAAA"}.get(int.from_bytes(q[at + 1:at + 3], "big"), "?")
        self.asked.append((name, kind, "tcp" if tcp else "udp"))
        got = self.zone.get((name, kind), 3)
        flags, qid = 0x8180, q[:2]
        if isinstance(got, dict):
            got = got["tcp" if tcp else "udp"]
            flags |= 0 if tcp else 0x0200
        if (name, kind) in self.wrong_id:
            qid = bytes([q[0] ^ 0xff, q[1]])
        records = got if isinstance(got, list) else []
        rcode = 0 if isinstance(got, list) else got
        head = qid + (flags | rcode).to_bytes(2, "big") + b"\x00\x01" + len(records).to_bytes(2, "big") + b"\x00" * 4
        return head + q[12:at + 5] + b"".join(record(*r) for r in records)

    def serve_udp(self):
        while True:
            try:
                q, peer = self.udp.recvfrom(512)
                self.udp.sendto(self.answer(q, False), peer)
            except OSError:
                return

    def serve_tcp(self):
        while True:
            try:
                c, _ = self.tcp.accept()
            except OSError:
                return
            threading.Thread(target=self.serve_conn, args=(c,), daemon=True).start()

    def serve_conn(self, c):
        with c:
            buf = b""
            while True:
                try:
                    data = c.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while len(buf) >= 2 and len(buf) >= 2 + int.from_bytes(buf[:2], "big"):
                    n = int.from_bytes(buf[:2], "big")
                    out = self.answer(buf[2:2 + n], True)
                    buf = buf[2 + n:]
                    c.sendall(len(out).to_bytes(2, "big") + out)

    def stop(self):
        self.udp.close()
        self.tcp.close()


def tried(port: int, host: str) -> tuple[int, list[str]]:
    """The status and the addresses tried, in sorted order: a cached answer is handed out
    from a random place in it (nginx's rotation)."""
    status, body = fetch(port, host)
    return status, sorted(a for a in body.split(", ") if a)


def fetch(port: int, host: str, path: str = "/") -> tuple[int, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def conf(dns_ports, backend_port, resolver_timeout="2s"):
    servers = " ".join(f"127.0.0.1:{p}" for p in dns_ports)
    return PEER_MAIN + f"""
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{{port}};
        location / {{
            resolver {servers};
            resolver_timeout {resolver_timeout};
            proxy_pass http://$host:{backend_port}/ok;
            proxy_connect_timeout 200ms;
            proxy_next_upstream error timeout;
            proxy_intercept_errors on;
            error_page 502 504 = /tried;
        }}
        location /tried {{ return 200 "$upstream_addr"; }}
    }}
}}
"""


def alias(name, target):
    return (name, "CNAME", target)


def a(owner, ip):
    return (owner, "A", ip)


def aaaa(owner, ip):
    return (owner, "AAAA", ip)


# Each name's A and AAAA answers: addresses (127.0.0.20x and fe80::x refuse at once, so every
# address found is tried and listed), nothing, an error, a CNAME, a CNAME with addresses.
ZONE = {
    ("two.test", "A"): [a("two.test", "127.0.0.201")],
    ("two.test", "AAAA"): [aaaa("two.test", "fe80::1")],
    ("both.test", "A"): [a("both.test", "127.0.0.201"), a("both.test", "127.0.0.202")],
    ("both.test", "AAAA"): [aaaa("both.test", "fe80::1")],
    ("alias.test", "A"): [a("alias.test", "127.0.0.203")],
    ("alias.test", "AAAA"): [aaaa("alias.test", "fe80::3")],
    ("alias4.test", "A"): [a("alias4.test", "127.0.0.204")],
    ("alias4.test", "AAAA"): [],
    ("alias6.test", "A"): [],
    ("alias6.test", "AAAA"): [aaaa("alias6.test", "fe80::6")],
    # empty A, CNAME-only AAAA: the CNAME is followed (both families of its target)
    ("z-c.test", "A"): [],
    ("z-c.test", "AAAA"): [alias("z-c.test", "alias.test")],
    # addresses for A, CNAME-only AAAA: the A addresses alone
    ("n-c.test", "A"): [a("n-c.test", "127.0.0.201")],
    ("n-c.test", "AAAA"): [alias("n-c.test", "alias.test")],
    # CNAME-only A, addresses for AAAA: the AAAA addresses alone
    ("c-n.test", "A"): [alias("c-n.test", "alias.test")],
    ("c-n.test", "AAAA"): [aaaa("c-n.test", "fe80::1")],
    # CNAME-only A, empty AAAA: the first answer's CNAME is not kept: not found
    ("c-z.test", "A"): [alias("c-z.test", "alias.test")],
    ("c-z.test", "AAAA"): [],
    # two different CNAMEs: the second answer's is followed
    ("c1-c2.test", "A"): [alias("c1-c2.test", "alias4.test")],
    ("c1-c2.test", "AAAA"): [alias("c1-c2.test", "alias6.test")],
    # CNAME-only A, CNAME and addresses in AAAA: those addresses
    ("c-cn.test", "A"): [alias("c-cn.test", "alias.test")],
    ("c-cn.test", "AAAA"): [alias("c-cn.test", "alias.test"), aaaa("alias.test", "fe80::1"),
                            aaaa("alias.test", "fe80::2")],
    # CNAME and addresses in A, CNAME-only AAAA
    ("cn-c.test", "A"): [alias("cn-c.test", "alias.test"), a("alias.test", "127.0.0.201")],
    ("cn-c.test", "AAAA"): [alias("cn-c.test", "alias.test")],
    # an error for either fails the name, whatever the other has
    ("n-e.test", "A"): [a("n-e.test", "127.0.0.201")],
    ("n-e.test", "AAAA"): 2,
    ("e-n.test", "A"): 2,
    ("e-n.test", "AAAA"): [aaaa("e-n.test", "fe80::1")],
    ("e-c.test", "A"): 5,
    ("e-c.test", "AAAA"): [alias("e-c.test", "alias.test")],
    ("cn-e.test", "A"): [alias("cn-e.test", "alias.test"), a("alias.test", "127.0.0.201")],
    ("cn-e.test", "AAAA"): 3,
    # nothing for either
    ("z-z.test", "A"): [],
    ("z-z.test", "AAAA"): [],
    # a chain of CNAMEs, each a name of its own
    ("chain.test", "A"): [alias("chain.test", "hop.test")],
    ("chain.test", "AAAA"): [alias("chain.test", "hop.test")],
    ("hop.test", "A"): [alias("hop.test", "both.test")],
    ("hop.test", "AAAA"): [alias("hop.test", "both.test")],
    # truncated over UDP (with an address that must not be used), whole over TCP
    ("tc.test", "A"): {"udp": [a("tc.test", "127.0.0.209")], "tcp": [a("tc.test", "127.0.0.205")]},
    ("tc.test", "AAAA"): {"udp": [], "tcp": []},
}


def test_answer_pairs_as_nginx(tmp_path):
    dns = RecordDns(ZONE)
    backend = free_port()
    names = sorted({n for n, _ in ZONE} - {"alias.test", "alias4.test", "alias6.test", "hop.test"})
    try:
        with side_by_side(tmp_path, conf([dns.port], backend)) as (srv, nginx_port):
            got = {n: tried(srv.port, n) for n in names}
            want = {n: tried(nginx_port, n) for n in names}
            log = srv.error_log()
    finally:
        dns.stop()
    assert got == want
    p = backend
    # What they are, beyond being the same.
    assert got["z-c.test"] == (200, [f"127.0.0.203:{p}", f"[fe80::3]:{p}"])
    assert got["n-c.test"] == (200, [f"127.0.0.201:{p}"])
    assert got["c-n.test"] == (200, [f"[fe80::1]:{p}"])
    assert got["c1-c2.test"] == (200, [f"[fe80::6]:{p}"])
    assert got["c-cn.test"] == (200, [f"[fe80::1]:{p}", f"[fe80::2]:{p}"])
    assert got["chain.test"] == (200, [f"127.0.0.201:{p}", f"127.0.0.202:{p}", f"[fe80::1]:{p}"])
    assert got["tc.test"] == (200, [f"127.0.0.205:{p}"])
    # Not resolved: the 502's error page, no address tried.
    for failed in ("c-z.test", "n-e.test", "e-n.test", "e-c.test", "cn-e.test", "z-z.test"):
        assert got[failed] == (200, []), failed
    assert "n-e.test could not be resolved (2: Server failure)" in log
    assert "e-c.test could not be resolved (5: Operation refused)" in log
    assert "c-z.test could not be resolved (3: Host not found)" in log
    # The truncated answer was asked again over TCP.
    assert ("tc.test", "A", "tcp") in dns.asked


def test_ignored_answers_go_to_the_next_server(tmp_path):
    """An answer with another id and a format error are ignored: what is unanswered goes to
    the next server after 5 s (within resolver_timeout); a question gone over TCP (its UDP
    answer was truncated) goes on over TCP. Each new name starts at the next server."""
    bad = RecordDns({("fe.test", "A"): [a("fe.test", "127.0.0.208")], ("fe.test", "AAAA"): 1,
                     ("tc2.test", "A"): {"udp": [a("tc2.test", "127.0.0.208")], "tcp": 1},
                     ("tc2.test", "AAAA"): []},
                    wrong_id={("fe.test", "A")})
    good = RecordDns({("fe.test", "A"): [a("fe.test", "127.0.0.206")], ("fe.test", "AAAA"): [],
                      ("tc2.test", "A"): {"udp": [], "tcp": [a("tc2.test", "127.0.0.207")]},
                      ("tc2.test", "AAAA"): []})
    backend = free_port()
    # fe.test starts at `bad`, skip.test at `good` (not found), tc2.test at `bad` again.
    names = ("fe.test", "skip.test", "tc2.test")
    try:
        with side_by_side(tmp_path, conf([bad.port, good.port], backend, "8s")) as (srv, nginx_port):
            got = [fetch(srv.port, n) for n in names]
            want = [fetch(nginx_port, n) for n in names]
    finally:
        bad.stop()
        good.stop()
    assert got == want
    assert got[0] == (200, f"127.0.0.206:{backend}")
    assert got[1] == (200, "")
    assert got[2] == (200, f"127.0.0.207:{backend}")
    assert ("tc2.test", "A", "tcp") in good.asked and ("tc2.test", "A", "udp") not in good.asked


def test_status_named_by_next_upstream_goes_to_next_address_as_nginx(tmp_path):
    """A name's addresses are tried in turn after an answer `proxy_next_upstream http_404`
    names, within `proxy_next_upstream_tries`, as nginx does."""
    import http.server

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    bport = backend.server_address[1]
    dns = RecordDns({("three.test", "A"): [a("three.test", "127.0.0.1")] * 3, ("three.test", "AAAA"): []})
    conf = PEER_MAIN + f"""
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{{port}};
        resolver 127.0.0.1:{dns.port};
        proxy_next_upstream http_404;
        add_header X-S $upstream_status always;
        location / {{ proxy_pass http://$host:{bport}; }}
        location /two {{ proxy_pass http://$host:{bport}; proxy_next_upstream_tries 2; }}
    }}
}}
"""

    def statuses(port, path):
        with socket.create_connection(("127.0.0.1", port), timeout=15) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\nHost: three.test\r\n\r\n".encode())
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head = data.partition(b"\r\n\r\n")[0].decode()
        return [line for line in head.split("\r\n") if line.startswith("X-S: ")]

    try:
        with side_by_side(tmp_path, conf) as (srv, nginx_port):
            got = [statuses(srv.port, p) for p in ("/", "/two")]
            want = [statuses(nginx_port, p) for p in ("/", "/two")]
    finally:
        dns.stop()
        backend.shutdown()
        backend.server_close()
    assert got == want == [["X-S: 404, 404, 404"], ["X-S: 404, 404"]]
