"""`metrics` and `status_zone`: the Prometheus page, read by Debian's Prometheus (which asks
for OpenMetrics) after a known load, checked with its own `promtool`, and the plain text
format with its parser; counts per server zone, upstream peer and limit zone."""

import http.client
import json
import math
import re
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request

import pytest

from conftest import free_port, wait_port, wait_until

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def get(port, path, headers=None, method="GET"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, headers=headers or {})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, r.getheader("Content-Type"), body


def start(gannet, back_port, extra_server=""):
    probed = free_port()
    """A server without a name (its zone is its address), proxying /app/ to a second server
    named `back`, with a limit_req zone and the metrics page in a zone of its own."""
    return gannet.start(
        files={"a.txt": "hello"},
        http=f"""
            log_format accept "$http_accept";
            limit_req_zone $binary_remote_addr zone=perip:1m rate=10000r/s;
            upstream backs {{ server 127.0.0.1:{back_port}; keepalive 4; }}
            upstream checked {{
                server 127.0.0.1:{free_port()};
                server 127.0.0.1:1 down;
                server 127.0.0.1:{probed};
            }}
            server {{
                listen 127.0.0.1:{probed};
                server_name probed;
                location / {{ return 200 "probed\\n"; }}
            }}
            server {{
                listen 127.0.0.1:{back_port};
                server_name back;
                location / {{ return 200 "from back\\n"; }}
            }}""",
        server=f"""
            location /app/ {{
                proxy_pass http://backs;
                proxy_http_version 1.1;
                proxy_set_header Connection "";
            }}
            location /direct/ {{ proxy_pass http://127.0.0.1:{back_port}; }}
            location /checked/ {{ proxy_pass http://checked; health_check interval=100ms fails=1; }}
            location /limited/ {{ limit_req zone=perip burst=5; try_files /a.txt =404; }}
            location = /metrics {{
                metrics;
                status_zone scrape;
                access_log {gannet.tmp}/scrape.log accept;
            }}
            {extra_server}""",
    )


def load(port):
    """The known load: 200 answers of 200, 100 of 404, 20 proxied to a group, 5 to an
    address, 10 limited."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for path, n, want in (("/a.txt", 200, 200), ("/missing", 100, 404), ("/app/x", 20, 200), ("/direct/y", 5, 200),
                          ("/limited/x", 10, 200)):
        for _ in range(n):
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            assert r.status == want, (path, r.status)
    c.close()


def samples(text):
    """name{labels} -> value of a text page."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^([a-z0-9_]+(?:\{[^}]*\})?) (\S+)$", text, re.M)}


def test_page_counts_the_load(gannet):
    back = free_port()
    srv = start(gannet, back)
    load(srv.port)
    status, ctype, body = get(srv.port, "/metrics")
    assert status == 200
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    text = body.decode()
    assert "# EOF" not in text
    assert "# TYPE gannet_http_requests_total counter" in text
    s = samples(text)
    zone = f"127.0.0.1:{srv.port}"
    assert s[f'gannet_http_requests_total{{server="{zone}",code="2xx"}}'] == 235
    assert s[f'gannet_http_requests_total{{server="{zone}",code="4xx"}}'] == 100
    assert s['gannet_http_requests_total{server="back",code="2xx"}'] == 25
    assert s[f'gannet_http_request_duration_seconds_count{{server="{zone}"}}'] == 335
    assert s[f'gannet_http_request_duration_seconds_bucket{{server="{zone}",le="+Inf"}}'] == 335
    assert s[f'gannet_http_received_bytes_total{{server="{zone}"}}'] > 335 * 20
    assert s[f'gannet_http_sent_bytes_total{{server="{zone}"}}'] > 200 * len("hello")
    peer = f'upstream="backs",peer="127.0.0.1:{back}"'
    assert s[f'gannet_upstream_requests_total{{{peer}}}'] == 20
    assert s[f'gannet_upstream_responses_total{{{peer},code="2xx"}}'] == 20
    assert s[f'gannet_upstream_failures_total{{{peer}}}'] == 0
    assert s[f'gannet_upstream_response_duration_seconds_count{{{peer}}}'] == 20
    assert s[f'gannet_upstream_peer_state{{{peer},state="up"}}'] == 1
    # The 20 went one after another over one kept connection, idle in the pool now.
    assert s[f'gannet_upstream_connections{{{peer},state="idle"}}'] == 1
    assert s[f'gannet_upstream_connections{{{peer},state="active"}}'] == 0
    # A proxy_pass to an address: nginx's implicit group named after it.
    direct = f'upstream="127.0.0.1:{back}",peer="127.0.0.1:{back}"'
    assert s[f'gannet_upstream_responses_total{{{direct},code="2xx"}}'] == 5
    # Back-to-back requests over the 10000r/s rate are delayed (burst, no nodelay).
    limited = [s[f'gannet_limit_req_requests_total{{zone="perip",result="{r}"}}']
               for r in ("passed", "delayed", "rejected")]
    assert limited[0] + limited[1] == 10 and limited[2] == 0, limited
    assert s["gannet_connections_accepted_total"] >= 2
    assert s['gannet_connections{state="writing"}'] == 1
    # The group with active checks: its dead server is found unhealthy, the `down` one is
    # down, the live one up.
    checked = re.compile(r'gannet_upstream_peer_state\{upstream="checked",peer="127.0.0.1:(\d+)",'
                         r'state="(\w+)"\} 1$', re.M)
    states = wait_until(lambda: (st := sorted(checked.findall(get(srv.port, "/metrics")[2].decode())))
                        and ("unhealthy" in [x[1] for x in st]) and st)
    assert states and sorted(x[1] for x in states) == ["down", "unhealthy", "up"], states
    # This scrape is counted in its own zone once answered.
    assert wait_until(lambda: samples(get(srv.port, "/metrics")[2].decode())
                      .get('gannet_http_requests_total{server="scrape",code="2xx"}') >= 3)
    # Only GET and HEAD.
    assert get(srv.port, "/metrics", method="POST")[0] == 405


