#!/usr/bin/env bash
# Profile-guided build of gannet: the release build, laid out by what a server does most.
#
#   scripts/build-pgo.sh            # -> target/pgo/gannet (cargo profile `pgo`)
#   scripts/build-pgo.sh --train BIN    # only the training load, against BIN (checks it)
#
# Three steps: an instrumented build (`-Cprofile-generate`, in target/pgo-gen), a training
# load against it, then the build with the counts (`-Cprofile-use`, cargo profile `pgo`,
# which inherits `release`). LLVM then places the hot paths together and the cold ones
# apart and inlines where the counts say: 1.05-1.23x the plain release build's requests per
# CPU-second in the arena under a CPU quota (robots.txt, cache hits and 95 % mixes;
# docs/bench/README.md, "The profile-guided build").
# `packaging/build-deb.sh --profile pgo` packages it.
#
# The training is self-contained: one gannet process (`master_process off`, so that it writes
# its counts when it exits) serving static files (small ones on kept and new connections, a
# page at 1,000 connections, an image), proxying to a server block of its own over kept
# connections, caching those answers (hits, and misses on new keys), the same over TLS with
# HTTP/1.1 and HTTP/2; wrk and h2load (nghttp2-client) drive it. Code it does not reach is
# laid out as cold: a workload it leaves out may lose. FCGI=unix:/path/to.sock adds a
# FastCGI location (SCRIPT_FILENAME from FCGI_SCRIPT, default /var/www/html/index.php).
# Needs: cargo, rustup (for llvm-tools' llvm-profdata), wrk, h2load, openssl, curl.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

# The training's folder and server, removed and stopped however the script ends.
w="" g=""
trap 'if [ -n "$g" ]; then kill "$g" 2> /dev/null || true; fi; [ -z "$w" ] || rm -rf "$w"' EXIT

# One load of the training: `load NAME COMMAND...` runs wrk or h2load and prints NAME's
# count; a load with no answers or one not 2xx sets the caller's `failed`.
load() {
  local name=$1 out n
  shift
  out=$("$@" 2>&1) || true
  n=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p; s/^requests: \([0-9]*\) total.*/\1/p' <<< "$out" | head -1)
  if [ -z "$n" ] || [ "$n" = 0 ] || grep -qE 'Non-2xx|[1-9][0-9]* (failed|errored|[45]xx)' <<< "$out"; then
    echo "build-pgo.sh: $name: $(tail -5 <<< "$out")" >&2
    failed=1
  fi
  echo "$name: ${n:-0} requests"
}

