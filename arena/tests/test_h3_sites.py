"""The --h3 variant's servers: gannet and Caddy configured for HTTP/3 over QUIC beside TLS on
TCP at the same port number, in both profiles, each config passing the server's own check;
both started and fetched over HTTP/3 by h3load (the run's certificate verified, ALPN h3, the
image whole); every other server left out with its reason.

Like the smoke tests this needs h3load (`cargo build --release -p h3load`, or H3LOAD_BIN) and
fails, not skips, without it."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from arena import ports, tls
from arena.clients import h3load
from arena.runner import transport_plan
from arena.scenarios.base import Options
from arena.servers import PROFILES, SERVERS, Site, SiteOptions
from arena.servers.base import TlsSite
from arena.servers.gannet import gannet_binary
from test_render import CHECKERS, GANNET_DIRECTIVES

H3_SERVERS = ("gannet", "caddy")
# What gannet's HTTP/3 config may use on top of the static site's directives.
GANNET_H3_DIRECTIVES = {"ssl_certificate", "ssl_certificate_key", "ssl_session_tickets", "ssl_session_cache",
                        "quic_gso"}


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cert")
    folder.chmod(0o755)
    return tls.make_certificate(folder / "tls")


def h3_options(cert, resumption: bool = False) -> SiteOptions:
    return SiteOptions(tls=TlsSite(cert.cert, cert.key, http3=True, resumption=resumption))


def render(name, profile, site_options, workdir, docroot):
    server = SERVERS[name]
    rundir = workdir / f"{name}-{profile}"
    rundir.mkdir()
    configs = server.configs(Site(docroot, 18443, site_options), rundir, profile)
    for file, text in configs.items():
        (rundir / file).write_text(text)
    return server, rundir, configs


def test_only_gannet_and_caddy_serve_h3():
    chosen, skipped = transport_plan(list(SERVERS.values()), Options(transport="h3"))
    assert [s.name for s in chosen] == list(H3_SERVERS)
    assert "nginx 1.22 has no HTTP/3" in skipped["nginx"]
    assert "-QUIC" in skipped["haproxy"] and "h2o 2.2" in skipped["h2o"]
    assert skipped["apache-prefork"] == skipped["apache-event"] == "Apache httpd 2.4 has no HTTP/3"
    assert set(skipped) == set(SERVERS) - set(H3_SERVERS)
    # The other variants are as they were.
    assert transport_plan([SERVERS["nginx"]], Options(transport="h2"))[1] == {}


@pytest.mark.parametrize("profile", PROFILES)
def test_gannet_listens_quic_beside_tls(profile, cert, workdir, docroot):
    _, rundir, configs = render("gannet", profile, h3_options(cert), workdir, docroot[0])
    text = configs["gannet.conf"]
    assert re.search(r"listen 127\.0\.0\.1:18443 ssl[ ;]", text)
    assert re.search(r"^\s*listen 127\.0\.0\.1:18443 quic;$", text, re.MULTILINE)
    assert ("quic_gso on;" in text) == (profile == "tuned")
    assert "http2" not in text
    done = subprocess.run([str(gannet_binary()), "-t", "-c", str(rundir / "gannet.conf"), "-p", f"{rundir}/"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    names = set(re.findall(r"(?:^|[{};])\s*([a-z_0-9]+)", re.sub(r"#.*", "", text)))
    assert names <= GANNET_DIRECTIVES | GANNET_H3_DIRECTIVES, names - GANNET_DIRECTIVES - GANNET_H3_DIRECTIVES


@pytest.mark.parametrize("resumption", [False, True], ids=["full-handshakes", "resumption"])
@pytest.mark.parametrize("profile", PROFILES)
def test_caddy_serves_h3_and_validates(profile, resumption, cert, workdir, docroot):
    server, rundir, configs = render("caddy", profile, h3_options(cert, resumption), workdir, docroot[0])
    assert "protocols h1 h3\n" in configs["Caddyfile"]
    main = rundir / ("caddy.json" if "caddy.json" in configs else "Caddyfile")
    if not resumption:
        adapted = json.loads(configs["caddy.json"])
        srv = adapted["apps"]["http"]["servers"]["srv0"]
        assert srv["protocols"] == ["h1", "h3"] and srv["listen"] == ["127.0.0.1:18443"]
        assert adapted["apps"]["tls"]["session_tickets"] == {"disabled": True}
    command = CHECKERS["caddy"](rundir, main)
    if main.suffix == ".json":
        command = command[:command.index("--adapter")]
    env = dict(os.environ, **server.environment(rundir, profile))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", H3_SERVERS)
def test_server_answers_h3load(name, profile, cert, workdir, docroot):
    site = Site(docroot[0], ports.free_port(), h3_options(cert))
    running = SERVERS[name].start(site, workdir / name, profile, "0")
    try:
        # The TCP side still speaks HTTP/1.1 over TLS (the arena waits for and probes it there).
        record = tls.server_record(site.host, site.port, "h3", cert.cert)
        assert record["alpn"] == "http/1.1" and record["protocol"] == "TLSv1.3", record
        image = h3load.probe(running.url("/img.jpg"), cert.cert, "1", docroot[1]["img.jpg"])
        assert image == {"alpn": "h3", "protocol": "TLSv1.3", "verified": True, "status_2xx": 2,
                         "body_bytes": 2 * docroot[1]["img.jpg"], "error": None}
        # 30 requests over 3 connections, 4 streams each: every one answered whole.
        result, tool, failure = h3load.run(running.url("/robots.txt"), 3, 30, "1", streams=4, cafile=cert.cert)
        assert failure is None, tool.stderr
        assert result.requests == result.sent == 30 and result.failures == 0
        assert result.body_bytes == 30 * docroot[1]["robots.txt"]
        assert result.extra["connections_made"] == 3 and result.extra["application_protocol"] == "h3"
    finally:
        running.stop()


def test_wrong_certificate_fails_the_probe(cert, tmp_path, workdir, docroot):
    """h3load verifies against --cacert: a server with another certificate is not served."""
    other = tls.make_certificate(tmp_path / "other")
    site = Site(docroot[0], ports.free_port(), h3_options(cert))
    running = SERVERS["gannet"].start(site, workdir / "gannet", "tuned", "0")
    try:
        info = h3load.probe(running.url("/robots.txt"), other.cert, "1")
        assert info["error"] and "h3load exited with code 1" in info["error"], info
        assert info["status_2xx"] == 0
    finally:
        running.stop()


def test_connection_ended_by_goaway_is_made_again(cert, workdir, docroot):
    """gannet's default profile keeps nginx's `keepalive_requests 1000`, which over HTTP/3
    ends a connection with GOAWAY after 1,000 streams: h3load makes a new one and every
    request is answered, none counted failed (those refused unprocessed are sent again)."""
    site = Site(docroot[0], ports.free_port(), h3_options(cert))
    running = SERVERS["gannet"].start(site, workdir / "gannet", "default", "0")
    try:
        result, tool, failure = h3load.run(running.url("/robots.txt"), 1, 2500, "1", streams=10, cafile=cert.cert)
        assert failure is None, tool.stderr
        assert result.requests == result.sent == 2500 and result.failures == 0, tool.stdout
        assert result.extra["connections_made"] >= 3, tool.stdout  # 1,000 requests at most on each
        assert result.body_bytes == 2500 * docroot[1]["robots.txt"]
    finally:
        running.stop()
