"""The served files: S1's wallpaper is a real 1920x1200 JPEG of exactly 394 KiB."""

from __future__ import annotations

import io

from PIL import Image

from arena.workload import IMAGE_SIZE, _pad, make_image


def test_wallpaper_is_a_valid_jpeg_of_the_exact_size(docroot):
    path, files = docroot
    data = (path / "img.jpg").read_bytes()
    assert len(data) == IMAGE_SIZE == files["img.jpg"] == 394 * 1024
    image = Image.open(io.BytesIO(data))
    image.load()
    assert image.format == "JPEG" and image.size == (1920, 1200)
    assert (path / "robots.txt").stat().st_mode & 0o444 == 0o444


def test_padding_reaches_any_size_with_valid_segments():
    small = make_image(size=200_000)
    assert len(small) == 200_000
    Image.open(io.BytesIO(small)).load()
    jpeg = b"\xff\xd8" + b"\x00" * 10 + b"\xff\xd9"
    for target in (len(jpeg) + 4, len(jpeg) + 65_541, len(jpeg) + 70_000):
        assert len(_pad(jpeg, target)) == target
