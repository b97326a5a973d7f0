"""The config corpus (tests/configs/, see its README.md): each real-world config through
`nginx -t` and `gannet -t`, then both servers started once on it and every request of its
requests.yaml sent to both, the parts that matter compared. A config listed in
tests/configs/KNOWN_GAPS.md is xfail(strict=True): when gannet closes the gap the test
XPASSes and fails, so the list must shrink with it.
"""

from __future__ import annotations

import pytest

from corpus_lib import NGINX, PHP_FPM, Services, config_names, known_gaps, run_config

pytestmark = pytest.mark.skipif(NGINX is None or PHP_FPM is None, reason="nginx and php-fpm are installed by scripts/test-all.sh")

GAPS = known_gaps()


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    svc = Services(tmp_path_factory.mktemp("corpus-services"))
    yield svc
    svc.close()


def test_every_gap_names_a_config():
    assert set(GAPS) <= set(config_names()), set(GAPS) - set(config_names())


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=GAPS[n])) if n in GAPS else n for n in config_names()],
)
def test_config(name, services, tmp_path):
    res = run_config(name, tmp_path, services)
    assert res.passed, res.report()
