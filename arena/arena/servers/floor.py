"""The floor (issue 30): not a web server but the least one can do - `floor.c`, one epoll loop
answering each request from the document root's files preloaded as complete answers (one recv,
one send, nothing else). A reference row in the static scenarios: what the kernel costs per
request, so every server's capacity reads as a fraction of it. Compiled with the system's C
compiler on first use (cached by the source's hash); started with its address and document
root on the command line, no config file; cleartext HTTP/1.1 only."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from arena.errors import ArenaError
from arena.servers.base import Server, Site
from arena.tools import require


class Floor(Server):
    name = "floor"
    title = "floor (a bare epoll loop)"
    program = "floor"
    package = "(arena/servers/floor.c, built with cc)"
    reference = True

    def source(self) -> bytes:
        return resources.files("arena.servers").joinpath("floor.c").read_bytes()

    def binary(self) -> str:
        source = self.source()
        built = Path(tempfile.gettempdir()) / f"arena-floor-{hashlib.sha256(source).hexdigest()[:12]}"
        if not built.exists():
            src = built.with_suffix(".c")
            src.write_bytes(source)
            done = subprocess.run([require("cc"), "-O2", "-o", str(built), str(src)], capture_output=True, text=True)
            if done.returncode != 0:
                raise ArenaError(f"building the floor failed: {done.stderr.strip()[-500:]}")
        return str(built)

    def version(self) -> str:
        return f"floor.c {hashlib.sha256(self.source()).hexdigest()[:12]}"

    def serves(self, kind: str, profile: str) -> bool:
        return kind == "static"

    def site_template_name(self, kind: str, profile: str) -> str:
        if not self.serves(kind, profile):
            raise ArenaError(f"floor cannot serve {kind} sites (it is the static scenarios' reference row)")
        return "(none: floor.c serves the document root's files)"

    def transport_support(self, transport: str) -> str | None:
        return None if transport == "http" else "the floor speaks cleartext HTTP/1.1 only"

    def configs(self, site: Site, rundir: Path, profile: str) -> dict[str, str]:
        self.site_template_name(site.options.kind, profile)
        return {}

    def site_command(self, binary: str, rundir: Path, site: Site, profile: str) -> list[str]:
        return [binary, site.host, str(site.port), str(site.docroot)]
