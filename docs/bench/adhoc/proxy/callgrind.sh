#!/bin/bash
# User-space instructions per proxied request, counted by callgrind: exact and repeatable where
# CPU time on this machine swings by several percent from run to run (for finding what to cut;
# claims are still made with the CPU times of robots/bench.py). Needs valgrind and h2load, the back end
# of run.sh running, and a build with line tables for per-line figures:
#   CARGO_PROFILE_RELEASE_DEBUG=line-tables-only RUSTFLAGS="-C force-frame-pointers=yes" \
#     CARGO_TARGET_DIR=/tmp/tgt-prof cargo build --release -p gannet
# Usage, from a folder holding this folder's files: bash callgrind.sh BINARY [REQUESTS]
# then: callgrind_annotate --inclusive=yes /tmp/cg.BINARY.out.1
B=$1; N=${2:-20000}; OUT=/tmp/cg.$(basename "$B").out
sed -e 's/18081/18110/' -e 's/gannet.pid/cg.pid/' gannet.conf > cg.conf
rm -f "$OUT"*
valgrind --tool=callgrind --callgrind-out-file="$OUT" "$B" -c "$PWD/cg.conf" > /tmp/cg.log 2>&1 &
VP=$!
for _ in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:18110/ad.json && break; sleep 0.2; done
callgrind_control -z $VP > /dev/null
taskset -c 1 h2load -n "$N" -c 10 --h1 http://127.0.0.1:18110/ad.json | grep -E "requests:|status codes"
callgrind_control -d $VP > /dev/null
kill $VP; wait $VP 2>/dev/null
total=$(grep -m1 '^summary:' "$OUT.1" | awk '{print $2}')
echo "user instructions per request: $((total / N))"
