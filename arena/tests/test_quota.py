"""`--server-quota` (arena/quota.py, issue 30): the cgroup files written for v1 and v2 layouts
(on stand-in folders), and on this machine's real cgroups a server started inside its group:
every process of its tree in the group, throttled under load, the group gone after the stop;
and a run's records carry capacity per core = req/s x 100 / P."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arena import ports, quota
from arena.clients import wrk
from arena.errors import ArenaError
from arena.quota import CpuQuota
from arena.servers import SERVERS, Site, SiteOptions


def test_v1_group_gets_period_and_quota(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    q = CpuQuota("nginx", 25, root=tmp_path)
    assert q.version == "cgroup v1 cpu" and q.path.parent == tmp_path / "cpu"
    assert (q.path / "cpu.cfs_period_us").read_text() == "10000"
    assert (q.path / "cpu.cfs_quota_us").read_text() == "2500"
    (q.path / "cpu.stat").write_text("nr_periods 40\nnr_throttled 7\nthrottled_time 123\n")
    assert q.throttled() == 7


def test_v2_group_enables_the_controller_and_sets_cpu_max(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    q = CpuQuota("gannet", 12.5, root=tmp_path)
    assert q.version == "cgroup v2 cpu.max"
    # The real file adds to the set; the stand-in keeps the last write.
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    assert (q.path / "cpu.max").read_text() == "1250 10000"


def test_no_cpu_controller_and_bad_percent_are_clear_errors(tmp_path):
    with pytest.raises(ArenaError, match="needs the cgroup cpu controller"):
        CpuQuota("nginx", 25, root=tmp_path)
    with pytest.raises(ArenaError, match="between 1 and 100"):
        CpuQuota("nginx", 150, root=tmp_path)


def _cgroups(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def test_server_tree_runs_inside_its_throttled_group(workdir, docroot):
    group = CpuQuota("gannet-test", 10)
    site = Site(docroot[0], ports.free_port(), SiteOptions())
    server = SERVERS["gannet"].start(site, workdir / "gannet", "tuned", "0", group)
    try:
        tree = server.tree()
        assert len(tree) >= 2  # master and worker
        assert all(group.path.name in _cgroups(pid) for pid in tree)
        before = group.throttled()
        result, _, failure = wrk.run(server.url("/robots.txt"), 10, 20_000, "1")
        assert failure is None and result.requests >= 20_000
        assert group.throttled() > before
    finally:
        server.stop()
    assert not group.path.exists()


def test_run_reports_capacity_per_core(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "arena", "run", "s5-latency", "--quick", "--servers", "gannet",
                           "--server-quota", "50", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["options"]["server_quota"] == 50
    given = results["environment"]["server_quota"]
    assert given["percent"] == 50 and given["period_us"] == quota.PERIOD_US
    assert given["cgroup"] in ("cgroup v1 cpu", "cgroup v2 cpu.max")
    for s in results["samples"]:
        assert s["throttled"] in (True, False)
        assert s["capacity_per_core"] == pytest.approx(s["rps"] * 2)
    assert "Capacity per core" in (out / "report.md").read_text()
