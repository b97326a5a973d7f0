"""The `mail {}` proxy: Python's imaplib, poplib and smtplib as clients, an auth_http server
and IMAP / POP3 / SMTP back ends written here (threads, real sockets) against the real
binary: the login through the auth server reaching the back end it names, a refusal with the
auth server's message and `Auth-Wait`, STARTTLS, SMTP with XCLIENT and without
authentication, the PROXY protocol both ways, `max_errors`; and the dialogue before the
login side by side with Debian's nginx (its mail module loaded).

Each config has a small http server on `{port}` so the harness knows when the process is up
without opening a mail session itself.
"""

from __future__ import annotations

import base64
import imaplib
import os
import poplib
import smtplib
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import free_port, wait_port, wait_until
from nginx_peer import NGINX, NginxPeer
from test_tls import Pki

MAIL_MODULE = "/usr/lib/nginx/modules/ngx_mail_module.so"


def conf(mail: str, load: bool = False) -> str:
    head = f"load_module {MAIL_MODULE};\n" if load else ""
    return head + """
worker_processes 1;
pid {tmp}/server.pid;
error_log {tmp}/error.log info;
events { worker_connections 64; }
http { access_log off; server { listen 127.0.0.1:{port}; return 204; } }
mail {
""" + mail + "\n}\n"


def start(gannet, body: str, *ports: int):
    """gannet on `conf(body)`, once its mail ports take connections too."""
    srv = gannet.start(conf=conf(body))
    for p in ports:
        wait_port(p, srv.proc)
    return srv


class Auth:
    """An auth_http server: `answer(headers) -> dict` gives the response headers; every
    request's headers are kept in `seen`."""

    def __init__(self):
        self.seen: list[dict] = []
        self.answer = lambda h: {}
        auth = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):
                h = {k.lower(): v for k, v in self.headers.items()}
                h[":path"] = self.path
                auth.seen.append(h)
                self.send_response(200)
                for k, v in auth.answer(h).items():
                    self.send_header(k, str(v))
                self.end_headers()

            def log_message(self, *a):
                pass

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


