#!/bin/bash
# User-space instructions per stream session (callgrind, exact and repeatable):
#   bash cg.sh BINARY [N] [C]   (setup as measure.sh; for nginx: replace the gannet command
#   line by "/usr/sbin/nginx -c /tmp/l4m/nginx.conf" and port 19081 by 19082)
set -u
cd /tmp/l4m
B=$1; N=${2:-2000}; C=${3:-10}; OUT=/tmp/l4m/cg.out
PAD="X-Pad: $(printf 'p%.0s' $(seq 1 950))"
rm -f $OUT*
valgrind --tool=callgrind --callgrind-out-file=$OUT "$B" -c /tmp/l4m/gannet.conf > /tmp/l4m/cg.log 2>&1 &
VP=$!
for _ in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/19081) 2>/dev/null && break; sleep 0.2; done
load() { taskset -c 1 wrk -t 1 -c "$C" -d 120s --timeout 10s -s wrk_quota.lua -H "Connection: close" -H "$PAD" \
  "http://127.0.0.1:19081/1k.bin" -- "$1" "$C" | grep -E "ARENA-JSON|errors|requests in"; }
load 200
callgrind_control -z $VP > /dev/null
load "$N"
callgrind_control -d $VP > /dev/null
kill $VP; wait $VP 2>/dev/null
f=$OUT.1
total=$(grep -m1 '^summary:' "$f" | awk '{print $2}')
[ -z "$total" ] && total=$(grep -m1 '^totals:' "$f" | awk '{print $2}')
echo "user instructions per session: $((total / N))  ($f)"
