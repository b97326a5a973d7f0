"""nginx's other flags: `-g` (main-context directives before the file's; one also in the
file is a "duplicate"), `-e` (the error log when the config names none, and for start-up
errors), `-T` (the config with every included file), `-q`, Debian's unit line
`-g 'daemon on; master_process on;'`, `master_process off`, and the default config path
(`GANNET_DEFAULT_CONF` standing in for `/etc/gannet/gannet.conf`).
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
from pathlib import Path

from conftest import free_port, gannet_bin, wait_port, wait_until

CONF = """pid {tmp}/gannet.pid;
events {}
http {
    include {tmp}/site.conf;
}
user root;
"""
SITE = "server { listen 127.0.0.1:%d; root %s; }\n"


def setup(tmp: Path, conf: str = CONF) -> tuple[Path, int]:
    port = free_port()
    (tmp / "www").mkdir(exist_ok=True)
    (tmp / "www" / "a.txt").write_text("A")
    (tmp / "site.conf").write_text(SITE % (port, tmp / "www"))
    path = tmp / "gannet.conf"
    path.write_text(conf.replace("{tmp}", str(tmp)))
    return path, port


def run(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(gannet_bin()), *args], capture_output=True, text=True, timeout=30, **kw)


def get(port: int, path: str) -> bytes:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    c.close()
    return body if r.status == 200 else b"%d" % r.status


def test_g_adds_main_directives_and_a_file_duplicate_is_an_error(tmp_path):
    conf, _ = setup(tmp_path)
    assert run("-t", "-c", str(conf), "-g", "worker_processes 2; master_process on;").returncode == 0
    r = run("-t", "-c", str(conf), "-g", f"pid {tmp_path}/other.pid;")
    assert r.returncode == 1
    assert f'{conf}:1: "pid" directive is duplicate' in r.stderr, r.stderr
    r = run("-t", "-c", str(conf), "-g", "bogus on;")
    assert r.returncode == 1 and 'command line: unknown directive "bogus"' in r.stderr, r.stderr
    r = run("-t", "-c", str(conf), "-g", "master_process maybe;")
    assert 'command line: invalid value "maybe" in "master_process" directive' in r.stderr, r.stderr


def test_debian_unit_line_daemon_on_master_process_on(tmp_path):
    conf, port = setup(tmp_path)
    r = run("-c", str(conf), "-g", "daemon on; master_process on;")
    assert r.returncode == 0, r.stderr
    pid_file = tmp_path / "gannet.pid"
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip())
    try:
        wait_port(port)
        assert get(port, "/a.txt") == b"A"
    finally:
        assert run("-s", "stop", "-c", str(conf)).returncode == 0
    assert wait_until(lambda: not pid_file.exists())


def test_master_process_off_is_one_foreground_process(tmp_path):
    conf, port = setup(tmp_path)
    proc = subprocess.Popen([str(gannet_bin()), "-c", str(conf), "-g", "master_process off;"])
    try:
        wait_port(port, proc)
        assert get(port, "/a.txt") == b"A"
        assert (tmp_path / "gannet.pid").read_text().strip() == str(proc.pid)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0


def test_T_prints_every_file_read(tmp_path):
    conf, _ = setup(tmp_path)
    r = run("-T", "-c", str(conf))
    assert r.returncode == 0, r.stderr
    main, site = conf.read_text(), (tmp_path / "site.conf").read_text()
    assert r.stdout == f"# configuration file {conf}:\n{main}\n# configuration file {tmp_path}/site.conf:\n{site}\n"
    assert "test is successful" in r.stderr
    q = run("-T", "-q", "-c", str(conf))
    assert q.stdout == r.stdout and q.stderr == ""


def test_q_prints_only_errors(tmp_path):
    conf, _ = setup(tmp_path)
    assert run("-t", "-q", "-c", str(conf)).stderr == ""
    (tmp_path / "site.conf").write_text("server { bogus; }\n")
    r = run("-t", "-q", "-c", str(conf))
    assert r.returncode == 1 and f'{tmp_path}/site.conf:1: unknown directive "bogus"' in r.stderr


def test_e_is_the_error_log_when_the_config_names_none(tmp_path):
    conf, port = setup(tmp_path)
    log = tmp_path / "e.log"
    proc = subprocess.Popen([str(gannet_bin()), "-c", str(conf), "-e", str(log)], stderr=subprocess.PIPE)
    try:
        wait_port(port, proc)
        assert get(port, "/nope") == b"404"
        assert wait_until(lambda: log.exists() and "open()" in log.read_text()), log.read_text() if log.exists() else ""
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert b"open()" not in err
    # Before the config is read: a start-up error goes to it too.
    r = run("-c", str(tmp_path / "missing.conf"), "-e", str(log))
    assert r.returncode == 1 and "missing.conf" in r.stderr
    assert re.search(r"\[emerg\] \d+#\d+: open\(\) \".*missing\.conf\" failed", log.read_text())
    # `-e stderr` and a config's own error_log: the config's wins.
    conf.write_text(conf.read_text() + f"error_log {tmp_path}/own.log;\n")
    proc = subprocess.Popen([str(gannet_bin()), "-c", str(conf), "-e", "stderr"], stderr=subprocess.PIPE)
    try:
        wait_port(port, proc)
        assert get(port, "/gone") == b"404"
        assert wait_until(lambda: "/gone" in (tmp_path / "own.log").read_text())
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert b"/gone" not in err


def test_default_config_path_when_no_c(tmp_path):
    conf, port = setup(tmp_path, CONF.replace("{tmp}/site.conf", "site.conf"))
    env = {**os.environ, "GANNET_DEFAULT_CONF": str(conf)}
    r = run("-t", env=env)
    assert r.returncode == 0 and f"configuration file {conf} test is successful" in r.stderr, r.stderr
    proc = subprocess.Popen([str(gannet_bin())], env=env, cwd="/")
    try:
        wait_port(port, proc)
        assert get(port, "/a.txt") == b"A"
    finally:
        proc.terminate()
        proc.wait(10)
    # Absent: the embedded default, serving the current directory.
    env["GANNET_DEFAULT_CONF"] = str(tmp_path / "absent.conf")
    r = run("-t", env=env)
    assert r.returncode == 0 and "(embedded default) test is successful" in r.stderr, r.stderr



# --- as nginx's test suite (nginx-tests' lib/Test/Nginx.pm) runs the binary -----------------

def test_relative_c_is_under_the_prefix_as_nginx_tests_start_it(tmp_path):
    """Test::Nginx runs `BIN -p DIR/ -c nginx.conf -e error.log -g 'pid ...; error_log ...
    debug;'` from another directory, waits for the pid file, and stops with SIGQUIT; the
    error log must then hold no [alert]."""
    port = free_port()
    (tmp_path / "a.txt").write_text("A")
    (tmp_path / "nginx.conf").write_text(
        "daemon off;\nuser root;\nevents {}\nhttp {\n    root %s;\n    access_log %s/access.log;\n"
        "    server { listen 127.0.0.1:%d; }\n}\n" % (tmp_path, tmp_path, port)
    )
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    globals_ = f"pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log debug;"
    proc = subprocess.Popen(
        [str(gannet_bin()), "-p", f"{tmp_path}/", "-c", "nginx.conf", "-e", "error.log", "-g", globals_],
        cwd=elsewhere, stderr=subprocess.PIPE,
    )
    try:
        wait_until(lambda: (tmp_path / "nginx.pid").exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.stderr.read()
        wait_port(port, proc)
        assert get(port, "/a.txt") == b"A"
        assert int((tmp_path / "nginx.pid").read_text()) == proc.pid
    finally:
        proc.send_signal(15 if proc.poll() is not None else 3)  # SIGQUIT, as Test::Nginx::stop
        proc.wait(timeout=20)
    assert "[alert]" not in (tmp_path / "error.log").read_text()
    # -t too: the same relative name under the prefix.
    r = run("-t", "-p", f"{tmp_path}/", "-c", "nginx.conf", "-g", globals_, cwd=elsewhere)
    assert r.returncode == 0, r.stderr


def debian_nginx_configure_args() -> set[str]:
    r = subprocess.run(["/usr/sbin/nginx", "-V"], capture_output=True, text=True, timeout=10)
    # A dynamic module (`--with-stream=dynamic`) is the same module.
    return {a.removesuffix("=dynamic") for a in r.stderr.split("configure arguments:", 1)[1].split()}


def test_V_is_nginx_style_and_names_only_real_nginx_modules():
    """nginx-tests' has_version()/has() read `-V`: the version line as nginx's, and module
    switches in nginx's own spelling. The `--with-` ones gannet claims are those Debian's
    nginx is built with (the same names, not invented ones)."""
    r = run("-V")
    assert r.returncode == 0
    lines = r.stderr.splitlines()
    assert re.match(r"nginx version: nginx/1\.22\.1 \(gannet/\d+\.\d+", lines[0]), lines[0]
    assert "TLS SNI support enabled" in lines
    args = r.stderr.split("configure arguments:", 1)[1].split()
    withs = {a for a in args if a.startswith("--with-")}
    assert {"--with-http_ssl_module", "--with-http_v2_module", "--with-http_realip_module"} <= withs
    assert withs <= debian_nginx_configure_args()
    # What gannet lacks is off or not named: nginx-tests skips http_v3...; what it has of
    # the default modules (ssi, memcached, grpc, the cache) is not switched off.
    assert not re.search(r"--without-http_(ssi|memcached|grpc)_module|--without-http-cache", r.stderr)
    assert {"--with-http_dav_module", "--with-http_stub_status_module", "--with-stream",
            "--with-http_slice_module", "--with-http_mp4_module", "--with-mail",
            "--with-mail_ssl_module"} <= withs
    assert not re.search(r"http_v3|OpenSSL", r.stderr)
    v = run("-v")
    assert v.returncode == 0 and v.stderr.strip() == lines[0]
