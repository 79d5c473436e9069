"""ethtool collector: every captured ``ethtool`` output as a case folder, the vendor-neutral names,
and the SIOCETHTOOL ioctl against a real veth inside a network namespace (``ethtool -S`` as oracle)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from collectors.ethtool import EthtoolCollector, EthtoolOptions
from fabricd.collector import CollectorConfigError, CollectorContext, build
from fabricd.drivers.ethtool import all_rules, drivers, is_queue_stat, neutral
from fabricd.drivers.vocabulary import VOCABULARY
from fabricd.model import Kind, Reading
from fabricd.parsers.ethtool import (
    EthtoolReadError,
    parse_ethtool_i,
    parse_ethtool_s,
    parse_ethtool_settings,
    parse_ethtool_stats,
)
from tests.helpers import CASES, need_binary
from tests.netns import send_udp, veth_pair

ETHTOOL_CASES = sorted(p for p in (CASES / "ethtool").iterdir() if p.is_dir())
# The neutral names the ethtool tables map into, with the vocabulary's unit for each.
NEUTRAL_UNITS = {r.name: VOCABULARY[r.name].unit for d in drivers() for r in d.rules}
UPDATE = os.environ.get("UPDATE_GOLDEN", "") == "1"
PREFIX = "fdnl"


def collector(**options: Any) -> EthtoolCollector:
    return EthtoolCollector(CollectorContext(node="n1", options=EthtoolOptions(**options)))


def case_kind(text: str) -> tuple[str, str]:
    """(kind, interface) from the capture's command line (``# ethtool -S eth0``); no line = statistics."""
    first = text.splitlines()[0] if text else ""
    words = first.lstrip("# ").split("|")[0].split() if first.startswith("#") else []  # "| grep ..." too
    if len(words) == 3 and words[1] == "-i":
        return "driver", words[2]
    if len(words) == 2:
        return "settings", words[1]
    return "statistics", words[-1] if words else "eth0"


async def case_result(case: Path, tmp_path: Path) -> dict[str, Any]:
    text = (case / "input.txt").read_text()
    kind, ifname = case_kind(text)
    if kind == "driver":
        return {"kind": kind, "driver": asdict(parse_ethtool_i(text))}
    if kind == "settings":
        return {"kind": kind, "settings": asdict(parse_ethtool_settings(text))}
    try:
        parsed = parse_ethtool_s(text)
    except EthtoolReadError as exc:
        return {"kind": kind, "interface": ifname, "error": str(exc)}
    (tmp_path / f"{ifname}.txt").write_text(text)  # through the file source, as the simulator feeds it
    readings = await collector(stats_dir=tmp_path).collect()
    return {
        "kind": kind,
        "interface": ifname,
        "parsed_statistics": len(parsed),
        "readings": [r.to_json() for r in readings],
    }


@pytest.mark.parametrize("case", ETHTOOL_CASES, ids=[p.name for p in ETHTOOL_CASES])
async def test_case_matches_expected(case: Path, tmp_path: Path) -> None:
    got = await case_result(case, tmp_path)
    if UPDATE:
        (case / "expected.json").write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads((case / "expected.json").read_text())


def expected(case: str) -> dict[str, Any]:
    return dict(json.loads((CASES / "ethtool" / case / "expected.json").read_text()))


def by_name(case: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["name"], r.get("labels", {}).get("priority", "")): r for r in expected(case)["readings"]}


def test_pfc_pause_is_one_neutral_series_per_priority_in_seconds() -> None:
    # The same physical signal from three vendors lands on the same name, label and unit.
    mlx5, bnxt, ionic = (
        by_name("crafted_mlx5_pfc_prio3"),
        by_name("crafted_bnxt_pfc_pri3"),
        by_name("crafted_ionic_pfc"),
    )
    assert mlx5[("rx_pause_duration", "3")]["value"] == pytest.approx(2.75)  # 2750000 us
    assert mlx5[("rx_pause_duration", "3")]["counter"] == "rx_prio3_pause_duration"
    assert bnxt[("rx_pause_duration", "3")]["value"] == pytest.approx(1.930442)
    assert ionic[("rx_pause_duration", "3")]["value"] == pytest.approx(0.456)
    assert mlx5[("rx_pause_frames", "3")]["value"] == 48211
    assert bnxt[("rx_pause_frames", "3")]["value"] == 30877
    assert ionic[("rx_pause_frames", "all")]["value"] == 9120
    assert bnxt[("rx_pause_frames", "global")]["counter"] == "rx_pause_frames"
    assert mlx5[("tx_pause_storm_error_events", "")]["value"] == 1
    assert mlx5[("rx_ecn_marked_packets", "3")]["unit"] == "packets"


