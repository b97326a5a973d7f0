#!/bin/bash
# FastCGI cost per request of the web server alone, counted (no wall clock): user-space
# instructions per request under callgrind, or system calls per request from the syscall
# tracepoints (and the context switches), over a fixed number of HTTP/1.1 keep-alive requests (h2load --h1, 10
# connections, after 200 to warm up). The method of ../cost/measure.sh: one process serves
# (`master_process off`), on CPU 0; h2load and PHP-FPM run on CPU 1 and PHP-FPM's work is not
# counted. See docs/bench/cost-per-request.md (FastCGI).
#
# Usage: bash count.sh BINARY|nginx LABEL keep|new hello|s1 [REQUESTS] [cg|sys]
#   keep: `fastcgi_keep_conn on` and an upstream with `keepalive 4` (gannet's also
#         `max_conns=4` and a queue: the arena's tuned gannet, docs/bench/adhoc/fastcgi/gannet.conf)
#   new:  `fastcgi_pass unix:...`, a new connection per request (the arena's nginx)
#   hello: hello.php from a pool of 16 children started here (php-fpm8.2; it stays up for the
#         next run: kill "$(cat /tmp/fcgicount/fpm.pid)" when done)
#   s1:   the arena's s1-dynamic mix (260 URLs of the Shakespeare app, HTML and JSON,
#         `try_files` to the front controller); apps/shakespeare/setup.sh must have run (its
#         PHP-FPM and MariaDB are moved to CPU 1 while this runs)
# Needs valgrind (cg), perf (sys), h2load. Each server gets its own fastcgi_params (gannet's
# conf/, Debian's /etc/nginx/), as in the arena.
set -u
B=$1; L=$2; MODE=$3; WL=$4; N=${5:-10000}; HOW=${6:-cg}
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../../.." && pwd)
W=${WORK:-/tmp/fcgicount}; PORT=${PORT:-18130}
mkdir -p "$W/www"
if [ "$WL" = hello ]; then
  cp "$HERE/hello.php" "$W/www/"
  ROOT=$W/www; SOCK=$W/php.sock; URL=(-i "$W/hello.txt"); LOC=""
  echo "http://127.0.0.1:$PORT/hello.php" > "$W/hello.txt"
  if [ ! -S "$SOCK" ] || ! pgrep -f "php-fpm.*$W/fpm.conf" > /dev/null; then
    printf '[global]\npid = %s/fpm.pid\nerror_log = %s/fpm.log\ndaemonize = no\n[cnt]\nlisten = %s\nlisten.mode = 0666\npm = static\npm.max_children = 16\n' \
      "$W" "$W" "$SOCK" > "$W/fpm.conf"
    taskset -c 1 php-fpm8.2 -F -R -y "$W/fpm.conf" > /dev/null 2>&1 &
    for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done
  fi
