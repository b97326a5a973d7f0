"""`proxy_cookie_domain`, `proxy_cookie_path` and `proxy_cookie_flags`, and `proxy_redirect`
regex rules with the absolute Location they give: gannet and Debian's nginx run one config in
which the server proxies to its own `/b/` location, which sets the cookies; every
`Set-Cookie` (and `Location`) they send must be the same, byte for byte."""

from __future__ import annotations

import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side

CONF = PEER_MAIN + r"""
http {
    access_log off;
    proxy_cookie_path /app/ /inherited/;
    server {
        listen 127.0.0.1:{port};
        location /b/ {
            add_header Set-Cookie "a=1; Domain=.Backend.internal; Path=/app/x; HttpOnly";
            add_header Set-Cookie "b=2;path=/app;domain=other.internal;secure";
            add_header Set-Cookie "  c=3 ;  Path = /APP/y ;Secure ; samesite=lax";
            add_header Set-Cookie "d=4";
            add_header Set-Cookie "E=5; expires=Thu, 01 Jan 2037 00:00:00 GMT; path=/other/";
            add_header Set-Cookie "f=6; Domain=x.backend.internal; Path=/app";
            return 200 "ok\n";
        }
        location /plain/ { proxy_pass http://127.0.0.1:{port}/b/; proxy_cookie_domain backend.internal example.org; proxy_cookie_path /app/ /; }
        location /regex/ { proxy_pass http://127.0.0.1:{port}/b/; proxy_cookie_domain ~^BACKEND\.(.+)$ $1.example.org; proxy_cookie_path ~*^/app(.*)$ /new$1; }
        location /vars/ { proxy_pass http://127.0.0.1:{port}/b/; proxy_cookie_path /app $host; proxy_cookie_domain other.internal $server_port.test; }
        location /dots/ { proxy_pass http://127.0.0.1:{port}/b/; proxy_cookie_domain .x.backend.internal .example.com; proxy_cookie_domain .$server_port.backend.internal en.example.org; proxy_cookie_domain backend.internal .d.test; }
        location /inherit/ { proxy_pass http://127.0.0.1:{port}/b/; }
        location /off/ { proxy_pass http://127.0.0.1:{port}/b/; proxy_cookie_path off; proxy_cookie_domain off; }
        location /flags/ { proxy_pass http://127.0.0.1:{port}/b/; proxy_cookie_path off; proxy_cookie_flags ~ secure httponly samesite=strict; }
        location /some/ {
            proxy_pass http://127.0.0.1:{port}/b/; proxy_cookie_path off;
            proxy_cookie_flags A nohttponly samesite=none;
            proxy_cookie_flags b nosecure samesite=lax;
            proxy_cookie_flags ~^[ce]$ secure nosamesite;
            proxy_cookie_flags ~ httponly;
        }
        location /hidden/ { proxy_pass http://127.0.0.1:{port}/b/; proxy_hide_header Set-Cookie; proxy_cookie_flags ~ secure; }
        location /r/ { return 302 "http://backend.internal/x/b?q=1"; }
        location /redir1/ { proxy_pass http://127.0.0.1:{port}/r/; proxy_redirect ~/x/ /y/; }
        location /redir2/ { proxy_pass http://127.0.0.1:{port}/r/; proxy_redirect ~^http://([^/]+)/x/(.*)$ http://$1.new/z/$2; }
        location /redir3/ { proxy_pass http://127.0.0.1:{port}/r/; proxy_redirect http://backend.internal/x/ /; }
    }
}
"""

PATHS = ["/plain/", "/dots/", "/regex/", "/vars/", "/inherit/", "/off/", "/flags/", "/some/", "/hidden/", "/redir1/", "/redir2/", "/redir3/"]


def cookies_and_location(port: int, path: str) -> tuple[int, list[str], str | None]:
    a = exchange(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    head = a.raw.partition(b"\r\n\r\n")[0].decode("latin-1")
    cookies = [c.replace(str(port), "PORT") for c in re.findall(r"(?im)^set-cookie: ?(.*?)\r?$", head)]
    loc = a.headers.get("location")
    return a.status, cookies, loc.replace(f":{port}/", ":PORT/") if loc else None


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_cookies_and_redirects_match_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        answers = {p: (cookies_and_location(nginx_port, p), cookies_and_location(srv.port, p)) for p in PATHS}
    diffs = [f"{p}:\n  nginx  {n}\n  gannet {g}" for p, (n, g) in answers.items() if n != g]
    assert not diffs, "\n".join(diffs)
    # The comparison saw the rules at work (a config both servers ignored would pass too).
    assert "a=1; Domain=.example.org; Path=/x; HttpOnly" in answers["/plain/"][1][1]
    assert "d=4; Secure; HttpOnly; SameSite=Strict" in answers["/flags/"][1][1]
    # A plain domain rule and its replacement lose their leading dot; the cookie's stays.
    assert "a=1; Domain=.d.test; Path=/inherited/x; HttpOnly" in answers["/dots/"][1][1]
    assert "f=6; Domain=example.com; Path=/app" in answers["/dots/"][1][1]
    assert answers["/hidden/"][1][1] == []
    assert answers["/redir1/"][1][2] == "http://127.0.0.1:PORT/y/"


@pytest.mark.parametrize(
    "stmt, message",
    [
        ("proxy_cookie_path /x;", 'invalid parameter "/x"'),
        ("proxy_cookie_flags a;", 'invalid parameter "a"'),
        ("proxy_cookie_flags a sometimes;", 'invalid value "sometimes" in "proxy_cookie_flags" directive'),
        ("proxy_cookie_domain a b c;", 'invalid number of arguments in "proxy_cookie_domain" directive'),
        ("proxy_cookie_path ~(unclosed /;", 'pcre2_compile() failed: missing closing parenthesis in "(unclosed"'),
        ("proxy_cookie_path off; proxy_cookie_path /a /b;", '"proxy_cookie_path" directive is duplicate'),
        ("proxy_cookie_flags a secure; proxy_cookie_flags off;", '"proxy_cookie_flags" directive is duplicate'),
    ],
)
def test_bad_cookie_rules_are_config_errors(gannet, stmt, message):
    r = gannet.check(server=f"location / {{ {stmt} }}")
    assert r.returncode != 0
    assert re.search(r"check\.conf:\d+: .*" + re.escape(message), r.stderr), r.stderr
