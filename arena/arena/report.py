"""report.md and a self-contained report.html (plots inline as base64) from results.json data.

Tables: one per server in the study's own layout (S1: requests, concurrency, req/s, max CPU,
memory, failed responses), then side-by-side summaries with every figure's ratio to gannet,
then the response headers each server sent, then warnings (client-bound points, errors)."""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path

from arena import tls
from arena.metrics import BY_KEY, fmt
from arena.summary import REFERENCE

# A table is shown for each figure that some point has (the PHP tier's only in the dynamic scenarios).
SIDE_BY_SIDE = ["capacity_per_core", "rps", "cpu_per_10k", "kernel_cpu_per_10k", "pair_cpu_per_10k", "total_cpu_per_10k", "php_cpu_per_10k", "gb_per_s", "cpu_per_gb", "p99_ms",
                "peak_pss_mib", "php_peak_pss_mib", "failures", "loss_pct", "get_failures", "post_failures",
                "shadow_copies", "hit_pct"]


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


def _note(row: dict) -> str:
    """What a row's figures cannot say by themselves: rounds the load tool stalled in (their
    counts are partial and not the server's failures) or that could not run."""
    notes = []
    if row.get("tool_stalled_rounds"):
        notes.append(f"tool stalled ({row['tool_stalled_rounds']}/{row['rounds']})")
    if row.get("not_measured_rounds"):
        notes.append(f"not measured ({row['not_measured_rounds']}/{row['rounds']})")
    return "; ".join(notes) or "-"


def _cell(row: dict, key: str, with_range: bool = False) -> str:
    if key == "note":
        return _note(row)
    if key in row["params"]:
        value = row["params"][key]
        return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
    m = row["metrics"].get(key)
    if m is None:
        return "-"
    text = fmt(key, m["median"])
    if with_range and m["n"] > 1 and m["min"] != m["max"]:
        text += f" ({fmt(key, m['min'])}-{fmt(key, m['max'])})"
    return text


def server_tables(results: dict) -> list[Table]:
    columns = results["scenario"]["study_columns"]
    tables = []
    for server in results["servers"]:
        rows = [r for r in results["summary"] if r["server"] == server]
        if not rows:
            continue
        body = [[_cell(r, key, with_range=(key == "rps")) for _, key in columns] for r in rows]
        tables.append(Table(f"{server}", [h for h, _ in columns], body,
                            "median over rounds; req/s shows (min-max)"))
    return tables


def side_by_side(results: dict, key: str) -> Table:
    metric = BY_KEY[key]
    servers = results["servers"]
    by_point: dict[str, dict[str, dict]] = {}
    for row in results["summary"]:
        by_point.setdefault(row["point"], {})[row["server"]] = row
    body = []
    for point, rows in by_point.items():
        cells = [point]
        for server in servers:
            row = rows.get(server)
            if row is None or key not in row["metrics"]:
                cells.append("-")
                continue
            text = _cell(row, key, with_range=True)
            r = row.get("ratio_to_gannet", {}).get(key)
            if r is not None and server != REFERENCE:
                text += f" x{r:.2f}"
            cells.append(text)
        body.append(cells)
    unit = f" ({metric.unit})" if metric.unit else ""
    better = f"; {metric.better} is better" if metric.better else ""
    return Table(f"{metric.label}{unit}", ["point"] + servers, body,
                 f"median (min-max) over rounds; xN = ratio to {REFERENCE}{better}")


def header_table(results: dict) -> Table:
    body = []
    for server, probes in results["environment"].get("probes", {}).items():
        for path, p in probes.items():
            server_line = next((line.split(":", 1)[1].strip() for line in p["headers_keepalive"].split("\r\n")
                                if line.lower().startswith("server:")), "-")
            body.append([server, path, str(p["header_keepalive"]), str(p["header_close"]),
                         f"{p['body_bytes']:,}", server_line])
    return Table("Response headers", ["server", "path", "header bytes (keep-alive)",
                                      "header bytes (close)", "body bytes", "Server header"], body)


def tls_table(results: dict) -> Table | None:
    """What each server negotiated (openssl s_client, once per server at the start)."""
    record = results["environment"].get("tls")
    if not record:
        return None
    body = []
    quic = record["transport"] == "h3"
    for server, info in record["servers"].items():
        resumes = info.get("resumes_sessions")
        body.append([server, info.get("protocol") or "-", info.get("cipher") or "-", info.get("alpn") or "-",
                     info.get("key_exchange") or "-", info.get("signature") or "-",
                     "-" if resumes is None else "yes" if resumes else "no", _load_tool_saw(results, server)])
    tool = "h3load" if quic else "h2load"
    offered = tls.TCP_ALPN.get(record["transport"], tls.ALPN.get(record["transport"]))
    note = (f"openssl s_client offering ALPN {offered}, once per server before the load"
            f"{' (over TCP, on the port QUIC shares)' if quic else ''}; cipher and protocol choices are each "
            "server's defaults (the client's cipher order counts too: h2load puts AES-128-GCM first). "
            "'resumes a session': a second connection from Python offering the first one's session")
    if quic:
        note += ("; over QUIC h3load verifies the run's certificate on every connection and reports the ALPN "
                 "protocol (TLS 1.3 by definition; quinn does not say which cipher was agreed)")
    return Table("TLS negotiated", ["server", "protocol", "cipher", "ALPN", "key exchange", "signature",
                                    "resumes a session", f"{tool} negotiated"], body, note)


