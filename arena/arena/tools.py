"""Finding external programs, naming the Debian package that provides each, and their versions."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from arena import repo
from arena.errors import ArenaError

# program -> Debian package that ships it; used in "missing tool" messages and `arena peers install`.
PACKAGES = {
    "wrk": "wrk",
    "h2load": "nghttp2-client",
    "ab": "apache2-utils",
    "httperf": "httperf",
    "siege": "siege",
    "taskset": "util-linux",
    "ss": "iproute2",
    "nginx": "nginx",
    "lighttpd": "lighttpd",
    "h2o": "h2o",
    "apache2": "apache2",
    "caddy": "caddy",
    "openssl": "openssl",
}

# Load tools built from this repository (`cargo build --release`), not packaged: name -> the
# environment variable that points at another build.
BUILT = {"h3load": "H3LOAD_BIN"}

LOAD_TOOLS = ["wrk", "h2load", "ab", "httperf", "siege", "h3load"]
# libapache2-mod-php8.2: Apache prefork runs the dynamic scenarios' PHP app with mod_php.
# lighttpd-mod-openssl and openssl: the --tls and --h2 variants (lighttpd's TLS module; the test
# certificate and the handshake probe).
PEER_PACKAGES = ["nginx", "lighttpd", "lighttpd-mod-openssl", "h2o", "apache2", "caddy", "libapache2-mod-php8.2",
                 "varnish", "haproxy", "libnginx-mod-stream", "wrk", "nghttp2-client", "apache2-utils", "httperf", "siege", "iproute2", "openssl"]

# How to ask each program its version; the first line matching the regex is kept.
_VERSION_COMMANDS = {
    "wrk": (["wrk", "-v"], r"wrk\s+\S+"),
    "h2load": (["h2load", "--version"], r"h2load\s+\S+"),
    "ab": (["ab", "-V"], r"Version\s+\S+"),
    "httperf": (["httperf", "--version"], r"httperf-\S+"),
    "siege": (["siege", "--version"], r"SIEGE\s+\S+"),
    "ss": (["ss", "-V"], r"iproute2-\S+"),
    "h3load": (["h3load", "--version"], r"h3load\s+\S+"),
}

_SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def built(program: str) -> Path:
    """Where a tool built from this repository is: $H3LOAD_BIN (say), else the release build
    under the checkout."""
    override = os.environ.get(BUILT[program])
    return Path(override) if override else repo.root_or_nowhere() / "target" / "release" / program


def which(program: str) -> str | None:
    """Path of `program`, also looking in the sbin directories a non-root PATH may lack."""
    if program in BUILT:
        path = built(program)
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    return shutil.which(program) or shutil.which(program, path=_SEARCH_PATH)


def require(program: str) -> str:
    """Path of `program`, or an ArenaError naming the apt package that provides it (or, for a
    tool of this repository, how to build it)."""
    path = which(program)
    if path is None and program in BUILT:
        raise ArenaError(f"{program} not found at {built(program)}: build it with `cargo build --release -p "
                         f"{program}` in the repository{repo.hint()}, or set {BUILT[program]} to the binary")
    if path is None:
        package = PACKAGES.get(program, program)
        raise ArenaError(
            f"{program} not found: install the Debian package '{package}' "
            f"(apt-get install {package}, or `arena peers install`)"
        )
    return path


def first_line_matching(text: str, pattern: str) -> str | None:
    match = re.search(pattern, text)
    return match.group(0) if match else None


def command_output(cmd: list[str], timeout: float = 10) -> str:
    """stdout+stderr of a short informational command, or '' if it cannot run."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (done.stdout or "") + (done.stderr or "")


def tool_version(program: str) -> str:
    """Version string of a load tool, or 'missing'."""
    if which(program) is None:
        return "missing"
    cmd, pattern = _VERSION_COMMANDS[program]
    cmd = [which(program)] + cmd[1:]
    return first_line_matching(command_output(cmd), pattern) or "unknown"
