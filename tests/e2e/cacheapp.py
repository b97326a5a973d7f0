"""An HTTP application for the cache tests: it counts the requests it gets per (X-Who,
path and query), so a test sees how many reached it, and answers as the query says:
`cc=` a Cache-Control, `xae=` an X-Accel-Expires, `exp=` an Expires that many seconds
ahead, `cookie=1` a Set-Cookie, `vary=` a Vary, `status=`, `size=` a body of that many
bytes, `ar=1` an Accept-Ranges, `delay=` seconds before answering, `etag=` an ETag (and a 304 to a request
with that If-None-Match), `loc=` a Location of that path on the application's own address. The body names the path and the count, so an
answer from a cache shows an older count."""

from __future__ import annotations

import threading
import time
from collections import Counter
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class CacheApp:
    def __init__(self):
        self.counts: Counter = Counter()
        # The conditional and range headers of each (X-Who, path)'s last request.
        self.seen: dict = {}
        self.lock = threading.Lock()
        app = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.answer(head=True)

            def do_GET(self):
                self.answer(head=False)

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                self.answer(head=False)

            def answer(self, head: bool):
                with app.lock:
                    k = (self.headers.get("X-Who", ""), self.path)
                    app.counts[k] += 1
                    n = app.counts[k]
                q = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                app.seen[k] = {h: self.headers.get(h) for h in ("If-None-Match", "If-Modified-Since", "Range")}
                if "etag" in q and self.headers.get("If-None-Match") == f'"{q["etag"]}"':
                    self.send_response(304)
                    self.send_header("ETag", f'"{q["etag"]}"')
                    if "xae" in q:
                        self.send_header("X-Accel-Expires", q["xae"])
                    self.end_headers()
                    return
                if "delay" in q:
                    time.sleep(float(q["delay"]))
                body = f"{urlsplit(self.path).path} {self.command} count={n} lang={self.headers.get('Accept-Language', '')}\n".encode()
                if "size" in q:
                    size = int(q["size"])
                    body = (body + bytes(range(256)) * (size // 256 + 1))[:size]
                self.send_response(int(q.get("status", 200)))
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                if "cc" in q:
                    self.send_header("Cache-Control", q["cc"])
                if "xae" in q:
                    self.send_header("X-Accel-Expires", q["xae"])
                if "exp" in q:
                    self.send_header("Expires", formatdate(time.time() + int(q["exp"]), usegmt=True))
                if "cookie" in q:
                    self.send_header("Set-Cookie", "a=b")
                if "etag" in q:
                    self.send_header("ETag", f'"{q["etag"]}"')
                if "ar" in q:
                    self.send_header("Accept-Ranges", "bytes")
                if "loc" in q:
                    self.send_header("Location", f"http://127.0.0.1:{app.port}{q['loc']}")
                if "vary" in q:
                    self.send_header("Vary", q["vary"])
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def count(self, who: str, path: str) -> int:
        with self.lock:
            return self.counts[(who, path)]

    def stop(self) -> None:
        """Stop listening: later connections are refused."""
        self.srv.shutdown()
        self.srv.server_close()