def test_every_neutral_name_is_produced_with_its_unit() -> None:
    produced = {}
    for case in ETHTOOL_CASES:
        for r in expected(case.name).get("readings", []):
            if r["counter"] != r["name"] or neutral(r["counter"]) is not None:
                produced[r["name"]] = r["unit"]
    neutral_only = {k: v for k, v in produced.items() if k in NEUTRAL_UNITS}
    assert neutral_only == NEUTRAL_UNITS
    assert {(name, unit) for _, name, unit in all_rules()} <= set(NEUTRAL_UNITS.items())


def test_real_mlx5_capture_maps_global_pause_and_port_discards() -> None:
    got = by_name("ethq_mlx5_cx4lx_ubuntu1804_k4.15")
    assert got[("rx_pause_frames", "global")]["counter"] == "rx_global_pause"
    assert got[("rx_priority_bytes", "0")]["value"] == 2202570777997
    assert got[("rx_discards", "")]["counter"] == "rx_discards_phy"
    legacy = by_name("ethq_mlx5_older_driver_legacy_names")
    assert legacy[("rx_pause_frames", "global")]["counter"] == "pause_ctrl_rx"
    assert legacy[("rx_discards", "")]["counter"] == "in_discards"


def test_pasted_shell_session_is_read_without_problems() -> None:
    # A prompt with a space, "ethtool -S em1|grep ..." twice, and the bare prompt on the last line.
    text = (CASES / "ethtool" / "blog_igb_prompt_two_greps_queue_stats" / "input.txt").read_text()
    result = parse_ethtool_stats(text)
    assert (result.interface, len(result.stats), result.problems) == ("em1", 64, [])
    assert result.stats[-1].raw == "rx_queue_7_alloc_failed" and result.stats[0].value == 5976826882
    for prompt, ifname in (("$ sudo ethtool -S p1p1", "p1p1"), ("cumulus@switch:~$ sudo ethtool -S swp1", "swp1")):
        assert parse_ethtool_stats(f"{prompt}\n     rx_packets: 1\n").interface == ifname


def test_a_driver_info_command_pasted_before_the_statistics_is_a_command_line() -> None:
    # isc-projects/ethq#7: "$ ethtool -i eth0", its output, then "$ ethtool -S eth0" and 37 statistics.
    text = (CASES / "ethtool" / "ethq7_be2net_driver_info_then_stats_prompts" / "input.txt").read_text()
    result = parse_ethtool_stats(text)
    assert (result.driver, result.interface, len(result.stats), result.problems) == ("be2net", "eth0", 37, [])
    assert (result.stats[0].raw, result.stats[-1].raw) == ("rx_crc_errors", "roce_drops_crc")
    assert "version" not in parse_ethtool_s(text) and len(parse_ethtool_s(text)) == 37
    # only -S names the statistics' interface
    assert parse_ethtool_stats("$ ethtool -i eth7\n$ ethtool -S eth0\n     rx_packets: 1\n").interface == "eth0"
    assert parse_ethtool_stats("# ethtool --driver eth7\n     rx_packets: 1\n").interface is None


def test_a_grep_of_the_dump_sosreport_saved_is_a_command_line_naming_the_interface() -> None:
    # ryran/xsos#112: "$ grep pause sos_commands/networking/ethtool_-S_eth1" and 3 statistics.
    text = (CASES / "ethtool" / "xsos112_grep_pause_sosreport_file" / "input.txt").read_text()
    result = parse_ethtool_stats(text)
    assert (result.interface, [(s.raw, s.value) for s in result.stats], result.problems) == (
        "eth1",
        [("rx_pause_frames", 95331), ("rx_constant_pause_events", 0), ("tx_pause_frames", 0)],
        [],
    )
    assert [p.text for p in parse_ethtool_stats("     <etc etc>\n     rx_packets: 1\n").problems] == ["<etc etc>"]


