"""Study S1's Shakespeare app (apps/shakespeare: PHP over MariaDB behind one PHP-FPM pool) as
the dynamic scenarios use it:

- ready(): is it set up? If not, run apps/shakespeare/setup.sh (as root), or say which command
  to run. Never a traceback.
- url_list(): the fixed URL mix, drawn from the app itself in a deterministic order, with each
  page's body size (asked of the pool directly over FastCGI, no web server in between).
- PhpTier: the pool's master and children as one process set, measured as the arena measures
  a server, and pinned to the server CPUs with MariaDB for the run (then put back).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from arena import procs, repo
from arena.errors import ArenaError
from arena.servers.gannet import REPO_ROOT
from arena.servers.sites import embeds_app
from arena.tools import command_output

APP_DIR = REPO_ROOT / "apps" / "shakespeare"
SETUP = APP_DIR / "setup.sh"
SETUP_COMMAND = "apps/shakespeare/setup.sh"
# setup.sh's settings, read from the same environment variables it reads.
DOCROOT = Path(os.environ.get("SHAKESPEARE_DOCROOT", "/var/www/shakespeare"))
SOCKET = os.environ.get("SHAKESPEARE_FPM_SOCKET", "/run/php/shakespeare.sock")
PHP_VERSION = "8.2"
FPM_PID_FILE = Path(f"/run/php/php{PHP_VERSION}-fpm.pid")
FPM_BINARY = f"/usr/sbin/php-fpm{PHP_VERSION}"
POOL_DIR = Path(f"/etc/php/{PHP_VERSION}/fpm/pool.d")
DB_PID_FILE = Path("/run/mysqld/mysqld.pid")
DB_SOCKET = "/run/mysqld/mysqld.sock"
SETUP_TIMEOUT = 900.0
# Apache prefork with mod_php holds one persistent MariaDB connection per process, up to the
# 1,024 processes of its tuned profile (arena/servers/apache.py).
EMBEDDED_PHP_PROCESSES = 1024


def _fcgi():
    """apps/shakespeare/fcgi.py, the app's own FastCGI client (standard library only)."""
    path = APP_DIR / "fcgi.py"
    if not path.is_file():
        raise ArenaError(f"{path} not found: the dynamic scenarios need the repository's apps/shakespeare")
    spec = importlib.util.spec_from_file_location("shakespeare_fcgi", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fetch(path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of one request for `path`, sent to the pool as a web server would."""
    fcgi = _fcgi()
    try:
        status, _, body = fcgi.request(f"unix:{SOCKET}", path, docroot=str(DOCROOT), timeout=timeout)
    except (OSError, fcgi.FastCGIError) as exc:
        raise ArenaError(f"the PHP-FPM pool on unix:{SOCKET} did not answer {path}: {exc}") from None
    return status, body


def problem() -> str | None:
    """Why the app cannot serve right now, or None when it answers /.json with 200."""
    if not (DOCROOT / "index.php").is_file():
        return f"{DOCROOT}/index.php does not exist"
    if not Path(SOCKET).exists():
        return f"no PHP-FPM pool listens on unix:{SOCKET}"
    try:
        status, _ = fetch("/.json", timeout=5)
    except ArenaError as exc:
        return str(exc)
    if status != 200:
        return f"the app answers /.json with status {status} (is MariaDB up and loaded?)"
    return None


def _all_cpus() -> set[int]:
    """The CPUs a service started now should be allowed (the arena itself is pinned)."""
    try:
        return os.sched_getaffinity(1)
    except OSError:
        return set(range(os.cpu_count() or 1))


def ready(log=print) -> None:
    """Make sure the app answers; run setup.sh as root when it does not."""
    why = problem()
    if why is None:
        return
    if os.geteuid() != 0 or not SETUP.is_file():
        raise ArenaError(f"the Shakespeare app is not set up ({why}): run `sudo {SETUP_COMMAND}` "
                         f"in {REPO_ROOT}{repo.hint()} (it installs PHP-FPM and MariaDB, loads the data and "
                         "starts the pool), then run the arena again")
    log(f"the Shakespeare app is not ready ({why}): running {SETUP_COMMAND}")
    try:
        # Services it starts must not inherit the arena's pinning to the client CPUs.
        done = subprocess.run([str(SETUP)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=SETUP_TIMEOUT, preexec_fn=lambda: os.sched_setaffinity(0, _all_cpus()))
    except subprocess.TimeoutExpired:
        raise ArenaError(f"{SETUP_COMMAND} did not finish within {SETUP_TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise ArenaError(f"{SETUP_COMMAND} failed (exit code {done.returncode}):\n{tail}")
    why = problem()
    if why is not None:
        raise ArenaError(f"the Shakespeare app still does not answer after {SETUP_COMMAND}: {why}")


# --- the URL mix -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Url:
    path: str
    body_bytes: int


def _json(path: str) -> dict:
    status, body = fetch(path)
    if status != 200:
        raise ArenaError(f"the app answers {path} with status {status}; expected 200")
    return json.loads(body)


def url_list() -> list[Url]:
    """The fixed URL mix: the front page, then for every work (by slug) the work, its first
    act and that act's first scene; each as HTML and as JSON (`.json`). 2 + 6 x works URLs
    (260 with the 43 works loaded), each with its body size."""
    paths = ["/", "/.json"]
    for work in sorted(_json("/.json")["works"], key=lambda w: w["slug"]):
        slug = work["slug"]
        act = _json(f"/{slug}.json")["acts"][0]["act"]
        scene = _json(f"/{slug}/{act}.json")["scenes"][0]["scene"]
        for page in (f"/{slug}", f"/{slug}/{act}", f"/{slug}/{act}/{scene}"):
            paths += [page, page + ".json"]
    urls = []
    for path in paths:
        status, body = fetch(path)
        if status != 200:
            raise ArenaError(f"the app answers {path} with status {status}; expected 200")
        urls.append(Url(path, len(body)))
    return urls


def digest(urls: list[Url]) -> str:
    """sha256 of the list and its sizes: two runs with the same digest ran the same mix."""
    return hashlib.sha256("".join(f"{u.path} {u.body_bytes}\n" for u in urls).encode()).hexdigest()


def write_urls(urls: list[Url], path: Path, prefix: str = "") -> Path:
    """One URL per line (prefix + path): siege -f, h2load -i (absolute) or wrk_paths.lua (paths)."""
    path.write_text("".join(f"{prefix}{u.path}\n" for u in urls))
    return path


# --- the PHP tier -------------------------------------------------------------------------------

def pool_name(socket_path: str = SOCKET, pool_dir: Path = POOL_DIR) -> str:
    """The name of the pool that listens on `socket_path`, read from PHP-FPM's pool files."""
    for conf in sorted(pool_dir.glob("*.conf")):
        name = None
        for line in conf.read_text(errors="replace").splitlines():
            line = line.strip()
            header = re.fullmatch(r"\[([^\]]+)\]", line)
            if header:
                name = header.group(1)
                continue
            key, _, value = line.partition("=")
            if name and key.strip() == "listen" and value.strip() in (socket_path, f"unix:{socket_path}"):
                return name
    raise ArenaError(f"no PHP-FPM pool in {pool_dir} listens on {socket_path}: run `sudo {SETUP_COMMAND}`")


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


@dataclass
class PhpTier:
    """The PHP-FPM master and the children of one pool (not the master's other pools)."""
    master: int
    pool: str
    _member: dict[int, bool] = field(default_factory=dict)

    def pids(self) -> list[int]:
        out = []
        for pid in procs.process_tree(self.master):
            if pid not in self._member:
                # A pid's title is fixed for its life (pm static never recycles children).
                self._member[pid] = pid == self.master or _cmdline(pid) == f"php-fpm: pool {self.pool}"
            if self._member[pid]:
                out.append(pid)
        return out

    @classmethod
    def find(cls) -> "PhpTier":
        master = _pid(FPM_PID_FILE)
        if master is None or not procs.alive(master):
            raise ArenaError(f"the PHP-FPM master ({FPM_PID_FILE}) is not running: run `sudo {SETUP_COMMAND}`")
        return cls(master, pool_name())


def backend_threads(tier: PhpTier) -> list[tuple[int, int]]:
    """(process, thread) of every thread of PHP-FPM (all its pools: children it forks inherit
    the master's CPUs) and of MariaDB."""
    pids = procs.process_tree(tier.master)
    db = _pid(DB_PID_FILE)
    if db is not None and procs.alive(db):
        pids.append(db)
    threads = []
    for pid in pids:
        try:
            threads += [(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            pass
    return threads


def pin(tier: PhpTier, cpus: set[int]) -> dict[int, set[int]]:
    """Pin the backend's threads to `cpus`; return the CPUs each had, for unpin()."""
    before = {}
    for _, tid in backend_threads(tier):
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cpus)
        except OSError:
            before.pop(tid, None)  # gone meanwhile
    return before


def unpin(tier: PhpTier, before: dict[int, set[int]]) -> None:
    """Give every backend thread its CPUs back; threads born during the run (MariaDB starts
    one per new connection) get their process's."""
    for pid, tid in backend_threads(tier):
        cpus = before.get(tid) or before.get(pid)
        if cpus is None:
            continue
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


# --- MariaDB ------------------------------------------------------------------------------------

def _db(sql: str) -> str | None:
    try:
        done = subprocess.run(["mariadb", f"--socket={DB_SOCKET}", "-N", "-B", "-e", sql],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def ensure_db_connections(wanted: int) -> dict:
    """MariaDB must accept `wanted` connections at once: raise max_connections (a runtime
    setting, as setup.sh does) when root, else say what to run."""
    current = _db("SELECT @@max_connections")
    if current is None:
        raise ArenaError(f"cannot read MariaDB's max_connections over {DB_SOCKET} (run the arena as root, "
                         f"or raise it to {wanted}: SET GLOBAL max_connections = {wanted})")
    if int(current) >= wanted:
        return {"max_connections": int(current)}
    if _db(f"SET GLOBAL max_connections = {wanted}") is None:
        raise ArenaError(f"MariaDB allows {current} connections and mod_php needs up to {wanted}: run "
                         f"`mariadb -e 'SET GLOBAL max_connections = {wanted}'` as root")
    return {"max_connections": wanted, "raised_from": int(current)}


# --- one run --------------------------------------------------------------------------------------

@dataclass
class App:
    """What the dynamic scenarios keep between prepare() and finish()."""
    urls: list[Url]
    tier: PhpTier
    pinned: dict[int, set[int]]
    record: dict

    def size_of(self) -> dict[str, int]:
        return {u.path: u.body_bytes for u in self.urls}

    def probe_paths(self) -> list[str]:
        """Paths each server is probed on before the run: both front pages and the smallest
        and largest bodies of the mix (their headers bound every reply's)."""
        by_size = sorted(self.urls, key=lambda u: (u.body_bytes, u.path))
        chosen = ["/", "/.json", by_size[0].path, by_size[-1].path]
        return list(dict.fromkeys(chosen))


def prepare(servers: list[str], kind: str, server_cpus: set[int], log=print) -> App:
    """Ready the app, draw the URL mix, find the PHP tier, make room in MariaDB for mod_php,
    and pin PHP-FPM and MariaDB to the server CPUs (unpin with finish())."""
    ready(log)
    urls = url_list()
    tier = PhpTier.find()
    children = len(tier.pids()) - 1
    record = {
        "app": str(APP_DIR), "docroot": str(DOCROOT), "fastcgi_socket": SOCKET,
        "php_fpm": command_output([FPM_BINARY, "-v"]).splitlines()[0] if Path(FPM_BINARY).exists() else "missing",
        "php_fpm_master": tier.master, "pool": tier.pool, "pool_children": children,
        "mariadb": (_db("SELECT VERSION()") or "unknown"),
        "urls": [[u.path, u.body_bytes] for u in urls], "urls_sha256": digest(urls),
        "backend_cpus": ",".join(map(str, sorted(server_cpus))),
    }
    if any(embeds_app(name, kind) for name in servers):
        # Both pools of setup.sh keep a persistent connection per child, and so does every
        # mod_php process: room for all of them.
        record["mariadb_connections"] = ensure_db_connections(2 * children + EMBEDDED_PHP_PROCESSES + 50)
    pinned = pin(tier, server_cpus)
    return App(urls, tier, pinned, record)


def finish(app: App | None) -> None:
    if app is not None:
        unpin(app.tier, app.pinned)
