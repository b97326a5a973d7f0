"""The load tools' parsers, fed real outputs captured from nginx (tests/capture_fixtures.py)."""

from __future__ import annotations

import pytest

from arena.clients import ab, h2load, httperf, siege, wrk
from conftest import fixture_text

IMAGE = 403456


def test_wrk_exact_figures_come_from_the_script_line():
    res = wrk.parse(fixture_text("wrk_keepalive.txt"))
    assert res.requests == 2001
    assert res.sent == 2010
    assert res.bytes_total == 807803700
    assert res.duration_s == pytest.approx(1.024089)
    assert res.rps == pytest.approx(2001 / 1.024089)
    assert res.latency_ms == pytest.approx({"p50": 3.66, "p90": 9.533, "p99": 12.755, "max": 13.356,
                                            "mean": 4.5356})
    assert res.failures == 0
    # 2001 replies of the image plus a constant header.
    assert (res.bytes_total - 2001 * IMAGE) % 2001 == 0


def test_wrk_socket_errors_are_kept_by_kind():
    # The fixture's exact line with a reset and two timeouts, and wrk's own text line.
    text = fixture_text("wrk_keepalive.txt").replace(
        '"read": 0, "write": 0, "status": 0, "timeout": 0', '"read": 1, "write": 0, "status": 0, "timeout": 2')
    res = wrk.parse(text)
    assert res.socket_errors == 3 and res.failures == 3
    assert res.extra["socket_errors"] == {"read": 1, "timeout": 2}
    plain = fixture_text("wrk_plain.txt") + "  Socket errors: connect 0, read 0, write 0, timeout 4\n"
    assert wrk.parse(plain).extra["socket_errors"] == {"timeout": 4}
    assert "socket_errors" not in wrk.parse(fixture_text("wrk_keepalive.txt")).extra


def test_wrk_new_connection_run():
    res = wrk.parse(fixture_text("wrk_close.txt"))
    assert res.requests == 1002
    assert res.bytes_total == 404502390
    assert res.failures == 0


def test_wrk_plain_report_without_the_script():
    res = wrk.parse(fixture_text("wrk_plain.txt"))
    assert res.requests == 2345
    assert res.duration_s == pytest.approx(1.02)
    assert res.bytes_total == int(0.88 * 1024 ** 3)
    assert res.rps == pytest.approx(2301.42)
    assert res.latency_ms["p50"] == pytest.approx(3.84)
    assert res.latency_ms["p90"] == pytest.approx(9.25)
    assert res.latency_ms["p99"] == pytest.approx(13.41)
    assert res.latency_ms["max"] == pytest.approx(14.39)
    assert res.latency_ms["mean"] == pytest.approx(4.41)
    assert res.sent is None


def test_wrk_counts_non_2xx_as_failures():
    res = wrk.parse(fixture_text("wrk_404.txt"))
    assert res.requests == 10988
    assert res.non_2xx_3xx == 10988
    assert res.failures == 10988


def test_h2load_keepalive_with_request_log():
    res = h2load.parse(fixture_text("h2load_keepalive.txt"), fixture_text("h2load_keepalive.log"))
    assert res.requests == 300
    assert res.failures == 0
    assert res.duration_s == pytest.approx(0.17981)
    assert res.rps == pytest.approx(1668.44)
    assert res.bytes_total == 121110000
    assert res.header_bytes == 57900
    assert res.body_bytes == 300 * IMAGE
    durations = [int(line.split()[2]) / 1000 for line in fixture_text("h2load_keepalive.log").splitlines()]
    assert len(durations) == 300
    # The per-request log is more precise than the report's rounded "14.51ms".
    assert res.latency_ms["max"] == pytest.approx(max(durations)) == pytest.approx(14.51, abs=0.01)
    assert res.latency_ms["mean"] == pytest.approx(sum(durations) / 300)
    assert res.latency_ms["p50"] <= res.latency_ms["p90"] <= res.latency_ms["p99"] <= res.latency_ms["max"]


def test_h2load_new_connection_run():
    res = h2load.parse(fixture_text("h2load_close.txt"))
    assert res.requests == 300
    assert res.body_bytes == 300 * IMAGE
    assert res.header_bytes == 56400
    assert res.extra["connect_mean_ms"] == pytest.approx(0.349)
    assert res.latency_ms.get("p99") is None  # no log given


def test_h2load_404s_are_failures():
    res = h2load.parse(fixture_text("h2load_404.txt"))
    assert res.requests == 300
    assert res.non_2xx_3xx == 300
    assert res.failures == 300
    assert res.socket_errors == 0


