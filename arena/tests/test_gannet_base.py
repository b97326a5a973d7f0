"""`gannet-base` (issue 30: the build before as a column): an earlier gannet build, given by
GANNET_BASE_BIN, run beside the current one with the same templates; refused clearly without
it. `--points` narrows the run to the points named."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from arena.servers import WEB_SERVERS
from arena.servers.gannet import gannet_binary


def arena(*args, env):
    return subprocess.run([sys.executable, "-m", "arena", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_without_a_base_binary_the_run_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GANNET_BASE_BIN"}
    done = arena("run", "small-static", "--quick", "--servers", "gannet,gannet-base", "--out", str(tmp_path / "r"),
                 env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("arena: gannet-base needs GANNET_BASE_BIN"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_base_build_runs_as_a_column_of_its_own(tmp_path):
    assert "gannet-base" not in WEB_SERVERS
    out = tmp_path / "run"
    env = dict(os.environ, GANNET_BASE_BIN=str(gannet_binary()))
    done = arena("run", "small-static", "--quick", "--servers", "gannet,gannet-base", "--points", "wrk/keepalive/*",
                 "--out", str(out), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["options"]["points"] == ["wrk/keepalive/*"]
    keys = {p["key"] for p in results["points"]}
    assert keys and all(k.startswith("wrk/keepalive/") for k in keys)
    served = {s["server"] for s in results["samples"]}
    assert served == {"gannet", "gannet-base"}
    for s in results["samples"]:
        assert s["failures"] == 0 and s["rps"] > 0
    env_info = results["environment"]
    assert env_info["gannet_base_sha256"] == env_info["gannet_sha256"]
    assert "gannet-base" in (out / "report.md").read_text()
