"""The "php" site kind: every server's PHP template in both profiles renders completely, passes
that server's own config check (gannet's too), and - against the real servers and the real
PHP-FPM pool - answers the Shakespeare app's pages exactly as the pool answers them directly.
Also how site kinds are looked up (arena/servers/sites.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from arena import ports, probe, shakespeare
from arena.errors import ArenaError
from arena.scenarios._php_app import keep_share
from arena.servers import PROFILES, SERVERS, WEB_SERVERS, Site, SiteOptions, sites
from arena.servers.gannet import gannet_binary
from test_render import CHECKERS, GANNET_DIRECTIVES

SOCKET = "/run/php/shakespeare.sock"
PHP = SiteOptions(kind="php", docroot=Path("/var/www/shakespeare"), app={"fastcgi_socket": SOCKET, "fastcgi_keep": 8},
                  connections=2064)


def render_php(name: str, profile: str, workdir: Path):
    server = SERVERS[name]
    rundir = workdir / f"{name}-{profile}"
    rundir.mkdir()
    configs = server.configs(Site(PHP.docroot, 18080, PHP), rundir, profile)
    for file, text in configs.items():
        (rundir / file).write_text(text)
    return server, rundir, configs[server.config_file]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(WEB_SERVERS))
def test_php_config_renders_completely(name, profile, workdir):
    _, _, text = render_php(name, profile, workdir)
    assert "{{" not in text and "}}" not in text
    assert "18080" in text and "/var/www/shakespeare" in text
    if sites.embeds_app(name, "php"):
        assert "libphp8.2.so" in text and "application/x-httpd-php" in text
    else:
        assert re.search(rf"unix:?/?{re.escape(SOCKET)}|{re.escape(SOCKET)}", text)
        assert "libphp" not in text


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(CHECKERS))
def test_peer_accepts_its_php_config(name, profile, workdir):
    server, rundir, _ = render_php(name, profile, workdir)
    env = dict(os.environ, **server.environment(rundir, profile))
    done = subprocess.run(CHECKERS[name](rundir, rundir / server.config_file), capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("profile", PROFILES)
def test_gannet_accepts_its_php_config(profile, workdir):
    """`gannet -t`, and only directives the gannet adapter documents (plus the FastCGI ones)."""
    _, rundir, text = render_php("gannet", profile, workdir)
    done = subprocess.run([str(gannet_binary()), "-t", "-c", str(rundir / "gannet.conf"), "-p", f"{rundir}/"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    names = set(re.findall(r"(?:^|[{};])\s*([a-z_]+)", re.sub(r"#.*", "", text)))
    upstream = {"upstream", "keepalive", "queue", "fastcgi_keep_conn"}
    assert names <= GANNET_DIRECTIVES | upstream | {"try_files", "fastcgi_param", "fastcgi_pass"}, names
    # Tuned: kept connections, at most the server's share of the pool's children.
    kept = "max_conns=8;" in text and "keepalive 8;" in text and "fastcgi_keep_conn on;" in text
    assert kept == (profile == "tuned"), text
    assert re.search(r"include /\S+/fastcgi_params;", text)


def test_every_server_has_a_snippet_for_every_kind():
    # static-gz needs a feature lighttpd and Apache lack: test_render checks who serves it.
    # adserver is s4-proxy's back end, always Debian's nginx (test_proxy_sites.py); the kinds
    # that say what some servers lack are checked per server there too.
    for server in WEB_SERVERS.values():
        for kind in {k for k, v in sites.KINDS.items() if not v.lacking} - {"static-gz", "adserver"}:
            for profile in PROFILES:
                assert server.site_template_name(kind, profile).startswith("sites/")


def test_kept_connections_share_the_pool_among_the_servers_that_use_it():
    # Apache prefork runs PHP itself: it takes no share.
    assert keep_share(100, ["gannet", "nginx", "lighttpd", "apache-prefork"]) == 33
    assert keep_share(100, ["gannet"]) == 100
    assert keep_share(3, ["gannet", "nginx", "lighttpd", "h2o", "caddy"]) == 1
    assert keep_share(100, ["apache-prefork"]) == 100


def test_only_gannet_keeps_fastcgi_connections(workdir):
    # nginx's keepalive bounds idle connections, not those in use: with more requests in flight
    # than the pool has children, kept connections end up holding every child and the requests
    # sent on new ones wait in PHP-FPM's backlog until they time out (the smoke run's h2load
    # c=100 did, against 50 children). gannet bounds them all (max_conns) and queues the rest.
    for name in WEB_SERVERS:
        _, _, text = render_php(name, "tuned", workdir)
        assert ("fastcgi_keep_conn on;" in text) == (name == "gannet"), name


def test_snippet_lookup_prefers_the_server_then_its_family():
    assert SERVERS["apache-prefork"].site_template_name("php", "tuned") == "sites/apache-prefork-php.conf"
    assert SERVERS["apache-event"].site_template_name("php", "tuned") == "sites/apache-php.conf"
    assert SERVERS["apache-event"].site_template_name("static", "default") == "sites/apache-static-default.conf"
    assert SERVERS["gannet"].site_template_name("static", "tuned") == "sites/gannet-static.conf"
    with pytest.raises(ArenaError, match="unknown site kind 'cgi'"):
        SERVERS["nginx"].site_template_name("cgi", "tuned")


def test_inline_indents_the_snippet_as_its_line():
    main = "a {\n    {{site}}\n}\n"
    assert sites.inline(main, "x;\n\ny {\n  z;\n}\n") == "a {\n    x;\n\n    y {\n      z;\n    }\n}\n"
    with pytest.raises(KeyError, match="exactly one"):
        sites.inline("no marker", "x")


def test_a_kind_says_what_it_needs(monkeypatch):
    with pytest.raises(ArenaError, match="php sites need fastcgi_socket"):
        SERVERS["nginx"].configs(Site(PHP.docroot, 18080, SiteOptions(kind="php")), Path("/tmp"), "tuned")
    sites.check("apache-prefork", "php")  # the real module is installed here
    sites.check("nginx", "php")
    # What the message says when a file a kind needs is missing: a kind that names one.
    monkeypatch.setitem(sites.KINDS, "php", sites.Kind(
        "php", "", requires={"apache-prefork": ((Path("/nonexistent/libphp.so"), "libapache2-mod-php8.2"),)}))
    with pytest.raises(ArenaError, match=r"apache-prefork needs /nonexistent/libphp.so to serve php sites: "
                                         r"install the Debian package 'libapache2-mod-php8.2'"):
        sites.check("apache-prefork", "php")


@pytest.fixture(scope="module")
def app_ready():
    shakespeare.ready()


PAGES = ["/", "/.json", "/hamlet", "/hamlet.json", "/hamlet/3", "/hamlet/3/1.json", "/taming-of-the-shrew/0/1",
         "/sonnets/1/18.json", "/no-such-work", "/hamlet/one.json"]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(WEB_SERVERS))
def test_server_answers_the_app_as_the_pool_does(name, profile, workdir, app_ready):
    """Statuses (200, 404, 400) and body bytes through the server equal the pool's own answer."""
    want = {path: shakespeare.fetch(path) for path in PAGES}
    site = Site(PHP.docroot, ports.free_port(), SiteOptions(**{**PHP.__dict__, "connections": 256}))
    server = SERVERS[name].start(site, workdir / name, profile, "0")
    try:
        for path in PAGES:
            for close in (False, True):
                reply = probe.get(site.host, site.port, path, close=close)
                status, body = want[path]
                assert (reply.status, reply.body_bytes) == (status, len(body)), f"{name} {path} close={close}"
    finally:
        server.stop()
