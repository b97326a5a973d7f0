"""TLS / HTTP/2 side by side: gannet and nginx pinned to CPU 0, h2load on CPU 1, interleaved
rounds; prints req/s and server CPU seconds per 10k requests (user + system, whole process
tree), and gannet's ratios to nginx.
Usage (from a folder holding gannet.conf, nginx.conf, cert.pem, key.pem and the files; run.sh
sets it up): python3 bench.py LABEL ROUNDS PATH h2load-args..."""
import subprocess, sys, time, re, os, signal, statistics
D = os.getcwd()
SERVERS = {"gannet": ([os.environ.get("GANNET", "/work/main/target/release/gannet"), "-c", f"{D}/gannet.conf", "-p", D + "/"], 18443),
           "nginx": (["nginx", "-p", D + "/", "-c", f"{D}/nginx.conf", "-e", "stderr"], 18444)}
def cpu(pid):
    pids = [pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    t = 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split(); t += int(f[11]) + int(f[12])
        except OSError: pass
    return t / os.sysconf("SC_CLK_TCK")
label, rounds, path, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
NAMES = os.environ.get("SERVERS", "gannet,nginx").split(",")
SERVERS = {n: SERVERS[n] for n in NAMES}
procs = {n: subprocess.Popen(["taskset", "-c", "0"] + c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n, (c, _) in SERVERS.items()}
time.sleep(1)
# QUOTA=P holds each server's process tree to P% of a CPU (a cgroup v1 cpu quota of its own),
# so that the server and not h2load is what limits the rate: with one CPU for h2load, the
# client's own handshake work caps it before either server is busy.
if os.environ.get("QUOTA"):
    for n, p in procs.items():
        g = f"/sys/fs/cgroup/cpu/bench-{n}"
        os.makedirs(g, exist_ok=True)
        open(f"{g}/cpu.cfs_period_us", "w").write("100000")
        open(f"{g}/cpu.cfs_quota_us", "w").write(str(int(float(os.environ["QUOTA"]) * 1000)))
        kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()
        for pid in [str(p.pid)] + kids:
            open(f"{g}/cgroup.procs", "w").write(pid)
res = {n: [] for n in SERVERS}
try:
    for r in range(rounds):
        for n, (_, port) in SERVERS.items():
            c0 = cpu(procs[n].pid)
            out = subprocess.run(["taskset", "-c", "1", "h2load"] + args + [f"https://127.0.0.1:{port}{path}"], capture_output=True, text=True).stdout
            c1 = cpu(procs[n].pid)
            m = re.search(r"finished in ([\d.]+)m?s, ([\d.]+) req/s", out)
            st = re.search(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", out)
            proto = re.search(r"TLS Protocol: (\S+)", out), re.search(r"Application protocol: (\S+)", out)
            done = int(st.group(4))
            res[n].append((float(m.group(2)), (c1 - c0) / max(done, 1) * 1e4, int(st.group(5)) + int(st.group(6)), "/".join(p.group(1) if p else "?" for p in proto)))
finally:
    for p in procs.values(): p.send_signal(signal.SIGTERM)
    for p in procs.values(): p.wait(5)
g = res["gannet"]; ng = res["nginx"]
for n in SERVERS:
    rps = [x[0] for x in res[n]]; c = [x[1] for x in res[n]]
    print(f"{label:24s} {n:7s} req/s {statistics.median(rps):9.0f} ({min(rps):.0f}-{max(rps):.0f}) cpu s/10k {statistics.median(c):.3f} failed {sum(x[2] for x in res[n])} proto {res[n][0][3]}")
print(f"{label:24s} ratio gannet/nginx req/s {statistics.median(x[0] for x in g)/statistics.median(x[0] for x in ng):.2f}  cpu/req {statistics.median(x[1] for x in g)/statistics.median(x[1] for x in ng):.2f}")
