"""secure_link, secure_link_md5, secure_link_secret: `$secure_link` and
`$secure_link_expires` computed as nginx does, checked side by side with Debian's nginx on
the same config (good, bad, expired and malformed links, both forms)."""

import base64
import hashlib
import time

import pytest

from nginx_peer import NGINX, PEER_MAIN, check_both, side_by_side

CONF = PEER_MAIN + """
http {
    server {
        listen 127.0.0.1:{port};
        root {root};
        secure_link $arg_md5,$arg_expires;
        secure_link_md5 "$secure_link_expires$uri secret";
        location /s/ {
            if ($secure_link = "") { return 403; }
            if ($secure_link = "0") { return 410; }
            return 200 "ok [$secure_link] [$secure_link_expires]\\n";
        }
        location /plain/ {
            secure_link $arg_md5;
            secure_link_md5 "$uri secret";
            return 200 "[$secure_link] [$secure_link_expires]\\n";
        }
        location /p/ {
            secure_link_secret word;
            if ($secure_link = "") { return 403; }
            return 200 "link [$secure_link]\\n";
        }
    }
}
"""


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.md5(text.encode()).digest()).decode().rstrip("=")


def cases():
    future, past = int(time.time()) + 3600, int(time.time()) - 3600
    good = b64(f"{future}/s/a secret")
    yield f"/s/a?md5={good}&expires={future}"
    yield f"/s/a?md5={good}==&expires={future}"
    yield f"/s/a?md5={good}=junk&expires={future}"
    yield f"/s/a?md5={b64(f'{past}/s/a secret')}&expires={past}"
    yield f"/s/a?md5={good}&expires={future + 1}"
    yield f"/s/b?md5={good}&expires={future}"
    yield f"/s/a?md5={good}&expires=-5"
    yield f"/s/a?md5={good}&expires=12x"
    yield f"/s/a?md5={good}&expires="
    yield f"/s/a?md5={good[:-1]}&expires={future}"
    yield f"/s/a?md5={good}AAAA&expires={future}"
    yield f"/s/a?md5=%2B%2F{good[2:]}&expires={future}"
    yield "/s/a?md5=&expires=1"
    yield "/s/a"
    yield f"/plain/x?md5={b64('/plain/x secret')}"
    yield f"/plain/x?md5={b64('/plain/y secret')}"
    link = "dir/file.txt"
    h = hashlib.md5((link + "word").encode()).hexdigest()
    yield f"/p/{h}/{link}"
    yield f"/p/{h.upper()}/{link}"
    yield f"/p/{h}/dir/other.txt"
    yield f"/p/{h[:-1]}/{link}"
    yield f"/p/{h}/"
    hq = hashlib.md5(b"f?x=1word").hexdigest()
    yield f"/p/{hq}/f?x=1"


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_secure_link_matches_nginx(tmp_path):
    with side_by_side(tmp_path, CONF) as (srv, nginx_port):
        statuses = set()
        for path in cases():
            ours = srv.get(path)
            theirs = srv.get(path, port=nginx_port)
            assert ours[0] == theirs[0], path
            if ours[0] == 200:
                assert ours[2] == theirs[2], path
            statuses.add(ours[0])
        # The cases reach every outcome: good, bad and expired.
        assert statuses == {200, 403, 410}


def test_secure_link_values(gannet):
    future = int(time.time()) + 60
    srv = gannet.start(conf=CONF.replace("{tmp}", str(gannet.tmp)))
    ok = srv.get(f"/s/a?md5={b64(f'{future}/s/a secret')}&expires={future}")
    assert ok[0] == 200 and ok[2] == f"ok [1] [{future}]\n".encode()
    assert srv.get(f"/s/a?md5={b64('x')}&expires={future}")[0] == 403


@pytest.mark.skipif(NGINX is None, reason="nginx is installed by scripts/test-all.sh")
def test_secret_cannot_mix(tmp_path):
    n, g = check_both(tmp_path, "server { listen 127.0.0.1:2; location / { secure_link $arg_h; secure_link_secret w; } }")
    assert n.returncode != 0 and g.returncode != 0
    msg = '"secure_link_secret" cannot be mixed with "secure_link" and "secure_link_md5"'
    assert msg in n.stderr and msg in g.stderr
    assert "check.conf:" in g.stderr
