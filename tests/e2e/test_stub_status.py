"""stub_status and `$connections_*`: nginx's exact text layout (side by side with Debian's
nginx after the same traffic), counts that are the whole server's (several worker threads,
and across a reload), and Debian's prometheus-nginx-exporter reading gannet's page."""

import http.client
import re
import shutil
import signal
import socket
import subprocess
import urllib.request

import pytest

from conftest import free_port, wait_port, wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both, side_by_side

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        location = /status { stub_status; }
        location = /old { stub_status on; }
        location = /vars {
            return 200 "$connections_active $connections_reading $connections_writing $connections_waiting\\n";
        }
    }
}
"""

LAYOUT = re.compile(
    rb"Active connections: (\d+) \nserver accepts handled requests\n (\d+) (\d+) (\d+) \n"
    rb"Reading: (\d+) Writing: (\d+) Waiting: (\d+) \n\Z"
)


def get(port, path, method="GET", conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, headers={} if conn else {"Connection": "close"})
    r = c.getresponse()
    body = r.read()
    if not conn:
        c.close()
    return r.status, r.getheader("Content-Type"), body


def traffic(port):
    """Three closed connections (a file, a 404, a status page), then one kept alive after a
    request."""
    for path in ("/a.txt", "/missing", "/status"):
        get(port, path)
    kept = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    get(port, "/a.txt", conn=kept)
    return kept


def settled(port):
    """Read the page until the closed connections are gone (each read is a connection and
    a request of its own): (page, reads made)."""
    reads = []

    def read():
        reads.append(get(port, "/status"))
        return reads[-1][2].startswith(b"Active connections: 2 \n")

    assert wait_until(read, 5), reads[-1]
    return reads[-1], len(reads)


@pytest.mark.skipif(NGINX is None, reason="nginx not installed")
def test_layout_and_counts_as_nginx(tmp_path):
    files = {"a.txt": "hello\n"}
    with side_by_side(tmp_path, CONF, files) as (srv, nginx_port):
        answers = {}
        for name, port in (("gannet", srv.port), ("nginx", nginx_port)):
            kept = traffic(port)
            page, n = settled(port)
            # The harness's probe of the port, 3 closed, the kept one, the reads.
            want = (f"Active connections: 2 \nserver accepts handled requests\n"
                    f" {5 + n} {5 + n} {4 + n} \nReading: 0 Writing: 1 Waiting: 1 \n").encode()
            assert page == (200, "text/plain", want), name
            # active, reading, writing (this request), waiting (the kept one)
            assert wait_until(lambda: get(port, "/vars")[2] == b"2 0 1 1\n", 5), name
            old = get(port, "/old")
            assert old[:2] == (200, "text/plain") and LAYOUT.match(old[2]), (name, old)
            assert get(port, "/status", "POST")[0] == 405
            head = get(port, "/status", "HEAD")
            assert head[0] == 200 and head[2] == b""
            answers[name] = page
            kept.close()
        assert answers["gannet"][2].split(b" ")[:3] == answers["nginx"][2].split(b" ")[:3]


def test_counts_sum_worker_threads_and_survive_reload(gannet):
    """Four worker threads each accept some of forty connections: the page counts all of
    them; after a reload (a new worker process) the totals keep counting up."""
    conf, port = gannet.render(server="location = /status { stub_status; }")
    srv = gannet.start(conf=conf.replace("worker_processes 1;", "worker_processes 4;"),
                       files={"a.txt": "x"}, port=port)

    def counts():
        m = LAYOUT.match(get(srv.port, "/status")[2])
        return tuple(int(x) for x in m.groups())

    # The start-up probe's connection may still be on its way to being counted by another
    # worker thread: the base is taken once two reads in a row differ by their own
    # connection alone.
    seen = [counts()]

    def settled():
        seen.append(counts())
        return seen[-1][1] - seen[-2][1] == 1

    assert wait_until(settled, 5)
    base = seen[-1]
    for _ in range(40):
        get(srv.port, "/a.txt")
    after = counts()
    # This status request's connection is counted too: 41 more accepted, 41 requests.
    assert after[1] - base[1] == 41 and after[2] - base[2] == 41 and after[3] - base[3] == 41
    old_pids = srv.worker_pids()
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: (p := srv.worker_pids()) and p != old_pids and len(p) == 1, 10)
    again = counts()
    assert again[1] > after[1] and again[3] > after[3], (after, again)
    assert again[0] == 1 and again[5] == 1


def test_config_errors(tmp_path):
    if NGINX is None:
        pytest.skip("nginx not installed")
    for http in ("stub_status;", "server { listen 127.0.0.1:2; stub_status a b; }"):
        n, g = check_both(tmp_path, http)
        assert n.returncode != 0 and g.returncode != 0, (n.stderr, g.stderr)
        line = re.search(r"in \S+:(\d+)", n.stderr).group(1)
        assert f":{line}" in g.stderr, (n.stderr, g.stderr)


EXPORTER = shutil.which("prometheus-nginx-exporter")


@pytest.mark.skipif(EXPORTER is None, reason="prometheus-nginx-exporter not installed")
def test_prometheus_exporter_reads_it(gannet):
    srv = gannet.start(server="location = /status { stub_status; }", files={"a.txt": "x"})
    for _ in range(7):
        get(srv.port, "/a.txt")
    # The page is read when /metrics is asked for; its own connection and request count.
    wait_until(lambda: LAYOUT.match(get(srv.port, "/status")[2]).group(1) == b"1", 5)
    port = free_port()
    exporter = subprocess.Popen(
        [EXPORTER, f"-nginx.scrape-uri=http://127.0.0.1:{srv.port}/status",
         f"-web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_port(port, exporter)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        exporter.terminate()
        exporter.wait(10)
    values = dict(re.findall(r"^(nginx_\w+) (\S+)$", metrics, re.M))
    assert values["nginx_up"] == "1", metrics
    # 7 file requests, 1 status read by the test, then the exporter's own (it may read the
    # page once at start to check it, so one or two).
    assert values["nginx_http_requests_total"] in ("9", "10"), values
    assert values["nginx_connections_accepted"] == values["nginx_connections_handled"]
    assert int(values["nginx_connections_accepted"]) == int(values["nginx_http_requests_total"])
    assert values["nginx_connections_active"] == "1"
    assert values["nginx_connections_writing"] == "1"
    assert values["nginx_connections_reading"] == "0"
    assert values["nginx_connections_waiting"] == "0"
