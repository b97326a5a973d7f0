#!/usr/bin/env bash
# Cost per request of the arena's cache scenario, counted rather than timed (the machine is
# shared: wall-clock figures swing, counts over a fixed number of requests hardly do).
# server.conf is the scenario's config (one worker, the keys zone, the origin over kept
# connections) plus a second server with the same proxy_pass and no cache.
#
#   hit-c1000   every request a hit (the API's 360 URLs, each fetched once before), 1,000 kept
#               connections
#   hit-c100    the same at 100 connections
#   mix-c1000   the arena's 95 % point: every 20th request a URL never seen
#   miss-c10    every request a new URL (the upstream request, the entry stored), 10
#               connections (fewer than the upstream's 32 kept ones)
#   plain-c10   the same requests through the uncached proxy_pass
#   miss-c1, plain-c1  the same two one request at a time, 1 ms apart (wrk's delay(), so
#               that a request does not wait for the work left of the one before; only when
#               PHASES names them): with LATENCY=1, what a miss adds to an answer's wait
#
# Default: system calls (perf stat on the syscalls:sys_enter_* tracepoints), context
# switches and page faults of the worker process, its threads and the threads they start
# (tokio's blocking pool, gannet's cache manager; nginx's cache manager and loader are
# processes of their own, not counted), and the worker's resident memory after the phase
# (VmRSS). CALLGRIND=1: user-space instructions per request (valgrind's callgrind, every
# thread; `master_process off` so that the one process is the worker; fewer requests).
# Client: wrk with the arena's wrk_paths.lua (a fixed count, the paths in order) on CPU 1,
# the server on CPU 0; counts are divided by the answers wrk counted (wrk sends up to
# `connections` more, which the server may or may not have answered: N >> connections).
#
# CONTENT=php: the arena's other content, the Shakespeare app's 260 pages (HTML and JSON, as
# the app's PHP-FPM pool answers them: apps/shakespeare, run its setup.sh once) in place of
# the API's URLs; the origin passes them to the pool, as the arena's does.
#
# CACHESIM=1 (with CALLGRIND=1): callgrind's cache simulation too, set to this machine's L1d
# (48 KiB, 12-way) and L2 (1 MiB, 16-way, as its last level), as cost/measure.sh's `cache`
# mode: D1 and L2 misses per request, user space only.
#
# CPU=1: the worker's CPU time per request instead (`perf stat -e task-clock`, without the
# system-call tracepoints, which would weigh on the server making more calls). wrk phases only.
#
# PROFILE=1: where the worker's time goes instead (`perf record -e cpu-clock -g`, sampled, so
# kernel time is seen too): the samples by system call and part of the network stack
# (image/prof.py; its "user space" is every sample under no system call, page faults and
# interrupts too), the kernel's and user space's shares by symbol, and the top symbols by
# self time in $W/NAME.top. wrk phases only.
#
# WORK: the folder the run's files go in (default /tmp; the cache's entries are there). A
# miss's CPU depends on the file system: on an ext4 without a journal (this VM's root), a new
# file's inode skips every inode of its group freed in the last 1-6 minutes, reading each
# (the kernel's `recently_deleted`), so a run right after another's folder was removed paid
# 2-8x per miss, more and more from run to run. For misses, put WORK on a journaled file
# system (a loop-mounted ext4 image does).
#
# LATENCY=1: wrk's latency per phase instead (p50, p90, p99, mean), nothing attached to the
# server. wrk phases only.
#
# KEPT=1: kept connections only, as cost/measure.sh's KEPT=1 (cost/keeper.c over the phase's
# path file, in order): the phase's connections opened and given 3 answers each before the
# count starts, the load running on both sides of the counted window, so no accept or close
# is in the counts and c=100 and c=1,000 compare request for request. The counts are divided
# by the server's answers in the window: its calls of `sendto` and `writev` (gannet: one of
# them an answer) or `writev` (nginx: the head, then `sendfile` of the body); without
# CALLGRIND also the events per `epoll_wait` (its return values). hit and mix phases only.
#
# Usage: bash count.sh gannet|nginx [REQUESTS]   (GANNET_BIN overrides target/release/gannet;
#        PHASES="miss-c10 plain-c10" runs only those phases, each still after the warm-up)
# Output: one line per phase, then the system calls per request of each, in $W/NAME.calls
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../../.." && pwd)
SERVER=$1
N=${2:-50000}
CG=${CALLGRIND:-}
[ -n "$CG" ] && N=${2:-10000}
CONTENT=${CONTENT:-api}
KEPT=${KEPT:-}
SIM=()
[ -n "$CG" ] && [ -n "${CACHESIM:-}" ] && SIM=(--cache-sim=yes --D1=49152,12,64 --LL=1048576,16,64 --I1=32768,8,64)
W=${WORK:-/tmp}/cachecount.$SERVER.$CONTENT${CG:+.cg}${KEPT:+.kept}${PROFILE:+.prof}${CPU:+.cpu}
# PORTS (environment): the first of the three ports (the origin, the cache, the plain proxy).
ORIGIN=${PORTS:-18190} PORT=$((ORIGIN + 1)) PLAIN=$((ORIGIN + 2))
rm -rf "$W"
mkdir -p "$W"

