<?php
/*
 * The Shakespeare app of study S1: one front controller for every URL.
 *
 *   /                        every work: title, year, genre
 *   /{work}                  its acts
 *   /{work}/{act}            the act's scenes
 *   /{work}/{act}/{scene}    the scene's text
 *   any of them + ".json"    the same data as JSON ("/.json" or "/index.json" for the list)
 *
 * Web servers route every URL that is not a file here, as WordPress does:
 *   try_files $uri $uri/ /index.php?$args;
 * so the path comes from REQUEST_URI (the client's own request line), not from the script
 * name or PATH_INFO. Data: MariaDB, loaded by ../load.py; see ../README.md.
 */
declare(strict_types=1);

const GENRES = ['comedy' => 'Comedy', 'tragedy' => 'Tragedy', 'history' => 'History', 'poem' => 'Poem'];
const JSON_FLAGS = JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE | JSON_INVALID_UTF8_SUBSTITUTE | JSON_THROW_ON_ERROR;

final class HttpError extends Exception
{
    public function __construct(public readonly int $status, string $message)
    {
        parent::__construct($message);
    }
}

/** The connection, opened once per request; persistent, so each PHP-FPM child keeps one
 *  MariaDB connection across requests (PDO pings it before reuse and reconnects if the
 *  server went away). Settings come from the pool's env[] lines, with setup.sh's values as
 *  defaults. */
function db(): PDO
{
    static $pdo = null;
    if ($pdo === null) {
        $socket = getenv('SHAKESPEARE_DB_SOCKET') ?: '/run/mysqld/mysqld.sock';
        $name = getenv('SHAKESPEARE_DB_NAME') ?: 'shakespeare';
        $pdo = new PDO(
            "mysql:unix_socket=$socket;dbname=$name;charset=utf8mb4",
            getenv('SHAKESPEARE_DB_USER') ?: 'shakespeare',
            getenv('SHAKESPEARE_DB_PASSWORD') ?: 'shakespeare-s1',
            [
                PDO::ATTR_PERSISTENT => true,
                PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION,
                PDO::ATTR_DEFAULT_FETCH_MODE => PDO::FETCH_ASSOC,
                // Real server-side prepared statements: values never become SQL text, and
                // integer columns come back as PHP ints (so JSON has numbers).
                PDO::ATTR_EMULATE_PREPARES => false,
            ]
        );
    }
    return $pdo;
}

/** Runs a prepared statement and returns all rows. */
function rows(string $sql, array $params = []): array
{
    $st = db()->prepare($sql);
    $st->execute($params);
    return $st->fetchAll();
}

function h(string|int|null $s): string
{
    return htmlspecialchars((string)$s, ENT_QUOTES | ENT_SUBSTITUTE | ENT_HTML5, 'UTF-8');
}

function roman(int $n): string
{
    $out = '';
    foreach (['C' => 100, 'XC' => 90, 'L' => 50, 'XL' => 40, 'X' => 10, 'IX' => 9, 'V' => 5, 'IV' => 4, 'I' => 1] as $sym => $v) {
        for (; $n >= $v; $n -= $v) {
            $out .= $sym;
        }
    }
    return $out;
}

/** "Act III"; act 0 is an induction (The Taming of the Shrew, Henry IV Part 2); a poem's
 *  single act holds its parts. */
function act_label(array $work, int $act): string
{
    if ($work['genre'] === 'poem') {
        return 'Poem';
    }
    return $act === 0 ? 'Induction' : 'Act ' . roman($act);
}

// --- routing ------------------------------------------------------------------------------

/** Splits the request path into segments and sets $json; throws HttpError for junk. */
function parse_path(string $uri, bool &$json): array
{
    $path = explode('?', $uri, 2)[0];
    // An absolute-form request target (GET http://host/path) carries the path after the authority.
    if (preg_match('~^https?://[^/]*(/.*)?$~i', $path, $m)) {
        $path = $m[1] ?? '/';
    }
    if ($path === '' || $path[0] !== '/') {
        throw new HttpError(400, 'the request path must start with /');
    }
    // ".json" at the end of any path asks for JSON, errors included.
    $json = str_ends_with($path, '.json');
    if ($json) {
        $path = substr($path, 0, -5);
    }
    // Empty segments (a trailing or doubled slash) are ignored; each segment is decoded on
    // its own, so an encoded slash stays inside its segment.
    $segments = [];
    foreach (explode('/', $path) as $raw) {
        if ($raw === '') {
            continue;
        }
        $seg = rawurldecode($raw);
        if ($seg === '.' || $seg === '..') {
            throw new HttpError(400, 'dot segments are not allowed in the path');
        }
        $segments[] = $seg;
    }
    // The front controller itself: /index.php and /index.php/... (PATH_INFO style); and
    // "/index.json" (like "/.json") is the list of works.
    if ($segments && $segments[0] === 'index.php') {
        array_shift($segments);
    } elseif ($json && $segments === ['index']) {
        $segments = [];
    }
    return $segments;
}

