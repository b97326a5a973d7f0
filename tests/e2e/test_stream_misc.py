"""The stream proxy's smaller directives and variables, each side by side with Debian's
nginx (its stream module loaded) where it is observable: `set`, `map` regex captures,
`$limit_conn_status` with `limit_conn_dry_run`, `error_log` in a stream server, unix
clients (`$remote_addr`, `geo`, `deny unix:`), `set_real_ip_from` with a host name,
`proxy_half_close`, `resolver` for `proxy_pass $var`, UDP `proxy_requests` /
`proxy_responses`, `access_log` paths with variables and `escape=json`, a PROXY line with
an unknown protocol word, and the rates given by variables.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import free_port, wait_until
from nginx_peer import NGINX, NginxPeer
from test_stream import DNSMASQ, STREAM_MODULE, Echo, conf, log_lines, talk

needs_nginx = pytest.mark.skipif(NGINX is None or not os.path.exists(STREAM_MODULE),
                                 reason="needs nginx and libnginx-mod-stream")


@pytest.fixture
def echo():
    e = Echo(2)
    yield e
    e.close()


@contextmanager
def both(gannet, tmp_path: Path, body):
    """gannet and nginx with `conf(body(side))`; yields {side: tmp dir}."""
    srv = gannet.start(conf=conf(body("g"), load=True))
    ng_tmp = tmp_path / "nginx"
    # Workers as root, as gannet's (the test folders are root's, 0700).
    nginx = NginxPeer(conf(body("n"), load=True) + "\nuser root;\n", free_port(), tmp_path, ng_tmp)
    try:
        yield {"g": srv.tmp, "n": ng_tmp}
    finally:
        nginx.stop()


def ports(n: int) -> dict[str, list[int]]:
    return {side: [free_port() for _ in range(n)] for side in ("g", "n")}


def read_all(port: int, data: bytes = b"", timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        if data:
            s.sendall(data)
        out = b""
        while chunk := s.recv(4096):
            out += chunk
        return out


@needs_nginx
def test_differential_set_and_map_captures(gannet, tmp_path):
    """`set` over a `map` variable and into a new one (read before and after), `$1` and a
    named capture of a `map` regex, a `set` variable no server set (empty): the same text
    from both; `$nginx_version` has a value in both."""
    p = ports(3)
    body = lambda side: (
        "map $server_port $x {\n"
        f"  ~^({p[side][0]})$ cap-$1;\n"
        f"  ~^(?P<pt>{p[side][1]})$ named-$pt;\n"
        "  default dflt;\n}\n"
        "map 0 $m { default original; }\n"
        f"server {{ listen 127.0.0.1:{p[side][0]}; listen 127.0.0.1:{p[side][1]};\n"
        "  set $s $m; set $m new; set $t \"$x+$s\";\n"
        "  return \"$x|$m|$s|$t|v=$nginx_version\"; }\n"
        f"server {{ listen 127.0.0.1:{p[side][2]}; return \"[$s]$x\"; }}")
    with both(gannet, tmp_path, body):
        got = {side: [read_all(q).decode() for q in p[side]] for side in p}
    strip = lambda v: [re.sub(r"\d+", "N", re.sub(r"v=[\d.]+$", "v=", a)) for a in v]
    assert strip(got["g"]) == strip(got["n"]), got
    assert got["g"][0] == f"cap-{p['g'][0]}|new|original|cap-{p['g'][0]}+original|v=" + got["g"][0].rsplit("=", 1)[1]
    assert got["g"][1].startswith(f"named-{p['g'][1]}|new|original|")
    assert got["g"][2] == "[]dflt"
    assert re.search(r"v=\d+\.\d+\.\d+$", got["g"][0]) and re.search(r"v=\d+\.\d+\.\d+$", got["n"][0])


@needs_nginx
def test_differential_limit_conn_status_and_dry_run(gannet, tmp_path, echo):
    """One session held in zone `z` (limit 1): a second one on a limited server is refused
    (REJECTED, 503), one on a `limit_conn_dry_run on` server is proxied (REJECTED_DRY_RUN),
    one without a limit logs `-`; the held one PASSED. The same log lines in both."""
    a = echo.ports[0]
    p = ports(4)
    body = lambda side: (
        "limit_conn_zone $binary_remote_addr zone=z:1m;\n"
        "log_format lc '$server_port $limit_conn_status $status';\n"
        f"server {{ listen 127.0.0.1:{p[side][0]}; limit_conn z 1; access_log {{tmp}}/lc.log lc; proxy_pass 127.0.0.1:{a}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][1]}; limit_conn z 1; access_log {{tmp}}/lc.log lc; proxy_pass 127.0.0.1:{a}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][2]}; limit_conn z 1; limit_conn_dry_run on; access_log {{tmp}}/lc.log lc; proxy_pass 127.0.0.1:{a}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][3]}; access_log {{tmp}}/lc.log lc; proxy_pass 127.0.0.1:{a}; }}")
    with both(gannet, tmp_path, body) as tmps:
        logs = {}
        for side, tmp in tmps.items():
            held = socket.create_connection(("127.0.0.1", p[side][0]), timeout=5)
            held.sendall(b"x")
            assert held.recv(100) == b"[0]x"
            answers = [talk(q) for q in p[side][1:]]
            held.close()
            assert answers == [b"", b"[0]hello", b"[0]hello"], (side, answers)
            log = tmp / "lc.log"
            assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 4), side
            order = {str(q): i for i, q in enumerate(p[side])}
            logs[side] = sorted(re.sub(r"^\d+", lambda m: str(order[m.group(0)]), l) for l in log.read_text().splitlines())
            assert "limiting connections, dry run, by zone \"z\"" in (tmp / "error.log").read_text(), side
    assert logs["g"] == logs["n"] == ["0 PASSED 200", "1 REJECTED 503", "2 REJECTED_DRY_RUN 200", "3 - 200"], logs


@needs_nginx
def test_differential_error_log_in_stream_server(gannet, tmp_path, echo):
    """`error_log FILE info` in a stream server: its sessions' lines (the client's connect,
    the upstream's, the disconnect with the byte counts, an error) go there and not to the
    main log; a server without one writes to the main log. The same messages in both."""
    a = echo.ports[0]
    dead = free_port()
    p = ports(3)
    body = lambda side: (
        f"server {{ listen 127.0.0.1:{p[side][0]}; error_log {{tmp}}/srv.log info; proxy_pass 127.0.0.1:{a}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][1]}; error_log {{tmp}}/srv.log info; proxy_pass 127.0.0.1:{dead}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][2]}; proxy_pass 127.0.0.1:{dead}; }}")
    with both(gannet, tmp_path, body) as tmps:
        for side, tmp in tmps.items():
            assert talk(p[side][0]) == b"[0]hello"
            assert talk(p[side][1]) == b""
            assert talk(p[side][2]) == b""
            srv_log, main = tmp / "srv.log", tmp / "error.log"
            assert wait_until(lambda: "disconnected, bytes from/to client:5/8, bytes from/to upstream:8/5" in srv_log.read_text()), side
            text = srv_log.read_text()
            assert re.search(rf"\[info\] .* client 127\.0\.0\.1:\d+ connected to 127\.0\.0\.1:{p[side][0]}", text), side
            assert re.search(rf"\[info\] .* proxy 127\.0\.0\.1:\d+ connected to 127\.0\.0\.1:{a}", text), side
            assert re.search(rf"\[error\] .* connect\(\) failed \(111: Connection refused\).*server: 127\.0\.0\.1:{p[side][1]}", text), side
            assert f"server: 127.0.0.1:{p[side][1]}" not in main.read_text(), side
            assert wait_until(lambda: f"server: 127.0.0.1:{p[side][2]}" in main.read_text()), side
            assert f"server: 127.0.0.1:{p[side][2]}" not in text, side


@needs_nginx
def test_differential_unix_clients(gannet, tmp_path):
    """Clients of `listen unix:` (reached through `proxy_pass unix:`): `$remote_addr` is
    `unix:`, `geo` sees 255.255.255.255, `deny unix:` refuses them. The same in both."""
    p = ports(2)
    body = lambda side: (
        "geo $g { default other; 255.255.255.255 none; }\n"
        "geo $remote_addr $gr { ranges; default none2; 0.0.0.0-255.255.255.254 low; }\n"
        f"server {{ listen unix:{{tmp}}/{side}a.sock; return \"[$remote_addr][$remote_port][$g][$gr]\"; }}\n"
        f"server {{ listen unix:{{tmp}}/{side}b.sock; deny unix:; return SEEN; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][0]}; proxy_pass unix:{{tmp}}/{side}a.sock; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][1]}; proxy_pass unix:{{tmp}}/{side}b.sock; }}")
    with both(gannet, tmp_path, body):
        got = {side: [read_all(q) for q in p[side]] for side in p}
    assert got["g"] == got["n"] == [b"[unix:][][none][none2]", b""], got


@needs_nginx
def test_differential_realip_hostname_and_unix(gannet, tmp_path):
    """`set_real_ip_from localhost` trusts what the name resolves to at load; `unix:`
    trusts unix clients only: a PROXY header's address becomes `$remote_addr` or not."""
    p = ports(3)
    body = lambda side: (
        f"server {{ listen 127.0.0.1:{p[side][0]} proxy_protocol; set_real_ip_from localhost; return $remote_addr; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][1]} proxy_protocol; listen unix:{{tmp}}/{side}.sock proxy_protocol;\n"
        "  set_real_ip_from unix:; return $remote_addr; }\n"
        f"server {{ listen 127.0.0.1:{p[side][2]}; proxy_pass unix:{{tmp}}/{side}.sock; }}")
    pp = b"PROXY TCP4 192.0.2.1 192.0.2.2 1234 5678\r\n"
    with both(gannet, tmp_path, body):
        got = {side: [read_all(q, pp) for q in p[side]] for side in p}
    assert got["g"] == got["n"] == [b"192.0.2.1", b"127.0.0.1", b"192.0.2.1"], got


