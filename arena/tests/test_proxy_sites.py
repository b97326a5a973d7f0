"""The "proxy" site kind (s4-proxy): every server's proxy config in both profiles renders
completely with the backend's address and kept upstream connections where the server has
them, and passes that server's own config check (gannet's too); the "adserver" backend kind
renders for nginx and answers POSTs 200 from its files."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
from pathlib import Path

import pytest

from arena import ports, probe
from arena.errors import ArenaError
from arena.servers import PROFILES, SERVERS, Site, SiteOptions
from arena.servers.gannet import gannet_binary
from test_render import CHECKERS, GANNET_DIRECTIVES, PROXY_CHECKERS

BACKEND = {"backend_host": "127.0.0.1", "backend_port": 18999}
PROXY = SiteOptions(kind="proxy", app=BACKEND, connections=2048)
# What gannet's proxy config may use on top of the static site's directives.
GANNET_PROXY_DIRECTIVES = GANNET_DIRECTIVES | {"upstream", "keepalive", "proxy_pass", "proxy_http_version",
                                               "proxy_set_header"}
# How each server keeps upstream connections (lighttpd has no upstream keep-alive).
KEEPALIVE = {
    "gannet": r"keepalive 32;[\s\S]*proxy_http_version 1\.1;\s*proxy_set_header Connection \"\";",
    "nginx": r"keepalive 32;[\s\S]*proxy_http_version 1\.1;\s*proxy_set_header Connection \"\";",
    "apache-prefork": r"ProxyPass \"/\" \"http://127\.0\.0\.1:18999/\" keepalive=On",
    "apache-worker": r"ProxyPass \"/\" \"http://127\.0\.0\.1:18999/\" keepalive=On",
    "apache-event": r"ProxyPass \"/\" \"http://127\.0\.0\.1:18999/\" keepalive=On",
    "caddy": r"keepalive_idle_conns_per_host 32",
    "h2o": r"proxy\.timeout\.keepalive: 65000",
    "lighttpd": r"\"host\" => \"127\.0\.0\.1\", \"port\" => 18999",
    "haproxy": r"http-reuse always[\s\S]*server origin 127\.0\.0\.1:18999",
}
# Every server but the cache-only one (Varnish: the cache scenario's) and the floor (a reference row).
PROXIES = [name for name in SERVERS if name not in ("varnish", "floor")]


def render(name: str, profile: str, workdir: Path, options: SiteOptions = PROXY, docroot: Path | None = None):
    server = SERVERS[name]
    rundir = workdir / f"{name}-{profile}"
    rundir.mkdir()
    configs = server.configs(Site(docroot or workdir, 18080, options), rundir, profile)
    for file, text in configs.items():
        (rundir / file).write_text(text)
    return server, rundir, configs[server.config_file]


def test_every_server_can_proxy():
    assert all(SERVERS[name].serves("proxy", p) for name in PROXIES for p in PROFILES)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", PROXIES)
def test_proxy_config_renders_completely(name, profile, workdir):
    _, _, text = render(name, profile, workdir)
    assert "{{" not in text and "}}" not in text
    assert "18080" in text and "18999" in text
    assert re.search(KEEPALIVE[name], text), text


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(CHECKERS) + list(PROXY_CHECKERS))
def test_peer_accepts_its_proxy_config(name, profile, workdir):
    server, rundir, _ = render(name, profile, workdir)
    env = dict(os.environ, **server.environment(rundir, profile))
    check = {**CHECKERS, **PROXY_CHECKERS}[name]
    done = subprocess.run(check(rundir, rundir / server.config_file), capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("profile", PROFILES)
def test_gannet_accepts_its_proxy_config(profile, workdir):
    _, rundir, text = render("gannet", profile, workdir)
    names = set(re.findall(r"(?:^|[{};])\s*([a-z_]+)", re.sub(r"#.*", "", text)))
    assert names <= GANNET_PROXY_DIRECTIVES, names - GANNET_PROXY_DIRECTIVES
    done = subprocess.run([str(gannet_binary()), "-t", "-c", str(rundir / "gannet.conf")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_upstream_block_only_for_proxy_sites(workdir, docroot):
    _, _, text = render("nginx", "tuned", workdir, SiteOptions(), docroot[0])
    assert "upstream" not in text and "{{" not in text


def test_adserver_answers_posts_from_its_files(workdir, docroot):
    """The backend kind: GET and POST both 200 with the file, and both logged."""
    (docroot[0] / "event.json").write_text('{"ok":true}\n')
    site = Site(docroot[0], ports.free_port(), SiteOptions(kind="adserver", access_log=True))
    server = SERVERS["nginx"].start(site, workdir / "backend", "tuned", "0")
    try:
        got = probe.get(site.host, site.port, "/event.json?x=1", close=True)
        conn = http.client.HTTPConnection(site.host, site.port, timeout=5)
        conn.request("POST", "/event.json", body=b"a=1",
                     headers={"Content-Type": "application/x-www-form-urlencoded"})
        posted = conn.getresponse()
        posted_body = posted.read()
        conn.close()
    finally:
        server.stop()
    assert got.status == 200 and got.body_bytes == 12
    assert posted.status == 200 and posted_body == b'{"ok":true}\n'
    log = (workdir / "backend" / "access.log").read_text()
    assert '"GET /event.json?x=1 HTTP/1.1" 200' in log and '"POST /event.json HTTP/1.1" 200' in log


# -- the variants' kinds: proxy-failover (s4-failover) and proxy-mirror (s4-mirror) --------------
FAILOVER = SiteOptions(kind="proxy-failover", connections=2048,
                       app={"backend_host": "127.0.0.1", "backend_port_1": 18991, "backend_port_2": 18992,
                            "backend_port_3": 18993})
MIRROR = SiteOptions(kind="proxy-mirror", connections=2048,
                     app={"backend_host": "127.0.0.1", "backend_port": 18991, "shadow_port": 18994})
# What gannet's variant configs may use on top of its proxy config's directives.
GANNET_VARIANT_DIRECTIVES = GANNET_PROXY_DIRECTIVES | {"proxy_next_upstream", "proxy_next_upstream_tries",
                                                       "health_check", "mirror", "internal"}
_NGINX_FAILOVER = (r"server 127\.0\.0\.1:18991 max_fails=1 fail_timeout=5s;\s*server 127\.0\.0\.1:18992 max_fails=1 "
                   r"fail_timeout=5s;\s*server 127\.0\.0\.1:18993 max_fails=1 fail_timeout=5s;\s*keepalive 32;"
                   r"[\s\S]*proxy_next_upstream error timeout;\s*proxy_next_upstream_tries 3;")
_APACHE_FAILOVER = (r"<Proxy \"balancer://backend\">\s*BalancerMember \"http://127\.0\.0\.1:18991\" keepalive=On retry=5"
                    r"[\s\S]*18993\" keepalive=On retry=5\s*ProxySet lbmethod=byrequests failonstatus=502,503\s*</Proxy>"
                    r"\s*ProxyPass \"/\" \"balancer://backend/\"")
# Each server's passive checks and retries (and active ones where it has them).
FAILOVER_SETUP = {
    "gannet": _NGINX_FAILOVER + r"\s*health_check interval=1s fails=1 passes=1 uri=/robots\.txt;",
    "nginx": _NGINX_FAILOVER + r"\s*}",
    "apache-prefork": _APACHE_FAILOVER,
    "apache-worker": _APACHE_FAILOVER,
    "apache-event": _APACHE_FAILOVER,
    "caddy": (r"reverse_proxy 127\.0\.0\.1:18991 127\.0\.0\.1:18992 127\.0\.0\.1:18993 \{\s*lb_policy round_robin\s*"
              r"lb_try_duration 2s\s*fail_duration 5s\s*max_fails 1\s*health_uri /robots\.txt\s*health_interval 1s"),
    "lighttpd": (r"proxy\.balance = \"round-robin\"[\s\S]*\"port\" => 18991, \"disable-time\" => 5 \),[\s\S]*"
                 r"\"port\" => 18993, \"disable-time\" => 5 \)"),
}
_MIRROR = (r"upstream shadow_backend \{\s*server 127\.0\.0\.1:18994;\s*keepalive 32;\s*\}[\s\S]*"
           r"location /p/ \{\s*proxy_pass http://backend/;\s*\}\s*location /m/ \{\s*mirror /shadow;\s*"
           r"proxy_pass http://backend/;\s*\}\s*location = /shadow \{\s*internal;\s*"
           r"proxy_pass http://shadow_backend\$request_uri;\s*\}")
MIRROR_SETUP = {"gannet": _MIRROR, "nginx": _MIRROR}


def _check(name: str, profile: str, rundir: Path, text: str, allowed: set[str]) -> None:
    """The server's own config test (gannet's -t, with only the directives it may use)."""
    server = SERVERS[name]
    if name == "gannet":
        names = set(re.findall(r"(?:^|[{};])\s*([a-z_]+)", re.sub(r"#.*", "", text)))
        assert names <= allowed, names - allowed
        cmd = [str(gannet_binary()), "-t", "-c", str(rundir / "gannet.conf")]
    else:
        cmd = CHECKERS[name](rundir, rundir / server.config_file)
    env = dict(os.environ, **server.environment(rundir, profile))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_which_servers_serve_the_variants():
    assert {n for n, s in SERVERS.items() if s.serves("proxy-failover", "tuned")} == set(FAILOVER_SETUP)
    assert {n for n, s in SERVERS.items() if s.serves("proxy-mirror", "tuned")} == set(MIRROR_SETUP)
    # The others are refused with what they lack.
    with pytest.raises(ArenaError, match=r"h2o cannot serve proxy-failover sites \(h2o 2\.2 .* one back end"):
        SERVERS["h2o"].site_template_name("proxy-failover", "tuned")
    with pytest.raises(ArenaError, match=r"apache-event cannot serve proxy-mirror sites \(only gannet and nginx"):
        SERVERS["apache-event"].site_template_name("proxy-mirror", "tuned")


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(FAILOVER_SETUP))
def test_failover_config_renders_and_passes_its_check(name, profile, workdir):
    _, rundir, text = render(name, profile, workdir, FAILOVER)
    assert "{{" not in text and "}}" not in text and "18080" in text
    assert re.search(FAILOVER_SETUP[name], text), text
    # Only gannet's (in nginx Plus's syntax) has an active check among the nginx-syntax ones.
    assert ("health_check" in text) == (name == "gannet")
    _check(name, profile, rundir, text, GANNET_VARIANT_DIRECTIVES)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(MIRROR_SETUP))
def test_mirror_config_renders_and_passes_its_check(name, profile, workdir):
    _, rundir, text = render(name, profile, workdir, MIRROR)
    assert "{{" not in text and "}}" not in text and "18080" in text
    assert re.search(MIRROR_SETUP[name], text), text
    _check(name, profile, rundir, text, GANNET_VARIANT_DIRECTIVES)
