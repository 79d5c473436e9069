"""NCCL Inspector: its JSON lines and Prometheus files parsed, the collector, rank stragglers."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from collectors.inspector import InspectorCollector
from fabricd.collector import build
from fabricd.detect.ranks import RankStragglers, RankTime, SlowRank
from fabricd.inspector_parse import CollRecord, job_of_folder, message_size, parse_jsonl, parse_prom
from fabricd.model import Incident, Kind, Reading, Sample
from fabricd.scrape_rows import BUILD, Layout, ScrapeRows
from fabricd.server.rankstragglers import RankStragglerDetector
from fabricd.server.store.records import Delivery
from tests.helpers import CASES
from tests.support.detectors import ImmediateDetector

CASE = CASES / "inspector"
JSON_LOG = CASE / "readme_json" / "nccl-inspector-4242" / "example-hostname-1639453.log"
PROM = CASE / "prom_synthetic" / "nccl_inspector_metrics_GPU-5c8a3f2e.prom"
REGISTRY = {"inspector": "collectors.inspector:InspectorCollector"}


def test_documented_json_records() -> None:
    parsed = parse_jsonl(JSON_LOG.read_text(), job_of_folder(JSON_LOG.parent.name))
    assert parsed.errors == []
    assert parsed.records[0] == CollRecord(
        "4242",
        "0x7f8c496ae9f661",
        2,
        8,
        "example-hostname",
        "AllReduce",
        1407,
        17179869184.0,
        0.061974,
        485.119099e9,
        277.210914e9,
        1,
    )
    assert [(r.coll, r.rank, r.seq, r.exec_time_seconds) for r in parsed.records[1:]] == [
        ("ReduceScatter", 4, 1231, 0.041057),
        ("ReduceScatter", 31, 129, 0.00011),
    ]
    assert job_of_folder("nccl-inspector-unknown-jobid") == "" and job_of_folder("logs") == ""


def test_v43_records_take_the_dump_context_and_bad_lines_are_named() -> None:
    # SYNTHETIC v4.3 dump, shaped as the plugin's inspector_json_reader.py restores it.
    context = {"header": {"id": "0x1", "rank": 0, "n_ranks": 2}, "metadata": {"hostname": "h"}, "dump_stats": {}}
    perf = {"coll": "AllGather", "coll_sn": 5, "coll_msg_size_bytes": 8, "coll_exec_time_us": 9}
    bad = {"coll_perf": {"coll": "AllGather"}}
    text = "\n".join(
        [
            json.dumps(context),
            json.dumps({"coll_perf": {**perf, "coll_busbw_gbs": 1, "coll_algobw_gbs": 1}}),
            "{oops",
            json.dumps(bad),
            "[]",
        ]
    )
    parsed = parse_jsonl(text, "7")
    assert [(r.comm, r.rank, r.host, r.coll, r.seq) for r in parsed.records] == [("0x1", 0, "h", "AllGather", 5)]
    assert parsed.errors == [
        "line 3: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        "line 4: missing 'coll_msg_size_bytes'",
        "line 5: a record is a JSON object",
    ]


def test_prometheus_file_merges_the_three_metrics_per_rank() -> None:
    parsed = parse_prom(PROM.read_text())
    assert parsed.errors == []
    assert [(r.rank, r.exec_time_seconds) for r in parsed.records] == [
        (0, 0.061974),
        (1, 0.06241),
        (2, 0.061002),
        (3, 0.13195),
    ]
    assert parsed.records[3] == CollRecord(
        "4242",
        "0xd152c00f111816",
        3,
        4,
        "pool0-0002",
        "AllReduce",
        228924,
        2 * 1024**3,
        0.13195,
        227.853e9,
        151.902e9,
        1,
    )
    with pytest.raises(ValueError, match=r"message_size '2 GiB' is not a size such as 2.00GB"):
        message_size("2 GiB")


def _collector(folder: Path) -> InspectorCollector:
    c = build("inspector", {"dir": str(folder)}, node="n1", sysfs_root=Path("/sys"), registry=REGISTRY)
    assert isinstance(c, InspectorCollector)
    return c


def _series(readings: list[Reading]) -> list[tuple[str, str, str, float]]:
    return [(r.device, dict(r.labels).get("rank", ""), r.counter, r.value) for r in readings]


def test_collector_follows_json_lines_and_rewritten_prom_files(tmp_path: Path) -> None:
    folder = tmp_path / "inspector"
    shutil.copytree(JSON_LOG.parent, folder / JSON_LOG.parent.name)
    c = _collector(folder)
    first = list(asyncio.run(c.collect()))
    assert [(r.device, dict(r.labels)) for r in first if r.counter == "exec_time_seconds"] == [
        ("AllReduce", {"job_id": "4242", "comm": "0x7f8c496ae9f661", "rank": "2"}),
        ("ReduceScatter", {"job_id": "4242", "comm": "0xe62dedaa97644a", "rank": "4"}),
        ("ReduceScatter", {"job_id": "4242", "comm": "0x9e7a479f95a66c", "rank": "31"}),
    ]
    assert _series(list(asyncio.run(c.collect()))) == [("", "", "records_invalid", 0.0)]  # nothing new
    log = folder / JSON_LOG.parent.name / JSON_LOG.name
    record = json.loads(JSON_LOG.read_text().splitlines()[0])
    record["coll_perf"]["coll_sn"] = 1408
    with log.open("a") as f:
        f.write(json.dumps(record) + "\n" + '{"header": {"id": "0x7f')  # the next line is half written
    got = _series(list(asyncio.run(c.collect())))
    assert got[0] == ("AllReduce", "2", "exec_time_seconds", 0.061974) and len(got) == 7
    shutil.copy(PROM, folder / PROM.name)
    got = _series(list(asyncio.run(c.collect())))
    assert [(rank, v) for _, rank, name, v in got if name == "exec_time_seconds"] == [
        ("0", 0.061974),
        ("1", 0.06241),
        ("2", 0.061002),
        ("3", 0.13195),
    ]
    os.utime(folder / PROM.name, ns=(1, 1))  # rewritten with the same records: nothing new to report
    assert _series(list(asyncio.run(c.collect()))) == [("", "", "records_invalid", 0.0)]


def test_a_rank_slower_than_its_peers_is_a_straggler_after_two_dumps() -> None:
    ranks = RankStragglers(ratio=1.5, min_ranks=3, sustain=2)
    records = parse_prom(PROM.read_text()).records
    for dump, ts in enumerate((100.0, 130.0)):
        for r in records:
            ranks.observe(RankTime(r.job_id, r.comm, r.coll, str(r.rank), f"node-{r.rank}", ts, r.exec_time_seconds))
        slow = ranks.judge()
        assert slow == (
            []
            if dump == 0
            else [SlowRank("4242", "0xd152c00f111816", "AllReduce", "3", "node-3", 130.0, 0.13195, 0.061974)]
        )
    assert round(slow[0].ratio, 2) == 2.13
    for r in records:  # rank 3 recovers
        ranks.observe(RankTime(r.job_id, r.comm, r.coll, str(r.rank), f"node-{r.rank}", 160.0, 0.062))
    assert ranks.judge() == [] and ranks.slow() == set()
    # A communicator silent for ten windows is forgotten.
    ranks.observe(RankTime("9", "0xother", "AllGather", "0", "node-0", 160.0 + 10 * 120 + 1, 0.01))
    assert ranks.judge() == [] and list(ranks.groups) == [("9", "0xother", "AllGather")]


class Quiet(ImmediateDetector):
    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        return []


def test_straggler_incidents_open_and_resolve_on_inspector_samples(tmp_path: Path) -> None:
    det = RankStragglerDetector(Quiet())
    records = parse_prom(PROM.read_text()).records
    from collectors.inspector import record_readings

    def dump(ts: float, slow_seconds: float) -> list[Delivery]:
        out = []
        for r in records:
            seconds = slow_seconds if r.rank == 3 else r.exec_time_seconds
            rec = dataclasses.replace(r, exec_time_seconds=seconds)
            out.append(Delivery(f"node-{r.rank}", [Sample(ts, x) for x in record_readings(rec)]))
        return out

    assert det.deliver(dump(100.0, 0.13195), 100.0, frozenset()) == []
    (inc,) = det.deliver(dump(130.0, 0.13195), 130.0, frozenset())
    assert (inc.kind.value, inc.state.value, inc.element, inc.started_ts) == ("straggler", "open", "node-3", 130.0)
    assert (
        inc.summary == "rank 3 of job 4242 is 2.1x slower than its peers in AllReduce (communicator 0xd152c00f111816)"
    )
    assert (inc.evidence[0].signal, inc.evidence[0].value, inc.evidence[0].threshold) == (
        "rank_exec_time_ratio",
        2.129,
        1.5,
    )
    (resolved,) = det.deliver(dump(160.0, 0.062), 160.0, frozenset())
    assert (resolved.key, resolved.state.value, resolved.resolved_ts) == (inc.key, "resolved", 160.0)


class _Untouched:
    """An inner detector that looks at no sample (what the rank detector itself reads is tested)."""

    rates_only = True

    def deliver(self, deliveries: Sequence[Delivery], now: float, partial: frozenset[str]) -> list[Incident]:
        return []


def _as_rows(readings: Sequence[Reading], ts: float) -> ScrapeRows:
    """A scrape as the detection loop's stream hands it on: its stored rows and their layout."""
    rows = [(i + 1, ts, r.value, None, "ok", None) for i, r in enumerate(readings)]
    layout = Layout(tuple(range(len(readings))), tuple((r, BUILD) for r in readings))
    return ScrapeRows(layout, rows, ts)


