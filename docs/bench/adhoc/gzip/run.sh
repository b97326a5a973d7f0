#!/usr/bin/env bash
# Compression side by side: gzip level 1 everywhere, wrk sending Accept-Encoding: gzip.
# Run from a copy in /tmp/gzbench (the configs use absolute paths there):
#   mkdir -p /tmp/gzbench/www /tmp/gzbench/logs && cp * ../robots/bench.py /tmp/gzbench/ && cd /tmp/gzbench && ./run.sh
set -euo pipefail
cd "$(dirname "$0")"
mv -f robots.txt page.html www/ 2>/dev/null || true

AE=(-H "Accept-Encoding: gzip")
python3 bench.py /robots.txt 100 5s 3 "${AE[@]}"
python3 bench.py /page.html 100 5s 3 "${AE[@]}"
