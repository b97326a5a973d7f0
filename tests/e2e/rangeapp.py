"""An HTTP application that serves one deterministic file with byte ranges, for the slice
and range tests: it records each request's path and Range per client server (`X-Who`),
and misbehaves as the path's folders say: `norange/` ignores Range (a 200 of the whole),
`no206/` answers the first slice only with a 206 (the others whole, 200), `etag/`
gives each range its own ETag, `noar/` sends no Accept-Ranges, `big/` serves a 3 MB
file (`BIG`) instead."""

from __future__ import annotations

import re
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SIZE = 10_000
DATA = bytes((i * 7 + i // 251) % 256 for i in range(SIZE))
BIG = DATA * 300
MTIME = formatdate(1_700_000_000, usegmt=True)


class RangeApp:
    def __init__(self):
        self.seen: list = []
        self.lock = threading.Lock()
        app = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                with app.lock:
                    app.seen.append((self.headers.get("X-Who", ""), self.path, rng))
                etag = '"v1"'
                data = BIG if "/big/" in self.path else DATA
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
                if "/norange/" in self.path:
                    m = None
                if "/no206/" in self.path and m and int(m.group(1)) > 0:
                    m = None
                if "/etag/" in self.path and m:
                    etag = f'"v{m.group(1)}"'
                if m and int(m.group(1)) >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if m:
                    start = int(m.group(1))
                    end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                    body = data[start : end + 1]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                else:
                    body = data
                    self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", etag)
                self.send_header("Last-Modified", MTIME)
                if "/noar/" not in self.path:
                    self.send_header("Accept-Ranges", "bytes")
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def ranges(self, who: str) -> list:
        """The (path, Range) of each request the server on port `who` sent, in order."""
        with self.lock:
            return [(p, r) for w, p, r in self.seen if w == who]

    def clear(self) -> None:
        with self.lock:
            self.seen.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