else
  ROOT=/var/www/shakespeare; SOCK=/run/php/shakespeare.sock
  LOC='location / { try_files $uri $uri/ /index.php?$args; }'
  [ -s "$W/s1.txt" ] || (cd "$REPO/arena" && python3 -c "
from pathlib import Path
from arena import shakespeare
shakespeare.write_urls(shakespeare.url_list(), Path('$W/s1.txt'), 'http://127.0.0.1:$PORT')") || exit 1
  URL=(-i "$W/s1.txt")
  tier=$(pgrep -f "php-fpm|mariadbd")
  for p in $tier; do taskset -a -p -c 1 "$p" > /dev/null; done
  trap 'for p in $tier; do taskset -a -p -c 0,1 "$p" > /dev/null 2>&1; done' EXIT
fi
if [ "$B" = nginx ]; then
  PARAMS=/etc/nginx/fastcgi_params; MIME=/etc/nginx/mime.types; UP="server unix:$SOCK;"
else
  PARAMS=$REPO/conf/fastcgi_params; MIME=$REPO/conf/mime.types; UP="server unix:$SOCK max_conns=4;"
  [ "$MODE" = keep ] && UP="$UP queue 65536 timeout=60s;"
fi
if [ "$MODE" = keep ]; then
  HTTP="upstream php_pool { $UP keepalive 4; }"; PASS="fastcgi_pass php_pool; fastcgi_keep_conn on;"
else
  HTTP=""; PASS="fastcgi_pass unix:$SOCK;"
fi
cat > "$W/$L.conf" << EOF
worker_processes 1;
pid $W/$L.pid;
error_log $W/$L.error.log;
events { worker_connections 4096; }
http {
    include $MIME;
    default_type application/octet-stream;
    sendfile on; tcp_nopush on; tcp_nodelay on;
    keepalive_timeout 65; keepalive_requests 1000000;
    open_file_cache max=1000 inactive=60s; open_file_cache_valid 30s; open_file_cache_errors on;
    access_log off;
    $HTTP
    server {
        listen 127.0.0.1:$PORT backlog=4096 deferred;
        server_name localhost;
        root $ROOT;
        index index.php;
        $LOC
        location ~ \.php\$ {
            include $PARAMS;
            fastcgi_param SCRIPT_FILENAME \$document_root\$fastcgi_script_name;
            $PASS
        }
    }
}
EOF
# One process serves (nginx's development mode), so that callgrind's controls reach it.
if [ "$B" = nginx ]; then
  CMD=(nginx -p "$W" -c "$W/$L.conf" -g "daemon off; master_process off;")
else
  sed -i '1a master_process off;' "$W/$L.conf"
  CMD=("$B" -c "$W/$L.conf")
fi
rm -f "$W"/cg."$L".*
if [ "$HOW" = cg ]; then
  taskset -c 0 valgrind --tool=callgrind --callgrind-out-file="$W/cg.$L.%p" "${CMD[@]}" > "$W/$L.vg.log" 2>&1 &
else
  taskset -c 0 "${CMD[@]}" > "$W/$L.log" 2>&1 &
fi
VP=$!
FIRST=$(head -1 "${URL[1]}")
for _ in $(seq 1 150); do curl -s -o /dev/null "$FIRST" && break; sleep 0.2; done
# Warm-up: PHP's opcache, the open file cache, the kept connections.
taskset -c 1 h2load --h1 -n 520 -c 10 "${URL[@]}" > /dev/null 2>&1
if [ "$HOW" = cg ]; then
  PIDS=$(pgrep -f "valgrind.bin.*$W/$L.conf" | tr '\n' ' ')
  for p in $PIDS; do callgrind_control -z "$p" > /dev/null 2>&1; done
  taskset -c 1 h2load --h1 -n "$N" -c 10 "${URL[@]}" | grep -E "^requests:|status codes"
  for p in $PIDS; do callgrind_control -d "$p" > /dev/null 2>&1; done
  kill $VP; wait $VP 2>/dev/null
  # The dump taken at the end of the run (suffix .1), not the one written at exit.
  total=0
  for f in "$W"/cg."$L".*.1; do
    t=$(grep -m1 '^summary:' "$f" | awk '{print $2}'); total=$((total + ${t:-0}))
  done
  echo "$L $MODE $WL user instructions/request: $((total / N))"
else
  WP=$(pgrep -n -f "$W/$L.conf")
  perf stat -e 'syscalls:sys_enter_*' -e context-switches -p "$WP" -o "$W/$L.perf.txt" &
  PP=$!
  sleep 0.5
  taskset -c 1 h2load --h1 -n "$N" -c 10 "${URL[@]}" | grep -E "^requests:|status codes"
  kill -INT $PP; wait $PP
  kill $VP; wait $VP 2>/dev/null
  awk -v n="$N" -v l="$L $MODE $WL" '$1 ~ /^[0-9,]+$/ && $2 ~ /syscalls/ {gsub(",","",$1); if ($1>0) {s+=$1; printf "  %-40s %.3f\n", $2, $1/n}} $1 ~ /^[0-9,]+$/ && $2 == "context-switches" {gsub(",","",$1); printf "  %-40s %.3f\n", $2, $1/n} END {printf "%s system calls/request: %.3f\n", l, s/n}' "$W/$L.perf.txt"
fi
