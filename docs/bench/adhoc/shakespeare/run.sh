#!/bin/bash
# gannet and nginx in front of the Shakespeare app's PHP-FPM pool (apps/shakespeare/setup.sh
# must have run), one worker each on CPU 0, wrk on CPU 1 cycling the app's URL list, rounds
# interleaved; prints req/s and server CPU seconds per 10k requests (utime + stime of the
# server's processes, and each alone). With `strace` as last argument, also counts each
# server's system calls over 3 s of load (strace slows the server: those req/s mean nothing);
# with `perf`, counts per request (perf stat over 5 s of load, little slowed): system calls,
# epoll_wait calls, context switches, and the microseconds the server's worker was on a CPU.
# With KEEP=1 both keep their FastCGI connections (gannet-keep.conf, nginx-keep.conf: 16 each,
# gannet's bounded with max_conns and a queue; nginx's only while idle, which is safe here
# because wrk's connections stay below the pool's children).
# usage: mkdir -p /tmp/dynprof && cp docs/bench/adhoc/shakespeare/* /tmp/dynprof/ && [KEEP=1] /tmp/dynprof/run.sh ROUNDS SECONDS CONNECTIONS [strace|perf]
R=${1:-3}; D=${2:-8}; C=${3:-10}
V=${KEEP:+-keep}
cd /tmp/dynprof || exit 1
# The arena's URL mix (the front page; per work the work, its first act, that act's first scene).
[ -s paths.txt ] || (cd /work/main/arena && python3 -c "
from pathlib import Path
from arena import shakespeare
shakespeare.write_urls(shakespeare.url_list(), Path('/tmp/dynprof/paths.txt'))") || exit 1
# As in the arena: PHP-FPM and MariaDB share CPU 0 with the server (undone at exit).
tier=$(pgrep -f "php-fpm|mariadbd")
for p in $tier; do taskset -a -p -c 0 "$p" >/dev/null; done
taskset -c 0 /work/main/target/release/gannet -c /tmp/dynprof/gannet$V.conf -p /tmp/dynprof/ &
taskset -c 0 nginx -c /tmp/dynprof/nginx$V.conf -p /tmp/dynprof/ 2>/dev/null
trap 'kill $(cat /tmp/dynprof/gannet.pid /tmp/dynprof/nginx.pid) 2>/dev/null; for p in $tier; do taskset -a -p -c 0,1 "$p" >/dev/null; done' EXIT
for _ in $(seq 50); do [ -s gannet.pid ] && [ -s nginx.pid ] && break; sleep 0.1; done
# cpu PID: clock ticks used by PID and its children, in user mode and in the kernel
cpu() { local u=0 s=0 p; for p in $1 $(pgrep -P "$1"); do set -- $(cut -d' ' -f14,15 "/proc/$p/stat"); u=$((u + $1)); s=$((s + $2)); done; echo "$u $s"; }
# per10k TICKS: seconds per 10k of the round's $n requests
per10k() { echo "scale=3; $1 * 100 / $n" | bc; }
for r in $(seq "$R"); do
  for s in gannet:65201 nginx:65202; do
    name=${s%:*}; port=${s#*:}; pid=$(cat $name.pid)
    read -r ua sa < <(cpu "$pid")
    out=$(taskset -c 1 wrk -t1 -c"$C" -d"${D}s" -s cycle.lua "http://127.0.0.1:$port/" 2>&1)
    read -r ub sb < <(cpu "$pid")
    n=$(echo "$out" | awk '/requests in/{print $1}')
    echo "$name round $r: $(echo "$out" | awk '/Requests\/sec/{print $2}') req/s," \
      "$(per10k $((ub + sb - ua - sa))) CPU s/10k (user $(per10k $((ub - ua))), kernel $(per10k $((sb - sa))))" \
      "$(echo "$out" | grep -E 'Non-2xx|Socket errors' | tr '\n' ' ')"
  done
done
if [ "$4" = strace ]; then
  for s in gannet:65201 nginx:65202; do
    name=${s%:*}; port=${s#*:}; pid=$(cat $name.pid)
    [ $name = nginx ] && pid=$(pgrep -P "$pid")
    timeout 5 strace -c -f -p "$pid" -o strace-$name.txt 2>/dev/null & tracer=$!
    sleep 0.5 # strace attaching: a head start, not a synchronisation the figures rely on
    n=$(taskset -c 1 wrk -t1 -c"$C" -d3s -s cycle.lua "http://127.0.0.1:$port/" | awk '/requests in/{print $1}')
    wait $tracer
    echo "$name: $(awk '/total/{print $4}' strace-$name.txt) system calls for $n requests"
  done
fi
if [ "$4" = perf ]; then
  events=raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,context-switches,task-clock
  for s in gannet:65201 nginx:65202; do
    name=${s%:*}; port=${s#*:}; pid=$(cat $name.pid)
    [ $name = nginx ] && pid=$(pgrep -P "$pid")
    perf stat -x, -e "$events" -p "$pid" -o perf-$name.txt & counter=$!
    n=$(taskset -c 1 wrk -t1 -c"$C" -d5s -s cycle.lua "http://127.0.0.1:$port/" | awk '/requests in/{print $1}')
    kill -INT $counter; wait $counter
    # -x, lines: value,unit,event,...; task-clock is in milliseconds, shown in microseconds
    echo "$name, per request over $n: $(awk -F, -v n="$n" '$1 ~ /^[0-9.]+$/ {
      if ($3 == "task-clock") printf "on-CPU %.1f us  ", $1 * 1000 / n; else printf "%s %.2f  ", $3, $1 / n }' perf-$name.txt)"
  done
fi
