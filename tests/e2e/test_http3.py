"""HTTP/3 over QUIC (`listen ... quic`), with real clients: aioquic's HTTP/3 client
(tests/e2e/h3client.py) and ngtcp2's (`gtlsclient`, Debian's ngtcp2-client). Files with
ranges, 304 and gzip, a proxied answer, a FastCGI page, request bodies, SNI, the QUIC
directives as the client sees them (transport parameters, Retry), `$http3` and
`$server_protocol` in the access log, and config errors. Certificates come from test_tls's
throwaway CA. Debian's nginx 1.22 has no HTTP/3, so there is no differential peer here."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess

import pytest

from conftest import REPO, free_port, wait_until
from test_fastcgi import BODY_PHP, INFO_PHP, PHP_FPM, fpm  # noqa: F401  (fixture)
from test_tls import Pki, conf, pair

h3client = pytest.importorskip("h3client", reason="aioquic is installed by scripts/test-all.sh")

GTLSCLIENT = shutil.which("gtlsclient")

LOG = "log_format h3 '$server_protocol|$http3|$request|$status'; access_log {tmp}/h3.log h3;"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("pki3"))
    p.issue("ec", "ec.test", sans=("ec.test", "localhost"))
    p.issue("a", "a.test", sans=("a.test",))
    p.issue("b", "b.test", sans=("b.test",))
    return p


def quic_conf(pki, body: str = "", extra_servers: str = "", http: str = "") -> tuple[str, int]:
    """One server on TCP (TLS) and QUIC at the same port, as nginx's docs set it up."""
    port = free_port()
    return conf(f"""
    server {{
        listen 127.0.0.1:{port} ssl;
        listen 127.0.0.1:{port} quic reuseport;
        server_name localhost;
        root {{root}};
        {pair(pki, 'ec')}
        add_header Alt-Svc 'h3=":{port}"; ma=86400';
        location = /v {{ return 200 "$server_protocol|$http3|$request|$server_name|$ssl_server_name|$ssl_protocol\\n"; }}
        location = /offers {{ return 200 "$ssl_ciphers|$ssl_curves|$ssl_alpn_protocol\\n"; }}
        {body}
    }}
    {extra_servers}""", http=LOG + http), port


def h3log(srv) -> str:
    """The access log in the `h3` format (`LOG`)."""
    p = srv.tmp / "h3.log"
    return p.read_text() if p.exists() else ""


BIG = bytes(range(256)) * 1200 + b"tail"


def test_files_ranges_304_and_gzip(gannet, pki):
    text, port = quic_conf(pki, "gzip on; gzip_types text/plain; etag on;")
    page = b"compress me " * 500
    srv = gannet.start(conf=text, files={"big.bin": BIG, "page.txt": page}, port=port)
    info: dict = {}
    # (No HEAD here: aioquic holds a HEAD answer's body to its Content-Length and closes
    # the connection; test_ngtcp2_client_downloads sends one.)
    whole, part = h3client.fetch_many(port, [
        ("GET", "/big.bin", None, None),
        ("GET", "/big.bin", {"range": "bytes=1000-1999"}, None),
    ], sni="localhost", info=info)
    assert info["alpn"] == "h3"
    assert whole.status == 200 and whole.body == BIG
    assert whole.headers["content-length"] == str(len(BIG))
    assert whole.headers["alt-svc"] == f'h3=":{port}"; ma=86400'
    assert "connection" not in whole.headers
    assert part.status == 206 and part.body == BIG[1000:2000]
    assert part.headers["content-range"] == f"bytes 1000-1999/{len(BIG)}"
    etag = whole.headers["etag"]
    lm = whole.headers["last-modified"]
    again, since, zipped = h3client.fetch_many(port, [
        ("GET", "/big.bin", {"if-none-match": etag}, None),
        ("GET", "/big.bin", {"if-modified-since": lm}, None),
        ("GET", "/page.txt", {"accept-encoding": "gzip"}, None),
    ])
    assert again.status == 304 and again.body == b""
    assert since.status == 304
    assert zipped.status == 200 and zipped.headers["content-encoding"] == "gzip"
    assert gzip.decompress(zipped.body) == page
    offers = h3client.fetch(port, "/offers", sni="localhost")
    # aioquic offers these suites and groups (the client's ClientHello, as nginx gives it).
    assert offers.body.startswith(b"TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256"), offers.body
    assert offers.body.endswith(b"|h3\n") and b"X25519" in offers.body
    v = h3client.fetch(port, "/v", sni="localhost")
    assert v.body == b"HTTP/3.0|h3|GET /v HTTP/3.0|localhost|localhost|TLSv1.3\n"
    log = h3log(srv)
    assert "HTTP/3.0|h3|GET /big.bin HTTP/3.0|206" in log
    assert "HTTP/3.0|h3|GET /page.txt HTTP/3.0|200" in log