@needs_nginx
def test_differential_half_close(gannet, tmp_path):
    """`proxy_half_close on`: the client's FIN reaches the upstream as one, and the
    upstream's answer written after it still reaches the client; without it the session
    ends at the client's FIN."""
    up = socket.socket()
    up.bind(("127.0.0.1", 0))
    up.listen(8)

    def serve():
        while True:
            try:
                c, _ = up.accept()
            except OSError:
                return
            with c:
                got = b""
                while d := c.recv(100):
                    got += d
                try:
                    c.sendall(b"after-eof:" + got)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    u = up.getsockname()[1]
    p = ports(2)
    body = lambda side: (
        f"server {{ listen 127.0.0.1:{p[side][0]}; proxy_half_close on; proxy_pass 127.0.0.1:{u}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][1]}; proxy_pass 127.0.0.1:{u}; }}")

    def half(port):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"abc")
            s.shutdown(socket.SHUT_WR)
            out = b""
            try:
                while chunk := s.recv(100):
                    out += chunk
            except ConnectionResetError:
                pass
            return out

    try:
        with both(gannet, tmp_path, body):
            got = {side: [half(q) for q in p[side]] for side in p}
    finally:
        up.close()
    assert got["g"] == got["n"] == [b"after-eof:abc", b""], got


