"""Packets per answer from a tcpdump capture on lo (count.sh): the server's segments with data
and their sizes, its bare ACKs, the client's segments. Answers are the server's segments that
start with a status line (the head goes out with the file's first bytes or alone).
usage: python3 pcap.py FILE PORT"""

import struct
import sys
from collections import Counter

path, port = sys.argv[1], int(sys.argv[2])
with open(path, "rb") as f:
    data = f.read()
magic = struct.unpack("<I", data[:4])[0]
end = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
link = struct.unpack(end + "I", data[20:24])[0]
skip = {1: 14, 113: 16, 276: 20, 0: 4}[link]
pos = 24
answers = heads_alone = 0
srv_data, srv_ack, cli_data, cli_ack = [], 0, 0, 0
starts = {}  # the client's port: the sequence number its answer began at
small = Counter()  # segments under 1 KiB: (where in the answer, in 64 KiB steps; size) 
while pos + 16 <= len(data):
    incl = struct.unpack(end + "IIII", data[pos:pos + 16])[2]
    pkt = data[pos + 16:pos + 16 + incl]
    pos += 16 + incl
    ip = pkt[skip:]
    if len(ip) < 20 or ip[0] >> 4 != 4:
        continue
    ihl = (ip[0] & 15) * 4
    total = struct.unpack(">H", ip[2:4])[0]
    tcp = ip[ihl:]
    sport = struct.unpack(">H", tcp[0:2])[0]
    thl = (tcp[12] >> 4) * 4
    payload = total - ihl - thl
    start = tcp[thl:thl + 9]
    if sport == port:
        dport = struct.unpack(">H", tcp[2:4])[0]
        seq = struct.unpack(">I", tcp[4:8])[0]
        if payload:
            srv_data.append(payload)
            if payload < 1024 and dport in starts:
                small[((seq - starts[dport]) % (1 << 32) >> 16, payload // 100 * 100)] += 1
            if start == b"HTTP/1.1 ":
                starts[dport] = seq
                answers += 1
                if payload < 1024:
                    heads_alone += 1
        else:
            srv_ack += 1
    elif payload:
        cli_data += 1
    else:
        cli_ack += 1
n = max(answers, 1)
print(f"  packets on lo: {answers} answers; per answer: server data segments "
      f"{len(srv_data) / n:.2f} ({sum(srv_data) / max(len(srv_data), 1):,.0f} bytes each), "
      f"server bare ACKs {srv_ack / n:.2f}, client segments {cli_data / n:.2f} with data "
      f"+ {cli_ack / n:.2f} bare ACKs; heads alone in a segment {heads_alone / n:.2f}")
edges = [1024, 16384, 32768, 49152, 65536, 1 << 30]
names = ["<1K", "1-16K", "16-32K", "32-48K", "48-64K", ">=64K"]
counts = [0] * len(edges)
for p in srv_data:
    counts[next(i for i, e in enumerate(edges) if p < e)] += 1
print("  server data segments by size, per answer: " +
      ", ".join(f"{nm} {c / n:.2f}" for nm, c in zip(names, counts)))
if small:
    print("  segments under 1 KiB, the commonest (64 KiB step of the answer they start in, size "
          "to 100 bytes): " + ", ".join(f"{k[0]}/{k[1]} {c / n:.2f}" for k, c in small.most_common(6)))
