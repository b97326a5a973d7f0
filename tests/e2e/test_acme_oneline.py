"""The one-line HTTPS start, `gannet --https NAME --root DIR` (or `--proxy ADDR`), against a
real Pebble: no config file, the certificate obtained over HTTP-01 on the plain-HTTP
port, the files (or the proxied app) served over TLS verified against Pebble's root, and
plain HTTP redirected to https."""

from __future__ import annotations

import http.server
import subprocess
import threading
from pathlib import Path

import pytest

from conftest import free_port, gannet_bin, wait_port, wait_until
from test_acme import Pebble, need_pebble


@pytest.fixture
def ports():
    return free_port(), free_port()


@pytest.fixture
def pebble(tmp_path, ports):
    need_pebble()
    p = Pebble(tmp_path, ports[0])
    yield p
    p.stop()


def start(tmp_path: Path, pebble: Pebble, ports, *content: str) -> subprocess.Popen:
    http_port, https_port = ports
    args = [str(gannet_bin()), "--https", "localhost", *content,
            "--acme-server", pebble.directory, "--acme-ca-root", str(pebble.minica),
            "--state-dir", str(tmp_path / "state"), "--email", "admin@example.test",
            "--http-listen", f"127.0.0.1:{http_port}", "--https-listen", f"127.0.0.1:{https_port}",
            # The test's folders are root's only (as every e2e test's workers, see conftest).
            "-g", "user root;"]
    err = open(tmp_path / "stderr", "wb")
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=err)
    wait_port(http_port, proc)
    return proc


def curl(url: str, root: Path, port: int) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--cacert", str(root), "--resolve", f"localhost:{port}:127.0.0.1",
                           "-D", "-", url], capture_output=True, text=True, timeout=20)


def served(root: Path, port: int, path: str = "/") -> str | None:
    r = curl(f"https://localhost:{port}{path}", root, port)
    return r.stdout if r.returncode == 0 else None


def stop(proc: subprocess.Popen):
    proc.terminate()
    proc.wait(10)


def test_one_line_serves_files_with_an_acme_certificate(tmp_path, pebble, ports):
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("hello from the one-liner\n")
    proc = start(tmp_path, pebble, ports, "--root", str(site))
    try:
        http_port, https_port = ports
        out = wait_until(lambda: served(pebble.root, https_port), deadline=60, every=0.5)
        assert out, (tmp_path / "stderr").read_text() + pebble.log_path.read_text()
        assert out.startswith("HTTP/2 200") and out.endswith("hello from the one-liner\n"), out
        # The ACME state is where --state-dir said, and no config file was written.
        assert list((tmp_path / "state").glob("localhost-*.crt"))
        # Plain HTTP goes to https, on the HTTPS port given.
        r = subprocess.run(["curl", "-sS", "-D", "-", "-o", "/dev/null", f"http://localhost:{http_port}/a?b"],
                           capture_output=True, text=True, timeout=10)
        assert r.stdout.startswith("HTTP/1.1 301"), r.stdout
        assert f"Location: https://localhost:{https_port}/a?b" in r.stdout, r.stdout
    finally:
        stop(proc)
    assert b"serving " in (tmp_path / "stderr").read_bytes()


def test_one_line_proxy(tmp_path, pebble, ports):
    class App(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"app saw {self.path} host={self.headers['Host']} proto={self.headers['X-Forwarded-Proto']}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    app = http.server.ThreadingHTTPServer(("127.0.0.1", 0), App)
    threading.Thread(target=app.serve_forever, daemon=True).start()
    proc = start(tmp_path, pebble, ports, "--proxy", f"127.0.0.1:{app.server_address[1]}")
    try:
        https_port = ports[1]
        out = wait_until(lambda: served(pebble.root, https_port, "/x?y=1"), deadline=60, every=0.5)
        assert out, (tmp_path / "stderr").read_text()
        assert out.endswith(f"app saw /x?y=1 host=localhost proto=https\n"), out
    finally:
        stop(proc)
        app.shutdown()


def test_one_line_needs_root_or_proxy_and_no_config_file():
    r = subprocess.run([str(gannet_bin()), "--https", "example.com"], capture_output=True, text=True)
    assert r.returncode != 0 and "--root" in r.stderr, r.stderr
    r = subprocess.run([str(gannet_bin()), "--https", "example.com", "--root", "/", "--proxy", "x:1"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "cannot be used with" in r.stderr, r.stderr
    r = subprocess.run([str(gannet_bin()), "--https", "example.com", "--root", "/", "-c", "/x.conf"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "cannot be used with" in r.stderr, r.stderr
    # A bad name is a config error, as acme_certificate's.
    r = subprocess.run([str(gannet_bin()), "--https", "bad name", "--root", "/", "--state-dir", "/tmp/x", "-t"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and 'invalid server name: "bad name"' in r.stderr, r.stderr