def test_grep_over_several_saved_dumps_reads_the_first_interface_and_names_the_others() -> None:
    # The shape of ryran/xsos#65's command, egrep "drop|err" sos_commands/networking/ethtool_-S_eth*:
    # grep prefixes each line with its file. The names were read with the prefix in them, exit 0.
    text = (
        "sos_commands/networking/ethtool_-S_eth0:     rx_errors: 5\n"
        "sos_commands/networking/ethtool_-S_eth0:     rx_prio3_discards: 2\n"
        "sos_commands/networking/ethtool_-S_eth1:     rx_missed_errors: 7\n"
    )
    result = parse_ethtool_stats(text, "mlx5_core")
    assert (result.interface, [(s.raw, s.name, s.value) for s in result.stats]) == (
        "eth0",
        [("rx_errors", None, 5), ("rx_prio3_discards", "rx_priority_discards", 2)],
    )
    assert [(p.line, p.message) for p in result.problems] == [
        (3, "a statistic of another interface (eth1): give each interface's dump a file of its own")
    ]


def test_real_cx4lx_pause_duration_is_seconds() -> None:
    got = by_name("blog_mlx5_cx4lx_tx_global_pause_pci_grep")
    assert got[("tx_pause_duration", "global")]["value"] == pytest.approx(555.665182)  # 555665182 us
    assert got[("tx_pause_frames", "global")]["value"] == 1266552


def test_cardinality_is_bounded_by_default() -> None:
    # 751 statistics on one mlx5 port; only the neutral ones leave the host unless asked.
    case = expected("ethq_mlx5_cx4lx_ubuntu1804_k4.15")
    assert case["parsed_statistics"] == 751
    assert len(case["readings"]) <= 60
    assert all(r["name"] in NEUTRAL_UNITS for r in case["readings"])


async def test_unmapped_and_queue_statistics_are_opt_in(tmp_path: Path) -> None:
    text = (CASES / "ethtool" / "ethq_mlx5_cx4lx_ubuntu1804_k4.15" / "input.txt").read_text()
    (tmp_path / "eth0.txt").write_text(text)
    parsed = parse_ethtool_s(text)
    queues = {n for n in parsed if is_queue_stat(n)}
    assert "rx0_packets" in queues and "rx_64_bytes_phy" not in queues and "rx_prio0_bytes" not in queues
    unmapped = await collector(stats_dir=tmp_path, include_unmapped=True).collect()
    everything = await collector(stats_dir=tmp_path, include_unmapped=True, include_queues=True).collect()
    assert not {r.counter for r in unmapped} & queues
    assert {r.counter for r in everything} == set(parsed)
    raw = next(r for r in everything if r.counter == "tx_pci_signal_integrity")
    assert (raw.name, raw.value, raw.width) == ("", 34, 64)


async def test_node_exporter_layout_with_driver_settings_and_a_failing_bond(tmp_path: Path) -> None:
    for case, target in [
        ("node_exporter_eth0_statistics", "eth0/statistics"),
        ("node_exporter_eth0_driver", "eth0/driver"),
        ("node_exporter_eth0_settings", "eth0/settings"),
        ("node_exporter_bond0_statistics_error", "bond0/statistics"),
    ]:
        (tmp_path / target).parent.mkdir(exist_ok=True)
        (tmp_path / target).write_bytes((CASES / "ethtool" / case / "input.txt").read_bytes())
    readings = await collector(stats_dir=tmp_path, include_unmapped=True).collect()
    assert {r.device for r in readings} == {"eth0"}  # bond0's ERROR: 1 is skipped, not fatal
    by_counter = {r.counter: r for r in readings}
    assert by_counter["speed"].value == 1000 * 125_000 and by_counter["speed"].kind is Kind.GAUGE
    assert by_counter["link_detected"].value == 1.0
    assert dict(by_counter["driver_info"].labels)["driver"] == "e1000e"
    assert by_counter["port.rx_dropped"].value == 12028
    # "duplicate metric" and "duplicate_metric" would be one series downstream: both dropped.
    assert not {"duplicate metric", "duplicate_metric"} & set(by_counter)


