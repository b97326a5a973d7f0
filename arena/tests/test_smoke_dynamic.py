"""Smoke runs of the dynamic scenarios (issue 4): `arena run s1-dynamic --quick --servers
gannet,nginx` must answer every request of every point 2xx with the URL mix's byte counts and
measure the PHP tier beside each server; `arena run s3-sessions --quick --servers nginx`
likewise through siege. Needs the Shakespeare app (a run as root sets it up itself) and
gannet's release binary: without it the first test FAILS, as the static smoke test does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from arena import shakespeare


def run(scenario: str, servers: str, out) -> dict:
    done = subprocess.run([sys.executable, "-m", "arena", "run", scenario, "--quick", "--servers", servers,
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    return json.loads((out / "results.json").read_text())


def check_app_recorded(results: dict, servers: list[str]) -> dict:
    app = results["environment"]["scenario"]
    assert app["pool"] == "shakespeare" and app["fastcgi_socket"] == shakespeare.SOCKET
    assert [path for path, _ in app["urls"][:2]] == ["/", "/.json"] and len(app["urls"]) >= 2 + 6 * 40
    assert all(size > 0 for _, size in app["urls"])
    for server in servers:
        probes = results["environment"]["probes"][server]
        assert set(probes) >= {"/", "/.json"} and all(p["status"] == 200 for p in probes.values())
    return app


def test_smoke_s1_dynamic_gannet_and_nginx(tmp_path):
    shakespeare.ready()
    tier = shakespeare.PhpTier.find()
    cpus_before = os.sched_getaffinity(tier.master)
    results = run("s1-dynamic", "gannet,nginx", tmp_path / "run")
    planned = {p["key"]: p["params"] for p in results["points"]}
    assert results["interrupted"] is False
    assert len(planned) == results["points_planned"] == 12
    # The command as a user types it, though this run was `python -m arena`.
    assert results["environment"]["command"][:3] == ["arena", "run", "s1-dynamic"]
    app = check_app_recorded(results, ["gannet", "nginx"])
    for server in ("gannet", "nginx"):
        samples = [s for s in results["samples"] if s["server"] == server]
        assert {s["point"] for s in samples} == set(planned), server
        for s in samples:
            where = f"{server} at {s['point']}"
            assert s["error"] is None, where
            assert s["failures"] == 0 and s["non_2xx_3xx"] == 0, where
            assert s["requests"] >= planned[s["point"]]["requests"], where
            assert s["bytes_ok"] is True, f"{where}: {s['bytes_total']} bytes, expected {s['bytes_expected']}"
            assert s["php_in_server"] is False and s["php_processes"] == 1 + app["pool_children"], where
            assert s["php_cpu_per_10k"] > 0 and s["php_peak_pss_mib"] > 0 and s["peak_pss_mib"] > 0, where
            assert s["total_cpu_per_10k"] >= s["cpu_per_10k"], where
    # The back end was pinned to the server CPU for the run and given its CPUs back.
    assert app["backend_cpus"] == "0"
    assert os.sched_getaffinity(tier.master) == cpus_before
    assert (tmp_path / "run" / "php-cpu.png").exists()


def test_smoke_s3_sessions_on_nginx(tmp_path):
    results = run("s3-sessions", "nginx", tmp_path / "run")
    check_app_recorded(results, ["nginx"])
    assert [s["point"] for s in results["samples"]] == ["sessions5", "sessions10"]
    for s, point in zip(results["samples"], results["points"]):
        assert s["error"] is None and s["failures"] == 0, s["point"]
        assert s["transactions"] == point["params"]["planned_transactions"]
        assert s["extra"]["status_counts"] == {"200": point["params"]["planned_transactions"]}
        assert s["bytes_ok"] is True and s["php_cpu_per_10k"] > 0
    assert "| Sessions | Transactions | Elapsed (s) |" in (tmp_path / "run" / "report.md").read_text()
