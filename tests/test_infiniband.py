"""The infiniband collector on real captured trees (cases/infiniband/*) and on written edge cases.

Golden files: ``tests/cases/infiniband/<case>/expected.json`` holds fabricd's readings for the case's
``sys/`` tree, one JSON object per line. Regenerate after an intended change with
``FABRICD_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_infiniband.py`` and review the diff.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from collectors import REGISTRY
from collectors.infiniband import InfinibandCollector, parse_rate, parse_state, parse_value
from fabricd.collector import CollectorConfigError, CollectorContext, build
from fabricd.model import Kind, Reading
from fabricd.sim.sysfstree import DeviceTree, PortTree, Raw, write_infiniband_tree
from tests.helpers import CASES

CASE_DIR = CASES / "infiniband"
CASE_NAMES = sorted(p.name for p in CASE_DIR.iterdir() if (p / "sys").is_dir())
UPDATE_GOLDEN = os.environ.get("FABRICD_UPDATE_GOLDEN", "") == "1"


def collector(sysfs_root: Path, **options: Any) -> InfinibandCollector:
    opts = InfinibandCollector.Options.model_validate(options)
    return InfinibandCollector(CollectorContext(node="n1", sysfs_root=sysfs_root, options=opts))


def golden_row(r: Reading) -> dict[str, Any]:
    return {**r.to_json(), "width": r.width, "saturates": r.saturates}


def golden_rows(readings: list[Reading]) -> list[dict[str, Any]]:
    rows = [golden_row(r) for r in readings]
    return sorted(rows, key=lambda d: (d["device"], d["port"], d["counter"], json.dumps(d.get("labels"))))


def by_key(readings: list[Reading]) -> dict[tuple[str, str, str], Reading]:
    return {(r.device, r.port, r.counter): r for r in readings}


def test_case_folders_are_discovered() -> None:
    assert {"procfs", "node_exporter", "gpud-h100"} <= set(CASE_NAMES)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_case_matches_golden(case: str) -> None:
    rows = golden_rows(collector(CASE_DIR / case / "sys").scrape())
    expected_path = CASE_DIR / case / "expected.json"
    if UPDATE_GOLDEN:
        expected_path.write_text("[\n" + ",\n".join(json.dumps(r, sort_keys=True) for r in rows) + "\n]\n")
    assert rows == json.loads(expected_path.read_text())


# --- the values prometheus/procfs's own tests expect (shared/fixtures/README.md) ---------------


@pytest.fixture(scope="module")
def procfs() -> dict[tuple[str, str, str], Reading]:
    return by_key(collector(CASE_DIR / "procfs" / "sys").scrape())


@pytest.mark.parametrize(
    ("device", "port", "counter", "value"),
    [
        ("hfi1_0", "1", "port_rcv_data", 1380366808104),  # 345091702026 words x 4
        ("hfi1_0", "1", "port_xmit_data", 1094233306172),
        ("hfi1_0", "1", "rate", 12_500_000_000),
        ("hfi1_0", "1", "state", 4),
        ("hfi1_0", "1", "phys_state", 5),
        ("mlx4_0", "1", "port_rcv_data", 8884894436),
        ("mlx4_0", "1", "port_xmit_data", 106036453180),
        ("mlx4_0", "1", "port_xmit_wait", 3599),
        ("mlx4_0", "1", "rate", 5_000_000_000),
        ("mlx4_0", "2", "port_rcv_data", 9841747136),
        ("mlx4_0", "2", "port_xmit_data", 106161427560),
        ("mlx4_0", "2", "port_xmit_wait", 3846),
        ("mlx5_0", "1", "port_rcv_data", 72505381512),
        ("mlx5_0", "1", "port_xmit_data", 11523046035392),
        ("mlx5_0", "1", "roce_adp_retrans", 99),
        ("mlx5_0", "1", "roce_adp_retrans_to", 4),
        ("mlx5_0", "1", "phys_state", 4),  # this fixture really says "4: ACTIVE"
        ("mlx5_0", "1", "rate", 3_125_000_000),
    ],
)
def test_procfs_documented_values(
    procfs: dict[tuple[str, str, str], Reading], device: str, port: str, counter: str, value: int
) -> None:
    assert procfs[(device, port, counter)].value == value


def test_procfs_units_and_strings(procfs: dict[tuple[str, str, str], Reading]) -> None:
    assert procfs[("mlx4_0", "1", "port_rcv_data")].unit == "bytes"
    assert procfs[("mlx4_0", "1", "port_xmit_wait")].unit == "ticks"
    assert procfs[("mlx4_0", "1", "port_rcv_packets")].unit == "packets"
    assert procfs[("mlx4_0", "1", "symbol_error")].unit == ""
    info = dict(procfs[("mlx5_0", "", "info")].labels)
    assert info["node_guid"] == "0a7f:bc12:45ef:d23b"  # no trailing newline in the file
    assert info["firmware_version"] == "14.28.2006"
    port_info = dict(procfs[("mlx5_0", "1", "port_info")].labels)
    assert port_info["phys_state"] == "ACTIVE"
    # "InfiniBand\n\n" is read as InfiniBand
    assert dict(procfs[("mlx4_0", "2", "port_info")].labels)["link_layer"] == "InfiniBand"
    assert dict(procfs[("hfi1_0", "", "info")].labels)["hca_type"] == ""  # hfi1 has none
    assert ("mlx5_0", "1", "lifespan") not in procfs  # a cache time, not a counter


def test_hardware_widths(procfs: dict[tuple[str, str, str], Reading]) -> None:
    # IBA PortCounters: narrow and saturating; data from PortCountersExtended: 64 bit.
    widths = {
        c: (procfs[("mlx5_0", "1", c)].width, procfs[("mlx5_0", "1", c)].saturates)
        for c in (
            "symbol_error",
            "link_downed",
            "excessive_buffer_overrun_errors",
            "port_xmit_wait",
            "port_rcv_data",
            "out_of_sequence",
        )
    }
    assert widths == {
        "symbol_error": (16, True),
        "link_downed": (8, True),
        "excessive_buffer_overrun_errors": (4, True),
        "port_xmit_wait": (32, True),
        "port_rcv_data": (64, False),
        "out_of_sequence": (32, False),  # mlx5 Q counter: 32 bit, wraps
    }
    assert procfs[("mlx5_0", "1", "port_rcv_data")].scale == 4


def test_node_exporter_tree_quirks() -> None:
    got = by_key(collector(CASE_DIR / "node_exporter" / "sys").scrape())
    iwarp = {c for (d, _, c), r in got.items() if d == "i40iw0" and r.kind is Kind.COUNTER}
    assert iwarp == set()  # every counter is "N/A (no PMA)"
    assert got[("i40iw0", "1", "rate")].value == 1.25e9  # "10 Gb/sec (4X)"
    assert got[("mlx4_0", "1", "port_xmit_wait")].value == 4294967295  # saturated, reported as read
    assert got[("mlx4_0", "1", "port_rcv_data_64")].value == 4631917 * 4
    assert got[("mlx4_0", "2", "port_xmit_data")].value == 0


def test_gpud_h100_tree() -> None:
    got = by_key(collector(CASE_DIR / "gpud-h100" / "sys").scrape())
    devices = {d for d, _, _ in got}
    assert devices == {f"mlx5_{i}" for i in (0, 1, 4, 5, 6, 7, 8, 9)} | {"mlx5_bond_0"}
    for dev in devices - {"mlx5_bond_0"}:
        assert got[(dev, "1", "rate")].value == 400 * 125_000_000
    assert got[("mlx5_0", "1", "port_rcv_data")].value == 230539874932483 * 4  # > 2^32 words
    assert got[("mlx5_bond_0", "1", "rate")].value == 200 * 125_000_000
    assert dict(got[("mlx5_bond_0", "1", "port_info")].labels)["link_layer"] == "Ethernet"
    assert got[("mlx5_4", "1", "port_xmit_wait")].value == 2489603687
    assert got[("mlx5_0", "1", "rx_dct_connect")].value == 422237


# --- pure parsers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (b"123\n", 123),
        (b"123", 123),
        (b"N/A (no PMA)\n", None),
        (b"", None),
        (b"\n", None),
        ("7\n\n", 7),
        (b"18446744073709551615\n", 2**64 - 1),
        (b"-1\n", None),
        (b"12abc", None),
    ],
)
def test_parse_value(text: bytes | str, value: int | None) -> None:
    assert parse_value(text) == value


def test_parse_state() -> None:
    assert parse_state(b"4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state("5: LinkUp") == (5, "LinkUp")
    assert parse_state("7: Phy Test\n") == (7, "Phy Test")
    with pytest.raises(ValueError):
        parse_state("ACTIVE")


@pytest.mark.parametrize(
    ("text", "bytes_per_second"),
    [
        ("100 Gb/sec (4X EDR)", 12_500_000_000),
        ("40 Gb/sec (4X QDR)", 5_000_000_000),
        ("25 Gb/sec (1X EDR)", 3_125_000_000),
        ("2.5 Gb/sec (1X SDR)", 312_500_000),
        ("500 Gb/sec (4X HDR)", 62_500_000_000),
        ("0 GB/sec", 0),
        (b"400 Gb/sec (4X NDR)\n", 50_000_000_000),
    ],
)
def test_parse_rate(text: str | bytes, bytes_per_second: float) -> None:  # procfs's test values
    assert parse_rate(text) == bytes_per_second


# --- written trees: quirks, appear/vanish -------------------------------------------------------


def mlx5(port_rcv_data: int = 1000, **hw: int) -> DeviceTree:
    return DeviceTree(
        ports={
            "1": PortTree(
                counters={"port_rcv_data": port_rcv_data, "port_rcv_packets": 10, "symbol_error": 0},
                hw_counters={"out_of_sequence": 0, "lifespan": 10, **hw},
            )
        }
    )


def test_bnxt_re_without_counters_folder(tmp_path: Path) -> None:
    write_infiniband_tree(
        tmp_path,
        {
            "bnxt_re0": DeviceTree(
                hca_type="BCM57508", ports={"1": PortTree(counters=None, hw_counters={"rx_pkts": 5, "tx_bytes": 8})}
            )
        },
    )
    got = by_key(collector(tmp_path).scrape())
    assert got[("bnxt_re0", "1", "rx_pkts")].unit == "packets"
    assert got[("bnxt_re0", "1", "tx_bytes")].unit == "bytes"
    assert got[("bnxt_re0", "1", "state")].value == 4


def test_device_level_hw_counters_have_empty_port(tmp_path: Path) -> None:
    write_infiniband_tree(tmp_path, {"mlx5_0": DeviceTree(hw_counters={"np_cnp_sent": 3})})
    got = by_key(collector(tmp_path).scrape())
    assert got[("mlx5_0", "", "np_cnp_sent")].value == 3
    assert got[("mlx5_0", "", "np_cnp_sent")].width == 64  # congestion counters are 64 bit


def test_quirky_text(tmp_path: Path) -> None:
    port = PortTree(
        state=Raw("4: ACTIVE"),
        link_layer=Raw("InfiniBand\n\n"),
        rate="garbage",
        counters={"port_xmit_data": Raw("25"), "symbol_error": "N/A (no PMA)"},
    )
    write_infiniband_tree(tmp_path, {"mlx5_0": DeviceTree(node_guid=Raw("0a7f:bc12"), ports={"1": port})})
    got = by_key(collector(tmp_path).scrape())
    assert got[("mlx5_0", "1", "port_xmit_data")].value == 100
    assert ("mlx5_0", "1", "symbol_error") not in got
    assert ("mlx5_0", "1", "rate") not in got  # unparsable: skipped, not zero
    assert got[("mlx5_0", "1", "state")].value == 4


def test_no_infiniband_folder_logs_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = collector(tmp_path)
    with caplog.at_level(logging.INFO, logger="fabricd.collectors.infiniband"):
        assert c.scrape() == []
        assert c.scrape() == []
    assert [r.getMessage() for r in caplog.records].count(f"infiniband: no devices under {c.top}") == 1


def test_values_change_between_scrapes_without_rediscovery(tmp_path: Path) -> None:
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5(1000)})
    c = collector(tmp_path)
    assert by_key(c.scrape())[("mlx5_0", "1", "port_rcv_data")].value == 4000
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5(123456789)})
    assert by_key(c.scrape())[("mlx5_0", "1", "port_rcv_data")].value == 123456789 * 4
    assert c.discoveries == 1  # files were re-read through the open descriptors


def test_devices_appear_and_vanish(tmp_path: Path) -> None:
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5()})
    c = collector(tmp_path)
    assert {r.device for r in c.scrape()} == {"mlx5_0"}
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5(), "mlx5_1": mlx5(7)})
    assert by_key(c.scrape())[("mlx5_1", "1", "port_rcv_data")].value == 28
    write_infiniband_tree(tmp_path, {"mlx5_1": mlx5(8)})
    assert {r.device for r in c.scrape()} == {"mlx5_1"}
    write_infiniband_tree(tmp_path, {})
    assert c.scrape() == []


def test_recreated_device_is_read_fresh(tmp_path: Path) -> None:
    # A driver reload re-creates the device folder under the same name: the old descriptors point
    # at files that no longer exist. The new folder must be read, not the stale one.
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5(1000)})
    c = collector(tmp_path)
    c.scrape()
    shutil.rmtree(tmp_path / "class" / "infiniband" / "mlx5_0")
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5(5)})
    assert by_key(c.scrape())[("mlx5_0", "1", "port_rcv_data")].value == 20


def test_new_counter_files_found_by_periodic_rescan(tmp_path: Path) -> None:
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5()})
    c = collector(tmp_path, rescan_every=2)
    c.scrape()
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5(np_cnp_sent=9)})
    seen = [("mlx5_0", "1", "np_cnp_sent") in by_key(c.scrape()) for _ in range(2)]
    assert seen[-1] is True


def test_fd_budget_still_reads_everything(tmp_path: Path) -> None:
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5(), "mlx5_1": mlx5()})
    limited = golden_rows(collector(tmp_path, max_open_files=3).scrape())
    assert limited == golden_rows(collector(tmp_path).scrape())


async def test_collect_is_async_and_registered(tmp_path: Path) -> None:
    write_infiniband_tree(tmp_path, {"mlx5_0": mlx5()})
    c = build("infiniband", {"rescan_every": 5}, node="n1", sysfs_root=tmp_path, registry=REGISTRY)
    readings = await c.collect()
    assert any(r.counter == "port_rcv_data" for r in readings)
    with pytest.raises(CollectorConfigError, match=r"collectors\.infiniband\.rescan_every"):
        build("infiniband", {"rescan_every": 0}, node="n1", sysfs_root=tmp_path, registry=REGISTRY)
