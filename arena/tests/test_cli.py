"""Bad input gives one clear line and a non-zero exit, never a traceback; Ctrl-C keeps the
completed points."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from arena import tools
from arena.errors import ArenaError


def arena(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "arena", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("args, message", [
    (["run", "s9-nothing"], "arena: unknown scenario 's9-nothing': choose from c10k, cache, l4-proxy, s1-dynamic, s1-static, s2-rate, s2-rate-gz, "
                            "s3-sessions, s4-failover, s4-mirror, s4-proxy, s5-latency, small-static"),
    (["run", "s4-mirror", "--servers", "gannet,caddy"],
     "arena: caddy cannot serve proxy-mirror sites (only gannet and nginx (ngx_http_mirror_module) have request "
     "mirroring built in)"),
    (["run", "s4-failover", "--servers", "h2o"], "arena: h2o cannot serve proxy-failover sites (h2o 2.2"),
    (["run", "s1-static", "--servers", "nginx,iis"], "arena: unknown server 'iis'"),
    (["run", "s1-static", "--servers", "nginx", "--server-cpus", "64"], "arena: CPU 64 is not available here"),
    (["run", "s1-static", "--servers", "nginx", "--rounds", "0"], "arena: --rounds must be at least 1"),
    (["run", "s2-rate", "--tls", "--servers", "nginx"],
     "arena: s2-rate has no HTTPS/1.1 (HTTP/1.1 over TLS) variant (--tls): scenarios with one: c10k, s1-static"),
    (["run", "s5-latency", "--h2", "--servers", "nginx"],
     "arena: s5-latency has no HTTP/2 over TLS variant (--h2): scenarios with one: c10k, s1-static"),
    (["run", "s1-static", "--cert", "rsa", "--servers", "nginx"], "arena: --cert needs --tls, --h2 or --h3"),
    (["run", "s1-static", "--resumption", "--servers", "nginx"], "arena: --resumption needs --tls, --h2 or --h3"),
    (["run", "s1-static", "--h2", "--servers", "apache-prefork"],
     "arena: none of the servers chosen can serve HTTP/2 over TLS"),
    (["run", "s1-static", "--h3", "--servers", "nginx,h2o"],
     "arena: none of the servers chosen can serve HTTP/3 over QUIC (nginx: Debian's nginx 1.22 has no HTTP/3 "
     "(ngx_http_v3_module came with nginx 1.25); h2o: Debian's h2o 2.2 has no HTTP/3"),
    (["run", "c10k", "--h3", "--servers", "gannet"],
     "arena: c10k has no HTTP/3 over QUIC variant (--h3): scenarios with one: s1-static"),
    (["run", "s1-static", "--h3", "--h2"], "arena: --h3 is a transport of its own: drop --h2"),
    (["run", "small-static", "--points", "wrk/nothing/*", "--servers", "nginx"],
     "arena: --points wrk/nothing/* matches none of small-static's points: "),
    (["run", "small-static", "--points", " , ", "--servers", "nginx"], "arena: --points needs at least one pattern"),
])
def test_bad_input_is_one_clear_line(args, message):
    done = arena(*args)
    assert done.returncode == 1
    assert done.stderr.startswith(message)
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_missing_gannet_fails_before_anything_starts(tmp_path):
    env = dict(os.environ, GANNET_BIN=str(tmp_path / "no-gannet"))
    done = arena("run", "s1-static", "--quick", "--servers", "gannet,nginx", "--out", str(tmp_path / "run"), env=env)
    assert done.returncode == 1
    assert "gannet binary not found" in done.stderr and "cargo build --release" in done.stderr
    assert list(tmp_path.iterdir()) == []  # no result folder, not even a partial one


def test_missing_tool_names_its_package(monkeypatch):
    # Simulated absence: the real tools are installed here, and uninstalling them is not a test.
    monkeypatch.setattr(tools, "which", lambda program: None)
    with pytest.raises(ArenaError, match=r"h2load not found: install the Debian package 'nghttp2-client'"):
        tools.require("h2load")


def test_missing_h3load_says_how_to_build_it(tmp_path):
    env = dict(os.environ, H3LOAD_BIN=str(tmp_path / "no-h3load"))
    done = arena("run", "s1-static", "--quick", "--h3", "--servers", "gannet,caddy", "--out", str(tmp_path / "run"),
                 env=env)
    assert done.returncode == 1
    assert done.stderr.startswith(f"arena: h3load not found at {tmp_path / 'no-h3load'}: build it with "
                                  "`cargo build --release -p h3load`"), done.stderr
    assert list(tmp_path.iterdir()) == []


def test_existing_output_folder_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    done = arena("run", "s5-latency", "--quick", "--servers", "nginx", "--out", str(tmp_path / "run"))
    assert done.returncode == 1 and "already exists" in done.stderr


def test_list_and_servers_and_peers_dry_run():
    listed = arena("list")
    assert listed.returncode == 0
    for name in ("s1-static", "s1-dynamic", "s2-rate", "s3-sessions", "s4-proxy", "s4-failover", "s4-mirror",
                 "s5-latency", "c10k"):
        assert name in listed.stdout
    servers = arena("servers")
    assert servers.returncode == 0 and "apache-event" in servers.stdout and "wrk" in servers.stdout
    dry = arena("peers", "install", "--dry-run")
    assert dry.returncode == 0
    assert ("apt-get install -y -q --no-install-recommends nginx lighttpd lighttpd-mod-openssl h2o apache2 caddy "
            "libapache2-mod-php8.2") in dry.stderr


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_ctrl_c_keeps_completed_points(tmp_path, inherited):
    """Also when started with SIGINT ignored, as a background job of a script is."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "arena", "run", "s5-latency", "--quick", "--rounds", "20",
                             "--servers", "nginx", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, inherited))
    deadline = time.monotonic() + 90
    seen = ""
    while "round 1:" not in seen and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen += line
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, seen + err
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True
    assert results["samples"] and results["samples"][0]["round"] == 1
    assert "INTERRUPTED" in (out / "report.md").read_text()


def test_points_selects_by_pattern():
    from arena.scenarios import get
    from arena.scenarios.base import Options

    scenario = get("s1-dynamic")
    every = [p.key for p in scenario.points(Options())]
    chosen = [p.key for p in scenario.selected(Options(points=("wrk/keepalive/*", "h2load/close/c1")))]
    assert chosen == [k for k in every if k.startswith("wrk/keepalive/")] + ["h2load/close/c1"]
    assert len(chosen) == 5
    assert scenario.selected(Options()) == scenario.points(Options())
