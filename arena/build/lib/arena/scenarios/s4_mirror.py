"""S4's mirror variant: the study copied live traffic to its proxies with TCPCopy; gannet and
nginx can copy requests themselves (`mirror URI`, nginx's ngx_http_mirror_module). Each
proxies to the back end as in s4-proxy and, for the mirrored half of the traffic, also sends a
copy of every request (POST bodies included) to a second nginx, the shadow back end, whose
answers are dropped.

Each proxy serves the same replay two ways in one process and over the same upstream pools:
under /p/ plainly, under /m/ with the mirror (both prefixes stripped before the back end; the
shadow gets the request URI as the client sent it, and serves the same files under /m/). The
points alternate - each rate without the mirror, then with it - so the main traffic's latency
with and without the mirror is measured under the same conditions, interleaved. Per point:
the main traffic's counts and latency (httperf's connection time: median of the largest
replayer, mean, max), what the back end served, and the copies the shadow back end logged.

The other peers have no request mirroring and are left out (Apache, lighttpd, h2o and Caddy
would need a module or a second proxy in front).
"""

from __future__ import annotations

from dataclasses import replace

from arena import adtraffic, ports, proxycount
from arena.report import Table
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point
from arena.scenarios.s4_proxy import ReplayGroup, S4Proxy, header_groups
from arena.servers.base import RunningServer, SiteOptions

# The two ways the same traffic goes through the proxy: the URI prefix its locations match.
MODES = {"off": "/p", "on": "/m"}


