"""Access and error logs as an admin reads them: the predefined `combined` line, escaping,
custom `log_format` variables, `access_log off`, several logs at once, buffered logs
(`buffer=` / `flush=`, and the flush at a graceful or fast stop), and the error log's
`open() ... failed` line for a missing file (gone with `log_not_found off`).

Logs are written after the response, so every check polls the file with a deadline.
"""

import re
import signal
import time
from pathlib import Path

import pytest

COMBINED_RE = re.compile(
    r'^(?P<addr>\S+) - (?P<user>\S+) \[(?P<time>\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2} [+-]\d{4})\] '
    r'"(?P<request>[^"]*)" (?P<status>\d{3}) (?P<bytes>\d+) "(?P<referer>[^"]*)" "(?P<ua>[^"]*)"$'
)

CUSTOM = "log_format custom '$status|$body_bytes_sent|$bytes_sent|$request_length|$request_time|$http_x_custom';"


def lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def wait_lines(path: Path, n: int, deadline: float = 5.0) -> list[str]:
    """The file's lines once there are at least `n` of them (or whatever is there at the deadline)."""
    end = time.monotonic() + deadline
    while len(lines(path)) < n and time.monotonic() < end:
        time.sleep(0.02)
    return lines(path)


def wait_text(path: Path, needle: str, deadline: float = 5.0) -> str:
    end = time.monotonic() + deadline
    while needle not in "\n".join(lines(path)) and time.monotonic() < end:
        time.sleep(0.02)
    return "\n".join(lines(path))


def raw_request(srv, target: str, headers: bytes = b"") -> tuple[bytes, bytes]:
    """Send one HTTP/1.1 request with Connection: close; (request bytes, response bytes)."""
    req = f"GET {target} HTTP/1.1\r\nHost: log.test\r\n".encode() + headers + b"Connection: close\r\n\r\n"
    return req, srv.raw(req)


def test_combined_line(gannet):
    srv = gannet.start(files={"page.html": "<p>hello log</p>\n"})
    status, _, body = srv.get("/page.html?x=1", headers={"Referer": "http://ref.test/from", "User-Agent": "tester/2.1 (e2e)"})
    assert status == 200
    [line] = wait_lines(srv.tmp / "access.log", 1)
    m = COMBINED_RE.match(line)
    assert m, line
    assert m["addr"] == "127.0.0.1" and m["user"] == "-"
    assert m["request"] == "GET /page.html?x=1 HTTP/1.1"
    assert (m["status"], int(m["bytes"])) == ("200", len(body))
    assert (m["referer"], m["ua"]) == ("http://ref.test/from", "tester/2.1 (e2e)")


def test_combined_line_for_404_and_missing_headers(gannet):
    srv = gannet.start()
    _, resp = raw_request(srv, "/nope")
    body = resp.split(b"\r\n\r\n", 1)[1]
    [line] = wait_lines(srv.tmp / "access.log", 1)
    m = COMBINED_RE.match(line)
    assert m, line
    assert (m["status"], int(m["bytes"]), m["referer"], m["ua"]) == ("404", len(body), "-", "-")


def test_user_agent_escaping(gannet):
    srv = gannet.start(files={"a.txt": "a"})
    raw_request(srv, "/a.txt", b'User-Agent: say "hi" caf\xc3\xa9\\x\r\n')
    [line] = wait_lines(srv.tmp / "access.log", 1)
    assert line.endswith(' "-" "say \\x22hi\\x22 caf\\xC3\\xA9\\x5Cx"'), line


def test_custom_format_variables(gannet):
    srv = gannet.start(http=CUSTOM, server=f"access_log {gannet.tmp}/custom.log custom;", files={"c.txt": "0123456789"})
    req, resp = raw_request(srv, "/c.txt", b"X-Custom: marker-42\r\n")
    raw_request(srv, "/c.txt")
    first, second = wait_lines(srv.tmp / "custom.log", 2)
    status, body_bytes, bytes_sent, req_len, req_time, custom = first.split("|")
    assert (status, body_bytes, custom) == ("200", "10", "marker-42")
    assert int(bytes_sent) == len(resp)
    assert int(req_len) == len(req)
    assert re.fullmatch(r"\d+\.\d{3}", req_time) and float(req_time) < 5
    assert second.endswith("|-"), second


