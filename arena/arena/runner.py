"""Running a scenario: check prerequisites, start every server, probe them, warm up, then
measure each point in interleaved rounds (A B C, B C A, ...), and hand the records to the
output writer. Servers are always stopped, whatever happens."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from arena import envinfo, ports, probe, resume, tls, tools
from arena.errors import ArenaError
from arena.measure import TreeSample
from arena.clients import h3load
from arena.clients.base import LoadResult
from arena.output import RunFolder, write_run
from arena.quota import CpuQuota
from arena.scenarios.base import Context, Options, Scenario, record
from arena.servers import sites
from arena.servers.base import RunningServer, Server, Site, TlsSite
from arena.workload import make_docroot


def cpu_list(text: str) -> set[int]:
    """'0', '0,1', '0-3' -> CPU numbers."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            if "-" in part:
                low, high = part.split("-")
                cpus.update(range(int(low), int(high) + 1))
            else:
                cpus.add(int(part))
    except ValueError:
        raise ArenaError(f"bad CPU list '{text}': use e.g. 0 or 0,1 or 0-3") from None
    return cpus


def parse_cpus(text: str) -> set[int]:
    """'0', '0,1', '0-3' -> CPU numbers; each must be one this process may run on."""
    cpus = cpu_list(text)
    allowed = os.sched_getaffinity(0)
    missing = sorted(cpus - allowed)
    if missing:
        raise ArenaError(f"CPU {missing[0]} is not available here (usable CPUs: "
                         f"{','.join(map(str, sorted(allowed)))})")
    return cpus


def transport_plan(servers: list[Server], options: Options) -> tuple[list[Server], dict[str, str]]:
    """The servers that can serve the run's transport, and why each of the others cannot: a
    server that cannot is left out with that note in the report, not an error."""
    skipped = {}
    for server in servers:
        why = server.transport_support(options.transport)
        if why:
            skipped[server.name] = why
    return [s for s in servers if s.name not in skipped], skipped


def check_transport(scenario: Scenario, options: Options) -> None:
    """The scenario must have a variant for the run's transport."""
    tls.check_transport(options.transport)
    if options.transport not in scenario.transports:
        from arena.scenarios import REGISTRY
        having = sorted(n for n, s in REGISTRY.items() if options.transport in s.transports)
        raise ArenaError(f"{scenario.name} has no {tls.LABELS[options.transport]} variant "
                         f"(--{options.transport}): scenarios with one: {', '.join(having)}")


def preflight(scenario: Scenario, servers: list[Server], options: Options) -> None:
    """Fail before starting anything: missing tools, missing binaries and modules, bad CPU lists."""
    check_transport(scenario, options)
    tools.require("taskset")
    for name in scenario.tools_for(options):
        tools.require(name)
    if options.transport != "http":
        tools.require("openssl")
    kind = scenario.site_options(options).kind
    for server in servers:
        server.binary()
        # A server named with --servers that lacks the feature (a mirror, say): say so now.
        server.site_template_name(kind, options.profile)
        sites.check(server.name, kind)
        server.check_transport(options.transport)
    parse_cpus(options.server_cpus)
    parse_cpus(options.client_cpus)
    if options.rounds < 1:
        raise ArenaError("--rounds must be at least 1")


def probe_server(server: RunningServer, paths: list[str], files: dict[str, int]) -> None:
    """Fetch each path with and without keep-alive; check status and body size."""
    context = server.site.client_tls()
    for path in paths:
        try:
            keep = probe.get(server.site.host, server.site.port, path, close=False, context=context)
            close = probe.get(server.site.host, server.site.port, path, close=True, context=context)
        except OSError as exc:
            raise ArenaError(f"{server.name}: probing {path} failed: {exc}") from None
        expected = files.get(path.lstrip("/"))
        for reply in (keep, close):
            if reply.status != 200 or (expected is not None and reply.body_bytes != expected):
                raise ArenaError(f"{server.name} answers {path} with status {reply.status} and "
                                 f"{reply.body_bytes} bytes; expected 200 and {expected} bytes")
        server.probes[path] = {
            "status": keep.status, "body_bytes": keep.body_bytes,
            "header_keepalive": keep.header_bytes, "header_close": close.header_bytes,
            "header_min": min(keep.header_bytes, close.header_bytes),
            "header_max": max(keep.header_bytes, close.header_bytes),
            "wire_keepalive": keep.wire_bytes, "wire_close": close.wire_bytes,
            "headers_keepalive": keep.headers, "headers_close": close.headers,
        }


