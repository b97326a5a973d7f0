"""Binary upgrade with nginx's signals (USR2, WINCH, QUIT to the old master), under load:
the new master takes the listening sockets over (GANNET_INHERIT), the pid file moves to
`PID.oldbin` and back when the new binary fails or is stopped, and a HUP to an old master
whose workers WINCH stopped starts them again. The binary is the same file: what is tested
is the hand-over, not a version change.
"""

import os
import signal

import pytest

import wrkload
from conftest import wait_until, worker_pids


def read_pid(path):
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid):
    """Running, not a zombie waiting for its (new) parent to reap it."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class Upgrade:
    """The pid files of a server under upgrade; stops the new master at the end."""

    def __init__(self, srv):
        self.srv = srv
        self.pid = srv.tmp / "gannet.pid"
        self.oldbin = srv.tmp / "gannet.pid.oldbin"
        self.old = srv.proc.pid
        self.new = None

    def start(self):
        """USR2 to the old master; wait for the new master's pid file and worker."""
        # The master writes its pid file after it opens the listening sockets (as nginx's
        # does), so a server that answers may not have written it yet.
        assert wait_until(lambda: read_pid(self.pid) == self.old, 10)
        self.srv.proc.send_signal(signal.SIGUSR2)
        self.new = wait_until(lambda: read_pid(self.pid) not in (None, self.old) and read_pid(self.pid), 15)
        assert self.new, f"no new master: {self.srv.error_log()[-2000:]}"
        assert read_pid(self.oldbin) == self.old
        assert wait_until(lambda: worker_pids(self.new), 10), "the new master started no worker"
        return self.new

    def close(self):
        if self.new and alive(self.new):
            os.kill(self.new, signal.SIGTERM)
            assert wait_until(lambda: not alive(self.new), 10)


@pytest.mark.skipif(wrkload.WRK is None, reason="wrk is not installed")
def test_usr2_winch_quit_under_load_lose_no_request(gannet):
    srv = gannet.start(files={"index.html": "hello\n"}, server="access_log off;")
    up = Upgrade(srv)
    load = wrkload.start(f"{srv.base}/index.html", seconds=8)
    try:
        assert wait_until(lambda: wrkload.established(srv.port) >= 200, 10), "wrk did not connect"
        new = up.start()
        srv.proc.send_signal(signal.SIGWINCH)
        assert wait_until(lambda: not worker_pids(up.old), 10), "the old workers did not stop"
        assert srv.proc.poll() is None, "SIGWINCH stops the workers, not the master"
        srv.proc.send_signal(signal.SIGQUIT)
        srv.proc.wait(10)
        assert load.poll() is None, "wrk ended before the sequence did: the run proves nothing"
        r = wrkload.finish(load)
        assert r.requests > 1000, r.text
        assert not r.errors, r.text
        assert r.non2xx == 0, r.text
        # The new master serves alone.
        assert not alive(up.old)
        assert read_pid(up.pid) == new and not up.oldbin.exists()
        assert worker_pids(new)
        assert srv.get("/index.html")[0] == 200
    finally:
        if load.poll() is None:
            load.kill()
            load.wait()
        up.close()


def test_a_new_binary_that_fails_leaves_the_old_one_serving(gannet):
    srv = gannet.start(files={"index.html": "hello\n"})
    worker = srv.worker_pid()
    # The new binary reads the config file again, now broken.
    srv.conf_path.write_text(srv.conf_path.read_text() + "\nfrobnicate on;\n")
    srv.proc.send_signal(signal.SIGUSR2)
    assert wait_until(lambda: "exited with code 1" in srv.error_log(), 15), srv.error_log()
    pid, oldbin = srv.tmp / "gannet.pid", srv.tmp / "gannet.pid.oldbin"
    assert wait_until(lambda: read_pid(pid) == srv.proc.pid and not oldbin.exists())
    assert srv.get("/index.html")[0] == 200
    assert srv.worker_pids() == [worker]


def test_hup_after_winch_starts_the_old_workers_again_and_quit_of_the_new_rolls_back(gannet):
    srv = gannet.start(server='location = /v { return 200 "up\\n"; }')
    up = Upgrade(srv)
    try:
        new = up.start()
        srv.proc.send_signal(signal.SIGUSR2)
        assert wait_until(lambda: "is ignored: new binary process" in srv.error_log())
        os.kill(new, signal.SIGUSR2)
        assert wait_until(lambda: "is ignored: the old binary's master is still running" in srv.error_log())
        srv.proc.send_signal(signal.SIGWINCH)
        assert wait_until(lambda: not worker_pids(up.old), 10)
        assert srv.get("/v")[0] == 200, "the new master serves"
        srv.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: worker_pids(up.old), 10), "HUP did not start the old workers again"
        # WINCH again, then stop the new master: the old one takes its pid file back and
        # starts its workers by itself, as nginx.
        srv.proc.send_signal(signal.SIGWINCH)
        assert wait_until(lambda: not worker_pids(up.old), 10)
        os.kill(new, signal.SIGQUIT)
        assert wait_until(lambda: not alive(new), 10)
        assert wait_until(lambda: read_pid(up.pid) == up.old and not up.oldbin.exists(), 10)
        assert wait_until(lambda: worker_pids(up.old), 10)
        assert srv.get("/v")[0] == 200
        assert srv.proc.poll() is None
    finally:
        up.close()
