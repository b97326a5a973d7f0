#!/bin/bash
# Cost per request, deterministically (no wall-clock benchmark): user-space instructions per
# request under callgrind, or system calls per request from the syscall tracepoints, over a
# fixed number of HTTP/1.1 keep-alive requests (h2load --h1, 10 connections). The server has
# CPU 0, the client CPU 1. See docs/bench/cost-per-request.md.
#
# Usage (from anywhere; needs valgrind, h2load, perf, nginx for the proxy's back end, gcc for
# the floor):
#   bash measure.sh BINARY|floor LABEL PATH [REQUESTS] [cg|sys]
# PATH: /robots.txt (static) or /px/ad.json (proxied to the back end, started here).
# BINARY "floor" is arena/arena/servers/floor.c (built on first use): recv + send only;
# "nginx" is Debian's nginx with the same gannet.conf (`daemon off` added); "haproxy" is
# Debian's HAProxy with haproxy.cfg (one thread, `http-reuse always`, no log); "lighttpd" and
# "h2o" are Debian's with lighttpd.conf and h2o.conf (the arena's tuned profiles, static files
# only, no access log: LOG does not apply to them).
# LOG=off (environment) turns gannet's and nginx's access log off, as the arena's tuned
# profile has it (HAProxy logs nothing either way).
# WORK and PORT (environment) change the scratch folder and the port (default /tmp/cost, 18120).
# HEADERS (environment, one "Name: value" a line) adds request fields, e.g. a browser's.
# CLOSE=1 (environment): a new connection per request ("Connection: close", closer.c, built
# on first use) instead of h2load's kept ones: the counts are then per connection. CONC
# (environment): the connections at a time (10).
set -u
B=$1; L=$2; P=$3; N=${4:-20000}; MODE=${5:-cg}
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../../.." && pwd)
W=${WORK:-/tmp/cost}; PORT=${PORT:-18120}
mkdir -p "$W/www"
cp "$HERE/../robots/robots.txt" "$HERE/../proxy/ad.json" "$W/www/"
H=()
while IFS= read -r h; do [ -n "$h" ] && H+=(-H "$h"); done <<< "${HEADERS:-}"
fill() {
  sed -e "s#WORK#$W#g" -e "s#PORT#$PORT#g" -e "s#MIME#$REPO/conf/mime.types#g" "$1" |
    if [ "${LOG:-on}" = off ]; then sed -e "s#^\( *access_log\) .*#\1 off;#"; else cat; fi
}
# The counted load: N requests, kept connections (h2load) or one connection each (closer).
load() {
  if [ "${CLOSE:-}" = 1 ]; then
    [ -x "$W/closer" ] || gcc -O2 -o "$W/closer" "$HERE/closer.c"
    taskset -c 1 "$W/closer" 127.0.0.1 $PORT "$P" "$N" "${CONC:-10}"
  else
    taskset -c 1 h2load --h1 -n "$N" -c "${CONC:-10}" "${H[@]}" "http://127.0.0.1:$PORT$P" | grep -E "^requests:|status codes"
  fi
}
if [[ $P == /px/* ]] && ! curl -s -o /dev/null http://127.0.0.1:18090/ad.json; then
  fill "$HERE/backend.conf" > "$W/backend.conf"
  taskset -c 1 nginx -p "$W" -c "$W/backend.conf" > "$W/backend.log" 2>&1 &
  for _ in $(seq 1 50); do curl -s -o /dev/null http://127.0.0.1:18090/ad.json && break; sleep 0.1; done
fi
if [ "$B" = floor ]; then
  [ -x "$W/floor" ] || gcc -O2 -o "$W/floor" "$REPO/arena/arena/servers/floor.c"
  CMD=("$W/floor" 127.0.0.1 $PORT "$W/www")
elif [ "$B" = haproxy ]; then
  fill "$HERE/haproxy.cfg" > "$W/$L.conf"
  CMD=(haproxy -db -f "$W/$L.conf")
elif [ "$B" = lighttpd ]; then
  fill "$HERE/lighttpd.conf" > "$W/$L.conf"
  CMD=(lighttpd -D -f "$W/$L.conf")
elif [ "$B" = h2o ]; then
  fill "$HERE/h2o.conf" > "$W/$L.conf"
  CMD=(h2o -m worker -c "$W/$L.conf")
elif [ "$B" = nginx ]; then
  fill "$HERE/gannet.conf" > "$W/$L.conf"
  CMD=(nginx -p "$W" -g "daemon off;" -c "$W/$L.conf")
else
  fill "$HERE/gannet.conf" > "$W/$L.conf"
  CMD=("$B" -c "$W/$L.conf")
fi
rm -f "$W/$PORT.access.log" "$W"/cg."$L".*
if [ "$MODE" = cg ]; then
  taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$W/cg.$L.%p" "${CMD[@]}" > "$W/$L.vg.log" 2>&1 &
else
  taskset -c 0 "${CMD[@]}" > "$W/$L.log" 2>&1 &
fi
VP=$!
for _ in $(seq 1 150); do curl -s -o /dev/null "http://127.0.0.1:$PORT$P" && break; sleep 0.2; done
# Warm-up: the open file cache, the upstream connections.
taskset -c 1 h2load --h1 -n 200 -c 10 "http://127.0.0.1:$PORT$P" > /dev/null 2>&1
if [ "$MODE" = cg ]; then
  # Only this server's process (other valgrind runs on the machine are left alone).
  if [ "$B" = floor ]; then ME="$W/floor "; else ME="$W/$L.conf"; fi
  PIDS=$(pgrep -f "valgrind.bin.*$ME" | tr '\n' ' ')
  for p in $PIDS; do callgrind_control -z "$p" > /dev/null; done
  load
  for p in $PIDS; do callgrind_control -d "$p" > /dev/null; done
  kill $VP; wait $VP 2>/dev/null
  # The dump taken at the end of the run (suffix .1), not the one written at exit.
  total=0
  for f in "$W"/cg."$L".*.1; do
    t=$(grep -m1 '^summary:' "$f" | awk '{print $2}'); total=$((total + ${t:-0}))
  done
  echo "$L $P user instructions/request: $((total / N))"
else
  # The process that serves (gannet with `master_process off`, or the floor).
  if [ "$B" = floor ]; then WP=$VP; else WP=$(pgrep -n -f "$W/$L.conf"); fi
  # Besides the system calls: the process's context switches (each sleep in epoll_wait and
  # wake-up) and the packets sent from its context (on loopback, every segment the server
  # sends: data, FIN, ACKs it sends itself), and its page faults (memory the kernel hands it
  # again after a free gave it back).
  perf stat -e 'syscalls:sys_enter_*,context-switches,page-faults,net:net_dev_xmit' -p "$WP" -o "$W/$L.perf.txt" &
  PP=$!
  # perf stat takes a while to attach on a loaded machine: counts start after it has.
  sleep 2
  load
  kill -INT $PP; wait $PP
  kill $VP; wait $VP 2>/dev/null
  awk -v n="$N" -v l="$L" '$1 ~ /^[0-9,]+$/ && $2 ~ /syscalls/ {gsub(",","",$1); if ($1>0) {s+=$1; printf "  %-40s %.3f\n", $2, $1/n}}
    $1 ~ /^[0-9,]+$/ && $2 !~ /syscalls/ {gsub(",","",$1); o = o sprintf("  %-40s %.3f\n", $2, $1/n)}
    END {printf "%s system calls/request: %.3f\n%s", l, s/n, o}' "$W/$L.perf.txt"
fi