def test_tcp_listener_beside_quic_keeps_its_protocol(gannet, pki):
    text, port = quic_conf(pki)
    srv = gannet.start(conf=text, port=port)
    r = subprocess.run(["curl", "-sk", "--http1.1", f"https://127.0.0.1:{port}/v", "-D", "-"], capture_output=True, timeout=30)
    assert r.stdout.endswith(b"HTTP/1.1||GET /v HTTP/1.1|localhost||TLSv1.3\n")
    # The Alt-Svc header advertises the QUIC port to TCP clients.
    assert f'alt-svc: h3=":{port}"; ma=86400'.encode() in r.stdout.lower()
    assert wait_until(lambda: "HTTP/1.1||GET /v HTTP/1.1|200" in h3log(srv))


@pytest.mark.skipif(GTLSCLIENT is None, reason="ngtcp2-client is installed by scripts/test-all.sh")
def test_ngtcp2_client_downloads(gannet, pki, tmp_path):
    text, port = quic_conf(pki)
    srv = gannet.start(conf=text, files={"big.bin": BIG, "small.txt": "small\n"}, port=port)
    out = tmp_path / "dl"
    out.mkdir()
    r = subprocess.run([GTLSCLIENT, "-q", "--exit-on-all-streams-close", f"--download={out}", "localhost", str(port),
                        f"https://localhost:{port}/big.bin", f"https://localhost:{port}/small.txt"],
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (out / "big.bin").read_bytes() == BIG
    assert (out / "small.txt").read_bytes() == b"small\n"
    assert wait_until(lambda: h3log(srv).count("HTTP/3.0|h3|GET ") == 2)
    r = subprocess.run([GTLSCLIENT, "--no-quic-dump", "-m", "HEAD", "--exit-on-all-streams-close", "localhost", str(port),
                        f"https://localhost:{port}/big.bin"], capture_output=True, timeout=60)
    heads = r.stderr.decode(errors="replace")
    assert "[:status: 200]" in heads and f"[content-length: {len(BIG)}]" in heads, heads
    assert wait_until(lambda: "HTTP/3.0|h3|HEAD /big.bin HTTP/3.0|200" in h3log(srv))


def test_proxied_answer_and_request_bodies(gannet, pki):
    up = free_port()
    upstream = f"""
    server {{
        listen 127.0.0.1:{up};
        location / {{ return 200 "upstream $request_method $uri len=$content_length x=$http_x_a\\n"; }}
    }}"""
    text, port = quic_conf(pki, f"""
        client_max_body_size 1m;
        location /app/ {{ proxy_pass http://127.0.0.1:{up}/; }}
        location = /up {{ dav_methods PUT; root {{tmp}}; }}
    """, upstream)
    srv = gannet.start(conf=text, port=port)
    body = bytes(range(256)) * 400
    got, posted, put, too_big, short, extra = h3client.fetch_many(port, [
        ("GET", "/app/x?q=1", {"x-a": "hi"}, None),
        ("POST", "/app/y", None, body),
        ("PUT", "/up", None, body),
        ("POST", "/app/z", None, b"z" * (1024 * 1024 + 1)),
        # DATA that does not add up to the Content-Length (RFC 9114 4.1.2): 400, as nginx.
        ("POST", "/app/short", {"content-length": "10"}, b"abcd"),
        ("POST", "/app/extra", {"content-length": "2"}, b"abcd"),
    ])
    assert got.status == 200 and got.body == b"upstream GET /x len= x=hi\n"
    assert posted.status == 200 and posted.body == f"upstream POST /y len={len(body)} x=\n".encode()
    assert put.status == 201 and (srv.root.parent / "up").read_bytes() == body
    assert too_big.status == 413
    assert short.status == 400 and extra.status == 400


@pytest.mark.skipif(PHP_FPM is None, reason="php-fpm is installed by scripts/test-all.sh")
def test_fastcgi_page(gannet, pki, fpm):  # noqa: F811
    text, port = quic_conf(pki, f"""
        location ~ \\.php$ {{
            include {REPO}/conf/fastcgi.conf;
            fastcgi_pass unix:{fpm['sock']};
        }}""")
    gannet.start(conf=text, files={"info.php": INFO_PHP, "body.php": BODY_PHP}, port=port)
    body = b"q" * 70000
    info, posted = h3client.fetch_many(port, [
        ("GET", "/info.php?a=1", {"x-custom": "h3"}, None),
        ("POST", "/body.php", None, body),
    ], sni="localhost")
    assert info.status == 200, info.body
    got = json.loads(info.body)
    assert got["SERVER_PROTOCOL"] == "HTTP/3.0"
    assert got["HTTP_X_CUSTOM"] == "h3" and got["GET"] == {"a": "1"}
    assert got["HTTP_HOST"] == f"localhost:{port}"
    import hashlib
    assert posted.body.decode() == f"{len(body)} {hashlib.md5(body).hexdigest()}"


def test_sni_picks_certificate_and_server(gannet, pki):
    port = free_port()
    text = conf(f"""
    server {{
        listen 127.0.0.1:{port} quic;
        server_name a.test;
        {pair(pki, 'a')}
        location / {{ return 200 "a|$ssl_server_name\\n"; }}
    }}
    server {{
        listen 127.0.0.1:{port} quic;
        server_name b.test;
        {pair(pki, 'b')}
        location / {{ return 200 "b|$ssl_server_name\\n"; }}
    }}
    server {{ listen 127.0.0.1:{{port}}; }}""")
    gannet.start(conf=text, port=port)
    for name in ("a", "b"):
        info: dict = {}
        r = h3client.fetch(port, "/", sni=f"{name}.test", info=info)
        assert r.body == f"{name}|{name}.test\n".encode()
        assert info["cert_cn"] == f"CN={name}.test"
    # An unknown name gets the default server (the first), as on TCP.
    info = {}
    r = h3client.fetch(port, "/", sni="other.test", info=info)
    assert r.body == b"a|other.test\n" and info["cert_cn"] == "CN=a.test"


def test_http3_off_refuses_the_handshake(gannet, pki):
    port = free_port()
    text = conf(f"""
    server {{
        listen 127.0.0.1:{port} quic;
        server_name a.test;
        {pair(pki, 'a')}
        location / {{ return 200 "a\\n"; }}
    }}
    server {{
        listen 127.0.0.1:{port} quic;
        server_name b.test;
        http3 off;
        {pair(pki, 'b')}
    }}
    server {{ listen 127.0.0.1:{{port}}; }}""")
    srv = gannet.start(conf=text, port=port)
    assert h3client.fetch(port, "/", sni="a.test").status == 200
    with pytest.raises(Exception):
        h3client.fetch(port, "/", sni="b.test", timeout=5)
    assert wait_until(lambda: 'QUIC handshake refused for "b.test": http3 is off' in srv.error_log())


def test_transport_directives_reach_the_client(gannet, pki):
    text, port = quic_conf(pki, http="http3_max_concurrent_streams 7; http3_stream_buffer_size 32k;")
    first = gannet.start(conf=text, files={"big.bin": BIG}, port=port)
    info: dict = {}
    # More requests than the stream limit at once: they queue for credit and all complete.
    answers = h3client.fetch_many(port, [("GET", "/big.bin", None, None)] * 12, info=info)
    assert info["max_streams_bidi"] == 7
    assert info["stream_window"] == 32 * 1024
    assert info["max_data"] == 7 * 32 * 1024
    assert info["retries"] == 0
    assert all(a.status == 200 and a.body == BIG for a in answers)
    first.stop()
    # nginx's defaults: 128 streams, 64k per stream.
    text, port = quic_conf(pki)
    gannet.start(conf=text, port=port)
    info = {}
    h3client.fetch(port, "/v", info=info)
    assert (info["max_streams_bidi"], info["stream_window"]) == (128, 65536)


def test_quic_retry_validates_the_address_first(gannet, pki, tmp_path):
    key = tmp_path / "host.key"
    key.write_bytes(b"k" * 32)
    text, port = quic_conf(pki, f"quic_retry on; quic_host_key {key};")
    gannet.start(conf=text, port=port)
    info: dict = {}
    r = h3client.fetch(port, "/v", info=info)
    assert r.status == 200 and info["retries"] == 1


@pytest.mark.parametrize("line, message", [
    ("listen 127.0.0.1:{port} quic ssl;", '"listen" directive "ssl" parameter is incompatible with "quic"'),
    ("listen 127.0.0.1:{port} quic http2;", '"listen" directive "http2" parameter is incompatible with "quic"'),
    ("listen 127.0.0.1:{port} quic backlog=10;", '"listen" directive "backlog" parameter is incompatible with "quic"'),
    ("http3_max_concurrent_streams lots;", '"http3_max_concurrent_streams" directive invalid number'),
    ("http3_stream_buffer_size 1q;", '"http3_stream_buffer_size" directive invalid value'),
    ("quic_retry maybe;", 'it must be "on" or "off"'),
    ("quic_host_key /nonexistent/host.key;", 'open() "/nonexistent/host.key" failed'),
])
def test_bad_values_are_config_errors_with_file_and_line(gannet, pki, line, message):
    port = free_port()
    text = conf(f"""
    server {{
        listen 127.0.0.1:{port} quic;
        {pair(pki, 'ec')}
        {line.replace('{port}', str(free_port()))}
    }}
    server {{ listen 127.0.0.1:{{port}}; }}""")
    r = gannet.check(conf=text)
    assert r.returncode != 0
    assert message in r.stderr, r.stderr
    # The file and the line of the directive.
    want = next(i for i, x in enumerate(text.splitlines(), 1) if x.strip().startswith(line.split()[0]) and (line.split()[0] != "listen" or "quic " in x))
    assert f"check.conf:{want}" in r.stderr, r.stderr


def test_quic_address_needs_a_certificate_and_tls13(gannet, pki):
    port = free_port()
    r = gannet.check(conf=conf(f"server {{ listen 127.0.0.1:{port} quic; }} server {{ listen 127.0.0.1:{{port}}; }}"))
    assert r.returncode != 0 and 'no "ssl_certificate" is defined for the "listen ... quic" directive' in r.stderr
    r = gannet.check(conf=conf(f"""server {{ listen 127.0.0.1:{port} quic; ssl_protocols TLSv1.2; {pair(pki, 'ec')} }}
        server {{ listen 127.0.0.1:{{port}}; }}"""))
    assert r.returncode != 0 and '"ssl_protocols" must enable TLSv1.3 for the "listen ... quic" directive' in r.stderr


@pytest.mark.skipif(GTLSCLIENT is None, reason="ngtcp2-client is installed by scripts/test-all.sh")
def test_downloads_complete_despite_lost_packets(gannet, pki, tmp_path):
    """5% of the packets lost each way. (`tc netem` on a network namespace's loopback
    would be the outside way, but this kernel has no netem: ngtcp2's client drops the
    packets itself, on receipt for the server's and before sending for its own.) Every
    download completes, bytes compared, so the server's loss recovery works."""
    text, port = quic_conf(pki)
    files = {f"f{i}.bin": bytes((i * 7 + k) % 251 for k in range(300_000 + i * 50_000)) for i in range(4)}
    srv = gannet.start(conf=text, files=files, port=port)
    for run in range(3):
        out = tmp_path / f"dl{run}"
        out.mkdir()
        urls = [f"https://localhost:{port}/{name}" for name in files]
        r = subprocess.run([GTLSCLIENT, "-q", "--rx-loss=0.05", "--tx-loss=0.05", "--exit-on-all-streams-close",
                            f"--download={out}", "localhost", str(port), *urls], capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr
        for name, data in files.items():
            assert (out / name).read_bytes() == data, (run, name)
    assert wait_until(lambda: h3log(srv).count("HTTP/3.0|h3|GET /f") == 12)


CADDY = shutil.which("caddy")


@pytest.mark.skipif(CADDY is None, reason="caddy is installed by scripts/test-all.sh")
def test_status_codes_and_range_fields_match_caddy(gannet, pki, tmp_path):
    """Caddy serves the same files over HTTP/3: the statuses and the range fields of the
    answers agree (their error pages and other fields are each server's own)."""
    text, port = quic_conf(pki)
    gannet.start(conf=text, files={"big.bin": BIG, "dir/a.txt": "a\n"}, port=port)
    cport = free_port()
    (tmp_path / "Caddyfile").write_text(f"""{{
\tadmin off
\tauto_https disable_redirects
\tservers {{
\t\tprotocols h1 h2 h3
\t}}
}}
https://localhost:{cport} {{
\ttls {pki.path('ec.pem')} {pki.path('ec.key')}
\troot * {gannet.tmp / 'www'}
\tfile_server
}}
""")
    caddy = subprocess.Popen([CADDY, "run", "--config", str(tmp_path / "Caddyfile"), "--adapter", "caddyfile"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    try:
        def up():
            try:
                return h3client.fetch(cport, "/dir/a.txt", sni="localhost", timeout=2).status == 200
            except Exception:
                return False

        assert wait_until(up, deadline=20)
        reqs = [
            ("GET", "/big.bin", None, None),
            ("GET", "/big.bin", {"range": "bytes=10-19"}, None),
            ("GET", "/big.bin", {"range": "bytes=-100"}, None),
            ("GET", "/big.bin", {"range": f"bytes={len(BIG)}-"}, None),
            ("GET", "/missing", None, None),
            ("GET", "/dir/a.txt", None, None),
        ]
        ours = h3client.fetch_many(port, reqs, sni="localhost")
        theirs = h3client.fetch_many(cport, reqs, sni="localhost")
        for (_, path, hdrs, _), a, b in zip(reqs, ours, theirs):
            assert a.status == b.status, (path, hdrs, a.status, b.status)
            if a.status in (200, 206):
                assert a.body == b.body, path
                # (nginx, so gannet, sends Accept-Ranges on a 200 only; Caddy on a 206 too.)
                fields = ("content-length", "content-range") if a.status == 206 else ("content-length", "accept-ranges")
                for f in fields:
                    assert a.headers.get(f) == b.headers.get(f), (path, hdrs, f)
            if a.status == 416:
                assert a.headers["content-range"] == b.headers["content-range"]
        # Each one's own validators give 304 from each.
        for p, first in ((port, ours[0]), (cport, theirs[0])):
            again = h3client.fetch(p, "/big.bin", headers={"if-none-match": first.headers["etag"]}, sni="localhost")
            assert again.status == 304, p
    finally:
        caddy.terminate()
        caddy.wait(10)


def test_keepalive_requests_ends_the_connection_with_goaway(gannet, pki):
    text, port = quic_conf(pki, "keepalive_requests 2;")
    srv = gannet.start(conf=text, port=port)
    answers = h3client.fetch_many(port, [("GET", "/v", None, None)] * 3, timeout=10)
    assert sorted(a.status for a in answers) == [0, 200, 200]
    assert [a.reset for a in answers].count(True) == 1
    assert wait_until(lambda: h3log(srv).count("GET /v HTTP/3.0|200") == 2)
    # A new connection is served again.
    assert h3client.fetch(port, "/v").status == 200


@pytest.mark.parametrize("early", ["on", "off"])
def test_0rtt_only_with_ssl_early_data_on(gannet, pki, early):
    text, port = quic_conf(pki, f"""ssl_early_data {early};
        location = /e {{ return 200 "early=$ssl_early_data\\n"; }}""")
    srv = gannet.start(conf=text, port=port)
    tickets: list = []
    first = h3client.fetch(port, "/e", sni="localhost", tickets=tickets)
    assert tickets, "the server sent no session ticket"
    assert (tickets[-1].max_early_data_size or 0) == (0xFFFFFFFF if early == "on" else 0)
    again = h3client.fetch(port, "/e", sni="localhost", tickets=tickets)
    assert again.status == 200
    # Sent in 0-RTT data and answered before the handshake completed: "1", as nginx's
    # $ssl_early_data; without ssl_early_data the request waits for the handshake.
    assert again.body == (b"early=1\n" if early == "on" else b"early=\n")
    assert first.body == b"early=\n"
    assert wait_until(lambda: h3log(srv).count("GET /e HTTP/3.0|200") == 2)


def test_access_rules_limits_redirects_and_error_pages(gannet, pki):
    """The phases run as over HTTP/1.x and HTTP/2 (one exchange for all): access rules,
    limit_req, rewrites with their redirects, error_page."""
    text, port = quic_conf(pki, """
        location /private/ { deny all; }
        location /limited/ { limit_req zone=one nodelay; }
        location = /old { return 301 /new; }
        location = /gone { return 410; }
        error_page 410 /gone.html;
        location = /gone.html { internal; return 200 "custom gone\\n"; }
    """, http="limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;")
    srv = gannet.start(conf=text, files={"limited/a": "a\n", "limited/b": "b\n"}, port=port)
    private, first, second, old, gone = h3client.fetch_many(port, [
        ("GET", "/private/x", None, None),
        ("GET", "/limited/a", None, None),
        ("GET", "/limited/b", None, None),
        ("GET", "/old", None, None),
        ("GET", "/gone", None, None),
    ], sni="localhost")
    assert private.status == 403
    assert sorted([first.status, second.status]) == [200, 503]
    assert old.status == 301 and old.headers["location"] == f"https://localhost:{port}/new"
    assert gone.status == 410 and gone.body == b"custom gone\n"
    assert wait_until(lambda: "GET /private/x HTTP/3.0|403" in h3log(srv))
    assert "access forbidden by rule" in srv.error_log()
