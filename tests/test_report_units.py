"""Report pieces that need no server: progress display, ordering by leaf, rendering, escaping, windows."""

from __future__ import annotations

import io
import math
import struct

import pytest

from fabricd.perfmodel import Fabric
from fabricd.progress import PlainProgress, progress
from fabricd.report import ReportData, ReportQuery
from fabricd.report.data import PingCell, Window
from fabricd.report.gather import incident_end, series_step
from fabricd.report.plots import leaf_breaks, node_order, pingmesh_plot
from fabricd.report.render import render


def test_plain_progress_prints_a_bounded_number_of_lines_and_always_the_last() -> None:
    out = io.StringIO()
    with progress("eval", total=95, stream=out) as step:
        for k in range(95):
            step(note=f"scenario-{k}")
    lines = out.getvalue().splitlines()
    assert 9 <= len(lines) <= 11  # about one line per tenth, not 95
    assert lines[-1] == "eval: 95/95 (100%) scenario-94"
    assert all("\x1b[" not in line for line in lines)  # no terminal control codes in a log


def test_progress_without_a_total_counts() -> None:
    out = io.StringIO()
    step = PlainProgress("warm-up", None, out, lines=10)
    step(3, "nodes up")
    assert out.getvalue() == "warm-up: 3 nodes up\n"


def test_progress_on_a_terminal_draws_a_rich_bar() -> None:
    out = io.StringIO()
    with progress("bench", total=4, stream=out, tty=True) as step:
        for _ in range(4):
            step()
    text = out.getvalue()
    assert "bench" in text and "4/4" in text


def test_pairs_are_ordered_by_leaf_with_natural_node_numbers() -> None:
    nodes = node_order(["node-010", "node-002", "node-001", "node-009", "node-005"])
    assert nodes == ["node-001", "node-002", "node-005", "node-009", "node-010"]
    assert leaf_breaks(nodes, 4) == [2, 3]  # leaves: 1-4 | 5-8 | 9-12
    assert leaf_breaks(["gpu-a", "gpu-b"], 4) == []  # names without numbers: no leaf lines


def test_pingmesh_heatmap_is_a_real_image_with_gaps_where_nothing_was_probed() -> None:
    cells = [
        PingCell("node-001", "node-002", 20e-6, 0.0),
        PingCell("node-002", "node-001", 35e-6, 0.25),
        PingCell("node-003", "node-001", None, None),
    ]
    plot = pingmesh_plot(cells, nodes_per_leaf=2)
    width, height = struct.unpack(">II", plot.png[16:24])
    assert plot.png.startswith(b"\x89PNG") and width > 600 and height > 250
    assert plot.data["p99_us"][1][0] == pytest.approx(35.0) and plot.data["loss_percent"][1][0] == pytest.approx(25.0)
    assert math.isnan(plot.data["p99_us"][0][2])  # node-001 never probed node-003
    assert plot.data["leaf_breaks"] == [2]


def test_fleet_text_is_escaped_and_empty_sections_say_so() -> None:
    inc = {
        "id": 7,
        "kind": "congestion",
        "severity": "critical",
        "state": "open",
        "element": "<script>x</script>",
        "summary": "a & b",
        "started_ts": 1e9,
        "updated_ts": 1e9 + 60,
        "resolved_ts": None,
        "acked_by": None,
        "candidates": [],
        "evidence": [],
        "timeline": [],
    }
    data = ReportData("Incident #7", Window(1e9 - 600, 1e9 + 660), 1e9 + 700, ReportQuery(incident_id=7), [inc])
    html = render(data).html
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html and "a &amp; b" in html
    for words in (
        "No localization candidates.",
        "No evidence recorded.",
        "No pingmesh results in this window.",
        "No NCCL-tests results in this window.",
        "No port throughput in this window.",
    ):
        assert words in html
    assert "<img" not in html


def test_query_is_one_incident_or_one_range() -> None:
    with pytest.raises(ValueError, match="not both or neither"):
        ReportQuery()
    with pytest.raises(ValueError, match="not both or neither"):
        ReportQuery(incident_id=1, since=0.0)
    with pytest.raises(ValueError, match="until must be after since"):
        ReportQuery(since=100.0, until=50.0)
    with pytest.raises(ValueError, match="link rates must be positive"):
        ReportQuery(incident_id=1, fabric=Fabric(link_rate_bytes_per_second=0.0))


def test_long_windows_are_read_in_buckets_and_open_incidents_end_at_their_latest_news() -> None:
    assert series_step(Window(0, 3600)) is None
    assert series_step(Window(0, 6 * 3600)) == "36s"  # 600 points
    inc = {
        "started_ts": 100.0,
        "updated_ts": 100.0,
        "resolved_ts": None,
        "evidence": [{"ts": 160.0}],
        "timeline": [{"ts": 130.0}],
    }
    assert incident_end(inc, now=1000.0) == 160.0
    assert incident_end({**inc, "resolved_ts": 400.0}, now=1000.0) == 400.0
    assert incident_end({**inc, "resolved_ts": 4000.0}, now=1000.0) == 1000.0
