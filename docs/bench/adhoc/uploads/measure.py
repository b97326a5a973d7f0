"""4 clients x 2 GiB uploads at once (`client_max_body_size 0`) through a proxied location to
a slow (~2 MB/s per connection) upstream, for 40 s; records each server process's idle and
peak RSS. Run one server at a time (not two benchmarks at once on two cores):
  python3 measure.py gannet target/release/gannet
  python3 measure.py nginx"""
import os, socket, subprocess, sys, threading, time

which = sys.argv[1]
base = f"/tmp/uploads-measure/{which}"
os.makedirs(base, exist_ok=True)
RUN = 40
stop = threading.Event()

up = socket.socket(); up.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
up.bind(("127.0.0.1", 0)); up.listen(16); up_port = up.getsockname()[1]
got = [0]
def slow(conn):
    while not stop.is_set():
        b = conn.recv(65536)
        if not b: return
        got[0] += len(b)
        time.sleep(len(b) / 2e6)   # pacing: ~2 MB/s per connection
def accept():
    while True:
        try: c, _ = up.accept()
        except OSError: return
        threading.Thread(target=slow, args=(c,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
conf = f"""worker_processes 1;
pid {base}/pid;
error_log {base}/error.log;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_max_body_size 0;
    client_body_temp_path {base}/body;
    proxy_temp_path {base}/proxy;
    fastcgi_temp_path {base}/fcgi; scgi_temp_path {base}/scgi; uwsgi_temp_path {base}/uwsgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{ proxy_pass http://127.0.0.1:{up_port}; proxy_read_timeout 300s; proxy_send_timeout 300s; }}
    }}
}}
"""
open(f"{base}/conf", "w").write(conf)
if which == "nginx":
    proc = subprocess.Popen(["/usr/sbin/nginx", "-p", base, "-c", f"{base}/conf", "-g", "daemon off;"])
else:
    proc = subprocess.Popen([sys.argv[2], "-p", base, "-c", f"{base}/conf"])
for _ in range(200):
    try: socket.create_connection(("127.0.0.1", port), 0.1).close(); break
    except OSError: time.sleep(0.05)

def pids():
    out = [proc.pid]
    try:
        kids = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        out += [int(k) for k in kids]
    except OSError: pass
    return out
def vm(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"): return int(line.split()[1])
    return 0

time.sleep(0.5)
idle = {p: vm(p, "VmRSS") for p in pids()}
sent = [0] * 4
done_at = [None] * 4
block = os.urandom(1 << 20)
def client(i):
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(f"POST /up{i} HTTP/1.1\r\nHost: t\r\nContent-Length: {2 << 30}\r\n\r\n".encode())
    while not stop.is_set() and sent[i] < (2 << 30):
        try: c.sendall(block)
        except OSError: return
        sent[i] += len(block)
    done_at[i] = time.time() - t0
    while not stop.is_set(): time.sleep(0.1)
    c.close()
t0 = time.time()
ts = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
for t in ts: t.start()
peak = {p: 0 for p in idle}
while time.time() - t0 < RUN:
    for p in list(peak):
        try: peak[p] = max(peak[p], vm(p, "VmRSS"))
        except OSError: pass
    time.sleep(0.05)
hwm = {p: vm(p, "VmHWM") for p in peak}
stop.set()
proc.terminate(); proc.wait(15)
print("uploads done at", done_at); print(f"{which}: sent by clients {sum(sent)/2**30:.2f} GiB in {RUN}s, upstream got {got[0]/2**20:.1f} MiB")
for p in peak:
    print(f"  pid {p}: idle RSS {idle[p]/1024:.1f} MiB, peak RSS {peak[p]/1024:.1f} MiB, VmHWM {hwm[p]/1024:.1f} MiB, growth {(max(peak[p],hwm[p])-idle[p])/1024:.1f} MiB")
