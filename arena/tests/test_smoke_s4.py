"""The smoke run of s4-proxy: `arena run s4-proxy --quick --servers gannet,nginx` proxies the
replayed log at 2 low rates to the nginx back end; at those rates neither proxy may lose a
request, the back end's log must count every planned request, and the proxy's CPU, memory and
TCP states must be recorded. Like test_smoke.py, it FAILS (never skips) without gannet's
release binary."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def test_smoke_s4_proxy_gannet_and_nginx(tmp_path):
    out = tmp_path / "run"
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "arena", "run", "s4-proxy", "--quick", "--servers", "gannet,nginx",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    assert time.monotonic() - start < 60
    results = json.loads((out / "results.json").read_text())
    scenario = results["environment"]["scenario"]
    assert scenario["backend"]["cpus"] == "1" and scenario["log"]["posts"] > 0
    planned = {p["key"]: p["params"] for p in results["points"]}
    assert sorted(planned) == ["rate100", "rate50"]
    for server in ("gannet", "nginx"):
        samples = [s for s in results["samples"] if s["server"] == server]
        assert {s["point"] for s in samples} == set(planned), server
        for s in samples:
            where = f"{server} at {s['point']}"
            assert s["error"] is None, where
            assert s["planned"] == s["rate"] * planned[s["point"]]["seconds"], where
            assert s["sent"] == s["ok"] == s["planned"] and s["failures"] == 0, where
            assert s["backend_served"] == s["planned"] and s["backend_statuses"] == {"200": s["planned"]}, where
            assert s["lost"] == 0 and s["loss_pct"] == 0.0, where
            assert s["p50_ms"] is not None and s["mean_ms"] > 0 and s["max_ms"] >= s["p50_ms"], where
            assert s["cpu_per_10k"] is not None and s["peak_pss_mib"] > 0, where
            assert s["tcp_states"].get("TIME-WAIT", 0) > 0, where
    assert "| Rate (req/s) | Planned |" in (out / "report.md").read_text()