async def test_interface_include_and_exclude_patterns(tmp_path: Path) -> None:
    text = (CASES / "ethtool" / "crafted_mlx5_pfc_prio3" / "input.txt").read_text()
    for name in ("ens1f0np0", "ens1f1np1", "eth0", "lo"):
        (tmp_path / f"{name}.txt").write_text(text)
    assert {r.device for r in await collector(stats_dir=tmp_path).collect()} == {"ens1f0np0", "ens1f1np1", "eth0"}
    only = collector(stats_dir=tmp_path, interfaces=["ens1*"], exclude=["re:.*np1"])
    assert {r.device for r in await only.collect()} == {"ens1f0np0"}


def test_bad_options_name_the_key() -> None:
    registry = {"ethtool": "collectors.ethtool:EthtoolCollector"}
    with pytest.raises(CollectorConfigError, match=r"collectors\.ethtool\.exclude"):
        build("ethtool", {"exclude": ["re:("]}, node="n", sysfs_root=Path("/sys"), registry=registry)
    with pytest.raises(CollectorConfigError, match=r"collectors\.ethtool\.stats_dirr"):
        build("ethtool", {"stats_dirr": "/tmp"}, node="n", sysfs_root=Path("/sys"), registry=registry)


def test_parser_quirks() -> None:
    assert parse_ethtool_s("NIC statistics:\n     rx: 1\n") == {"rx": 1}
    assert parse_ethtool_s("rx: 1\ntx: 18446744073709551615") == {"rx": 1, "tx": 2**64 - 1}
    assert parse_ethtool_s("# ethtool -S x\nnetlink error: Operation not permitted\n[3]: rx_ucast_packets: 7") == {
        "[3]: rx_ucast_packets": 7
    }
    # cxgb4 pads its names to align the columns (kernel commit 0bf9a7d6174f): the blanks are not the name's
    assert parse_ethtool_s("NIC statistics:\n     tx_octets_ok        : 5\n     rx_frames_ok  : 2\n") == {
        "tx_octets_ok": 5,
        "rx_frames_ok": 2,
    }
    with pytest.raises(EthtoolReadError):
        parse_ethtool_s("ERROR: 95")


# --- the real kernel ---------------------------------------------------------------------------


def values(readings: list[Reading] | Any) -> dict[str, float]:
    return {r.counter: r.value for r in readings if r.kind is Kind.COUNTER}


@pytest.mark.root
async def test_ioctl_reads_veth_statistics_like_ethtool_in_a_netns() -> None:
    ethtool = need_binary("ethtool")
    with veth_pair(PREFIX, queues=4) as pair:
        # veth counts received frames per queue only on its NAPI path: GRO on at the receiver
        # and no TSO at the sender (drivers/net/veth.c, veth_skb_is_eligible_for_gro).
        pair.run_b([ethtool, "-K", pair.if_b, "gro", "on"])
        pair.run_a([ethtool, "-K", pair.if_a, "tso", "off"])
        sent = send_udp(pair, count=40)
        coll = collector(netns=pair.ns_b, interfaces=[pair.if_b], include_unmapped=True, include_queues=True)
        try:
            first = await coll.collect()
            oracle = parse_ethtool_s(pair.run_b([ethtool, "-S", pair.if_b]))
            assert values(first) == oracle
            received = sum(v for k, v in oracle.items() if k.endswith("_xdp_packets"))
            assert sent == 40 and received >= 40
            info = next(r for r in first if r.counter == "driver_info")
            assert dict(info.labels)["driver"] == "veth" and info.device == pair.if_b
            settings = parse_ethtool_settings(pair.run_b([ethtool, pair.if_b]))
            speed = next(r for r in first if r.counter == "speed")
            assert speed.value == (settings.speed_mbps or 0) * 125_000

            # Fewer active queues -> a shorter string table: the cached one must be re-fetched.
            pair.run_b([ethtool, "-L", pair.if_b, "rx", "2"])
            second = await coll.collect()
            oracle = parse_ethtool_s(pair.run_b([ethtool, "-S", pair.if_b]))
            assert values(second) == oracle
            assert not any(k.startswith("rx_queue_3_") for k in values(second))
        finally:
            await coll.close()


@pytest.mark.root
async def test_default_options_on_veth_emit_only_info_not_queue_series() -> None:
    with veth_pair(PREFIX) as pair:
        coll = collector(netns=pair.ns_a)
        try:
            readings = await coll.collect()
        finally:
            await coll.close()
    assert {r.device for r in readings} == {pair.if_a}  # loopback excluded by its IFF_LOOPBACK flag
    assert {r.counter for r in readings} == {"driver_info", "speed", "link_detected"}
