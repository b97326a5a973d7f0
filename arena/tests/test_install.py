"""The arena as a tool people install (issue 30): run from any folder it writes its results
under that folder; a copy of the package outside any checkout (as a non-editable `pip install
./arena` leaves it) runs what needs no checkout, says to pass --repo for gannet, and with
`--repo` finds gannet's binary in the checkout named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ARENA_PACKAGE = Path(__file__).resolve().parents[1] / "arena"
CHECKOUT = Path(__file__).resolve().parents[2]


def arena(args: list[str], cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ARENA_REPO", "GANNET_BIN")}
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "arena", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_results_go_under_the_current_folder(tmp_path):
    done = arena(["run", "s5-latency", "--quick", "--servers", "floor"], tmp_path, ARENA_PACKAGE.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    (folder,) = (tmp_path / "results").iterdir()
    assert folder.name.endswith("-s5-latency") and (folder / "results.json").is_file()


def test_a_copy_outside_any_checkout_needs_repo_for_gannet(tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(ARENA_PACKAGE, site / "arena", ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    # The floor needs nothing from a checkout.
    done = arena(["run", "s5-latency", "--quick", "--servers", "floor", "--out", str(work / "f")], work, site)
    assert done.returncode == 0, done.stderr[-2000:]
    # gannet does: a clear line naming --repo, nothing started.
    done = arena(["run", "s5-latency", "--quick", "--servers", "gannet", "--out", str(work / "g")], work, site)
    assert done.returncode == 1 and "pass --repo PATH" in done.stderr and not (work / "g").exists()
    done = arena(["run", "s5-latency", "--quick", "--servers", "gannet", "--repo", str(tmp_path)], work, site)
    assert done.returncode == 1 and "not a gannet checkout" in done.stderr
    done = arena(["run", "s5-latency", "--quick", "--servers", "gannet", "--repo", str(CHECKOUT),
                  "--out", str(work / "r")], work, site)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((work / "r" / "results.json").read_text())
    assert results["servers"] == ["gannet"] and all(s["failures"] == 0 for s in results["samples"])