@needs_nginx
@pytest.mark.skipif(DNSMASQ is None, reason="needs dnsmasq (scripts/test-all.sh)")
def test_differential_resolver(gannet, tmp_path, echo):
    """`resolver` in stream: `proxy_pass $var` giving `name:port` is looked up through it;
    a name that does not exist and one without a port end the session with 500."""
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 up.test\n")
    dns_port = free_port()
    dns = subprocess.Popen([DNSMASQ, "-k", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", f"--addn-hosts={hosts}",
                            f"--port={dns_port}", "--listen-address=127.0.0.1", "--bind-interfaces", "--local=/test/",
                            "--user=root", "--group=root", "--pid-file="], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    a = echo.ports[0]
    p = ports(3)
    body = lambda side: (
        f"resolver 127.0.0.1:{dns_port} ipv6=off; resolver_timeout 5s;\n"
        "log_format r '$server_port $status';\n"
        "map $server_port $to {\n"
        f"  {p[side][0]} up.test:{a}; {p[side][1]} nx.test:{a}; default up.test;\n}}\n" +
        "".join(f"server {{ listen 127.0.0.1:{q}; access_log {{tmp}}/r.log r; proxy_pass $to; }}\n" for q in p[side]))
    try:
        with both(gannet, tmp_path, body) as tmps:
            logs = {}
            for side, tmp in tmps.items():
                assert wait_until(lambda: talk(p[side][0]) == b"[0]hello", deadline=10), side
                assert talk(p[side][1]) == b"" and talk(p[side][2]) == b""
                log = tmp / "r.log"
                assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 3), side
                order = {str(q): i for i, q in enumerate(p[side])}
                logs[side] = [re.sub(r"^\d+", lambda m: str(order[m.group(0)]), l) for l in log.read_text().splitlines()[-3:]]
                err = (tmp / "error.log").read_text()
                assert "nx.test could not be resolved" in err and 'no port in upstream "up.test"' in err, side
        assert logs["g"] == logs["n"] == ["0 200", "1 500", "2 500"], logs
    finally:
        dns.kill()
        dns.wait()