# The training load against $1; fails if an answer is not 2xx or a load got none.
train() {
  local bin=$1 ps pt po
  w=$(mktemp -d /tmp/gannet-pgo.XXXXXX)
  read -r ps pt po < <(python3 -c '
import socket
s = [socket.socket() for _ in range(3)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
  mkdir -p "$w/www" "$w/origin/api"
  head -c 204 /dev/urandom | base64 -w 60 | head -c 204 > "$w/www/robots.txt"
  head -c 2100 /dev/urandom | base64 -w 76 > "$w/www/index.html"
  head -c 400000 /dev/urandom > "$w/www/image.jpg"
  for i in $(seq 0 49); do
    printf '{"id": %d, "ad": "%s"}\n' "$i" "$(head -c 600 /dev/urandom | base64 -w 0)" > "$w/origin/api/$i.json"
  done
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost -keyout "$w/key.pem" \
    -out "$w/cert.pem" 2> /dev/null
  local fcgi=""
  if [ -n "${FCGI:-}" ]; then
    fcgi="location /fcgi/ { include $repo/conf/fastcgi_params;
      fastcgi_param SCRIPT_FILENAME ${FCGI_SCRIPT:-/var/www/html/index.php};
      fastcgi_param SCRIPT_NAME /index.php; fastcgi_param REQUEST_URI /; fastcgi_pass $FCGI; }"
  fi
  cat > "$w/gannet.conf" <<EOF
worker_processes 1;
master_process off;
daemon off;
pid $w/gannet.pid;
error_log $w/error.log;
events { worker_connections 4096; }
http {
    include $repo/conf/mime.types;
    access_log off;
    sendfile on;
    tcp_nopush on;
    open_file_cache max=1000;
    keepalive_requests 1000000;
    proxy_cache_path $w/cache levels=1:2 keys_zone=train:10m use_temp_path=off;
    upstream origin { server 127.0.0.1:$po; keepalive 16; }
    server {
        listen 127.0.0.1:$ps backlog=4096 deferred;
        listen 127.0.0.1:$pt ssl;
        http2 on;
        ssl_certificate $w/cert.pem;
        ssl_certificate_key $w/key.pem;
        root $w/www;
        location /logged/ { alias $w/www/; access_log $w/access.log; }
        location /proxy/ {
            proxy_pass http://origin/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
        location /cache/ {
            proxy_pass http://origin/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache train;
            proxy_cache_valid 200 10m;
        }
        $fcgi
    }
    server { listen 127.0.0.1:$po; root $w/origin; default_type application/json; }
}
EOF
  cat > "$w/hits.lua" <<'EOF'
n = 0
request = function() n = n + 1; return wrk.format("GET", "/cache/api/" .. (n % 50) .. ".json") end
EOF
  cat > "$w/misses.lua" <<'EOF'
n = 0
request = function() n = n + 1; return wrk.format("GET", "/cache/api/" .. (n % 50) .. ".json?k=" .. n) end
EOF
  "$bin" -c "$w/gannet.conf" &
  g=$!
  local up=""
  for _ in $(seq 1 100); do
    curl -sf -o /dev/null "http://127.0.0.1:$ps/robots.txt" && { up=1; break; }
    sleep 0.1
  done
  [ -n "$up" ] || { echo "build-pgo.sh: gannet did not start: $(cat "$w/error.log")" >&2; return 1; }
  local http="http://127.0.0.1:$ps" https="https://127.0.0.1:$pt" failed=0
  load "static keep-alive" wrk -t1 -c100 -d3s "$http/robots.txt"
  load "static c=1000" wrk -t1 -c1000 -d3s "$http/index.html"
  load "static new connections" wrk -t1 -c50 -d2s -H "Connection: close" "$http/robots.txt"
  load "static image" wrk -t1 -c10 -d2s "$http/image.jpg"
  load "static logged" wrk -t1 -c50 -d2s "$http/logged/index.html"
  load "proxy" wrk -t1 -c100 -d3s "$http/proxy/api/1.json"
  load "cache misses" wrk -t1 -c10 -d3s -s "$w/misses.lua" "$http"
  load "cache hits" wrk -t1 -c100 -d3s -s "$w/hits.lua" "$http"
  load "cache hits c=1000" wrk -t1 -c1000 -d3s -s "$w/hits.lua" "$http"
  load "TLS" wrk -t1 -c50 -d3s "$https/index.html"
  load "HTTP/2" h2load -n 30000 -c 10 -m 10 "$https/robots.txt"
  load "HTTP/2 cache" h2load -n 20000 -c 10 -m 10 "$https/cache/api/7.json"
  [ -z "$fcgi" ] || load "FastCGI" wrk -t1 -c20 -d3s "$http/fcgi/"
  kill -TERM "$g"
  wait "$g" || { echo "build-pgo.sh: gannet exited with $?" >&2; return 1; }
  g=""
  return "$failed"
}

if [ "${1:-}" = --train ]; then
  train "$2"
  exit
fi

cd "$repo"
sysroot=$(rustc --print sysroot)
host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$sysroot/lib/rustlib/$host/bin/llvm-profdata"
[ -x "$profdata" ] || rustup component add llvm-tools-preview
raw="$repo/target/pgo-gen/profiles"
rm -rf "$raw"
RUSTFLAGS="-Cprofile-generate=$raw" cargo build --release -p gannet --target-dir target/pgo-gen
# The training's counts alone (the build scripts built above write theirs in $raw too).
LLVM_PROFILE_FILE="$raw/train-%m.profraw" train target/pgo-gen/release/gannet
"$profdata" merge -o target/pgo-gen/gannet.profdata "$raw"/train-*.profraw
RUSTFLAGS="-Cprofile-use=$repo/target/pgo-gen/gannet.profdata" cargo build --profile pgo -p gannet
echo "$repo/target/pgo/gannet"