class Backend:
    """A mail server that logs every line it gets (`lines`, per connection in `conns`) and
    answers by `reply(line, conn) -> bytes`, after `greeting`."""

    def __init__(self, greeting: bytes, reply):
        self.greeting, self.reply = greeting, reply
        self.conns: list[list[bytes]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        lines: list[bytes] = []
        self.conns.append(lines)
        f = c.makefile("rb")
        with c:
            c.sendall(self.greeting)
            for line in f:
                lines.append(line)
                out = self.reply(line, lines)
                if out is None:
                    return
                c.sendall(out)

    def close(self):
        self.sock.close()


def imap_reply(line: bytes, lines):
    if line.startswith(b"PROXY "):
        return b""
    if line.rstrip().endswith(b"}"):
        return b"+ go ahead\r\n"
    if len(lines) >= 3 and b"LOGIN {" in lines[-3]:
        tag = lines[-3].split(b" ")[0]
        return tag + b" OK LOGIN completed\r\n"
    tag, _, cmd = line.strip().partition(b" ")
    if cmd.upper() == b"LOGOUT":
        return b"* BYE\r\n" + tag + b" OK LOGOUT completed\r\n"
    return tag + b" OK " + cmd + b" done by backend\r\n"


def pop3_reply(line: bytes, lines):
    cmd = line.split(b" ")[0].strip().upper()
    if cmd == b"STAT":
        return b"+OK 7 700\r\n"
    if cmd == b"QUIT":
        return b"+OK bye\r\n"
    return b"+OK\r\n"


def smtp_reply(line: bytes, lines):
    cmd = line[:4].upper()
    if cmd == b"EHLO":
        return b"250-backend\r\n250-XCLIENT ADDR LOGIN NAME\r\n250 AUTH PLAIN\r\n"
    if cmd == b"XCLI":
        return b"220 backend ready again\r\n"
    if cmd == b"AUTH":
        return b"235 2.7.0 backend accepted\r\n"
    if cmd == b"RCPT":
        return b"250 2.1.5 recipient ok at backend\r\n"
    if cmd == b"QUIT":
        return b"221 bye\r\n"
    return b"250 ok\r\n"


@pytest.fixture
def auth():
    a = Auth()
    yield a
    a.close()


@pytest.fixture
def backends():
    made = []

    def make(kind):
        b = {
            "imap": lambda: Backend(b"* OK backend ready\r\n", imap_reply),
            "pop3": lambda: Backend(b"+OK backend ready\r\n", pop3_reply),
            "smtp": lambda: Backend(b"220 backend ESMTP\r\n", smtp_reply),
        }[kind]()
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


def to(backend):
    """The auth server's answer sending a login to `backend`."""
    return {"Auth-Status": "OK", "Auth-Server": "127.0.0.1", "Auth-Port": backend.port}


def test_imap_login_reaches_the_backend_the_auth_server_names(gannet, auth, backends):
    b = backends("imap")
    auth.answer = lambda h: {**to(b), "Auth-Pass": "from-auth"}
    p = free_port()
    srv = start(gannet, f"""
    auth_http 127.0.0.1:{auth.port}/mail/auth;
    auth_http_header X-Gannet-Test yes;
    server {{ listen 127.0.0.1:{p}; protocol imap; }}
""", p)
    c = imaplib.IMAP4("127.0.0.1", p)
    assert c.welcome == b"* OK IMAP4 ready"
    typ, caps = c.capability()
    assert typ == "OK" and caps[0] == b"IMAP4 IMAP4rev1 UIDPLUS AUTH=PLAIN"
    typ, data = c.login("alice@example.com", "se cret")
    assert typ == "OK" and data[0] == b"LOGIN completed"
    assert c.noop()[1][0] == b"NOOP done by backend"
    c.logout()
    h = auth.seen[0]
    assert h[":path"] == "/mail/auth"
    assert h["auth-method"] == "plain" and h["auth-protocol"] == "imap"
    assert h["auth-user"] == "alice@example.com"
    # nginx %-escapes the password's spaces.
    assert h["auth-pass"] == "se%20cret"
    assert h["auth-login-attempt"] == "1" and h["client-ip"] == "127.0.0.1"
    assert h["x-gannet-test"] == "yes" and h["host"] == "127.0.0.1"
    # The back end gets the password the auth server gave, in literals.
    sent = b"".join(b.conns[0])
    assert b"LOGIN {17}\r\nalice@example.com {9}\r\nfrom-auth\r\n" in sent
    wait_until(lambda: "client logged in" in srv.error_log())
    assert 'login: "alice@example.com"' in srv.error_log()


def test_pop3_refusal_with_auth_wait_then_login(gannet, auth, backends):
    b = backends("pop3")
    auth.answer = lambda h: (to(b) if h["auth-login-attempt"] == "2"
                             else {"Auth-Status": "Mailbox locked", "Auth-Wait": "1"})
    p = free_port()
    srv = start(gannet, f"""
    auth_http 127.0.0.1:{auth.port};
    server {{ listen 127.0.0.1:{p}; protocol pop3; }}
""", p)
    c = poplib.POP3("127.0.0.1", p)
    assert c.getwelcome() == b"+OK POP3 ready"
    c.user("bob")
    with pytest.raises(poplib.error_proto, match="-ERR Mailbox locked"):
        c.pass_("pw")
    # After Auth-Wait the session goes on: the second attempt is counted and proxied.
    c.user("bob")
    assert c.pass_("pw") == b"+OK"
    assert c.stat() == (7, 700)
    c.quit()
    assert [h["auth-login-attempt"] for h in auth.seen] == ["1", "2"]
    assert b"".join(b.conns[0]).startswith(b"USER bob\r\nPASS pw\r\n")
    assert 'client login failed: "Mailbox locked"' in srv.error_log()


def test_refusal_without_auth_wait_ends_the_session(gannet, auth):
    auth.answer = lambda h: {"Auth-Status": "Invalid login", "Auth-Error-Code": "550 5.7.1"}
    p = free_port()
    start(gannet, f"""
    auth_http 127.0.0.1:{auth.port};
    smtp_auth plain;
    server {{ listen 127.0.0.1:{p}; protocol smtp; server_name mx.test; }}
""", p)
    c = smtplib.SMTP("127.0.0.1", p)
    c.ehlo("client.test")
    # One mechanism offered, so smtplib does not try another after the refusal.
    with pytest.raises(smtplib.SMTPAuthenticationError) as e:
        c.login("carol", "pw")
    assert e.value.smtp_code == 550 and e.value.smtp_error == b"5.7.1 Invalid login"
    with pytest.raises(smtplib.SMTPServerDisconnected):
        c.noop()


def test_smtp_xclient_and_login(gannet, auth, backends):
    b = backends("smtp")
    auth.answer = lambda h: to(b)
    p = free_port()
    start(gannet, f"""
    auth_http 127.0.0.1:{auth.port};
    server {{ listen 127.0.0.1:{p}; protocol smtp; server_name mx.test; }}
""", p)
    c = smtplib.SMTP("127.0.0.1", p)
    code, text = c.ehlo("client.test")
    assert code == 250 and text == b"mx.test\nAUTH PLAIN LOGIN"
    assert c.login("dave+x@example.com", "pw") == (235, b"2.0.0 OK")
    assert c.mail("dave@example.com")[0] == 250
    c.quit()
    lines = b.conns[0]
    assert lines[0] == b"EHLO mx.test\r\n"
    # XCLIENT's LOGIN is xtext: `+` escaped.
    assert lines[1] == b"XCLIENT ADDR=127.0.0.1 LOGIN=dave%2Bx@example.com NAME=[UNAVAILABLE]\r\n"
    assert lines[2] == b"EHLO client.test\r\n"
    # The client's own command text (smtplib writes `mail FROM:`).
    assert lines[3].startswith(b"mail FROM:<dave@example.com>")
    assert auth.seen[0]["client-host"] == "[UNAVAILABLE]"


def test_smtp_without_authentication(gannet, auth, backends):
    b = backends("smtp")
    auth.answer = lambda h: to(b)
    p = free_port()
    start(gannet, f"""
    auth_http 127.0.0.1:{auth.port};
    smtp_auth none;
    xclient off;
    server {{ listen 127.0.0.1:{p}; protocol smtp; server_name mx.test; }}
""", p)
    c = smtplib.SMTP("127.0.0.1", p)
    c.helo("client.test")
    assert c.mail("from@example.com") == (250, b"2.0.0 OK")
    # The recipient is the login: the back end's answer to RCPT TO comes through.
    assert c.rcpt("to@example.com") == (250, b"2.1.5 recipient ok at backend")
    c.quit()
    h = auth.seen[0]
    assert h["auth-method"] == "none"
    assert h["auth-smtp-helo"] == "client.test"
    # The client's command text as written (smtplib's `mail FROM:`).
    assert h["auth-smtp-from"] == "mail FROM:<from@example.com>"
    assert h["auth-smtp-to"] == "rcpt TO:<to@example.com>"
    assert b.conns[0][:3] == [b"HELO mx.test\r\n", b"mail FROM:<from@example.com>\r\n",
                              b"rcpt TO:<to@example.com>\r\n"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    p = Pki(tmp_path_factory.mktemp("mailpki"))
    p.issue("mail", "localhost", sans=("localhost",))
    return p


def test_starttls(gannet, auth, backends, pki):
    b = backends("imap")
    auth.answer = lambda h: to(b)
    p = free_port()
    start(gannet, f"""
    auth_http 127.0.0.1:{auth.port};
    ssl_certificate {pki.d}/mail.pem;
    ssl_certificate_key {pki.d}/mail.key;
    server {{ listen 127.0.0.1:{p}; protocol imap; starttls only; }}
""", p)
    c = imaplib.IMAP4("localhost", p)
    assert "STARTTLS" in c.capabilities and "LOGINDISABLED" in c.capabilities
    # No login before STARTTLS with `only`.
    with pytest.raises(imaplib.IMAP4.error, match="invalid command"):
        c.login("erin", "pw")
    ctx = ssl.create_default_context(cafile=str(pki.d / "ca.pem"))
    c.starttls(ssl_context=ctx)
    assert "AUTH=PLAIN" in c.capabilities and "STARTTLS" not in c.capabilities
    assert c.login("erin", "pw")[0] == "OK"
    c.logout()
    h = auth.seen[0]
    assert h["auth-ssl"] == "on" and h["auth-ssl-protocol"].startswith("TLSv1.")


def test_proxy_protocol_both_ways(gannet, auth, backends):
    b = backends("imap")
    auth.answer = lambda h: to(b)
    p = free_port()
    start(gannet, f"""
    auth_http 127.0.0.1:{auth.port};
    proxy_protocol on;
    set_real_ip_from 127.0.0.1;
    server {{ listen 127.0.0.1:{p} proxy_protocol; protocol imap; }}
""", p)
    with socket.create_connection(("127.0.0.1", p), timeout=5) as s:
        f = s.makefile("rb")
        s.sendall(b"PROXY TCP4 192.0.2.7 192.0.2.1 4242 143\r\n")
        assert f.readline() == b"* OK IMAP4 ready\r\n"
        s.sendall(b"a1 LOGIN frank pw\r\n")
        assert f.readline() == b"a1 OK LOGIN completed\r\n"
    h = auth.seen[0]
    assert h["client-ip"] == "192.0.2.7"
    assert (h["proxy-protocol-addr"], h["proxy-protocol-port"]) == ("192.0.2.7", "4242")
    assert (h["proxy-protocol-server-addr"], h["proxy-protocol-server-port"]) == ("192.0.2.1", "143")
    assert b.conns[0][0] == f"PROXY TCP4 192.0.2.7 127.0.0.1 4242 {p}\r\n".encode()


def test_max_errors(gannet, auth):
    p = free_port()
    srv = start(gannet, f"""
    auth_http 127.0.0.1:{auth.port};
    max_errors 2;
    server {{ listen 127.0.0.1:{p}; protocol imap; }}
""", p)
    with socket.create_connection(("127.0.0.1", p), timeout=5) as s:
        f = s.makefile("rb")
        f.readline()
        s.sendall(b"a1 FOO\r\na2 BAR\r\na3 BAZ\r\n")
        assert f.readline() == b"a1 BAD invalid command\r\n"
        assert f.readline() == b"a2 BAD invalid command\r\n"
        assert f.readline() == b""
    wait_until(lambda: "client sent too many invalid commands" in srv.error_log())


def test_server_error_logs_by_level(gannet, auth):
    """A mail server's own `error_log`s each take the lines of their level: a session's
    accept at debug (nginx's event module writes it to the listener's log) only in the
    debug one, its `connected` line at info in both."""
    p = free_port()
    srv = start(gannet, f"""
    auth_http 127.0.0.1:{auth.port};
    server {{
        listen 127.0.0.1:{p}; protocol imap;
        error_log {{tmp}}/debug.log debug;
        error_log {{tmp}}/info.log info;
    }}
""", p)
    with socket.create_connection(("127.0.0.1", p), timeout=5) as s:
        assert s.makefile("rb").readline().startswith(b"* OK")
    debug, info = gannet.tmp / "debug.log", gannet.tmp / "info.log"
    wait_until(lambda: "[debug]" in debug.read_text() and "connected to" in info.read_text())
    assert "[debug]" not in info.read_text()
    assert "accept: 127.0.0.1" in debug.read_text()


def test_auth_server_failures_are_internal_errors(gannet):
    p = free_port()
    dead = free_port()
    srv = start(gannet, f"""
    auth_http 127.0.0.1:{dead};
    server {{ listen 127.0.0.1:{p}; protocol pop3; }}
""", p)
    c = poplib.POP3("127.0.0.1", p)
    c.user("gina")
    with pytest.raises(poplib.error_proto, match="-ERR internal server error"):
        c.pass_("pw")
    wait_until(lambda: "connect() failed" in srv.error_log())
    assert "while in http auth state" in srv.error_log()


def talk(port: int, lines: list[bytes]) -> bytes:
    """Send each line, collecting what comes back until the server has been quiet a
    moment; the last line ends the session, so after it everything up to the close."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.settimeout(0.25)

        def drain():
            nonlocal out
            try:
                while d := s.recv(65536):
                    out += d
            except socket.timeout:
                pass

        drain()
        for line in lines[:-1]:
            s.sendall(line)
            drain()
        s.settimeout(5)
        s.sendall(lines[-1])
        while d := s.recv(65536):
            out += d
    return out


@pytest.mark.skipif(NGINX is None or not os.path.exists(MAIL_MODULE), reason="nginx with its mail module needed")
def test_differential_dialogues_before_login(gannet, auth, tmp_path):
    # Every login refused, without Auth-Wait: the refusal is the session's last line.
    auth.answer = lambda h: {"Auth-Status": "Bad password"}
    ports = [free_port() for _ in range(3)]
    body = f"""
    auth_http 127.0.0.1:{auth.port};
    server_name mx.test;
    server {{ listen 127.0.0.1:{ports[0]}; protocol imap; imap_capabilities IMAP4rev1 IDLE; imap_auth plain cram-md5; }}
    server {{ listen 127.0.0.1:{ports[1]}; protocol pop3; pop3_capabilities TOP USER; pop3_auth plain external; }}
    server {{ listen 127.0.0.1:{ports[2]}; protocol smtp; smtp_capabilities PIPELINING SIZE=1000; smtp_auth login plain; }}
"""
    imap = [b"a1 CAPABILITY\r\n", b"a2 NOOP\r\n", b"a3 FOO\r\n", b"a4 LOGIN\r\n",
            b"a5 AUTHENTICATE LOGIN\r\n", base64.b64encode(b"u") + b"\r\n", b"!!\r\n", b"a6 LOGIN u p\r\n"]
    pop3 = [b"CAPA\r\n", b"AUTH\r\n", b"NOOP\r\n", b"FOO\r\n", b"PASS x\r\n", b"AUTH PLAIN\r\n", b"###\r\n",
            b"USER u\r\n", b"PASS p\r\n"]
    smtp = [b"EHLO a.test\r\n", b"HELO a.test\r\n", b"MAIL FROM:<a@b>\r\n", b"HELO\r\n", b"FOO\r\n",
            b"AUTH\r\n", b"AUTH LOGIN\r\n", b"x\r\n", b"RSET\r\n",
            b"AUTH PLAIN " + base64.b64encode(b"\0u\0p") + b"\r\n"]
    g = start(gannet, body, *ports)
    got = [talk(ports[i], s) for i, s in enumerate((imap, pop3, smtp))]
    g.stop()
    # The same addresses, then served by nginx.
    nginx_port = free_port()
    nginx = NginxPeer(conf(body, load=True), nginx_port, tmp_path, tmp_path / "nginx")
    try:
        for p in ports:
            wait_port(p, nginx.proc)
        want = [talk(ports[i], s) for i, s in enumerate((imap, pop3, smtp))]
    finally:
        nginx.stop()
    assert got == want
    assert got[0].startswith(b"* OK IMAP4 ready\r\n* CAPABILITY IMAP4rev1 IDLE AUTH=PLAIN AUTH=CRAM-MD5\r\n")
    assert got[0].endswith(b"a6 NO Bad password\r\n")
    assert got[1].endswith(b"-ERR Bad password\r\n")
    assert got[2].endswith(b"535 5.7.0 Bad password\r\n")
