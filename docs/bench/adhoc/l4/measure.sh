#!/bin/bash
# System calls and context switches per session of a stream proxy (perf's tracepoints, then
# strace -c for the breakdown), N short sessions (connect, ~1 KB request, 1 KB answer, close)
# from wrk at concurrency C. Setup, from this folder: mkdir -p /tmp/l4m/www && cp * /tmp/l4m/
#   && cp ../../../../arena/arena/clients/wrk_quota.lua /tmp/l4m/ && head -c 1024 /dev/urandom
#   > /tmp/l4m/www/1k.bin && taskset -c 1 nginx -c /tmp/l4m/backend.conf &
# Usage: bash measure.sh gannet BINARY [N] [C] | bash measure.sh nginx "" [N] [C] | haproxy ""
set -u
cd /tmp/l4m
WHO=$1; BIN=${2:-}; N=${3:-2000}; C=${4:-10}
PAD="X-Pad: $(printf 'p%.0s' $(seq 1 950))"
case $WHO in
  gannet) PORT=19081; taskset -c 0 "$BIN" -c /tmp/l4m/gannet.conf & ;;
  nginx) PORT=19082; taskset -c 0 /usr/sbin/nginx -c /tmp/l4m/nginx.conf & ;;
  haproxy) PORT=19083; taskset -c 0 /usr/sbin/haproxy -db -f /tmp/l4m/haproxy.cfg & ;;
esac
PID=$!
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
load() { taskset -c 1 wrk -t 1 -c "$C" -d 60s --timeout 5s -s wrk_quota.lua -H "Connection: close" -H "$PAD" \
  "http://127.0.0.1:$PORT/1k.bin" -- "$1" "$C" | grep -E "ARENA-JSON" | sed 's/.*"requests":\([0-9]*\).*"errors":\({[^}]*}\).*/requests \1 errors \2/'; }
load 500 >/dev/null
perf stat -e raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_recvfrom,syscalls:sys_enter_getsockopt,syscalls:sys_enter_accept4,context-switches,cpu-migrations,task-clock -p $PID -o /tmp/l4m/perf.$WHO.txt &
PP=$!; sleep 0.5
load "$N"
kill -INT $PP; wait $PP
awk -v n="$N" '/syscalls|context-switches|cpu-migrations/ {gsub(",","",$1); printf "%-28s %10d  per session %.2f\n", $2, $1, $1/n}' /tmp/l4m/perf.$WHO.txt
strace -c -f -p $PID -o /tmp/l4m/strace.$WHO.txt &
SP=$!; sleep 1
load "$N"
kill -INT $SP; wait $SP
awk -v n="$N" '/^ *[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9]+/ {c=$4; name=$NF; if (NF==6) c=$4; printf "%-16s %8d  per session %.2f\n", name, c, c/n}' /tmp/l4m/strace.$WHO.txt
kill $PID; wait $PID 2>/dev/null
