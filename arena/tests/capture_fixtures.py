"""Regenerate the parser fixtures: real outputs of wrk, h2load, ab, httperf and siege run for
about a second each against a local nginx started by the arena's own adapter, and of h3load
(built from this repository) against Debian's Caddy over HTTP/3.

    python tests/capture_fixtures.py      (from arena/; needs nginx, Caddy and the load tools)
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from arena import adtraffic, ports, proxycount, tls
from arena.clients import ab, h2load, h3load, httperf, siege, wrk
from arena.clients.base import run_tool
from arena.servers import SERVERS, Site, SiteOptions
from arena.servers.base import TlsSite
from arena.workload import make_docroot

OUT = Path(__file__).with_name("fixtures")
CPUS = "1"


def save(name: str, text: str) -> None:
    (OUT / name).write_text(text)
    print(f"wrote {name} ({len(text)} bytes)")


def capture_url_lists(server, work: Path) -> None:
    """wrk_paths.lua and siege -f -v over a list of paths, one of them missing (404)."""
    paths = ["/index.html", "/robots.txt", "/missing.html"]
    (work / "paths.txt").write_text("".join(f"{p}\n" for p in paths))
    (work / "urls.txt").write_text("".join(f"{server.url(p)}\n" for p in paths))
    save("wrk_paths.txt", run_tool(wrk.command(server.url("/"), 4, 300, paths_file=str(work / "paths.txt")),
                                   CPUS, 60).stdout)
    done = run_tool(siege.command(None, 2, 6, urls_file=str(work / "urls.txt"), verbose=True), CPUS, 60)
    save("siege_verbose.txt", done.stderr + done.stdout)


def capture_s4() -> None:
    """s4-proxy: an httperf --wsesslog replay of the generated log against the adserver back
    end, its access log and `ss -Htan` right after; and a replay against a closed port."""
    work = Path(tempfile.mkdtemp(prefix="arena-fixtures-s4-"))
    work.chmod(0o755)
    adtraffic.write_docroot(work / "www")
    (work / "sessions.txt").write_text(adtraffic.session_file(adtraffic.generate(200)))
    site = Site(work / "www", ports.free_port(), SiteOptions(kind="adserver", access_log=True))
    server = SERVERS["nginx"].start(site, work / "nginx", "tuned", "0")
    try:
        headers = adtraffic.HEADER_SETS["desktop"][1]
        command = httperf.sessions_command(site.host, site.port, str(work / "sessions.txt"), 300, 150,
                                           headers=headers)
        save("httperf_wsesslog.txt", run_tool(command, CPUS, 60).stdout)
        # The back end's sockets and a few others (the machine's other sockets, unfiltered, are many).
        lines = subprocess.run(["ss", "-Htan"], capture_output=True, text=True).stdout.splitlines()
        ours = [line for line in lines if proxycount.tcp_states(line, {site.port})]
        save("s4_ss.txt", "\n".join(ours + [line for line in lines if line not in ours][:40]) + "\n")
        save("s4_access.log", (work / "nginx" / "access.log").read_text())
        closed = httperf.sessions_command(site.host, ports.free_port(), str(work / "sessions.txt"), 20, 20)
        save("httperf_wsesslog_refused.txt", run_tool(closed, CPUS, 60).stdout)
        save("s4_port.txt", f"{site.port}\n")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def capture_tls() -> None:
    """The --tls and --h2 variants: h2load over HTTPS/1.1 (a new connection per request) and
    over HTTP/2 (10 streams per connection), and openssl s_client, against nginx on TLS with
    HTTP/2 and the arena's own test certificate."""
    work = Path(tempfile.mkdtemp(prefix="arena-fixtures-tls-"))
    work.chmod(0o755)
    make_docroot(work / "www")
    cert = tls.make_certificate(work / "tls")
    site = Site(work / "www", ports.free_port(), SiteOptions(tls=TlsSite(cert.cert, cert.key, http2=True)))
    server = SERVERS["nginx"].start(site, work / "nginx", "tuned", "0")
    try:
        url = server.url("/img.jpg")
        log = work / "h2load.log"
        out = run_tool(h2load.command(url, 10, 200, close=True, log_file=str(log)), CPUS, 60).stdout
        save("h2load_tls_close.txt", out)
        save("h2load_tls_close.log", log.read_text())
        save("h2load_h2.txt", run_tool(h2load.command(url, 10, 300, http2=True, streams=10), CPUS, 60).stdout)
        done = subprocess.run(["openssl", "s_client", "-connect", f"{site.host}:{site.port}", "-alpn", "h2",
                               "-CAfile", str(cert.cert), "-verify_ip", site.host],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace", timeout=30)
        # Only s_client's report: what the server sent after the handshake is binary (h2 frames).
        save("s_client_h2.txt", "".join(line for line in done.stdout.splitlines(keepends=True) if line.isprintable()
                                        or line.endswith("\n") and line[:-1].isprintable()))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def capture_h3() -> None:
    """The --h3 variant: h3load against Caddy over HTTP/3 (nginx 1.22 has none) with the
    arena's test certificate verified: the image over 2 connections of 4 streams, a missing
    page, and a port nothing answers on (a 1 s handshake deadline)."""
    work = Path(tempfile.mkdtemp(prefix="arena-fixtures-h3-"))
    work.chmod(0o755)
    make_docroot(work / "www")
    cert = tls.make_certificate(work / "tls")
    site = Site(work / "www", ports.free_port(), SiteOptions(tls=TlsSite(cert.cert, cert.key, http3=True)))
    server = SERVERS["caddy"].start(site, work / "caddy", "tuned", "0")
    try:
        image = h3load.command(server.url("/img.jpg"), 2, 40, streams=4, cafile=cert.cert)
        save("h3load_image.txt", run_tool(image, CPUS, 60).stdout)
        save("h3load_404.txt", run_tool(h3load.command(server.url("/missing.html"), 1, 20), CPUS, 60).stdout)
        closed = f"https://{site.host}:{ports.free_port()}/img.jpg"
        save("h3load_refused.txt", run_tool(h3load.command(closed, 1, 5, timeout=1), CPUS, 60).stdout)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="arena-fixtures-"))
    work.chmod(0o755)
    make_docroot(work / "www")
    site = Site(work / "www", ports.free_port(), SiteOptions(gzip=True, keepalive_timeout=15))
    server = SERVERS["nginx"].start(site, work / "nginx", "tuned", "0")
    try:
        url = server.url("/img.jpg")
        missing = server.url("/missing.html")
        save("wrk_keepalive.txt", run_tool(wrk.command(url, 10, 2000), CPUS, 60).stdout)
        save("wrk_close.txt", run_tool(wrk.command(url, 10, 1000, close=True), CPUS, 60).stdout)
        save("wrk_plain.txt", run_tool(["wrk", "-t1", "-c10", "-d1s", "--latency", url], CPUS, 30).stdout)
        save("wrk_404.txt", run_tool(["wrk", "-t1", "-c10", "-d1s", missing], CPUS, 30).stdout)

        log = work / "h2load.log"
        out = run_tool(h2load.command(url, 10, 300, log_file=str(log)), CPUS, 60).stdout
        save("h2load_keepalive.txt", out)
        save("h2load_keepalive.log", log.read_text())
        save("h2load_close.txt", run_tool(h2load.command(url, 10, 300, close=True), CPUS, 60).stdout)
        save("h2load_404.txt", run_tool(h2load.command(missing, 10, 300), CPUS, 60).stdout)

        index = server.url("/index.html")
        csv = work / "ab.csv"
        save("ab_close.txt", run_tool(ab.command(index, 10, 2000, csv_file=str(csv)), CPUS, 60).stdout)
        save("ab_close.csv", csv.read_text())
        save("ab_keepalive.txt", run_tool(ab.command(index, 10, 2000, keepalive=True), CPUS, 60).stdout)
        save("ab_404.txt", run_tool(ab.command(missing, 10, 500), CPUS, 60).stdout)

        host, port = site.host, site.port
        save("httperf_gzip.txt", run_tool(httperf.command(host, port, "/robots.txt", 100, 100, 10,
                                                          headers=["Accept-Encoding: gzip"]), CPUS, 60).stdout)
        closed = ports.free_port()
        save("httperf_refused.txt", run_tool(httperf.command(host, closed, "/robots.txt", 50, 20, 10),
                                             CPUS, 60).stdout)

        done = run_tool(siege.command(index, 10, 50), CPUS, 60)
        save("siege.txt", done.stderr + done.stdout)
        rc = work / "siegerc"
        rc.write_text("json_output = true\n")
        done = run_tool(siege.command(index, 10, 50, rc_file=str(rc)), CPUS, 60)
        save("siege_json.txt", done.stderr + done.stdout)
        capture_url_lists(server, work)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    capture_s4()
    capture_tls()
    capture_h3()


if __name__ == "__main__":
    main()
