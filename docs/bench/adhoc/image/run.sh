#!/usr/bin/env bash
# The 394 KB image side by side: gannet, nginx and lighttpd (one worker each on CPU 0, wrk on
# CPU 1, robots/bench.py's interleaved rounds), first with tcp_nopush off (nginx's default:
# nginx then sends each response head in a packet of its own), then on (the arena's tuned
# profile). lighttpd has no such switch.
# Usage: bash docs/bench/adhoc/image/run.sh [connections] [rounds]   (works in /tmp/imgbench)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
conns=${1:-100}
rounds=${2:-3}
mkdir -p /tmp/imgbench/www /tmp/imgbench/logs && cd /tmp/imgbench
[ -f www/img.jpg ] || head -c 403456 /dev/urandom > www/img.jpg
for nopush in off on; do
    for f in gannet nginx lighttpd; do
        sed "s#/tmp/bench#/tmp/imgbench#g" "$here/../robots/$f.conf" > "$f.conf"
    done
    sed -i "s/sendfile on;/sendfile on; tcp_nopush $nopush;/" gannet.conf nginx.conf
    echo "== tcp_nopush $nopush, c=$conns"
    SERVERS=gannet,nginx,lighttpd python3 "$here/../robots/bench.py" /img.jpg "$conns" 5s "$rounds"
done
