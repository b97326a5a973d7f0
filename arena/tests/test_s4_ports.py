"""s4-proxy's client ports and stalled replays (arena/tcptune.py, clients/httperf.py): the
sysctl tuning and its undoing, the TIME-WAIT count and the wait before a point on real
sockets, and a real httperf that stalls against a listener that accepts and never answers:
stopped with SIGINT at its deadline, its partial counts kept, the point marked as the tool's
stall - never as the server's failures or loss - in the record, the summary and the report."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from arena import ports, tcptune
from arena.clients import httperf
from arena.clients.base import run_tool
from arena.measure import TreeSample
from arena.report import markdown
from arena.scenarios import REGISTRY
from arena.scenarios.base import Point
from arena.scenarios.s4_proxy import ReplayRun
from arena.summary import summarize

CPU = str(min(os.sched_getaffinity(0)))


def fake_sys(tmp_path, port_range="32768\t60999", reuse="0"):
    root = tmp_path / "sys"
    (root / "net/ipv4").mkdir(parents=True)
    (root / "net/ipv4/ip_local_port_range").write_text(port_range + "\n")
    (root / "net/ipv4/tcp_tw_reuse").write_text(reuse + "\n")
    return root


def test_tune_widens_records_and_restores(tmp_path):
    root = fake_sys(tmp_path)
    tuning = tcptune.tune(root, is_root=True)
    assert tcptune.read(tcptune.PORT_RANGE, root) == "1024 65000"
    assert tcptune.read(tcptune.TW_REUSE, root) == "1"
    assert tuning.to_dict()["before"] == {tcptune.PORT_RANGE: "32768 60999", tcptune.TW_REUSE: "0"}
    assert tuning.to_dict()["during"] == {tcptune.PORT_RANGE: "1024 65000", tcptune.TW_REUSE: "1"}
    tuning.restore()
    tuning.restore()  # idempotent
    assert tcptune.read(tcptune.PORT_RANGE, root) == "32768 60999" and tcptune.read(tcptune.TW_REUSE, root) == "0"


def test_tune_keeps_what_is_wide_enough_and_never_narrows(tmp_path):
    # Linux's default tcp_tw_reuse (2) already covers loopback; a range wider at one end stays so.
    root = fake_sys(tmp_path, "500 64000", "2")
    tuning = tcptune.tune(root, is_root=True)
    assert tcptune.read(tcptune.PORT_RANGE, root) == "500 65000"
    assert tuning.changed == [tcptune.PORT_RANGE] and tcptune.read(tcptune.TW_REUSE, root) == "2"
    root2 = fake_sys(tmp_path / "wide", "1024 65535", "1")
    assert tcptune.tune(root2, is_root=True).changed == []


def test_tune_without_root_changes_nothing_and_says_so(tmp_path):
    root = fake_sys(tmp_path)
    tuning = tcptune.tune(root, is_root=False)
    assert tuning.changed == [] and tcptune.read(tcptune.PORT_RANGE, root) == "32768 60999"
    assert "not root" in tuning.note and "1024 65000" in tuning.note


def test_time_wait_parsing_and_counting():
    text = ("0 0 127.0.0.1:40001 127.0.0.1:8080 timer:(timewait,59sec,0)\n"
            "0 0 127.0.0.1:40002 127.0.0.1:8080 timer:(timewait,12sec,0)\n"
            "0 0 127.0.0.1:40003 127.0.0.1:9090 timer:(timewait,59sec,0)\n"
            "0 0 127.0.0.1:8080 127.0.0.1:40004 timer:(timewait,350ms,0)\n"
            "0 0 [::1]:40005 [::1]:8080 timer:(timewait,1min,0)\n"
            "garbage\n")
    found = tcptune.parse_time_wait(text)
    assert [s.local_port for s in found] == [40001, 40002, 40003, 8080, 40005]
    assert [s.remaining_s for s in found] == [59, 12, 59, 0.35, 60]
    # Without reuse every TIME-WAIT towards 8080 from a port in range blocks; with reuse only
    # the ones less than a second old; the server's own side (local 8080) never does.
    assert tcptune.blocked_ports(found, (40000, 40010), 8080, reuse=False) == 3
    assert tcptune.blocked_ports(found, (40000, 40010), 8080, reuse=True) == 2
    assert tcptune.blocked_ports(found, (40002, 40010), 8080, reuse=False) == 2
    assert tcptune.ports_needed(2000, 10, reuse=False) == 20_000
    assert tcptune.ports_needed(2000, 10, reuse=True) == 4_000
    assert tcptune.ports_needed(50, 1, reuse=True) == 50


def _time_wait_clients(count: int) -> tuple[int, list[int]]:
    """A listener and `count` client connections closed by the client first, so each client
    port ends in TIME-WAIT; returns the listener's port and the client ports."""
    listener = socket.socket()
    listener.bind((ports.HOST, 0))
    listener.listen(count)
    port = listener.getsockname()[1]
    client_ports = []
    for _ in range(count):
        client = socket.create_connection((ports.HOST, port))
        served, _ = listener.accept()
        client_ports.append(client.getsockname()[1])
        client.close()
        assert served.recv(1) == b""  # the client's FIN arrived
        served.close()
    listener.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        waiting = {s.local_port for s in tcptune.time_wait_sockets() if s.peer_port == port}
        if set(client_ports) <= waiting:
            return port, client_ports
        time.sleep(0.05)  # poll interval under the deadline
    raise AssertionError("the client sockets never showed in TIME-WAIT")