@needs_nginx
def test_differential_udp_proxy_requests(gannet, tmp_path):
    """UDP `proxy_requests 2`: a burst of 5 datagrams makes sessions of 2, 2 and 1 (each
    with its own upstream socket), no datagram is lost; with `proxy_responses 1` the last,
    short session ends with 200 at `proxy_timeout`. The same replies and log in both."""
    back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    back.bind(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                d, peer = back.recvfrom(100)
                back.sendto(b"%d %s" % (peer[1], d), peer)
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    b = back.getsockname()[1]
    p = ports(1)
    body = lambda side: (
        "log_format u '$status $bytes_received $bytes_sent';\n"
        f"server {{ listen 127.0.0.1:{p[side][0]} udp; proxy_requests 2; proxy_responses 1; proxy_timeout 1s;\n"
        f"  access_log {{tmp}}/u.log u; proxy_pass 127.0.0.1:{b}; }}")
    try:
        with both(gannet, tmp_path, body) as tmps:
            got = {}
            for side, tmp in tmps.items():
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
                    c.settimeout(5)
                    c.connect(("127.0.0.1", p[side][0]))
                    for i in range(5):
                        c.send(b"%d" % i)
                    replies = sorted((c.recv(100).split() for _ in range(5)), key=lambda r: r[1])
                ports_seen = [r[0] for r in replies]
                log = tmp / "u.log"
                assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == 3), side
                got[side] = ([r[1] for r in replies],
                             ports_seen[0] == ports_seen[1] != ports_seen[2] == ports_seen[3] != ports_seen[4],
                             sorted(log.read_text().splitlines()))
    finally:
        back.close()
    assert got["g"] == got["n"], got
    assert got["g"][:2] == ([b"0", b"1", b"2", b"3", b"4"], True), got


@needs_nginx
def test_differential_access_log_path_and_escapes(gannet, tmp_path):
    """`access_log` with a variable in its path writes to the file it names per session;
    a variable without a value is `-` by default and nothing with `escape=json`."""
    p = ports(1)
    body = lambda side: (
        "log_format d '[$upstream_addr]';\n"
        "log_format j escape=json '[$upstream_addr]';\n"
        f"server {{ listen 127.0.0.1:{p[side][0]}; return ok;\n"
        "  access_log {tmp}/v_$server_port.log d; access_log {tmp}/j.log j; }")
    with both(gannet, tmp_path, body) as tmps:
        got = {}
        for side, tmp in tmps.items():
            assert read_all(p[side][0]) == b"ok"
            v, j = tmp / f"v_{p[side][0]}.log", tmp / "j.log"
            assert wait_until(lambda: v.exists() and j.exists() and j.read_text()), side
            got[side] = (v.read_text(), j.read_text())
    assert got["g"] == got["n"] == ("[-]\n", "[]\n"), got


