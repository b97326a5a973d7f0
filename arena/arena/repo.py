"""Where the gannet repository is (its release binary, conf/mime.types, apps/shakespeare): the
arena also runs from a non-editable `pip install ./arena`, whose package lives in
site-packages, far from any checkout.

In order: `--repo PATH` (which sets ARENA_REPO before the servers and the app are first
imported), the ARENA_REPO environment variable, the checkout this package is part of (an
editable install or a run from the source tree), the current folder if it is a checkout. None
of these: what needs the checkout (gannet, the PHP app) says to pass --repo."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "ARENA_REPO"


def is_checkout(path: Path) -> bool:
    return (path / "Cargo.toml").is_file() and (path / "apps").is_dir()


def find() -> Path | None:
    given = os.environ.get(ENV)
    if given:
        return Path(given).resolve()
    # arena/arena/repo.py -> the repository root is three levels up in a checkout.
    source = Path(__file__).resolve().parents[2]
    if is_checkout(source):
        return source
    here = Path.cwd()
    return here if is_checkout(here) else None


def root_or_nowhere() -> Path:
    """The checkout, or a path where nothing is: every check that looks for a file in it then
    fails with its own clear message, which adds hint()."""
    return find() or Path("/nonexistent-gannet-checkout")


def hint() -> str:
    """What to add to a "not found" message when there is no checkout."""
    return "" if find() else f" (no gannet checkout found: run from one, or pass --repo PATH / set {ENV})"
