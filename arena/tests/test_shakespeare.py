"""The Shakespeare app as the dynamic scenarios use it, against the real pool and database:
the URL mix (drawn from the app, checked against MariaDB), the PHP tier as a process set, the
pinning of the back end and its undoing, the expected byte counts of each client, and the
message when the app is not set up."""

from __future__ import annotations

import os
import subprocess

import pytest

from arena import procs, shakespeare
from arena.errors import ArenaError
from arena.scenarios._php_app import cycle_counts, h2load_bodies, wrk_bytes_bounds


@pytest.fixture(scope="module")
def urls():
    shakespeare.ready()
    return shakespeare.url_list()


def db(sql: str) -> list[list[str]]:
    done = subprocess.run(["mariadb", "-N", "-B", "shakespeare", "-e", sql], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    return [line.split("\t") for line in done.stdout.splitlines()]


def test_url_mix_is_the_documented_list(urls):
    """The front page, then per work (by slug) the work, its first act and that act's first
    scene, each as HTML then JSON; every body size is the app's real answer."""
    works = db("SELECT w.slug, MIN(c.act) FROM works w JOIN chapters c ON c.work_id = w.id GROUP BY w.slug")
    assert [u.path for u in urls[:2]] == ["/", "/.json"]
    assert len(urls) == 2 + 6 * len(works)
    for i, (slug, act) in enumerate(sorted(works)):
        (scene,) = db(f"SELECT MIN(c.scene) FROM chapters c JOIN works w ON w.id = c.work_id "
                      f"WHERE w.slug = '{slug}' AND c.act = {act}")[0]
        page = [f"/{slug}", f"/{slug}/{act}", f"/{slug}/{act}/{scene}"]
        assert [u.path for u in urls[2 + 6 * i: 8 + 6 * i]] == [p + suffix for p in page for suffix in ("", ".json")]
    for u in urls[::37]:
        status, body = shakespeare.fetch(u.path)
        assert status == 200 and len(body) == u.body_bytes


def test_url_mix_is_deterministic(urls, tmp_path):
    again = shakespeare.url_list()
    assert again == urls and shakespeare.digest(again) == shakespeare.digest(urls)
    paths = shakespeare.write_urls(urls, tmp_path / "paths.txt").read_text().splitlines()
    absolute = shakespeare.write_urls(urls, tmp_path / "urls.txt", "http://127.0.0.1:8080").read_text().splitlines()
    assert paths[:2] == ["/", "/.json"] and absolute[1] == "http://127.0.0.1:8080/.json"
    assert len(paths) == len(absolute) == len(urls)


def test_php_tier_is_the_master_and_this_pools_children(urls):
    tier = shakespeare.PhpTier.find()
    pids = tier.pids()
    assert pids[0] == tier.master and tier.pool == "shakespeare"
    titles = {open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip() for pid in pids[1:]}
    assert titles == {"php-fpm: pool shakespeare"}
    children = int(os.environ.get("SHAKESPEARE_FPM_CHILDREN", "100"))
    assert len(pids) == 1 + children
    # The master's other pools (the TCP one, Debian's www) are not counted.
    assert len(procs.process_tree(tier.master)) > len(pids)


def test_pool_name_is_read_from_the_pool_files(tmp_path):
    (tmp_path / "a.conf").write_text("[www]\nlisten = /run/php/php8.2-fpm.sock\n")
    (tmp_path / "b.conf").write_text("; comment\n[app]\nuser = www-data\nlisten = /tmp/app.sock\n[other]\nlisten = 127.0.0.1:9000\n")
    assert shakespeare.pool_name("/tmp/app.sock", tmp_path) == "app"
    with pytest.raises(ArenaError, match="no PHP-FPM pool .* listens on /tmp/none.sock"):
        shakespeare.pool_name("/tmp/none.sock", tmp_path)


def test_backend_is_pinned_and_given_back(urls):
    tier = shakespeare.PhpTier.find()
    threads = shakespeare.backend_threads(tier)
    before = {tid: os.sched_getaffinity(tid) for _, tid in threads}
    pinned = shakespeare.pin(tier, {0})
    try:
        assert all(os.sched_getaffinity(tid) == {0} for _, tid in threads if procs.alive(tid))
    finally:
        shakespeare.unpin(tier, pinned)
    assert all(os.sched_getaffinity(tid) == before[tid] for _, tid in threads if procs.alive(tid))


def test_not_set_up_says_which_command_to_run(monkeypatch, tmp_path):
    # A pool socket that does not exist and no setup.sh to run: the message names the command.
    monkeypatch.setattr(shakespeare, "SOCKET", str(tmp_path / "none.sock"))
    monkeypatch.setattr(shakespeare, "SETUP", tmp_path / "no-setup.sh")
    assert "no PHP-FPM pool listens on unix:" in shakespeare.problem()
    with pytest.raises(ArenaError, match=r"the Shakespeare app is not set up \(no PHP-FPM pool listens on "
                                         r"unix:.*none.sock\): run `sudo apps/shakespeare/setup.sh`"):
        shakespeare.ready()


def test_cycle_and_h2load_counts_match_a_simulation():
    sizes = [5, 70, 300, 11]
    for requests, clients in [(10, 3), (7, 7), (1000, 13), (4, 1)]:
        simulated = 0
        each, extra = divmod(requests, clients)
        for client in range(clients):
            for k in range(each + (1 if client < extra else 0)):
                simulated += sizes[k % len(sizes)]
        assert h2load_bodies(sizes, requests, clients) == simulated
    assert cycle_counts(4, 10) == [3, 3, 2, 2]


def test_wrk_bounds_hold_the_exact_cases():
    sizes = [100, 1000, 10]
    # Nothing abandoned: exactly the bodies of the first `sent` requests plus their heads.
    low, high = wrk_bytes_bounds(sizes, 6, 6, (200, 200))
    body = 2 * sum(sizes)
    assert low <= body + 6 * 200 <= high and high - low == 6 * 2 * 16
    # Two abandoned: the completed ones are any 4 of the 6.
    low, high = wrk_bytes_bounds(sizes, 6, 4, (200, 200))
    assert low <= (10 + 10 + 100 + 100) + 4 * 184 and high >= (1000 + 1000 + 100 + 100) + 4 * 216
