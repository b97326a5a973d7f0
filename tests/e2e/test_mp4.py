"""`mp4;` against Debian's nginx on the same config and files: `?start=` (and `&end=`)
answers a new MP4 file whose moov is cut to the samples from that time (byte for byte as
nginx's), files with moov first or last, large files read from disk, mp4_start_key_frame,
ranges, HEAD and ETags of the new file, and the 500s of a start past the end, a moov over
mp4_max_buffer_size and a broken file, with nginx's log lines."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, exchange, side_by_side

pytestmark = [
    pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh"),
    pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is installed by scripts/test-all.sh"),
]

CONF = PEER_MAIN + """
http {
    types { video/mp4 mp4; }
    server {
        listen 127.0.0.1:{port};
        root {root};
        location /v/ { mp4; }
        location /k/ { mp4; mp4_start_key_frame on; }
        location /tiny/ { mp4; mp4_buffer_size 1k; mp4_max_buffer_size 2k; }
        location /plain/ { }
    }
}
"""


def make_mp4(tmp, name: str, seconds: int, size: str, extra: list[str]) -> bytes:
    """A real H.264 + AAC file (with B-frames: ctts) made by ffmpeg."""
    out = tmp / name
    subprocess.run(
        ["ffmpeg", "-hide_banner", "-loglevel", "error", "-y",
         "-f", "lavfi", "-i", f"testsrc=size={size}:rate=25:duration={seconds}",
         "-f", "lavfi", "-i", f"sine=frequency=440:duration={seconds}",
         "-c:v", "libx264", "-g", "30", "-bf", "2", "-preset", "veryfast",
         "-c:a", "aac", "-b:a", "32k", "-shortest", *extra, str(out)],
        check=True, timeout=120,
    )
    return out.read_bytes()


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("media")
    tail = make_mp4(tmp, "tail.mp4", 6, "64x48", [])
    head = make_mp4(tmp, "head.mp4", 6, "64x48", ["-movflags", "+faststart"])
    # Over the 64 KiB gannet keeps in memory: read and sent from the file.
    big = make_mp4(tmp, "big.mp4", 8, "320x240", ["-movflags", "+faststart"])
    assert len(head) < 64 * 1024 < len(big)
    co64 = to_co64(head)
    assert b"co64" in co64 and b"stco" not in co64 and len(co64) > len(head)
    return {"tail": tail, "head": head, "big": big, "co64": co64}


CONTAINERS = (b"moov", b"trak", b"mdia", b"minf", b"stbl")


def boxes(data: bytes):
    at = 0
    while at + 8 <= len(data):
        size = int.from_bytes(data[at:at + 4], "big")
        yield data[at + 4:at + 8], data[at + 8:at + size]
        at += size


def to_co64(data: bytes) -> bytes:
    """The same movie with 64-bit chunk offsets (co64 for stco), moov first: every offset
    moves by what moov grows."""
    growth = 0

    def rebuild(payload: bytes, shift: int) -> bytes:
        nonlocal growth
        out = b""
        for name, body in boxes(payload):
            if name in CONTAINERS:
                body = rebuild(body, shift)
            elif name == b"stco":
                n = int.from_bytes(body[4:8], "big")
                offs = [int.from_bytes(body[8 + 4 * i:12 + 4 * i], "big") + shift for i in range(n)]
                body = body[:8] + b"".join(o.to_bytes(8, "big") for o in offs)
                name = b"co64"
                growth += 4 * n
            out += (8 + len(body)).to_bytes(4, "big") + name + body
        return out

    rebuild(data, 0)
    grown, growth = growth, 0
    return rebuild(data, grown)


def get(path: str, extra: str = "", method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode()


COMPARED = ("content-type", "content-length", "etag", "last-modified", "content-range", "accept-ranges")


def test_mp4_as_nginx(tmp_path, media):
    broken = bytearray(media["head"])
    # The first trak's stts entry count made huge: "mp4 stts atom too small".
    at = broken.index(b"stts") + 8
    broken[at:at + 4] = b"\x7f\xff\xff\xff"
    files = {
        "v/tail.mp4": media["tail"], "v/head.mp4": media["head"], "v/big.mp4": media["big"],
        "v/broken.mp4": bytes(broken), "k/head.mp4": media["head"], "k/big.mp4": media["big"],
        "tiny/head.mp4": media["head"], "v/co64.mp4": media["co64"], "plain/head.mp4": media["head"],
    }
    cases = [get("/v/head.mp4"), get("/v/head.mp4?start=0"), get("/v/tail.mp4?start=0")]
    for f in ("head", "tail", "big", "co64"):
        for q in ("start=1", "start=2.5", "start=3.999", "start=1&end=3", "end=2.2", "start=4&end=1",
                  "start=0.04", "start=5.9", "start=abc", "start=1.2.3"):
            cases.append(get(f"/v/{f}.mp4?{q}"))
    for f in ("head", "big", "co64"):
        for q in ("start=1", "start=2.5", "start=1.3&end=4.1"):
            cases.append(get(f"/k/{f}.mp4?{q}"))
    cases += [
        get("/v/head.mp4?start=2", "Range: bytes=100-2000\r\n"),
        get("/v/big.mp4?start=2", "Range: bytes=-500\r\n"),
        get("/v/head.mp4?start=2", "Range: bytes=0-10,20-30\r\n"),
        get("/v/head.mp4?start=2", method="HEAD"),
        get("/v/head.mp4?start=60"),
        get("/v/head.mp4?start=2", method="POST"),
        get("/v/broken.mp4?start=1"),
        get("/v/broken.mp4"),
        get("/tiny/head.mp4?start=1"),
        get("/plain/head.mp4?start=1"),
        get("/v/nothing.mp4?start=1"),
    ]
    with side_by_side(tmp_path, CONF, files) as (srv, nginx_port):
        seen = []
        for req in cases:
            ours, theirs = exchange(srv.port, req), exchange(nginx_port, req)
            line = req.split(b"\r\n")[0]
            assert ours.status == theirs.status, line
            seen.append(ours.status)
            for h in COMPARED:
                assert ours.headers.get(h) == theirs.headers.get(h), (line, h)
            if ours.status in (200, 206):
                assert ours.body == theirs.body, line
        assert seen[-11:] == [206, 206, 200, 200, 500, 405, 500, 200, 500, 200, 404]
        # A cut file is shorter than the whole one, and an MP4 again that ffprobe reads as
        # the 3.5 s after the start (6 s file), its 64-bit offsets ones too.
        for f in ("tail", "co64"):
            cut = exchange(srv.port, get(f"/v/{f}.mp4?start=2.5"))
            assert cut.status == 200 and len(cut.body) < len(media[f]) and cut.body[4:8] == b"ftyp"
            out = tmp_path / f"cut-{f}.mp4"
            out.write_bytes(cut.body)
            probe = subprocess.run(
                ["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0", str(out)],
                capture_output=True, text=True, timeout=60, check=True,
            )
            assert 3.3 < float(probe.stdout) < 3.7, probe.stdout
        log = (tmp_path / "gannet" / "error.log").read_text()
        for line in ("mp4 start time exceeds file duration", "mp4 stts atom too small",
                     "mp4 moov atom is too large:", "you may want to increase mp4_max_buffer_size"):
            assert line in log


def test_mp4_directives_checked(tmp_path):
    n, g = check_both(tmp_path, "server { listen 127.0.0.1:2; mp4; }")
    assert n.returncode != 0 and g.returncode != 0
    assert '"mp4" directive is not allowed here' in n.stderr and '"mp4" directive is not allowed here' in g.stderr
    for bad, msg in (("mp4_buffer_size 1q;", '"mp4_buffer_size" directive invalid value'),
                     ("mp4_start_key_frame maybe;", 'invalid value "maybe" in "mp4_start_key_frame" directive'),
                     ("mp4_max_buffer_size 1m; mp4_max_buffer_size 2m;", '"mp4_max_buffer_size" directive is duplicate')):
        n, g = check_both(tmp_path, bad)
        assert n.returncode != 0 and g.returncode != 0, bad
        assert msg in n.stderr and msg in g.stderr, (bad, n.stderr, g.stderr)
    n, g = check_both(tmp_path, "mp4_buffer_size 1m; mp4_max_buffer_size 20m; mp4_start_key_frame on;")
    assert n.returncode == 0 and g.returncode == 0, g.stderr


def test_mp4_broken_files_answer_500_not_crash(gannet, media):
    """Files cut short or with bytes of their moov overwritten (the same ones each run): each
    answer is the file (200) or a 500 with an mp4 log line, and the worker stays up."""
    import random

    head = media["head"]
    moov = head.index(b"moov") - 4
    moov_end = moov + int.from_bytes(head[moov:moov + 4], "big")
    rnd = random.Random(4)
    files = {}
    for i in range(60):
        b = bytearray(head)
        if i < 10:
            b = b[: rnd.randrange(16, len(b))]
        else:
            for _ in range(1 + i % 4):
                at = rnd.randrange(moov, moov_end)
                b[at] = rnd.choice((0, 1, 0xFF, b[at] ^ 0x80, rnd.randrange(256)))
        files[f"v/b{i}.mp4"] = bytes(b)
    srv = gannet.start(files=files, server="location /v/ { mp4; mp4_start_key_frame on; }")
    statuses = set()
    for i in range(60):
        for q in ("start=1", "start=2.2&end=4", "end=1.5"):
            r = exchange(srv.port, get(f"/v/b{i}.mp4?{q}"))
            assert r.status in (200, 500), (i, q, r.status)
            statuses.add(r.status)
    assert statuses == {200, 500}
    assert exchange(srv.port, get("/v/b0.mp4")).status == 200
    log = srv.error_log()
    assert "mp4" in log and "panicked" not in log
