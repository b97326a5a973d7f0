"""Shared test helpers: fixture files, and a real docroot + server started through the arena's
own adapters (tests that need a server start the real one)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from arena import ports
from arena.servers import SERVERS, Site, SiteOptions
from arena.workload import make_docroot

FIXTURES = Path(__file__).with_name("fixtures")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="arena-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def docroot(workdir):
    files = make_docroot(workdir / "www")
    return workdir / "www", files


@pytest.fixture
def nginx(workdir, docroot):
    """A real nginx (tuned profile) on a free port, pinned to CPU 0; stopped afterwards."""
    site = Site(docroot[0], ports.free_port(), SiteOptions())
    server = SERVERS["nginx"].start(site, workdir / "nginx", "tuned", "0")
    yield server
    server.stop()
