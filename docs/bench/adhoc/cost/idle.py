"""Hold N idle keep-alive connections to a server, as the arena's c10k does: each sends one
request and reads its answer's head, then stays open and silent until this process is
killed. Prints "ready" once every answer has come (measure.sh's IDLE=N)."""

import signal
import socket
import sys

host, port, path, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
req = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
socks = []
for _ in range(n):
    s = socket.create_connection((host, port))
    s.sendall(req)
    socks.append(s)
for s in socks:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            sys.exit(f"a held connection closed before its answer ({len(socks)} held)")
        data += chunk
print("ready", flush=True)
signal.pause()
