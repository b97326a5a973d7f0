"""s4-failover's and s4-mirror's parts on real back ends: the kill and restart of a real nginx
back end (SIGKILL to its master and worker, the port refused while it is down, the same port
and log after the restart), the replay split by method, the rotation of the killed back end,
the shadow's document root; and the quick smoke runs of both variants against gannet and
nginx: no failed GET although a back end died half-way through every point, every back end
serving again after its restart, and every mirrored request's copy at the shadow back end.
Like the other smoke tests they FAIL (never skip) without gannet's release binary."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from arena import ports, probe, procs, tcptune
from arena.scenarios.base import Options
from arena.scenarios.s4_failover import BACKENDS, POSTS, S4Failover
from arena.scenarios.s4_mirror import S4Mirror

CPU = str(min(os.sched_getaffinity(0)))


def refused(port: int) -> bool:
    try:
        socket.create_connection((ports.HOST, port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


@pytest.fixture
def failover():
    scenario = S4Failover()
    sysctl = {name: tcptune.read(name) for name in (tcptune.PORT_RANGE, tcptune.TW_REUSE)}
    try:
        yield scenario, scenario.prepare(Options(quick=True, client_cpus=CPU, backend_cpus=CPU), ["gannet"])
    finally:
        scenario.finish()
    assert {name: tcptune.read(name) for name in sysctl} == sysctl  # put back


def test_failover_kill_and_restart_of_a_real_backend(failover):
    scenario, info = failover
    assert len(info["backends"]) == BACKENDS == len(scenario.backends)
    low, high = scenario.client_ports
    for b in scenario.backends:
        # Outside the client port range: no connection can hold the port while it is down.
        assert not low <= b.site.port <= high
        assert probe.get(b.site.host, b.site.port, "/ads/slot-01.json", close=True).status == 200
    app = scenario.site_options(Options()).app
    assert [app[f"backend_port_{i}"] for i in (1, 2, 3)] == [b.site.port for b in scenario.backends]

    victim = scenario.backends[1]
    tree = procs.process_tree(victim.pid)
    assert len(tree) >= 2  # nginx's master and its worker: both must die
    pids = scenario.kill(victim)
    assert sorted(pids) == sorted(tree)
    deadline = time.monotonic() + 5
    while not refused(victim.site.port) and time.monotonic() < deadline:
        time.sleep(0.02)  # poll interval under the deadline
    assert refused(victim.site.port)

    took = scenario.restart(1, pids, Options(client_cpus=CPU, backend_cpus=CPU))
    again = scenario.backends[1]
    assert again is not victim and again.pid != victim.pid and 0 < took < 10
    assert not any(procs.alive(pid) for pid in pids)
    assert again.site.port == victim.site.port and again.rundir == victim.rundir
    assert probe.get(again.site.host, again.site.port, "/sync.json?r=1", close=True).status == 200
    log = (again.rundir / "access.log").read_text()
    assert '"GET /ads/slot-01.json HTTP/1.1" 200' in log and '"GET /sync.json?r=1 HTTP/1.1" 200' in log


def test_failover_replay_split_by_method_and_rotation(failover):
    scenario, info = failover
    groups = {name: group for name, (group, _) in scenario.groups.items()}
    assert set(groups) == {"desktop", "mobile", "app", POSTS}
    assert all(r.method == "GET" for n, g in groups.items() if n != POSTS for r in g.requests)
    assert groups[POSTS].requests and all(r.method == "POST" for r in groups[POSTS].requests)
    assert abs(sum(g.share for g in groups.values()) - 1) < 1e-9
    assert info["log"]["replayers"][POSTS]["requests"] == info["log"]["posts"]
    replays = scenario.replays(100, 2)
    assert {r.name for r in replays} == set(groups) and abs(sum(r.rate for r in replays) - 100) < 1e-9
    points = scenario.points(Options(quick=False))
    assert [p.params["victim"] for p in points] == [1, 2, 3, 1]
    warm = scenario.warmup(points[0], Options())
    assert warm.params["victim"] is None and warm.params["seconds"] == 1


def test_mirror_points_interleave_and_shadow_serves_mirrored_uris():
    scenario = S4Mirror()
    try:
        scenario.prepare(Options(quick=True, client_cpus=CPU, backend_cpus=CPU), ["gannet"])
        points = scenario.points(Options(quick=True))
        assert [(p.params["rate"], p.params["mirror"]) for p in points] == [(100, "off"), (100, "on")]
        full = scenario.points(Options())
        assert [p.params["mirror"] for p in full] == ["off", "on"] * (len(full) // 2)
        names = {r.name for r in scenario.replays(100, 2, [n for n in scenario.groups if n.endswith("-on")])}
        assert names == {"desktop-on", "mobile-on", "app-on"}
        on = scenario.groups["desktop-on"][0].requests
        off = scenario.groups["desktop-off"][0].requests
        assert all(a.uri == "/m" + b.uri[2:] for a, b in zip(on, off)) and off[0].uri.startswith("/p/")
        # The shadow gets the client's URI (/m/...) and serves it; the back end gets it stripped.
        shadow = scenario.shadow
        assert probe.get(shadow.site.host, shadow.site.port, on[0].uri, close=True).status == 200
        assert probe.get(scenario.backend.site.host, scenario.backend.site.port, on[0].uri[2:],
                         close=True).status == 200
    finally:
        scenario.finish()
    assert scenario.backends == [] and scenario.workdir is None


def run_arena(*args):
    return subprocess.run([sys.executable, "-m", "arena", "run", *args], capture_output=True, text=True,
                          timeout=300)


def test_smoke_s4_failover_gannet_and_nginx(tmp_path):
    out = tmp_path / "run"
    start = time.monotonic()
    done = run_arena("s4-failover", "--quick", "--servers", "gannet,nginx", "--out", str(out))
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr and time.monotonic() - start < 90
    results = json.loads((out / "results.json").read_text())
    ports_of = [b["address"] for b in results["environment"]["scenario"]["backends"]]
    assert len(ports_of) == BACKENDS
    for server in ("gannet", "nginx"):
        samples = {s["point"]: s for s in results["samples"] if s["server"] == server}
        assert sorted(samples) == ["rate100", "rate50"], server
        for key, s in samples.items():
            where = f"{server} at {key}"
            assert s["error"] is None and not s["tool_stalled"], where
            # The target: no client saw a GET fail although a back end died half-way.
            assert s["get_planned"] > 0 and s["get_failures"] == 0, where
            assert s["post_planned"] > 0 and s["post_failures"] is not None, where
            assert s["victim"] == {"rate50": 1, "rate100": 2}[key], where
            assert 0.7 <= s["kill_at_s"] <= 1.5 and s["restart_s"] is not None, where
            # The survivors carried the point; the killed one served until it died. (Whether a
            # back end restarted before the point gets traffic again depends on when each
            # proxy's fail_timeout ends: not asserted.)
            assert s["served_by_survivors"] > 0 and s["served_by_killed"] > 0, where
            assert len(s["served_per_backend"]) == BACKENDS, where
    report = (out / "report.md").read_text()
    assert "| Rate (req/s) | GETs | Failed GETs | POSTs | Failed POSTs |" in report


def test_smoke_s4_mirror_gannet_and_nginx(tmp_path):
    out = tmp_path / "run"
    start = time.monotonic()
    done = run_arena("s4-mirror", "--quick", "--out", str(out))  # default servers: those with a mirror
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr and time.monotonic() - start < 90
    assert "not run (no proxy-mirror site support: only gannet and nginx" in done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["servers"] == ["gannet", "nginx"]
    for s in results["samples"]:
        where = f"{s['server']} at {s['point']}"
        assert s["error"] is None and s["failures"] == 0 and s["lost"] == 0, where
        assert s["backend_served"] == s["planned"] and s["p50_ms"] is not None, where
        if s["mirror"] == "on":
            # Every request's copy reached the shadow, and was served there.
            assert s["shadow_copies"] == s["backend_served"] and s["shadow_statuses"] == {"200": s["planned"]}, where
        else:
            assert s["shadow_copies"] == 0, where
    report = (out / "report.md").read_text()
    assert "Main-traffic latency without and with the mirror" in report
    assert "| gannet | 100 |" in report and "| nginx | 100 |" in report