def test_sent_http_variables(gannet):
    """`$sent_http_NAME`: the response's Content-Type, Location and other headers as sent
    (any case in the name), `-` for one it does not have."""
    fmt = ("log_format sent '$sent_http_content_type|$sent_http_location|$sent_http_x_tag|"
           "$sent_http_etag|$sent_http_last_modified|$sent_http_x_none';")
    srv = gannet.start(
        http=fmt,
        server=f"""access_log {gannet.tmp}/sent.log sent;
            location /t/ {{ add_header X-Tag tagged; }}
            location = /go {{ return 302 /t/a.txt; }}""",
        files={"t/a.txt": "a"},
    )
    assert srv.get("/t/a.txt")[0] == 200
    assert srv.get("/go")[0] == 302
    first, second = wait_lines(srv.tmp / "sent.log", 2)
    ctype, location, tag, etag, modified, none = first.split("|")
    assert (ctype, location, tag, none) == ("text/plain", "-", "tagged", "-")
    assert re.fullmatch(r"\\x22[0-9a-f]+-1\\x22", etag), etag  # the quotes, escaped as nginx does
    assert re.fullmatch(r"\w{3}, \d\d \w{3} \d{4} \d\d:\d\d:\d\d GMT", modified), modified
    second = second.split("|")
    assert second == ["text/html", f"http://127.0.0.1:{srv.port}/t/a.txt", "-", "-", "-", "-"]


def test_access_log_off_in_location(gannet):
    srv = gannet.start(server="location /quiet/ { access_log off; }", files={"quiet/q.txt": "q", "loud.txt": "l"})
    assert srv.get("/quiet/q.txt")[0] == 200
    assert srv.get("/loud.txt")[0] == 200
    log = wait_lines(srv.tmp / "access.log", 1)
    assert len(log) == 1 and '"GET /loud.txt HTTP/1.1"' in log[0], log


def test_two_access_logs(gannet):
    srv = gannet.start(
        http=CUSTOM,
        server=f"access_log {gannet.tmp}/one.log; access_log {gannet.tmp}/two.log custom;",
        files={"t.txt": "two"},
    )
    srv.get("/t.txt")
    [one] = wait_lines(srv.tmp / "one.log", 1)
    [two] = wait_lines(srv.tmp / "two.log", 1)
    assert COMBINED_RE.match(one) and '"GET /t.txt HTTP/1.1" 200 3 ' in one, one
    assert two.startswith("200|3|"), two
    # a server-level access_log replaces the http-level one
    assert lines(srv.tmp / "access.log") == []


def test_buffered_log_flushes_within_deadline(gannet):
    srv = gannet.start(server=f"access_log {gannet.tmp}/buf.log combined buffer=64k flush=1s;", files={"b.txt": "b"})
    srv.get("/b.txt")
    assert len(wait_lines(srv.tmp / "buf.log", 1, deadline=5.0)) == 1


def test_buffered_log_written_at_graceful_stop(gannet):
    srv = gannet.start(server=f"access_log {gannet.tmp}/buf.log combined buffer=64k flush=1h;", files={"b.txt": "b"})
    for i in range(5):
        assert srv.get(f"/b.txt?n={i}")[0] == 200
    assert lines(srv.tmp / "buf.log") == []  # 5 short lines neither fill 64k nor wait an hour
    assert srv.stop(signal.SIGQUIT) == 0
    got = lines(srv.tmp / "buf.log")
    assert [re.search(r"\?n=(\d)", ln)[1] for ln in got] == ["0", "1", "2", "3", "4"], got


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["term", "int"])
@pytest.mark.parametrize("main", ["", "master_process off;"], ids=["workers", "single"])
def test_buffered_log_written_at_fast_stop(gannet, sig, main):
    # nginx's worker writes its `buffer=` logs on its way out, a fast stop too; gannet's
    # worker process died on the signal with the lines still in its buffer.
    srv = gannet.start(main=main, server=f"access_log {gannet.tmp}/buf.log combined buffer=64k flush=1h;", files={"b.txt": "b"})
    for i in range(3):
        assert srv.get(f"/b.txt?n={i}")[0] == 200
    assert lines(srv.tmp / "buf.log") == []
    srv.stop(sig)
    got = lines(srv.tmp / "buf.log")
    assert [re.search(r"\?n=(\d)", ln)[1] for ln in got] == ["0", "1", "2"], got


def error_log_after_404(gannet, server: str) -> str:
    """Request a missing file, then a directory without index (whose `forbidden` error line
    marks that the 404's line, if any, has been written), and return the error log."""
    srv = gannet.start(server=server, files={"dir/": None})
    assert srv.get("/missing.txt")[0] == 404
    assert srv.get("/dir/")[0] == 403
    return wait_text(srv.tmp / "error.log", "is forbidden")


def test_error_log_open_failed_for_404(gannet):
    log = error_log_after_404(gannet, "")
    path = re.escape(str(gannet.tmp / "www" / "missing.txt"))
    pat = (
        r"^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} \[error\] \d+#\d+: \*\d+ "
        rf'open\(\) "{path}" failed \(2: No such file or directory\), client: 127\.0\.0\.1, '
        r'server: \S*, request: "GET /missing\.txt HTTP/1\.1", host: "127\.0\.0\.1:\d+"$'
    )
    assert re.search(pat, log, re.M), log


def test_error_log_quiet_with_log_not_found_off(gannet):
    log = error_log_after_404(gannet, "log_not_found off;")
    assert "is forbidden" in log and "open()" not in log, log