def _load_tool_saw(results: dict, server: str) -> str:
    """Every protocol, cipher and application protocol h2load (or h3load) reported for the
    server's rounds."""
    seen = sorted({" ".join(str(x[k]) for k in ("tls_protocol", "tls_cipher", "application_protocol") if x.get(k))
                   for s in results["samples"] if s.get("server") == server and s.get("tool") in ("h2load", "h3load")
                   for x in [s.get("extra") or {}] if x.get("tls_protocol")})
    return "; ".join(seen) or "-"


def _handshakes(record: dict) -> str:
    if record["transport"] == "h3":
        return ("h3load keeps its QUIC connections, making one again only when the server ends it: the points "
                "measure requests, not handshakes")
    if record["resumption"]:
        return ("resumption left on in every server; wrk and h2load resume the previous connection's "
                "session, so new-connection points measure resumed handshakes where the server resumes")
    return ("full handshakes: session tickets and session cache off in every server (wrk and h2load would "
            "otherwise resume the previous connection's session)")


def warnings(results: dict) -> list[str]:
    out = []
    if results.get("interrupted"):
        out.append("The run was interrupted: only the completed points are reported.")
    record = results["environment"].get("tls")
    for server, info in (record or {}).get("servers", {}).items():
        resumes = info.get("resumes_sessions")
        if resumes is not None and resumes != record["resumption"]:
            out.append(f"{server} {'resumed' if resumes else 'did not resume'} a TLS session though resumption "
                       f"was {'on' if record['resumption'] else 'off'}: its new-connection points are not "
                       "the same kind of handshake as the others'.")
    for row in results["summary"]:
        where = f"{row['server']} at {row['point']}"
        if row["client_bound_rounds"]:
            out.append(f"{where}: the client was CPU-bound in {row['client_bound_rounds']} round(s); "
                       "the server may be faster than measured.")
        if row.get("tool_stalled_rounds"):
            out.append(f"{where}: the load tool stalled in {row['tool_stalled_rounds']} round(s) and was stopped "
                       "with SIGINT at its deadline; its partial counts are shown, and none of it counts as the "
                       "server's failures or loss.")
        if row.get("unthrottled_rounds"):
            out.append(f"{where}: the CPU quota never throttled the server in {row['unthrottled_rounds']} round(s): "
                       "something else was the limit there, so its capacity per core is a lower bound.")
        if row["bytes_ok"] is False:
            out.append(f"{where}: some replies did not carry the expected number of bytes.")
        for err in row["errors"]:
            out.append(f"{where}: {err}")
    for sample in results.get("samples", []):
        drops = (sample.get("extra") or {}).get("udp_receive_drops")
        if drops:
            out.append(f"{sample['server']} at {sample['point']}, round {sample['round']}: the kernel dropped "
                       f"{drops:,} UDP datagrams for a full receive buffer (the client's or the server's); QUIC "
                       "resent them, at a cost to both sides.")
    return out


def scenario_tables(results: dict) -> list[Table]:
    """Tables a scenario adds for itself (its `report_tables(results)`, if it has one)."""
    from arena.scenarios import REGISTRY
    hook = getattr(REGISTRY.get(results["scenario"]["name"]), "report_tables", None)
    return hook(results) if hook else []


def skipped_table(results: dict) -> Table | None:
    skipped = results["environment"].get("skipped")
    if not skipped:
        return None
    return Table("Not run", ["server", "why"], [[name, why] for name, why in skipped.items()])


def all_tables(results: dict) -> list[tuple[str, list[Table]]]:
    extra = scenario_tables(results)
    sections = [
        ("Per server (the study's layout)", server_tables(results)),
        *([("What this scenario compares", extra)] if extra else []),
        ("Side by side", [side_by_side(results, k) for k in SIDE_BY_SIDE
                          if any(k in r["metrics"] for r in results["summary"])]),
        ("What each server sends", [t for t in (header_table(results), tls_table(results)) if t]),
    ]
    skipped = skipped_table(results)
    if skipped:
        sections.insert(0, ("Servers left out", [skipped]))
    return sections


