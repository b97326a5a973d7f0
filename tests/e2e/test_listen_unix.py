"""`listen unix:PATH`: HTTP/1.1, h2c and HTTPS (with HTTP/2) over a unix domain socket with
curl --unix-socket; the variables a unix client gets, against Debian's nginx; server_name
and default_server on the socket; the socket file (mode 0666, made by the root master
before the workers drop to `user`, removed at exit and when a reload drops it, an existing
file refused as nginx refuses it); a reload adding one; a binary upgrade keeping it; and
`-t`'s errors as nginx's.

The unix listeners come first in each config: the master binds in config order, so once
the TCP port answers (what the harness waits for) the unix socket listens too.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess

import pytest

from conftest import wait_until
from nginx_peer import NGINX, PEER_MAIN, check_both, side_by_side
from test_binary_upgrade import Upgrade, alive, read_pid

VARS = (
    'return 200 "ra=$remote_addr rp=$remote_port sa=$server_addr sp=$server_port '
    'bra=$binary_remote_addr rra=$realip_remote_addr xff=$proxy_add_x_forwarded_for '
    'sn=$server_name host=$host scheme=$scheme\\n";'
)


def conf(servers: str, main: str = "") -> str:
    return PEER_MAIN + main + "http {\n access_log {tmp}/access.log;\n" + servers + "\n}\n"


def curl(sock, url: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "10", "--unix-socket", str(sock), *args, url],
                          capture_output=True, text=True, timeout=20)


def get(sock, url: str = "http://t/", *args: str) -> str:
    r = curl(sock, url, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout


TWO_SERVERS = """
 server { listen unix:{tmp}/s.sock; listen 127.0.0.1:{port}; server_name a.test; location / { %s } }
 server { listen unix:{tmp}/s.sock default_server; server_name b.test; location / { %s } }
""" % (VARS, VARS)


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_variables_and_server_names_as_nginx(tmp_path):
    with side_by_side(tmp_path, conf(TWO_SERVERS)) as (g, _):
        for host in ("a.test", "b.test", "other.test"):
            ours = get(tmp_path / "gannet" / "s.sock", f"http://{host}/")
            theirs = get(tmp_path / "nginx" / "s.sock", f"http://{host}/")
            assert ours.replace(str(tmp_path / "gannet"), "T") == theirs.replace(str(tmp_path / "nginx"), "T")
        assert "ra=unix: rp= sa=unix:" in ours and "sp= bra=unix:" in ours, ours
        assert "sn=b.test host=other.test" in ours, ours  # the default_server
        log = (tmp_path / "gannet" / "access.log").read_text()
        assert log.startswith("unix: - - ["), log


def test_h2c_and_https_with_h2_over_the_socket(gannet, tmp_path):
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=t.test"], check=True, capture_output=True)
    srv = gannet.start(conf=conf(f"""
 server {{ listen unix:{{tmp}}/tls.sock ssl http2; ssl_certificate {crt}; ssl_certificate_key {key};
          location / {{ return 200 "$scheme $http2 $ssl_protocol $remote_addr\\n"; }} }}
 server {{ listen unix:{{tmp}}/h2c.sock http2; listen 127.0.0.1:{{port}}; location / {{ {VARS} }} }}
