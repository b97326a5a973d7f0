"""The result folder of a run. It is written under a hidden `.NAME.partial` name and renamed
only when every file is in place, so a half-written folder never looks complete.

Files: results.json (everything), results.csv (one row per point and server), samples.csv
(one row per round), report.md, report.html, PNG plots, environment.json, configs/."""

from __future__ import annotations

import csv
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

from arena import plots, report
from arena.errors import ArenaError
from arena.metrics import METRICS
from arena.summary import summarize


class RunFolder:
    def __init__(self, final: Path, resume: bool = False):
        self.final = final
        self.tmp = final.with_name(f".{final.name}.partial")
        # A resumed run rewrites its own folder: the old one stays until the new one is whole.
        self.resume = resume

    def create(self) -> None:
        if self.final.exists() and not self.resume:
            raise ArenaError(f"output folder {self.final} already exists: choose another --out")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir(parents=True)

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def finish(self) -> Path:
        if self.resume and self.final.exists():
            old = self.final.with_name(f".{self.final.name}.replaced")
            shutil.rmtree(old, ignore_errors=True)
            self.final.rename(old)
            self.tmp.rename(self.final)
            shutil.rmtree(old)
        else:
            self.tmp.rename(self.final)
        return self.final


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


def write_csv(path: Path, summary: list[dict]) -> None:
    param_keys: list[str] = []
    for row in summary:
        for key in row["params"]:
            if key not in param_keys:
                param_keys.append(key)
    header = ["point", "server", "rounds"] + param_keys
    for m in METRICS:
        header += [m.key, f"{m.key}_min", f"{m.key}_max", f"{m.key}_vs_gannet"]
    header += ["failures_total", "client_bound_rounds", "bytes_ok"]
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(header)
        for row in summary:
            cells = [row["point"], row["server"], row["rounds"]] + [row["params"].get(k, "") for k in param_keys]
            for m in METRICS:
                s = row["metrics"].get(m.key)
                r = row.get("ratio_to_gannet", {}).get(m.key)
                cells += [s["median"], s["min"], s["max"]] if s else ["", "", ""]
                cells.append("" if r is None else r)
            cells += [row["failures_total"], row["client_bound_rounds"], row["bytes_ok"]]
            out.writerow(cells)


def write_samples_csv(path: Path, samples: list[dict]) -> None:
    keys = [k for k in (samples[0] if samples else {}) if k != "extra"]
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        out.writeheader()
        out.writerows(samples)


def render_reports(results: dict, folder: Path) -> None:
    """(Re)write report.md, report.html and the plots from a results dict."""
    made = plots.make_plots(results, folder)
    (folder / "report.md").write_text(report.markdown(results, made))
    (folder / "report.html").write_text(report.html_page(results, made, folder))


def write_run(folder: RunFolder, *, scenario, options, servers, points, samples, environment,
              started: float, finished: float, interrupted: bool, previous: dict | None = None) -> dict:
    """`previous`: the interrupted run this session resumed (its samples are in `samples`)."""
    point_dicts = [p.to_dict() for p in points]
    done = {s["point"] for s in samples}
    session = {"started": _iso(started), "finished": _iso(finished), "interrupted": interrupted}
    sessions = [session]
    if previous:
        sessions = previous.get("sessions") or [{k: previous[k] for k in ("started", "finished", "interrupted")}]
        sessions = [*sessions, session]
    results = {
        "format": 1,
        "scenario": {"name": scenario.name, "title": scenario.title, "study": scenario.study,
                     "description": scenario.description, "x_label": scenario.x_label,
                     "study_columns": scenario.study_columns},
        "options": {"quick": options.quick, "rounds": options.rounds, "requests": options.requests,
                    "profile": options.profile, "server_cpus": options.server_cpus,
                    "client_cpus": options.client_cpus, "backend_cpus": options.backend_cpus,
                    "transport": options.transport,
                    "cert": options.cert if options.transport != "http" else None,
                    "resumption": options.resumption if options.transport != "http" else None,
                    "server_quota": options.server_quota,
                    "points": list(options.points) if options.points is not None else None},
        "servers": servers,
        "started": sessions[0]["started"],
        "finished": session["finished"],
        "interrupted": interrupted,
        "sessions": sessions,
        "points": [p for p in point_dicts if p["key"] in done],
        "points_planned": len(point_dicts),
        "samples": samples,
        "environment": environment,
    }
    results["summary"] = summarize(results["points"], samples, servers)
    out = folder.tmp
    (out / "environment.json").write_text(json.dumps(environment, indent=2, default=str))
    write_csv(out / "results.csv", results["summary"])
    write_samples_csv(out / "samples.csv", samples)
    render_reports(results, out)
    # results.json last: its presence means every other file is there.
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    return results
