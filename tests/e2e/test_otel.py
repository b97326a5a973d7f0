"""ngx_otel_module (nginx-otel's directives): W3C trace context extracted from the client and
injected towards the application, one SERVER span per sampled request exported over
OTLP/gRPC to a real receiver (Jaeger, installed by scripts/test-all.sh), read back through
Jaeger's query API; sampling by a variable from `split_clients`; the `$otel_*` variables.

Debian's nginx has no OpenTelemetry module, so there is no differential run: the spec is
nginx-otel's source (what it reads, injects and exports) and the OTLP receiver's view.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import urllib.request
import uuid

import pytest

from conftest import free_port, wait_port, wait_until
from rawapps import FastCgiApp, HttpApp, Listener, end_request, http_answer, made, stdout
from test_tls import Pki


def jaeger_bin() -> str | None:
    found = shutil.which("jaeger")
    home = os.path.expanduser("~/go/bin/jaeger")
    return found or (home if os.path.exists(home) else None)


JAEGER_CONF = """
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:{query}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp}{tls}
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
"""


class Jaeger:
    def __init__(self, tmp, cert=None, key=None):
        self.otlp, self.query, query_grpc = free_port(), free_port(), free_port()
        conf = tmp / "jaeger.yaml"
        tls = f"\n        tls:\n          cert_file: {cert}\n          key_file: {key}" if cert else ""
        conf.write_text(JAEGER_CONF.format(otlp=self.otlp, query=self.query, query_grpc=query_grpc, tls=tls))
        self.log = open(tmp / "jaeger.log", "wb")
        self.proc = subprocess.Popen([jaeger_bin(), "--config", str(conf)], stdout=self.log, stderr=subprocess.STDOUT)
        wait_port(self.otlp, self.proc, deadline=60)
        wait_port(self.query, self.proc, deadline=60)

    def api(self, path: str):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.query}{path}", timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def spans(self, trace_id: str) -> list[dict]:
        got = self.api(f"/api/traces/{trace_id}")
        if not got or not got.get("data"):
            return []
        trace = got["data"][0]
        for s in trace["spans"]:
            s["process"] = trace["processes"][s["processID"]]
        return trace["spans"]

    def trace_ids(self, service: str) -> set[str]:
        got = self.api(f"/api/traces?service={service}&limit=100000&lookback=1h") or {}
        return {t["traceID"] for t in got.get("data") or []}

    def close(self):
        # Memory storage, nothing to keep: no graceful shutdown to wait for.
        self.proc.kill()
        self.proc.wait(10)
        self.log.close()


@pytest.fixture
def jaeger(tmp_path):
    if jaeger_bin() is None:
        pytest.skip("jaeger is not installed (scripts/test-all.sh installs it)")
    j = Jaeger(tmp_path)
    yield j
    j.close()


@pytest.fixture
def app():
    yield from made(HttpApp)


def tags(span: dict) -> dict:
    return {t["key"]: t["value"] for t in span["tags"]}


def exporter(j: Jaeger, service: str) -> str:
    return f"""
        otel_exporter {{ endpoint 127.0.0.1:{j.otlp}; interval 50ms; batch_size 64; header x-test yes; }}
        otel_service_name {service};
        otel_resource_attr deployment.environment e2e;
        log_format otel '$otel_trace_id $otel_span_id $otel_parent_id $otel_parent_sampled';
    """


def header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        n, _, v = line.partition(b":")
        if n.strip().lower() == name:
            return v.strip()
    return None


def test_client_context_goes_through_to_upstream_and_span(gannet, jaeger, app, tmp_path):
    up = app(lambda conn, head, body: conn.sendall(http_answer(b"up\n", keep=False)))
    service = f"gannet-{uuid.uuid4().hex[:8]}"
    srv = gannet.start(
        http=exporter(jaeger, service),
        server=f"""
            location /app {{
                otel_trace on;
                otel_trace_context propagate;
                otel_span_attr app.custom "v-$arg_x";
                access_log {tmp_path}/otel.log otel;
                proxy_pass http://127.0.0.1:{up.port};
            }}
        """,
    )
    tid, sid = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    status, _, body = srv.get("/app?x=1", headers={
        "traceparent": f"00-{tid}-{sid}-01", "tracestate": "k=v", "User-Agent": "otel-test"})
    assert (status, body) == (200, b"up\n")

    # The upstream got this request's context: the client's trace, gannet's span, sampled.
    (_, head, _), = up.requests
    parent = header(head, b"traceparent").decode()
    m = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01", parent)
    assert m and m[1] == tid and m[2] != sid, parent
    span_id = m[2]
    assert header(head, b"tracestate") == b"k=v"

    # The access log's variables name the same ids.
    line = wait_until(lambda: (tmp_path / "otel.log").exists() and (tmp_path / "otel.log").read_text())
    assert line.split() == [tid, span_id, sid, "1"]

    # Jaeger has gannet's span, child of the client's, with nginx-otel's attributes.
    spans = wait_until(lambda: jaeger.spans(tid), deadline=20, every=0.1)
    assert len(spans) == 1, spans
    s = spans[0]
    assert s["spanID"] == span_id and s["operationName"] == "/app"
    assert [(r["refType"], r["traceID"], r["spanID"]) for r in s["references"]] == [("CHILD_OF", tid, sid)]
    t = tags(s)
    assert t["span.kind"] == "server"
    assert (t["http.method"], t["http.target"], t["http.route"]) == ("GET", "/app?x=1", "/app")
    assert (t["http.status_code"], t["http.flavor"], t["http.scheme"]) == (200, "1.1", "http")
    assert (t["http.user_agent"], t["http.response_content_length"]) == ("otel-test", 3)
    assert (t["net.sock.peer.addr"], t["net.host.port"]) == ("127.0.0.1", srv.port)
    assert t["app.custom"] == "v-1"
    assert t["w3c.tracestate"] == "k=v"
    assert s["process"]["serviceName"] == service
    assert {"key": "deployment.environment", "type": "string", "value": "e2e"} in s["process"]["tags"]


def test_http2_request_is_traced_the_same_way(gannet, jaeger, app):
    """HTTP/2 goes through the same phases: injected context upstream, `http.flavor` 2.0;
    `otel_span_name` with variables; a 5xx answer marks the span as an error."""
    up = app(lambda conn, head, body: conn.sendall(http_answer(b"up", status="503 Busy", keep=False)))
    service = f"gannet-{uuid.uuid4().hex[:8]}"
    srv = gannet.start(http=exporter(jaeger, service), server=f"""
        http2 on;
        location /h2 {{ otel_trace on; otel_trace_context propagate; otel_span_name "h2 $request_method $uri";
                        proxy_pass http://127.0.0.1:{up.port}; }}
    """)
    tid, sid = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    r = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-H", f"traceparent: 00-{tid}-{sid}-00",
                        "-w", "%{http_version}", f"{srv.base}/h2"], capture_output=True, timeout=10)
    assert r.stdout == b"up2"
    (_, head, _), = up.requests
    span_id = re.fullmatch(rf"00-{tid}-([0-9a-f]{{16}})-01", header(head, b"traceparent").decode())[1]
    spans = wait_until(lambda: jaeger.spans(tid), deadline=20, every=0.1)
    assert [s["spanID"] for s in spans] == [span_id]
    assert spans[0]["operationName"] == "h2 GET /h2"
    t = tags(spans[0])
    assert (t["http.flavor"], t["http.status_code"], t["otel.status_code"]) == ("2.0", 503, "ERROR")
    assert [r["spanID"] for r in spans[0]["references"]] == [sid]


def test_split_clients_samples_a_tenth(gannet, jaeger, tmp_path):
    service = f"gannet-{uuid.uuid4().hex[:8]}"
    srv = gannet.start(
        http=exporter(jaeger, service) + """
            split_clients "$request_id" $otel_on { 10% on; * off; }
            log_format sampled '$otel_on $otel_trace_id';
        """,
        server=f"""
            location /s {{
                otel_trace $otel_on;
                access_log {tmp_path}/sampled.log sampled;
                return 204;
            }}
        """,
    )
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    n = 1000
    for _ in range(n):
        c.request("GET", "/s")
        r = c.getresponse()
        r.read()
        assert r.status == 204
    c.close()
    log = tmp_path / "sampled.log"
    lines = wait_until(lambda: log.exists() and len(log.read_text().splitlines()) == n and log.read_text().splitlines())
    sampled = {tid for on, tid in (l.split() for l in lines) if on == "on"}
    # Binomial(1000, 0.1): mean 100, sd 9.5; 5 sd either way.
    sd = math.sqrt(n * 0.1 * 0.9)
    assert abs(len(sampled) - n * 0.1) < 5 * sd, len(sampled)
    # Exactly the sampled requests were exported, each with the trace id its log line has.
    def exported():
        ids = jaeger.trace_ids(service)
        return ids if len(ids) >= len(sampled) else None

    assert wait_until(exported, deadline=30, every=0.2) == sampled


def test_without_otel_trace_the_client_context_passes_untouched(gannet, app):
    """`otel_trace_context ignore` (the default) leaves traceparent alone; `inject` replaces it
    with a new trace's unsampled context when `otel_trace off`; no exporter is needed when no
    location has `otel_trace`."""
    up = app(lambda conn, head, body: conn.sendall(http_answer(b"ok", keep=False)))
    srv = gannet.start(server=f"""
        location /plain {{ proxy_pass http://127.0.0.1:{up.port}; }}
        location /inject {{ otel_trace_context inject; proxy_pass http://127.0.0.1:{up.port}; }}
        location /extract {{ otel_trace_context extract; proxy_pass http://127.0.0.1:{up.port};
                             add_header X-Ids "$otel_trace_id $otel_parent_id $otel_parent_sampled"; }}
    """)
    tid, sid = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    sent = f"00-{tid}-{sid}-01"
    assert srv.get("/plain", headers={"traceparent": sent})[0] == 200
    assert srv.get("/inject", headers={"traceparent": sent, "tracestate": "a=b"})[0] == 200
    status, h, _ = srv.get("/extract", headers={"traceparent": sent})
    assert status == 200 and h["x-ids"] == f"{tid} {sid} 1"
    heads = [head for _, head, _ in up.requests]
    assert header(heads[0], b"traceparent").decode() == sent
    injected = header(heads[1], b"traceparent").decode()
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-00", injected) and tid not in injected
    # No parent was extracted, so its (empty) tracestate replaces the client's.
    assert header(heads[1], b"tracestate") == b""
    assert header(heads[2], b"traceparent").decode() == sent


class RecordingFastCgi(FastCgiApp):
    """Keeps the bytes of each request's records up to its empty STDIN (the params)."""

    def __init__(self):
        self.seen = []
        super().__init__(None)

    def serve(self, conn):
        buf = b""
        while self.END_OF_STDIN not in buf:
            got = conn.recv(65536)
            if not got:
                return
            buf += got
        self.seen.append(buf)
        conn.sendall(stdout(b"Status: 200\r\nContent-Type: text/plain\r\n\r\nfcgi") + end_request())
        conn.close()


@pytest.fixture
def fcgi():
    yield from made(RecordingFastCgi)


def test_fastcgi_gets_the_context_as_http_traceparent(gannet, jaeger, fcgi):
    app = fcgi()
    srv = gannet.start(http=exporter(jaeger, "gannet-fcgi"), server=f"""
        location / {{
            otel_trace on; otel_trace_context propagate;
            add_header X-Span $otel_span_id;
            fastcgi_pass 127.0.0.1:{app.port};
        }}
    """)
    tid, sid = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    status, h, body = srv.get("/x.php", headers={"traceparent": f"00-{tid}-{sid}-00"})
    assert (status, body) == (200, b"fcgi")
    params = b"".join(app.seen)
    assert b"HTTP_TRACEPARENT" + f"00-{tid}-{h['x-span']}-01".encode() in params


def test_export_over_tls_with_trusted_certificate(gannet, tmp_path):
    """`endpoint https://...` with `trusted_certificate`: gRPC over TLS, the receiver's
    certificate checked against that CA."""
    if jaeger_bin() is None:
        pytest.skip("jaeger is not installed (scripts/test-all.sh installs it)")
    (tmp_path / "pki").mkdir()
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("otlp", "localhost", sans=("localhost",))
    j = Jaeger(tmp_path, cert, key)
    try:
        srv = gannet.start(http=f"""
            otel_exporter {{ endpoint https://localhost:{j.otlp}; trusted_certificate {pki.d}/ca.pem; interval 50ms; }}
            otel_service_name gannet-tls;
        """, server="location / { otel_trace on; otel_trace_context propagate; return 204; }")
        tid = uuid.uuid4().hex
        assert srv.get("/", headers={"traceparent": f"00-{tid}-{'1' * 16}-01"})[0] == 204
        spans = wait_until(lambda: j.spans(tid), deadline=20, every=0.1)
        assert len(spans) == 1 and spans[0]["process"]["serviceName"] == "gannet-tls"
    finally:
        j.close()


def test_spans_left_are_sent_when_the_worker_exits(gannet, jaeger):
    """`interval 1h`: nothing is sent before the graceful stop (QUIT), which sends it."""
    srv = gannet.start(http=f"otel_exporter {{ endpoint 127.0.0.1:{jaeger.otlp}; interval 1h; }} otel_service_name gannet-exit;",
                       server="location / { otel_trace on; otel_trace_context extract; return 204; }")
    tid = uuid.uuid4().hex
    assert srv.get("/", headers={"traceparent": f"00-{tid}-{'2' * 16}-01"})[0] == 204
    assert jaeger.spans(tid) == []
    assert srv.stop(signal.SIGQUIT) == 0
    spans = wait_until(lambda: jaeger.spans(tid), deadline=10, every=0.1)
    assert len(spans) == 1 and spans[0]["references"][0]["spanID"] == "2" * 16


class Silent(Listener):
    """A receiver that accepts and never answers: the export of the first batch hangs."""

    def serve(self, conn):
        while conn.recv(65536):
            pass


def test_a_full_queue_drops_spans_and_says_so(gannet):
    """`batch_size 1; batch_count 1`: one span in the queue while the export thread is stuck
    on a receiver that never answers; the others are dropped, counted in a notice, and the
    requests are answered all the same."""
    receiver = Silent()
    try:
        srv = gannet.start(http=f"otel_exporter {{ endpoint 127.0.0.1:{receiver.port}; batch_size 1; batch_count 1; interval 10ms; }}",
                           server="location / { otel_trace on; return 204; }")
        for _ in range(6):
            assert srv.get("/")[0] == 204
        assert wait_until(lambda: re.search(r"\[notice\] .*OTel dropped records: [1-5]\b", srv.error_log())), srv.error_log()
    finally:
        receiver.close()


@pytest.mark.parametrize("http,server,error", [
    ("", "location / { otel_trace on; }", '"otel_exporter" block is missing'),
    ("otel_exporter { interval 1s; }", "", '"otel_exporter" requires "endpoint"'),
    ("otel_exporter { endpoint a:1; bogus 1; }", "", 'unknown directive "bogus" in "otel_exporter"'),
    ("otel_exporter { endpoint a:1; interval x; }", "", '"interval" directive of "otel_exporter" invalid value'),
    ("otel_exporter { endpoint a:1 b; }", "",
     'invalid number of arguments in "endpoint" directive of "otel_exporter"'),
    ("otel_exporter { endpoint a:1; header 'a b' c; }", "",
     '"header" directive of "otel_exporter" has invalid header name'),
    ("otel_exporter { endpoint a:1; } otel_exporter { endpoint b:1; }", "", '"otel_exporter" directive is duplicate'),
    ("", "otel_trace_context sideways;", 'invalid value "sideways" in "otel_trace_context" directive'),
    ("", "location / { otel_service_name x; }", '"otel_service_name" directive is not allowed here'),
])
def test_config_errors(gannet, http, server, error):
    r = gannet.check(http=http, server=server)
    assert r.returncode != 0 and error in r.stderr, r.stderr
    assert re.search(r"gannet\.conf:\d+|check\.conf:\d+", r.stderr), r.stderr