def test_connection_states(gannet):
    """A kept-alive connection with nothing to do is idle, then parked out of its task; the
    states add up to the open connections."""
    srv = start(gannet, free_port())
    kept = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    kept.request("GET", "/a.txt")
    kept.getresponse().read()

    def states():
        s = samples(get(srv.port, "/metrics")[2].decode())
        return {k: s[f'gannet_connections{{state="{k}"}}'] for k in ("reading", "writing", "idle", "parked")}

    st = wait_until(lambda: (x := states())["parked"] == 1 and x, 10)
    assert st == {"reading": 0, "writing": 1, "idle": 0, "parked": 1}, st
    kept.request("GET", "/a.txt")
    assert kept.getresponse().read() == b"hello"
    st = states()
    assert st["idle"] + st["parked"] == 1, st
    # Closed by its client, it leaves the counts (parked or not by then).
    kept.close()
    st = wait_until(lambda: (x := states())["idle"] + x["parked"] == 0 and x, 10)
    assert st == {"reading": 0, "writing": 1, "idle": 0, "parked": 0}, st


def test_openmetrics_when_asked(gannet):
    srv = start(gannet, free_port())
    status, ctype, body = get(srv.port, "/metrics",
                              {"Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"})
    assert status == 200
    assert ctype == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    text = body.decode()
    assert text.endswith("\n# EOF\n")
    assert "# TYPE gannet_http_requests counter" in text
    assert "# TYPE gannet_http_requests_total" not in text


def test_counts_survive_a_reload(gannet):
    srv = start(gannet, free_port())
    load(srv.port)
    zone = f'gannet_http_requests_total{{server="127.0.0.1:{srv.port}",code="4xx"}}'
    old = srv.worker_pids()
    srv.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: (p := srv.worker_pids()) and p != old and len(p) == 1, 10)
    get(srv.port, "/missing")
    assert samples(get(srv.port, "/metrics")[2].decode())[zone] == 101


