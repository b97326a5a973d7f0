"""`arena compare RUN_A RUN_B`: what changed between two runs, point by point and server by
server, for the figures that matter (throughput, CPU per request, tail latency, memory,
failures)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from arena.errors import ArenaError
from arena.metrics import BY_KEY, fmt

KEYS = ["rps", "cpu_per_10k", "p99_ms", "peak_pss_mib", "failures"]
NOISE = 0.05  # changes under 5 % are within this machine's noise; not flagged


def load(path: Path) -> dict:
    file = path / "results.json" if path.is_dir() else path
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise ArenaError(f"no results.json in {path}: is it a finished run folder?") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArenaError(f"{file} is not a valid results file") from None


# The --h2 and --h3 variants plan the same points, each under its own prefix (h2/h2load/...,
# h3/h3load/...): compared with each other they are matched on the rest of the key.
MULTIPLEXED = re.compile(r"^h[23]/h[23]load/")


def unprefixed(key: str) -> str:
    return MULTIPLEXED.sub("", key)


def changes(a: dict, b: dict) -> tuple[list[dict], list[str]]:
    """Rows (point, server, metric, a, b, change, verdict) and notes on what does not match."""
    notes = []
    point = str
    if a["scenario"]["name"] != b["scenario"]["name"]:
        notes.append(f"different scenarios: {a['scenario']['name']} vs {b['scenario']['name']}")
    if a["options"]["profile"] != b["options"]["profile"]:
        notes.append(f"different profiles: {a['options']['profile']} vs {b['options']['profile']}")
    # Runs written before the TLS variants have no transport: they were cleartext.
    ta, tb = a["options"].get("transport") or "http", b["options"].get("transport") or "http"
    if ta != tb:
        notes.append(f"different transports: {ta} vs {tb}")
        if {ta, tb} == {"h2", "h3"}:
            notes.append("HTTP/2 and HTTP/3 points matched on their keys without the transport's prefix")
            point = unprefixed
    elif ta != "http":
        for key, what in (("cert", "certificates"), ("resumption", "TLS session resumption")):
            if a["options"].get(key) != b["options"].get(key):
                notes.append(f"different {what}: {a['options'].get(key)} vs {b['options'].get(key)}")
    index_a = {(point(r["point"]), r["server"]): r for r in a["summary"]}
    index_b = {(point(r["point"]), r["server"]): r for r in b["summary"]}
    for pair in sorted(set(index_a) - set(index_b)):
        notes.append(f"only in A: {pair[1]} at {pair[0]}")
    for pair in sorted(set(index_b) - set(index_a)):
        notes.append(f"only in B: {pair[1]} at {pair[0]}")
    rows = []
    for pair in [p for p in index_a if p in index_b]:
        for key in KEYS:
            ma = index_a[pair]["metrics"].get(key)
            mb = index_b[pair]["metrics"].get(key)
            if ma is None or mb is None:
                continue
            va, vb = ma["median"], mb["median"]
            change = (vb - va) / va if va else (0.0 if vb == va else None)
            better = BY_KEY[key].better
            if change is None or abs(change) < NOISE:
                verdict = "same" if change is not None else "new"
            elif (change > 0) == (better == "higher"):
                verdict = "better"
            else:
                verdict = "worse"
            if key == "failures" and va != vb:
                verdict = "better" if vb < va else "worse"
            rows.append({"point": pair[0], "server": pair[1], "metric": key,
                         "a": va, "b": vb, "change": change, "verdict": verdict})
    return rows, notes


def render(a_path: Path, b_path: Path, console, all_rows: bool = False) -> int:
    from rich.table import Table

    a, b = load(a_path), load(b_path)
    rows, notes = changes(a, b)
    for note in notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    table = Table(title=f"{a_path.name} -> {b_path.name}")
    for col in ("point", "server", "figure", "A", "B", "change", ""):
        table.add_column(col, justify="left" if col in ("point", "server", "figure", "") else "right")
    colour = {"better": "green", "worse": "red", "same": "dim", "new": "dim"}
    shown = 0
    for r in rows:
        if r["verdict"] == "same" and not all_rows:
            continue
        shown += 1
        change = "-" if r["change"] is None else f"{r['change'] * 100:+.1f}%"
        table.add_row(r["point"], r["server"], BY_KEY[r["metric"]].label, fmt(r["metric"], r["a"]),
                      fmt(r["metric"], r["b"]), change, f"[{colour[r['verdict']]}]{r['verdict']}[/]")
    if shown:
        console.print(table)
    same = sum(1 for r in rows if r["verdict"] == "same")
    console.print(f"{shown} change(s) beyond {NOISE:.0%}; {same} figure(s) within noise"
                  + ("" if all_rows else " (use --all to list them)"))
    return 0
