"""`gannet -t` names what it cannot do yet, with file:line, instead of a bare "unknown"."""

import pytest


@pytest.mark.parametrize(
    "line, message",
    [
        ("location /api/ { proxy_ssl_conf_command Options PrioritizeChaCha; }", '"proxy_ssl_conf_command": this proxy directive is not supported yet'),
        ("location ~ \\.php$ { fastcgi_bind 127.0.0.1; }", '"fastcgi_bind": this FastCGI directive is not supported yet'),
        ("ssl_conf_command Options PrioritizeChaCha;", '"ssl_conf_command": this TLS directive is not supported yet'),
        ("geo $x $y { default 0; }", '"geo" directive is not allowed here'),
        ("frobnicate on;", 'unknown directive "frobnicate"'),
    ],
)
def test_unsupported_directive_is_named_with_its_line(gannet, line, message):
    r = gannet.check(server=line)
    assert r.returncode != 0
    conf_lines = (gannet.tmp / "check.conf").read_text().splitlines()
    lineno = next(i for i, text in enumerate(conf_lines, 1) if line.split()[0] in text and "listen" not in text)
    assert f"check.conf:{lineno}: {message}" in r.stderr, r.stderr
