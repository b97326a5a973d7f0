"""SSI includes run side by side, as nginx's: the includes of a page all reach their upstream
before any of them answers, and their bodies still go out in the page's order. An include
the page waits for (`wait="yes"`) is done before the page is parsed on."""

from __future__ import annotations

import threading

import pytest

import rawapps


@pytest.fixture
def apps():
    yield from rawapps.made(rawapps.HttpApp)


def barrier_app(apps, parties: int, wait: float = 4):
    """Answers `/x/NAME` with `<NAME>` only once `parties` requests are in at the same
    time (all at once: the later includes' answers come before the first's is read);
    a request that waits `wait` seconds in vain is answered `alone-NAME`."""
    barrier = threading.Barrier(parties, timeout=wait)

    def behave(conn, head, _body):
        name = head.split(b" ")[1].rsplit(b"/", 1)[1]
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            conn.sendall(rawapps.http_answer(b"alone-" + name, keep=False))
            return
        conn.sendall(rawapps.http_answer(b"<" + name + b">", keep=False))

    return apps(behave)


def conf(port: int) -> str:
    return f"""
        location /x/ {{ proxy_pass http://127.0.0.1:{port}; proxy_read_timeout 6s; }}
        location /page {{ ssi on; default_type text/html; }}
    """


def test_includes_run_side_by_side_in_page_order(gannet, apps):
    app = barrier_app(apps, 3)
    page = 'A<!--# include virtual="/x/one" -->B<!--# include virtual="/x/two" -->C<!--# include virtual="/x/three" -->D'
    srv = gannet.start(files={"page": page}, server=conf(app.port))
    status, _, body = srv.get("/page")
    assert status == 200
    assert body == b"A<one>B<two>C<three>D"


def test_waited_include_runs_alone(gannet, apps):
    # The page is not parsed past a `wait="yes"` include until it is done: the include after
    # it is not under way meanwhile, so the first one's upstream sees it come in alone.
    app = barrier_app(apps, 2, wait=1)
    page = '<!--# include virtual="/x/one" wait="yes" -->|<!--# include virtual="/x/two" -->'
    srv = gannet.start(files={"page": page}, server=conf(app.port))
    status, _, body = srv.get("/page")
    assert status == 200
    assert body == b"alone-one|alone-two"
