"""`arena compare`: what changed between two runs."""

from __future__ import annotations

import subprocess
import sys

from arena.compare import changes
from results_data import build


def test_changes_flags_better_and_worse(tmp_path):
    a = build(tmp_path / "a", {"gannet": [1000], "nginx": [500]})
    b = build(tmp_path / "b", {"gannet": [1500], "nginx": [510]})
    rows, notes = changes(a, b)
    assert notes == []
    rps = {(r["point"], r["server"]): r for r in rows if r["metric"] == "rps"}
    assert rps[("wrk/keepalive/c1", "gannet")]["verdict"] == "better"
    assert rps[("wrk/keepalive/c1", "gannet")]["change"] == 0.5
    assert rps[("wrk/keepalive/c1", "nginx")]["verdict"] == "same"  # 2 % is noise
    cpu = {(r["point"], r["server"]): r for r in rows if r["metric"] == "cpu_per_10k"}
    assert cpu[("wrk/keepalive/c1", "gannet")]["verdict"] == "better"  # less CPU per request


def test_changes_notes_servers_missing_from_one_run(tmp_path):
    a = build(tmp_path / "a", {"gannet": [1000], "nginx": [500]})
    b = build(tmp_path / "b", {"gannet": [800]})
    rows, notes = changes(a, b)
    assert any(n.startswith("only in A: nginx") for n in notes)
    assert all(r["server"] == "gannet" for r in rows)
    assert {r["verdict"] for r in rows if r["metric"] == "rps"} == {"worse"}


def test_compare_command(tmp_path):
    build(tmp_path / "a", {"gannet": [1000], "nginx": [500]})
    build(tmp_path / "b", {"gannet": [2000], "nginx": [500]})
    done = subprocess.run([sys.executable, "-m", "arena", "compare", str(tmp_path / "a"), str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "better" in done.stdout and "+100.0%" in done.stdout
    missing = subprocess.run([sys.executable, "-m", "arena", "compare", str(tmp_path / "a"), str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert "no results.json" in missing.stderr and "Traceback" not in missing.stderr


def test_changes_notes_a_different_transport(tmp_path):
    a = build(tmp_path / "a", {"gannet": [1000]})
    b = build(tmp_path / "b", {"gannet": [1000]})
    a["options"].pop("transport", None)  # a run from before the TLS variants: cleartext
    b["options"].update({"transport": "tls", "cert": "ecdsa", "resumption": False})
    assert changes(a, b)[1] == ["different transports: http vs tls"]
    a["options"].update({"transport": "tls", "cert": "rsa", "resumption": True})
    assert changes(a, b)[1] == ["different certificates: rsa vs ecdsa", "different TLS session resumption: True vs False"]


def test_http2_and_http3_runs_compare_point_by_point(tmp_path):
    """`arena compare` of an --h2 and an --h3 run: the same points under each transport's prefix."""
    h2 = build(tmp_path / "h2", {"gannet": [1000]}, transport="h2")
    h3 = build(tmp_path / "h3", {"gannet": [800]}, transport="h3")
    assert {r["point"].split("/")[0] for r in h3["summary"]} == {"h3"}
    rows, notes = changes(h2, h3)
    assert notes == ["different transports: h2 vs h3",
                     "HTTP/2 and HTTP/3 points matched on their keys without the transport's prefix"]
    rps = {r["point"]: r for r in rows if r["metric"] == "rps"}
    assert set(rps) == {r["point"].removeprefix("h2/h2load/") for r in h2["summary"]}
    assert {"m10/c100", "robots/m1/c1"} <= set(rps)
    assert rps["m10/c100"]["verdict"] == "worse" and rps["m10/c100"]["change"] == -0.2
    # Other transports are not matched across: nothing in common.
    tls = build(tmp_path / "tls", {"gannet": [800]}, transport="tls")
    assert changes(h2, tls)[0] == []
