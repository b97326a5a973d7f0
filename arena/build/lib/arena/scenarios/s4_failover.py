"""S4's failover variant: each proxy balances over three back ends (Debian's nginx, the same ad
files, each its own access log), and half-way through every rate point one of them is killed
(SIGKILL to its master and worker: a crash, not a shutdown) and restarted before the next
point. Each proxy runs with what it has to route around a dead server: passive health checks
and retries (nginx and gannet max_fails/fail_timeout and proxy_next_upstream, Apache's
balancer with retry and failonstatus, Caddy's lb_try_duration and fail_duration, lighttpd's
disable-time), plus active checks where the server has them (gannet's health_check in nginx
Plus's syntax, Caddy's health_uri). h2o 2.2 takes one back end per proxy.reverse.url and is
left out.

What counts is what the clients saw, by method: a GET (idempotent) may be retried on another
server, so none should fail; a POST already sent to the server that died may not be resent,
so those can fail. The replay therefore runs GETs and POSTs in separate httperfs (the GETs
one per header set, as in s4-proxy; the POSTs, 5 % of the log, in one, with the desktop
browser's headers). Per point: GETs and POSTs planned and failed (not answered 2xx), the
requests the surviving back ends served, the killed one's count before it died, when it was
killed and how long its restart took.

The killed back end is a different one at each point (point n kills back end n mod 3); back
ends listen outside the client port range so nothing can hold their port while they are down.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

from arena import adtraffic, ports, procs, proxycount
from arena.errors import ArenaError
from arena.scenarios import register
from arena.scenarios.base import Context, Options, Point
from arena.scenarios.s4_proxy import ReplayGroup, S4Proxy, merge_statuses
from arena.servers import SERVERS
from arena.servers.base import RunningServer, SiteOptions

BACKENDS = 3
POSTS = "post"
# How long a killed back end's processes may take to disappear before it is restarted.
GONE_TIMEOUT_S = 5.0


@register
class S4Failover(S4Proxy):
    name = "s4-failover"
    title = "S4 failover: a back end killed half-way through each rate point, failures seen by the clients"
    description = ("Each server balances over three back ends (Debian's nginx) with its passive health checks "
                   "and retries (gannet also with its active health_check; Caddy with health_uri); half-way "
                   "through each rate point one back end is killed (SIGKILL) and it is restarted before the next "
                   "point. The ad log is replayed as in s4-proxy, GETs and POSTs by separate httperfs, at 250 to "
                   "2,000 requests/s, 10 s each. Reported: failed GETs and POSTs as the clients saw them (target: "
                   "no failed GET), requests the surviving back ends served. h2o 2.2 cannot balance: left out.")
    study_columns = [("Rate (req/s)", "rate"), ("GETs", "get_planned"), ("Failed GETs", "get_failures"),
                     ("POSTs", "post_planned"), ("Failed POSTs", "post_failures"),
                     ("Served by the survivors", "served_by_survivors"),
                     ("Served by the killed one", "served_by_killed"), ("Killed at (s)", "kill_at_s"),
                     ("Restart (s)", "restart_s"), ("Median (ms)", "p50_ms"), ("Max (ms)", "max_ms"),
                     ("Max CPU %", "peak_cpu_pct"), ("CPU s / 10k", "cpu_per_10k"), ("Note", "note")]
    kind = "proxy-failover"

    def site_options(self, options: Options) -> SiteOptions:
        app = {"backend_host": ports.HOST}
        for i in range(BACKENDS):
            app[f"backend_port_{i + 1}"] = self.backends[i].site.port if len(self.backends) > i else 0
        return SiteOptions(kind=self.kind, connections=4096, app=app)

    def replay_groups(self, log: list[adtraffic.Request]) -> list[ReplayGroup]:
        """GETs per header set, and all POSTs in one group (with the desktop headers)."""
        groups = [ReplayGroup(name, tuple(r for r in requests if r.method == "GET"), adtraffic.HEADER_SETS[name][1],
                              sum(r.method == "GET" for r in requests) / len(log))
                  for name, requests in adtraffic.split(log).items()]
        posts = tuple(r for r in log if r.method == "POST")
        groups.append(ReplayGroup(POSTS, posts, adtraffic.HEADER_SETS["desktop"][1], len(posts) / len(log)))
        return groups

    def start_backends(self, options: Options, files: dict[str, int]) -> dict:
        for i in range(BACKENDS):
            self.start_backend(f"backend{i + 1}", self.workdir / "www", options)
        self.backend = self.backends[0]
        return {"backends": [self.backend_info(b, options, files) for b in self.backends]}

    def _rates(self, options: Options) -> list[int]:
        return [50, 100] if options.quick else [250, 500, 1000, 2000]

    def points(self, options: Options) -> list[Point]:
        seconds = 2 if options.quick else 10
        return [Point(key=f"rate{rate}", series="a back end killed half-way", x=rate,
                      params={"rate": rate, "seconds": seconds, "victim": i % BACKENDS + 1})
                for i, rate in enumerate(self._rates(options))]

    def warmup(self, point: Point, options: Options) -> Point | None:
        warm = super().warmup(point, options)
        if warm is None:
            return None
        # Warm-up kills nothing.
        return Point(warm.key, warm.series, warm.x, {**warm.params, "victim": None})

    # -- killing and restarting ------------------------------------------------------------
    def kill(self, server: RunningServer) -> list[int]:
        """SIGKILL the back end's master and workers, as a crash would end them; their pids."""
        pids = procs.process_tree(server.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def restart(self, index: int, pids: list[int], options: Options) -> float:
        """Start the killed back end again on its port once all its processes (`pids`) are
        gone - a worker still holding the listening socket would keep the port; the seconds
        it took until it answered."""
        dead = self.backends[index]
        start = time.monotonic()
        dead.proc.wait()
        while any(procs.alive(pid) for pid in pids):
            if time.monotonic() - start > GONE_TIMEOUT_S:
                raise ArenaError(f"the killed back end on port {dead.site.port} still has processes after "
                                 f"{GONE_TIMEOUT_S:.0f} s: {pids}")
            time.sleep(0.02)  # poll interval under the deadline
        self.backends[index] = SERVERS["nginx"].start(dead.site, dead.rundir, "tuned", self.backend_cpus(options))
        if index == 0:
            self.backend = self.backends[0]
        return time.monotonic() - start

    def measure(self, point: Point, server: RunningServer, ctx: Context) -> dict:
        rate, seconds = point.params["rate"], point.params["seconds"]
        victim = point.params.get("victim")
        index = victim - 1 if victim else None
        replays = self.replays(rate, seconds)
        check = self.check_ports(server, rate, seconds)
        if not check.ok:
            return self.not_measured(point, sum(r.sessions for r in replays), check.message)
        logs = [b.rundir / "access.log" for b in self.backends]
        offsets = [proxycount.log_size(p) for p in logs]
        killed = {}

        def kill() -> None:
            killed["at"] = time.monotonic()
            killed["pids"] = self.kill(self.backends[index])

        timer = threading.Timer(seconds / 2, kill) if index is not None else None

        def start_timer() -> None:
            killed["start"] = time.monotonic()
            if timer:
                timer.start()

        try:
            run = self.replay(server, replays, ctx, during=start_timer)
        finally:
            if timer:
                timer.cancel()
                timer.join()
        rec = self.client_record(point, run)

        def counts() -> Counter:
            total: Counter = Counter()
            for path, offset in zip(logs, offsets):
                total.update(proxycount.served_since(path, offset))
            return total

        proxycount.settle(counts, rec["sent"] or 0)
        per_backend = [proxycount.served_since(p, o) for p, o in zip(logs, offsets)]
        served = [sum(c.values()) for c in per_backend]
        self.add_loss(rec, sum(served))
        by_method = {"GET": [d for d in run.done if d.replay.name != POSTS],
                     "POST": [d for d in run.done if d.replay.name == POSTS]}
        for method, done in by_method.items():
            planned = sum(d.replay.sessions for d in done)
            ok = sum(int(d.result.extra.get("status_2xx", 0)) for d in done)
            rec[f"{method.lower()}_planned"] = planned
            rec[f"{method.lower()}_ok"] = ok
            # A replayer that stalled: its requests are the tool's, not the proxy's failures.
            rec[f"{method.lower()}_failures"] = None if rec["tool_failed"] else planned - ok
        rec.update({
            "backend_statuses": merge_statuses(per_backend),
            "served_per_backend": {str(b.site.port): n for b, n in zip(self.backends, served)},
            "victim": victim,
            "served_by_killed": served[index] if index is not None else None,
            "served_by_survivors": sum(n for i, n in enumerate(served) if i != index),
            "kill_at_s": round(killed["at"] - killed["start"], 2) if "at" in killed else None,
            "port_wait_s": round(check.waited_s, 2),
        })
        if index is not None:
            if "at" not in killed:
                # The replay ended before half its planned time (a tool failure): kill now so
                # the next point still starts with every back end freshly restarted.
                killed["pids"] = self.kill(self.backends[index])
            rec["restart_s"] = round(self.restart(index, killed["pids"], ctx.options), 2)
        return rec
