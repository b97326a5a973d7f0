"""Privilege separation, started as root: the master keeps root (binds, reads keys, opens
logs, reloads), the worker process that serves runs as `user`; `env`,
`working_directory`, `worker_rlimit_core` shape the worker process. Everything is read
from /proc of the real processes or seen over real sockets."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from conftest import wait_until

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="needs root (gannet drops to `user` only when started as root)",
)

try:
    WWW = pwd.getpwnam("www-data")
except KeyError:
    WWW = None

needs_www = pytest.mark.skipif(WWW is None, reason="needs the www-data user")


@pytest.fixture
def docroot():
    """A document root www-data can read (pytest's temp folders are root's, mode 0700):
    a public file and a root-only (0600) one."""
    d = Path(tempfile.mkdtemp(prefix="gannet-priv-"))
    d.chmod(0o755)
    (d / "public.txt").write_text("public")
    (d / "public.txt").chmod(0o644)
    (d / "secret.txt").write_text("root only")
    (d / "secret.txt").chmod(0o600)
    yield d
    shutil.rmtree(d)


def ids(pid: int, tid: int | str | None = None) -> dict[str, list[int]]:
    """Uid, Gid and Groups of a process (or one of its threads) from /proc."""
    path = f"/proc/{pid}/task/{tid}/status" if tid is not None else f"/proc/{pid}/status"
    out = {}
    for line in open(path):
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid", "Groups"):
            out[key] = [int(v) for v in value.split()]
    return out


def threads(pid: int) -> dict[str, str]:
    """{thread id: name} of a process."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[tid] = open(f"/proc/{pid}/task/{tid}/comm").read().strip()
        except OSError:
            pass
    return out


def main_conf(gannet, docroot: Path, main: str = "user www-data;", server: str = "", port: int | None = None):
    conf, port = gannet.render(conf="""
{main}
worker_processes 2;
pid {tmp}/gannet.pid;
error_log {tmp}/error.log info;
events { worker_connections 256; }
http {
    access_log {tmp}/access.log;
    server {
        listen 127.0.0.1:{port};
        root DOCROOT;
        location = /shadow { alias /etc/shadow; }
        SERVER
    }
}
""".replace("{main}", main).replace("DOCROOT", str(docroot)).replace("SERVER", server), port=port, as_root=False)
    return conf, port


def start(gannet, conf: str, port: int):
    return gannet.start(conf=conf, port=port, as_root=False)


@needs_www
def test_worker_threads_run_as_user_and_the_master_as_root(gannet, docroot):
    conf, port = main_conf(gannet, docroot)
    srv = start(gannet, conf, port)
    worker = srv.worker_pid()
    # Every thread of the worker process (the two worker threads included) is www-data
    # through and through: real, effective, saved and filesystem ids, and its groups are
    # www-data's own (initgroups), not root's.
    names = wait_until(lambda: sorted(n for n in threads(worker).values() if n.startswith("gannet-worker-")) == ["gannet-worker-0", "gannet-worker-1"])
    assert names, threads(worker)
    want_groups = sorted(set(os.getgrouplist("www-data", WWW.pw_gid)))
    for tid in threads(worker):
        got = ids(worker, tid)
        assert got["Uid"] == [WWW.pw_uid] * 4, (tid, got)
        assert got["Gid"] == [grp.getgrnam("www-data").gr_gid] * 4, (tid, got)
        assert sorted(got["Groups"]) == want_groups, (tid, got)
    # Not dumpable (no core wanted): its /proc entries, memory included, stay root's, out
    # of reach of www-data's other processes.
    assert os.stat(f"/proc/{worker}/mem").st_uid == 0
    # The master keeps root, and it has one thread: no thread of it serves clients.
    master = ids(srv.proc.pid)
    assert master["Uid"] == [0] * 4 and master["Gid"] == [0] * 4
    assert list(threads(srv.proc.pid).values()) == ["gannet"]


