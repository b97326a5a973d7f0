#!/bin/bash
# System calls per short session by name (perf's syscall tracepoints, every thread of the
# server), the reads that found the end (recv 0) or nothing (EAGAIN), the accepts that found
# nothing, the wake-ups the server's context made (sched_wakeup: mostly the back end and the
# client, woken by the bytes it sends), the packets sent in its context (net_dev_queue: its
# own and, over loopback, the peers' answers its softirqs make) and its CPU time (task-clock).
# N short sessions after 500 to warm up, server on CPU 0. Setup as measure.sh; QUOTA as where.sh.
# Usage: [QUOTA=P] bash cnt.sh gannet BINARY [N] [C] | bash cnt.sh nginx "" [N] [C] | haproxy ""
set -u
cd /tmp/l4m
WHO=$1; BIN=${2:-}; N=${3:-5000}; C=${4:-10}
PAD="X-Pad: $(printf 'p%.0s' $(seq 1 950))"
CG=/sys/fs/cgroup/cpu/l4m-cnt
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
load() { taskset -c 1 wrk -t 1 -c "$C" -d 60s --timeout 5s -s wrk_quota.lua -H "Connection: close" -H "$PAD" \
  "http://127.0.0.1:$PORT/1k.bin" -- "$1" "$C" >/dev/null; }
load 500
EV=task-clock,raw_syscalls:sys_enter,sched:sched_wakeup,context-switches,net:net_dev_queue
for s in accept4 epoll_wait epoll_pwait epoll_ctl recvfrom sendto writev readv read write close connect socket getsockopt setsockopt ioctl clock_gettime shutdown; do EV=$EV,syscalls:sys_enter_$s; done
perf stat -e $EV -e syscalls:sys_exit_recvfrom --filter "ret == 0" -e syscalls:sys_exit_recvfrom --filter "ret == -11" -e syscalls:sys_exit_accept4 --filter "ret == -11" -p $PID -o /tmp/l4m/cnt.$WHO.txt &
SP=$!; sleep 0.5
load "$N"
kill -INT $SP; wait $SP
kill $PID; wait $PID 2>/dev/null
[ -n "${QUOTA:-}" ] && rmdir $CG 2>/dev/null
# The filtered exits come last, in the order given: recv 0, recv EAGAIN, accept4 EAGAIN.
awk -v n="$N" 'BEGIN {split("recv=0 recv=EAGAIN accept4=EAGAIN", ex)}
  /task-clock/ {gsub(",","",$1); printf "cpu %.1fus ", $1*1000/n}
  /sys_enter|sys_exit|wakeup|context|net_dev_queue/ {gsub(",","",$1); name=$2; sub(/.*sys_enter_?/, "", name); sub(/sched:sched_/, "", name); sub(/net:net_dev_queue/, "packets", name);
    if (name ~ /sys_exit/) name=ex[++k]; if (name=="") name="ALL"; if ($1 > 0) printf "%s %.2f ", name, $1/n}
  END {print ""}' /tmp/l4m/cnt.$WHO.txt
