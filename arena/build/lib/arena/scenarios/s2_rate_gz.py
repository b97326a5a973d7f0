"""S2 rate sweep with precompressed files: the same httperf sweep as `s2-rate`, but each
server answers with robots.txt.gz made beforehand (`gzip_static on` in gannet and nginx,
`file.send-compressed` in h2o, `precompressed gzip` in Caddy) instead of compressing each
reply. lighttpd and Apache have no built-in equivalent and are left out by default."""

from __future__ import annotations

from arena.scenarios import register
from arena.scenarios.base import Options
from arena.scenarios.s2_rate import S2Rate
from arena.servers.base import SiteOptions


@register
class S2RateGz(S2Rate):
    name = "s2-rate-gz"
    title = "S2 rate sweep, precompressed: robots.txt.gz, 10 requests per connection"
    description = S2Rate.description + " Precompressed robots.txt.gz served as is (gzip_static and equivalents)."

    def site_options(self, options: Options) -> SiteOptions:
        return SiteOptions(gzip=True, keepalive_timeout=15, connections=1024, kind="static-gz")
