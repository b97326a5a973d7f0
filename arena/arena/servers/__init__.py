"""The registry of server adapters, by CLI name."""

from __future__ import annotations

from arena.errors import ArenaError
from arena.servers.apache import MPMS, Apache
from arena.servers.base import PROFILES, RunningServer, Server, Site, SiteOptions
from arena.servers.caddy import Caddy
from arena.servers.gannet import Gannet
from arena.servers.h2o import H2o
from arena.servers.lighttpd import Lighttpd
from arena.servers.nginx import Nginx

SERVERS: dict[str, Server] = {
    s.name: s for s in [Gannet(), Nginx(), *(Apache(m) for m in MPMS), Lighttpd(), H2o(), Caddy()]
}

__all__ = ["SERVERS", "PROFILES", "RunningServer", "Server", "Site", "SiteOptions", "get", "parse_list"]


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
