#!/bin/bash
# What 10,000 idle connections cost the active ones, on one page: gannet and Debian's h2o,
# each in a cgroup v1 `cpu` group held to 25 % of CPU 0 (the arena's quota), wrk -t1 -c100
# for 8 s on the arena's /index.html (2,761 bytes) from CPU 1, with none and with 10,000
# idle connections held by idle.py; three rounds, servers and idle counts interleaved.
# Capacity per core = rps x 4; the ticks are the server's user and system time in the window.
#   bash idle-ab.sh [GANNET_BINARY]      (default: the repository's release build)
# See docs/bench/README.md (the c10k row).
set -u
HERE=$(cd "$(dirname "$0")" && pwd); REPO=$(cd "$HERE/../../../.." && pwd)
W=${WORK:-/tmp/idle-ab}; C=$HERE; GB=${1:-$REPO/target/release/gannet}
mkdir -p $W/www
(cd "$REPO/arena" && python3 -c "from arena import workload as w; open('$W/www/index.html', 'w').write(w.INDEX)")
ulimit -n 20000
fill() { sed -e "s#WORK#$W#g" -e "s#PORT#$2#g" -e "s#MIME#$REPO/conf/mime.types#g" \
  -e "s#worker_connections [0-9]*#worker_connections 20000#" -e "s#max-connections: [0-9]*#max-connections: 20000#" "$1"; }
fill $C/gannet-small-static.conf 18301 > $W/g.conf
fill $C/h2o.conf 18302 > $W/h.conf
start() { # NAME CMD...
  local n=$1; shift
  mkdir -p /sys/fs/cgroup/cpu/ab-$n
  echo 10000 > /sys/fs/cgroup/cpu/ab-$n/cpu.cfs_period_us
  echo 2500 > /sys/fs/cgroup/cpu/ab-$n/cpu.cfs_quota_us
  (echo $BASHPID > /sys/fs/cgroup/cpu/ab-$n/cgroup.procs; exec taskset -c 0 "$@" > $W/$n.out 2>&1) &
}
start g $GB -c $W/g.conf
start h h2o -m worker -c $W/h.conf
for p in 18301 18302; do for i in $(seq 100); do curl -sf -o /dev/null http://127.0.0.1:$p/index.html && break; sleep 0.1; done; done
pids() { cat /sys/fs/cgroup/cpu/ab-$1/cgroup.procs; }
cpu() { # user and system ticks of the group's processes
  local u=0 s=0; for p in $(pids $1); do read -r a b <<< "$(awk '{print $14, $15}' /proc/$p/stat)"; u=$((u+a)); s=$((s+b)); done; echo $u $s; }
for r in 1 2 3; do
  for idle in 0 10000; do
    for n in g h; do
      port=$([ $n = g ] && echo 18301 || echo 18302)
      if [ $idle -gt 0 ]; then
        coproc IDL { exec taskset -c 1 python3 $C/idle.py 127.0.0.1 $port /index.html $idle; }
        read -r line <&"${IDL[0]}"; [ "$line" = ready ] || echo "idle: $line"
        sleep 3
      fi
      taskset -c 1 wrk -t1 -c100 -d2s http://127.0.0.1:$port/index.html > /dev/null
      read -r u0 s0 <<< "$(cpu $n)"
      out=$(taskset -c 1 wrk -t1 -c100 -d8s http://127.0.0.1:$port/index.html)
      read -r u1 s1 <<< "$(cpu $n)"
      reqs=$(echo "$out" | awk '/requests in/ {print $1}')
      rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
      err=$(echo "$out" | grep -c "Socket errors\|Non-2xx")
      echo "round $r idle $idle $n rps $rps reqs $reqs user_ticks $((u1-u0)) sys_ticks $((s1-s0)) errlines $err"
      if [ $idle -gt 0 ]; then kill $IDL_PID; wait $IDL_PID 2>/dev/null; sleep 2; fi
    done
  done
done
for n in g h; do for p in $(pids $n); do kill $p; done; done
sleep 1; rmdir /sys/fs/cgroup/cpu/ab-g /sys/fs/cgroup/cpu/ab-h 2>/dev/null
echo done
