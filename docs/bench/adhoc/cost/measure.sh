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
# CONF (environment): another gannet/nginx config in this folder than gannet.conf, e.g.
# gannet-small-static.conf (the arena's small-static run as it is: `location / { }`, no log).
# WORK and PORT (environment) change the scratch folder and the port (default /tmp/cost, 18120).
# HEADERS (environment, one "Name: value" a line) adds request fields, e.g. a browser's.
# CLOSE=1 (environment): a new connection per request ("Connection: close", closer.c, built
# on first use) instead of h2load's kept ones: the counts are then per connection. CONC
# (environment): the connections at a time (10).
# KEPT=1 (environment): kept connections only ([keeper.c](keeper.c), built on first use): CONC
# connections opened and warmed up (3 answers each) before the count starts, the load running
# on both sides of the counted window, and the counts divided by the server's own answers in
# the window (its `send`/`sendto` calls: one per answer for gannet and the floor), so accepts
# and closes are out and CONC=100 and CONC=1000 compare request for request. In this mode
# MODE may also be `cache`: callgrind with its cache simulation, this machine's L1d (48 KiB,
# 12-way) and L2 (1 MiB, 16-way, as callgrind's last level), user space only; and `sys` adds
# the `epoll_wait` calls' events (their return values, `syscalls:sys_exit_epoll_wait`).
# IDLE=N (environment): N more connections, each answered once and then held idle for the
# whole count ([idle.py](idle.py)), as the arena's c10k holds its 10,000 (gannet parks them
# after a second); the config's worker_connections becomes 20,000 (this machine's fd cap).
set -u
WC=()
if [ -n "${IDLE:-}" ]; then
  ulimit -n 20000
  WC=(-e "s#worker_connections [0-9]*#worker_connections 20000#")
