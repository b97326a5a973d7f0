"""The first things an admin checks: a file is served, keep-alive and pipelining work."""


def test_serves_file_with_headers(gannet):
    srv = gannet.start(files={"robots.txt": "User-agent: *\n"})
    status, h, body = srv.get("/robots.txt")
    assert status == 200
    assert body == b"User-agent: *\n"
    assert h["content-type"] == "text/plain"
    assert h["content-length"] == "14"
    assert h["server"].startswith("gannet")
    assert h["etag"].startswith('"') and h["accept-ranges"] == "bytes"


def test_pipelined_requests_answered_in_order(gannet):
    srv = gannet.start(files={"a.txt": "AAA", "b.txt": "BB"})
    req = b"GET /a.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /b.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    out = srv.raw(req)
    assert out.count(b"HTTP/1.1 200 OK") == 3
    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in out.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"AAA", b"BB", b"AAA"]
    assert b"Connection: close" in out.rsplit(b"HTTP/1.1", 1)[1]
