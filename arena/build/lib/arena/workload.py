"""The document root every server serves: the studies' files, generated locally.

- img.jpg: S1's wallpaper, a 1920x1200 JPEG of exactly 394 KiB (403,456 bytes). It is drawn
  deterministically (seeded noise over gradients), encoded at the highest quality that stays
  under the target, then padded to the exact size with JPEG comment segments, so every run and
  every machine serves the same byte count.
- robots.txt: S2's file.
- index.html: a small static page (S5's static workload, c10k's requests).
"""

from __future__ import annotations

import gzip

import io
import os
from pathlib import Path

IMAGE_NAME = "img.jpg"
IMAGE_SIZE = 394 * 1024
IMAGE_WIDTH, IMAGE_HEIGHT = 1920, 1200

ROBOTS = (
    "User-agent: *\n"
    "Disallow: /private/\n"
    "Disallow: /tmp/\n"
    "Disallow: /cgi-bin/\n"
    "Allow: /\n"
    "\n"
    "# The arena serves this file in the S2 rate sweep (httperf, 10 calls per connection).\n"
    "Sitemap: http://127.0.0.1/sitemap.xml\n"
)

INDEX = (
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>arena</title></head>\n"
    "<body>\n<h1>The arena</h1>\n"
    + "".join(f"<p>Paragraph {i}: the quick brown fox jumps over the lazy dog.</p>\n" for i in range(40))
    + "</body>\n</html>\n"
)


def _draw(quality: int) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(394)
    y, x = np.mgrid[0:IMAGE_HEIGHT, 0:IMAGE_WIDTH].astype(np.float32)
    base = np.stack([
        128 + 100 * np.sin(x / 173.0) * np.cos(y / 211.0),
        128 + 100 * np.sin((x + y) / 307.0),
        128 + 100 * np.cos(x / 97.0 - y / 151.0),
    ], axis=-1)
    noise = rng.normal(0, 14, size=base.shape).astype(np.float32)
    pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _pad(jpeg: bytes, size: int) -> bytes:
    """Insert COM (0xFFFE) segments after SOI until the file is exactly `size` bytes."""
    missing = size - len(jpeg)
    segments = []
    while missing > 0:
        # A segment is 2 marker bytes + 2 length bytes + payload; the length counts itself.
        payload = min(missing - 4, 65533)
        if 0 < missing - (payload + 4) < 4:
            payload -= 4  # leave room for one more whole segment
        if payload < 0:
            raise ValueError("cannot pad by fewer than 4 bytes")
        segments.append(b"\xff\xfe" + (payload + 2).to_bytes(2, "big") + b" " * payload)
        missing -= payload + 4
    return jpeg[:2] + b"".join(segments) + jpeg[2:]


def make_image(size: int = IMAGE_SIZE) -> bytes:
    """The S1 wallpaper: highest quality whose encoding leaves room to pad to `size`."""
    low, high, best = 10, 95, None
    while low <= high:
        quality = (low + high) // 2
        data = _draw(quality)
        if len(data) <= size - 4 or len(data) == size:
            best, low = data, quality + 1
        else:
            high = quality - 1
    if best is None:
        raise RuntimeError("cannot encode the wallpaper under the target size")
    return _pad(best, size) if len(best) != size else best


_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gannet-arena"


def image_bytes() -> bytes:
    """The wallpaper, from a cache keyed by its size (drawing it takes about a second)."""
    cached = _CACHE / f"wallpaper-{IMAGE_SIZE}.jpg"
    try:
        data = cached.read_bytes()
        if len(data) == IMAGE_SIZE:
            return data
    except OSError:
        pass
    data = make_image()
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(cached)
    except OSError:
        pass  # a read-only home only costs us the cache
    return data


def make_docroot(path: Path) -> dict[str, int]:
    """Write the served files into `path`; return name -> size in bytes.

    Everything is world-readable because servers started as root serve as nobody/www-data.
    """
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    files = {IMAGE_NAME: image_bytes(), "robots.txt": ROBOTS.encode(), "index.html": INDEX.encode()}
    # Precompressed copies for the static-gz site (gzip_static and equivalents); made as
    # `gzip -9n` would, so every server sends the same bytes.
    compressed = {f"{name}.gz": gzip.compress(files[name], 9, mtime=0) for name in ("robots.txt", "index.html")}
    for name, data in {**files, **compressed}.items():
        target = path / name
        target.write_bytes(data)
        target.chmod(0o644)
    return {name: len(data) for name, data in files.items()}
