"""The report writer: study-layout tables, side-by-side summary, self-contained HTML, CSV."""

from __future__ import annotations

import base64
import csv
import json
import re

import pytest

from arena.report import header_table, markdown, server_tables, side_by_side
from results_data import build


@pytest.fixture(scope="module")
def simple(tmp_path_factory):
    """gannet at 1,000 req/s and nginx at 500 at every point, one round."""
    folder = tmp_path_factory.mktemp("report") / "run"
    return folder, build(folder, {"gannet": [1000], "nginx": [500]})


def test_result_folder_has_every_file(simple):
    folder = simple[0]
    names = {p.name for p in folder.iterdir()}
    assert {"results.json", "results.csv", "samples.csv", "report.md", "report.html",
            "environment.json", "rps.png", "latency.png", "cpu.png", "memory.png"} <= names
    assert not list(folder.parent.glob(".*partial"))


def test_study_layout_tables(simple):
    results = simple[1]
    tables = server_tables(results)
    assert [t.title for t in tables] == ["gannet", "nginx"]
    assert tables[0].headers == ["Client", "Connection", "Requests", "Concurrency", "Req/s",
                                 "Max CPU %", "Memory (PSS MiB)", "Failed responses"]
    assert tables[1].rows[0] == ["wrk", "keep-alive", "1,000", "1", "500", "80", "4.0", "0"]
    assert len(tables[0].rows) == len(results["points"])


def test_side_by_side_shows_ratio_to_gannet(simple):
    results = simple[1]
    table = side_by_side(results, "rps")
    assert table.headers == ["point", "gannet", "nginx"]
    assert table.rows[0] == ["wrk/keepalive/c1", "1,000", "500 x0.50"]


def test_markdown_and_html(tmp_path):
    results = build(tmp_path / "run", {"gannet": [1000, 1200], "nginx": [500, 550]}, interrupted=True)
    md = (tmp_path / "run" / "report.md").read_text()
    assert md.startswith("# S1 static")
    assert "INTERRUPTED" in md and "The run was interrupted" in md
    assert "| wrk | keep-alive | 1,000 | 1 | 1,100 (1,000-1,200) |" in md
    assert "![Requests per second](rps.png)" in md
    page = (tmp_path / "run" / "report.html").read_text()
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    assert len(images) == 4
    assert base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<table>" in page and "src='rps.png'" not in page  # self-contained
    assert markdown(results, []) .count("####") >= 4


def test_header_table_lists_each_server(simple):
    results = simple[1]
    rows = header_table(results).rows
    assert rows[0] == ["gannet", "/img.jpg", "240", "235", "403,456", "gannet"]


def test_csv_has_one_row_per_point_and_server(simple):
    folder, results = simple
    with open(folder / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * len(results["points"])
    assert rows[1]["server"] == "nginx" and float(rows[1]["rps_vs_gannet"]) == 0.5
    saved = json.loads((folder / "results.json").read_text())
    assert saved["summary"] == json.loads(json.dumps(results["summary"]))
