#!/bin/bash
# System calls per short session by name (perf's syscall tracepoints, every thread of the
# server), the reads that found the end (recv 0) or nothing (EAGAIN), the accepts that found
# nothing, the wake-ups the server's context made (sched_wakeup: mostly the back end and the
# client, woken by the bytes it sends), the packets sent in its context (net_dev_queue: its
# own and, over loopback, the peers' answers its softirqs make) and its CPU time (task-clock).
# N short sessions after 500 to warm up, server on CPU 0. Setup as measure.sh; QUOTA as where.sh.
# Usage: [QUOTA=P] bash cnt.sh gannet BINARY [N] [C] | bash cnt.sh nginx "" [N] [C] | haproxy ""
NAME=cnt
source "$(dirname "$0")/start.sh"
load() { sessions "$1" >/dev/null; }
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
