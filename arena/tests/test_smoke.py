"""The smoke run of issue 3: `arena run s1-static --quick --servers gannet,nginx` must work and
both servers must serve every request with the right byte count and no failure.

It needs gannet's release binary (target/release/gannet, or GANNET_BIN): CI builds it first.
Without it this test FAILS on purpose - a missing gannet must never pass as a skipped smoke.
The same check also runs on two peers, so the smoke path itself is verified independently."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

IMAGE = 394 * 1024


def smoke(servers: str, out) -> dict:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "arena", "run", "s1-static", "--quick", "--servers", servers,
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    results = json.loads((out / "results.json").read_text())
    results["elapsed"] = time.monotonic() - start
    return results


def check_every_request_served(results: dict, servers: list[str]) -> None:
    planned = {p["key"]: p["params"] for p in results["points"]}
    assert results["interrupted"] is False
    assert len(planned) == results["points_planned"] == 12
    for server in servers:
        samples = [s for s in results["samples"] if s["server"] == server]
        assert {s["point"] for s in samples} == set(planned), server
        for s in samples:
            where = f"{server} at {s['point']}"
            assert s["error"] is None, where
            assert s["failures"] == 0, where
            assert s["requests"] >= planned[s["point"]]["requests"], where
            assert s["body_size"] == IMAGE
            assert s["bytes_ok"] is True, f"{where}: {s['bytes_total']} bytes for {s['requests']} replies"
            assert s["cpu_per_10k"] is not None and s["peak_pss_mib"] > 0, where
            # The load tool's CPU is its own figure and part of the pair's.
            assert s["client_cpu_per_10k"] > 0, where
            assert s["pair_cpu_per_10k"] == pytest.approx(s["cpu_per_10k"] + s["client_cpu_per_10k"]), where


def test_smoke_gannet_and_nginx(tmp_path):
    results = smoke("gannet,nginx", tmp_path / "run")
    check_every_request_served(results, ["gannet", "nginx"])


def test_smoke_path_on_two_peers(tmp_path):
    results = smoke("nginx,lighttpd", tmp_path / "run")
    check_every_request_served(results, ["nginx", "lighttpd"])
    assert results["elapsed"] < 90
    assert (tmp_path / "run" / "report.html").stat().st_size > 10_000