@needs_nginx
def test_differential_proxy_protocol_unknown_word_is_400(gannet, tmp_path):
    """`PROXY INVALID` without its line's end: nginx finds it broken at once (400) rather
    than waiting for the rest of the line."""
    p = ports(1)
    body = lambda side: (
        "log_format st '$status';\n"
        f"server {{ listen 127.0.0.1:{p[side][0]} proxy_protocol; access_log {{tmp}}/st.log st; return ok; }}")
    with both(gannet, tmp_path, body) as tmps:
        got = {}
        for side, tmp in tmps.items():
            start = time.monotonic()
            try:
                answer = read_all(p[side][0], b"PROXY INVALID", timeout=10)
            except ConnectionResetError:
                answer = b""
            assert answer == b"", side
            assert time.monotonic() - start < 5, side
            log = tmp / "st.log"
            assert wait_until(lambda: log.exists() and log.read_text()), side
            got[side] = log.read_text()
    assert got["g"] == got["n"] == "400\n", got


def test_download_rate_from_a_variable(gannet):
    """`proxy_download_rate $rate` (a `map`'s value): 6 KiB at 2k a second take about two
    seconds; a value that is not a size means no limit."""
    big = socket.socket()
    big.bind(("127.0.0.1", 0))
    big.listen(4)

    def serve():
        while True:
            try:
                c, _ = big.accept()
            except OSError:
                return
            with c:
                c.sendall(b"x" * 6144)

    threading.Thread(target=serve, daemon=True).start()
    p, q = free_port(), free_port()
    gannet.start(conf=conf(
        f"map $server_port $rate {{ {p} 2k; default junk; }}\n"
        f"server {{ listen 127.0.0.1:{p}; listen 127.0.0.1:{q}; proxy_download_rate $rate; proxy_pass 127.0.0.1:{big.getsockname()[1]}; }}"))
    try:
        took = []
        for port in (p, q):
            start = time.monotonic()
            assert read_all(port, timeout=10) == b"x" * 6144
            took.append(time.monotonic() - start)
    finally:
        big.close()
    assert 1.5 <= took[0] < 5 and took[1] < 1, took


def test_stream_config_errors(gannet):
    """`set` outside a server and on a built-in variable, `error_log` with a bad level:
    nginx's messages with the file and line."""
    cases = [
        ("set $a 1;\nserver { listen 127.0.0.1:1; return x; }", '"set" directive is not allowed here'),
        ("server { listen 127.0.0.1:1; set $remote_addr 1; return x; }", 'the duplicate "remote_addr" variable'),
        ("server { listen 127.0.0.1:1; error_log x.log loud; return x; }", 'invalid log level "loud"'),
        ("server { listen 127.0.0.1:1; proxy_half_close maybe; proxy_pass 127.0.0.1:2; }", "proxy_half_close"),
        ("server { listen 127.0.0.1:1; tcp_nodelay maybe; proxy_pass 127.0.0.1:2; }", "tcp_nodelay"),
    ]
    for body, msg in cases:
        r = gannet.check(conf=conf(body))
        assert r.returncode != 0 and msg in r.stderr, (body, r.stderr)
        assert "gannet.conf:" in r.stderr or "check.conf:" in r.stderr, r.stderr


