"""From per-round records to per-point figures: median and min-max of every metric over the
rounds, and each median as a ratio to gannet's at the same point."""

from __future__ import annotations

from arena.metrics import METRICS
from arena.stats import ratio, spread

REFERENCE = "gannet"


def summarize(points: list[dict], samples: list[dict], servers: list[str]) -> list[dict]:
    """One entry per (point, server) that has at least one record, in point then server order."""
    by_pair: dict[tuple[str, str], list[dict]] = {}
    for rec in samples:
        by_pair.setdefault((rec["point"], rec["server"]), []).append(rec)
    rows = []
    for point in points:
        medians_of: dict[str, dict] = {}
        for server in servers:
            recs = by_pair.get((point["key"], server))
            if not recs:
                continue
            metrics = {}
            for m in METRICS:
                s = spread([r.get(m.key) for r in recs])
                if s is not None:
                    metrics[m.key] = s.to_dict()
            medians_of[server] = {k: v["median"] for k, v in metrics.items()}
            errors = sorted({r["error"] for r in recs if r.get("error")})
            rows.append({
                "point": point["key"], "series": point["series"], "x": point["x"],
                "params": point["params"], "server": server, "rounds": len(recs),
                "metrics": metrics,
                "failures_total": sum(r.get("failures") or 0 for r in recs),
                "requests_total": sum(r.get("requests") or 0 for r in recs),
                "client_bound_rounds": sum(1 for r in recs if r.get("client_bound")),
                # The load tool's own failures (s4-proxy): not the server's, reported apart.
                "tool_stalled_rounds": sum(1 for r in recs if r.get("tool_stalled")),
                "not_measured_rounds": sum(1 for r in recs if r.get("not_measured")),
                "unthrottled_rounds": sum(1 for r in recs if r.get("throttled") is False),
                "bytes_ok": (all(r.get("bytes_ok") for r in recs)
                             if all(r.get("bytes_ok") is not None for r in recs) else None),
                "errors": errors,
            })
        reference = medians_of.get(REFERENCE)
        for row in rows:
            if row["point"] == point["key"]:
                row["ratio_to_gannet"] = {
                    key: ratio(value["median"], reference.get(key)) if reference else None
                    for key, value in row["metrics"].items()
                }
    return rows
