#!/usr/bin/env bash
# Everything the tests need, then every test: on a fresh Debian 12 machine (as root) this
# installs the packages (the peers the arena drives too), builds gannet, sets up the
# Shakespeare app, and runs the Rust tests, lints, the end-to-end tests against the real
# binary (and Debian's nginx for the differential test), the arena's tests with its smoke
# benchmarks, and the app's tests through nginx and gannet. Target: well under 30 minutes
# on 2 cores (about 4 minutes once the packages are installed).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# The lib*-perl ones are what nginx's own test suite needs (scripts/nginx-tests.sh; not run here).
step "system packages"
pkgs=(curl openssl python3-yaml dpkg-dev libcrypt-dev nginx slowhttptest lighttpd lighttpd-mod-openssl h2o caddy apache2 apache2-utils libapache2-mod-php8.2 wrk nghttp2-client httperf siege iproute2 strace php-fpm uwsgi-core uwsgi-plugin-python3 dnsmasq prometheus-nginx-exporter memcached libnginx-mod-stream libnginx-mod-mail bind9-dnsutils mariadb-server mariadb-client libio-socket-ssl-perl libfcgi-perl libscgi-perl libprotocol-websocket-perl libcache-memcached-perl prometheus varnish haproxy python3-grpcio ffmpeg redis-server ngtcp2-client libcryptx-perl libnginx-mod-http-image-filter libgd-perl)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's dnsmasq starts a system DNS service on install; the tests run their own on a test
# port (tests/e2e/test_resolver.py), and a service holding port 53 is not wanted.
if [ -d /run/systemd/system ]; then
  systemctl disable --now dnsmasq >/dev/null 2>&1 || true
elif [ -f /run/dnsmasq/dnsmasq.pid ]; then
  kill "$(cat /run/dnsmasq/dnsmasq.pid)" 2>/dev/null || true
fi
# Debian's prometheus starts a service scraping the local host on install; the metrics tests
# run their own (tests/e2e/test_metrics.py) on a test port.
if [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true
elif [ -f /run/prometheus.pid ]; then
  kill "$(cat /run/prometheus.pid)" 2>/dev/null || true
fi

# Debian's varnish, haproxy and redis-server start services on install; the arena (cache,
# l4-proxy, s4-proxy) and the tests (test_limit_req_redis.py) run their own on free ports.
if [ -d /run/systemd/system ]; then
  systemctl disable --now varnish haproxy redis-server >/dev/null 2>&1 || true
fi

step "rust toolchain"
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (rustup) first" >&2
  exit 1
fi
rustup component add clippy rustfmt >/dev/null 2>&1 || true

step "cargo-deb (tests/e2e/test_package.py builds the Debian package with it)"
if ! command -v cargo-deb >/dev/null; then
  cargo install --locked -q cargo-deb --version '^3.8'
fi

step "python packages"
python3 -m pip install -q -e './arena[test]'
# Independent decoders for the compression tests.
python3 -m pip install -q brotli zstandard
# An HTTP/3 client for tests/e2e/test_http3.py (with ngtcp2-client's gtlsclient).
python3 -m pip install -q aioquic
# X.509 parsing and ECDSA signing for tests/e2e/test_acme_revoke.py and test_acme_redis.py.
python3 -m pip install -q cryptography

step "h2spec (HTTP/2 conformance; a Go module, for tests/e2e/test_http2.py)"
if ! command -v h2spec >/dev/null && [ ! -x "$HOME/go/bin/h2spec" ]; then
  if command -v go >/dev/null; then
    go install github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible
  else
    echo "go not found: the h2spec test will be skipped"
  fi
fi

step "jaeger (an OTLP receiver with a query API, for tests/e2e/test_otel.py)"
if ! command -v jaeger >/dev/null && [ ! -x "$HOME/go/bin/jaeger" ]; then
  if command -v go >/dev/null; then
    # Its go.mod has replace directives, so `go install pkg@version` refuses it: it is
    # built as a tool of a throwaway module, kept in the cache for the next run.
    tools="$HOME/.cache/gannet-tools/jaeger"
    mkdir -p "$tools"
    (cd "$tools" && { [ -f go.mod ] || go mod init gannet-tools/jaeger; } &&
      go get -tool github.com/jaegertracing/jaeger/cmd/jaeger@v1.76.0 &&
      GOBIN="$HOME/go/bin" go install github.com/jaegertracing/jaeger/cmd/jaeger)
  else
    echo "go not found: the OpenTelemetry tests will be skipped"
  fi
fi

step "pebble (Let's Encrypt's test ACME server; a Go module, for tests/e2e/test_acme.py)"
if ! command -v pebble >/dev/null && [ ! -x "$HOME/go/bin/pebble" ]; then
  if command -v go >/dev/null; then
    # Its own test certificates (the HTTPS listener's and their CA) are read by the tests
    # from the module cache this fills.
    go install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.3
  else
    echo "go not found: the ACME tests will be skipped"
  fi
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -q -- -D warnings

step "cargo test"
cargo test --workspace -q 2>&1 | tail -n 40

step "build the release binaries (gannet, and the arena's HTTP/3 load client)"
cargo build --release -p gannet -p h3load -q
export GANNET_BIN="$PWD/target/release/gannet"
export H3LOAD_BIN="$PWD/target/release/h3load"

step "Shakespeare app: PHP-FPM + MariaDB (study S1's dynamic workload)"
apps/shakespeare/setup.sh

# Three runs: each suite has its own conftest.py and import root.
step "end-to-end tests"
python3 -m pytest -q tests/e2e

step "arena tests (with a short benchmark smoke run)"
(cd arena && python3 -m pytest -q)

step "Shakespeare app tests (data, and every route through nginx and gannet)"
python3 -m pytest -q apps/shakespeare/tests
