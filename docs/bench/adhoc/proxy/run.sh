#!/usr/bin/env bash
# Reverse proxy, side by side: gannet and nginx (CPU 0) in front of one nginx backend (CPU 1,
# beside wrk), both with kept upstream connections (nginx's recipe). Interleaved rounds.
# Usage: (cd docs/bench/adhoc/proxy && cp * ../robots/bench.py /tmp/pxbench/) then
#   cd /tmp/pxbench && bash run.sh [connections] [duration] [rounds]
set -euo pipefail
cd "$(dirname "$0")"
taskset -c 1 nginx -p "$PWD" -c "$PWD/backend.conf" & backend=$!
trap 'kill $backend' EXIT
sleep 0.5
SERVERS=gannet,nginx python3 bench.py /ad.json "${1:-100}" "${2:-5s}" "${3:-3}"
