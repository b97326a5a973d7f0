"""Study S4's traffic, generated: the ad-delivery back end's files and a request log to replay.

The study replayed a copy of live ad-delivery traffic. Here a seeded generator stands in for
it, shaped as such traffic is: ad slot requests with query strings that differ per request
(site, placement, user id, size, cache buster), cookie-sync pixels, and event beacons; 5 % of
the requests are POSTs with a small form body (impression and click events). Each request
comes with one of three header sets - a desktop browser, a mobile browser and an app SDK -
that the replayer sends as a whole (httperf can add headers per run, not per request).

The same seed gives the same log, byte for byte, so every proxy and every run get the same
requests.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

POST_SHARE = 0.05
SLOTS = 12                       # ad responses, 200 to 2,000 bytes
HEADER_SETS: dict[str, tuple[float, tuple[str, ...]]] = {
    # name -> (share of the requests, the headers sent with each of them)
    "desktop": (0.55, ("Accept: application/json, text/javascript, */*; q=0.01",
                       "Accept-Language: en-GB,en;q=0.9",
                       "Referer: https://news.example.com/world/today.html",
                       "Cookie: uid=5f1c2a9b; seg=sports,travel")),
    "mobile": (0.35, ("Accept: */*",
                      "Accept-Language: zh-CN,zh;q=0.9,en;q=0.6",
                      "Referer: https://m.example.com/video/list",
                      "X-Requested-With: XMLHttpRequest")),
    "app": (0.10, ("Accept: application/json",
                   "X-SDK-Version: 4.2.1",
                   "X-Device-Id: 7c0f3e7a-1d2b-4c55-9e51-2b8f0a6d3c11")),
}
SITES = ("news", "sports", "video", "mail", "games", "finance")
SIZES = ("300x250", "728x90", "160x600", "320x50", "970x250")


@dataclass(frozen=True)
class Request:
    method: str
    uri: str                     # path and query string
    headers: str                 # the header set's name
    body: str = ""


def write_docroot(root: Path) -> dict[str, int]:
    """The back end's files (relative path -> size): ad slot responses of 200 to 2,000 bytes,
    the sync pixel's and the event endpoint's JSON, and robots.txt (readiness polls it)."""
    rng = random.Random(4)
    files: dict[str, str] = {}
    for slot in range(1, SLOTS + 1):
        size = 200 + (slot - 1) * (1800 // (SLOTS - 1))
        ad = {"slot": slot, "id": f"cr-{rng.randrange(10**8):08d}", "w": 300, "h": 250,
              "click": f"https://ads.example.com/c/{slot}", "html": ""}
        text = json.dumps(ad, separators=(",", ":"))
        ad["html"] = "x" * (size - len(text) - 1)
        files[f"ads/slot-{slot:02d}.json"] = json.dumps(ad, separators=(",", ":")) + "\n"
    files["sync.json"] = '{"sync":true,"partners":["a","b","c"]}\n'
    files["event.json"] = '{"ok":true}\n'
    files["robots.txt"] = "User-agent: *\nDisallow: /\n"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.chmod(0o755)
    (root / "ads").chmod(0o755)
    return {name: len(text.encode()) for name, text in files.items()}


def generate(count: int, seed: int = 4) -> list[Request]:
    """`count` requests: 5 % POSTs to /event.json, the rest ad slots (90 %) and sync pixels."""
    rng = random.Random(seed)
    names = list(HEADER_SETS)
    weights = [HEADER_SETS[n][0] for n in names]
    log = []
    for i in range(count):
        headers = rng.choices(names, weights)[0]
        user = f"{rng.randrange(16**8):08x}"
        if rng.random() < POST_SHARE:
            event = rng.choice(("impression", "click", "viewable"))
            body = f"event={event}&slot={rng.randint(1, SLOTS)}&uid={user}&ts={1_700_000_000 + i}"
            log.append(Request("POST", "/event.json", headers, body))
        elif rng.random() < 0.9:
            slot = rng.randint(1, SLOTS)
            uri = (f"/ads/slot-{slot:02d}.json?site={rng.choice(SITES)}&pos={rng.randint(1, 6)}"
                   f"&size={rng.choice(SIZES)}&uid={user}&cb={rng.randrange(10**9)}")
            log.append(Request("GET", uri, headers))
        else:
            log.append(Request("GET", f"/sync.json?partner={rng.choice('abc')}&uid={user}", headers))
    return log


def session_file(requests: list[Request]) -> str:
    """httperf --wsesslog input: one session (one connection) per request, as many short-lived
    clients send ad requests; POSTs carry their body (httperf adds Content-Length)."""
    lines = []
    for r in requests:
        if r.method == "POST":
            lines.append(f"{r.uri} method=POST contents='{r.body}'")
        else:
            lines.append(r.uri)
    return "\n\n".join(lines) + "\n"


def split(requests: list[Request]) -> dict[str, list[Request]]:
    """The log by header set, each in log order (one replayer per header set)."""
    groups: dict[str, list[Request]] = {name: [] for name in HEADER_SETS}
    for r in requests:
        groups[r.headers].append(r)
    return groups
