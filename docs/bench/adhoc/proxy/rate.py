"""S4's shape ad hoc: one request per new connection, open loop (httperf --rate on CPU 1), each
proxy on CPU 0 in front of run.sh's back end, rounds interleaved; prints server CPU seconds
per 10k requests (user and system apart) and what httperf counted.
Usage, from the folder bench.py and this folder's files were copied to (see run.sh), with the
back end running and enough client ports (sysctl net.ipv4.ip_local_port_range="1024 65000";
set it back after: for a minute the TIME-WAIT sockets on low ports keep other servers from
binding those ports):
  [GANNETS=base=/path/to/older/gannet] SERVERS=gannet,base,nginx RATE=2000 NUM=10000 ROUNDS=5 \\
    python3 rate.py"""
import os, re, signal, statistics, subprocess, time

from bench import SERVERS, tree_cpu


def main():
    rate = int(os.environ.get("RATE", "1000"))
    n = int(os.environ.get("NUM", "10000"))
    rounds = int(os.environ.get("ROUNDS", "5"))
    names = os.environ.get("SERVERS", "gannet,nginx").split(",")
    procs = {x: subprocess.Popen(["taskset", "-c", "0"] + SERVERS[x][0], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for x in names}
    time.sleep(1.0)
    res = {x: [] for x in names}
    try:
        for _ in range(rounds):
            for x in names:
                u0, s0 = tree_cpu(procs[x].pid)
                out = subprocess.run(["taskset", "-c", "1", "httperf", "--server", "127.0.0.1", "--port",
                                      str(SERVERS[x][1]), "--uri", "/ad.json", "--rate", str(rate),
                                      "--num-conns", str(n), "--num-calls", "1", "--timeout", "5"],
                                     capture_output=True, text=True).stdout
                u1, s1 = tree_cpu(procs[x].pid)
                ok = int(re.search(r"Reply status: 1xx=\d+ 2xx=(\d+)", out).group(1))
                errors = re.search(r"Errors: total (\d+)", out).group(1)
                k = 10000 / n
                res[x].append(((u1 - u0 + s1 - s0) * k, (u1 - u0) * k, (s1 - s0) * k, ok, errors))
                time.sleep(1)  # the round's TIME-WAIT sockets need not hit the next server's
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            p.wait(5)
    for x in names:
        cpu = [v[0] for v in res[x]]
        print(f"{x:8s} rate {rate} cpu s/10k {statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f})"
              f" user {statistics.median(v[1] for v in res[x]):.3f} system {statistics.median(v[2] for v in res[x]):.3f}"
              f" 2xx {[v[3] for v in res[x]]} errors {[v[4] for v in res[x]]}")


if __name__ == "__main__":
    main()
