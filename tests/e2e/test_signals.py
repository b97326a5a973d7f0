"""SIGUSR1 (`gannet -s reopen`) and SIGHUP (`gannet -s reload`) as logrotate and an admin use
them: logs moved away are reopened by name; a changed config is served after a reload, a
broken one is logged with its file:line while the running one keeps serving, a response in
flight when the reload comes is finished by the old worker, and new connections are never
refused while workers change (listening sockets are kept across reloads), also when the
number of workers or the listen addresses change.
"""

import hashlib
import signal
import socket
import subprocess
import threading

from conftest import free_port, gannet_bin, wait_until


def signal_cli(srv, what):
    r = subprocess.run([str(gannet_bin()), "-s", what, "-c", str(srv.conf_path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def text_of(srv, path, port=None):
    status, _, data = srv.get(path, port=port)
    return status, data.decode()


def rewrite_conf(gannet, srv, server, **kw):
    text, _ = gannet.render(server=server, port=srv.port, **kw)
    srv.conf_path.write_text(text)
    return text


def test_sigusr1_reopens_access_and_error_logs(gannet):
    srv = gannet.start(files={"a.txt": "a", "b.txt": "b"})
    assert srv.get("/a.txt")[0] == 200
    log, err = gannet.tmp / "access.log", gannet.tmp / "error.log"
    assert wait_until(lambda: "/a.txt" in srv.access_log())
    log.rename(gannet.tmp / "access.log.1")
    err.rename(gannet.tmp / "error.log.1")
    signal_cli(srv, "reopen")
    assert wait_until(lambda: log.exists() and err.exists()), "the logs were not created again"
    # The master reopens the files and hands them to the worker, which puts them in place
    # when its event loop reads its channel: until then its lines still go to the moved
    # files (as nginx's do until each worker has reopened). Asked until a line lands in the
    # new file, which is then the worker's.
    assert wait_until(lambda: srv.get("/b.txt")[0] == 200 and "/b.txt" in log.read_text())
    assert srv.get("/a.txt?after")[0] == 200
    assert wait_until(lambda: "/a.txt?after" in log.read_text())
    rotated = (gannet.tmp / "access.log.1").read_text()
    assert "/a.txt " in rotated and "after" not in rotated
    assert wait_until(lambda: "reopened the log files" in err.read_text())


def test_sighup_applies_a_new_config_and_keeps_the_old_on_error(gannet):
    srv = gannet.start(server='location = /v { return 200 "one\\n"; }')
    assert text_of(srv, "/v") == (200, "one\n")
    rewrite_conf(gannet, srv, 'location = /v { return 200 "two\\n"; }')
    signal_cli(srv, "reload")
    assert wait_until(lambda: text_of(srv, "/v") == (200, "two\n"))
    text = rewrite_conf(gannet, srv, 'location = /v { return 200 "three\\n"; }\n        frobnicate on;')
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "frobnicate" in t)
    # `gannet -s reload` reads the config too (for the pid file) and refuses a bad one, as
    # nginx does; a plain SIGHUP reaches the master, which must keep serving.
    r = subprocess.run([str(gannet_bin()), "-s", "reload", "-c", str(srv.conf_path)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and f"gannet.conf:{line}:" in r.stderr
    srv.proc.send_signal(signal.SIGHUP)
    want = f'gannet.conf:{line}: unknown directive "frobnicate"; the running configuration is kept'
    assert wait_until(lambda: want in srv.error_log()), srv.error_log()
    assert text_of(srv, "/v") == (200, "two\n")
    assert srv.proc.poll() is None


BIG = bytes(range(256)) * (64 * 1024)  # 16 MB: more than the socket buffers hold


def test_reload_lets_a_response_in_flight_finish(gannet):
    srv = gannet.start(files={"big.bin": BIG}, server='location = /v { return 200 "one\\n"; }')
    busy = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        busy.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        got = busy.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ")
        rewrite_conf(gannet, srv, 'location = /v { return 200 "two\\n"; }')
        signal_cli(srv, "reload")
        assert wait_until(lambda: text_of(srv, "/v") == (200, "two\n"))
        _, body = got.split(b"\r\n\r\n", 1)
        while len(body) < len(BIG) and (chunk := busy.recv(1 << 20)):
            body += chunk
        assert hashlib.sha256(body).digest() == hashlib.sha256(BIG).digest()
    finally:
        busy.close()


def test_no_connection_is_refused_across_reloads(gannet):
    """Requests on new connections run all through several reloads, which also change the
    number of workers; every one must be answered."""
    srv = gannet.start(server='location = /v { return 200 "0\\n"; }')
    failures, answered, stop = [], [0], threading.Event()

    def client():
        while not stop.is_set():
            try:
                status, _ = text_of(srv, "/v")
                if status != 200:
                    failures.append(status)
                answered[0] += 1
            except OSError as e:
                failures.append(repr(e))

    t = threading.Thread(target=client)
    t.start()
    try:
        for n, workers in enumerate([2, 1, 3, 1], start=1):
            text, _ = gannet.render(server=f'location = /v {{ return 200 "{n}\\n"; }}', port=srv.port)
            srv.conf_path.write_text(text.replace("worker_processes 1;", f"worker_processes {workers};"))
            signal_cli(srv, "reload")
            assert wait_until(lambda: text_of(srv, "/v") == (200, f"{n}\n")), n
    finally:
        stop.set()
        t.join(30)
    assert answered[0] > 0
    assert not failures, failures[:5]


def test_reload_adds_and_removes_listen_addresses(gannet):
    srv = gannet.start(server='location = /v { return 200 "main\\n"; }')
    extra = free_port()
    rewrite_conf(gannet, srv, 'location = /v { return 200 "main\\n"; }', http=f'server {{ listen 127.0.0.1:{extra}; return 200 "extra\\n"; }}')
    signal_cli(srv, "reload")
    assert wait_until(lambda: _answers(srv, extra) == "extra\n")
    rewrite_conf(gannet, srv, 'location = /v { return 200 "main\\n"; }')
    signal_cli(srv, "reload")
    assert wait_until(lambda: _answers(srv, extra) is None), "the removed address still answers"
    assert text_of(srv, "/v") == (200, "main\n")


def _answers(srv, port):
    try:
        status, data = text_of(srv, "/", port=port)
        return data
    except OSError:
        return None


def test_graceful_stop_does_not_linger_on_a_connection_the_client_closes(gannet):
    # An HTTP/1.0 request (no keep-alive) in flight at SIGQUIT: its answer ends with the
    # close the client asked for, and nothing is unread, so the draining worker closes
    # at once, as nginx does, rather than waiting (up to 2 s) for the client to close
    # first: a client that holds its socket does not hold the stop.
    import time

    srv = gannet.start(files={"big.bin": BIG})
    busy = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        busy.sendall(b"GET /big.bin HTTP/1.0\r\nHost: x\r\n\r\n")
        got = busy.recv(65536)
        assert got.startswith(b"HTTP/1.1 200 ")
        srv.proc.send_signal(signal.SIGQUIT)
        while chunk := busy.recv(1 << 20):
            got += chunk
        ended = time.monotonic()
        srv.proc.wait(10)
        assert time.monotonic() - ended < 1.0
    finally:
        busy.close()
