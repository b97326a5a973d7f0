"""`arena run --resume FOLDER`: a run stopped with Ctrl-C is completed later, keeping the points
it finished and measuring only the others, or refused when it would not measure the same thing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from test_smoke import check_every_request_served

SERVERS = ["gannet", "nginx"]


def arena(*args, env=None):
    return subprocess.run([sys.executable, "-m", "arena", *args], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A quick s1-static run stopped with SIGINT once its second point has begun."""
    out = tmp_path_factory.mktemp("interrupted") / "run"
    proc = subprocess.Popen([sys.executable, "-m", "arena", "run", "s1-static", "--quick", "--rounds", "2",
                             "--servers", ",".join(SERVERS), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    seen, points = "", []
    while len(points) < 2 and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
        if " round " in line and ":" in line:
            key = line.split()[1]
            if key not in points:
                points.append(key)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, seen + err
    return out


def copy_of(folder, tmp_path):
    target = tmp_path / folder.name
    shutil.copytree(folder, target)
    return target


def test_resume_measures_only_the_points_left(interrupted, tmp_path):
    run = copy_of(interrupted, tmp_path)
    before = json.loads((run / "results.json").read_text())
    assert before["interrupted"] is True
    rounds = before["options"]["rounds"]
    per_point: dict[str, int] = {}
    for s in before["samples"]:
        per_point[s["point"]] = per_point.get(s["point"], 0) + 1
    whole = {p for p, n in per_point.items() if n == rounds * len(SERVERS)}
    assert whole and len(per_point) < before["points_planned"]

    done = arena("run", "--resume", str(run))
    assert done.returncode == 0, done.stderr[-3000:]
    after = json.loads((run / "results.json").read_text())
    check_every_request_served(after, SERVERS)
    assert after["options"] == before["options"] and after["servers"] == SERVERS
    # The finished points are the interrupted session's own records, untouched; a point cut
    # short was measured again from its first round, as many rounds as the others.
    kept = [s for s in before["samples"] if s["point"] in whole]
    assert [s for s in after["samples"] if s["point"] in whole] == kept
    assert len(after["samples"]) == rounds * len(SERVERS) * after["points_planned"]
    assert after["samples"][len(kept)]["point"] not in whole
    assert not any(f"{p} " in line and " round " in line for p in whole for line in done.stderr.splitlines())
    assert len(after["sessions"]) == 2 and after["sessions"][0]["interrupted"] is True
    assert after["started"] == before["started"]
    assert [r["command"] for r in after["environment"]["resumed"]] == [["arena", "run", "--resume", str(run)]]
    report = (run / "report.md").read_text()
    assert "**Status**: complete" in report and "**Sessions**: 2, resumed with `arena run --resume`" in report
    assert not list(tmp_path.glob(".*"))  # no partial or replaced folder left beside it

    again = arena("run", "--resume", str(run))
    assert again.returncode == 1
    assert again.stderr.strip() == f"arena: {run} holds a complete run: nothing to resume"


def test_resume_refuses_another_gannet_build(interrupted, tmp_path):
    run = copy_of(interrupted, tmp_path)
    before = (run / "results.json").read_bytes()
    env = json.loads(before)["environment"]
    other = tmp_path / "gannet"
    shutil.copy(env["gannet_binary"], other)
    with open(other, "ab") as f:
        f.write(b"\0")  # still runs; a different build all the same
    done = arena("run", "--resume", str(run), env={**os.environ, "GANNET_BIN": str(other)})
    assert done.returncode == 1
    assert done.stderr.startswith(f"arena: the gannet binary ({other}) is not the build the interrupted run "
                                  "measured (its SHA-256 differs)"), done.stderr
    assert (run / "results.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gannet", run.name]


@pytest.mark.parametrize("args, message", [
    (["s1-static", "--servers", "nginx"], "drop scenario, --servers"),
    (["--rounds", "5", "--server-cpus", "0"], "drop --rounds, --server-cpus"),
])
def test_resume_takes_the_runs_own_options(interrupted, args, message):
    done = arena("run", *args, "--resume", str(interrupted))
    assert done.returncode == 1
    assert done.stderr.strip() == ("arena: --resume continues a run with its own scenario, servers and options: "
                                   + message)


def test_resume_needs_an_interrupted_run(tmp_path):
    done = arena("run", "--resume", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.strip() == f"arena: {tmp_path} is not an arena result folder (no results.json): nothing to resume"
