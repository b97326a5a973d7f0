#!/bin/bash
# Where a stream proxy's CPU goes per short session, counted over a fixed number of
# sessions rather than timed (the machine has no PMU: no cycles or cache-miss counters):
# - perf stat on the server's process (all its threads): task-clock (exact CPU time), page
#   faults, context switches, migrations, system calls, softirqs run in its context;
# - perf record of the software cpu-clock (an hrtimer every 50 us of the server's CPU
#   time, not tied to the 4 ms tick that /proc's utime/stime sample): the samples' split
#   between user space and the kernel, per thread and per symbol.
# N short sessions (connect, ~1 KB request, 1 KB answer, close) from wrk at concurrency C
# after 500 to warm up, server on CPU 0, back end and client on CPU 1. Setup as measure.sh.
# QUOTA=25 runs the server in a cgroup (v1 cpu) of its own limited to 25 % of one CPU in 10 ms
# periods, as the arena's --server-quota 25: the event loop then serves its sessions in
# batches, as in the arena's runs, which changes the per-session system calls and wake-ups.
# Usage: [QUOTA=P] bash where.sh gannet BINARY [N] [C] | bash where.sh nginx "" [N] [C] | haproxy ""
NAME=where
source "$(dirname "$0")/start.sh"
load() { sessions "$1" | grep -E "ARENA-JSON" | sed 's/.*"requests":\([0-9]*\).*"errors":\({[^}]*}\).*/requests \1 errors \2/'; }
load 500 >/dev/null
perf stat -e task-clock,page-faults,context-switches,cpu-migrations,raw_syscalls:sys_enter,irq:softirq_entry,sched:sched_wakeup \
  -p $PID -o /tmp/l4m/stat.$WHO.txt &
SP=$!
perf record -q -e cpu-clock -c 50000 -p $PID -o /tmp/l4m/rec.$WHO.data 2>/dev/null &
RP=$!
sleep 0.5
# /proc's utime and stime (ticks, what the arena's kernel column reads) around the load.
ticks() { awk '{sub(/.*\) /, ""); print $12, $13}' /proc/$PID/stat; }
T0=$(ticks)
load "$N"
T1=$(ticks)
kill -INT $SP $RP; wait $SP $RP 2>/dev/null
echo "$T0 $T1" | awk -v n="$N" -v hz="$(getconf CLK_TCK)" '{u=$3-$1; s=$4-$2; printf "utime %d ticks, stime %d ticks: user %.1f%%, per session %.2f us user, %.2f us kernel (ticks)\n", u, s, 100*u/(u+s), u*1e6/hz/n, s*1e6/hz/n}'
awk -v n="$N" '/task-clock/ {gsub(",","",$1); printf "%-28s %10.1f ms  per session %.2f us\n", "task-clock", $1, $1*1000/n}
  /page-faults|context-switches|cpu-migrations|sys_enter|softirq_entry|sched_wakeup/ {gsub(",","",$1); printf "%-28s %10d  per session %.3f\n", $2, $1, $1/n}' /tmp/l4m/stat.$WHO.txt
# The split: samples in the kernel ([k]) and in user space, and the user ones by symbol.
perf script -i /tmp/l4m/rec.$WHO.data -F ip 2>/dev/null | awk -v n="$N" '{m = ($1 ~ /^ffff/) ? "kernel" : "user"; c[m]++; t++}
  END {for (m in c) printf "%-8s %6d samples (%.1f%%)  ~%.2f us per session\n", m, c[m], 100*c[m]/t, c[m]*50/n}'
perf report -i /tmp/l4m/rec.$WHO.data --stdio --sort sym 2>/dev/null | grep -E '^ +[0-9].*\[\.\]' | head -30
kill $PID; wait $PID 2>/dev/null
[ -n "${QUOTA:-}" ] && rmdir $CG 2>/dev/null
