"""FastCGI overhead side by side: gannet (kept connections) and nginx in front of PHP-FPM
pools of 4 children each, all on CPU 0, wrk on CPU 1, interleaved 5 s rounds; prints req/s
and server / PHP-FPM CPU seconds per 10k requests.
Usage: mkdir -p /tmp/fcgi/www && cp * /tmp/fcgi/ && mv /tmp/fcgi/hello.php /tmp/fcgi/www/ &&
  cd /tmp/fcgi && [BASE=/path/to/older/gannet] python3 bench.py CONNECTIONS ROUNDS"""
import subprocess, sys, time, re, os, signal, statistics
def cpu(pid):
    tot=0
    for p in [pid]+[int(x) for x in subprocess.run(["pgrep","-P",str(pid)],capture_output=True,text=True).stdout.split()]:
        try:
            f=open(f"/proc/{p}/stat").read().rsplit(")",1)[1].split(); tot+=int(f[11])+int(f[12])
        except Exception: pass
    return tot/100
S={"gannet":(["/work/main/target/release/gannet","-c","/tmp/fcgi/gannet.conf"],18091),
   "nginx":(["nginx","-p","/tmp/fcgi","-c","/tmp/fcgi/nginx.conf","-g","daemon off;"],18092)}
# BASE=/path/to/an/older/gannet: that build too, side by side on its own pool (base.conf).
if os.environ.get("BASE"):
  S["base"]=([os.environ["BASE"],"-c","/tmp/fcgi/base.conf"],18093)
conns=int(sys.argv[1]); rounds=int(sys.argv[2])
fpm=subprocess.Popen(["taskset","-c","0","php-fpm8.2","-F","-y","/tmp/fcgi/fpm.conf","-R"],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
procs={n:subprocess.Popen(["taskset","-c","0"]+c,stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL) for n,(c,p) in S.items()}
time.sleep(1.5)
res={n:[] for n in S}
try:
  for r in range(rounds):
    for n,(c,port) in S.items():
      c0=cpu(procs[n].pid); f0=cpu(fpm.pid)
      out=subprocess.run(["taskset","-c","1","wrk","-t1",f"-c{conns}","-d5s",f"http://127.0.0.1:{port}/hello.php"],capture_output=True,text=True).stdout
      c1=cpu(procs[n].pid); f1=cpu(fpm.pid)
      print(n, out[-300:], flush=True) if " 0 requests in" in out else None
      rps=float(re.search(r"Requests/sec:\s+([\d.]+)",out).group(1)); tot=int(re.search(r"(\d+) requests in",out).group(1))
      non=re.search(r"Non-2xx or 3xx responses: (\d+)",out); err=re.search(r"Socket errors: (.*)",out)
      res[n].append((rps,(c1-c0)/tot*10000,(f1-f0)/tot*10000,(non.group(1) if non else "0"),(err.group(1) if err else "")))
finally:
  for p in list(procs.values())+[fpm]: p.send_signal(signal.SIGQUIT if p is fpm else signal.SIGTERM)
  for p in list(procs.values())+[fpm]:
    try: p.wait(5)
    except Exception: p.kill()
for n in S:
  x=res[n]; print(f"{n:7s} req/s {statistics.median([a[0] for a in x]):8.0f} server CPU s/10k {statistics.median([a[1] for a in x]):.3f} php CPU s/10k {statistics.median([a[2] for a in x]):.3f} non2xx {[a[3] for a in x]} err {[a[4] for a in x if a[4]]}")