def _md_table(t: Table) -> str:
    lines = [f"#### {t.title}", "", "| " + " | ".join(t.headers) + " |",
             "|" + "|".join("---" for _ in t.headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in t.rows]
    if t.note:
        lines += ["", f"_{t.note}_"]
    return "\n".join(lines) + "\n"


def _intro(results: dict) -> list[tuple[str, str]]:
    env = results["environment"]
    record = env.get("tls")
    transport = []
    if record:
        cert = record["certificate"]
        key = "ECDSA P-256" if cert["kind"] == "ecdsa" else "RSA 2048"
        transport = [("Transport", record["label"]),
                     ("Certificate", f"self-signed, {key}, made for this run with the openssl CLI (tls/cert.pem)"),
                     ("New connections", _handshakes(record))]
    return [
        ("Study", results["scenario"]["study"]),
        ("Workload", results["scenario"]["description"]),
        *transport,
        ("Servers", ", ".join(results["servers"])),
        ("Profile", results["options"]["profile"]),
        ("Rounds", str(results["options"]["rounds"]) + (" (quick)" if results["options"]["quick"] else "")),
        ("Pinning", f"server CPUs {env['pinning']['server_cpus']}, client CPUs {env['pinning']['client_cpus']}"),
        *_quota(results),
        ("Machine", f"{env['cpu_model']}, {env['cpus_online']} CPUs, {env['memory_mib']} MiB, kernel {env['kernel']}"),
        ("Command", " ".join(env["command"])),
        ("Started", results["started"]),
        *_sessions(results),
        ("Status", "INTERRUPTED" if results["interrupted"] else "complete"),
    ]


def _quota(results: dict) -> list[tuple[str, str]]:
    """--server-quota: what each server was given, and how capacity per core follows from it."""
    quota = results["environment"].get("server_quota")
    if not quota:
        return []
    return [("Server CPU quota", f"{quota['percent']:g} % of one CPU per server's process tree "
                                 f"({quota['cgroup']}, {quota['period_us']} us periods); capacity per core = "
                                 f"req/s x {100 / quota['percent']:g}; scenarios' back ends and PHP tier unlimited")]


def _sessions(results: dict) -> list[tuple[str, str]]:
    """A resumed run (arena/resume.py) says when each part of it ran."""
    sessions = results.get("sessions") or []
    if len(sessions) < 2:
        return []
    spans = "; ".join(f"{s['started']} to {s['finished']}" for s in sessions)
    return [("Sessions", f"{len(sessions)}, resumed with `arena run --resume` (each point's rounds ran "
                         f"within one session): {spans}")]


def markdown(results: dict, plots: list[tuple[str, str]]) -> str:
    out = [f"# {results['scenario']['title']}", ""]
    out += [f"- **{k}**: {v}" for k, v in _intro(results)]
    out.append("")
    warn = warnings(results)
    if warn:
        out += ["## Warnings", ""] + [f"- {w}" for w in warn] + [""]
    for section, tables in all_tables(results):
        out += [f"## {section}", ""]
        out += [_md_table(t) for t in tables]
    if plots:
        out += ["## Plots", ""] + [f"![{title}]({name})" for name, title in plots] + [""]
    out += ["Configs, versions and the machine are in `environment.json` and `configs/`.", ""]
    return "\n".join(out)


def _html_table(t: Table) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in t.headers)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    note = f"<p class=note>{html.escape(t.note)}</p>" if t.note else ""
    return f"<h4>{html.escape(t.title)}</h4><table><tr>{head}</tr>{rows}</table>{note}"


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td:first-child{text-align:left}.note{color:#666;font-size:90%}
.warn{background:#fff4e0;padding:.5em 1em;border-left:4px solid #e90}img{max-width:100%}"""


def html_page(results: dict, plots: list[tuple[str, str]], folder: Path) -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(results['scenario']['title'])}"
             f"</title><style>{_CSS}</style></head><body><h1>{html.escape(results['scenario']['title'])}</h1><ul>"]
    parts += [f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in _intro(results)]
    parts.append("</ul>")
    warn = warnings(results)
    if warn:
        parts.append("<div class=warn><h2>Warnings</h2><ul>" +
                     "".join(f"<li>{html.escape(w)}</li>" for w in warn) + "</ul></div>")
    for section, tables in all_tables(results):
        parts.append(f"<h2>{html.escape(section)}</h2>")
        parts += [_html_table(t) for t in tables]
    if plots:
        parts.append("<h2>Plots</h2>")
        for name, title in plots:
            data = base64.b64encode((folder / name).read_bytes()).decode()
            parts.append(f"<h4>{html.escape(title)}</h4><img alt='{html.escape(title)}' "
                         f"src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)
