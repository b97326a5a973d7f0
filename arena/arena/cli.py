"""The `arena` command line: list, run, compare, servers, peers install.

Every failure the user can act on is an ArenaError, printed as one clear line (plus detail
such as a server's log tail) with a non-zero exit; Ctrl-C exits with 130."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from arena import __version__
from arena.errors import ArenaError

# Under the folder the command runs in (not the source tree): a run from anywhere, or from an
# installed package, keeps its results where the user is.
RESULTS_DIR = Path("results")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arena", description="Re-run published web-server studies "
                                "against gannet and its peers, side by side.")
    p.add_argument("--version", action="version", version=f"arena {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    sub.add_parser("list", help="list the scenarios")
    sub.add_parser("servers", help="list the servers and load tools, with versions")

    run = sub.add_parser("run", help="run a scenario")
    run.add_argument("scenario", nargs="?")
    run.add_argument("--resume", type=Path, metavar="FOLDER", help="measure the points an interrupted run "
                     "(Ctrl-C) left, with its own scenario, servers and options, and complete its folder")
    run.add_argument("--servers", help="comma-separated (default: all that can serve the scenario's site)")
    run.add_argument("--profile", choices=["tuned", "default"], help="tuned (the default) or default")
    run.add_argument("--rounds", type=int, help="measured rounds per point (default 3; 1 with --quick)")
    run.add_argument("--requests", type=int, help="requests per point (overrides the scenario's)")
    run.add_argument("--quick", action="store_true", help="small counts: a smoke run for CI")
    run.add_argument("--out", type=Path, help="result folder (default ./results/<time>-<scenario>)")
    run.add_argument("--repo", type=Path, help="the gannet checkout (its release binary, conf/ and apps/; default: "
                     "the one this arena is part of, or the current folder)")
    run.add_argument("--server-cpus", help="CPUs the servers are pinned to (default 0)")
    run.add_argument("--client-cpus", help="CPUs the load tools are pinned to (default 1)")
    run.add_argument("--backend-cpus", help="CPUs a scenario's back ends are pinned to (the s4 scenarios; default: "
                     "the client CPUs)")
    run.add_argument("--server-quota", type=float, metavar="P", help="each server's process tree limited to P %% "
                     "of one CPU (a cgroup): req/s becomes capacity per core; needs root")
    run.add_argument("--points", metavar="PATTERNS", help="comma-separated shell patterns of the point keys "
                     "to measure (e.g. 'wrk/keepalive/*'; the keys are in a report's tables and results.json); "
                     "default: every point")
    run.add_argument("--tls", action="store_true", help="HTTPS/1.1: every server on TLS (s1-static, c10k)")
    run.add_argument("--h2", action="store_true", help="HTTP/2 over TLS (s1-static, c10k)")
    run.add_argument("--h3", action="store_true", help="HTTP/3 over QUIC (s1-static): the servers that speak it, "
                     "loaded by h3load (built from this repository)")
    run.add_argument("--cert", choices=["ecdsa", "rsa"], help="the run's self-signed test certificate: "
                     "ecdsa (P-256, the default) or rsa (2048 bits); with --tls, --h2 or --h3")
    run.add_argument("--resumption", action="store_true", help="leave TLS session resumption on in every "
                     "server (default: off, so each new connection is a full handshake); with --tls, --h2 "
                     "or --h3")

    cmp = sub.add_parser("compare", help="show what changed between two runs")
    cmp.add_argument("run_a", type=Path)
    cmp.add_argument("run_b", type=Path)
    cmp.add_argument("--all", action="store_true", help="also list figures within noise")

    peers = sub.add_parser("peers", help="manage the peer servers and load tools")
    peers_sub = peers.add_subparsers(dest="peers_command", metavar="ACTION")
    peers_sub.required = True
    inst = peers_sub.add_parser("install", help="apt-get install the peers and load tools")
    inst.add_argument("--dry-run", action="store_true", help="only print the apt-get commands")
    return p


def _list(console: Console) -> int:
    from arena.scenarios import REGISTRY

    table = Table(title="scenarios")
    for col in ("name", "study", "what it runs"):
        table.add_column(col)
    for name in sorted(REGISTRY):
        s = REGISTRY[name]
        table.add_row(name, s.study, s.description)
    console.print(table)
    return 0


def _servers(console: Console) -> int:
    from arena.peers import inventory
    from arena.servers import SERVERS

    table = Table(title="servers and load tools")
    for col in ("name", "kind", "version"):
        table.add_column(col)
    for name, kind, version in inventory(SERVERS.values()):
        table.add_row(name, kind, f"[red]{version}[/]" if version == "missing" else version)
    console.print(table)
    return 0


ALL_SERVERS = "gannet,nginx,apache-prefork,apache-worker,apache-event,lighttpd,h2o,caddy,varnish,haproxy,floor"


def _resume(args, console: Console) -> int:
    from arena import resume, runner, scenarios, servers

    # Every other `run` argument chooses what a run measures: a resumed run takes its own.
    given = [name for name, value in vars(args).items()
             if name not in ("command", "resume", "repo") and value not in (None, False)]
    if given:
        shown = ", ".join(n if n == "scenario" else "--" + n.replace("_", "-") for n in given)
        raise ArenaError(f"--resume continues a run with its own scenario, servers and options: drop {shown}")
    previous = resume.load(args.resume)
    chosen = servers.parse_list(",".join(previous["servers"]))
    final = runner.run(scenarios.get(previous["scenario"]["name"]), chosen, resume.options(previous),
                       args.resume, console, previous=previous)
    console.print(f"results: {final}/report.md (and report.html, results.json)")
    return 130 if _interrupted(final) else 0


def _run(args, console: Console) -> int:
    from arena import runner, scenarios, servers
    from arena.scenarios.base import Options
    from arena.servers import sites

    if args.resume:
        return _resume(args, console)
    if not args.scenario:
        raise ArenaError("name a scenario (`arena list` shows them), or --resume FOLDER")
    args.profile = args.profile or "tuned"
    if args.h3 and (args.h2 or args.tls):
        raise ArenaError(f"--h3 is a transport of its own: drop {'--h2' if args.h2 else '--tls'}")
    scenario = scenarios.get(args.scenario)
    if args.servers:
        chosen = servers.parse_list(args.servers)
    else:
        # Every server, less those that cannot serve this scenario's site (a feature they lack).
        kind = scenario.site_options(Options()).kind
        everyone = servers.parse_list(ALL_SERVERS)
        chosen = [s for s in everyone if s.serves(kind, args.profile)]
        skipped = [s.name for s in everyone if s not in chosen]
        if skipped:
            why = sites.kind(kind).lacking
            console.print(f"not run (no {kind} site support{': ' + why if why else ''}): {', '.join(skipped)}")
    transport = "h3" if args.h3 else "h2" if args.h2 else "tls" if args.tls else "http"
    if transport == "http" and (args.cert or args.resumption):
        raise ArenaError(f"{'--cert' if args.cert else '--resumption'} needs --tls, --h2 or --h3")
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    if args.requests is not None and args.requests < 1:
        raise ArenaError("--requests must be at least 1")
    options = Options(quick=args.quick, rounds=rounds, requests=args.requests,
                      server_cpus=args.server_cpus or "0", client_cpus=args.client_cpus or "1", profile=args.profile,
                      backend_cpus=args.backend_cpus, transport=transport, cert=args.cert or "ecdsa",
                      resumption=args.resumption, server_quota=args.server_quota,
                      points=_patterns(args.points))
    if not scenario.selected(options):
        keys = ", ".join(p.key for p in scenario.points(options))
        raise ArenaError(f"--points {args.points} matches none of {scenario.name}'s points: {keys}")
    suffix = "" if transport == "http" else f"-{transport}"
    out = args.out or RESULTS_DIR / f"{datetime.now():%Y%m%d-%H%M%S}-{scenario.name}{suffix}"
    final = runner.run(scenario, chosen, options, out, console)
    console.print(f"results: {final}/report.md (and report.html, results.json)")
    return 130 if final and _interrupted(final) else 0


def _patterns(text: str | None) -> tuple[str, ...] | None:
    """--points: its comma-separated patterns (None: every point)."""
    if text is None:
        return None
    patterns = tuple(p.strip() for p in text.split(",") if p.strip())
    if not patterns:
        raise ArenaError("--points needs at least one pattern")
    return patterns


def _interrupted(folder: Path) -> bool:
    import json
    return json.loads((folder / "results.json").read_text()).get("interrupted", False)


def _use_repo(path: Path) -> None:
    """--repo: the checkout every later lookup uses (arena/repo.py reads ARENA_REPO when the
    servers and the app are first imported, which is after this)."""
    import os

    from arena import repo
    if not repo.is_checkout(path):
        raise ArenaError(f"--repo {path}: not a gannet checkout (no Cargo.toml and apps/ there)")
    os.environ[repo.ENV] = str(path.resolve())


def main(argv: list[str] | None = None) -> int:
    # soft_wrap: messages stay one line each, whatever the terminal width (logs, CI).
    console = Console(stderr=True, soft_wrap=True)
    args = _parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C (SIGINT) stops a run and keeps its completed points, even when the parent
        # ignored SIGINT: a background job of a non-interactive shell inherits it ignored,
        # and Python then never raises KeyboardInterrupt.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if getattr(args, "repo", None):
            _use_repo(args.repo)
        if args.command == "list":
            return _list(Console())
        if args.command == "servers":
            return _servers(Console())
        if args.command == "run":
            return _run(args, console)
        if args.command == "compare":
            from arena.compare import render
            return render(args.run_a, args.run_b, Console())
        if args.command == "peers":
            from arena.peers import install
            for cmd in install(dry_run=args.dry_run):
                console.print(("would run: " if args.dry_run else "ran: ") + cmd, highlight=False)
            return 0
    except ArenaError as exc:
        lines = str(exc).splitlines() or ["error"]
        console.print(f"[bold red]arena: {lines[0]}[/]", highlight=False, soft_wrap=True)
        for line in lines[1:]:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        console.print("arena: interrupted")
        return 130
    return 2


if __name__ == "__main__":
    sys.exit(main())