@needs_nginx
def test_differential_no_live_upstreams_logs_the_group(gannet, tmp_path, echo):
    """A group whose servers are all `down`: 502, nginx's "no live upstreams" line, and
    the group's name as `$upstream_addr`. A group of a dead server and a `down` one: the
    dead one alone is tried (nginx's tries leave `down` servers out)."""
    dead = free_port()
    p = ports(2)
    body = lambda side: (
        "log_format n '$upstream_addr $status';\n"
        f"upstream u2 {{ server 127.0.0.1:{echo.ports[0]} down; server 127.0.0.1:{echo.ports[1]} backup down; }}\n"
        f"upstream u3 {{ server 127.0.0.1:{dead}; server 127.0.0.1:{echo.ports[1]} down; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][0]}; access_log {{tmp}}/n.log n; proxy_pass u2; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][1]}; access_log {{tmp}}/n3.log n; proxy_pass u3; }}")
    with both(gannet, tmp_path, body) as tmps:
        got = {}
        for side, tmp in tmps.items():
            assert talk(p[side][0]) == b"" and talk(p[side][1]) == b""
            log, log3 = tmp / "n.log", tmp / "n3.log"
            assert wait_until(lambda: log.exists() and log.read_text() and log3.exists() and log3.read_text()), side
            got[side] = (log.read_text(), log3.read_text().replace(str(dead), "DEAD"))
            assert 'no live upstreams while connecting to upstream' in (tmp / "error.log").read_text(), side
    assert got["g"] == got["n"] == ("u2 502\n", "127.0.0.1:DEAD 502\n"), got


@needs_nginx
def test_differential_udp_upload_rate(gannet, tmp_path):
    """UDP `proxy_upload_rate 500`: a 1000-byte datagram goes at once; for the two seconds
    its size costs the session reads nothing, so a datagram sent then is lost (nginx's
    too); one sent after goes through."""
    back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    back.bind(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                d, peer = back.recvfrom(2000)
                back.sendto(d, peer)
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    p = ports(1)
    body = lambda side: (
        f"server {{ listen 127.0.0.1:{p[side][0]} udp; proxy_upload_rate 500; proxy_timeout 5s;\n"
        f"  proxy_pass 127.0.0.1:{back.getsockname()[1]}; }}")
    data = b"1234567890" * 100
    try:
        with both(gannet, tmp_path, body):
            got = {}
            for side in p:
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
                    c.connect(("127.0.0.1", p[side][0]))
                    c.settimeout(5)
                    c.send(data)
                    first = c.recv(2000)
                    c.send(data)
                    c.settimeout(0.5)
                    try:
                        early = c.recv(2000)
                    except socket.timeout:
                        early = b""
                    # The second was dropped; once its predecessor's two seconds passed, a
                    # third one goes through.
                    time.sleep(1.6)
                    c.settimeout(5)
                    c.send(data)
                    late = c.recv(2000)
                got[side] = (first == data, early, late == data)
    finally:
        back.close()
    assert got["g"] == got["n"] == (True, b"", True), got


@needs_nginx
def test_differential_proxy_bind(gannet, tmp_path):
    """`proxy_bind 127.0.0.2`, a `proxy_bind $var` and a server that sets none under a
    stream-level one with `off`: the upstream sees the address asked for."""
    up = socket.socket()
    up.bind(("127.0.0.1", 0))
    up.listen(8)

    def serve():
        while True:
            try:
                c, peer = up.accept()
            except OSError:
                return
            with c:
                c.sendall(peer[0].encode())

    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))

    def serve_udp():
        while True:
            try:
                _, peer = udp.recvfrom(100)
                udp.sendto(peer[0].encode(), peer)
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    threading.Thread(target=serve_udp, daemon=True).start()
    u, uu = up.getsockname()[1], udp.getsockname()[1]
    p = ports(4)
    body = lambda side: (
        "map $server_port $from { default 127.0.0.3; }\n"
        "proxy_bind 127.0.0.4;\n"
        f"server {{ listen 127.0.0.1:{p[side][0]}; proxy_bind 127.0.0.2; proxy_pass 127.0.0.1:{u}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][1]}; proxy_bind $from; proxy_pass 127.0.0.1:{u}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][2]}; proxy_bind off; proxy_pass 127.0.0.1:{u}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][3]} udp; proxy_responses 1; proxy_pass 127.0.0.1:{uu}; }}")

    def dgram(port):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.settimeout(5)
            c.sendto(b"x", ("127.0.0.1", port))
            return c.recv(100)

    try:
        with both(gannet, tmp_path, body):
            got = {side: [read_all(q) for q in p[side][:3]] + [dgram(p[side][3])] for side in p}
    finally:
        up.close()
        udp.close()
    assert got["g"] == got["n"] == [b"127.0.0.2", b"127.0.0.3", b"127.0.0.1", b"127.0.0.4"], got


