"""Resuming an interrupted run (`arena run --resume FOLDER`).

A full study run takes hours (s1-static: 8 servers x 16 points x 3 rounds of 100,000 requests),
longer than a machine may be free at a stretch. Ctrl-C keeps the completed points; `--resume`
runs the ones left with the run's own scenario, servers and options, and rewrites the folder
with every point. The unit of work is the point: its rounds are interleaved across the servers
within one session, so a point cut short is measured again from its first round, and every
ratio in the report still comes from servers measured side by side.

A resumed run must measure the same things: the same server and tool versions, the same gannet
build (its binary's SHA-256) and the same machine, or it is refused."""

from __future__ import annotations

import json
from pathlib import Path

from arena.errors import ArenaError
from arena.scenarios.base import Options

# What must be equal between the interrupted session and the resuming one.
_MACHINE = (("cpu_model", "CPU"), ("cpus_online", "CPU count"), ("kernel", "kernel"),
            ("pinning", "CPU pinning"), ("profile", "profile"))


def load(folder: Path) -> dict:
    """The interrupted run's results.json; an ArenaError if there is nothing to resume."""
    path = folder / "results.json"
    if not path.is_file():
        raise ArenaError(f"{folder} is not an arena result folder (no results.json): nothing to resume")
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArenaError(f"{path}: cannot read it: {exc}") from None
    if not results.get("interrupted"):
        raise ArenaError(f"{folder} holds a complete run: nothing to resume")
    return results


def options(results: dict) -> Options:
    """The Options the interrupted run was started with."""
    o = results["options"]
    return Options(quick=o["quick"], rounds=o["rounds"], requests=o["requests"], profile=o["profile"],
                   server_cpus=o["server_cpus"], client_cpus=o["client_cpus"],
                   backend_cpus=o.get("backend_cpus"), transport=o["transport"],
                   cert=o.get("cert") or "ecdsa", resumption=bool(o.get("resumption")),
                   server_quota=o.get("server_quota"),
                   points=tuple(o["points"]) if o.get("points") is not None else None)


def kept_samples(results: dict, point_keys: list[str]) -> list[dict]:
    """The samples of the points every server finished (all rounds); the others are re-run."""
    planned = set(point_keys)
    unknown = sorted({s["point"] for s in results["samples"]} - planned)
    if unknown:
        raise ArenaError(f"the run measured points this arena no longer plans ({', '.join(unknown)}): "
                         "it was made by another version of the scenario; start a new run")
    rounds = results["options"]["rounds"]
    count: dict[str, int] = {}
    for s in results["samples"]:
        count[s["point"]] = count.get(s["point"], 0) + 1
    whole = {p for p, n in count.items() if n == rounds * len(results["servers"])}
    return [s for s in results["samples"] if s["point"] in whole]


def environment(previous: dict, now: dict, servers: list[str]) -> dict:
    """The interrupted run's environment with this session appended under "resumed"; an
    ArenaError when a version, the gannet build or the machine differs."""
    for key, what in _MACHINE:
        if previous.get(key) != now.get(key):
            raise ArenaError(f"the {what} differs from the interrupted run's ({previous.get(key)} then, "
                             f"{now.get(key)} now): a resumed run must be measured alike; start a new run")
    for group in ("servers", "tools"):
        for name, version in now[group].items():
            if previous.get(group, {}).get(name) != version:
                raise ArenaError(f"{name} is {version} now, {previous.get(group, {}).get(name)} in the "
                                 "interrupted run: a resumed run must measure the same versions; start a new run")
    if "gannet" in servers and previous.get("gannet_sha256") != now.get("gannet_sha256"):
        raise ArenaError(f"the gannet binary ({now.get('gannet_binary')}) is not the build the interrupted run "
                         "measured (its SHA-256 differs): rebuild that commit "
                         f"({previous.get('repository_commit')}) or point GANNET_BIN at it, or start a new run")
    session = {k: now.get(k) for k in ("recorded_at", "command", "repository_commit")}
    return {**previous, "resumed": [*previous.get("resumed", []), session]}