def test_stored_scrapes_without_inspector_series_are_not_built_into_samples() -> None:
    """The rank detector wraps the engine in the service and looked at every sample of every
    delivery, building the samples of each stored scrape that the detection loop hands on as rows
    (``fabricd.scrape_rows``). It now opens only scrapes with Inspector series, and still judges
    their ranks; the detector stack keeps the engine's rates-only read (``keep_for``)."""
    from collectors.inspector import record_readings
    from fabricd.detect.engine import DetectionEngine
    from fabricd.server.detection import EngineFeed, keep_for
    from fabricd.server.jobattribution import JobAttribution

    det = RankStragglerDetector(_Untouched())  # type: ignore[arg-type]
    counters = [Reading("infiniband", "mlx5_0", "1", "port_xmit_data", 0.0, "bytes", Kind.COUNTER, ())]
    records = parse_prom(PROM.read_text()).records
    for ts, slow in ((100.0, 0.13195), (130.0, 0.13195)):
        ib = _as_rows(counters, ts)
        timed = [
            Delivery(
                f"node-{r.rank}",
                _as_rows(
                    record_readings(
                        dataclasses.replace(r, exec_time_seconds=slow if r.rank == 3 else r.exec_time_seconds)
                    ),
                    ts,
                ),
            )
            for r in records
        ]
        got = det.deliver([Delivery("node-9", ib), *timed], ts, frozenset())
        assert ib._built is None
    assert [(i.kind.value, i.element) for i in got] == [("straggler", "node-3")]
    stack = JobAttribution(RankStragglerDetector(EngineFeed(DetectionEngine())), None, None)  # type: ignore[arg-type]
    keep = keep_for(stack)
    assert (
        keep is not None
        and keep.rates_only
        and keep.inputs is not None
        and "exec_time_seconds" in keep.inputs["inspector"]
    )