@needs_nginx
def test_differential_udp_refused_upstream_is_marked_failed(gannet, tmp_path):
    """UDP to a group whose first server's port is closed: the ICMP error ends that
    session and marks the server failed (`max_fails=1`), so the next sessions all go to
    the live one."""
    live = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    live.bind(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                _, peer = live.recvfrom(100)
                live.sendto(b"live", peer)
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    dead = free_port()
    p = ports(1)
    body = lambda side: (
        f"upstream u {{ server 127.0.0.1:{dead}; server 127.0.0.1:{live.getsockname()[1]}; }}\n"
        f"server {{ listen 127.0.0.1:{p[side][0]} udp; proxy_responses 1; proxy_timeout 1s; proxy_pass u; }}")

    def ask(port):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as c:
            c.settimeout(2)
            c.sendto(b".", ("127.0.0.1", port))
            try:
                return c.recv(100)
            except (socket.timeout, ConnectionRefusedError):
                return b""

    try:
        with both(gannet, tmp_path, body):
            got = {side: [ask(p[side][0]) for _ in range(5)] for side in p}
    finally:
        live.close()
    assert got["g"] == got["n"] == [b""] + [b"live"] * 4, got


def _nodelay_of_peer(conn: socket.socket) -> int:
    """TCP_NODELAY of the gannet socket at the other end of `conn` (found by its port in
    /proc/net/tcp, borrowed from its process with pidfd_getfd)."""
    import ctypes
    port = conn.getpeername()[1]
    local = f"0100007F:{port:04X}"
    inode = next(f.split()[9] for f in Path("/proc/net/tcp").read_text().splitlines()[1:]
                 if f.split()[1] == local)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if not Path(f"/proc/{pid}/comm").read_text().startswith("gannet"):
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != f"socket:[{inode}]":
                    continue
            except OSError:
                continue
            pidfd = os.pidfd_open(int(pid))
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                dup = libc.syscall(438, pidfd, int(fd), 0)  # pidfd_getfd
                assert dup >= 0, os.strerror(ctypes.get_errno())
                s = socket.socket(fileno=dup)
                try:
                    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                finally:
                    s.close()
            finally:
                os.close(pidfd)
    raise AssertionError(f"no gannet socket on port {port}")


def test_tcp_nodelay_on_the_upstream_before_its_second_send(gannet):
    """`tcp_nodelay` (on by default) is on the upstream socket by the time a second send
    goes to it (Nagle's algorithm never holds a connection's first send back, so the
    plain relay sets it then, not at the connect: a short session saves the call);
    `tcp_nodelay off` leaves it off."""
    up = socket.socket()
    up.bind(("127.0.0.1", 0))
    up.listen(4)
    on, off = free_port(), free_port()
    u = up.getsockname()[1]
    gannet.start(conf=conf(f"server {{ listen 127.0.0.1:{on}; proxy_pass 127.0.0.1:{u}; }}\n"
                           f"server {{ listen 127.0.0.1:{off}; tcp_nodelay off; proxy_pass 127.0.0.1:{u}; }}"))
    up.settimeout(5)
    try:
        for port, want in ((on, 1), (off, 0)):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
                c.sendall(b"a")
                conn, _ = up.accept()
                with conn:
                    conn.settimeout(5)
                    assert conn.recv(10) == b"a"
                    first = _nodelay_of_peer(conn)
                    c.sendall(b"b")
                    assert conn.recv(10) == b"b"
                    assert (first, _nodelay_of_peer(conn)) == (0, want), port
    finally:
        up.close()
