"""Logs on the inherited descriptors: `access_log /dev/stdout` and the error log on stderr
write through fd 1 and fd 2 themselves, so `gannet > server.log 2>&1` keeps every line whole
(a second open of `/dev/stdout` had its own offset, and error lines overwrote access lines).
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess

from conftest import free_port, gannet_bin, wait_port, wait_until

ACCESS_RE = re.compile(r'^127\.0\.0\.1 - - \[[^\]]+\] "GET /(here|gone)-\d+ HTTP/1\.1" (200|404) \d+ "-" "[^"]*"$')
ERROR_RE = re.compile(r'^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[error\] \d+#\d+: \*\d+ open\(\) ".*/gone-\d+" failed .*$')


def test_stdout_and_stderr_share_one_file_whole_lines(tmp_path):
    """Interleave 200s (an access line each) and 404s (an access line and an error line each),
    with both streams on one file opened without O_APPEND, as a shell's `> file 2>&1`."""
    root = tmp_path / "www"
    root.mkdir()
    n = 40
    for i in range(n):
        (root / f"here-{i}").write_text("x" * i)
    port = free_port()
    out_path = tmp_path / "server.log"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen([str(gannet_bin())], cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "GANNET_LISTEN": f"127.0.0.1:{port}",
                                     "GANNET_DEFAULT_CONF": str(tmp_path / "absent.conf")})
    try:
        wait_port(port, proc)
        for i in range(n):
            for name in (f"here-{i}", f"gone-{i}"):
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", f"/{name}")
                c.getresponse().read()
                c.close()

        def done():
            text = out_path.read_text(errors="replace")
            return text.count('" 404 ') >= n and text.count('" 200 ') >= n and text.count("[error]") >= n
        assert wait_until(done), out_path.read_text(errors="replace")
    finally:
        proc.terminate()
        proc.wait(10)
    lines = out_path.read_text(errors="replace").splitlines()
    banner = [l for l in lines if l.startswith("gannet: serving ")]
    access = [l for l in lines if ACCESS_RE.match(l)]
    errors = [l for l in lines if ERROR_RE.match(l)]
    assert len(banner) == 1
    assert len(access) == 2 * n and len(errors) == n
    assert len(lines) == 1 + 2 * n + n, [l for l in lines if l not in access and l not in errors]