def quic_probe(server: RunningServer, path: str, body_size: int | None, cert: tls.Certificate, cpus: str) -> dict:
    """h3load fetches `path` twice over HTTP/3, verifying the run's certificate: what the
    server negotiates over QUIC; one that does not answer whole stops the run."""
    info = h3load.probe(server.url(path), cert.cert, cpus, body_size)
    if info["error"]:
        raise ArenaError(f"{server.name} does not serve {path} over HTTP/3 as configured: {info['error']}")
    if info["alpn"] != tls.ALPN["h3"] or not info["verified"]:
        raise ArenaError(f"{server.name}: HTTP/3 handshake negotiated ALPN {info['alpn'] or 'none'}, certificate "
                         f"{'verified' if info['verified'] else 'not verified'}; expected h3 with the run's certificate")
    return info


def tls_record(running: list[RunningServer], options: Options, cert: tls.Certificate, path: str = "/robots.txt",
               body_size: int | None = None) -> dict:
    """What each server negotiates (openssl s_client, once per server) and whether it resumes;
    with --h3 also over QUIC (h3load fetching `path`, of `body_size` bytes). A server that does
    not speak the transport's protocol stops the run before any load."""
    servers = {}
    offered = tls.TCP_ALPN[options.transport]
    for server in running:
        info = tls.server_record(server.site.host, server.site.port, options.transport, cert.cert)
        if info.get("error"):
            raise ArenaError(f"{server.name}: openssl s_client: {info['error']}")
        if info["alpn"] != offered:
            raise ArenaError(f"{server.name} answered ALPN {offered} with {info['alpn'] or 'no protocol'}: "
                             f"it does not serve {tls.LABELS[options.transport]} as configured")
        if options.transport == "h3":
            info["quic"] = quic_probe(server, path, body_size, cert, options.client_cpus)
        servers[server.name] = info
    # The clients' TLS library: wrk, h2load and s_client all use the system's OpenSSL.
    openssl = tools.command_output([tools.require("openssl"), "version"]).strip()
    return {"transport": options.transport, "label": tls.LABELS[options.transport],
            "certificate": cert.to_dict(), "resumption": options.resumption, "client_openssl": openssl,
            "servers": servers}


def _dead_record(server: RunningServer) -> dict:
    rec = record(LoadResult(tool="-"), None, f"{server.name} is no longer running", TreeSample())
    rec["failures"] = None
    return rec


def measure_under_quota(scenario: Scenario, point, server, ctx: Context) -> dict:
    """One round; under --server-quota also whether the quota throttled the server during it
    (if not, the server was not the limit) and the capacity per core it implies."""
    quota = server.quota
    before = quota.throttled() if quota else 0
    rec = scenario.measure(point, server, ctx)
    if quota:
        rec["throttled"] = quota.throttled() > before
        rec["capacity_per_core"] = rec["rps"] * 100 / quota.percent if rec.get("rps") else None
    return rec


def _summary_line(server: str, key: str, rnd: int, rec: dict) -> str:
    rps = f"{rec['rps']:,.0f} req/s" if rec.get("rps") else "- req/s"
    cpu = f"{rec['cpu_per_10k']:.3f} s CPU/10k" if rec.get("cpu_per_10k") is not None else ""
    flags = " CLIENT-BOUND" if rec.get("client_bound") else ""
    flags += " NOT THROTTLED (the quota was not the limit)" if rec.get("throttled") is False else ""
    flags += " TOOL STALLED (not the server's failure)" if rec.get("tool_stalled") else ""
    err = f" ERROR: {rec['error']}" if rec.get("error") else ""
    failed = "-" if rec.get("failures") is None else rec["failures"]
    return f"{server:15} {key:28} round {rnd}: {rps}, {failed} failed, {cpu}{flags}{err}"


