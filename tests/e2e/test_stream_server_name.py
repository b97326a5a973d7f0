"""Stream virtual servers (nginx 1.25.5+): several `server` blocks on one `listen`
address, chosen by the SNI name of `listen ... ssl` (during the handshake, so the chosen
server's certificate answers) or of `ssl_preread` (TLS passed through untouched), by
`server_name` (exact, `*.suffix`, `.name`, `prefix.*`, `~regex` with named captures),
else the `default_server`; `$server_name`; the config errors with file and line.

Debian's nginx 1.22 has no stream `server_name`, so these follow nginx's documentation
and its own tests (stream_server_name.t, stream_ssl_reject_handshake.t) instead of a
side-by-side run."""

from __future__ import annotations

import socket
import ssl
import subprocess

import pytest

from conftest import free_port, wait_until
from test_stream import Echo, conf
from test_stream_ssl import TlsEcho
from test_tls import Pki

pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="needs the openssl command-line tool",
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki"))
    for name in ("alpha", "beta", "fallback"):
        p.issue(name, f"{name}.test")
    return p


@pytest.fixture
def echo():
    e = Echo(3)
    yield e
    e.close()


def tls_talk(port: int, pki: Pki, sni: str | None, data: bytes = b"hi") -> tuple[str, bytes]:
    """A TLS session through `port` with `sni` (None: no SNI): the CN of the certificate
    that answered and the first answer read."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(pki.path("ca.pem"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=sni) as t:
            cert = t.getpeercert()
            cn = [v for rdn in cert["subject"] for k, v in rdn if k == "commonName"][0]
            t.sendall(data)
            got = b""
            while True:
                try:
                    d = t.recv(4096)
                except (ssl.SSLEOFError, ConnectionResetError):
                    break
                if not d:
                    break
                got += d
                if data in got:
                    break
            return cn, got


def certs(pki: Pki, name: str) -> str:
    return f"ssl_certificate {pki.path(name + '.pem')}; ssl_certificate_key {pki.path(name + '.key')};"


def test_sni_picks_server_certificate_and_upstream(gannet, pki, echo):
    """Two servers on one `listen ... ssl` and a default one: each SNI name gets its
    server's certificate and upstream; an unknown name and no SNI get the default
    server (marked `default_server` though written last); `$server_name` is logged."""
    p = free_port()
    a, b, c = echo.ports
    srv = gannet.start(conf=conf(
        "log_format vs '$server_name $ssl_server_name $upstream_addr';\n"
        f"server {{ listen 127.0.0.1:{p} ssl; server_name alpha.test; {certs(pki, 'alpha')}\n"
        f"  access_log {{tmp}}/vs.log vs; proxy_pass 127.0.0.1:{a}; }}\n"
        f"server {{ listen 127.0.0.1:{p}; server_name beta.test; {certs(pki, 'beta')}\n"
        f"  access_log {{tmp}}/vs.log vs; proxy_pass 127.0.0.1:{b}; }}\n"
        f"server {{ listen 127.0.0.1:{p} default_server; server_name fallback.test; {certs(pki, 'fallback')}\n"
        f"  access_log {{tmp}}/vs.log vs; proxy_pass 127.0.0.1:{c}; }}"))
    assert tls_talk(p, pki, "alpha.test") == ("alpha.test", b"[0]hi")
    assert tls_talk(p, pki, "BETA.test") == ("beta.test", b"[1]hi")
    assert tls_talk(p, pki, "unknown.test") == ("fallback.test", b"[2]hi")
    assert tls_talk(p, pki, None) == ("fallback.test", b"[2]hi")
    log = srv.tmp / "vs.log"
    assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 4), log
    assert log.read_text().splitlines() == [
        f"alpha.test alpha.test 127.0.0.1:{a}",
        f"beta.test beta.test 127.0.0.1:{b}",
        f"fallback.test unknown.test 127.0.0.1:{c}",
        f"fallback.test - 127.0.0.1:{c}",
    ]


def test_chosen_server_without_certificate_uses_default_one(gannet, pki):
    """A chosen server with no certificate of its own answers with the default server's
    (nginx keeps the default's SSL context), but its own `return`; one with
    `ssl_reject_handshake on` refuses the handshake."""
    p = free_port()
    gannet.start(conf=conf(
        f"server {{ listen 127.0.0.1:{p} ssl; {certs(pki, 'fallback')} return default; }}\n"
        f"server {{ listen 127.0.0.1:{p}; server_name plain.test; return $server_name; }}\n"
        f"server {{ listen 127.0.0.1:{p}; server_name no.test; ssl_reject_handshake on; return no; }}"))
    assert tls_talk(p, pki, "plain.test") == ("fallback.test", b"plain.test")
    assert tls_talk(p, pki, "other.test") == ("fallback.test", b"default")
    with pytest.raises(ssl.SSLError, match="UNRECOGNIZED_NAME|unrecognized name"):
        tls_talk(p, pki, "no.test")


def test_wildcard_and_regex_names(gannet, pki):
    """nginx's order: exact, the longest `*.suffix`, `prefix.*`, then regexes in config
    order; `.name` is the name and its subdomains; a regex's named capture is a variable;
    `$server_name` of a regex server is the regex as written."""
    p = free_port()
    names = [
        ("exact", "www.example.com"),
        ("wc", "*.example.com"),
        ("wclong", "*.deep.example.com"),
        ("tail", "mail.*"),
        ("dot", ".dot.test"),
        ("re", r"~^(?<sub>[a-z]+)\.re\.test$"),
    ]
    body = f"{certs(pki, 'alpha')}\nserver {{ listen 127.0.0.1:{p} ssl; return default; }}\n"
    for tag, n in names:
        ret = "$sub" if tag == "re" else f"{tag}:$server_name"
        body += f'server {{ listen 127.0.0.1:{p}; server_name "{n}"; return "{ret}"; }}\n'
    gannet.start(conf=conf(body))
    cases = {
        "www.example.com": b"exact:www.example.com",
        "a.example.com": b"wc:*.example.com",
        "a.deep.example.com": b"wclong:*.deep.example.com",
        "mail.example.org": b"tail:mail.*",
        "dot.test": b"dot:dot.test",
        "x.dot.test": b"dot:dot.test",
        "abc.re.test": b"abc",
        "ABC.RE.TEST": b"abc",
        "a1.re.test": b"default",
    }
    got = {sni: tls_talk(p, pki, sni)[1] for sni in cases}
    assert got == cases


def test_ssl_preread_picks_server_without_terminating(gannet, pki):
    """`ssl_preread on` in the default server: the ClientHello's name moves the session
    to the server that has it, whose `proxy_pass` gets the TLS bytes as they came (the
    client sees the backend's own certificate); an unknown name stays in the default."""
    backs = {n: TlsEcho(pki, n) for n in ("alpha", "beta", "fallback")}
    try:
        p = free_port()
        srv = gannet.start(conf=conf(
            "log_format pr '$server_name $ssl_preread_server_name';\n"
            f"server {{ listen 127.0.0.1:{p}; ssl_preread on; access_log {{tmp}}/pr.log pr;\n"
            f"  proxy_pass 127.0.0.1:{backs['fallback'].port}; }}\n"
            f"server {{ listen 127.0.0.1:{p}; server_name alpha.test; access_log {{tmp}}/pr.log pr;\n"
            f"  proxy_pass 127.0.0.1:{backs['alpha'].port}; }}\n"
            f"server {{ listen 127.0.0.1:{p}; server_name ~^b.*; access_log {{tmp}}/pr.log pr;\n"
            f"  proxy_pass 127.0.0.1:{backs['beta'].port}; }}"))
        assert tls_talk(p, pki, "alpha.test") == ("alpha.test", b"ok:hi")
        assert tls_talk(p, pki, "beta.test") == ("beta.test", b"ok:hi")
        assert tls_talk(p, pki, "gamma.test") == ("fallback.test", b"ok:hi")
        assert [b.sni for b in backs.values()] == [["alpha.test"], ["beta.test"], ["gamma.test"]]
        log = srv.tmp / "pr.log"
        assert wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 3)
        assert log.read_text().splitlines() == [
            "alpha.test alpha.test", "~^b.* beta.test", " gamma.test"]
    finally:
        for b in backs.values():
            b.close()


def test_without_ssl_or_preread_default_serves(gannet):
    """A plain address with several servers: nothing names one, the default serves."""
    p = free_port()
    gannet.start(conf=conf(
        f"server {{ listen 127.0.0.1:{p}; server_name a.test; return a; }}\n"
        f"server {{ listen 127.0.0.1:{p} default_server; server_name b.test; return b; }}"))
    with socket.create_connection(("127.0.0.1", p), timeout=5) as s:
        assert s.recv(10) == b"b"


def test_config_errors(gannet, pki):
    """nginx's messages, with the file and line."""
    p = free_port()
    cert = certs(pki, "alpha")
    cases = [
        (f"server {{ listen 127.0.0.1:{p} default_server; return a; }}\n"
         f"server {{ listen 127.0.0.1:{p} default_server; return b; }}",
         f"a duplicate default server for 127.0.0.1:{p}", ":11"),
        (f"server {{ listen 127.0.0.1:{p} backlog=10; return a; }}\n"
         f"server {{ listen 127.0.0.1:{p} backlog=20; return b; }}",
         f"duplicate listen options for 127.0.0.1:{p}", ":11"),
        (f"server {{ listen 127.0.0.1:{p}; listen 127.0.0.1:{p}; return a; }}",
         f"a duplicate listen 127.0.0.1:{p}", ":10"),
        (f"server {{ listen 127.0.0.1:{p}; server_name *x; return a; }}",
         'server name "*x" is invalid', ":10"),
        (f"server {{ listen 127.0.0.1:{p}; server_name ~; return a; }}",
         'empty regex in server name "~"', ":10"),
        (f"server_name a.test;\nserver {{ listen 127.0.0.1:{p}; return a; }}",
         '"server_name" directive is not allowed here', ":10"),
        (f"server {{ listen 127.0.0.1:{p}; server_names_hash_bucket_size 64; return a; }}",
         '"server_names_hash_bucket_size" directive is not allowed here', ":10"),
        (f"server_names_hash_max_size lots;\nserver {{ listen 127.0.0.1:{p}; return a; }}",
         '"server_names_hash_max_size" directive invalid number', ":10"),
        (f"server {{ listen 127.0.0.1:{p} ssl; return a; }}\n"
         f"server {{ listen 127.0.0.1:{p}; server_name x; {cert} return b; }}",
         'no "ssl_certificate" is defined for the "listen ... ssl" directive in', ":10"),
    ]
    for body, msg, line in cases:
        r = gannet.check(conf=conf(body))
        assert r.returncode != 0 and msg in r.stderr, (body, r.stderr)
        assert f"check.conf{line}" in r.stderr, (body, r.stderr)


def test_hash_sizes_accepted(gannet):
    p = free_port()
    r = gannet.check(conf=conf("server_names_hash_max_size 1024; server_names_hash_bucket_size 128;\n"
                               f"server {{ listen 127.0.0.1:{p}; server_name a; return a; }}"))
    assert r.returncode == 0, r.stderr
