#!/bin/bash
# The 394 KB image on kept connections, counted per answer (no wall clock): the serving
# process's system calls by type, context switches, packets it transmits, task-clock and
# its cpu-clock samples by kernel symbol; what each sendfile took and how many found the
# socket full (EAGAIN: an EPOLLOUT wake-up to come); then, in a second window, the packets on
# lo and their sizes (tcpdump). Load: ../cost/keeper.c (CONC kept connections, warmed up,
# closed loop, counted between its "ready" and "done"), server on CPU 0, keeper on CPU 1.
# See docs/bench/cost-per-request.md, section "Branch imgka".
#
# Usage: bash count.sh BINARY|nginx|lighttpd LABEL [CONC] [REQUESTS]
# BINARY is a gannet; nginx and lighttpd are Debian's, from ../cost's configs (the arena's
# tuned profiles; access logs off). WORK and PORT (environment): scratch folder and port
# (/tmp/imgcount, 18130). NOPCAP=1 skips the tcpdump window; NOPROF=1 the cpu-clock samples.
# CPU=1: task-clock and context switches only (no tracepoints, samples or capture, which
# cost the server time of their own), for interleaved rounds of CPU time per answer: a hint
# on a shared machine, not a result.
set -u
B=$1; L=$2; CONC=${3:-10}; N=${4:-20000}
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../../.." && pwd); COST=$HERE/../cost
W=${WORK:-/tmp/imgcount}; PORT=${PORT:-18130}
mkdir -p "$W/www"
[ -f "$W/www/img.jpg" ] || head -c 403456 /dev/urandom > "$W/www/img.jpg"
[ -x "$W/keeper" ] || gcc -O2 -o "$W/keeper" "$COST/keeper.c"
fill() {
  sed -e "s#WORK#$W#g" -e "s#PORT#$PORT#g" -e "s#MIME#$REPO/conf/mime.types#g" \
      -e "s#^\( *access_log\) .*#\1 off;#" "$1"
}
case $B in
  lighttpd) fill "$COST/lighttpd.conf" > "$W/$L.conf"; CMD=(lighttpd -D -f "$W/$L.conf") ;;
  nginx) fill "$COST/gannet.conf" > "$W/$L.conf"; CMD=(nginx -p "$W" -g "daemon off;" -c "$W/$L.conf") ;;
  *) fill "$COST/gannet.conf" > "$W/$L.conf"; CMD=("$B" -c "$W/$L.conf") ;;
esac
taskset -c 0 "${CMD[@]}" > "$W/$L.log" 2>&1 &
VP=$!
for _ in $(seq 1 150); do curl -s -o /dev/null "http://127.0.0.1:$PORT/img.jpg" && break; sleep 0.2; done
WP=$(pgrep -n -f "$W/$L.conf")
# `window START END`: a keeper run; START once its connections are warm, END after N answers.
window() {
  coproc KP { taskset -c 1 "$W/keeper" 127.0.0.1 $PORT /img.jpg "$CONC" "$N"; }
  local line
  echo go >&"${KP[1]}"
  read -r line <&"${KP[0]}"; [ "$line" = ready ] || { echo "keeper: $line"; return 1; }
  eval "$1"
  read -r line <&"${KP[0]}"; echo "  keeper: $line"
  eval "$2"
  echo stop >&"${KP[1]}"; wait "$KP_PID"
}
# Window 1: perf attached disabled, enabled and disabled through control FIFOs.
rm -f "$W"/ctl.* "$W"/ack.* && mkfifo "$W/ctl.s" "$W/ctl.r" "$W/ctl.p" "$W/ack.s" "$W/ack.r" "$W/ack.p"
EVENTS='task-clock,context-switches,net:net_dev_xmit,syscalls:sys_enter_*'
[ "${CPU:-}" = 1 ] && EVENTS=task-clock,context-switches NOPROF=1 NOPCAP=1
perf stat -e "$EVENTS" -D -1 --control "fifo:$W/ctl.s,$W/ack.s" -p "$WP" -o "$W/$L.stat" 2> /dev/null &
PS=$!
K=s PR=
if [ "${CPU:-}" != 1 ]; then
  perf record -e syscalls:sys_exit_sendfile64 -e syscalls:sys_exit_epoll_wait -D -1 \
    --control "fifo:$W/ctl.r,$W/ack.r" -p "$WP" -o "$W/$L.data" 2> /dev/null &
  PR=$!; K="s r"