def test_ab_new_connections_with_csv_percentiles():
    res = ab.parse(fixture_text("ab_close.txt"), fixture_text("ab_close.csv"))
    assert res.requests == 2000
    assert res.failures == 0
    assert res.duration_s == pytest.approx(0.426)
    assert res.rps == pytest.approx(4699.75)
    assert res.body_bytes == 2000 * 2761
    assert res.header_bytes == 5990000 - 5522000
    assert res.latency_ms["mean"] == pytest.approx(2.128)
    assert res.latency_ms["max"] == 15
    csv = ab.parse_csv(fixture_text("ab_close.csv"))
    assert res.latency_ms["p50"] == csv[50] and res.latency_ms["p99"] == csv[99]
    assert res.extra["server_software"] == "nginx/1.22.1"


def test_ab_keepalive_and_rounded_table_fallback():
    res = ab.parse(fixture_text("ab_keepalive.txt"))
    assert res.extra["keepalive_requests"] == 2000
    assert res.latency_ms["p90"] == 2 and res.latency_ms["p99"] == 12


def test_ab_non_2xx():
    res = ab.parse(fixture_text("ab_404.txt"))
    assert res.requests == 500
    assert res.non_2xx_3xx == 500
    assert res.failures == 500


def test_httperf_gzip_sweep_point():
    res = httperf.parse(fixture_text("httperf_gzip.txt"))
    assert res.extra["connections"] == 100
    assert res.sent == 1000 and res.requests == 1000
    assert res.duration_s == pytest.approx(0.993)
    assert res.rps == pytest.approx(1000 / 0.993)
    assert res.header_bytes == 249000
    assert res.bytes_total == 418000
    assert res.latency_ms["mean"] == pytest.approx(0.4)
    assert res.failures == 0
    assert res.extra["reply_rate_samples"] == 0


def test_httperf_refused_connections_are_failures():
    res = httperf.parse(fixture_text("httperf_refused.txt"))
    assert res.requests == 0
    assert res.failures == 20
    assert res.extra["connrefused"] == 20


@pytest.mark.parametrize("name", ["siege.txt", "siege_json.txt"])
def test_siege_text_and_json_summaries(name):
    res = siege.parse(fixture_text(name))
    assert res.requests == 500
    assert res.failures == 0
    assert res.extra["availability_pct"] == 100.0
    assert res.rps > 0 and res.duration_s > 0
    assert res.latency_ms["max"] == pytest.approx(20.0)


def test_wrk_paths_script_counts_every_non_2xx_answer():
    # wrk_paths.lua over /index.html, /robots.txt, /missing.html: every third answer is a 404.
    res = wrk.parse(fixture_text("wrk_paths.txt"))
    assert res.requests == 301 and res.sent == 304
    assert res.non_2xx_3xx == 100 and res.failures == 100
    assert res.bytes_total == 378000


def test_wrk_paths_command_cycles_a_path_file():
    cmd = wrk.command("http://127.0.0.1:8080/", 10, 500, paths_file="/tmp/paths.txt")
    assert cmd[cmd.index("-s") + 1].endswith("wrk_paths.lua")
    assert cmd[-4:] == ["--", "500", "10", "/tmp/paths.txt"]
    assert wrk.command("http://127.0.0.1:8080/x", 10, 500)[-3:] == ["--", "500", "10"]


def test_h2load_uri_file_replaces_the_url():
    cmd = h2load.command("http://127.0.0.1:8080/", 10, 500, uris_file="/tmp/urls.txt")
    assert cmd[-2:] == ["-i", "/tmp/urls.txt"] and "http://127.0.0.1:8080/" not in cmd
    res = h2load.parse(fixture_text("h2load_keepalive.txt"))
    assert res.extra["status_2xx"] == 300 and res.extra["status_3xx"] == 0


def test_siege_verbose_lines_give_statuses_and_sizes():
    text = fixture_text("siege_verbose.txt")
    lines = siege.transactions(text)
    assert len(lines) == 12
    assert lines[0] == (200, 0.0, 204, "/robots.txt") and lines[1] == (404, 0.0, 153, "/missing.html")
    res = siege.parse(text)
    # siege's own summary counts the 404s as neither failed nor successful transactions.
    assert res.extra["failed"] == 0 and res.extra["successful"] == 8 and res.extra["transactions"] == 12
    assert res.extra["status_counts"] == {"200": 8, "404": 4}
    assert res.non_2xx_3xx == 4 and res.failures == 4 and res.socket_errors == 0
    cmd = siege.command(None, 5, 20, urls_file="/tmp/urls.txt", verbose=True)
    assert cmd[-4:] == ["20", "-v", "-f", "/tmp/urls.txt"]
