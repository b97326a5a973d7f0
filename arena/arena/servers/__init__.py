"""The registry of server adapters, by CLI name."""

from __future__ import annotations

from arena.errors import ArenaError
from arena.servers.apache import MPMS, Apache
from arena.servers.base import PROFILES, RunningServer, Server, Site, SiteOptions
from arena.servers.caddy import Caddy
from arena.servers.floor import Floor
from arena.servers.gannet import Gannet
from arena.servers.h2o import H2o
from arena.servers.haproxy import Haproxy
from arena.servers.lighttpd import Lighttpd
from arena.servers.nginx import Nginx
from arena.servers.varnish import Varnish

SERVERS: dict[str, Server] = {
    s.name: s for s in [Gannet(), Nginx(), *(Apache(m) for m in MPMS), Lighttpd(), H2o(), Caddy(), Varnish(), Haproxy(), Floor()]
}

# The web servers: every adapter that serves the arena's files (Varnish and HAProxy only sit in
# front of another server, in the scenarios whose site kinds they have; the floor is a reference).
WEB_SERVERS: dict[str, Server] = {name: s for name, s in SERVERS.items()
                                   if s.serves("static", "tuned") and not s.reference}

__all__ = ["SERVERS", "WEB_SERVERS", "PROFILES", "RunningServer", "Server", "Site", "SiteOptions", "get", "parse_list"]


def get(name: str) -> Server:
    try:
        return SERVERS[name]
    except KeyError:
        raise ArenaError(f"unknown server '{name}': choose from {', '.join(SERVERS)}") from None


def parse_list(text: str) -> list[Server]:
    """'gannet,nginx' -> adapters, in order, without duplicates."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ArenaError("no servers given: use e.g. --servers gannet,nginx")
    seen: dict[str, Server] = {}
    for name in names:
        seen.setdefault(name, get(name))
    return list(seen.values())
