"""The per-driver counter tables against the neutral vocabulary, and how devices find their table."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path

import pytest

from fabricd.drivers import ethtool as eth
from fabricd.drivers import ib
from fabricd.drivers.ib import Counter, Overflow, pma
from fabricd.drivers.vocabulary import PORT, VOCABULARY
from fabricd.model import Kind

IB_ROWS: list[tuple[str, Counter]] = [
    *(("pma", c) for c in (*pma.COUNTERS.values(), *pma.EXT.values())),
    *((d.name, c) for d in ib.drivers() for c in d.counters),
]


@pytest.mark.parametrize(("table", "row"), IB_ROWS, ids=[f"{t}:{c.raw}" for t, c in IB_ROWS])
def test_every_ib_row_maps_into_the_vocabulary_with_its_unit_and_kind(table: str, row: Counter) -> None:
    term = VOCABULARY.get(row.name)
    assert term is not None, f"{table} maps {row.raw} to {row.name!r}, which is not a neutral name"
    assert (row.unit, row.kind) == (term.unit, term.kind), f"{table}:{row.raw}"
    assert row.source and row.help, f"{table}:{row.raw} must say where it comes from and what it counts"
    assert (row.kind is Kind.GAUGE) == (row.width == 0), f"{table}:{row.raw}: gauges have no width"
    assert row.width in (0, 4, 8, 16, 32, 64)


def test_every_ethtool_rule_maps_into_the_vocabulary_with_its_unit() -> None:
    for driver in eth.drivers():
        assert driver.kernel_drivers and driver.source.startswith("drivers/net/ethernet/")
        for rule in driver.rules:
            term = VOCABULARY.get(rule.name)
            assert term is not None and term.unit == rule.unit, (driver.name, rule.pattern.pattern)


def test_no_table_claims_a_raw_name_twice() -> None:
    for driver in ib.drivers():
        raws = [c.raw for c in driver.counters]
        assert len(raws) == len(set(raws)), driver.name
    assert len(pma.COUNTERS) == len(pma.BASE) + len(pma.DATA) + len(pma.EXT_ONLY) + len(pma.EXTRA)


def test_one_port_never_gets_one_neutral_name_from_two_files() -> None:
    # counters/ and hw_counters/ of one port share a series namespace: names must not collide.
    pma_names = {c.name for c in pma.COUNTERS.values()}
    for driver in ib.drivers():
        names = [c.name for c in driver.counters]
        assert len(names) == len(set(names)), driver.name
        assert not pma_names & set(names), driver.name


def test_every_neutral_name_is_used_by_a_table_or_is_a_port_attribute() -> None:
    used = {c.name for _, c in IB_ROWS} | {r.name for d in eth.drivers() for r in d.rules} | {t.name for t in PORT}
    assert set(VOCABULARY) == used, f"unused terms: {sorted(set(VOCABULARY) - used)}"


def _examples(pattern: str) -> list[str]:
    literal = pattern.replace("\\.", ".")  # ice's and i40e's names have dots (rx_crc_errors.nic)
    return [literal.replace("([0-7])", p) for p in "03"] if "([0-7])" in literal else [literal]


def test_no_two_ethtool_drivers_read_one_name_differently() -> None:
    # neutral(raw) without a driver tries every driver's rules: an example name of each rule must
    # land where its own driver puts it.
    for driver in eth.drivers():
        for rule in driver.rules:
            for example in _examples(rule.pattern.pattern):
                assert re.fullmatch(rule.pattern, example), example
                own = eth.neutral(example, driver.kernel_drivers[0])
                assert own is not None and eth.neutral(example) == own, (driver.name, example)


def test_every_driver_module_is_found_without_a_registration_line() -> None:
    for package, found, skip in ((ib, ib.drivers(), {"pma", "perfquery", "sysfs"}), (eth, eth.drivers(), set())):
        modules = {m.name for m in pkgutil.iter_modules([str(Path(package.__file__).parent)])} - skip
        assert len(found) == len(modules), (package.__name__, modules)
    assert [d.name for d in ib.drivers()] == ["bnxt_re", "mlx5"]


@pytest.mark.parametrize(
    ("device", "hca_type", "kernel_driver", "expected"),
    [
        ("mlx5_0", "MT4129", "", "mlx5"),
        ("mlx5_bond_0", "MT41692", "", "mlx5"),  # BlueField-3
        ("ibp3s0", "MT4123", "", "mlx5"),  # rdma-core persistent name, no driver link in the tree
        ("ibp3s0", "", "mlx5_core", "mlx5"),
        ("bnxt_re0", "", "", "bnxt_re"),
        ("rocep65s0f0", "", "bnxt_en", "bnxt_re"),
        ("rocep65s0f0", "MT4129", "bnxt_en", "bnxt_re"),  # the kernel's link decides
        ("mlx4_0", "MT4099", "", None),  # ConnectX-3 also says MT: not an mlx5
        ("i40iw0", "I40IW", "", None),
        ("hfi1_0", "", "hfi1", None),
    ],
)
def test_devices_find_their_driver(device: str, hca_type: str, kernel_driver: str, expected: str | None) -> None:
    found = ib.identify(device, hca_type, kernel_driver)
    assert (found.name if found else None) == expected


def test_counters_no_table_knows_keep_their_raw_name_and_64_bits() -> None:
    row = ib.hw_counter("", "rx_pkts")
    assert row == Counter("rx_pkts", "", "packets", 64, Overflow.WRAPS, source="no table: defaults")
    assert ib.hw_counter("mlx5", "lifespan") is None  # the cache time, not a counter
    assert ib.hw_counter("mlx5", "out_of_sequence") == next(
        c
        for c in ib.by_name("mlx5").counters
        if c.raw == "out_of_sequence"  # type: ignore[union-attr]
    )
    assert ib.safe_name("Weird-Name.1") == "weird_name_1"


def test_pre_4_5_kernels_read_the_data_counters_as_32_bit_saturating() -> None:
    modern = pma.counter("counters", "port_xmit_data", legacy_kernel=False)
    old = pma.counter("counters", "port_xmit_data", legacy_kernel=True)
    assert modern is not None and (modern.width, modern.saturates, modern.scale) == (64, False, 4)
    assert old is not None and (old.width, old.saturates, old.scale, old.name) == (32, True, 4, "port_transmit_data")
    wait = pma.counter("counters", "port_xmit_wait", legacy_kernel=True)
    assert wait is not None and (wait.width, wait.saturates, wait.unit) == (32, True, "ticks")
    assert pma.counter("counters_ext", "port_xmit_data_64", legacy_kernel=True).name == "legacy_port_transmit_data"  # type: ignore[union-attr]