@pytest.mark.skipif(PROMTOOL is None, reason="prometheus not installed")
def test_promtool_parses_the_text_format(gannet):
    srv = start(gannet, free_port())
    load(srv.port)
    body = get(srv.port, "/metrics")[2]
    r = subprocess.run([PROMTOOL, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert r.returncode == 0, (r.stdout, r.stderr, body.decode())


def query(prom, q):
    url = f"http://127.0.0.1:{prom}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)
    assert data["status"] == "success", data
    return data["data"]["result"]


def ready(prom):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{prom}/-/ready", timeout=10) as r:
            return r.status == 200
    except OSError:
        return False


def value(prom, q):
    res = query(prom, q)
    return float(res[0]["value"][1]) if res else None


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed")
def test_prometheus_scrapes_it(gannet, tmp_path):
    srv = start(gannet, free_port())
    prom = free_port()
    (tmp_path / "prometheus.yml").write_text(f"""
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: gannet
    metrics_path: /metrics
    static_configs:
      - targets: ["127.0.0.1:{srv.port}"]
""")
    p = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                          f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{prom}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(prom, p, 30)
        assert wait_until(lambda: ready(prom), 30)
        zone = f'server="127.0.0.1:{srv.port}"'
        # A scrape before the load: the zone is there at 0.
        assert wait_until(lambda: value(prom, f'gannet_http_requests_total{{{zone},code="2xx"}}') == 0, 30)
        load(srv.port)
        assert wait_until(lambda: value(prom, f'gannet_http_requests_total{{{zone},code="2xx"}}') == 235, 30)
        assert value(prom, f'gannet_http_requests_total{{{zone},code="4xx"}}') == 100
        # Prometheus asked for OpenMetrics and read it (its scrape stats say the format
        # parsed: up is 1 and the samples are there).
        assert value(prom, 'up{job="gannet"}') == 1
        assert "application/openmetrics-text" in (gannet.tmp / "scrape.log").read_text()
        assert value(prom, f'gannet_http_request_duration_seconds_count{{{zone}}}') == 335
        q = (f'histogram_quantile(0.5, sum by (le) '
             f'(increase(gannet_http_request_duration_seconds_bucket{{{zone}}}[1m])))')
        median = wait_until(lambda: (v := value(prom, q)) is not None and not math.isnan(v) and v, 30)
        assert 0 < median <= 0.25, median
    finally:
        p.terminate()
        p.wait(30)


def test_config_errors(gannet):
    r = gannet.check(server="status_zone;")
    assert r.returncode != 0 and re.search(r"\.conf:\d+: invalid number of arguments in \"status_zone\"", r.stderr), r.stderr
    r = gannet.check(server="status_zone a; status_zone b;")
    assert r.returncode != 0 and '"status_zone" directive is duplicate' in r.stderr, r.stderr
    r = gannet.check(server="location / { metrics on; }")
    assert r.returncode != 0, r.stderr


def exported(text):
    """The sample names a page can have, from its `# TYPE` lines (text format)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    return names


def test_grafana_dashboard_names_only_exported_metrics(gannet):
    """contrib/grafana/gannet.json parses and every metric its queries name is one the page
    has (read from a running gannet, not from a list kept by hand)."""
    from conftest import REPO
    dash = json.loads((REPO / "contrib/grafana/gannet.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    assert len(exprs) > 10
    used = {n for e in exprs for n in re.findall(r"\b(gannet_[a-z0-9_]+)", e)}
    srv = start(gannet, free_port())
    have = exported(get(srv.port, "/metrics")[2].decode())
    assert used and used <= have, sorted(used - have)
    # Each panel's targets are well formed.
    for p in dash["panels"]:
        assert p["title"] and p["targets"] and all(t["refId"] for t in p["targets"]), p


@pytest.mark.skipif(shutil.which("curl") is None or shutil.which("openssl") is None,
                    reason="needs curl and openssl")
def test_tls_handshakes_and_http2_streams(gannet):
    d = gannet.tmp
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-nodes", "-keyout", str(d / "k.pem"), "-out", str(d / "c.pem"), "-days", "2",
                    "-subj", "/CN=localhost"], check=True, capture_output=True, timeout=60)
    tls = free_port()
    srv = gannet.start(files={"a.txt": "hello"}, server="location = /metrics { metrics; }", http=f"""
        server {{
            listen 127.0.0.1:{tls} ssl;
            http2 on;
            ssl_certificate {d}/c.pem;
            ssl_certificate_key {d}/k.pem;
            location / {{ return 200 "tls\\n"; }}
        }}""")
    url = f"https://127.0.0.1:{tls}/"
    for extra in (["--http2"], ["--http1.1", "--tlsv1.2", "--tls-max", "1.2"]):
        r = subprocess.run(["curl", "-sk", *extra, url], capture_output=True, timeout=30)
        assert r.stdout == b"tls\n", r
    # A client that sends a TLS record and then garbage.
    import socket
    with socket.create_connection(("127.0.0.1", tls), timeout=10) as s:
        s.sendall(b"\x16\x03\x01\x00\x05hello")
        s.recv(100)

    def page():
        return samples(get(srv.port, "/metrics")[2].decode())

    s = wait_until(lambda: (x := page())["gannet_tls_handshakes_failed_total"] == 1 and x)
    assert s, page()
    assert s['gannet_tls_handshakes_total{version="TLSv1.3"}'] == 1
    assert s['gannet_tls_handshakes_total{version="TLSv1.2"}'] == 1
    assert s["gannet_tls_handshakes_resumed_total"] == 0
    assert s["gannet_http2_streams_total"] == 1
    assert s['gannet_http_requests_total{server="127.0.0.1:%d",code="2xx"}' % tls] == 2
