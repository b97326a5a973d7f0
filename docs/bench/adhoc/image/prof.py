"""The server's cpu-clock samples (count.sh: `perf record -g`) by what it was doing: the system
call a sample is under (or user space), and in it, the part of the network stack: receiving
a packet (tcp_v4_rcv: on loopback, the client's side of the server's own data, or the
client's ACKs), sending one (tcp_write_xmit down to the device), taking the file's pages into
the socket (splice), or the rest (epoll, scheduling, the system call itself).
usage: perf script -F ip,sym | python3 prof.py ANSWERS"""

import re
import sys
from collections import Counter

answers = int(sys.argv[1])
SYSCALL = re.compile(r"(?:__x64_sys|__do_sys|__se_sys)_(\w+)")
parts = Counter()
calls = Counter()
total = 0


def part(frames: list[str]) -> str:
    if "tcp_v4_rcv" in frames:
        return "receive"
    if any(f in ("tcp_write_xmit", "__tcp_transmit_skb", "tcp_push", "__tcp_push_pending_frames") for f in frames):
        return "send"
    if any(f.startswith(("splice", "filemap_", "skb_splice", "skb_append_pagefrags", "page_cache_pipe")) for f in frames):
        return "pages"
    if any(f.startswith(("ep_", "do_epoll")) for f in frames):
        return "epoll"
    if any(f in ("schedule", "__schedule", "finish_task_switch.isra.0", "schedule_hrtimeout_range") for f in frames):
        return "schedule"
    return "other"


def flush(frames: list[str]) -> None:
    global total
    if not frames:
        return
    total += 1
    call = "user space"
    for f in reversed(frames):  # from the root
        m = SYSCALL.match(f)
        if m:
            call = m.group(1)
            break
    else:
        if any(f.startswith(("asm_", "sysvec_", "irq_")) for f in frames):
            call = "interrupt"
        elif frames[0].startswith("[unknown]") or not any(f.startswith(("entry_SYSCALL", "do_syscall")) for f in frames):
            call = "user space" if not any("softirq" in f for f in frames) else "interrupt"
    calls[call] += 1
    parts[(call, part(frames) if call != "user space" else "-")] += 1


frames: list[str] = []
for line in sys.stdin:
    line = line.strip()
    if not line:
        flush(frames)
        frames = []
        continue
    bits = line.split(None, 1)
    frames.append(bits[1].split("+")[0] if len(bits) > 1 else "[unknown]")
flush(frames)
print(f"  cpu-clock samples by system call and part ({total} samples; share of the server's time):")
for call, n in calls.most_common():
    if n / total < 0.005:
        continue
    sub = ", ".join(f"{p} {c / total:.1%}" for (k, p), c in parts.most_common() if k == call and c / total >= 0.003)
    print(f"    {call:<14} {n / total:6.1%}  ({sub})")