def test_wait_for_ports_on_real_time_wait_sockets():
    port, client_ports = _time_wait_clients(4)
    span = (min(client_ports), max(client_ports))
    size = span[1] - span[0] + 1
    # The four sockets were just closed: they block their destination with or without reuse.
    for reuse in (False, True):
        check = tcptune.wait_for_ports({port: "the proxy"}, size - 4, span, reuse, timeout=0.2)
        assert check.ok and check.free[port] == size - 4
    start = time.monotonic()
    check = tcptune.wait_for_ports({port: "the proxy", port + 1 if port < 65535 else port - 1: "the back end"},
                                   size - 3, span, reuse=False, timeout=0.3, interval=0.1)
    assert not check.ok and 0.3 <= time.monotonic() - start < 5
    assert f"needs {size - 3:,} towards the proxy (port {port})" in check.message
    assert f"only {size - 4:,} of the {size:,}" in check.message and tcptune.TW_REUSE in check.message
    # Other destinations are not blocked by them (one port serves many destinations).
    assert check.free[port + 1 if port < 65535 else port - 1] == size


def test_free_port_outside_the_client_range():
    low, high = tcptune.port_range()
    port = ports.free_port_outside((low, high))
    assert not low <= port <= high or (low <= 1024 and high >= 65535)
    ports.check_free(port)


def test_run_tool_kills_what_ignores_sigint():
    tool = run_tool(["sh", "-c", "trap '' INT; sleep 30"], CPU, timeout=0.3, interrupt_grace=0.3)
    assert tool.timed_out and not tool.interrupted and tool.wall_seconds < 5


def test_replay_without_hog():
    cmd = httperf.sessions_command("127.0.0.1", 8080, "/tmp/s.txt", 10, 5.0)
    assert "--hog" not in cmd and "--wsesslog" in cmd


@pytest.fixture
def silent_listener():
    """Accepts every connection and never answers (holds the sockets open)."""
    listener = socket.socket()
    listener.bind((ports.HOST, 0))
    listener.listen(256)
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1], held
    stop.set()
    thread.join()
    for s in held:
        s.close()
    listener.close()


def test_stalled_replay_is_the_tools_failure_with_partial_counts(tmp_path, silent_listener):
    port, held = silent_listener
    sessions = tmp_path / "sessions.txt"
    sessions.write_text("/ads/slot-01.json?x=1\n\n/event.json method=POST contents='a=1'\n")
    # 20 sessions/s for 5 s, each waiting up to 30 s for an answer that never comes: httperf
    # would run 35 s; the 1.5 s deadline stops it with SIGINT.
    replay = httperf.Replay("desktop", str(sessions), 100, 20.0)
    start = time.monotonic()
    done = httperf.run_sessions(ports.HOST, port, [replay], CPU, timeout_s=30, deadline_s=1.5)
    assert time.monotonic() - start < 1.5 + httperf.INTERRUPT_GRACE_S
    d = done[0]
    assert d.stalled and d.tool.interrupted and "stalled" in d.failure
    assert d.result.sent > 0 and d.result.requests == 0 and len(held) > 0  # its partial counts

    scenario = REGISTRY["s4-proxy"]
    point = Point("rate20", "httperf log replay", 20, {"rate": 20, "seconds": 5})
    rec = scenario.client_record(point, ReplayRun(done, TreeSample(), 0.0, {}))
    scenario.add_loss(rec, 0)
    assert rec["tool_stalled"] and rec["stalled_replayers"] == ["desktop"]
    assert rec["planned"] == 100 and rec["sent"] == d.result.sent and rec["ok"] == 0
    # Not the server's: no failures, no loss.
    assert rec["failures"] is None and rec["lost"] is None and rec["loss_pct"] is None
    assert "desktop: httperf stalled" in rec["error"]

    rec.update({"server": "gannet", "point": point.key, "round": 1})
    summary = summarize([point.to_dict()], [rec], ["gannet"])
    assert summary[0]["tool_stalled_rounds"] == 1 and summary[0]["failures_total"] == 0
    assert "failures" not in summary[0]["metrics"] and "loss_pct" not in summary[0]["metrics"]
    results = {"scenario": {"name": scenario.name, "title": scenario.title, "study": scenario.study,
                            "description": scenario.description, "study_columns": scenario.study_columns},
               "servers": ["gannet"], "summary": summary, "interrupted": False, "started": "-",
               "options": {"profile": "tuned", "rounds": 1, "quick": True},
               "environment": {"pinning": {"server_cpus": "0", "client_cpus": "1"}, "cpu_model": "-",
                               "cpus_online": 2, "memory_mib": 1, "kernel": "-", "command": ["arena"]}}
    text = markdown(results, [])
    assert "| tool stalled (1/1) |" in text
    assert "the load tool stalled in 1 round(s)" in text
