"""The cache scenario (issue 33): the URL lists that set its hit ratios, Varnish's VCL as the
arena renders it (compiled by varnishd itself), and the smoke run: `arena run cache --quick
--servers gannet,nginx,varnish` answers every request, the 100 % points never reach the origin
and the 95 % points reach it once per planted miss. Like test_smoke.py, it FAILS (never skips)
without gannet's release binary; it needs the Shakespeare app (a run as root sets it up)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from arena import ports
from arena.scenarios.cache import MISS_EVERY, api_urls, with_misses
from arena.servers import SERVERS, Site, SiteOptions


def test_every_twentieth_request_is_a_url_never_seen():
    urls = ["/a", "/b?x=1", "/c"]
    lines = with_misses(urls, 100, "n1")
    assert len(lines) == 100
    misses = [line for line in lines if "arena_miss=" in line]
    assert len(misses) == 100 // MISS_EVERY and len(set(misses)) == len(misses)
    assert lines[19] == "/b?x=1&arena_miss=n1-19" and lines[39] == "/a?arena_miss=n1-39"
    # Another nonce (another round or server) plants other URLs.
    assert not set(misses) & set(with_misses(urls, 100, "n2"))
    assert len(set(api_urls())) == len(api_urls()) == 360


def test_varnish_vcl_compiles():
    # varnishd reads the VCL as its own unprivileged user: a folder it may enter (pytest's are 0700).
    tmp_path = Path(tempfile.mkdtemp(prefix="arena-vcl-"))
    tmp_path.chmod(0o755)
    site = Site(tmp_path, ports.free_port(), SiteOptions(kind="cache", app={"backend_host": "127.0.0.1",
                                                                              "backend_port": 8081}))
    varnish = SERVERS["varnish"]
    for profile in ("tuned", "default"):
        (text,) = varnish.configs(site, tmp_path, profile).values()
        vcl = tmp_path / f"{profile}.vcl"
        vcl.write_text(text)
        done = subprocess.run([varnish.binary(), "-C", "-f", str(vcl), "-n", str(tmp_path / "vd")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert '.port = "8081"' in text and "set beresp.ttl = 10m;" in text
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_smoke_cache_gannet_nginx_varnish(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "arena", "run", "cache", "--quick", "--servers",
                           "gannet,nginx,varnish", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    results = json.loads((out / "results.json").read_text())
    urls = results["environment"]["scenario"]["urls"]
    assert urls["api"] == 360 and urls["php"] > 200
    planned = {p["key"]: p["params"] for p in results["points"]}
    assert sorted(planned) == ["api/hit100/c10", "api/hit95/c10", "php/hit100/c10", "php/hit95/c10"]
    for server in ("gannet", "nginx", "varnish"):
        samples = [s for s in results["samples"] if s["server"] == server]
        assert {s["point"] for s in samples} == set(planned), server
        for s in samples:
            where = f"{server} at {s['point']}"
            assert s["error"] is None and s["failures"] == 0, where
            assert s["requests"] >= planned[s["point"]]["requests"], where
            if s["hit_target"] == 100:
                # Warmed with every URL: nothing reaches the origin.
                assert s["origin_requests"] == 0 and s["hit_pct"] == 100.0, where
            else:
                # One origin request per planted miss among the requests sent.
                assert abs(s["origin_requests"] - s["sent"] // MISS_EVERY) <= 1, where
                assert 94.0 <= s["hit_pct"] <= 96.0, where
