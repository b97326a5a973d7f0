"""`set`, `map` and `if` as an nginx admin writes them, over real sockets: user variables in
every place variables go (return, add_header, rewrite, try_files, log_format), the rewrite
script's order (server level, then location), `map` evaluated lazily and cached per request
(or not, when `volatile`), regex captures in values, `hostnames`, `include` in a map, `if`
conditions of every kind with their captures, the `if` block's settings replacing the
location's, and the config errors with their file:line (`gannet -t`).
"""

import pytest
import rawapps
from nginx_peer import NGINX, PEER_MAIN, exchange, side_by_side
from test_logging import wait_lines


def body(srv, path, headers=None):
    status, _, data = srv.get(path, headers=headers)
    assert status == 200, (path, status, data)
    return data.decode()


def test_set_values_reach_every_kind_of_directive(gannet):
    srv = gannet.start(
        files={"tf/real.txt": "real\n", "dest/x.txt": "dest x\n"},
        http="log_format vars '$who|$uri';",
        server="""
        set $who server-level;
        access_log {tmp}/vars.log vars;
        location = /ret { set $a "A:$uri"; set $b "$a|$arg_x|$who"; return 200 "$b\\n"; }
        location /hdr/ { set $h "hv-$arg_v"; add_header X-H $h; return 204; }
        location /tf/ { set $name real; try_files /tf/$name.txt =404; }
        location /rw/ { set $target dest; rewrite ^/rw/(.*)$ /$target/$1 last; }
        location /dest/ { }
        location = /override { set $who location-level; return 200 "$who\\n"; }
        """.replace("{tmp}", str(gannet.tmp)),
    )
    assert body(srv, "/ret?x=9") == "A:/ret|9|server-level\n"
    status, headers, _ = srv.get("/hdr/?v=7")
    assert (status, headers.get("x-h")) == (204, "hv-7")
    assert body(srv, "/tf/anything") == "real\n"
    assert body(srv, "/rw/x.txt") == "dest x\n"
    assert body(srv, "/override") == "location-level\n"
    logged = wait_lines(gannet.tmp / "vars.log", 5)
    assert "server-level|/ret" in logged
    assert "location-level|/override" in logged


def test_set_args_changes_the_query_string(gannet):
    srv = gannet.start(server='location /a/ { set $args "n=1&$args"; return 200 "$args $arg_n $is_args\\n"; }')
    assert body(srv, "/a/?q=2") == "n=1&q=2 1 ?\n"


def test_uninitialized_variable_is_empty_and_warned(gannet):
    srv = gannet.start(server="""
        location /a/ { return 200 "[$later]\\n"; }
        location /b/ { set $later x; return 200 "[$later]\\n"; }
    """)
    assert body(srv, "/a/") == "[]\n"
    assert body(srv, "/b/") == "[x]\n"
    assert 'using uninitialized "later" variable' in srv.error_log()


MAPS = """
    map $http_x_kind $kind {
        default other;
        alpha first;
        ~^b(?<rest>.*)$ b-$rest;
        ~*^C(\\d+)$ c$1;
        "" none;
        \\default escaped;
    }
    map $kind $kind2 { default "kind:$kind"; }
    map $arg_v $cached { default "v=$arg_v"; }
    map $arg_v $fresh { volatile; default "v=$arg_v"; }
    map $host $class {
        hostnames;
        *.wild.test wild;
        .dot.test dot;
        www.tail.* tail;
        default plain;
    }
    map $http_x_inc $inc { include {tmp}/map.inc; }
"""


def map_server(gannet):
    (gannet.tmp / "map.inc").write_text("one 1;\n~^t(wo)$ $1-2;\n")
    return gannet.start(
        http=MAPS.replace("{tmp}", str(gannet.tmp)),
        server="""
        location = /kind { return 200 "$kind|$kind2\\n"; }
        location = /cache { set $first "$cached/$fresh"; set $args v=2; return 200 "$first $cached/$fresh\\n"; }
        location = /class { return 200 "$class\\n"; }
        location = /inc { return 200 "$inc\\n"; }
        location = /lazy { return 200 "not read\\n"; }
        """,
    )


def test_map_keys_regexes_and_default(gannet):
    srv = map_server(gannet)
    for kind, want in [
        ("alpha", "first"),
        ("ALPHA", "first"),
        ("bravo", "b-ravo"),
        ("c42", "c42"),
        ("C7", "c7"),
        ("Bravo", "other"),
        ("default", "escaped"),
        ("zulu", "other"),
    ]:
        assert body(srv, "/kind", {"X-Kind": kind}) == f"{want}|kind:{want}\n", kind
    assert body(srv, "/kind") == "none|kind:none\n"


