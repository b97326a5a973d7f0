"""Interleaved side-by-side runs: each server pinned to CPU 0, wrk on CPU 1.
GANNETS="name=/path/to/binary,..." adds gannet builds side by side (before / after a change),
each on its own port with the folder's gannet.conf; name them in SERVERS."""
import subprocess, sys, time, re, os, signal, statistics
# Configs and pid files are in the folder this runs from (/tmp/bench, /tmp/gzbench...).
D = os.getcwd()
SERVERS = {
  "gannet":   (["/work/main/target/release/gannet", "-c", f"{D}/gannet.conf"], 18081),
  "nginx":    (["nginx", "-p", D, "-c", f"{D}/nginx.conf"], 18082),
  "lighttpd": (["lighttpd", "-D", "-f", f"{D}/lighttpd.conf"], 18084),
  "h2o":      (["h2o", "-c", f"{D}/h2o.conf"], 18085),
}
for port, spec in enumerate(filter(None, os.environ.get("GANNETS", "").split(",")), 18100):
    name, binary = spec.split("=")
    conf = open(f"{D}/gannet.conf").read().replace("18081", str(port)).replace("gannet.pid", f"{name}.pid")
    open(f"{D}/{name}.conf", "w").write(conf)
    SERVERS[name] = ([binary, "-c", f"{D}/{name}.conf"], port)
def tree_cpu(pid):
    pids=[pid]
    out=subprocess.run(["pgrep","-P",str(pid)],capture_output=True,text=True).stdout.split()
    pids+= [int(p) for p in out]
    user=system=0
    for p in pids:
        try:
            f=open(f"/proc/{p}/stat").read().rsplit(")",1)[1].split()
            user+=int(f[11]); system+=int(f[12])
        except Exception: pass
    t=os.sysconf("SC_CLK_TCK")
    return user/t, system/t
def main():
    path=sys.argv[1]; conns=int(sys.argv[2]); dur=sys.argv[3]; rounds=int(sys.argv[4]); extra=sys.argv[5:]
    names=os.environ.get("SERVERS","gannet,nginx,lighttpd,h2o").split(",")
    procs={}
    for n in names:
        cmd,port=SERVERS[n]
        procs[n]=subprocess.Popen(["taskset","-c","0"]+cmd,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    # Show what each server answers (the encoding and the size on the wire): a server that
    # does not compress (for the gzip runs) would make the comparison meaningless.
    import http.client
    hdrs=dict(h.split(": ",1) for h in extra[1::2]) if extra[:1]==["-H"] else {}
    for n in names:
        c=http.client.HTTPConnection("127.0.0.1",SERVERS[n][1],timeout=5)
        c.request("GET",path,headers=hdrs); r=c.getresponse(); body=r.read(); c.close()
        print(f"{n:9s} {r.status} Content-Encoding={r.getheader('Content-Encoding')} bytes={len(body)}")
    res={n:[] for n in names}
    try:
        for r in range(rounds):
            for n in names:
                port=SERVERS[n][1]
                u0,s0=tree_cpu(procs[n].pid)
                out=subprocess.run(["taskset","-c","1","wrk","-t1",f"-c{conns}",f"-d{dur}"]+extra+[f"http://127.0.0.1:{port}{path}"],capture_output=True,text=True).stdout
                u1,s1=tree_cpu(procs[n].pid)
                rps=float(re.search(r"Requests/sec:\s+([\d.]+)",out).group(1))
                total=int(re.search(r"(\d+) requests in",out).group(1))
                errs=re.search(r"Socket errors: (.*)",out); non2=re.search(r"Non-2xx or 3xx responses: (\d+)",out)
                busy=u1-u0+s1-s0; k=10000/total
                res[n].append((rps,busy*k,busy, (errs.group(1) if errs else ""), (non2.group(1) if non2 else "0"), (u1-u0)*k, (s1-s0)*k))
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try: p.wait(5)
            except Exception: p.kill()
    for n in names:
        rps=[x[0] for x in res[n]]; cpu=[x[1] for x in res[n]]; busy=[x[2] for x in res[n]]
        user=statistics.median([x[5] for x in res[n]]); system=statistics.median([x[6] for x in res[n]])
        print(f"{n:9s} req/s median {statistics.median(rps):9.0f} (min {min(rps):7.0f} max {max(rps):7.0f})  cpu s/10k {statistics.median(cpu):.3f} ({min(cpu):.3f}-{max(cpu):.3f}; user {user:.3f} system {system:.3f})  busy {statistics.median(busy):.2f}s errors {[x[3] for x in res[n] if x[3]]} non2xx {[x[4] for x in res[n]]}")
if __name__ == "__main__":
    main()
