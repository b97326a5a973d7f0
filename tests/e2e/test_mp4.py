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
    return {"tail": tail, "head": head, "big": big}


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
        "tiny/head.mp4": media["head"], "plain/head.mp4": media["head"],
    }
    cases = [get("/v/head.mp4"), get("/v/head.mp4?start=0"), get("/v/tail.mp4?start=0")]
    for f in ("head", "tail", "big"):
        for q in ("start=1", "start=2.5", "start=3.999", "start=1&end=3", "end=2.2", "start=4&end=1",
                  "start=0.04", "start=5.9", "start=abc", "start=1.2.3"):
            cases.append(get(f"/v/{f}.mp4?{q}"))
    for f in ("head", "big"):
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
        # A cut file is shorter than the whole one, and is an MP4 again.
        cut = exchange(srv.port, get("/v/tail.mp4?start=2.5"))
        assert cut.status == 200 and len(cut.body) < len(media["tail"]) and cut.body[4:8] == b"ftyp"
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
