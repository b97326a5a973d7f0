#!/bin/bash
# Sourced by cnt.sh and where.sh (NAME set to the script's): reads their arguments (WHO BIN
# N C), starts the server on CPU 0 (in a cgroup of its own limited to QUOTA % of one CPU if
# QUOTA is set), waits for its port and defines `sessions COUNT`: COUNT short sessions from
# wrk (at concurrency C, a new connection each, ~1 KB request and 1 KB answer), wrk's
# output on stdout.
set -u
cd /tmp/l4m
WHO=$1; BIN=${2:-}; N=${3:-5000}; C=${4:-10}
PAD="X-Pad: $(printf 'p%.0s' $(seq 1 950))"
CG=/sys/fs/cgroup/cpu/l4m-$NAME
case $WHO in
  gannet) PORT=19081; CMD=("$BIN" -c /tmp/l4m/gannet.conf) ;;
  nginx) PORT=19082; CMD=(/usr/sbin/nginx -c /tmp/l4m/nginx.conf) ;;
  haproxy) PORT=19083; CMD=(/usr/sbin/haproxy -db -f /tmp/l4m/haproxy.cfg) ;;
esac
if [ -n "${QUOTA:-}" ]; then
  mkdir -p $CG && echo 10000 > $CG/cpu.cfs_period_us && echo $((QUOTA * 100)) > $CG/cpu.cfs_quota_us
  taskset -c 0 sh -c 'echo $$ > '$CG'/cgroup.procs && exec "$@"' sh "${CMD[@]}" &
else
  taskset -c 0 "${CMD[@]}" &
fi
PID=$!
for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
sessions() { taskset -c 1 wrk -t 1 -c "$C" -d 60s --timeout 5s -s wrk_quota.lua -H "Connection: close" -H "$PAD" \
  "http://127.0.0.1:$PORT/1k.bin" -- "$1" "$C"; }
