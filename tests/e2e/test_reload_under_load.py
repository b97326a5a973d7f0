"""Reloads under load lose no request: ten SIGHUPs, one a second, while wrk keeps 200
keep-alive connections busy. Each draining worker answers what it has with
`Connection: close` and closes a kept connection only after a grace time for a request
already on its way, with a lingering close, so wrk sees no reset, no connection closed
under a request, and no error status. (Closing idle kept connections at once, as nginx
does, costs a few hundred read errors per such run.)
"""

import signal
import time

import pytest

import wrkload
from conftest import wait_until

pytestmark = pytest.mark.skipif(wrkload.WRK is None, reason="wrk is not installed")


def test_ten_reloads_in_ten_seconds_under_load_lose_no_request(gannet):
    srv = gannet.start(files={"index.html": "hello\n"}, server="access_log off;")
    load = wrkload.start(f"{srv.base}/index.html", seconds=12)
    try:
        assert wait_until(lambda: wrkload.established(srv.port) >= 200, 10), "wrk did not connect"
        seen = set(srv.worker_pids())
        for n in range(10):
            began = time.monotonic()
            srv.proc.send_signal(signal.SIGHUP)
            # A reload is complete once its new worker process runs.
            new = wait_until(lambda: set(srv.worker_pids()) - seen, 10)
            assert new, f"reload {n} started no worker process: {srv.error_log()[-2000:]}"
            seen |= new
            # Pacing, not synchronisation: one reload a second.
            time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))
        assert load.poll() is None, "wrk ended before the last reload: the run proves nothing"
    finally:
        r = wrkload.finish(load)
    assert r.requests > 1000, r.text
    assert not r.errors, r.text
    assert r.non2xx == 0, r.text
    assert srv.get("/index.html")[0] == 200
    # The old workers all drained and exited.
    assert wait_until(lambda: len(srv.worker_pids()) == 1, 10), srv.worker_pids()
