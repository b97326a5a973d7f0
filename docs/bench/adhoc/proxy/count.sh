#!/bin/bash
# System calls (by kind, and those failing with EAGAIN), packets and wake-ups per proxied
# request under capacity.py's conditions: kept upstream connections (`keepalive 256`), 100
# keep-alive clients (h2load --h1 -c 100, a fixed number of requests), the proxy alone on
# CPU 0 in a cgroup v1 `cpu` group limited to QUOTA % of it (25, as capacity.py; 0: none),
# Debian's nginx as the back end (backend.conf, 97-byte JSON) on CPU 1 with the client.
# Counted, not timed: `perf stat` on the proxy's processes (tracepoints), so the rate the
# shared machine gives does not enter; only how many calls the proxy makes per request,
# which depends a little on how many events one wake-up finds (the quota batches them).
#
#   bash count.sh BINARY|nginx|haproxy LABEL [REQUESTS]
#
# BINARY is a gannet build (one worker, `master_process off`); nginx and HAProxy are
# Debian's, configured as capacity.py configures them. Environment: QUOTA (25), CONC (100),
# PORT (18141), WORK (/tmp/pxcount). Packets are `net:net_dev_xmit` in the proxy's context:
# on loopback every segment its sends make, the ACKs its receives send, and the ACKs the
# peers' sockets send while the proxy's send delivers to them (softirq on the sender).
set -u
B=$1; L=$2; N=${3:-50000}
HERE=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-/tmp/pxcount}; PORT=${PORT:-18141}; Q=${QUOTA:-25}; C=${CONC:-100}
mkdir -p "$W/www"; chmod 755 "$W" "$W/www"
cp "$HERE/ad.json" "$W/www/"
if ! curl -s -o /dev/null http://127.0.0.1:18090/ad.json; then
  sed -e 's#^pid .*#pid '"$W"'/backend.pid;#' -e 's#root \.;#root '"$W"'/www;#' "$HERE/backend.conf" > "$W/backend.conf"
  taskset -c 1 nginx -p "$W" -c "$W/backend.conf" > "$W/backend.log" 2>&1 &
  for _ in $(seq 1 50); do curl -s -o /dev/null http://127.0.0.1:18090/ad.json && break; sleep 0.1; done
fi
HTTP="access_log off; keepalive_requests 1000000;
  upstream backend { server 127.0.0.1:18090; keepalive 256; }
  server { listen 127.0.0.1:$PORT backlog=4096;
    location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
case $B in
haproxy)
  cat > "$W/$L.conf" <<EOF
global
    nbthread 1
    maxconn 4096
    pidfile $W/$L.pid
defaults
    mode http
    timeout connect 5s
    timeout client 65s
    timeout server 65s
    timeout http-keep-alive 65s
    http-reuse always
frontend web
    bind 127.0.0.1:$PORT
    backlog 4096
    default_backend origin
backend origin
    server origin 127.0.0.1:18090
EOF
  CMD="haproxy -db -f $W/$L.conf";;
nginx)
  echo "worker_processes 1; daemon off; pid $W/$L.pid; error_log $W/$L.err error;
events { worker_connections 4096; } http { $HTTP }" > "$W/$L.conf"
  CMD="nginx -p $W/ -c $W/$L.conf";;
*)
  echo "worker_processes 1; master_process off; pid $W/$L.pid; error_log $W/$L.err error;
events { worker_connections 4096; } http { $HTTP }" > "$W/$L.conf"
  CMD="$B -c $W/$L.conf";;
esac
G=/sys/fs/cgroup/cpu/pxcount-$L
if [ "$Q" != 0 ]; then
  mkdir -p "$G"; echo 10000 > "$G/cpu.cfs_period_us"; echo $((Q * 100)) > "$G/cpu.cfs_quota_us"
  sh -c "echo \$\$ > $G/cgroup.procs && exec taskset -c 0 $CMD" > "$W/$L.log" 2>&1 &
else
  sh -c "exec taskset -c 0 $CMD" > "$W/$L.log" 2>&1 &
fi
VP=$!
for _ in $(seq 1 100); do curl -s -o /dev/null "http://127.0.0.1:$PORT/ad.json" && break; sleep 0.1; done
# Warm-up: every client and upstream connection made, caches filled.
taskset -c 1 h2load --h1 -n 5000 -c "$C" "http://127.0.0.1:$PORT/ad.json" > /dev/null 2>&1
PIDS=$(echo $VP $(pgrep -P $VP) | tr ' ' ',')
EV='syscalls:sys_enter_*,context-switches,page-faults,net:net_dev_xmit,sched:sched_waking,ipi:ipi_send_cpu'
F=()
for s in recvfrom read readv recvmsg sendto write writev sendmsg; do
  F+=(-e "syscalls:sys_exit_$s" --filter 'ret == -11')
done
perf stat -e "$EV" "${F[@]}" -p "$PIDS" -o "$W/$L.perf.txt" &
PP=$!
sleep 2
taskset -c 1 h2load --h1 -n "$N" -c "$C" "http://127.0.0.1:$PORT/ad.json" | grep -E "^requests:|status codes"
kill -INT $PP; wait $PP
kill $VP; wait $VP 2>/dev/null
[ "$Q" != 0 ] && rmdir "$G" 2>/dev/null
awk -v n="$N" -v l="$L" '
  $1 ~ /^[0-9,]+$/ && $2 ~ /sys_enter/ {gsub(",","",$1); if ($1>0) {s+=$1; printf "  %-40s %.3f\n", $2, $1/n}}
  $1 ~ /^[0-9,]+$/ && $2 ~ /sys_exit/ {gsub(",","",$1); if ($1>0) {e+=$1; printf "  %-40s %.3f (EAGAIN)\n", $2, $1/n}}
  $1 ~ /^[0-9,]+$/ && $2 !~ /syscalls/ {gsub(",","",$1); o = o sprintf("  %-40s %.3f\n", $2, $1/n)}
  END {printf "%s system calls/request: %.3f, of them EAGAIN %.3f\n%s", l, s/n, e/n, o}' "$W/$L.perf.txt"
