"""fabricd.parsers.ethtool and .sysfs: the driver tables on the issue-17 captures, values read off the
text by hand, failures as problems, and property tests (no input makes them raise)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricd.parsers.common import Problem
from fabricd.parsers.ethtool import EthtoolStat, parse_ethtool_stats
from fabricd.parsers.sysfs import parse_sysfs
from tests.helpers import CASES

ETHTOOL = CASES / "ethtool"


def stats(case: str, driver: str | None = None) -> dict[tuple[str | None, str], EthtoolStat]:
    result = parse_ethtool_stats((ETHTOOL / case / "input.txt").read_text(), driver)
    assert result.problems == [], case
    return {(s.name, s.labels.get("priority", "")): s for s in result.stats}


def test_ice_xon_xoff_per_priority() -> None:
    got = stats("blog_ice_e810_pfc_grep", "ice")
    assert len(got) == 32  # 8 priorities x xon/xoff x rx/tx, all mapped
    assert got[("rx_pause_frames", "3")].raw == "rx_priority_3_xoff.nic"
    assert got[("tx_pause_resume_frames", "7")].raw == "tx_priority_7_xon.nic"


def test_i40e_both_name_sets_land_on_the_same_names() -> None:
    new, old = stats("synthetic_i40e_intree_pfc_prio3", "i40e"), stats("synthetic_i40e_out_of_tree_pfc_prio3", "i40e")
    for got, suffix in ((new, "_xoff_rx"), (old, "_xoff")):
        assert got[("rx_pause_frames", "3")].raw == f"port.rx_priority_3{suffix}"
        assert got[("rx_pause_frames", "3")].value == 104
        assert got[("rx_pause_transitions", "3")].value == 51  # port.rx_priority_3_xon_2_xoff
        assert got[("rx_pause_frames", "global")].raw == "port.link_xoff_rx"
        assert (got[("rx_discards", "")].value, got[("rx_crc_errors", "")].value) == (1312, 4)


def test_mlx4_pause_durations_are_seconds() -> None:
    got = stats("blog_mlx4_cx3_pfc_prio3_grep", "mlx4_en")
    assert got[("tx_pause_duration", "3")].value == 0.047848  # "tx_pause_duration_prio_3: 47848" (us)
    assert got[("rx_pause_frames", "3")].value == 14812


def test_bnxt_port_discards_ring_drops_and_fec() -> None:
    got = stats("synthetic_bnxt_discards_rings_fec", "bnxt_en")
    assert {k: got[k].value for k in (("rx_discards", ""), ("tx_discards", ""), ("rx_ring_discards", ""))} == {
        ("rx_discards", ""): 1840,
        ("tx_discards", ""): 77,
        ("rx_ring_discards", ""): 26,
    }
    assert (got[("rx_fec_uncorrectable_blocks", "")].value, got[("rx_pcs_symbol_errors", "")].value) == (2, 12)
    result = parse_ethtool_stats((ETHTOOL / "synthetic_bnxt_discards_rings_fec" / "input.txt").read_text(), "bnxt_en")
    unmapped = [s.raw for s in result.stats if s.name is None]
    assert unmapped[:3] == ["[0]: rx_ucast_packets", "[0]: rx_discards", "[1]: rx_ucast_packets"]  # kept, raw


def test_mlx5_priority_discards() -> None:
    got = stats("synthetic_mlx5_prio3_discards", "mlx5_core")
    assert (got[("rx_priority_discards", "3")].raw, got[("rx_priority_discards", "3")].value) == (
        "rx_prio3_discards",
        3072,
    )
    assert got[("rx_pause_duration", "3")].value == 1.302


def test_ethtool_failures_are_problems() -> None:
    refused = parse_ethtool_stats("ERROR: 1")
    assert refused.problems == [Problem(1, "driver returned error 1", "ERROR: 1")]
    assert parse_ethtool_stats("").problems == [Problem(0, "no ethtool statistics in the text")]
    info = parse_ethtool_stats("driver: ice\nversion: 1.9\nNIC statistics:\n     rx_dropped.nic: 5\n")
    assert (info.driver, info.stats, info.problems) == (
        "ice",
        [EthtoolStat("rx_dropped.nic", "rx_discards", {}, 5, "packets")],
        [],
    )


def test_sysfs_tree_problems() -> None:
    got = parse_sysfs({"mlx5_0/ports/1/state": "garbled", "mlx5_0/ports/1/counters/port_rcv_errors": "x\n"})
    assert got.devices[0].state is None and got.devices[0].counters == {}
    assert got.problems == [
        Problem(0, "mlx5_0/ports/1/state: unreadable state", "garbled"),
        Problem(0, "mlx5_0/ports/1/counters/port_rcv_errors: not a counter value", "x"),
    ]
    rates = {f"mlx5_0/ports/{i}/rate": r for i, r in enumerate(["inf Gb/sec", "nan", "-5 Gb/sec", "1e400"], 1)}
    assert [d.rate_bps for d in parse_sysfs(rates).devices] == [None, None, None, None]
    assert parse_sysfs({}).problems == [
        Problem(0, "no <device>/ports/<n> in the tree (is it a class/infiniband folder?)")
    ]


@settings(max_examples=300, deadline=None)
@given(st.text(), st.sampled_from([None, "ice", "i40e", "mlx4_en", "bnxt_en", "mlx5_core", "nope"]))
def test_no_text_makes_the_ethtool_parser_raise(junk: str, driver: str | None) -> None:
    result = parse_ethtool_stats(junk, driver)
    assert result.stats or result.problems


NAMES = st.sampled_from(
    ["state", "rate", "link_layer", "counters/port_xmit_data", "counters/symbol_error", "hw_counters/out_of_buffer"]
)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.builds(
            lambda d, p, n: f"{d}/ports/{p}/{n}", st.sampled_from(["mlx5_0", "bnxt_re0"]), st.text(max_size=3), NAMES
        ),
        st.text(),
    )
)
def test_no_tree_makes_the_sysfs_parser_raise(files: dict[str, str]) -> None:
    result = parse_sysfs(files)
    assert result.devices or result.problems


def test_absurd_numbers_are_problems_not_crashes() -> None:
    from fabricd.parsers.ibnetdiscover import parse_ibnetdiscover
    from fabricd.parsers.nccl import parse_nccl_runs

    huge = "9" * 5000  # past int()'s 4300-digit limit
    assert parse_ethtool_stats(f"rx_bytes: {huge}\n").stats == []
    assert parse_ibnetdiscover(f"SW {huge} 1 0x1 4x EDR 'sw'").ports == []
    [run] = parse_nccl_runs(
        f"#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n8 2 float sum -1 1e400 0 0 0 {huge} 0 0 0\n"
    )
    assert [r.time_us for r in run.rows] == [None, None]
