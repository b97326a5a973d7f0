#!/bin/bash
# User-space instructions per stream session (callgrind, exact and repeatable), N short
# sessions (connect, ~1 KB request, 1 KB answer, close) from wrk at concurrency C, after 200
# to warm up. Setup as measure.sh.
# Usage: bash cg.sh gannet BINARY [N] [C] | bash cg.sh nginx "" [N] [C] | bash cg.sh haproxy "" [N] [C]
# then: callgrind_annotate --inclusive=yes /tmp/l4m/cg.WHO.out.1
set -u
cd /tmp/l4m
WHO=$1; B=${2:-}; N=${3:-2000}; C=${4:-10}; OUT=/tmp/l4m/cg.$WHO.out
PAD="X-Pad: $(printf 'p%.0s' $(seq 1 950))"
case $WHO in
  gannet) PORT=19081; CMD=("$B" -c /tmp/l4m/gannet.conf) ;;
  nginx) PORT=19082; CMD=(/usr/sbin/nginx -c /tmp/l4m/nginx.conf) ;;
  haproxy) PORT=19083; CMD=(/usr/sbin/haproxy -db -f /tmp/l4m/haproxy.cfg) ;;
esac
rm -f $OUT*
taskset -c 0 valgrind --tool=callgrind --callgrind-out-file=$OUT "${CMD[@]}" > /tmp/l4m/cg.log 2>&1 &
VP=$!
for _ in $(seq 1 200); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.2; done
load() { taskset -c 1 wrk -t 1 -c "$C" -d 120s --timeout 10s -s wrk_quota.lua -H "Connection: close" -H "$PAD" \
  "http://127.0.0.1:$PORT/1k.bin" -- "$1" "$C" | grep -E "ARENA-JSON|errors|requests in"; }
load 200 > /dev/null
callgrind_control -z $VP > /dev/null
load "$N"
callgrind_control -d $VP > /dev/null
kill $VP; wait $VP 2>/dev/null
f=$(ls -S $OUT.* 2>/dev/null | head -1)
total=$(grep -h '^summary:' $OUT.* 2>/dev/null | awk '{s+=$2} END {print s}')
echo "$WHO user instructions per session: $((total / N))  ($f)"
