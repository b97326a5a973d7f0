"""userid: the cookie is nginx's byte for byte, so each server reads the other's cookie
into the same `$uid_got`; `$uid_set`, the Set-Cookie attributes and userid_mark checked
side by side with Debian's nginx."""

import re

import pytest

from nginx_peer import NGINX, PEER_MAIN, side_by_side

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        userid on;
        userid_name uid;
        userid_domain example.com;
        userid_path /p;
        userid_expires 1d;
        userid_flags secure samesite=lax;
        userid_p3p 'CP="CUR ADM"';
        location / { return 200 "got=[$uid_got] set=[$uid_set]\\n"; }
        location /v1 { userid v1; userid_service 7; return 200 "got=[$uid_got] set=[$uid_set]\\n"; }
        location /log { userid log; return 200 "got=[$uid_got] set=[$uid_set]\\n"; }
        location /mark { userid_mark Z; return 200 "got=[$uid_got] set=[$uid_set]\\n"; }
        location /reset { set $uid_reset 1; return 200 "got=[$uid_got] set=[$uid_set]\\n"; }
    }
}
"""


def cookie_of(headers) -> str:
    return headers["set-cookie"].split(";")[0].split("=", 1)[1]


def attrs(headers) -> str:
    # Without the value and the expiry time, which differ between two servers.
    v = re.sub(r"^uid=[^;]*", "uid=X", headers["set-cookie"])
    return re.sub(r"expires=[^;]*", "expires=T", v)


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_userid_cookies_cross_read(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        for path in ("/", "/v1"):
            ours = srv.get(path)
            theirs = srv.get(path, port=nginx_port)
            assert ours[0] == theirs[0] == 200
            assert attrs(ours[1]) == attrs(theirs[1])
            assert ours[1]["p3p"] == theirs[1]["p3p"]
            expires = re.search(r"expires=([^;]*)", ours[1]["set-cookie"]).group(1)
            assert re.fullmatch(r"\w{3}, \d\d-\w{3}-\d\d \d\d:\d\d:\d\d GMT", expires)
            # A new identifier each: set, nothing got; `$uid_set` names the cookie sent.
            for status, h, body in (ours, theirs):
                got, set_ = re.fullmatch(rb"got=\[(.*)\] set=\[(.*)\]\n", body).groups()
                assert got == b"" and re.fullmatch(rb"uid=[0-9A-F]{32}", set_)
            # Each server decodes the other's cookie as the one that set it printed it.
            for maker, reader in ((theirs, srv.port), (ours, nginx_port)):
                uid = cookie_of(maker[1])
                printed = re.search(rb"set=\[(.*?)\]", maker[2]).group(1)
                for port in (srv.port, nginx_port):
                    back = srv.get(path, headers={"Cookie": f"a=b; uid={uid}"}, port=port)
                    assert re.search(rb"got=\[(.*?)\]", back[2]).group(1) == printed, (path, port)
                    # A cookie that came is not set again (no mark to add).
                    assert "set-cookie" not in back[1]


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_userid_mark_log_reset_match_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        uid = cookie_of(srv.get("/", port=nginx_port)[1])
        for path, cookie in (("/mark", uid), ("/mark", uid[:22] + "Z="), ("/log", uid), ("/reset", uid),
                             ("/", "short"), ("/", "!" * 22), ("/log", "")):
            h = {"Cookie": f"uid={cookie}"} if cookie else {}
            ours = srv.get(path, headers=h)
            theirs = srv.get(path, headers=h, port=nginx_port)
            assert ours[0] == theirs[0] == 200
            assert ("set-cookie" in ours[1]) == ("set-cookie" in theirs[1]), (path, cookie)
            got = lambda r: re.search(rb"got=\[(.*?)\]", r[2]).group(1)
            assert got(ours) == got(theirs), (path, cookie)
            if path == "/mark" and "set-cookie" in ours[1]:
                # The cookie as it came, marked.
                assert cookie_of(ours[1]) == cookie_of(theirs[1]) == uid[:22] + "Z="
            if path == "/reset":
                assert cookie_of(ours[1]) != uid and cookie_of(theirs[1]) != uid
        assert "client sent too short userid cookie" in srv.error_log()