def test_map_value_is_kept_for_the_request_unless_volatile(gannet):
    srv = map_server(gannet)
    assert body(srv, "/cache?v=1") == "v=1/v=1 v=1/v=2\n"


def test_map_hostnames_and_include(gannet):
    srv = map_server(gannet)
    for host, want in [("a.wild.test", "wild"), ("dot.test", "dot"), ("x.dot.test", "dot"), ("www.tail.org", "tail"), ("wild.test", "plain")]:
        assert body(srv, "/class", {"Host": host}) == f"{want}\n", host
    assert body(srv, "/inc", {"X-Inc": "one"}) == "1\n"
    assert body(srv, "/inc", {"X-Inc": "two"}) == "wo-2\n"
    assert body(srv, "/inc") == "\n"


def test_if_conditions(gannet):
    srv = gannet.start(
        files={"present.txt": "here\n", "sub/f.txt": "f\n", "run.sh": "#!/bin/sh\n"},
        server="""
        location = /t {
            if ($arg_a) { return 200 "a-true\\n"; }
            if ($arg_b = "x y") { return 200 "b-equal\\n"; }
            if ($arg_c != "") { return 200 "c-not-empty\\n"; }
            if ($arg_d ~ ^(\\w)(?<tail>\\w*)$) { return 200 "d=$1+$tail\\n"; }
            if ($arg_e ~* ^ABC$) { return 200 "e-caseless\\n"; }
            if ($arg_f !~ ^[0-9]+$) { return 200 "f-not-digits\\n"; }
            if ($arg_g !~* ^abc$) { return 200 "g-not-abc\\n"; }
            return 200 "none\\n";
        }
        location = /file {
            if (-f $document_root$arg_p) { return 200 "file\\n"; }
            if (-d $document_root$arg_p) { return 200 "dir\\n"; }
            if (!-e $document_root$arg_p) { return 200 "missing\\n"; }
            return 200 "other\\n";
        }
        location = /exec {
            if (-x $document_root/run.sh) { return 200 "exec\\n"; }
            if (!-x $document_root/run.sh) { return 200 "not-exec\\n"; }
        }
        """,
    )
    # Keeps the two negated conditions false unless a test puts its own value first
    # (`$arg_NAME` is the first one).
    g = "f=1&g=abc"
    assert body(srv, f"/t?a=1&{g}") == "a-true\n"
    assert body(srv, f"/t?a=0&{g}") == "none\n"
    assert body(srv, f"/t?b=x%20y&{g}") == "none\n"  # args are raw, not decoded, as in nginx
    assert body(srv, f"/t?c=1&{g}") == "c-not-empty\n"
    assert body(srv, f"/t?d=hello&{g}") == "d=h+ello\n"
    assert body(srv, f"/t?e=abc&{g}") == "e-caseless\n"
    assert body(srv, f"/t?f=12&{g}") == "none\n"
    assert body(srv, f"/t?f=1x&{g}") == "f-not-digits\n"
    assert body(srv, f"/t?g=ABC&{g}") == "none\n"
    assert body(srv, f"/t?g=abd&{g}") == "g-not-abc\n"
    assert body(srv, "/file?p=/present.txt") == "file\n"
    assert body(srv, "/file?p=/sub") == "dir\n"
    assert body(srv, "/file?p=/nothing") == "missing\n"
    assert body(srv, "/exec") == "not-exec\n"
    (gannet.tmp / "www" / "run.sh").chmod(0o755)
    assert body(srv, "/exec") == "exec\n"


def test_if_block_settings_replace_the_location_s(gannet):
    srv = gannet.start(
        files={"a/f.txt": "main root\n", "alt/a/f.txt": "alt root\n"},
        server="""
        location /a/ {
            add_header X-Where location;
            if ($arg_alt) { root {root}/alt; add_header X-Where if; }
            if ($arg_stop) { break; return 500; }
        }
        """.replace("{root}", str(gannet.tmp / "www")),
    )
    status, headers, data = srv.get("/a/f.txt")
    assert (status, data, headers.get("x-where")) == (200, b"main root\n", "location")
    status, headers, data = srv.get("/a/f.txt?alt=1")
    assert (status, data, headers.get("x-where")) == (200, b"alt root\n", "if")
    # `break` ends the script: the statement after it in the block never runs.
    status, _, data = srv.get("/a/f.txt?stop=1")
    assert (status, data) == (200, b"main root\n")


def test_server_level_script_runs_before_the_location_s(gannet):
    srv = gannet.start(server="""
        set $order s;
        if ($http_x_block) { return 410; }
        if ($uri ~ ^/old/) { rewrite ^/old/(.*)$ /new/$1; }
        location /new/ { set $order "$order-l"; return 200 "$order $uri\\n"; }
    """)
    assert body(srv, "/old/page") == "s-l /new/page\n"
    status, _, _ = srv.get("/new/x", headers={"X-Block": "1"})
    assert status == 410