@needs_www
def test_root_only_files_are_forbidden_public_ones_served(gannet, docroot):
    conf, port = main_conf(gannet, docroot, server=f"location = /secret {{ alias {docroot}/secret.txt; }}")
    srv = start(gannet, conf, port)
    assert srv.get("/public.txt")[::2] == (200, b"public")
    assert srv.get("/secret.txt")[0] == 403
    assert srv.get("/secret")[0] == 403
    assert srv.get("/shadow")[0] == 403
    assert "(13: Permission denied)" in srv.error_log()


def test_root_without_user_runs_workers_as_nobody(gannet, docroot):
    """Started as root with no `user`, the workers run as nginx's default account, nobody
    in group nogroup, never as root. The master makes the temp folders for them (owned by
    nobody, mode 0700) before they start, so a body too big for memory still goes through
    a file."""
    from test_request_body_files import HashApp, post, upload_of
    nobody = pwd.getpwnam("nobody")
    nogroup = grp.getgrnam("nogroup").gr_gid
    app = HashApp()
    try:
        (docroot / "temp").mkdir(mode=0o755)
        temp = docroot / "temp" / "body"
        conf, port = main_conf(gannet, docroot, main="", server=f"""
            client_body_temp_path {temp};
            client_body_buffer_size 8k;
            location /up {{ proxy_pass http://127.0.0.1:{app.port}; }}""")
        srv = start(gannet, conf, port)
        worker = srv.worker_pid()
        for tid in threads(worker):
            got = ids(worker, tid)
            assert got["Uid"] == [nobody.pw_uid] * 4 and got["Gid"] == [nogroup] * 4, (tid, got)
        st = temp.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (nobody.pw_uid, 0o700)
        assert srv.get("/public.txt")[::2] == (200, b"public")
        assert srv.get("/secret.txt")[0] == 403
        length, digest = upload_of(1)
        out = post(port, "/up", 1)
        assert out.startswith(b"HTTP/1.1 200") and f"{length} {digest}".encode() in out, out[:300]
    finally:
        app.close()


def test_temp_folder_that_cannot_be_made_stops_the_start(gannet, docroot):
    """As nginx: the master makes each temp folder, whose parent must exist; if it cannot,
    gannet does not start, and says which folder and why."""
    conf, _ = main_conf(gannet, docroot, main="", server=f"client_body_temp_path {docroot}/no/such;")
    r = gannet.check(conf=conf, as_root=False)
    assert r.returncode == 1
    assert f'mkdir() "{docroot}/no/such" failed (2: No such file or directory)' in r.stderr, r.stderr


@needs_www
def test_group_argument_and_default(gannet, docroot):
    """The group is the one named like the user unless given, as nginx."""
    conf, port = main_conf(gannet, docroot, main="user www-data nogroup;")
    srv = start(gannet, conf, port)
    assert ids(srv.worker_pid())["Gid"] == [grp.getgrnam("nogroup").gr_gid] * 4
    assert srv.get("/public.txt")[0] == 200


def test_unknown_user_or_group_is_a_config_error(gannet, docroot):
    conf, _ = main_conf(gannet, docroot, main="user no-such-user-here;")
    r = gannet.check(conf=conf)
    assert r.returncode != 0 and 'check.conf:2: getpwnam("no-such-user-here") failed' in r.stderr, r.stderr
    conf, _ = main_conf(gannet, docroot, main="user www-data no-such-group-here;")
    r = gannet.check(conf=conf)
    assert r.returncode != 0 and 'getgrnam("no-such-group-here") failed' in r.stderr, r.stderr
    conf, _ = main_conf(gannet, docroot, main="user www-data;\nuser www-data;")
    r = gannet.check(conf=conf)
    assert r.returncode != 0 and '"user" directive is duplicate' in r.stderr, r.stderr


