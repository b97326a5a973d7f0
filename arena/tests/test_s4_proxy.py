"""s4-proxy's parts: the generated request log (deterministic, 5 % POSTs, distinct URIs, three
header sets), the back end's files, httperf --wsesslog output and the combination of several
replayers, the back end's access-log count, the loss computation and the TCP state count -
on real captured outputs (tests/fixtures, from capture_fixtures.py's capture_s4)."""

from __future__ import annotations

import time

from arena import adtraffic, proxycount
from arena.clients import httperf
from arena.clients.base import LoadResult
from conftest import fixture_text


def test_log_is_deterministic_with_a_seed():
    assert adtraffic.generate(500, seed=7) == adtraffic.generate(500, seed=7)
    assert adtraffic.generate(500, seed=7) != adtraffic.generate(500, seed=8)


def test_log_mix():
    log = adtraffic.generate(20_000)
    posts = [r for r in log if r.method == "POST"]
    assert 0.045 <= len(posts) / len(log) <= 0.055
    assert all(r.body and r.uri == "/event.json" for r in posts)
    assert all(not r.body for r in log if r.method == "GET")
    # Query strings make nearly every request's URI its own; the paths are the back end's files.
    assert len({r.uri for r in log}) > 0.95 * len(log)
    paths = {r.uri.split("?")[0] for r in log}
    assert paths == {f"/ads/slot-{i:02d}.json" for i in range(1, 13)} | {"/sync.json", "/event.json"}
    shares = {name: sum(r.headers == name for r in log) / len(log) for name in adtraffic.HEADER_SETS}
    for name, (share, _) in adtraffic.HEADER_SETS.items():
        assert abs(shares[name] - share) < 0.02, name


def test_session_file_and_split():
    log = adtraffic.generate(100)
    text = adtraffic.session_file(log)
    sessions = text.strip().split("\n\n")
    assert len(sessions) == 100 and all("\n" not in s for s in sessions)
    post = next(r for r in log if r.method == "POST")
    assert f"{post.uri} method=POST contents='{post.body}'" in sessions
    groups = adtraffic.split(log)
    assert sum(map(len, groups.values())) == 100
    assert all(r.headers == name for name, rs in groups.items() for r in rs)


def test_docroot_sizes(tmp_path):
    files = adtraffic.write_docroot(tmp_path)
    ads = [size for name, size in files.items() if name.startswith("ads/")]
    assert len(ads) == 12 and min(ads) == 200 and max(ads) <= 2000
    assert all((tmp_path / name).stat().st_size == size for name, size in files.items())


def test_httperf_wsesslog_replay():
    res = httperf.parse(fixture_text("httperf_wsesslog.txt"))
    assert res.sent == res.requests == 300
    assert res.extra["status_2xx"] == 300 and res.failures == 0
    assert res.extra["connection_ms_median"] >= 0 and res.extra["connection_ms_max"] > 0
    assert res.extra["fd_unavail"] == 0


def test_httperf_wsesslog_refused():
    res = httperf.parse(fixture_text("httperf_wsesslog_refused.txt"))
    assert res.sent == 0 and res.requests == 0
    assert res.extra["connrefused"] == 20 and res.failures == 20


def test_combined_replayers():
    ok = httperf.parse(fixture_text("httperf_wsesslog.txt"))
    refused = httperf.parse(fixture_text("httperf_wsesslog_refused.txt"))
    both = proxycount.combine([ok, refused])
    assert both.sent == 300 and both.requests == 300 and both.failures == 20
    assert both.extra["status_2xx"] == 300 and both.extra["connrefused"] == 20
    assert both.latency_ms["p50"] == ok.extra["connection_ms_median"]
    assert both.latency_ms["mean"] == ok.latency_ms["mean"]
    assert proxycount.combine([LoadResult(tool="httperf")]).latency_ms == {}


def test_backend_access_log_count(tmp_path):
    text = fixture_text("s4_access.log")
    # The readiness poll's robots.txt, then the 300 replayed requests, every one 200.
    assert proxycount.access_statuses(text) == {"200": 301}
    log = tmp_path / "access.log"
    log.write_text(text)
    first = text.index("\n") + 1
    assert proxycount.served_since(log, first) == {"200": 300}
    # A line being written (no newline yet) is not counted; a 502 is counted as such.
    log.write_text('127.0.0.1 - - [22/Nov/2026:16:57:56 +0000] "GET /x HTTP/1.1" 502 0 "-" "-"\n'
                   '127.0.0.1 - - [22/Nov/2026:16:57:56 +0000] "GET /y HTTP/1.1" 200 ')
    assert proxycount.served_since(log, 0) == {"502": 1}
    # `only`: the requests for those targets (path and query) alone.
    log.write_text('127.0.0.1 - - [22/Nov/2026:16:57:56 +0000] "GET /a?m=1 HTTP/1.1" 200 0 "-" "-"\n'
                   '127.0.0.1 - - [22/Nov/2026:16:57:56 +0000] "GET /a?m=2 HTTP/1.1" 200 0 "-" "-"\n')
    assert proxycount.served_since(log, 0, only={"/a?m=2", "/b"}) == {"200": 1}
    assert proxycount.log_size(tmp_path / "none.log") == 0
    # Health-check probes and readiness polls (robots.txt) are not the replay's requests.
    log.write_text('127.0.0.1 - - [22/Nov/2026:16:57:56 +0000] "GET /robots.txt HTTP/1.0" 200 26 "-" "-"\n'
                   '127.0.0.1 - - [22/Nov/2026:16:57:56 +0000] "GET /robots.txt?x HTTP/1.1" 200 26 "-" "-"\n'
                   '127.0.0.1 - - [22/Nov/2026:16:57:56 +0000] "POST /event.json HTTP/1.1" 200 12 "-" "-"\n')
    assert proxycount.served_since(log, 0) == {"200": 1}
    assert proxycount.access_statuses(log.read_text()) == {"200": 3}


def test_settle_waits_for_late_log_lines_within_bounds():
    grows = iter([0, 0, 3, 5, 5, 5, 5])
    counts = proxycount.settle(lambda: {"200": next(grows)}, target=5, quiet=10, timeout=10, interval=0)
    assert counts == {"200": 5}
    # A count that stops short of the target ends after `quiet` seconds without growth.
    start = time.monotonic()
    assert proxycount.settle(lambda: {"200": 2}, target=5, quiet=0.2, timeout=10) == {"200": 2}
    assert 0.2 <= time.monotonic() - start < 2


def test_loss():
    assert proxycount.loss(1000, 1000) == (0, 0.0)
    assert proxycount.loss(1000, 953) == (47, 4.7)
    # Retries may make the back end serve more than was planned: no negative loss.
    assert proxycount.loss(1000, 1002) == (0, 0.0)
    assert proxycount.loss(0, 0) == (0, 0.0)


def test_tcp_states():
    port = int(fixture_text("s4_port.txt"))
    states = proxycount.tcp_states(fixture_text("s4_ss.txt"), {port})
    assert states["LISTEN"] == 1 and states["TIME-WAIT"] >= 300
    assert proxycount.tcp_states("garbage\n", {port}) == {}
