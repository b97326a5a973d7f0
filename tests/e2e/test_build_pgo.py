"""scripts/build-pgo.sh's training load (`--train BIN`), against the binary under test:
every load it drives (static files on kept and new connections, a proxy, a cache's misses
and hits, TLS, HTTP/2) gets answers, all of them 2xx, and the single-process server exits
cleanly on SIGTERM (an instrumented build writes its counts at that exit). The two release
builds around it are not run here; docs/bench/README.md ("The profile-guided build") has what
the build gains."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from conftest import REPO, gannet_bin

pytestmark = pytest.mark.skipif(
    shutil.which("wrk") is None or shutil.which("h2load") is None, reason="needs wrk and h2load"
)

LOADS = [
    "static keep-alive", "static c=1000", "static new connections", "static image", "static logged",
    "proxy", "cache misses", "cache hits", "cache hits c=1000", "TLS", "HTTP/2", "HTTP/2 cache",
]


def test_the_training_load_is_answered_in_full():
    r = subprocess.run(["bash", str(REPO / "scripts" / "build-pgo.sh"), "--train", str(gannet_bin())],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    counts = dict(line.split(": ", 1) for line in r.stdout.splitlines() if line.endswith(" requests"))
    assert sorted(counts) == sorted(LOADS), r.stdout
    for name in LOADS:
        assert int(counts[name].split()[0]) > 0, (name, r.stdout)
