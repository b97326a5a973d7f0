"""The smoke run of s4-proxy: `arena run s4-proxy --quick --servers gannet,nginx` proxies the
replayed log at 2 low rates to the nginx back end; at those rates neither proxy may lose a
request, the back end's log must count every planned request, and the proxy's CPU, memory and
TCP states must be recorded, and the client port sysctls recorded and put back. Like
test_smoke.py, it FAILS (never skips) without gannet's release binary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from arena import tcptune


def test_smoke_s4_proxy_gannet_and_nginx(tmp_path):
    out = tmp_path / "run"
    sysctl_before = {name: tcptune.read(name) for name in (tcptune.PORT_RANGE, tcptune.TW_REUSE)}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "arena", "run", "s4-proxy", "--quick", "--servers", "gannet,nginx",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    assert time.monotonic() - start < 60
    results = json.loads((out / "results.json").read_text())
    scenario = results["environment"]["scenario"]
    assert scenario["backend"]["cpus"] == "1" and scenario["log"]["posts"] > 0
    # The client port settings: recorded as found and as run, and put back afterwards.
    client_ports = scenario["client_ports"]
    assert client_ports["before"] == sysctl_before and client_ports["tw_reuse_effective"]
    if os.geteuid() == 0:
        low, high = map(int, client_ports["during"][tcptune.PORT_RANGE].split())
        assert low <= tcptune.WIDE_RANGE[0] and high >= tcptune.WIDE_RANGE[1]
    assert {name: tcptune.read(name) for name in sysctl_before} == sysctl_before
    planned = {p["key"]: p["params"] for p in results["points"]}
    assert sorted(planned) == ["rate100", "rate50"]
    for server in ("gannet", "nginx"):
        samples = [s for s in results["samples"] if s["server"] == server]
        assert {s["point"] for s in samples} == set(planned), server
        for s in samples:
            where = f"{server} at {s['point']}"
            assert s["error"] is None and not s["tool_stalled"], where
            assert s["planned"] == s["rate"] * planned[s["point"]]["seconds"], where
            assert s["sent"] == s["ok"] == s["planned"] and s["failures"] == 0, where
            assert s["backend_served"] == s["planned"] and s["backend_statuses"] == {"200": s["planned"]}, where
            assert s["lost"] == 0 and s["loss_pct"] == 0.0, where
            assert s["p50_ms"] is not None and s["mean_ms"] > 0 and s["max_ms"] >= s["p50_ms"], where
            assert s["cpu_per_10k"] is not None and s["peak_pss_mib"] > 0, where
            assert s["tcp_states"].get("TIME-WAIT", 0) > 0, where
    report = (out / "report.md").read_text()
    assert "| Rate (req/s) | Planned |" in report
    # The counts are in the table (figures, not "-"), and no point is marked as a tool stall.
    assert "| 50 | 100 | 100 | 100 | 100 | 0 | 0.00 |" in report and "tool stalled" not in report