"""))
    r = curl(srv.tmp / "h2c.sock", "http://t/", "--http2-prior-knowledge", "-w", "%{http_version}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ra=unix: ") and r.stdout.endswith("\n2"), r.stdout
    r = curl(srv.tmp / "tls.sock", "https://t.test/", "-k", "--http2", "-w", "%{http_version}")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "https h2 TLSv1.3 unix:\n2", r.stdout
    r = curl(srv.tmp / "tls.sock", "https://t.test/", "-k", "--http1.1")
    assert r.stdout == "https  TLSv1.3 unix:\n", r.stdout


def test_socket_file_made_by_root_for_unprivileged_workers_and_removed_at_exit(gannet):
    srv = gannet.start(conf=conf(
        f" server {{ listen unix:{{tmp}}/s.sock; listen 127.0.0.1:{{port}}; location / {{ {VARS} }} }}",
    ).replace("user root;", "user nobody nogroup;"))
    sock = srv.tmp / "s.sock"
    # The TCP port may answer before the master has bound and chmod-ed the socket file.
    wait_until(lambda: sock.exists() and stat.S_IMODE(os.stat(sock).st_mode) == 0o666)
    st = os.stat(sock)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666 and st.st_uid == 0, st
    assert get(sock).startswith("ra=unix: ")
    srv.stop(signal.SIGQUIT)
    assert not sock.exists()


def test_an_existing_file_at_the_path_is_refused_as_nginx_does(gannet, tmp_path):
    (tmp_path / "s.sock").write_text("stale")
    srv = gannet.start(conf=conf(" server { listen unix:{tmp}/s.sock; listen 127.0.0.1:{port}; }"), wait=False)
    assert srv.proc.wait(10) != 0
    err = srv.proc.stderr.read().decode()
    assert f"bind() to unix:{tmp_path}/s.sock failed" in err and "in use" in err, err
    assert (tmp_path / "s.sock").read_text() == "stale"


def test_reload_adds_and_removes_a_unix_listener(gannet):
    tcp_only = conf(" server { listen 127.0.0.1:{port}; location / { return 200 \"tcp\\n\"; } }")
    both = conf(f" server {{ listen unix:{{tmp}}/s.sock; listen 127.0.0.1:{{port}}; location / {{ {VARS} }} }}")
    srv = gannet.start(conf=tcp_only)
    sock = srv.tmp / "s.sock"
    assert not sock.exists()

    def reload_to(text: str):
        srv.conf_path.write_text(text.replace("{port}", str(srv.port)).replace("{tmp}", str(srv.tmp)))
        srv.proc.send_signal(signal.SIGHUP)

    reload_to(both)
    assert wait_until(lambda: sock.exists() and curl(sock, "http://t/").stdout.startswith("ra=unix:"))
    # Kept over a reload that still has it: the same socket file, still answering.
    ino = os.stat(sock).st_ino
    reload_to(both.replace("ra=", "again ra="))
    assert wait_until(lambda: curl(sock, "http://t/").stdout.startswith("again ra=unix:"))
    assert os.stat(sock).st_ino == ino
    reload_to(tcp_only)
    assert wait_until(lambda: not sock.exists())
    assert f"deleting socket {sock}" in srv.error_log()
    # The old workers may take a last connection while the new ones start, as nginx's.
    assert wait_until(lambda: srv.get("/")[2] == b"tcp\n")


def test_binary_upgrade_keeps_the_socket(gannet):
    srv = gannet.start(conf=conf(f" server {{ listen unix:{{tmp}}/s.sock; listen 127.0.0.1:{{port}}; location / {{ {VARS} }} }}")
                       .replace("pid {tmp}/server.pid", "pid {tmp}/gannet.pid"))
    sock = srv.tmp / "s.sock"
    ino = os.stat(sock).st_ino
    up = Upgrade(srv)
    # The port answers once bound, a moment before the master writes its pid file.
    assert wait_until(lambda: read_pid(up.pid) == srv.proc.pid)
    try:
        up.start()
        # The old master leaves: the socket (file and listener) stays with the new one.
        srv.proc.send_signal(signal.SIGQUIT)
        srv.proc.wait(10)
        assert sock.exists() and os.stat(sock).st_ino == ino
        assert get(sock).startswith("ra=unix: ")
        os.kill(up.new, signal.SIGQUIT)
        assert wait_until(lambda: not alive(up.new), 10)
        assert not sock.exists()
    finally:
        up.close()


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
@pytest.mark.parametrize("addr,why", [
    ("unix:/tmp/" + "a" * 103, "too long path in the unix domain socket"),
    ("unix:", "no path in the unix domain socket"),
])
def test_config_errors_as_nginx(tmp_path, addr, why):
    n, g = check_both(tmp_path, f"server {{ listen {addr}; }}")
    assert n.returncode != 0 and g.returncode != 0
    msg = f'{why} in "{addr}" of the "listen" directive'
    assert msg in n.stderr and msg in g.stderr, (n.stderr, g.stderr)
    assert "check.conf:" in g.stderr
    # 107 bytes is the longest path that fits (sun_path holds 108 with the NUL).
    n, g = check_both(tmp_path, "server { listen unix:/tmp/%s; }" % ("a" * 102))
    assert n.returncode == 0 and g.returncode == 0, (n.stderr, g.stderr)


def test_allow_unix_and_set_real_ip_from_unix(gannet):
    # Static files: `return` would answer before the access phase.
    srv = gannet.start(files={"only-unix": "in", "no-unix": "in"}, conf=conf(f"""
 server {{ listen unix:{{tmp}}/u.sock; set_real_ip_from 0.0.0.0/0; location / {{ {VARS} }} }}
 server {{ listen unix:{{tmp}}/s.sock; listen 127.0.0.1:{{port}}; root {{root}};
  location /only-unix {{ allow unix:; deny all; }}
  location /no-unix {{ allow 0.0.0.0/0; deny all; }}
  location /real {{ {VARS} }}
  set_real_ip_from unix:;
 }}
"""))
    sock = srv.tmp / "s.sock"
    code = ["-o", "/dev/null", "-w", "%{http_code}"]
    assert get(sock, "http://t/only-unix", *code) == "200"
    assert srv.get("/only-unix")[0] == 403
    # 0.0.0.0/0 is no network a unix client is in (nginx: only `unix:` and `all` match it).
    assert get(sock, "http://t/no-unix", *code) == "403"
    assert srv.get("/no-unix")[0] == 200
    assert get(sock, "http://t/real", "-H", "X-Real-IP: 192.0.2.7").startswith("ra=192.0.2.7 rp= sa=unix:")
    assert get(srv.tmp / "u.sock", "http://t/", "-H", "X-Real-IP: 192.0.2.7").startswith("ra=unix: ")