/** A path segment that must be an act or scene number. */
function number(string $seg, string $what): int
{
    if (!preg_match('/^[0-9]+$/', $seg)) {
        throw new HttpError(400, "$what must be a number, not \"$seg\"");
    }
    // Longer numbers than any act or scene cannot exist; don't let them overflow an int.
    return strlen($seg) > 6 ? 999999 : (int)$seg;
}

function find_work(string $slug): array
{
    if (!preg_match('/^[a-z0-9-]{1,64}$/', $slug)) {
        throw new HttpError(404, "no work called \"$slug\"");
    }
    $work = rows('SELECT id, slug, title, year, genre FROM works WHERE slug = ?', [$slug])[0] ?? null;
    if ($work === null) {
        throw new HttpError(404, "no work called \"$slug\"");
    }
    return $work;
}

function work_json(array $w): array
{
    return ['slug' => $w['slug'], 'title' => $w['title'], 'year' => $w['year'], 'genre' => $w['genre'], 'url' => '/' . $w['slug']];
}

// --- pages: each returns [title, breadcrumbs, HTML body, JSON data] --------------------------------

function page_index(): array
{
    $works = rows('SELECT slug, title, year, genre FROM works ORDER BY title');
    $html = "<table>\n<thead><tr><th>Title</th><th>Year</th><th>Genre</th></tr></thead>\n<tbody>\n";
    foreach ($works as $w) {
        $html .= '<tr><td><a href="/' . h($w['slug']) . '">' . h($w['title']) . '</a></td><td>' . h($w['year'])
            . '</td><td>' . h(GENRES[$w['genre']]) . "</td></tr>\n";
    }
    $html .= "</tbody>\n</table>\n";
    return ['The Complete Works of William Shakespeare', [], $html, ['works' => array_map('work_json', $works)]];
}

function page_work(string $slug): array
{
    $work = find_work($slug);
    $acts = rows(
        'SELECT act, COUNT(*) AS scenes FROM chapters WHERE work_id = ? GROUP BY act ORDER BY act',
        [$work['id']]
    );
    $base = '/' . $work['slug'];
    $html = '<p>' . h(GENRES[$work['genre']]) . ', ' . h($work['year']) . "</p>\n<ul>\n";
    $data = [];
    foreach ($acts as $a) {
        $n = (int)$a['scenes'];
        $html .= '<li><a href="' . h("$base/{$a['act']}") . '">' . h(act_label($work, $a['act'])) . '</a> ('
            . $n . ' ' . ($work['genre'] === 'poem' ? 'part' : 'scene') . ($n === 1 ? '' : 's') . ")</li>\n";
        $data[] = ['act' => $a['act'], 'label' => act_label($work, $a['act']), 'scenes' => $n, 'url' => "$base/{$a['act']}"];
    }
    $html .= "</ul>\n";
    return [$work['title'], [], $html, ['work' => work_json($work), 'acts' => $data]];
}

function page_act(string $slug, string $actSeg): array
{
    $act = number($actSeg, 'the act');
    $work = find_work($slug);
    $scenes = rows(
        'SELECT scene, title, description FROM chapters WHERE work_id = ? AND act = ? ORDER BY scene',
        [$work['id'], $act]
    );
    if (!$scenes) {
        throw new HttpError(404, "{$work['title']} has no act $actSeg");
    }
    $base = "/{$work['slug']}/$act";
    $html = "<ul>\n";
    $data = [];
    foreach ($scenes as $s) {
        $html .= '<li><a href="' . h("$base/{$s['scene']}") . '">' . h($s['title']) . '</a>'
            . ($s['description'] !== '' ? ': ' . h($s['description']) : '') . "</li>\n";
        $data[] = ['scene' => $s['scene'], 'title' => $s['title'], 'description' => $s['description'], 'url' => "$base/{$s['scene']}"];
    }
    $html .= "</ul>\n";
    $label = act_label($work, $act);
    return [
        "{$work['title']}: $label",
        [[$work['title'], "/{$work['slug']}"]],
        $html,
        ['work' => work_json($work), 'act' => $act, 'label' => $label, 'scenes' => $data],
    ];
}

