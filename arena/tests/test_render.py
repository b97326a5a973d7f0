"""Config rendering for every server and profile: every placeholder filled, the port and
document root in place, and each peer's own config checker accepting the result. gannet's
config must stick to the directives gannet implements."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from arena.render import render
from arena.servers import PROFILES, SERVERS, WEB_SERVERS, Site, SiteOptions

VARIANTS = {
    "plain": SiteOptions(),
    "gzip+log+c10k": SiteOptions(gzip=True, access_log=True, keepalive_timeout=15, connections=10_200),
}

CHECKERS = {
    "nginx": lambda d, f: ["nginx", "-t", "-q", "-p", f"{d}/", "-e", str(d / "error.log"), "-c", str(f)],
    "lighttpd": lambda d, f: ["lighttpd", "-tt", "-f", str(f)],
    "apache-prefork": lambda d, f: ["apache2", "-t", "-d", str(d), "-f", str(f)],
    "apache-worker": lambda d, f: ["apache2", "-t", "-d", str(d), "-f", str(f)],
    "apache-event": lambda d, f: ["apache2", "-t", "-d", str(d), "-f", str(f)],
    "h2o": lambda d, f: ["h2o", "-t", "-c", str(f)],
    "caddy": lambda d, f: ["caddy", "validate", "--config", str(f), "--adapter", "caddyfile"],
}
# The peers that serve no static site (a proxy or a cache only), with their config checks.
PROXY_CHECKERS = {
    "haproxy": lambda d, f: ["haproxy", "-c", "-q", "-f", str(f)],
}

# What gannet's config may use (see arena/README.md "The gannet adapter").
GANNET_DIRECTIVES = {
    "worker_processes", "pid", "error_log", "events", "worker_connections", "http", "include",
    "default_type", "sendfile", "tcp_nopush", "tcp_nodelay", "keepalive_timeout",
    "keepalive_requests", "access_log", "open_file_cache", "open_file_cache_valid",
    "open_file_cache_errors", "gzip", "gzip_types", "server", "listen",
    "server_name", "root", "index", "location",
}


def render_for(name, profile, options, workdir, docroot):
    server = SERVERS[name]
    rundir = workdir / f"{name}-{profile}"
    rundir.mkdir()
    site = Site(docroot, 18080, options)
    configs = server.configs(site, rundir, profile)
    for file, text in configs.items():
        (rundir / file).write_text(text)
    return server, rundir, configs


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(WEB_SERVERS))
def test_config_renders_completely(name, profile, variant, workdir, docroot):
    _, _, configs = render_for(name, profile, VARIANTS[variant], workdir, docroot[0])
    text = "\n".join(configs.values())
    assert "{{" not in text and "}}" not in text
    assert "18080" in text
    assert str(docroot[0]) in text


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", list(CHECKERS))
def test_peer_accepts_its_config(name, profile, variant, workdir, docroot):
    server, rundir, configs = render_for(name, profile, VARIANTS[variant], workdir, docroot[0])
    main = rundir / server.config_file
    env = dict(os.environ, **server.environment(rundir, profile))
    done = subprocess.run(CHECKERS[name](rundir, main), capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("profile", PROFILES)
def test_gannet_config_uses_only_supported_directives(profile, variant, workdir, docroot):
    _, _, configs = render_for("gannet", profile, VARIANTS[variant], workdir, docroot[0])
    text = re.sub(r"#.*", "", configs["gannet.conf"])
    # A directive is the first word of a statement: after start, '{', '}' or ';'.
    names = set(re.findall(r"(?:^|[{};])\s*([a-z_]+)", text))
    assert names <= GANNET_DIRECTIVES, names - GANNET_DIRECTIVES
    assert re.search(r"listen 127\.0\.0\.1:18080[ ;]", text)
    assert re.search(r"include /\S+mime\.types;", text)


def test_tuned_profiles_defer_accept(workdir, docroot):
    """Every tuned server that can wait for the request before accepting does (h2o and
    Apache do it by default): without it new-connection runs measure wake-ups, not servers."""
    rendered = {name: render_for(name, "tuned", SiteOptions(), workdir, docroot[0])[2]
                for name in ("gannet", "nginx", "lighttpd")}
    assert re.search(r"listen 127\.0\.0\.1:18080 backlog=4096 deferred;", rendered["gannet"]["gannet.conf"])
    assert re.search(r"listen \S+ backlog=4096 deferred;", rendered["nginx"]["nginx.conf"])
    assert "server.defer-accept = 1" in rendered["lighttpd"]["lighttpd.conf"]


def test_tuned_profiles_use_one_worker(workdir, docroot):
    rendered = {name: render_for(name, "tuned", SiteOptions(), workdir, docroot[0])[2]
                for name in ("gannet", "nginx", "h2o", "apache-event")}
    assert "worker_processes 1;" in rendered["gannet"]["gannet.conf"]
    assert "worker_processes 1;" in rendered["nginx"]["nginx.conf"]
    assert "num-threads: 1" in rendered["h2o"]["h2o.conf"]
    assert "ServerLimit 1\n" in rendered["apache-event"]["apache2.conf"]
    assert SERVERS["caddy"].environment(workdir, "tuned")["GOMAXPROCS"] == "1"


def test_renderer_rejects_missing_and_unused_values():
    assert render("a {{x}} b", {"x": 1}) == "a 1 b"
    with pytest.raises(KeyError):
        render("{{x}}", {})
    with pytest.raises(KeyError):
        render("plain", {"x": 1})
    # An optional value may go unused; a missing one is still an error.
    assert render("plain", {"x": 1}, optional=("x",)) == "plain"
    with pytest.raises(KeyError):
        render("{{x}}", {}, optional=("x",))
    # Nginx variables and braces pass through untouched.
    assert render("try_files $uri $uri/ =404; location / { }", {}) == "try_files $uri $uri/ =404; location / { }"


GZ_SERVERS = ["gannet", "nginx", "h2o", "caddy"]


def test_precompressed_site_support_is_what_each_server_has():
    """static-gz (s2-rate-gz) needs a built-in way to serve file.gz; lighttpd and Apache have
    none, so the default server list of that scenario leaves them out."""
    assert [n for n, s in WEB_SERVERS.items() if s.serves("static-gz", "tuned")] == GZ_SERVERS


@pytest.mark.parametrize("name", GZ_SERVERS)
def test_precompressed_site_config_is_accepted(name, workdir, docroot):
    options = SiteOptions(gzip=True, keepalive_timeout=15, kind="static-gz")
    server, rundir, configs = render_for(name, "tuned", options, workdir, docroot[0])
    main = rundir / server.config_file
    if name == "gannet":
        command = [server.binary(), "-t", "-c", str(main)]
    else:
        command = CHECKERS[name](rundir, main)
    env = dict(os.environ, **server.environment(rundir, "tuned"))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (docroot[0] / "robots.txt.gz").stat().st_size > 0
