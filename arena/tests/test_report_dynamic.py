"""The dynamic scenarios' reports, through the real writer from known per-round figures: S3's
table in the study's own columns, S1 dynamic's in the static layout plus the PHP tier, the
PHP tier's side-by-side tables and plots, and the CSV."""

from __future__ import annotations

import csv

import pytest

from arena import envinfo
from arena.clients.base import LoadResult, ToolRun
from arena.measure import TreeSample
from arena.output import RunFolder, write_run
from arena.report import server_tables, side_by_side
from arena.scenarios import get
from arena.scenarios._php_app import PhpAppScenario
from arena.scenarios.base import Options, record
from arena.servers import SERVERS


def dynamic_sample(server: str, rps: float, siege_summary: bool) -> dict:
    requests = 20_000
    result = LoadResult(tool="siege" if siege_summary else "wrk", requests=requests, rps=rps,
                        duration_s=requests / rps, latency_ms={"mean": 25.0, "max": 900.0})
    tool = ToolRun("", "", 0, cpu_seconds=1.0, wall_seconds=requests / rps, timed_out=False)
    tree = TreeSample(cpu_seconds=2.0, peak_cpu_percent=40.0, peak_rss_kib=8192, peak_pss_kib=4096, peak_processes=2)
    # apache-prefork runs PHP itself: no PHP-FPM figures, its tree is the whole PHP tier.
    php = None if server == "apache-prefork" else TreeSample(cpu_seconds=8.0, peak_cpu_percent=60.0,
                                                             peak_rss_kib=300 * 1024, peak_pss_kib=100 * 1024,
                                                             peak_processes=101)
    rec = record(result, tool, None, tree)
    PhpAppScenario.add_php(rec, tree, php, requests)
    if siege_summary:
        rec.update({"transactions": requests, "elapsed_s": requests / rps, "data_mb": 69.66, "response_s": 0.025,
                    "throughput_mb_s": 69.66 / (requests / rps), "siege_concurrency": 29.5})
    return rec


def build(folder, scenario_name: str, rps_of: dict[str, float]) -> dict:
    scenario = get(scenario_name)
    options = Options(quick=True, rounds=1, profile="default")
    points = scenario.points(options)
    samples = []
    for point in points:
        for server, rps in rps_of.items():
            rec = dynamic_sample(server, rps, scenario_name == "s3-sessions")
            rec.update({"server": server, "point": point.key, "round": 1})
            samples.append(rec)
    environment = envinfo.collect([SERVERS[s] for s in rps_of], scenario.tools, options)
    run = RunFolder(folder)
    run.create()
    results = write_run(run, scenario=scenario, options=options, servers=list(rps_of), points=points,
                        samples=samples, environment=environment, started=0.0, finished=60.0, interrupted=False)
    run.finish()
    return results


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("s3") / "run"
    return folder, build(folder, "s3-sessions", {"gannet": 1000.0, "nginx": 800.0, "apache-prefork": 500.0})


def test_s3_table_has_the_studys_columns(s3):
    tables = server_tables(s3[1])
    assert [t.title for t in tables] == ["gannet", "nginx", "apache-prefork"]
    assert tables[0].headers == ["Sessions", "Transactions", "Elapsed (s)", "Data (MB)", "Response time (s)",
                                 "Transaction rate (/s)", "Throughput (MB/s)", "Concurrency", "Failed",
                                 "Server max CPU %", "Server PSS (MiB)", "PHP-FPM max CPU %", "PHP-FPM PSS (MiB)",
                                 "CPU s / 10k (server + PHP)"]
    assert [row[0] for row in tables[0].rows] == ["5", "10"]
    assert tables[0].rows[0] == ["5", "20,000", "20.00", "69.66", "0.025", "1,000", "3.48", "29.50", "0",
                                 "40", "4.0", "60", "100.0", "5.000"]
    # mod_php: the PHP tier is the server's own tree, so the PHP-FPM columns are empty.
    assert tables[2].rows[0][11:] == ["-", "-", "1.000"]


def test_s3_report_files(s3):
    folder = s3[0]
    names = {p.name for p in folder.iterdir()}
    assert {"report.md", "report.html", "results.json", "results.csv", "rps.png", "php-cpu.png",
            "php-memory.png"} <= names
    md = (folder / "report.md").read_text()
    assert md.startswith("# S3 sessions")
    assert "#### PHP-FPM CPU s / 10k req (s)" in md and "#### Server + PHP CPU s / 10k req (s)" in md
    assert "![CPU s per 10,000 requests (solid server + PHP-FPM, dashed PHP-FPM alone)](php-cpu.png)" in md
    html = (folder / "report.html").read_text()
    # siege reports no percentiles: no latency plot.
    assert html.count("data:image/png;base64,") == 5 and "latency.png" not in names
    with open(folder / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * 3
    assert rows[0]["sessions"] == "5" and float(rows[0]["transactions"]) == 20000
    assert float(rows[1]["php_cpu_per_10k"]) == 4.0 and rows[2]["php_cpu_per_10k"] == ""


def test_s3_side_by_side_ratio_to_gannet(s3):
    table = side_by_side(s3[1], "total_cpu_per_10k")
    assert table.headers == ["point", "gannet", "nginx", "apache-prefork"]
    assert table.rows[0] == ["sessions5", "5.000", "5.000 x1.00", "1.000 x0.20"]


def test_s1_dynamic_table_is_the_static_layout_plus_php(tmp_path):
    results = build(tmp_path / "run", "s1-dynamic", {"gannet": 1000.0, "nginx": 900.0})
    table = server_tables(results)[0]
    assert table.headers == ["Client", "Connection", "Requests", "Concurrency", "Req/s", "Max CPU %",
                             "Memory (PSS MiB)", "PHP-FPM max CPU %", "PHP-FPM memory (PSS MiB)",
                             "CPU s / 10k (server + PHP)", "Failed responses"]
    assert table.rows[0] == ["wrk", "keep-alive", "300", "1", "1,000", "40", "4.0", "60", "100.0", "5.000", "0"]
    assert len(table.rows) == 12
