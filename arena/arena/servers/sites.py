"""Site kinds: what a server serves, as data.

Every server template (templates/<server>-<profile>.conf) holds the server's global settings
and one line `{{site}}` where the site goes: an nginx server block's contents, lighttpd's
document root and handlers, h2o's paths, Caddy's site directives, Apache's DocumentRoot and
handlers. That line is replaced by a snippet from templates/sites/, the first that exists of

    <server>-<kind>-<profile>.conf   <server>-<kind>.conf
    <family>-<kind>-<profile>.conf   <family>-<kind>.conf

(the family is "apache" for the three Apache MPMs, else the server's own name), indented as
the `{{site}}` line is. nginx-syntax templates (nginx, gannet) also hold a `{{site_http}}` line
in their http context, for what a kind needs outside the server block (an `upstream` group):
the same lookup with `-http` after the kind name, or nothing when no such snippet exists.
The snippet is rendered together with the main template, with the server's values plus the
site's own (`SiteOptions.app`, e.g. `fastcgi_socket`), and the renderer's rule still holds:
every placeholder filled, every value used - but for the kind's `optional` values, which only
the snippets of servers that have the setting use.

Adding a kind is adding its snippets and an entry in KINDS; no adapter changes, unless a server
needs something only code can compute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from arena.errors import ArenaError

APACHE_MODULES = Path("/usr/lib/apache2/modules")
SITE_LINE = re.compile(r"^([ \t]*)\{\{site\}\}[ \t]*$", re.MULTILINE)
SITE_HTTP_LINE = re.compile(r"^([ \t]*)\{\{site_http\}\}[ \t]*$", re.MULTILINE)


@dataclass(frozen=True)
class Kind:
    name: str
    description: str
    # Values the scenario must give in SiteOptions.app, used by the snippets.
    values: tuple[str, ...] = ()
    # Values the scenario gives too, used only by the snippets that need them (a setting some
    # servers have and others lack).
    optional: tuple[str, ...] = ()
    # Server name -> files its snippet needs, each with the Debian package that ships it.
    requires: dict[str, tuple[tuple[Path, str], ...]] = field(default_factory=dict)
    # Servers that run the application inside their own processes (Apache prefork + mod_php)
    # instead of handing requests to the application's own pool.
    embeds_app: frozenset[str] = frozenset()
    # Why the servers without a snippet for this kind cannot serve it ("" = every server can);
    # shown when a run leaves them out.
    lacking: str = ""
    # The snippets are whole configs, not a site inside the server's template (a layer-4
    # proxy is no HTTP server: nginx's and gannet's `stream {}` instead of their `http {}`).
    whole: bool = False


KINDS: dict[str, Kind] = {
    "static": Kind("static", "the arena's generated document root (img.jpg, robots.txt, index.html)"),
    "static-gz": Kind("static-gz", "the same document root, with robots.txt.gz and index.html.gz served "
                      "to clients that accept gzip instead of compressing per request (gzip_static and "
                      "each server's equivalent; lighttpd and Apache have none built in)"),
    "proxy": Kind(
        "proxy",
        "a reverse proxy: every request goes to the one backend at `backend_host`:`backend_port`, "
        "over kept upstream connections where the server can keep them (study S4)",
        values=("backend_host", "backend_port"),
    ),
    "proxy-failover": Kind(
        "proxy-failover",
        "a reverse proxy balancing over three back ends (`backend_port_1` to `_3`) with each server's "
        "passive health checks and retries (and gannet's and Caddy's active checks), so a back end killed "
        "mid-run is routed around (s4-failover)",
        values=("backend_host", "backend_port_1", "backend_port_2", "backend_port_3"),
        lacking="h2o 2.2 (Debian's) takes one back end per proxy.reverse.url: nothing to balance or fail over to",
    ),
    "proxy-mirror": Kind(
        "proxy-mirror",
        "a reverse proxy to the back end at `backend_port` under /p/ and /m/ (the prefix stripped), /m/ "
        "also sending a copy of each request to the shadow back end at `shadow_port` (s4-mirror)",
        values=("backend_host", "backend_port", "shadow_port"),
        lacking="only gannet and nginx (ngx_http_mirror_module) have request mirroring built in",
    ),
    "cache": Kind(
        "cache",
        "a caching reverse proxy: every request goes to the origin at `backend_host`:`backend_port` over "
        "kept connections, answers of 200 kept 10 minutes whatever the origin's headers say (the cache "
        "scenario)",
        values=("backend_host", "backend_port"),
        lacking="only gannet, nginx and Varnish have a response cache in this arena",
    ),
    "cache-origin": Kind("cache-origin", "the cache scenario's origin: the JSON API as files under /ads/, "
                         "every other path to the PHP app's front controller (`app_root`/index.php) by "
                         "the PHP-FPM pool on `fastcgi_socket`, every request in the access log",
                         values=("fastcgi_socket", "app_root"),
                         lacking="the cache scenario's origin is always Debian's nginx"),
    "l4-proxy": Kind(
        "l4-proxy",
        "a layer-4 (TCP) proxy: every connection relayed to the back end at `backend_host`:`backend_port`, "
        "bytes as they are (nginx's and gannet's `stream {}`, HAProxy's `mode tcp`)",
        values=("backend_host", "backend_port"),
        lacking="only gannet, nginx (stream module) and HAProxy proxy TCP in this arena",
        requires={"nginx": ((Path("/usr/lib/nginx/modules/ngx_stream_module.so"), "libnginx-mod-stream"),)},
        whole=True,
    ),
    "adserver": Kind("adserver", "study S4's backend: the ad responses of the document root as files, "
                     "POSTs answered 200 with the file at their path, every request in the access log"),
    "php": Kind(
        "php",
        "a PHP front controller (every path that is not a file goes to /index.php, WordPress-style) "
        "run by the PHP-FPM pool listening on the unix socket `fastcgi_socket`; Apache prefork runs "
        "it with mod_php instead, as study S1 did. Tuned gannet keeps FastCGI connections, at most "
        "`fastcgi_keep` (its share of the pool's children) with the requests beyond them queued; "
        "nginx's keepalive bounds only idle connections, so with more requests in flight than "
        "children its kept ones would hold them all and starve the rest",
        values=("fastcgi_socket", "fastcgi_keep"),
        optional=("fastcgi_keep",),
        requires={"apache-prefork": ((APACHE_MODULES / "libphp8.2.so", "libapache2-mod-php8.2"),)},
        embeds_app=frozenset({"apache-prefork"}),
    ),
}


def kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise ArenaError(f"unknown site kind '{name}': choose from {', '.join(KINDS)}") from None


def _templates():
    return resources.files("arena.servers").joinpath("templates")


def _candidates(server_name: str, family: str, stem: str, profile: str) -> list[str]:
    names = [f"{server_name}-{stem}-{profile}.conf", f"{server_name}-{stem}.conf"]
    if family != server_name:
        names += [f"{family}-{stem}-{profile}.conf", f"{family}-{stem}.conf"]
    return names


def _first(names: list[str]) -> str | None:
    folder = _templates().joinpath("sites")
    return next((f"sites/{n}" for n in names if folder.joinpath(n).is_file()), None)


def snippet_name(server_name: str, family: str, kind_name: str, profile: str) -> str:
    """The snippet file (relative to templates/) a server uses for a kind and profile."""
    kind(kind_name)
    names = _candidates(server_name, family, kind_name, profile)
    found = _first(names)
    if found is None:
        why = f" ({kind(kind_name).lacking})" if kind(kind_name).lacking else ""
        raise ArenaError(f"{server_name} cannot serve {kind_name} sites{why}: no templates/sites/{names[-1]}")
    return found


def http_snippet_name(server_name: str, family: str, kind_name: str, profile: str) -> str | None:
    """The snippet for the template's `{{site_http}}` line, if the kind has one for the server."""
    kind(kind_name)
    return _first(_candidates(server_name, family, f"{kind_name}-http", profile))


