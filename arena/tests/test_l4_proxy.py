"""The l4-proxy scenario (issue 34): HAProxy's and nginx's configs as the arena renders them
(checked by the servers themselves), and the smoke run: `arena run l4-proxy --quick --servers
gannet,nginx,haproxy` relays every short session and every bulk answer whole through each
proxy. Like test_smoke.py, it FAILS (never skips) without gannet's release binary."""

from __future__ import annotations

import json
import subprocess
import sys

from arena import ports
from arena.scenarios.l4_proxy import BULK_BYTES, SESSION_BYTES
from arena.servers import SERVERS, Site, SiteOptions


def test_haproxy_and_nginx_check_their_l4_configs(tmp_path):
    site = Site(tmp_path, ports.free_port(), SiteOptions(kind="l4-proxy", app={"backend_host": "127.0.0.1",
                                                                                 "backend_port": 8081}))
    for name, check in (("haproxy", ["-c", "-f"]), ("nginx", ["-t", "-p", f"{tmp_path}/", "-c"])):
        (config, text), = SERVERS[name].configs(site, tmp_path, "tuned").items()
        (tmp_path / config).write_text(text)
        done = subprocess.run([SERVERS[name].binary(), *check, str(tmp_path / config)], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        assert "127.0.0.1:8081" in text and "\nhttp {" not in text
        assert name == "haproxy" or "\nstream {" in text
    # A layer-4 site is a whole config: there is none for the default profile's templates.
    assert not SERVERS["gannet"].serves("l4-proxy", "default")


def test_smoke_l4_proxy_gannet_nginx_haproxy(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "arena", "run", "l4-proxy", "--quick", "--servers",
                           "gannet,nginx,haproxy", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    results = json.loads((out / "results.json").read_text())
    planned = {p["key"]: p["params"] for p in results["points"]}
    assert sorted(planned) == ["bulk/c1", "sessions/c10"]
    assert results["environment"]["scenario"]["session_request_bytes"] >= SESSION_BYTES
    for server in ("gannet", "nginx", "haproxy"):
        samples = {s["point"]: s for s in results["samples"] if s["server"] == server}
        assert set(samples) == set(planned), server
        for key, s in samples.items():
            where = f"{server} at {key}"
            assert s["error"] is None and s["failures"] == 0, where
            assert s["requests"] >= planned[key]["requests"] and s["bytes_ok"] is True, where
        bulk = samples["bulk/c1"]
        assert bulk["bytes_total"] >= 2 * BULK_BYTES and bulk["gb_per_s"] > 0 and bulk["cpu_per_gb"] > 0