fi
B=$1; L=$2; P=$3; N=${4:-20000}; MODE=${5:-cg}
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../../.." && pwd)
W=${WORK:-/tmp/cost}; PORT=${PORT:-18120}
mkdir -p "$W/www"
cp "$HERE/../robots/robots.txt" "$HERE/../proxy/ad.json" "$W/www/"
H=()
while IFS= read -r h; do [ -n "$h" ] && H+=(-H "$h"); done <<< "${HEADERS:-}"
fill() {
  sed -e "s#WORK#$W#g" -e "s#PORT#$PORT#g" -e "s#MIME#$REPO/conf/mime.types#g" "${WC[@]}" "$1" |
    if [ "${LOG:-on}" = off ]; then sed -e "s#^\( *access_log\) .*#\1 off;#"; else cat; fi
}
# KEPT=1: the keeper runs until told to stop; `window START END` runs START when N requests
# are about to be counted and END once they are.
window() {
  [ -x "$W/keeper" ] || gcc -O2 -o "$W/keeper" "$HERE/keeper.c"
  coproc KP { taskset -c 1 "$W/keeper" 127.0.0.1 $PORT "$P" "${CONC:-10}" "$N"; }
  local line
  echo go >&"${KP[1]}"
  read -r line <&"${KP[0]}"; [ "$line" = ready ] || { echo "keeper: $line"; return 1; }
  eval "$1"
  read -r line <&"${KP[0]}"; echo "keeper: $line"
  eval "$2"
  echo stop >&"${KP[1]}"; wait "$KP_PID"
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
  fill "$HERE/${CONF:-gannet.conf}" > "$W/$L.conf"
  CMD=(nginx -p "$W" -g "daemon off;" -c "$W/$L.conf")
else
  fill "$HERE/${CONF:-gannet.conf}" > "$W/$L.conf"
  CMD=("$B" -c "$W/$L.conf")
fi
rm -f "$W/$PORT.access.log" "$W"/cg."$L".*
SIM=()
[ "$MODE" = cache ] && SIM=(--cache-sim=yes --D1=49152,12,64 --LL=1048576,16,64 --I1=32768,8,64)
if [ "$MODE" = cg ] || [ "$MODE" = cache ]; then
  taskset -c 0 valgrind --tool=callgrind "${SIM[@]}" --callgrind-out-file="$W/cg.$L.%p" "${CMD[@]}" > "$W/$L.vg.log" 2>&1 &
else
  taskset -c 0 "${CMD[@]}" > "$W/$L.log" 2>&1 &
fi
VP=$!
for _ in $(seq 1 150); do curl -s -o /dev/null "http://127.0.0.1:$PORT$P" && break; sleep 0.2; done
# Warm-up: the open file cache, the upstream connections.
taskset -c 1 h2load --h1 -n 200 -c 10 "http://127.0.0.1:$PORT$P" > /dev/null 2>&1
if [ -n "${IDLE:-}" ]; then
  taskset -c 1 python3 "$HERE/idle.py" 127.0.0.1 $PORT "$P" "$IDLE" > "$W/idle.out" 2>&1 &
  IP=$!
  trap 'kill $IP 2>/dev/null' EXIT
  for _ in $(seq 1 600); do grep -q ready "$W/idle.out" && break; sleep 0.2; done
  cat "$W/idle.out"
  sleep 2  # past gannet's PARK_AFTER (1 s): the held connections are parked
fi
if [ "$MODE" = cg ] || [ "$MODE" = cache ]; then
  # Only this server's process (other valgrind runs on the machine are left alone).
  if [ "$B" = floor ]; then ME="$W/floor "; else ME="$W/$L.conf"; fi
  PIDS=$(pgrep -f "valgrind.bin.*$ME" | tr '\n' ' ')
  ZERO='for p in $PIDS; do callgrind_control -z "$p" > /dev/null; done'
  DUMP='for p in $PIDS; do callgrind_control -d "$p" > /dev/null; done'
  if [ "${KEPT:-}" = 1 ]; then window "$ZERO" "$DUMP"; else eval "$ZERO"; load; eval "$DUMP"; fi
  kill $VP; wait $VP 2>/dev/null
  # The dump taken at the end of the run (suffix .1), not the one written at exit. With
  # KEPT=1 the answers are the calls of libc's send/sendto in the window.
  cat "$W"/cg."$L".*.1 | awk -v n="$N" -v l="$L" -v p="$P" -v kept="${KEPT:-}" '
    /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
    /^summary:/ { for (i = 2; i <= NF; i++) sum[i - 1] += $i }
    /^c?fn=\([0-9]+\) / { id = $1; sub(/^c?fn=/, "", id); nm = $2; name[id] = nm }
    /^cfn=/ { id = $1; sub(/^cfn=/, "", id); target = name[id] }
    /^calls=/ { if (target ~ /^(__libc_)?send(to)?$/) { c = $1; sub(/calls=/, "", c); sends += c } }
    END {
      d = kept == 1 ? sends : n
      printf "%s %s user instructions/request: %d (over %d answers)\n", l, p, sum[col["Ir"]] / d, d
      if ("D1mr" in col) printf "  D1 misses/request: %.1f (read %.1f, write %.1f); L2 (LL) misses/request: %.1f (read %.1f, write %.1f); I1 misses %.1f\n",
        (sum[col["D1mr"]] + sum[col["D1mw"]]) / d, sum[col["D1mr"]] / d, sum[col["D1mw"]] / d,
        (sum[col["DLmr"]] + sum[col["DLmw"]]) / d, sum[col["DLmr"]] / d, sum[col["DLmw"]] / d, sum[col["I1mr"]] / d
    }' 
else
  # The process that serves (gannet with `master_process off`, or the floor).
  if [ "$B" = floor ]; then WP=$VP; else WP=$(pgrep -n -f "$W/$L.conf"); fi
  # Besides the system calls: the process's context switches (each sleep in epoll_wait and
  # wake-up) and the packets sent from its context (on loopback, every segment the server
  # sends: data, FIN, ACKs it sends itself), and its page faults (memory the kernel hands it
  # again after a free gave it back).
  EVENTS='syscalls:sys_enter_*,context-switches,page-faults,net:net_dev_xmit'
  if [ "${KEPT:-}" = 1 ]; then
    # Attached disabled, enabled and disabled through control FIFOs when the window opens
    # and closes (attaching takes seconds; enabling does not).
    rm -f "$W"/ctl.* && mkfifo "$W/ctl.s" "$W/ctl.r" "$W/ack.s" "$W/ack.r"
    perf stat -e "$EVENTS" -D -1 --control "fifo:$W/ctl.s,$W/ack.s" -p "$WP" -o "$W/$L.perf.txt" &
    PP=$!
    perf record -e syscalls:sys_exit_epoll_wait -D -1 --control "fifo:$W/ctl.r,$W/ack.r" -p "$WP" -o "$W/$L.ev.data" 2> /dev/null &
    PR=$!
    sleep 3
    ctl() { for k in s r; do echo "$1" > "$W/ctl.$k"; read -r _ < "$W/ack.$k"; done; }
    window "ctl enable" "ctl disable"
    kill -INT $PP $PR; wait $PP $PR
    # The answers in the window: the server's send/sendto calls.
    N=$(awk '$2 ~ /sys_enter_sendto$|sys_enter_send$/ {gsub(",","",$1); s+=$1} END {print s+0}' "$W/$L.perf.txt")
    # Each return value in hex ("0xa"); an error's (-EINTR) is huge and left out.
    perf script -i "$W/$L.ev.data" -F trace 2> /dev/null | awk -v n="$N" '
      {h = tolower($NF); sub(/^0x/, "", h); r = 0
       for (i = 1; i <= length(h); i++) r = r * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
       if (length(h) < 8) {c++; e += r}}
      END {if (c) printf "  epoll_wait: %d calls, %.1f events a call, %.3f calls/request (over %d answers)\n", c, e / c, c / n, n}'
    rm -f "$W"/ctl.* "$W"/ack.* "$W/$L.ev.data"
  else
    perf stat -e "$EVENTS" -p "$WP" -o "$W/$L.perf.txt" &
    PP=$!
    # perf stat takes a while to attach on a loaded machine: counts start after it has.
    sleep 2
    load
    kill -INT $PP; wait $PP
  fi
  kill $VP; wait $VP 2>/dev/null
  awk -v n="$N" -v l="$L" '$1 ~ /^[0-9,]+$/ && $2 ~ /syscalls/ {gsub(",","",$1); if ($1>0) {s+=$1; printf "  %-40s %.3f\n", $2, $1/n}}
    $1 ~ /^[0-9,]+$/ && $2 !~ /syscalls/ {gsub(",","",$1); o = o sprintf("  %-40s %.3f\n", $2, $1/n)}
    END {printf "%s system calls/request: %.3f\n%s", l, s/n, o}' "$W/$L.perf.txt"
fi