PYTHONPATH=$REPO/arena python3 - "$W" "$N" "$CONTENT" <<'EOF'
import itertools, sys
from pathlib import Path
from arena import adtraffic, shakespeare
from arena.scenarios.cache import api_urls, with_misses
w, n, content = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
adtraffic.write_docroot(w / "www")
urls = [u.path for u in shakespeare.url_list()] if content == "php" else api_urls()
lines = n + 1000 + 1
(w / "hit.txt").write_text("\n".join(urls) + "\n")
(w / "mix.txt").write_text("\n".join(with_misses(urls, lines, "mix")) + "\n")
miss = [f"{u}{'&' if '?' in u else '?'}miss={i}" for i, u in zip(range(lines), itertools.cycle(urls))]
(w / "miss.txt").write_text("\n".join(miss) + "\n")
EOF

fill() {
    sed -e "s|@RUN@|$W|g" -e "s|@PORT@|$PORT|g" -e "s|@PLAIN@|$PLAIN|g" -e "s|@ORIGIN@|$ORIGIN|g" \
        -e "s|@FPM@|${SHAKESPEARE_FPM_SOCKET:-/run/php/shakespeare.sock}|g" \
        -e "s|@APP@|${SHAKESPEARE_DOCROOT:-/var/www/shakespeare}|g" "$1"
}
fill "$HERE/origin.conf" > "$W/origin.conf"
fill "$HERE/server.conf" > "$W/server.conf"
# Under valgrind: one process, and the descriptor limit valgrind leaves (it keeps some).
[ -n "$CG" ] && sed -i -e 's/^daemon off;/daemon off;\nmaster_process off;/' -e '/worker_rlimit_nofile/d' "$W/server.conf"

taskset -c 1 nginx -p "$W/" -c "$W/origin.conf" &
origin=$!
# The origin first: a server whose first request finds it not listening yet marks it down
# (max_fails) and answers 502 to the warm-up.
for _ in $(seq 1 300); do
    curl -s -o /dev/null "http://127.0.0.1:$ORIGIN/robots.txt" && break
    sleep 0.1
done
case $SERVER in
gannet) BIN=${GANNET_BIN:-$REPO/target/release/gannet} ;;
nginx) BIN=/usr/sbin/nginx ;;
*) echo "usage: $0 gannet|nginx [REQUESTS]" >&2; exit 2 ;;
esac
if [ -n "$CG" ]; then
    taskset -c 0 valgrind --tool=callgrind "${SIM[@]}" --callgrind-out-file="$W/cg.out" \
        "$BIN" -p "$W/" -c "$W/server.conf" > "$W/valgrind.log" 2>&1 &
else
    taskset -c 0 "$BIN" -p "$W/" -c "$W/server.conf" &
fi
master=$!
trap 'kill $master $origin 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 1 300); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/robots.txt" && break
    sleep 0.1
done
if [ -n "$CG" ]; then
    worker=$master
else
    worker=$(pgrep -P "$master" | head -1)
    [ "$SERVER" = nginx ] && worker=$(pgrep -P "$master" -f "worker process" | head -1)
fi

# Warm: each URL once (and a page), as the arena does before its rounds.
PYTHONPATH=$REPO/arena python3 - "$W/hit.txt" "$PORT" <<'EOF'
import http.client, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[2]))
for path in open(sys.argv[1]).read().split():
    for _ in range(2):
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        assert r.status == 200, (path, r.status)
EOF

# The answers' system calls (KEPT=1 divides by their count in the window).
case $SERVER in
gannet) ANSWERS='sendto|send|writev' ;;
nginx) ANSWERS='writev' ;;
esac

