"""Smoke runs of the TLS variants: `arena run s1-static --quick --tls --servers gannet,nginx`
and the same with `--h2`, and c10k's HTTP/2 variant (with --requests 300). Both servers must serve every request
with the right byte count and no failure, over the protocol asked for: TLSv1.3 with ALPN
http/1.1 or h2 by openssl s_client at the start, and the same application protocol in every
h2load round; no session resumed (the default: new connections are full handshakes).
And `--h3` with gannet, Caddy and nginx: nginx left out with its reason, gannet and Caddy
serving every request over HTTP/3 (ALPN h3 in h3load's probe and in every round).

Like test_smoke.py this needs gannet's release binary (and h3load's) and fails, not skips,
without it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from arena.scenarios.base import Options
from arena.scenarios.s1_static import S1Static
from arena.workload import ROBOTS as ROBOTS_TEXT

IMAGE = 403456
ROBOTS = ROBOTS_TEXT.encode()


def run(tmp_path, *args: str, servers: str = "gannet,nginx") -> dict:
    out = tmp_path / "run"
    start = time.monotonic()
    # 300 requests per point rather than --quick's 1,000: over TLS the image costs the client
    # CPU too, and the CI budget is a few minutes for the whole arena suite.
    done = subprocess.run([sys.executable, "-m", "arena", "run", *args, "--quick", "--requests", "300",
                           "--servers", servers, "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"arena run failed:\n{done.stderr[-3000:]}"
    results = json.loads((out / "results.json").read_text())
    results["elapsed"] = time.monotonic() - start
    results["folder"] = out
    return results


def check_negotiated(results: dict, alpn: str) -> None:
    record = results["environment"]["tls"]
    assert record["resumption"] is False and record["certificate"]["kind"] == "ecdsa"
    assert record["client_openssl"].startswith("OpenSSL 3")
    assert set(record["servers"]) == {"gannet", "nginx"}
    for server, info in record["servers"].items():
        assert info["protocol"] == "TLSv1.3", server
        assert info["alpn"] == alpn and info["alpn_offered"] == alpn, server
        assert info["verified"] is True and info["signature"] == "ECDSA", server
        assert info["resumes_sessions"] is False, server
    for s in results["samples"]:
        if s["tool"] == "h2load":
            assert s["extra"]["application_protocol"] == alpn, s["point"]
            assert s["extra"]["tls_protocol"] == "TLSv1.3", s["point"]
    assert (results["folder"] / "tls" / "cert.pem").is_file()
    report = (results["folder"] / "report.md").read_text()
    assert "TLS negotiated" in report and "full handshakes" in report


def check_every_request_served(results: dict, points: int, servers=("gannet", "nginx")) -> None:
    planned = {p["key"]: p["params"] for p in results["points"]}
    assert results["interrupted"] is False
    assert len(planned) == results["points_planned"] == points
    for server in servers:
        samples = [s for s in results["samples"] if s["server"] == server]
        assert {s["point"] for s in samples} == set(planned), server
        for s in samples:
            where = f"{server} at {s['point']}"
            assert s["error"] is None, where
            assert s["failures"] == 0, where
            assert s["requests"] >= planned[s["point"]]["requests"] >= 300, where
            assert s["bytes_ok"] is True, f"{where}: {s['bytes_total']} bytes for {s['requests']} replies"


def test_smoke_https(tmp_path):
    results = run(tmp_path, "s1-static", "--tls")
    assert results["options"]["transport"] == "tls"
    check_every_request_served(results, 12)
    assert {p["key"].split("/")[0] for p in results["points"]} == {"tls"}
    assert {s["tool"] for s in results["samples"]} == {"wrk", "h2load"}
    assert all(s["body_size"] == IMAGE for s in results["samples"])
    check_negotiated(results, "http/1.1")


def test_smoke_http2(tmp_path):
    results = run(tmp_path, "s1-static", "--h2")
    check_every_request_served(results, 12)
    assert {p["params"]["streams"] for p in results["points"]} == {1, 10}
    assert {p["params"]["path"] for p in results["points"]} == {"/img.jpg", "/robots.txt"}
    assert {s["tool"] for s in results["samples"]} == {"h2load"}
    assert {s["body_size"] for s in results["samples"]} == {IMAGE, len(ROBOTS)}
    check_negotiated(results, "h2")


def test_smoke_http3(tmp_path):
    results = run(tmp_path, "s1-static", "--h3", servers="gannet,caddy,nginx")
    assert results["options"]["transport"] == "h3" and results["servers"] == ["gannet", "caddy"]
    assert "nginx 1.22 has no HTTP/3" in results["environment"]["skipped"]["nginx"]
    check_every_request_served(results, 12, servers=("gannet", "caddy"))
    # The same points as --h2's, so the two runs compare point by point.
    assert {p["key"].split("/")[0] for p in results["points"]} == {"h3"}
    assert {p["key"].replace("h3/h3load/", "") for p in results["points"]} == \
        {p.key.replace("h2/h2load/", "") for p in S1Static().points(Options(quick=True, transport="h2"))}
    assert {s["tool"] for s in results["samples"]} == {"h3load"}
    assert {s["body_size"] for s in results["samples"]} == {IMAGE, len(ROBOTS)}
    assert "h3load" in results["environment"]["tools"]
    record = results["environment"]["tls"]
    for server in ("gannet", "caddy"):
        info = record["servers"][server]
        # openssl s_client over TCP on the same port, then h3load over QUIC.
        assert info["protocol"] == "TLSv1.3" and info["alpn"] == "http/1.1" and info["verified"] is True, server
        assert info["quic"]["alpn"] == "h3" and info["quic"]["verified"] is True, server
        assert info["quic"]["body_bytes"] == 2 * IMAGE, server
    for s in results["samples"]:
        assert s["extra"]["application_protocol"] == "h3" and s["extra"]["certificate"] == "verified", s["point"]
    report = (results["folder"] / "report.md").read_text()
    assert "HTTP/3 over QUIC" in report and "h3load negotiated" in report and "Debian's nginx 1.22" in report


def test_smoke_c10k_http2(tmp_path):
    results = run(tmp_path, "c10k", "--h2")
    check_every_request_served(results, 1)
    for s in results["samples"]:
        assert s["idle_held"] == 1000 and s["idle_still_open"] == 1000 and s["fresh_ok"] == 1, s["server"]
        assert s["mem_per_conn_b"] > 0, s["server"]
    check_negotiated(results, "h2")