fi
if [ "${NOPROF:-}" != 1 ]; then
  perf record -e cpu-clock -F 4000 -g -D -1 --control "fifo:$W/ctl.p,$W/ack.p" -p "$WP" -o "$W/$L.prof" 2> /dev/null &
  PR="$PR $!"; K="s r p"
fi
sleep 3
ctl() { for k in $K; do echo "$1" > "$W/ctl.$k"; read -r _ < "$W/ack.$k"; done; }
echo "== $L c=$CONC, $N answers"
window "ctl enable" "ctl disable"
kill -INT $PS $PR; wait $PS $PR 2> /dev/null
awk -v n="$N" '$1 ~ /^[0-9.,]+$/ && $2 != "seconds" {v=$1; gsub(",","",v); if (v+0 == 0) next
    if ($2 ~ /^syscalls/) {s += v; sc = sc sprintf("    %-34s %7.3f\n", substr($2, 20), v/n)}
    else if ($2 == "msec") printf "  task-clock us/answer %.1f\n", v*1000/n
    else printf "  %-22s/answer %.2f\n", $2, v/n}
  END {printf "  system calls/answer %.2f\n%s", s/n, sc}' "$W/$L.stat"
# The system calls' returns: sendfile's bytes (or EAGAIN), epoll_wait's events.
[ "${CPU:-}" = 1 ] || perf script -i "$W/$L.data" -F event,trace 2> /dev/null | awk -v n="$N" '
  function hex(h,  r, i) { h = tolower(h); sub(/^0x/, "", h); r = 0
    for (i = 1; i <= length(h); i++) r = r * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1; return r }
  /sys_exit_sendfile64/ { r = $NF; if (length(r) > 10) eagain++; else { sf++; sb += hex(r) } }
  /sys_exit_epoll_wait/ { r = $NF; if (length(r) <= 10) { ew++; ev += hex(r) } }
  END { printf "  sendfile: %.2f/answer sent data, %.2f/answer EAGAIN, %.0f bytes a call\n", sf/n, eagain/n, sf ? sb/sf : 0
        printf "  epoll_wait: %.2f/answer, %.1f events a call\n", ew/n, ew ? ev/ew : 0 }'
if [ "${NOPROF:-}" != 1 ]; then
  perf script -i "$W/$L.prof" -F ip,sym 2> /dev/null | python3 "$HERE/prof.py" "$N"
  echo "  cpu-clock samples by kernel symbol (share of the server's samples, top 15):"
  perf report -i "$W/$L.prof" --no-children --sort sym --stdio 2> /dev/null |
    grep -E '^ +[0-9.]+%' | head -15 | sed 's/^/   /'
fi
rm -f "$W"/ctl.* "$W"/ack.* "$W/$L.data" "$W/$L.prof"
# Window 2: the packets on lo (tcpdump costs the server a copy per packet: a window of its own).
if [ "${NOPCAP:-}" != 1 ]; then
  rm -f "$W/$L.pcap"
  window "tcpdump -i lo -n -s 128 -B 262144 -c 400000 -w $W/$L.pcap tcp port $PORT 2> $W/tcpdump.err & TD=\$!; for _ in \$(seq 1 100); do grep -q listening $W/tcpdump.err && break; sleep 0.05; done" \
         "kill -INT \$TD; wait \$TD"
  grep -E 'captured|dropped' "$W/tcpdump.err" | sed 's/^/  tcpdump: /'
  python3 "$HERE/pcap.py" "$W/$L.pcap" "$PORT"
fi
kill $VP; wait $VP 2> /dev/null