def run(scenario: Scenario, servers: list[Server], options: Options, out: Path,
        console: Console | None = None, previous: dict | None = None) -> Path:
    """Run `scenario` on `servers`; write the result folder `out`; return its final path.
    `previous`: the interrupted run in `out` to resume (arena/resume.py): its whole points are
    kept and only the others are measured."""
    console = console or Console(stderr=True)
    check_transport(scenario, options)
    servers, skipped = transport_plan(servers, options)
    if not servers:
        reasons = "; ".join(f"{name}: {why}" for name, why in skipped.items())
        raise ArenaError(f"none of the servers chosen can serve {tls.LABELS[options.transport]} ({reasons})")
    for name, why in skipped.items():
        console.print(f"not run ({tls.LABELS[options.transport]}): {name}: {why}", highlight=False)
    preflight(scenario, servers, options)
    folder = RunFolder(out, resume=previous is not None)
    # The arena's own work (sampling, bookkeeping) stays off the server CPUs.
    os.sched_setaffinity(0, parse_cpus(options.client_cpus))
    workdir = Path(tempfile.mkdtemp(prefix="arena-"))
    workdir.chmod(0o755)
    running: list[RunningServer] = []
    points = scenario.selected(options)
    kept = resume.kept_samples(previous, [p.key for p in points]) if previous else []
    samples: list[dict] = []  # this session's
    interrupted = False
    environment: dict = {}
    started = time.time()
    done = {s["point"] for s in kept}
    todo = [p for p in points if p.key not in done]
    if previous and not todo:
        raise ArenaError(f"every point of {out} was measured: nothing to resume")
    previous_term = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        folder.create()
        files = make_docroot(workdir / "www")
        environment = envinfo.collect(servers, scenario.tools_for(options), options)
        if previous:
            environment = resume.environment(previous["environment"], environment, [s.name for s in servers])
        if skipped:
            environment["skipped"] = skipped
        # One certificate per run, in the result folder, the same files for every server.
        cert = tls.make_certificate(folder.tmp / "tls", options.cert) if options.transport != "http" else None
        # What the scenario sets up before any server starts (an application, say).
        prepared = scenario.prepare(options, [s.name for s in servers])
        if prepared:
            environment["scenario"] = prepared
        site_options = scenario.site_options(options)
        if cert:
            site_options = replace(site_options, tls=TlsSite(cert.cert, cert.key, http2=options.transport == "h2",
                                                             http3=options.transport == "h3",
                                                             resumption=options.resumption))
        for server in servers:
            site = Site(site_options.docroot or workdir / "www", ports.free_port(), site_options)
            quota = CpuQuota(server.name, options.server_quota) if options.server_quota else None
            running.append(server.start(site, workdir / server.name, options.profile, options.server_cpus, quota))
            if quota:
                environment["server_quota"] = quota.to_dict()
        for server in running:
            probe_server(server, scenario.probe_paths(), files)
        if cert:
            path = scenario.probe_paths()[0]
            environment["tls"] = tls_record(running, options, cert, path, files.get(path.lstrip("/")))
        envinfo.write_configs(folder.tmp, running)
        environment["probes"] = {s.name: s.probes for s in running}

        warm = any(scenario.warmup(p, options) for p in points[:1])
        per_point = len(running) * (options.rounds + (1 if warm else 0))
        columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()]
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task(scenario.name, total=len(todo) * per_point)
            ctx = Context(options, files, tick=progress.refresh, cert=cert.cert if cert else None)
            for point in todo:
                warmup = scenario.warmup(point, options)
                if warmup:
                    for server in running:
                        progress.update(task, description=f"{server.name} · {point.key} · warm-up")
                        if server.proc.poll() is None:
                            scenario.measure(warmup, server, ctx)
                        progress.advance(task)
                for rnd in range(1, options.rounds + 1):
                    # Rotate the order each round so no server always runs first.
                    shift = (rnd - 1) % len(running)
                    for server in running[shift:] + running[:shift]:
                        progress.update(task, description=f"{server.name} · {point.key} · "
                                                          f"round {rnd}/{options.rounds}")
                        if server.proc.poll() is None:
                            rec = measure_under_quota(scenario, point, server, ctx)
                        else:
                            rec = _dead_record(server)
                        rec.update({"server": server.name, "point": point.key, "round": rnd})
                        samples.append(rec)
                        progress.console.print(_summary_line(server.name, point.key, rnd, rec),
                                               highlight=False, soft_wrap=True)
                        progress.advance(task)
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: keeping the completed points[/yellow]")
    except BaseException:
        if not samples:
            folder.discard()  # nothing measured: leave no folder behind
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        for server in running:
            server.stop()
        scenario.finish()
        shutil.rmtree(workdir, ignore_errors=True)
    if not samples:
        folder.discard()
        raise ArenaError("interrupted before anything was measured" + (f": {out} is as it was" if previous else ""))
    write_run(folder, scenario=scenario, options=options, servers=[s.name for s in servers],
              points=points, samples=kept + samples, environment=environment,
              started=started, finished=time.time(), interrupted=interrupted, previous=previous)
    return folder.finish()
