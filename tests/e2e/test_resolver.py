"""`resolver` / `resolver_timeout`, `*_pass` with variables whose host is looked up at run time,
and upstream `server NAME resolve`, against a real DNS server (dnsmasq on a test port) and, for
the variable `proxy_pass` cases, side by side with Debian's nginx.
"""

from __future__ import annotations

import http.server
import os
import shutil
import signal
import socket
import subprocess
import threading
import urllib.request

import pytest

from conftest import free_port, wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both, side_by_side

DNSMASQ = shutil.which("dnsmasq") or ("/usr/sbin/dnsmasq" if os.path.exists("/usr/sbin/dnsmasq") else None)
pytestmark = pytest.mark.skipif(DNSMASQ is None, reason="dnsmasq is not installed (scripts/test-all.sh)")


class Dns:
    """dnsmasq answering for `*.test` from a hosts file only (NXDOMAIN for other names there)."""

    def __init__(self, tmp):
        self.hosts = tmp / "dns-hosts"
        self.hosts.write_text("")
        self.port = free_port()
        self.proc = subprocess.Popen(
            [DNSMASQ, "-k", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", f"--addn-hosts={self.hosts}",
             f"--port={self.port}", "--listen-address=127.0.0.1", "--bind-interfaces", "--local=/test/",
             "--user=root", "--group=root", "--pid-file="],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        wait_until(lambda: self.answers("probe.test") is not None or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.proc.stderr.read().decode()

    def answers(self, name):
        """The rcode dnsmasq gives `name` (None while it does not answer)."""
        q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
        q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00\x00\x01\x00\x01"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.2)
            s.sendto(q, ("127.0.0.1", self.port))
            try:
                return s.recv(512)[3] & 15
            except OSError:
                return None

    def address(self, name):
        """The one IPv4 address dnsmasq gives `name` now (None for none)."""
        q = b"\x12\x35\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
        q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00\x00\x01\x00\x01"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.5)
            s.sendto(q, ("127.0.0.1", self.port))
            r = s.recv(512)
        return socket.inet_ntoa(r[-4:]) if r[7] == 1 else None

    def set(self, records: dict):
        """Serve these names (name -> list of addresses) from now on."""
        self.hosts.write_text("".join(f"{ip} {name}\n" for name, ips in records.items() for ip in ips))
        self.proc.send_signal(signal.SIGHUP)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def dns(tmp_path):
    d = Dns(tmp_path)
    yield d
    d.stop()


class Backend:
    """An HTTP server on `ip` answering `<ip> <path>`."""

    def __init__(self, ip, port):
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = f"{ip} {self.path}\n".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer((ip, port), H)
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def backends():
    port = free_port()
    made = [Backend(ip, port) for ip in ("127.0.0.2", "127.0.0.3")]
    yield port
    for b in made:
        b.stop()


def fetch(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def silent_udp():
    """A UDP port that takes queries and never answers: a name server that times out."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def proxy_conf(dns_port, bport, dead_port):
    return PEER_MAIN + f"""
http {{
    access_log off;
    upstream grp {{ server 127.0.0.3:{bport}; }}
    server {{
        listen 127.0.0.1:{{port}};
        location /name/ {{
            resolver 127.0.0.1:{dns_port} valid=1s;
            proxy_pass http://$arg_h:{bport};
        }}
        location /uri/ {{
            resolver 127.0.0.1:{dns_port};
            proxy_pass http://app.test:{bport}$request_uri;
        }}
        location /group/ {{ proxy_pass http://$arg_g; }}
        location /ip/ {{ proxy_pass http://$arg_h:{bport}/fixed; }}
        location /nores/ {{ proxy_pass http://$arg_h:{bport}; }}
        location /slow/ {{
            resolver 127.0.0.1:{dead_port};
            resolver_timeout 1s;
            proxy_pass http://$arg_h:{bport};
        }}
    }}
}}
"""


CASES = [
    "/name/a?h=app.test",
    "/uri/x/y?z=1",
    "/group/g?g=grp",
    "/ip/q?h=127.0.0.3",
    "/nores/a?h=app.test",
    "/name/a?h=missing.test",
    "/slow/a?h=app.test",
    "/name/b?h=two.test",
]


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_variable_proxy_pass_as_nginx(tmp_path, dns, backends):
    # two.test's first address refuses: the next one answers.
    dns.set({"app.test": ["127.0.0.2"], "two.test": ["127.0.0.4", "127.0.0.2"]})
    wait_until(lambda: dns.answers("two.test") == 0)
    dead = silent_udp()
    with side_by_side(tmp_path, proxy_conf(dns.port, backends, dead.getsockname()[1])) as (srv, nginx_port):
        got = {p: fetch(srv.port, p) for p in CASES}
        want = {p: fetch(nginx_port, p) for p in CASES}
        assert got == want
        # What they are, beyond being the same.
        assert got["/name/a?h=app.test"] == (200, "127.0.0.2 /name/a?h=app.test\n")
        assert got["/uri/x/y?z=1"] == (200, "127.0.0.2 /uri/x/y?z=1\n")
        assert got["/group/g?g=grp"][1].startswith("127.0.0.3 ")
        assert got["/name/b?h=two.test"] == (200, "127.0.0.2 /name/b?h=two.test\n")
        for p in ["/nores/a?h=app.test", "/name/a?h=missing.test", "/slow/a?h=app.test"]:
            assert got[p][0] == 502
        log = srv.error_log()
        nlog = (tmp_path / "nginx" / "error.log").read_text()
        for line in [
            "no resolver defined to resolve app.test",
            "missing.test could not be resolved (3: Host not found)",
            "app.test could not be resolved (110: Operation timed out)",
        ]:
            assert line in log and line in nlog, line
        # Both tried the refusing address first, then the next.
        assert 'connect() failed' in log and '"http://127.0.0.4:' in log
        assert 'connect() failed' in nlog and '"http://127.0.0.4:' in nlog
    dead.close()


def test_answers_are_kept_for_valid(gannet, dns, backends):
    """`valid=` keeps an answer past its TTL (dnsmasq's is 0); without it the next request
    asks again."""
    dns.set({"app.test": ["127.0.0.2"]})
    wait_until(lambda: dns.address("app.test") == "127.0.0.2")
    srv = gannet.start(server=f"""
        location /kept/ {{ resolver 127.0.0.1:{dns.port} valid=300s; proxy_pass http://$arg_h:{backends}; }}
        location /ttl/ {{ resolver 127.0.0.1:{dns.port}; proxy_pass http://$arg_h:{backends}; }}
    """)
    assert fetch(srv.port, "/kept/?h=app.test")[1].startswith("127.0.0.2 ")
    assert fetch(srv.port, "/ttl/?h=app.test")[1].startswith("127.0.0.2 ")
    dns.set({"app.test": ["127.0.0.3"]})
    wait_until(lambda: dns.address("app.test") == "127.0.0.3")
    assert fetch(srv.port, "/ttl/?h=app.test")[1].startswith("127.0.0.3 ")
    assert fetch(srv.port, "/kept/?h=app.test")[1].startswith("127.0.0.2 ")


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_gateways_with_variables_as_nginx(tmp_path, dns):
    """`fastcgi_pass`, `scgi_pass`, `uwsgi_pass` with variables: the same 502s and log lines."""
    dns.set({"app.test": ["127.0.0.2"]})
    wait_until(lambda: dns.answers("app.test") == 0)
    locs = "".join(
        f"location /{p}/ {{ {p}_pass $arg_h:1; }}\n"
        f"location /r{p}/ {{ resolver 127.0.0.1:{dns.port}; {p}_pass $arg_h:1; }}\n"
        for p in ("fastcgi", "scgi", "uwsgi"))
    conf = PEER_MAIN + f"http {{ access_log off; server {{ listen 127.0.0.1:{{port}}; {locs} }} }}"
    paths = [f"/{r}{p}/?h={h}" for p in ("fastcgi", "scgi", "uwsgi") for r in ("", "r")
             for h in ("app.test", "gone.test")]
    with side_by_side(tmp_path, conf) as (srv, nginx_port):
        got = {p: fetch(srv.port, p)[0] for p in paths}
        assert got == {p: fetch(nginx_port, p)[0] for p in paths}
        assert set(got.values()) == {502}
        log = srv.error_log()
        nlog = (tmp_path / "nginx" / "error.log").read_text()
        for line in ["no resolver defined to resolve app.test",
                     "gone.test could not be resolved (3: Host not found)"]:
            assert log.count(line) == nlog.count(line) > 0, line


def test_fastcgi_pass_with_variables_resolves(gannet, dns):
    """`fastcgi_pass $var`: a name through the resolver, a missing one a 502 with nginx's line."""
    dns.set({"php.test": ["127.0.0.2"]})
    wait_until(lambda: dns.answers("php.test") == 0)
    srv = gannet.start(server=f"""
        resolver 127.0.0.1:{dns.port};
        location / {{ fastcgi_pass $arg_h:1; }}
    """)
    # Port 1 on 127.0.0.2 refuses: the name was resolved and connected to.
    assert fetch(srv.port, "/?h=php.test")[0] == 502
    assert "connect() failed" in srv.error_log() and "127.0.0.2:1" in srv.error_log()
    assert fetch(srv.port, "/?h=nope.test")[0] == 502
    assert "nope.test could not be resolved (3: Host not found)" in srv.error_log()


@pytest.mark.parametrize("where", ["http", "upstream"])
def test_upstream_server_resolve_follows_dns(gannet, dns, backends, where):
    dns.set({"svc.test": ["127.0.0.2"]})
    wait_until(lambda: dns.answers("svc.test") == 0)
    resolver = f"resolver 127.0.0.1:{dns.port} valid=1s; resolver_timeout 5s;"
    http_level, block = (resolver, "") if where == "http" else ("", resolver)
    srv = gannet.start(http=f"""
        {http_level}
        upstream dyn {{ zone dyn 64k; {block} server svc.test:{backends} resolve; }}
    """, server="location / { proxy_pass http://dyn; }")
    assert fetch(srv.port, "/a") == (200, "127.0.0.2 /a\n")
    # The name moves: requests follow once the answer expires, without a reload.
    dns.set({"svc.test": ["127.0.0.3"]})
    wait_until(lambda: fetch(srv.port, "/b") == (200, "127.0.0.3 /b\n"))
    # Two addresses: both are used.
    dns.set({"svc.test": ["127.0.0.2", "127.0.0.3"]})
    seen = set()
    wait_until(lambda: seen.add(fetch(srv.port, "/c")[1].split()[0]) or len(seen) == 2)
    # The name goes: no live server; it comes back: served again.
    dns.set({})
    wait_until(lambda: fetch(srv.port, "/d")[0] == 502)
    assert "svc.test could not be resolved (3: Host not found)" in srv.error_log()
    assert 'no live upstreams while connecting to upstream, upstream: "http://dyn"' in srv.error_log()
    dns.set({"svc.test": ["127.0.0.2"]})
    wait_until(lambda: fetch(srv.port, "/e") == (200, "127.0.0.2 /e\n"))


@pytest.mark.parametrize("http,message", [
    ("resolver 127.0.0.1; upstream u { server a.test resolve; }",
     'resolving names at run time requires upstream "u" in {conf}:'),
    ("upstream u { zone u 64k; server a.test resolve; }",
     'no resolver defined to resolve names at run time in upstream "u" in {conf}:'),
    # `ipv4=` is newer (1.23.1) than Debian's nginx too.
    ("resolver 127.0.0.1 ipv4=off ipv6=off;", '"ipv4" and "ipv6" cannot both be "off"'),
    ("resolver 127.0.0.1 ipv4=maybe;", "invalid parameter: ipv4=maybe"),
])
def test_newer_config_errors(gannet, http, message):
    """`server ... resolve` and `ipv4=` are newer than Debian's nginx: gannet alone."""
    r = gannet.check(http=http)
    assert r.returncode != 0
    assert message.split("{conf}")[0] in r.stderr, r.stderr


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
@pytest.mark.parametrize("http,message", [
    ("resolver 127.0.0.1 valid=x;", "invalid parameter: valid=x"),
    ("resolver valid=5s;", "no name servers defined"),
    ("resolver 127.0.0.1:0;", 'invalid port in resolver "127.0.0.1:0"'),
    ("resolver_timeout x;", '"resolver_timeout" directive invalid value'),
    ("server { resolver 127.0.0.1; resolver 127.0.0.2; }", '"resolver" directive is duplicate'),
])
def test_config_errors_as_nginx(tmp_path, http, message):
    n, g = check_both(tmp_path, http)
    assert n.returncode != 0 and g.returncode != 0
    assert message in n.stderr, n.stderr
    assert message in g.stderr, g.stderr
    # The same line of the same file.
    where = n.stderr.split(" in ")[-1].split()[0]
    assert where in g.stderr, (n.stderr, g.stderr)


def test_resolve_with_zone_and_resolver_in_the_block_loads(gannet):
    r = gannet.check(http="upstream u { zone u 64k; resolver 127.0.0.1:5353; resolver_timeout 2s;"
                          " server a.test resolve; }")
    assert r.returncode == 0, r.stderr


class ScriptedDns:
    """A UDP name server answering each (name, type) as `answers` says: a list of IPv4
    addresses (an empty list is NOERROR with no records) or an rcode (2: SERVFAIL)."""

    def __init__(self, answers: dict):
        self.answers = answers
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                q, peer = self.sock.recvfrom(512)
            except OSError:
                return
            at, labels = 12, []
            while q[at]:
                labels.append(q[at + 1:at + 1 + q[at]].decode())
                at += 1 + q[at]
            question = q[12:at + 5]
            qtype = int.from_bytes(q[at + 1:at + 3], "big")
            answer = self.answers.get((".".join(labels).lower(), qtype), 3)
            ips = answer if isinstance(answer, list) else []
            rcode = 0 if isinstance(answer, list) else answer
            head = q[:2] + bytes([0x81, 0x80 | rcode]) + b"\x00\x01" + len(ips).to_bytes(2, "big") + b"\x00\x00\x00\x00"
            records = b"".join(b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x0e\x10\x00\x04" + socket.inet_aton(ip) for ip in ips)
            self.sock.sendto(head + question + records, peer)

    def stop(self):
        self.sock.close()


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_name_server_answers_as_nginx_takes_them(tmp_path, backends):
    # A name server's error for AAAA (or A) fails the name even when the other type has
    # addresses, as nginx; an empty answer for one type leaves the other's addresses. With
    # two servers, each new name goes to the next one and a SERVFAIL is the answer (nginx
    # asks no other server; hickory's pool did): two.test fails once, then is found.
    A, AAAA = 1, 28
    dns = ScriptedDns({("a-err.test", A): ["127.0.0.2"], ("a-err.test", AAAA): 2,
                       ("err-a.test", A): 2, ("err-a.test", AAAA): [],
                       ("a-none.test", A): ["127.0.0.2"], ("a-none.test", AAAA): [],
                       ("two.test", A): 2, ("two.test", AAAA): 2})
    good = ScriptedDns({("two.test", A): ["127.0.0.2"], ("two.test", AAAA): []})
    conf = PEER_MAIN + f"""
http {{
    access_log off;
    server {{
        listen 127.0.0.1:{{port}};
        location / {{
            resolver 127.0.0.1:{dns.port};
            resolver_timeout 2s;
            proxy_pass http://$arg_h:{backends};
        }}
        location /two {{
            resolver 127.0.0.1:{dns.port} 127.0.0.1:{good.port};
            resolver_timeout 2s;
            proxy_pass http://$arg_h:{backends};
        }}
    }}
}}
"""
    paths = ["/?h=a-err.test", "/?h=err-a.test", "/?h=a-none.test"]
    try:
        with side_by_side(tmp_path, conf) as (srv, nginx_port):
            got = {p: fetch(srv.port, p)[0] for p in paths}
            want = {p: fetch(nginx_port, p)[0] for p in paths}
            got["two"] = [fetch(srv.port, "/two?h=two.test")[0] for _ in range(3)]
            want["two"] = [fetch(nginx_port, "/two?h=two.test")[0] for _ in range(3)]
            log = srv.error_log()
    finally:
        dns.stop()
        good.stop()
    assert got == want
    assert got == {"/?h=a-err.test": 502, "/?h=err-a.test": 502, "/?h=a-none.test": 200, "two": [502, 200, 200]}
    assert "a-err.test could not be resolved (2: Server failure)" in log
