"""NCCL RAS: the report parsed, the version gate, and the collector against a socket speaking the protocol."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from collectors.ras import RasCollector, RasFactories
from fabricd.collector import CollectorConfigError, build
from fabricd.parsers.ras import CommGroup, parse_status, problems
from fabricd.ras import check_version
from tests.helpers import CASES

REPORT = (CASES / "ras" / "issue1730_nccl2.26.2" / "status.txt").read_text()
REGISTRY = {"ras": "collectors.ras:RasCollector"}


def test_the_report_of_a_256_gpu_job() -> None:
    report = parse_status(REPORT)
    assert report.version == "2.26.2"
    assert report.groups == [CommGroup(0, 1, 32, 8, 256, 256, "RUNNING", "OK")]
    assert report.errors == [] and report.warnings == []


def test_a_mismatch_and_its_warning_lines() -> None:
    # NVIDIA/nccl#1911: 2 of 32 ranks one AllGather ahead; the details are under Warnings.
    report = parse_status((CASES / "ras" / "issue1911_nccl2.26.2_mismatch_warning" / "status.txt").read_text())
    assert report.version == "2.26.2"
    assert report.groups == [CommGroup(0, 1, 4, 8, 32, 32, "RUNNING", "MISMATCH")]
    assert report.errors == []
    assert report.warnings == [
        "#0-0 (fa93daea854b060b) MISMATCH",
        "Communicator ranks have different AllGather operation counts",
        "30 ranks have launched up to operation 640",
        "2 ranks have launched up to operation 641",
        "Rank 12 -- GPU 4 managed by process 323032 on node 10.137.190.124",
        "Rank 13 -- GPU 5 managed by process 323033 on node 10.137.190.124",
    ]


def test_a_job_summary_per_node_type_and_a_nocomm_group() -> None:
    # NVIDIA/nccl#1762 (excerpt): node types listed one per row, then totals; NOCOMM with zeros.
    report = parse_status((CASES / "ras" / "issue1762_nccl2.27.3_node_types_nocomm" / "status.txt").read_text())
    assert report.version == "2.27.3"
    assert report.groups == [
        CommGroup(0, 1, 1, 1, 2, 1, "RUNNING", "INCOMPLETE"),
        CommGroup(1, 4, 1, 1, 2, 1, "RUNNING", "MISMATCH"),
        CommGroup(2, 4, 0, 0, 0, 0, "NOCOMM", "INCOMPLETE,MISMATCH"),
    ]
    assert report.errors == [
        "INCOMPLETE",
        "Missing communicator data from 1 job process",
        "Process 60004 on node 10.4.109.13 managing GPU 0",
        "#0-0 (b3398875b8b2a063) INCOMPLETE",
        "Missing communicator data from 1 rank",
        "Rank 1 -- GPU 0 managed by process 60004 on node 10.4.109.13",
    ]
    assert report.warnings == []


def test_ranks_per_node_as_a_range() -> None:
    # The NCCL RAS docs' INCOMPLETE sample: "7-8" ranks per node (client_support.cc "%d-%d").
    text = (CASES / "ras" / "nccl_docs_ras_incomplete_ranks_per_node_range" / "status.txt").read_text()
    report = parse_status(text)
    assert report.version == ""
    assert report.groups == [CommGroup(0, 1, 4, 7, 32, 32, "RUNNING", "INCOMPLETE", ranks_per_node_max=8)]
    assert report.errors[-1] == "The missing rank: 21" and len(report.errors) == 6
    assert report.warnings == ["TIMEOUT", "Encountered 2 communication timeouts while gathering communicator data"]


def test_a_report_pasted_from_its_table_header_keeps_its_group() -> None:
    # NVIDIA's own RAS examples start at "Group  Comms ...", without the "Communicators..." title.
    straggler = (CASES / "ras" / "nccl_example08_2.30.7_sleep_mismatch_table_only" / "status.txt").read_text()
    report = parse_status(straggler)
    assert (report.version, report.communicators) == ("", True)
    assert report.groups == [CommGroup(0, 1, 2, 4, 8, 8, "RUNNING", "MISMATCH")]
    assert report.errors == [] and report.warnings[0] == "#0-0 (78db921d1c117b4a) MISMATCH"
    assert problems(straggler, report) == []
    crash = (CASES / "ras" / "nvblog_nccl2.24_crash_dead_incomplete_table_only" / "status.txt").read_text()
    report = parse_status(crash)  # blanks collapsed, as the blog's rendered page has them
    assert report.groups == [CommGroup(0, 1, 4, 7, 32, 32, "RUNNING", "INCOMPLETE", ranks_per_node_max=8)]
    assert report.errors[:2] == ["DEAD", "1 job process is considered dead (unreachable via the RAS network)"]
    assert report.errors[-1] == "The missing rank: 21" and len(report.errors) == 6
    assert problems(crash, report) == []


def test_no_communicator_left_is_still_a_report_with_its_dead_process() -> None:
    text = (CASES / "ras" / "nccl_example08_2.30.7_exit_dead_no_comm_data" / "status.txt").read_text()
    report = parse_status(text)
    assert (report.groups, report.communicators, problems(text, report)) == ([], True, [])
    assert report.errors == [
        "DEAD",
        "1 job process is considered dead (unreachable via the RAS network)",
        "Process 3748990 on node node1 managing GPU 3",
    ]
    assert report.warnings == []
    # an Errors section alone (no table, no version, no title) is not taken for a report
    assert problems("Errors\n======\nDEAD\n", parse_status("Errors\n======\nDEAD\n")) != []


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("2.26.2", r"NCCL 2.26.2: polling RAS crashes or corrupts jobs on this version \(NVIDIA/nccl#1669\)"),
        ("2.27.3", r"NVIDIA/nccl#1762"),
        ("2.29.7", r"NVIDIA/nccl#2346"),
        ("2.25.1", r"NCCL 2.25.1: RAS is polled only from 2.28.3 \(older versions crashed when polled\)"),
        ("latest", r"'latest' is not an NCCL version such as 2.28.9"),
    ],
)
def test_versions_known_to_crash_are_refused(version: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_version(version)
    with pytest.raises(CollectorConfigError, match=r"collectors.ras.nccl_version: Value error, "):
        build("ras", {"nccl_version": version}, node="n1", sysfs_root=Path("/sys"), registry=REGISTRY)


class FakeRasThread:
    """A local TCP service speaking NCCL's RAS client protocol (src/ras/client.cc), answering STATUS
    with the issue's report, its version line set to ``version``."""

    def __init__(self, version: str) -> None:
        self.report = REPORT.replace("NCCL version 2.26.2", f"NCCL version {version}")
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        assert await reader.readline() == b"CLIENT PROTOCOL 2\n"
        writer.write(b"SERVER PROTOCOL 2\n")
        assert await reader.readline() == b"STATUS\n"
        writer.write(self.report.encode())
        await writer.drain()
        writer.close()


async def _run(version: str, configured: str) -> tuple[list[list[tuple[str, str, float]]], int]:
    fake = FakeRasThread(version)
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clock = [0.0]
    options = {"nccl_version": configured, "host": "127.0.0.1", "port": port}
    c = build(
        "ras",
        options,
        node="n1",
        sysfs_root=Path("/sys"),
        registry=REGISTRY,
        factories=[RasFactories(monotonic=lambda: clock[0])],
    )
    assert isinstance(c, RasCollector)
    polls = []
    async with server:
        for t in (0.0, 100.0, 301.0):
            clock[0] = t
            polls.append([(r.device, r.counter, r.value) for r in await c.collect()])
    return polls, fake.connections


def test_collector_polls_at_most_every_interval() -> None:
    polls, connections = asyncio.run(_run("2.28.9", "2.28.9"))
    first = [("0", "group_ranks", 256.0), ("", "errors_reported", 0.0), ("", "warnings_reported", 0.0)]
    assert polls == [first, [], first] and connections == 2


def test_a_job_on_another_version_stops_the_polling() -> None:
    polls, connections = asyncio.run(_run("2.29.7", "2.28.9"))
    assert polls == [[], [], []] and connections == 1