# KEPT=1: the phase's count over kept connections only (see the top).
kept() {
    local name=$1 port=$2 conns=$3 paths=$4 line start stop
    [ -x "$W/keeper" ] || gcc -O2 -o "$W/keeper" "$REPO/docs/bench/adhoc/cost/keeper.c"
    if [ -n "$CG" ]; then
        start="callgrind_control -z $worker > /dev/null"
        stop="callgrind_control -d $name $worker > /dev/null"
    else
        # Attached disabled, enabled and disabled through control FIFOs when the window
        # opens and closes (attaching takes seconds; enabling does not).
        rm -f "$W"/ctl.* "$W"/ack.* && mkfifo "$W/ctl.s" "$W/ctl.r" "$W/ack.s" "$W/ack.r"
        perf stat -x, -e 'syscalls:sys_enter_*' -e context-switches,page-faults -D -1 \
            --control "fifo:$W/ctl.s,$W/ack.s" -p "$worker" -o "$W/$name.perf" &
        local pp=$!
        perf record -e syscalls:sys_exit_epoll_wait -D -1 --control "fifo:$W/ctl.r,$W/ack.r" \
            -p "$worker" -o "$W/$name.ev.data" 2> /dev/null &
        local pr=$!
        ctl() { for k in s r; do echo "$1" > "$W/ctl.$k"; read -r _ < "$W/ack.$k"; done; }
        start="ctl enable"
        stop="ctl disable"
        # Attaching perf to the worker's threads takes a while on a loaded machine.
        sleep 3
    fi
    coproc KP { taskset -c 1 "$W/keeper" 127.0.0.1 "$port" "@$W/$paths" "$conns" "$N" 2> "$W/$name.keeper"; }
    echo go >&"${KP[1]}"
    read -r line <&"${KP[0]}" || true
    [ "$line" = ready ] || { echo "keeper: $line $(cat "$W/$name.keeper")"; return 1; }
    eval "$start"
    read -r line <&"${KP[0]}"
    eval "$stop"
    echo stop >&"${KP[1]}"
    wait "$KP_PID"
    local keeper=$line
    if [ -n "$CG" ]; then
        local f
        f=$(ls -t "$W"/cg.out.* | head -1)
        awk -v name="$name" -v f="$f" -v keeper="$keeper" -v answers="^(__libc_)?($ANSWERS)\$" '
            /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
            /^summary:/ { for (i = 2; i <= NF; i++) sum[i - 1] += $i }
            /^c?fn=\([0-9]+\) / { id = $1; sub(/^c?fn=/, "", id); nm[id] = $2 }
            /^cfn=/ { id = $1; sub(/^cfn=/, "", id); target = nm[id] }
            /^calls=/ { if (target ~ answers) { c = $1; sub(/calls=/, "", c); d += c } }
            END {
                printf "%-10s %7d answers (keeper: %s)  %9.0f instructions/request", name, d, keeper, sum[col["Ir"]] / d
                if ("D1mr" in col) printf "  D1 misses %.1f (read %.1f, write %.1f)  L2 misses %.1f (read %.1f, write %.1f)  I1 misses %.1f",
                    (sum[col["D1mr"]] + sum[col["D1mw"]]) / d, sum[col["D1mr"]] / d, sum[col["D1mw"]] / d,
                    (sum[col["DLmr"]] + sum[col["DLmw"]]) / d, sum[col["DLmr"]] / d, sum[col["DLmw"]] / d, sum[col["I1mr"]] / d
                printf "  (%s)\n", f
            }' "$f"
        return
    fi
    kill -INT "$pp" "$pr"
    wait "$pp" "$pr" || true
    local answered
    answered=$(awk -F, -v a="^syscalls:sys_enter_($ANSWERS)\$" '$3 ~ a { s += $1 } END { print s + 0 }' "$W/$name.perf")
    local events
    # Each return value in hex ("0xa"); an error's (-EINTR) is huge and left out.
    events=$(perf script -i "$W/$name.ev.data" -F trace 2> /dev/null | awk '
        { h = tolower($NF); sub(/^0x/, "", h); r = 0
          for (i = 1; i <= length(h); i++) r = r * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
          if (length(h) < 8) { c++; e += r } }
        END { if (c) printf "%.1f", e / c }')
    rm -f "$W"/ctl.* "$W"/ack.* "$W/$name.ev.data"
    calls "$name" "$answered" "keeper: $keeper; epoll_wait events a call: $events"
}

# The system calls of a phase per answer, into $W/NAME.calls, and its line.
calls() {
    local name=$1 answered=$2 note=${3:-}
    awk -F, -v n="$answered" '$1 ~ /^[0-9]+$/ && $1 > 0 {
            name = $3; sub(/^syscalls:sys_enter_/, "", name)
            if (name == "context-switches") cs = $1
            else if (name == "page-faults") pf = $1
            else { total += $1; print name, $1 / n }
        }
        END { printf "TOTAL %.3f\nCS %.3f\nPF %.3f\n", total / n, cs / n, pf / n }' "$W/$name.perf" |
        sort -k2 -g -r > "$W/$name.calls"
    printf '%-10s %7d answers  %6.2f syscalls  %6.3f context switches  %6.3f page faults /request  %s KiB RSS  %s\n' \
        "$name" "$answered" "$(awk '$1=="TOTAL"{print $2}' "$W/$name.calls")" \
        "$(awk '$1=="CS"{print $2}' "$W/$name.calls")" "$(awk '$1=="PF"{print $2}' "$W/$name.calls")" \
        "$(awk '$1=="VmRSS:"{print $2}' "/proc/$worker/status")" "$note"
}

