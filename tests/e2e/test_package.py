"""The Debian package, end to end: built with packaging/build-deb.sh (cargo deb) from the
binary the other tests run, installed with dpkg into a throw-away root (`--root` with
`--force-script-chrootless`, so the maintainer scripts run here with DPKG_ROOT set),
then run as its systemd unit's lines say - ExecStartPre, ExecStart with a NOTIFY_SOCKET
the test binds, ExecReload, KillSignal - under the unit's CapabilityBoundingSet and
NoNewPrivileges (applied with setpriv), with the installed config's absolute paths
pointed into the scratch root and the default site on a free port. Then logrotate's
postrotate, an upgrade to a second build (version bump) that keeps the edited
conffiles, removal and purge.

Needs root, dpkg, setpriv and cargo-deb (scripts/test-all.sh installs it).
"""

from __future__ import annotations

import gzip
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest

from conftest import REPO, free_port, gannet_bin, wait_until, worker_pids

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (dpkg, setuid to www-data)"),
    pytest.mark.skipif(shutil.which("cargo-deb") is None, reason="needs cargo-deb (cargo install cargo-deb)"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)"),
]

V1, V2 = "0.1.0-1", "0.1.0-2"


@pytest.fixture(scope="module")
def debs(tmp_path_factory):
    """Two builds of the package from the binary under test, versions V1 and V2."""
    binary = gannet_bin().resolve()
    profile = {"release": "release", "debug": "dev", "pgo": "pgo"}.get(binary.parent.name)
    if profile is None:
        pytest.skip(f"{binary} is not in a cargo target folder")
    out = tmp_path_factory.mktemp("debs")
    env = dict(os.environ, CARGO_TARGET_DIR=str(binary.parent.parent))
    built = {}
    for version in (V1, V2):
        r = subprocess.run([str(REPO / "packaging" / "build-deb.sh"), "--profile", profile, "--fast",
                            "--deb-version", version, "--output", str(out)],
                           env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        built[version] = Path(r.stdout.strip().splitlines()[-1])
        assert built[version].exists(), r.stdout
    return built


def dpkg(root: Path, *args: str) -> subprocess.CompletedProcess:
    # --force-depends: the scratch root has no libc6 package (the binary runs on the host's).
    return subprocess.run(["dpkg", f"--root={root}", "--force-script-chrootless", "--force-depends", *args],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)


def unit(root: Path) -> dict[str, list[str]]:
    """The installed unit's [Service] settings: name -> values, in order."""
    out: dict[str, list[str]] = {}
    section = None
    for line in (root / "lib/systemd/system/gannet.service").read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line and not line.startswith("#"):
            k, _, v = line.partition("=")
            out.setdefault(k, []).append(v)
    return out


def mapped(root: Path, line: str, mainpid: int | None = None) -> list[str]:
    """A unit command line as argv, run inside the scratch root: the installed binary, the
    installed config and its folder as prefix; $MAINPID filled in."""
    argv = shlex.split(line.replace("$MAINPID", str(mainpid)))
    if argv[0] == "/usr/sbin/gannet":
        argv = [str(root / "usr/sbin/gannet"), *argv[1:], "-c", str(root / "etc/gannet/gannet.conf"),
                "-p", str(root / "etc/gannet")]
    return argv


def confined(root: Path, argv: list[str]) -> list[str]:
    """argv under the unit's capability bounding set and NoNewPrivileges, as systemd runs it."""
    u = unit(root)
    caps = u["CapabilityBoundingSet"][0].split()
    bounding = "-all," + ",".join("+" + c.lower().removeprefix("cap_") for c in caps)
    pre = ["setpriv", f"--bounding-set={bounding}"]
    if u.get("NoNewPrivileges") == ["yes"]:
        pre.append("--no-new-privs")
    return [*pre, "--", *argv]


def point_into(root: Path, port: int) -> None:
    """Edit the installed conffiles as an admin would: absolute paths into the scratch root,
    the default site on `port` of the loopback addresses."""
    conf = root / "etc/gannet/gannet.conf"
    text = conf.read_text()
    for path in ("/etc/gannet", "/var/log/gannet", "/var/lib/gannet", "/run/gannet.pid"):
        text = text.replace(f" {path}", f" {root}{path}")
    conf.write_text(text)
    site = root / "etc/gannet/sites-available/default"
    text = site.read_text()
    text = text.replace("listen 80 default_server;", f"listen 127.0.0.1:{port} default_server;")
    text = text.replace("listen [::]:80 default_server;", f"listen [::1]:{port} default_server;")
    text = text.replace("root /var/www/html;", f"root {root}/var/www/html;")
    site.write_text(text)


class Notify:
    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(15)
        self.path = path

    def next(self) -> dict[str, str]:
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines() if line)


