"""The figures recorded per point: their keys, labels, units and which direction is better.
Reports, CSV, plots and `arena compare` all read this one list."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    better: str | None   # "higher", "lower" or None (informational)
    digits: int = 0


METRICS = [
    Metric("rps", "Req/s", "req/s", "higher"),
    Metric("p50_ms", "p50", "ms", "lower", 2),
    Metric("p90_ms", "p90", "ms", "lower", 2),
    Metric("p99_ms", "p99", "ms", "lower", 2),
    Metric("max_ms", "max latency", "ms", "lower", 1),
    Metric("mean_ms", "mean latency", "ms", "lower", 2),
    Metric("failures", "Failed responses", "", "lower"),
    Metric("cpu_per_10k", "Server CPU s / 10k req", "s", "lower", 3),
    # Its part in the kernel: system calls and the network stack (arena/measure.py)
    Metric("kernel_cpu_per_10k", "Server CPU s / 10k req in the kernel", "s", "lower", 3),
    Metric("peak_cpu_pct", "Max CPU", "%", "lower"),
    Metric("peak_rss_mib", "Peak RSS", "MiB", "lower", 1),
    Metric("peak_pss_mib", "Peak PSS", "MiB", "lower", 1),
    Metric("header_bytes", "Header bytes / reply", "B", "lower", 1),
    Metric("bytes_per_reply", "Bytes / reply", "B", None, 1),
    Metric("client_cpu_pct", "Client CPU", "%", None),
    # The load tool's CPU per request, and the server's and the tool's together. On loopback
    # the kernel's work for one side often runs in the other's context: an ACK the client
    # sends makes the server's socket send its next segments on the client's CPU. So a
    # server that leaves more of a large answer to be sent that way looks cheaper by its own
    # CPU than it is (the 394 KB image at c=1,000, docs/bench/cost-per-request.md).
    Metric("client_cpu_per_10k", "Client CPU s / 10k req", "s", None, 3),
    Metric("pair_cpu_per_10k", "Server + client CPU s / 10k req", "s", "lower", 3),
    # c10k
    Metric("idle_held", "Idle connections held", "", "higher"),
    Metric("idle_still_open", "Idle connections still open at the end", "", "higher"),
    Metric("mem_per_conn_b", "Memory per idle connection (PSS)", "B", "lower"),
    Metric("fresh_ok", "New connection served (1 = yes)", "", "higher"),
    # s2-rate
    Metric("reply_rate_max", "Reply rate max", "replies/s", "higher"),
    # s1-dynamic, s3-sessions: the PHP tier (the PHP-FPM pool's master and children), measured
    # as the server is; for a server that runs PHP itself (mod_php) it is part of the server.
    Metric("php_cpu_per_10k", "PHP-FPM CPU s / 10k req", "s", "lower", 3),
    Metric("total_cpu_per_10k", "Server + PHP CPU s / 10k req", "s", "lower", 3),
    Metric("php_peak_cpu_pct", "PHP-FPM max CPU", "%", "lower"),
    Metric("php_peak_rss_mib", "PHP-FPM peak RSS", "MiB", "lower", 1),
    Metric("php_peak_pss_mib", "PHP-FPM peak PSS", "MiB", "lower", 1),
    Metric("total_peak_pss_mib", "Server + PHP peak PSS", "MiB", "lower", 1),
    # s3-sessions: siege's summary, in the study's columns
    Metric("transactions", "Transactions", "", None),
    Metric("elapsed_s", "Elapsed time", "s", None, 2),
    Metric("data_mb", "Data transferred", "MB", None, 2),
    Metric("response_s", "Response time", "s", "lower", 3),
    Metric("throughput_mb_s", "Throughput", "MB/s", "higher", 2),
    Metric("siege_concurrency", "Concurrency (siege)", "", None, 2),
    # s4-proxy and its variants: the replay's counts and the back ends' (None in a round whose
    # replayer stalled: those rounds are the tool's failure, not the server's)
    Metric("planned", "Requests planned", "", None),
    Metric("sent", "Requests sent", "", None),
    Metric("ok", "Answered 2xx", "", "higher"),
    Metric("backend_served", "Served by the back end(s)", "", None),
    Metric("lost", "Lost requests", "", "lower"),
    Metric("loss_pct", "Loss", "%", "lower", 2),
    Metric("tcp_syn_recv", "SYN-RECV sockets (peak)", "", None),
    Metric("tcp_time_wait", "TIME-WAIT sockets (peak)", "", None),
    # s4-failover: client-visible failures by method, and who served the point
    Metric("get_failures", "Failed GETs (client-visible)", "", "lower"),
    Metric("post_failures", "Failed POSTs (client-visible)", "", "lower"),
    Metric("get_planned", "GETs planned", "", None),
    Metric("post_planned", "POSTs planned", "", None),
    Metric("served_by_survivors", "Served by the surviving back ends", "", None),
    Metric("served_by_killed", "Served by the killed back end", "", None),
    Metric("kill_at_s", "Back end killed at", "s", None, 2),
    Metric("restart_s", "Back end restart", "s", None, 2),
    # s4-mirror: the copies the shadow back end received
    Metric("shadow_copies", "Copies at the shadow back end", "", None),
    Metric("shadow_pct", "Copies / served", "%", None, 1),
    # --server-quota: req/s per whole CPU (arena/quota.py)
    Metric("capacity_per_core", "Capacity per core", "req/s", "higher"),
    # cache: what reached the origin (its access log), so the hit ratio is measured, not assumed
    Metric("origin_requests", "Requests reaching the origin", "", None),
    Metric("hit_pct", "Hit ratio", "%", None, 2),
    # l4-proxy: the bulk relay
    Metric("gb_per_s", "Relayed", "GB/s", "higher", 3),
    Metric("cpu_per_gb", "Server CPU s / GB", "s", "lower", 3),
]

BY_KEY = {m.key: m for m in METRICS}


def fmt(key: str, value: float | None) -> str:
    """A figure rounded for a table; '-' when absent."""
    if value is None:
        return "-"
    metric = BY_KEY.get(key)
    digits = metric.digits if metric else 2
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"