@needs_www
@pytest.mark.skipif(shutil.which("runuser") is None, reason="needs runuser")
def test_user_without_root_is_ignored_with_a_warning(gannet, docroot):
    """As nginx: started by an ordinary user, `user` cannot be obeyed; said, not fatal."""
    # In a folder of that user's, where the temp folders can be made.
    own = docroot / "www-data"
    own.mkdir()
    os.chown(own, WWW.pw_uid, WWW.pw_gid)
    path = own / "check.conf"
    path.write_text("events {}\nuser nobody;\nhttp { access_log off; }\n")
    path.chmod(0o644)
    from conftest import gannet_bin
    r = subprocess.run(["runuser", "-u", "www-data", "--", str(gannet_bin()), "-t", "-c", str(path)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert f'the "user" directive makes sense only if the master process runs with super-user privileges, ignored in {path}:2' in r.stderr, r.stderr


def free_low_port(host: str = "127.0.0.2") -> int:
    """A port below 1024 free on `host` (only root may bind it)."""
    for port in range(1023, 600, -1):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    pytest.skip("no free port below 1024")


def self_signed(d: Path) -> tuple[Path, Path]:
    """A certificate and its key, the key root's alone (0600)."""
    key, cert = d / "root-only.key", d / "cert.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    key.chmod(0o600)
    return cert, key


@needs_www
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command-line tool")
def test_reload_adds_a_low_port_with_a_root_only_key(gannet, docroot):
    conf, port = main_conf(gannet, docroot)
    srv = start(gannet, conf, port)
    first = srv.worker_pid()
    low = free_low_port()
    cert, key = self_signed(gannet.tmp)
    tls_server = f"""
    server {{
        listen 127.0.0.2:{low} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        root {docroot};
    }}
"""
    srv.conf_path.write_text(conf.rstrip().removesuffix("}") + tls_server + "}\n")
    # Clients keep connecting to the old port through the reload: none is refused.
    refused, served, stop = [], [], threading.Event()

    def hammer():
        while not stop.is_set():
            try:
                served.append(srv.get("/public.txt")[0])
            except ConnectionRefusedError as e:
                refused.append(e)

    t = threading.Thread(target=hammer)
    t.start()
    try:
        wait_until(lambda: len(served) >= 5)
        srv.proc.send_signal(signal.SIGHUP)
        # The old worker process drains and goes; one new one serves.
        new = wait_until(lambda: srv.worker_pids() not in ([], [first]) and len(srv.worker_pids()) == 1 and srv.worker_pids()[0])
        assert new and new != first, srv.worker_pids()
        wait_until(lambda: len(served) >= 20)
    finally:
        stop.set()
        t.join()
    assert not refused and set(served) == {200}, (refused[:3], set(served))
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.2", low), timeout=5) as raw, ctx.wrap_socket(raw, server_hostname="localhost") as s:
        s.sendall(b"GET /public.txt HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"public"), answer
    assert srv.get("/public.txt")[::2] == (200, b"public")
    assert ids(new)["Uid"] == [WWW.pw_uid] * 4
    assert "[emerg]" not in srv.error_log(), srv.error_log()


@needs_www
def test_a_killed_worker_process_is_started_again(gannet, docroot):
    conf, port = main_conf(gannet, docroot)
    srv = start(gannet, conf, port)
    first = srv.worker_pid()
    os.kill(first, signal.SIGKILL)
    again = wait_until(lambda: srv.worker_pids() not in ([], [first]) and srv.worker_pids()[0])
    assert again and again != first
    assert srv.get("/public.txt")[::2] == (200, b"public")
    assert ids(again)["Uid"] == [WWW.pw_uid] * 4
    assert f"worker process {first} exited on signal 9; starting it again" in srv.error_log()
    assert srv.proc.poll() is None


@needs_www
def test_reopened_logs_reach_the_unprivileged_worker(gannet, docroot):
    """SIGUSR1 after logrotate moved the access log away: the master (root) creates the new
    file, the worker (www-data, which could not create it in root's folder) writes to it."""
    conf, port = main_conf(gannet, docroot)
    srv = start(gannet, conf, port)
    srv.worker_pid()
    assert srv.get("/public.txt")[0] == 200
    log = gannet.tmp / "access.log"
    wait_until(lambda: log.exists() and "GET /public.txt" in log.read_text())
    log.rename(gannet.tmp / "access.log.1")
    srv.proc.send_signal(signal.SIGUSR1)
    assert wait_until(lambda: log.exists())
    # The new file appears before the worker has it: ask until a line lands in it.
    assert wait_until(lambda: srv.get("/public.txt?after")[0] == 200 and "after" in log.read_text())
    # Requests made before the worker had it went to the old file; once it has it, every
    # line goes to the new one only.
    assert srv.get("/public.txt?final")[0] == 200
    assert wait_until(lambda: "final" in log.read_text())
    assert "final" not in (gannet.tmp / "access.log.1").read_text()


@needs_www
def test_env_working_directory_and_core_limit(gannet, docroot, monkeypatch):
    monkeypatch.setenv("GANNET_KEPT", "kept-value")
    monkeypatch.setenv("GANNET_MASTER_SECRET", "do-not-leak")
    monkeypatch.setenv("TZ", "Europe/Paris")
    work = Path(tempfile.mkdtemp(prefix="gannet-cwd-"))
    work.chmod(0o755)
    try:
        conf, port = main_conf(gannet, docroot, main=f"""user www-data;
env GANNET_KEPT;
env GANNET_SET=set-value;
env GANNET_ABSENT;
working_directory {work};
worker_rlimit_core 10m;
worker_rlimit_nofile 2048;""")
        srv = start(gannet, conf, port)
        worker = srv.worker_pid()
        raw = open(f"/proc/{worker}/environ", "rb").read()
        env = dict(e.split(b"=", 1) for e in raw.split(b"\0") if e)
        # Only what `env` lists (when set) and TZ; nothing of the master's environment, not
        # even in what /proc shows of the block the process started with.
        assert env == {b"GANNET_KEPT": b"kept-value", b"GANNET_SET": b"set-value", b"TZ": b"Europe/Paris"}, env
        assert b"do-not-leak" not in raw and b"PATH=" not in raw
        assert b"do-not-leak" in open(f"/proc/{srv.proc.pid}/environ", "rb").read(), "the master keeps its own"
        assert os.readlink(f"/proc/{worker}/cwd") == str(work)
        # Cores wanted: dumpable again after setuid, so its /proc entries are www-data's.
        assert os.stat(f"/proc/{worker}/mem").st_uid == WWW.pw_uid
        limits = {l[:26].strip(): l[26:].split() for l in open(f"/proc/{worker}/limits").read().splitlines()[1:]}
        assert limits["Max core file size"][:2] == [str(10 << 20)] * 2, limits
        assert limits["Max open files"][:2] == ["2048", "2048"], limits
        assert srv.get("/public.txt")[0] == 200
    finally:
        shutil.rmtree(work)


@needs_www
def test_working_directory_that_cannot_be_entered_is_fatal_not_a_fork_loop(gannet, docroot):
    """chdir failing is fatal for the worker process (exit code 2, as nginx): logged and not
    started again; with no worker left the master exits."""
    conf, port = main_conf(gannet, docroot, main="user www-data;\nworking_directory /nonexistent-gannet;")
    srv = gannet.start(conf=conf, port=port, wait=False)
    assert wait_until(lambda: srv.proc.poll() is not None), srv.error_log()
    assert srv.proc.returncode != 0
    log = srv.error_log()
    assert 'chdir("/nonexistent-gannet") failed' in log and "cannot be started again" in log, log


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_fast_stop_without_cap_kill_does_not_hang(gannet, docroot):
    """A root master that may not signal its workers (no CAP_KILL, a unit's bounding set
    without it) still stops on SIGTERM: after its wait it logs the failed kill and leaves;
    the worker process, its master gone, ends too."""
    from conftest import gannet_bin, wait_port, worker_pids
    conf, port = main_conf(gannet, docroot, main="user nobody nogroup;")
    path = gannet.tmp / "gannet.conf"
    path.write_text(conf)
    p = subprocess.Popen(["setpriv", "--bounding-set=-kill", "--", str(gannet_bin()), "-c", str(path)],
                         stderr=subprocess.PIPE)
    try:
        wait_port(port, p)
        workers = wait_until(lambda: worker_pids(p.pid))
        assert workers
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        log = (gannet.tmp / "error.log").read_text()
        assert f"kill({workers[0]}, 9) failed (Operation not permitted" in log, log
        assert wait_until(lambda: not os.path.exists(f"/proc/{workers[0]}"), 10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