def fetch(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read().decode()


def uids(pid: int) -> list[int]:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return [int(v) for v in line.split()[1:]]
    raise AssertionError("no Uid line")


def cap_bounding(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapBnd line")


def start(root: Path, notify: Notify) -> subprocess.Popen:
    u = unit(root)
    assert u["Type"] == ["notify"]
    for pre in u.get("ExecStartPre", []):
        r = subprocess.run(confined(root, mapped(root, pre)), capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stderr == "", (pre, r.stderr)
    env = {"PATH": os.environ["PATH"], "NOTIFY_SOCKET": str(notify.path)}
    return subprocess.Popen(confined(root, mapped(root, u["ExecStart"][0])), env=env, stderr=subprocess.PIPE)


@pytest.fixture
def scratch():
    # Not pytest's tmp_path: its folders are root's 0700, which www-data cannot enter.
    d = Path(tempfile.mkdtemp(prefix="gannet-deb-"))
    d.chmod(0o755)
    procs: list[subprocess.Popen] = []
    yield d, procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    shutil.rmtree(d)


def test_package_installs_runs_as_its_unit_upgrades_and_purges(debs, scratch):
    d, procs = scratch
    root = d / "root"
    (root / "var/lib/dpkg/updates").mkdir(parents=True)
    (root / "var/lib/dpkg/info").mkdir()
    (root / "var/lib/dpkg/status").touch()

    # Install.
    r = dpkg(root, "-i", str(debs[V1]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Version: {V1}" in dpkg(root, "-s", "gannet").stdout
    assert (root / "usr/sbin/gannet").stat().st_mode & 0o111
    conffiles = set((root / "var/lib/dpkg/info/gannet.conffiles").read_text().split())
    want = {f"/etc/gannet/{f}" for f in ("gannet.conf", "mime.types", "fastcgi_params", "fastcgi.conf",
                                          "scgi_params", "uwsgi_params", "sites-available/default")}
    assert want | {"/etc/logrotate.d/gannet"} <= conffiles
    man = gzip.decompress((root / "usr/share/man/man8/gannet.8.gz").read_bytes()).decode()
    assert ".TH gannet 8" in man and ".SH OPTIONS" in man
    # What the postinst made, as Debian's nginx: the site link, the log folder and files,
    # the default page; and the worker's temp folder.
    link = root / "etc/gannet/sites-enabled/default"
    assert link.is_symlink() and link.resolve() == (root / "etc/gannet/sites-available/default").resolve()
    logs = root / "var/log/gannet"
    st = logs.stat()
    assert (pwd.getpwuid(st.st_uid).pw_name, stat.S_IMODE(st.st_mode)) == ("root", 0o755)
    assert (root / "etc/gannet/conf.d").is_dir()
    www = pwd.getpwnam("www-data")
    for f in ("access.log", "error.log"):
        st = (logs / f).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (www.pw_uid, 0o640), f
    assert (root / "var/lib/gannet").stat().st_uid == www.pw_uid
    page = (root / "var/www/html/index.gannet-debian.html").read_text()
    assert "Welcome to gannet!" in page

    # The installed gannet checks the installed config, pointed into the scratch root.
    port = free_port()
    point_into(root, port)
    (root / "run").mkdir()  # the pid file's folder, there on any running system
    r = subprocess.run(mapped(root, "/usr/sbin/gannet -t"), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "test is successful" in r.stderr, r.stderr

    # Start as the unit does: READY=1 once it serves.
    n = Notify(d / "notify")
    p = start(root, n)
    procs.append(p)
    ready = n.next()
    assert ready["READY"] == "1" and ready["MAINPID"] == str(p.pid), ready
    assert ready["STATUS"] == f"serving on 127.0.0.1:{port} [::1]:{port}"
    # gannet, not setpriv (which exec'd it), is the main process, with the unit's bounding set.
    assert os.readlink(f"/proc/{p.pid}/exe") == str(root / "usr/sbin/gannet")
    assert bin(cap_bounding(p.pid)).count("1") == len(unit(root)["CapabilityBoundingSet"][0].split())
    for host in ("127.0.0.1", "[::1]"):
        status, body = fetch(f"http://{host}:{port}/")
        assert status == 200 and "Welcome to gannet!" in body
    (worker,) = worker_pids(p.pid)
    assert uids(worker) == [www.pw_uid] * 4 and uids(p.pid)[0] == 0
    assert wait_until(lambda: "GET / HTTP/1.1" in (logs / "access.log").read_text())

    # Reload as ExecReload does: the check, then SIGHUP; RELOADING=1, then READY=1 with a
    # new worker process.
    for line in unit(root)["ExecReload"]:
        r = subprocess.run(confined(root, mapped(root, line, p.pid)), capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (line, r.stderr)
    assert n.next()["RELOADING"] == "1"
    again = n.next()
    assert again["READY"] == "1" and again["STATUS"] == ready["STATUS"], again
    assert wait_until(lambda: worker_pids(p.pid) not in ([], [worker]) and len(worker_pids(p.pid)) == 1)
    assert fetch(f"http://127.0.0.1:{port}/")[0] == 200

    # logrotate: the logs moved away, then the package's postrotate script; the master
    # reopens them and the next request is logged in a new file.
    rotate = (root / "etc/logrotate.d/gannet").read_text()
    for word in ("daily", "rotate 14", "compress", "delaycompress", "create 0640 www-data adm"):
        assert re.search(rf"^\s*{word}$", rotate, re.M), word
    post = rotate.split("postrotate", 1)[1].split("endscript", 1)[0]
    (logs / "access.log").rename(logs / "access.log.1")
    r = subprocess.run(["sh", "-c", post.replace("/run/gannet.pid", str(root / "run/gannet.pid"))], timeout=30)
    assert r.returncode == 0
    assert wait_until(lambda: (logs / "access.log").exists())
    # The master creates the file before the worker has it: asked until a line lands in it.
    assert wait_until(lambda: fetch(f"http://127.0.0.1:{port}/?after-rotation")[0] == 200
                      and "after-rotation" in (logs / "access.log").read_text())

    # Stop with the unit's KillSignal: STOPPING=1, and gone within TimeoutStopSec.
    sig = getattr(signal, unit(root)["KillSignal"][0])
    p.send_signal(sig)
    assert n.next()["STOPPING"] == "1"
    assert p.wait(int(unit(root)["TimeoutStopSec"][0])) == 0

    # Upgrade to the second build: the edited conffiles are kept (dpkg would ask, and
    # fail with no terminal, had the package's version of them changed), the site link
    # is not made again, the new version runs.
    edited = {f: (root / f).read_text() for f in ("etc/gannet/gannet.conf", "etc/gannet/sites-available/default")}
    r = dpkg(root, "-i", str(debs[V2]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"Version: {V2}" in dpkg(root, "-s", "gannet").stdout
    assert {f: (root / f).read_text() for f in edited} == edited
    p = start(root, n)
    procs.append(p)
    assert n.next()["READY"] == "1"
    assert fetch(f"http://[::1]:{port}/")[0] == 200
    # SIGTERM (a fast stop) makes the master kill its www-data workers: the bounding set
    # must allow it (CAP_KILL), or the master would wait for them forever.
    p.terminate()
    assert n.next()["STOPPING"] == "1"
    assert p.wait(10) == 0

    # Remove keeps the configuration and logs; purge deletes them.
    r = dpkg(root, "-r", "gannet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (root / "usr/sbin/gannet").exists()
    assert (root / "etc/gannet/gannet.conf").read_text() == edited["etc/gannet/gannet.conf"]
    r = dpkg(root, "-P", "gannet")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (root / "etc/gannet").exists() and not logs.exists() and not (root / "var/lib/gannet").exists()
    assert "gannet" not in dpkg(root, "-l").stdout
