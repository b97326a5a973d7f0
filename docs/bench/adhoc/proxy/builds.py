"""Interleaved proxy runs with a user/system split: each proxy pinned to CPU 0, wrk on CPU 1.
GANNETS="name=/path/to/binary,..." runs several gannet builds side by side (each on its own
port, same config). Usage, from a folder holding this folder's files, the back end running
(see run.sh): GANNETS="before=...,after=..." SERVERS=before,after,nginx python3 builds.py /ad.json 100 3s 15"""
import subprocess, sys, time, re, os, signal, statistics
D = os.getcwd()
SERVERS = {"nginx": (["nginx", "-p", D, "-c", f"{D}/nginx.conf"], 18082)}
port = 18100
for spec in os.environ.get("GANNETS", f"gannet=/work/main/target/release/gannet").split(","):
    name, binary = spec.split("=")
    conf = open(f"{D}/gannet.conf").read().replace("18081", str(port)).replace("gannet.pid", f"{name}.pid")
    open(f"{D}/{name}.conf", "w").write(conf)
    SERVERS[name] = ([binary, "-c", f"{D}/{name}.conf"], port)
    port += 1
def tree_cpu(pid):
    pids = [pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()]
    u = s = 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            u += int(f[11]); s += int(f[12])
        except Exception:
            pass
    t = os.sysconf("SC_CLK_TCK")
    return u / t, s / t
def main():
    path, conns, dur, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    names = os.environ.get("SERVERS", "gannet,nginx").split(",")
    procs = {n: subprocess.Popen(["taskset", "-c", "0"] + SERVERS[n][0], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for n in names}
    time.sleep(1.0)
    res = {n: [] for n in names}
    try:
        for r in range(rounds):
            for n in names:
                u0, s0 = tree_cpu(procs[n].pid)
                out = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{dur}", f"http://127.0.0.1:{SERVERS[n][1]}{path}"], capture_output=True, text=True).stdout
                u1, s1 = tree_cpu(procs[n].pid)
                rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
                total = int(re.search(r"(\d+) requests in", out).group(1))
                errs = re.search(r"Socket errors: (.*)", out); non2 = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
                k = 10000 / total
                res[n].append((rps, (u1 - u0 + s1 - s0) * k, (u1 - u0) * k, (s1 - s0) * k, errs.group(1) if errs else "", non2.group(1) if non2 else "0"))
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try: p.wait(5)
            except Exception: p.kill()
    for n in names:
        col = lambda i: [x[i] for x in res[n]]
        print(f"{n:8s} req/s {statistics.median(col(0)):8.0f} ({min(col(0)):6.0f}-{max(col(0)):6.0f})  cpu s/10k {statistics.median(col(1)):.3f} ({min(col(1)):.3f}-{max(col(1)):.3f}) user {statistics.median(col(2)):.3f} sys {statistics.median(col(3)):.3f}  errors {[x[4] for x in res[n] if x[4]]} non2xx {col(5)}")
main()