@register
class S4Mirror(S4Proxy):
    name = "s4-mirror"
    title = "S4 mirror: the main traffic's latency without and with a copy of every request to a shadow back end"
    description = ("gannet and nginx (the peers have no request mirroring) proxy the ad log to the back end, half "
                   "the points plainly and half with `mirror` sending a copy of each request to a shadow back end "
                   "(a second Debian nginx), interleaved at each rate, in the same process. httperf --wsesslog as "
                   "in s4-proxy, 250 to 4,000 requests/s, 10 s each. Reported: the main traffic's latency without "
                   "and with the mirror, what the back end served and the copies the shadow received.")
    study_columns = [("Rate (req/s)", "rate"), ("Mirror", "mirror"), ("Planned", "planned"), ("Answered 2xx", "ok"),
                     ("Served by back end", "backend_served"), ("Lost", "lost"),
                     ("Copies at the shadow", "shadow_copies"), ("Median (ms)", "p50_ms"), ("Mean (ms)", "mean_ms"),
                     ("Max (ms)", "max_ms"), ("Max CPU %", "peak_cpu_pct"), ("CPU s / 10k", "cpu_per_10k"),
                     ("Memory (PSS MiB)", "peak_pss_mib"), ("Note", "note")]
    kind = "proxy-mirror"

    def __init__(self) -> None:
        super().__init__()
        self.shadow: RunningServer | None = None

    def site_options(self, options: Options) -> SiteOptions:
        return SiteOptions(kind=self.kind, connections=4096,
                           app={"backend_host": ports.HOST,
                                "backend_port": self.backend.site.port if self.backend else 0,
                                "shadow_port": self.shadow.site.port if self.shadow else 0})

    def replay_groups(self, log: list[adtraffic.Request]) -> list[ReplayGroup]:
        """The header sets' replayers once per mode, their URIs under the mode's prefix."""
        groups = []
        for mode, prefix in MODES.items():
            for g in header_groups(log):
                requests = tuple(replace(r, uri=prefix + r.uri) for r in g.requests)
                groups.append(ReplayGroup(f"{g.name}-{mode}", requests, g.headers, g.share))
        return groups

    def start_backends(self, options: Options, files: dict[str, int]) -> dict:
        self.backend = self.start_backend("backend", self.workdir / "www", options)
        # The shadow gets the client's URI, /m/ included: the same files under m/ too.
        shadow_root = self.workdir / "shadow-www"
        adtraffic.write_docroot(shadow_root)
        adtraffic.write_docroot(shadow_root / "m")
        shadow_root.chmod(0o755)
        self.shadow = self.start_backend("shadow", shadow_root, options)
        return {"backend": self.backend_info(self.backend, options, files),
                "shadow": self.backend_info(self.shadow, options, files)}

    def finish(self) -> None:
        super().finish()
        self.shadow = None

    def _rates(self, options: Options) -> list[int]:
        # Quick: one rate, both ways - the smoke run stays short.
        return [100] if options.quick else [250, 500, 1000, 2000, 3000, 4000]

    def points(self, options: Options) -> list[Point]:
        seconds = 2 if options.quick else 10
        series = {"off": "without mirror", "on": "with mirror"}
        return [Point(key=f"rate{rate}-mirror-{mode}", series=series[mode], x=rate,
                      params={"rate": rate, "seconds": seconds, "mirror": mode})
                for rate in self._rates(options) for mode in MODES]

    def probe_paths(self) -> list[str]:
        return ["/p/ads/slot-01.json", "/m/sync.json"]

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        rate, seconds, mode = point.params["rate"], point.params["seconds"], point.params["mirror"]
        replays = self.replays(rate, seconds, [n for n in self.groups if n.endswith(f"-{mode}")])
        check = self.check_ports(server, rate, seconds)
        if not check.ok:
            return self.not_measured(point, sum(r.sessions for r in replays), check.message)
        main, shadow = self.backend.rundir / "access.log", self.shadow.rundir / "access.log"
        main_offset, shadow_offset = proxycount.log_size(main), proxycount.log_size(shadow)
        run = self.replay(server, replays, ctx)
        rec = self.client_record(point, run)
        statuses = proxycount.settle(lambda: proxycount.served_since(main, main_offset), rec["sent"] or 0)
        served = sum(statuses.values())
        self.add_loss(rec, served)
        # The copies go out alongside (gannet) or after (nginx) each main request: give the
        # shadow's log the same chance to catch up, up to one copy per request served.
        if mode == "on":
            copies = proxycount.settle(lambda: proxycount.served_since(shadow, shadow_offset), served)
        else:
            copies = proxycount.served_since(shadow, shadow_offset)
        rec.update({
            "mirror": mode,
            "backend_statuses": dict(sorted(statuses.items())),
            "shadow_copies": sum(copies.values()),
            "shadow_statuses": dict(sorted(copies.items())),
            "shadow_pct": 100.0 * sum(copies.values()) / served if served and mode == "on" else None,
            "port_wait_s": round(check.waited_s, 2),
        })
        return rec

    def report_tables(self, results: dict) -> list[Table]:
        """The main traffic's latency without and with the mirror, side by side per rate."""
        rows: dict[tuple[str, float], dict[str, dict]] = {}
        for row in results["summary"]:
            rows.setdefault((row["server"], row["x"]), {})[row["params"].get("mirror")] = row["metrics"]

        def value(metrics: dict | None, key: str) -> float | None:
            m = (metrics or {}).get(key)
            return m["median"] if m else None

        def fmt(v: float | None, digits: int = 2) -> str:
            return "-" if v is None else f"{v:,.{digits}f}"

        body = []
        for (server, rate), modes in rows.items():
            off, on = modes.get("off"), modes.get("on")
            cells = [server, f"{rate:,.0f}"]
            for key in ("p50_ms", "mean_ms", "max_ms"):
                a, b = value(off, key), value(on, key)
                cells += [fmt(a), fmt(b), "-" if a in (None, 0) or b is None else f"x{b / a:.2f}"]
            cells.append(fmt(value(on, "shadow_pct"), 1))
            body.append(cells)
        headers = ["server", "rate"]
        for label in ("median", "mean", "max"):
            headers += [f"{label} off (ms)", f"{label} on (ms)", "on/off"]
        headers.append("copies / served (%)")
        return [Table("Main-traffic latency without and with the mirror", headers, body,
                      "medians over rounds of httperf's connection time (connect included); the points "
                      "alternate off and on at each rate")]