function page_scene(string $slug, string $actSeg, string $sceneSeg): array
{
    $act = number($actSeg, 'the act');
    $scene = number($sceneSeg, 'the scene');
    $work = find_work($slug);
    $chapter = rows(
        'SELECT id, title, description FROM chapters WHERE work_id = ? AND act = ? AND scene = ?',
        [$work['id'], $act, $scene]
    )[0] ?? null;
    if ($chapter === null) {
        // Say which part is missing; this extra query runs only on the error path.
        $hasAct = rows('SELECT 1 FROM chapters WHERE work_id = ? AND act = ? LIMIT 1', [$work['id'], $act]);
        throw new HttpError(404, $hasAct
            ? "{$work['title']}, " . act_label($work, $act) . ", has no scene $sceneSeg"
            : "{$work['title']} has no act $actSeg");
    }
    $paragraphs = rows(
        'SELECT p.seq, c.name AS speaker, p.is_direction, p.text FROM paragraphs p'
        . ' LEFT JOIN characters c ON c.id = p.character_id WHERE p.chapter_id = ? ORDER BY p.seq',
        [$chapter['id']]
    );
    $html = $chapter['description'] !== '' ? '<p class="place">' . h($chapter['description']) . "</p>\n" : '';
    $data = [];
    foreach ($paragraphs as $p) {
        $text = nl2br(h($p['text']), false);
        if ($p['is_direction']) {
            $html .= "<p class=\"sd\"><i>$text</i></p>\n";
        } elseif ($p['speaker'] !== null) {
            $html .= '<p><b>' . h($p['speaker']) . "</b><br>\n$text</p>\n";
        } else {
            $html .= "<p>$text</p>\n";
        }
        $data[] = ['n' => $p['seq'], 'speaker' => $p['speaker'], 'direction' => (bool)$p['is_direction'], 'text' => $p['text']];
    }
    $label = act_label($work, $act);
    return [
        "{$work['title']}: " . ($work['genre'] === 'poem' ? $chapter['title'] : "$label, {$chapter['title']}"),
        [[$work['title'], "/{$work['slug']}"], [$label, "/{$work['slug']}/$act"]],
        $html,
        [
            'work' => work_json($work), 'act' => $act, 'scene' => $scene, 'title' => $chapter['title'],
            'description' => $chapter['description'], 'paragraphs' => $data,
        ],
    ];
}

// --- output -------------------------------------------------------------------------------

function html_page(string $title, array $crumbs, string $body): string
{
    $nav = '<a href="/">Shakespeare</a>';
    foreach ($crumbs as [$label, $url]) {
        $nav .= ' &rsaquo; <a href="' . h($url) . '">' . h($label) . '</a>';
    }
    $t = h($title);
    return <<<HTML
    <!DOCTYPE html>
    <html lang="en">
    <head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1">
    <title>$t</title>
    <style>body{font-family:Georgia,serif;max-width:46em;margin:1em auto;padding:0 1em;line-height:1.4}
    td,th{padding:.15em .8em .15em 0;text-align:left}.sd,.place{color:#555}</style>
    </head>
    <body>
    <nav>$nav</nav>
    <h1>$t</h1>
    $body</body>
    </html>

    HTML;
}

function send(int $status, string $contentType, string $body): void
{
    http_response_code($status);
    header("Content-Type: $contentType");
    // The whole body is built before sending, so its length is known: web servers can keep
    // the client connection alive without chunked encoding.
    header('Content-Length: ' . strlen($body));
    echo $body;
}

$method = $_SERVER['REQUEST_METHOD'] ?? 'GET';
$json = false;
try {
    $segments = parse_path($_SERVER['REQUEST_URI'] ?? '/', $json);
    if ($method !== 'GET' && $method !== 'HEAD') {
        header('Allow: GET, HEAD');
        throw new HttpError(405, "method $method is not allowed");
    }
    [$title, $crumbs, $html, $data] = match (count($segments)) {
        0 => page_index(),
        1 => page_work($segments[0]),
        2 => page_act($segments[0], $segments[1]),
        3 => page_scene($segments[0], $segments[1], $segments[2]),
        default => throw new HttpError(404, 'no such page'),
    };
    if ($json) {
        send(200, 'application/json', json_encode($data, JSON_FLAGS));
    } else {
        send(200, 'text/html; charset=utf-8', html_page($title, $crumbs, $html));
    }
} catch (HttpError | PDOException $e) {
    if ($e instanceof PDOException) {
        // The database is down or not loaded: log the detail, tell the client little.
        error_log('shakespeare: ' . $e->getMessage());
        $e = new HttpError(503, 'the database is not available');
    }
    $reason = [400 => 'Bad Request', 404 => 'Not Found', 405 => 'Method Not Allowed', 503 => 'Service Unavailable'][$e->status];
    if ($json) {
        send($e->status, 'application/json', json_encode(['error' => ['status' => $e->status, 'message' => $e->getMessage()]], JSON_FLAGS));
    } else {
        send($e->status, 'text/html; charset=utf-8', html_page("{$e->status} $reason", [], '<p>' . h($e->getMessage()) . "</p>\n"));
    }
}