def test_rewrite_and_location_named_captures(gannet):
    srv = gannet.start(server="""
        location /p/ { rewrite ^/p/(?<section>\\w+)/(?<id>\\d+)$ /show?s=$section&id=$id last; }
        location = /show { return 200 "$arg_s $arg_id $section\\n"; }
        location ~ ^/~(?<user>[^/]+)(?<rest>/.*)$ { return 200 "$user $rest $1\\n"; }
    """)
    assert body(srv, "/p/news/42") == "news 42 news\n"
    assert body(srv, "/~ann/x/y") == "ann /x/y ann\n"


def conf_error(gannet, line, **kw):
    r = gannet.check(**kw)
    assert r.returncode != 0, r.stderr
    text = (gannet.tmp / "check.conf").read_text().splitlines()
    lineno = next(i for i, t in enumerate(text, 1) if line in t)
    return r.stderr, lineno


def test_unknown_variable_is_an_error_at_its_first_use(gannet):
    err, n = conf_error(gannet, "return 200 $nosuch;", server="location / { return 200 $nosuch; }")
    assert f'check.conf:{n}: unknown "nosuch" variable' in err
    err, n = conf_error(gannet, "add_header X $typo;", http="map $uri $ok { default 1; }", server="add_header X $typo;")
    assert f'check.conf:{n}: unknown "typo" variable' in err


def test_a_variable_set_anywhere_is_known_everywhere(gannet):
    r = gannet.check(http="log_format f '$defined_later';", server="location /x/ { set $defined_later 1; }")
    assert r.returncode == 0, r.stderr


def test_config_errors(gannet):
    cases = [
        ("set $uri x;", 'the duplicate "uri" variable'),
        ("set novar x;", 'invalid variable name "novar"'),
        ('rewrite ^ "";', "empty replacement"),
        ("if ($a == b) { }", 'unexpected "==" in condition'),
        ("if $a { }", 'invalid condition "$a"'),
        ("if ($uri ~ \"(\") { }", 'pcre2_compile() failed: missing closing parenthesis in "("'),
        ("location /i/ { if ($uri) { if ($uri) { } } }", '"if" directive is not allowed here'),
        ("location /j/ { if ($uri) { try_files $uri =404; } }", '"try_files" directive is not allowed here'),
        ("location /k/ { if ($uri) { index a.html; } }", '"index" directive is not allowed here'),
        ("if ($uri) { add_header X y; }", '"add_header" directive is not allowed here'),
        ("if ($uri) { location /x/ { } }", '"location" directive is not allowed here'),
        ("map $uri $m { default 1; }", '"map" directive is not allowed here'),
        ("location /l/ { limit_except GET { set $l 1; } }", '"set" directive is not allowed here'),
    ]
    for line, message in cases:
        err, n = conf_error(gannet, line, server=line)
        assert f"check.conf:{n}: {message}" in err, (line, err)
    err, n = conf_error(gannet, "default b;", http="map $uri $m {\n default a;\n default b;\n}")
    assert f"check.conf:{n}: duplicate default map parameter" in err


def echo_line(conn, head, body):
    """Answers with the request line it got and the X-Seen header (`$uri|$args|$is_args`)."""
    lines = head.decode("latin-1").split("\r\n")
    seen = next((line.split(":", 1)[1].strip() for line in lines if line.lower().startswith("x-seen:")), "-")
    conn.sendall(rawapps.http_answer(f"{lines[0]} seen={seen}\n".encode()))
    return "again"


