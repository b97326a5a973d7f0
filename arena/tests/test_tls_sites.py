"""The --tls and --h2 variants' server configs: every server's TLS (and HTTP/2) directives in
both profiles, each config passing the server's own check (gannet's too), and every server
started on TLS with the run's kind of certificate, negotiating what the variant asks for:
TLSv1.3, the ALPN protocol offered, no session resumption unless asked, and the image served
whole. Apache prefork's HTTP/2 refusal, which the arena reports instead of running it, is
checked against httpd itself."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from arena import ports, probe, tls
from arena.clients import idle
from arena.servers import PROFILES, SERVERS, WEB_SERVERS, Site, SiteOptions
from arena.servers.base import TlsSite
from arena.servers.gannet import gannet_binary
from test_render import CHECKERS, GANNET_DIRECTIVES

TRANSPORTS = ("tls", "h2")
# What gannet's TLS config may use on top of the static site's directives.
GANNET_TLS_DIRECTIVES = {"ssl_certificate", "ssl_certificate_key", "ssl_session_tickets", "ssl_session_cache",
                         "http2"}


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cert")
    folder.chmod(0o755)
    return tls.make_certificate(folder / "tls")


def options(cert, transport: str, resumption: bool = False, **more) -> SiteOptions:
    return SiteOptions(tls=TlsSite(cert.cert, cert.key, http2=transport == "h2", resumption=resumption), **more)


def render(name, profile, site_options, workdir, docroot):
    server = SERVERS[name]
    rundir = workdir / f"{name}-{profile}"
    rundir.mkdir()
    configs = server.configs(Site(docroot, 18443, site_options), rundir, profile)
    for file, text in configs.items():
        (rundir / file).write_text(text)
    return server, rundir, configs


def expected_lines(name: str, cert, transport: str, resumption: bool, profile: str) -> list[str]:
    """Regular expressions every rendered config must match (the directives that make TLS)."""
    h2 = transport == "h2"
    c, k = re.escape(str(cert.cert)), re.escape(str(cert.key))
    if name in ("gannet", "nginx"):
        lines = [rf"ssl_certificate {c};", rf"ssl_certificate_key {k};"]
        if name == "gannet":
            lines += [r"listen 127\.0\.0\.1:18443 ssl[ ;]"] + ([r"http2 on;"] if h2 else [])
        else:
            lines += [r"listen 127\.0\.0\.1:18443 ssl http2[ ;]" if h2 else r"listen 127\.0\.0\.1:18443 ssl[ ;]",
                      r"ssl_protocols TLSv1\.2 TLSv1\.3;" if profile == "tuned" else
                      r"ssl_protocols TLSv1 TLSv1\.1 TLSv1\.2 TLSv1\.3;"]
        if not resumption:
            lines += [r"ssl_session_tickets off;", r"ssl_session_cache off;"]
        return lines
    if name.startswith("apache"):
        lines = [r"LoadModule ssl_module \S+/mod_ssl\.so", r"SSLEngine on", rf'SSLCertificateFile "{c}"',
                 rf'SSLCertificateKeyFile "{k}"', r"Protocols h2 http/1\.1" if h2 else r"Protocols http/1\.1$"]
        if h2:
            lines.append(r"LoadModule http2_module \S+/mod_http2\.so")
        if not resumption:
            lines += [r"SSLSessionCache none", r"SSLSessionTickets off"]
        return lines
    if name == "lighttpd":
        lines = [r'"mod_openssl"', r'ssl\.engine = "enable"', rf'ssl\.pemfile = "{c}"', rf'ssl\.privkey = "{k}"']
        if not resumption:
            lines.append(r'ssl\.openssl\.ssl-conf-cmd = \("Options" => "-SessionTicket"\)')
        return lines
    if name == "h2o":
        lines = [rf"  ssl:\n    certificate-file: {c}\n    key-file: {k}", r"http2-idle-timeout: 300"]
        if not resumption:
            lines.append(r"ssl-session-resumption:\n  mode: off")
        return lines
    assert name == "caddy"
    return [r"https://127\.0\.0\.1:18443 \{", rf"\ttls {c} {k}\n",
            r"protocols h1 h2\n" if h2 else r"protocols h1\n"]


@pytest.mark.parametrize("resumption", [False, True], ids=["full-handshakes", "resumption"])
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("name", list(WEB_SERVERS))
def test_tls_config_has_the_directives(name, transport, profile, resumption, cert, workdir, docroot):
    server, _, configs = render(name, profile, options(cert, transport, resumption, keepalive_timeout=300),
                                workdir, docroot[0])
    text = configs[server.config_file]
    assert "{{" not in text and "}}" not in text
    for pattern in expected_lines(name, cert, transport, resumption, profile):
        assert re.search(pattern, text, re.MULTILINE), f"{pattern!r} not in:\n{text}"
    # HTTP/2 stays off in --tls configs, where a server can say so (lighttpd's default profile
    # turns h2proto on itself, and h2o always offers h2 over TLS).
    if transport == "tls" and name not in ("lighttpd", "h2o"):
        assert "http2" not in text and " h2" not in text
    if not resumption and name != "caddy":
        assert "session" in text.lower()
    if name == "caddy":
        # The Caddyfile has no switch for session tickets: Caddy's own JSON, with them disabled.
        if resumption:
            assert set(configs) == {"Caddyfile"}
        else:
            adapted = json.loads(configs["caddy.json"])
            assert adapted["apps"]["tls"]["session_tickets"] == {"disabled": True}
            assert adapted["apps"]["http"]["servers"]["srv0"]["listen"] == ["127.0.0.1:18443"]
        if profile == "default":
            assert "auto_https disable_redirects" in text  # no redirect listener on port 80


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(WEB_SERVERS))
def test_cleartext_configs_have_no_tls(name, profile, workdir, docroot):
    server, _, configs = render(name, profile, SiteOptions(), workdir, docroot[0])
    text = re.sub(r"#.*", "", configs[server.config_file]).lower()
    assert "ssl" not in text and "tls " not in text and "https://" not in text
    assert set(configs) == {server.config_file}


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("name", list(CHECKERS))
def test_peer_accepts_its_tls_config(name, transport, profile, cert, workdir, docroot):
    server, rundir, configs = render(name, profile, options(cert, transport), workdir, docroot[0])
    main = rundir / ("caddy.json" if "caddy.json" in configs else server.config_file)
    env = dict(os.environ, **server.environment(rundir, profile))
    command = CHECKERS[name](rundir, main)
    if main.suffix == ".json":
        command = command[:command.index("--adapter")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_gannet_accepts_its_tls_config(transport, profile, cert, workdir, docroot):
    _, rundir, configs = render("gannet", profile, options(cert, transport), workdir, docroot[0])
    done = subprocess.run([str(gannet_binary()), "-t", "-c", str(rundir / "gannet.conf"), "-p", f"{rundir}/"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    text = re.sub(r"#.*", "", configs["gannet.conf"])
    names = set(re.findall(r"(?:^|[{};])\s*([a-z_0-9]+)", text))
    assert names <= GANNET_DIRECTIVES | GANNET_TLS_DIRECTIVES, names - GANNET_DIRECTIVES - GANNET_TLS_DIRECTIVES


def serving(name, transport, site_options, workdir, docroot, profile="tuned"):
    server = SERVERS[name]
    assert server.transport_support(transport) is None
    site = Site(docroot[0], ports.free_port(), site_options)
    return site, server.start(site, workdir / name, profile, "0")


# Every server and variant the arena runs (Apache prefork's h2 is left out: see
# test_prefork_cannot_do_h2).
SERVED = [(name, t) for name in WEB_SERVERS for t in TRANSPORTS if SERVERS[name].transport_support(t) is None]


@pytest.mark.parametrize("name, transport", SERVED)
def test_server_serves_the_variant(name, transport, cert, workdir, docroot):
    site, running = serving(name, transport, options(cert, transport), workdir, docroot)
    try:
        record = tls.server_record(site.host, site.port, transport, cert.cert)
        assert record.get("error") is None, record
        assert record["protocol"] == "TLSv1.3"
        assert record["alpn"] == tls.ALPN[transport]
        assert record["verified"] is True and record["signature"] == "ECDSA"
        assert record["resumes_sessions"] is False
        reply = probe.get(site.host, site.port, "/img.jpg", close=True, context=site.client_tls())
        assert reply.status == 200 and reply.body_bytes == docroot[1]["img.jpg"]
        if transport == "h2":
            assert idle.fetch_once(site.host, site.port, "/index.html", "h2", str(cert.cert))
    finally:
        running.stop()


@pytest.mark.parametrize("name", list(WEB_SERVERS))
def test_server_resumes_when_asked(name, cert, workdir, docroot):
    site, running = serving(name, "tls", options(cert, "tls", resumption=True), workdir, docroot)
    try:
        assert tls.resumes(site.host, site.port, cert.cert) is True
    finally:
        running.stop()


@pytest.mark.parametrize("name", ["gannet", "nginx", "apache-event", "caddy"])
def test_rsa_certificate_and_default_profile(name, tmp_path_factory, workdir, docroot):
    folder = tmp_path_factory.mktemp("rsa")
    folder.chmod(0o755)
    rsa = tls.make_certificate(folder / "tls", "rsa")
    site, running = serving(name, "h2", options(rsa, "h2"), workdir, docroot, profile="default")
    try:
        record = tls.server_record(site.host, site.port, "h2", rsa.cert)
        assert record["alpn"] == "h2" and record["server_key_bits"] == 2048
        assert record["signature"] == "RSA-PSS" and record["verified"] is True
    finally:
        running.stop()


def test_prefork_cannot_do_h2(cert, workdir, docroot):
    """The reason the arena gives for leaving Apache prefork out of --h2 runs, against httpd:
    configured for HTTP/2 all the same, it warns (AH10034) and ALPN never selects h2."""
    prefork = SERVERS["apache-prefork"]
    assert "AH10034" in prefork.transport_support("h2")
    site = Site(docroot[0], ports.free_port(), options(cert, "h2"))
    running = prefork.start(site, workdir / "prefork", "tuned", "0")
    try:
        record = tls.server_record(site.host, site.port, "h2", cert.cert)
        assert record["protocol"] == "TLSv1.3" and record["alpn"] is None
    finally:
        running.stop()
    assert "AH10034" in (workdir / "prefork" / "error.log").read_text()


def test_certificate_kinds(cert, tmp_path):
    text = subprocess.run(["openssl", "x509", "-in", str(cert.cert), "-noout", "-text"], capture_output=True,
                          text=True, check=True).stdout
    assert "prime256v1" in text and "IP Address:127.0.0.1" in text and "CA:FALSE" in text
    rsa = tls.make_certificate(tmp_path / "rsa", "rsa")
    text = subprocess.run(["openssl", "x509", "-in", str(rsa.cert), "-noout", "-text"], capture_output=True,
                          text=True, check=True).stdout
    assert "Public-Key: (2048 bit)" in text and "rsaEncryption" in text