def supports(server_name: str, family: str, kind_name: str, profile: str) -> bool:
    """Whether the server has a snippet for the kind."""
    try:
        snippet_name(server_name, family, kind_name, profile)
        return True
    except ArenaError:
        return False


def inline(main: str, snippet: str, where: str = "template", line: re.Pattern = SITE_LINE) -> str:
    """`main` with its `{{site}}` line (or `line`) replaced by `snippet`, indented as that line."""
    found = list(line.finditer(main))
    if len(found) != 1:
        raise KeyError(f"{where} needs exactly one {line.pattern} line, has {len(found)}")
    indent = found[0].group(1)
    body = "\n".join(indent + line if line.strip() else "" for line in snippet.strip("\n").splitlines())
    return main[:found[0].start()] + body + main[found[0].end():]


def app_values(kind_name: str, app: dict[str, object]) -> dict[str, object]:
    """The site's own template values; each value the kind needs must be given."""
    k = kind(kind_name)
    missing = [v for v in k.values if v not in app]
    if missing:
        raise ArenaError(f"{k.name} sites need {', '.join(missing)} (SiteOptions.app)")
    return dict(app)


def check(server_name: str, kind_name: str) -> None:
    """Raise a clear ArenaError if a file this server needs for the kind is missing."""
    for path, package in kind(kind_name).requires.get(server_name, ()):
        if not Path(path).exists():
            raise ArenaError(f"{server_name} needs {path} to serve {kind_name} sites: install the Debian "
                             f"package '{package}' (apt-get install {package}, or `arena peers install`)")


def embeds_app(server_name: str, kind_name: str) -> bool:
    return server_name in kind(kind_name).embeds_app
