"""h3load, the --h3 variant's load client: its report parsed (real outputs captured from Caddy
over HTTP/3 by tests/capture_fixtures.py), the record a round makes of it, and its command
line."""

from __future__ import annotations

import pytest

from arena.clients import h3load
from arena.clients.base import ToolRun, tool_failed
from arena.measure import TreeSample
from arena.report import warnings
from arena.scenarios.base import record
from conftest import fixture_text
from results_data import build

IMAGE = 403456
# What the captured image run reported (tests/fixtures/h3load_image.txt).
HEADER_BYTES, RPS, DURATION, MEAN_MS = 5560, 55.66, 0.718632, 110.544


def test_image_run_over_two_connections():
    res = h3load.parse(fixture_text("h3load_image.txt"))
    assert res.tool == "h3load"
    assert res.requests == res.sent == 40 and res.extra["succeeded"] == 40
    assert res.failures == 0 and res.socket_errors == 0 and res.non_2xx_3xx == 0
    assert res.extra["status_2xx"] == 40 and res.extra["status_3xx"] == 0
    # Exactly the image 40 times; the UDP payload is more (QUIC packets whole, the handshakes).
    assert res.body_bytes == 40 * IMAGE
    assert res.bytes_total > res.body_bytes and res.extra["udp_datagrams"] > 40 * IMAGE // 1500
    assert res.header_bytes == HEADER_BYTES
    assert res.rps == pytest.approx(RPS) and res.duration_s == pytest.approx(DURATION)
    lat = res.latency_ms
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert lat["mean"] == pytest.approx(MEAN_MS)
    assert res.extra["connections_made"] == 2 and res.extra["connections_failed"] == 0
    assert res.extra["retried"] == 0 and res.extra["connect_mean_ms"] > 0
    assert res.extra["application_protocol"] == "h3" and res.extra["tls_protocol"] == "TLSv1.3"
    assert res.extra["certificate"] == "verified"
    assert "first_error" not in res.extra


def test_image_run_makes_a_whole_record():
    res = h3load.parse(fixture_text("h3load_image.txt"))
    tool = ToolRun("", "", 0, cpu_seconds=0.1, wall_seconds=0.5, timed_out=False)
    rec = record(res, tool, None, TreeSample(cpu_seconds=0.2), body_size=IMAGE)
    assert rec["bytes_ok"] is True and rec["failures"] == 0 and rec["requests"] == 40
    assert rec["header_bytes"] == pytest.approx(HEADER_BYTES / 40)
    assert rec["cpu_per_10k"] == pytest.approx(0.2 / 40 * 10000)
    # The wrong body size is caught.
    assert record(res, tool, None, TreeSample(), body_size=IMAGE - 1)["bytes_ok"] is False


def test_not_found_answers_count_as_failed():
    res = h3load.parse(fixture_text("h3load_404.txt"))
    assert res.requests == 20 and res.extra["succeeded"] == 0
    assert res.non_2xx_3xx == 20 and res.failures == 20 and res.socket_errors == 0
    assert res.extra["certificate"] == "not verified"


def test_no_server_is_every_request_failed():
    text = fixture_text("h3load_refused.txt")
    res = h3load.parse(text)
    assert res.requests == 0 and res.sent == 0 and res.failures == 5
    assert res.extra["connections_made"] == 0 and res.extra["connections_failed"] == 1
    assert "QUIC handshake" in res.extra["first_error"]
    assert "application_protocol" not in res.extra
    assert res.latency_ms == {"mean": None}
    run = ToolRun(text, "h3load: no request was answered: QUIC handshake with 127.0.0.1:1: no answer within 1s\n",
                  1, cpu_seconds=0.0, wall_seconds=1.0, timed_out=False)
    assert tool_failed(run, "h3load").startswith("h3load exited with code 1: h3load: no request was answered")


def test_command_line(monkeypatch, tmp_path):
    binary = tmp_path / "h3load"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("H3LOAD_BIN", str(binary))
    cmd = h3load.command("https://127.0.0.1:8443/img.jpg", 100, 100000, streams=10, cafile=tmp_path / "cert.pem")
    assert cmd == [str(binary), "-c", "100", "-n", "100000", "-m", "10", "--cacert", str(tmp_path / "cert.pem"),
                   "https://127.0.0.1:8443/img.jpg"]
    probe = h3load.command("https://127.0.0.1:8443/", 1, 2, timeout=5)
    assert probe[-3:] == ["--timeout", "5", "https://127.0.0.1:8443/"] and "--cacert" not in probe


def test_udp_receive_drops_from_the_kernels_counters():
    snmp = ("Ip: Forwarding DefaultTTL\nIp: 1 64\n"
            "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors\n"
            "Udp: 242148 1097 4439 247362 4437 0 0\n"
            "UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\nUdpLite: 0 0 0 0 9 0\n")
    assert h3load.udp_receive_drops(snmp) == 4437
    assert h3load.udp_receive_drops("Ip: 1\n") is None
    assert isinstance(h3load.udp_receive_drops(open("/proc/net/snmp").read()), int)


def test_report_warns_of_dropped_datagrams(tmp_path):
    results = build(tmp_path / "run", {"gannet": [1000]}, transport="h3")
    first = results["samples"][0]
    first["extra"]["udp_receive_drops"] = 12
    said = [w for w in warnings(results) if "UDP datagrams" in w]
    assert said == [f"gannet at {first['point']}, round 1: the kernel dropped 12 UDP datagrams for a full receive "
                    "buffer (the client's or the server's); QUIC resent them, at a cost to both sides."]
    first["extra"]["udp_receive_drops"] = 0
    assert not [w for w in warnings(results) if "UDP datagrams" in w]
