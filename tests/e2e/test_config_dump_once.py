"""`-T` shows a file included twice once, and `-t` on a config that fails names it by its
path under `-p`, on gannet and Debian's nginx alike.
"""

from __future__ import annotations

import subprocess

import pytest

from conftest import gannet_bin
from nginx_peer import NGINX


def run(binary: str, tmp, flag: str) -> str:
    r = subprocess.run([binary, flag, "-p", f"{tmp}/", "-c", "main.conf", "-g", f"pid {tmp}/x.pid;"],
                       capture_output=True, text=True, timeout=30)
    return r.stdout + r.stderr


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_dump_once_and_failure_name(tmp_path):
    (tmp_path / "inc.conf").write_text("env A;\n")
    (tmp_path / "main.conf").write_text(
        f"error_log {tmp_path}/e.log;\ninclude inc.conf;\ninclude inc.conf;\nevents {{}}\n")
    for binary in (str(gannet_bin()), NGINX):
        out = run(binary, tmp_path, "-T")
        assert out.count(f"# configuration file {tmp_path}/inc.conf:") == 1, (binary, out)
    (tmp_path / "inc.conf").unlink()
    for binary in (str(gannet_bin()), NGINX):
        out = run(binary, tmp_path, "-t")
        assert f"configuration file {tmp_path}/main.conf test failed" in out, (binary, out)
