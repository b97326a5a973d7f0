#!/usr/bin/env bash
# HTTPS and HTTP/2 side by side: gannet and Debian's nginx (one worker each, CPU 0) serving
# the same files with the same ECDSA P-256 certificate, TLS 1.2 + 1.3 (nginx 1.22 offers
# only up to 1.2 by default, so both configs name the versions), h2load on CPU 1.
# Usage: bash docs/bench/adhoc/tls/run.sh [rounds]   (works in /tmp/tlsbench)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rounds=${1:-3}
mkdir -p /tmp/tlsbench && cd /tmp/tlsbench
cp "$here"/bench.py "$here"/gannet.conf "$here"/nginx.conf "$here"/../robots/robots.txt .
[ -f cert.pem ] || openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout key.pem -out cert.pem -days 30 -subj /CN=localhost 2>/dev/null
[ -f rsacert.pem ] || openssl req -x509 -newkey rsa:2048 -nodes \
    -keyout rsakey.pem -out rsacert.pem -days 30 -subj /CN=localhost 2>/dev/null
[ -f img.jpg ] || head -c 394000 /dev/urandom > img.jpg
sed -i "s#@DIR@#$PWD#g" gannet.conf nginx.conf
# HTTP/2 over TLS, robots.txt, 100 connections x 10 streams.
python3 bench.py h2-robots-c100-m10 "$rounds" /robots.txt -c100 -m10 -n200000 -t1
# Handshakes: 2,000 connections of one request each (h2load does not resume sessions).
python3 bench.py handshake-h1-c2000 "$rounds" /robots.txt -c2000 -n2000 -t1 --h1
python3 bench.py handshake-h2-c2000 "$rounds" /robots.txt -c2000 -n2000 -t1
# The same with each server held to 30% of a CPU (bench.py's QUOTA), so that the server and
# not h2load is the limit: the servers' handshake capacity side by side.
QUOTA=30 python3 bench.py handshake-h1-c2000-q30 "$rounds" /robots.txt -c2000 -n2000 -t1 --h1
QUOTA=30 python3 bench.py handshake-h2-c2000-q30 "$rounds" /robots.txt -c2000 -n2000 -t1
# The study's 394 KB image over TLS, HTTP/1.1 and HTTP/2.
python3 bench.py img394k-h1-c10 "$rounds" /img.jpg -c10 -n6000 -t1 --h1
python3 bench.py img394k-h2-c10 "$rounds" /img.jpg -c10 -n6000 -t1
python3 bench.py img394k-h2-c100 "$rounds" /img.jpg -c100 -n6000 -t1
# Handshakes with an RSA-2048 certificate: the server's signature is then the costly side
# (with ECDSA the client's verification is, and h2load on one CPU limits the rate).
sed -i "s#$PWD/cert.pem#$PWD/rsacert.pem#; s#$PWD/key.pem#$PWD/rsakey.pem#" gannet.conf nginx.conf
python3 bench.py handshake-h1-rsa-c2000 "$rounds" /robots.txt -c2000 -n2000 -t1 --h1
python3 bench.py handshake-h2-rsa-c2000 "$rounds" /robots.txt -c2000 -n2000 -t1
QUOTA=50 python3 bench.py handshake-h1-rsa-c2000-q50 "$rounds" /robots.txt -c2000 -n2000 -t1 --h1
QUOTA=50 python3 bench.py handshake-h2-rsa-c2000-q50 "$rounds" /robots.txt -c2000 -n2000 -t1