REWRITE_ARGS_CONF = PEER_MAIN + r"""
http {
    server_tokens off;
    server {
        listen 127.0.0.1:{port};
        server_name main.test;
        proxy_set_header X-Seen "$uri|$args|$is_args";

        # Gitea's sub-path recipe: the URI gets the client's query in it, args kept.
        location ~ ^/g1($|/) {
            rewrite ^ $request_uri;
            rewrite ^(/g1)?(/.*) $2 break;
            proxy_pass http://127.0.0.1:APP$uri;
        }
        location /g2/ { rewrite ^/g2/(.*)$ /new/$1?added=1 break; proxy_pass http://127.0.0.1:APP; }
        location /g3/ { rewrite ^/g3/(.*)$ /new/$1?added=1? break; proxy_pass http://127.0.0.1:APP; }
        location /g4/ { rewrite ^/g4/(.*)$ /new/$1? break; proxy_pass http://127.0.0.1:APP; }
        location /g5/ { rewrite ^/g5/(.*)$ /new/$1?$arg_none break; proxy_pass http://127.0.0.1:APP; }
        location /g6/ { rewrite ^ $request_uri break; proxy_pass http://127.0.0.1:APP; }
        location /g7/ { rewrite ^ $request_uri? break; proxy_pass http://127.0.0.1:APP$uri$is_args$args; }
        location /g8/ { rewrite ^/g8/(.*)$ /new/$1 break; proxy_pass http://127.0.0.1:APP/base$uri; }
        location /r1/ { rewrite ^ $request_uri redirect; }
        location /r2/ { rewrite ^/r2/(.*)$ /to/$1?a=1 redirect; }
        location /r3/ { rewrite ^/r3/(.*)$ /to/$1?a=1? permanent; }
        location /r4/ { set $t "http://x.test/p"; rewrite ^ $t; return 200 "[$uri|$args|$is_args]\n"; }
        location /r5/ { rewrite ^ /x?; return 200 "[$uri|$args|$is_args]\n"; }
        location /r6/ { set $t "/y?"; rewrite ^ $t; return 200 "[$uri|$args|$is_args]\n"; }
        # nginx's own redirects go through error_page, the page carrying the Location.
        location /r7/ { error_page 302 =200 /page.txt; return 302 /elsewhere; }
        location /r8/ { error_page 301 /page.txt; rewrite ^/r8/(.*)$ /to/$1 permanent; }
        location /r9/ { root {root}; error_page 301 = /page.txt; }
        location = /page.txt { root {root}; }
        location /c1/ { rewrite ^/c1/(.*)$ /new?v=$1 break; proxy_pass http://127.0.0.1:APP; }
        location /c2/ { rewrite ^/c2/(.*)$ /to/$1 redirect; }
        location /c3/ { rewrite ^/c3/(.*)$ /new/$1 break; proxy_pass http://127.0.0.1:APP; }
        location /c4/ { rewrite ^/c4/(.*)$ /to/%41$1%20x%26%zz%4 redirect; }
    }
}
"""


@pytest.mark.skipif(NGINX is None, reason="Debian's nginx is installed by scripts/test-all.sh")
def test_rewrite_arguments_as_nginx_sets_them(tmp_path):
    """Where a rewrite's arguments start, whether the original ones follow and whether it
    redirects come from the replacement's text, not from what its variables hold: Gitea's
    `rewrite ^ $request_uri; rewrite ^(/gitea)?(/.*) $2 break; proxy_pass http://h$uri;`
    passes the query on, as nginx does."""
    app = rawapps.HttpApp(echo_line)
    try:
        conf = REWRITE_ARGS_CONF.replace("APP", str(app.port))
        paths = [f"/{loc}/a/b{q}" for loc in ("g1", "g2", "g3", "g4", "g5", "g6", "g7", "g8", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9") for q in ("", "?q=x")]
        paths += ["/g1/api/v1/repos/search?q=x&sort=a%20b", "/g1/a%2Fb/c?x=%2F"]
        paths += [f"/{c}/{p}" for c in ("c1", "c2", "c3", "c4") for p in ("a%20b&c", "a+b", "x%3Fy?q=1", "plain", "%C3%A9")]
        paths += ["/r1/a%2Fb%20c%3Fd?q=1", "/r1/a%26b"]
        with side_by_side(tmp_path, conf, {"page.txt": "page\n", "r9/a/b/x": "x\n"}) as (srv, nginx_port):
            sent = [f"GET {p} HTTP/1.1\r\nHost: main.test\r\nConnection: close\r\n\r\n".encode() for p in paths]
            answers = [(exchange(nginx_port, r), exchange(srv.port, r)) for r in sent]
    finally:
        app.close()

    def view(a, port):
        body = a.body.replace(b"<center>gannet</center>", b"<center>nginx</center>")
        return a.status, (a.headers.get("location") or "").replace(f":{port}/", ":PORT/"), body

    diffs = [f"{p}: nginx {view(n, nginx_port)}, gannet {view(g, srv.port)}"
             for p, (n, g) in zip(paths, answers) if view(n, nginx_port) != view(g, srv.port)]  # fmt: skip
    assert not diffs, f"{len(diffs)} differences from nginx:\n" + "\n".join(diffs)
    got = dict(zip(paths, (g for _, g in answers)))
    assert got["/g1/a/b?q=x"].body == b"GET /a/b?q=x HTTP/1.0 seen=/a/b?q=x|q=x|?\n"
    assert got["/r4/a/b?q=x"].body == b"[http://x.test/p|q=x|?]\n"
    assert got["/r7/a/b"].status == 200 and got["/r7/a/b"].headers["location"] == f"http://main.test:{srv.port}/elsewhere"
