"""`access_log` paths with variables and `open_log_file_cache`, as nginx's log module: one
file per `$host`, created by the worker running as `user` (and its `open() ... failed` when it
may not); no file, but `testing "ROOT" existence failed`, when the location's root is
missing; without the cache each line opens the path again (a renamed file is left at once),
with it the descriptor is kept until `valid` runs out (SIGUSR1 does not reopen it, as in
nginx). Checked side by side with Debian's nginx where both can run the same config.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import signal
import urllib.request
from pathlib import Path

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both, side_by_side


def conf(http: str, main: str = "") -> str:
    return PEER_MAIN + main + "http {\n" + http + "\n}\n"


PER_HOST = conf("""
 server {
  listen 127.0.0.1:{port};
  root {root};
  location / { access_log {tmp}/logs/$host.log; return 200 "ok\\n"; }
  location /gone/ { root {tmp}/no-such-root; access_log {tmp}/logs/gone-$host.log; return 200 "ok\\n"; }
 }
""")


def get(port: int, path: str, host: str) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Host": host})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200


def lines(p) -> list[str]:
    return p.read_text().splitlines() if p.exists() else []


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_per_host_files_and_missing_root_as_nginx(tmp_path):
    with side_by_side(tmp_path, PER_HOST) as (g, nginx_port):
        for side in ("gannet", "nginx"):
            (tmp_path / side / "logs").mkdir()
        for port in (g.port, nginx_port):
            for host in ("a.test", "b.test", "a.test"):
                get(port, "/x", host)
            get(port, "/gone/x", "a.test")
        for side in ("gannet", "nginx"):
            logs = tmp_path / side / "logs"
            # Each line is written after its answer went out: waited for.
            assert wait_until(lambda: [len(lines(logs / n)) for n in ("a.test.log", "b.test.log")] == [2, 1]), side
            assert sorted(os.listdir(logs)) == ["a.test.log", "b.test.log"], side
            assert all('"GET /x HTTP/1.1" 200 3' in ln for ln in lines(logs / "a.test.log"))
        for err in (g.error_log(), (tmp_path / "nginx" / "error.log").read_text()):
            assert f'testing "{tmp_path}/' in err and 'no-such-root" existence failed (2: No such file or directory)' in err, err


def test_files_are_made_by_the_unprivileged_worker(gannet):
    nobody = pwd.getpwnam("nobody")
    # Outside pytest's directory, which only root may enter.
    base = Path(tempfile.mkdtemp(prefix="gannet-logs-"))
    try:
        base.chmod(0o755)
        (base / "www").mkdir()
        logs = base / "logs"
        logs.mkdir()
        os.chown(logs, nobody.pw_uid, nobody.pw_gid)
        srv = gannet.start(conf=conf(f"""
 server {{ listen 127.0.0.1:{{port}}; root {base}/www;
  location / {{ access_log {logs}/$host.log; access_log {base}/$host.log; return 200 "ok\\n"; }} }}
""").replace("user root;", "user nobody nogroup;"))
        get(srv.port, "/", "a.test")
        made = logs / "a.test.log"
        st = os.stat(made)
        assert st.st_uid == nobody.pw_uid and st.st_mode & 0o777 == 0o644, st
        assert len(lines(made)) == 1
        # The base belongs to root: the worker may not create the file there, and says so.
        assert not (base / "a.test.log").exists()
        assert wait_until(lambda: f'open() "{base}/a.test.log" failed (13: Permission denied)' in srv.error_log())
    finally:
        shutil.rmtree(base)


def rotate_conf(cache: str) -> str:
    return conf("""
 %s
 server { listen 127.0.0.1:{port}; root {root};
  location / { access_log {tmp}/logs/$host.log; return 200 "ok\\n"; } }
""" % cache)


@pytest.mark.parametrize("cache", ["", "open_log_file_cache off;"])
def test_without_cache_each_line_opens_the_path(gannet, cache):
    (gannet.tmp / "logs").mkdir()
    srv = gannet.start(conf=rotate_conf(cache))
    log = srv.tmp / "logs" / "a.log"
    get(srv.port, "/", "a")
    os.rename(log, srv.tmp / "logs" / "a.log.1")
    get(srv.port, "/", "a")
    assert len(lines(log)) == 1 and len(lines(srv.tmp / "logs" / "a.log.1")) == 1


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_cached_descriptor_follows_the_rename_until_valid_runs_out_as_nginx(tmp_path):
    text = rotate_conf("open_log_file_cache max=10 inactive=1m valid=1s;")
    with side_by_side(tmp_path, text) as (g, nginx_port):
        for side in ("gannet", "nginx"):
            (tmp_path / side / "logs").mkdir()
        for side, port, master in (("gannet", g.port, g.proc.pid), ("nginx", nginx_port, None)):
            logs = tmp_path / side / "logs"
            get(port, "/", "a")
            # A server logs after its answer is out: the line is waited for.
            assert wait_until(lambda: (logs / "a.log").exists()), side
            os.rename(logs / "a.log", logs / "a.log.1")
            get(port, "/", "a")
            # Kept open: the line goes to the renamed file, even after SIGUSR1.
            assert wait_until(lambda: len(lines(logs / "a.log.1")) == 2), side
            assert not (logs / "a.log").exists(), side
            if master:
                os.kill(master, signal.SIGUSR1)
                assert wait_until(lambda: "reopened the log files" in g.error_log())
                get(port, "/", "a")
                assert not (logs / "a.log").exists(), side
            # Once `valid` has run out the name is looked at again: a new a.log.
            assert wait_until(lambda: get(port, "/", "a") or (logs / "a.log").exists(), deadline=10), side


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
@pytest.mark.parametrize("http,why", [
    ("open_log_file_cache inactive=10s;", '"open_log_file_cache" must have "max" parameter'),
    ("open_log_file_cache max=x;", 'invalid "open_log_file_cache" parameter "max=x"'),
    ("open_log_file_cache max=1 sometimes;", 'invalid "open_log_file_cache" parameter "sometimes"'),
    ("open_log_file_cache off; open_log_file_cache off;", '"open_log_file_cache" directive is duplicate'),
    ("access_log /tmp/$host.log combined buffer=4k;", "buffered logs cannot have variables in name"),
])
def test_config_errors_as_nginx(tmp_path, http, why):
    n, g = check_both(tmp_path, http)
    assert n.returncode != 0 and g.returncode != 0, (n.stderr, g.stderr)
    assert why in n.stderr and why in g.stderr, (n.stderr, g.stderr)
    assert "check.conf:" in g.stderr