phase() {
    local name=$1 port=$2 conns=$3 paths=$4
    case " ${PHASES:-hit-c1000 hit-c100 mix-c1000 miss-c10 plain-c10} " in *" $name "*) ;; *) return 0 ;; esac
    if [ -n "$KEPT" ]; then
        case $name in hit-* | mix-*) kept "$@" ;; esac
        return 0
    fi
    local script=$REPO/arena/arena/clients/wrk_paths.lua
    if [ "$conns" = 1 ]; then
        printf 'dofile("%s")\nfunction delay() return 1 end\n' "$script" > "$W/paced.lua"
        script=$W/paced.lua
    fi
    local client=(taskset -c 1 wrk -t 1 -c "$conns" -d 600s --timeout 10s
        -s "$script" "http://127.0.0.1:$port/" -- "$N" "$conns" "$W/$paths")
    if [ -n "$CG" ]; then
        callgrind_control -z "$worker" > /dev/null
        "${client[@]}" > "$W/$name.wrk"
        callgrind_control -d "$name" "$worker" > /dev/null
    elif [ -n "${LATENCY:-}" ]; then
        "${client[@]}" > "$W/$name.wrk"
    elif [ -n "${PROFILE:-}" ]; then
        perf record -e cpu-clock -F 4000 -g -p "$worker" -o "$W/$name.prof" -- "${client[@]}" > "$W/$name.wrk" 2> /dev/null
    elif [ -n "${CPU:-}" ]; then
        perf stat -x, -o "$W/$name.perf" -e task-clock,context-switches -p "$worker" -- "${client[@]}" > "$W/$name.wrk"
    else
        perf stat -x, -o "$W/$name.perf" -e 'syscalls:sys_enter_*' -e context-switches,page-faults \
            -p "$worker" -- "${client[@]}" > "$W/$name.wrk"
    fi
    local answered
    answered=$(grep -o '"requests": [0-9]*' "$W/$name.wrk" | grep -o '[0-9]*$')
    if [ -n "$CG" ]; then
        local f
        f=$(ls -t "$W"/cg.out.* | head -1)
        local ir
        ir=$(grep -m1 '^summary:' "$f" | awk '{print $2}')
        printf '%-10s %7d answers  %9.0f instructions/request  (%s)\n' "$name" "$answered" \
            "$(awk -v a="$ir" -v b="$answered" 'BEGIN { print a / b }')" "$f"
    elif [ -n "${LATENCY:-}" ]; then
        grep -o '"latency_us": {[^}]*}' "$W/$name.wrk" | sed "s/^/$(printf '%-10s %7d answers  ' "$name" "$answered")/"
    elif [ -n "${PROFILE:-}" ]; then
        echo "$name: $answered answers"
        perf script -i "$W/$name.prof" -F ip,sym 2> /dev/null | python3 "$HERE/../image/prof.py" "$answered"
        perf report -i "$W/$name.prof" --no-children --sort sym --stdio 2> /dev/null | grep -E '^ +[0-9]' > "$W/$name.syms" || true
        awk '{ sub(/%/, "", $1); if ($2 == "[k]") k += $1; else u += $1 }
            END { printf "  by symbol: kernel %.1f%%, user space %.1f%%\n", k, u }' "$W/$name.syms"
        awk '{ p = $1; sub(/%/, "", p) } p >= 0.7' "$W/$name.syms" > "$W/$name.top"
        echo "  top symbols (self): $W/$name.top"
    elif [ -n "${CPU:-}" ]; then
        awk -F, -v n="$answered" -v name="$name" '$3 ~ /task-clock/ { ms = $1 } $3 ~ /context-switches/ { cs = $1 }
            END { printf "%-10s %7d answers  %7.1f us CPU/request  %6.3f context switches/request\n", name, n, 1000 * ms / n, cs / n }' "$W/$name.perf"
    else
        calls "$name" "$answered"
    fi
}

phase hit-c1000 "$PORT" 1000 hit.txt
phase hit-c100 "$PORT" 100 hit.txt
phase mix-c1000 "$PORT" 1000 mix.txt
phase miss-c10 "$PORT" 10 miss.txt
phase plain-c10 "$PLAIN" 10 miss.txt
phase miss-c1 "$PORT" 1 miss.txt
phase plain-c1 "$PLAIN" 1 miss.txt
echo "per phase, each system call per request: $W/*.calls"
