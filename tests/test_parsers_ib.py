"""fabricd.parsers.perfquery and .ibqueryerrors on real captures, against values read off the text by
hand; failures as problems; no input making them raise."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricd.parsers.common import Problem
from fabricd.parsers.ibnetdiscover import parse_ibnetdiscover
from fabricd.parsers.ibqueryerrors import Summary, parse_ibqueryerrors
from fabricd.parsers.ibtracert import parse_ibtracert
from fabricd.parsers.perfquery import PortCounters, parse_perfquery_text, ports
from tests.helpers import CASES

IBQ = CASES / "ibqueryerrors"
PERFQUERY_CASES = sorted(p for p in (CASES / "perfquery").iterdir() if p.is_dir())
UPDATE = os.environ.get("UPDATE_GOLDEN", "") == "1"
SX = "MF0;ys23ib4:SX6036/U1"
SWITCH = "0x0002c903006e29b0"


def text(folder: str, case: str) -> str:
    return (CASES / folder / case / "input.txt").read_text()


def test_ibqueryerrors_on_a_real_fabric_with_saturated_counters() -> None:
    got = parse_ibqueryerrors(text("ibqueryerrors", "linux_rdma_2021_sx6036_saturated"))
    assert got.problems == []
    assert len(got.ports) == 15  # every "GUID ... port" line of the capture
    assert got.ports[0] == PortCounters(
        "0x7cfe900300179b31",
        1,
        None,
        "dl380g7 mlx4_0",
        {"vl15_dropped": 14, "port_transmit_wait": 4294967295},
        ["port_transmit_wait"],
    )
    # `GUID 0x2c903006e29b0 port ALL: [LinkErrorRecoveryCounter == 15] [LinkDownedCounter == 48] ...`
    assert got.ports[3] == PortCounters(
        SWITCH,
        "ALL",
        None,
        SX,
        {
            "link_error_recovery": 15,
            "link_downed": 48,
            "port_receive_switch_relay_errors": 2461,
            "port_transmit_discards": 15854,
            "vl15_dropped": 5,
            "port_transmit_wait": 4294967295,
        },
        ["port_transmit_wait"],
    )
    # port 5: SymbolErrorCounter at the 16-bit ceiling, PortXmitWait 84704351 below the 32-bit one
    assert got.ports[9].port == 5
    assert got.ports[9].saturated == ["symbol_errors"]
    assert got.ports[9].counters["port_transmit_wait"] == 84704351
    summary = got.summary
    assert (summary.nodes_checked, summary.bad_nodes, summary.ports_checked, summary.bad_ports) == (4, 4, 43, 14)
    assert (summary.thresholds, summary.suppressed) == ({}, [])


def test_ibqueryerrors_details_data_report_port_and_suppression() -> None:
    got = parse_ibqueryerrors(text("ibqueryerrors", "synthetic_details_data_report_port_suppressed"))
    assert got.problems == []
    port5 = got.ports[1]
    assert (port5.guid, port5.port, port5.lid, port5.name) == ("0x0c42a10300b95bfa", 5, 3, "MF0;ibswitch254:MQM8700/U1")
    assert port5.counters == {
        "port_receive_errors": 12,
        "port_local_physical_errors": 9,  # --details
        "port_malformed_packet_errors": 3,
        "port_transmit_wait": 7340032,  # printed with a suffix: the 64-bit field, not saturated
        "port_transmit_data": 268435456 * 4,  # --data: 4-octet words -> bytes
        "port_receive_data": 1024 * 4,
        "port_transmit_packets": 4096,
        "port_receive_packets": 16,
    }
    assert got.ports[2].counters == {"port_transmit_discards": 3, "port_inactive_discards": 3}
    assert got.ports[2].lid == 3  # Link info of a down port still names the switch LID
    hca = got.ports[3]
    assert (hca.name, hca.lid, hca.saturated) == ("gpu-v100-0 HCA-1", 1, ["symbol_errors", "link_downed"])
    assert got.summary.thresholds == {"SymbolErrorCounter": 10}
    assert got.summary.suppressed == ["PortRcvSwitchRelayErrors"]


def test_ibqueryerrors_capture_starting_with_its_command_line() -> None:
    # guilbaults/infiniband-exporter#48: "# ibqueryerrors --verbose ... -G 0xb8cef60300a1d92a", a node
    # without errors. The command line was a problem (exit 1 for a good capture).
    got = parse_ibqueryerrors(text("ibqueryerrors", "exporter_issue48_clean_node_with_command_line"))
    assert (got.ports, got.problems) == ([], [])
    names = "SymbolErrorCounter LinkErrorRecoveryCounter LinkDownedCounter PortRcvErrors PortRcvRemotePhysicalErrors"
    names += " PortRcvSwitchRelayErrors PortXmitDiscards PortXmitConstraintErrors PortRcvConstraintErrors"
    names += " LocalLinkIntegrityErrors ExcessiveBufferOverrunErrors VL15Dropped PortXmitWait"
    assert got.summary == Summary(1, 0, 1, 0, 0, dict.fromkeys(names.split(), 0), [])
    for command in ("$ sudo ibqueryerrors -c", "[root@sm01 ~]# /usr/sbin/ibqueryerrors --data"):
        assert parse_ibqueryerrors(command + "\n## Summary: 3 nodes checked, 0 bad nodes found\n").problems == []


def test_ibqueryerrors_failures_are_problems() -> None:
    got = parse_ibqueryerrors(
        "ibwarn: [4242] query_and_dump: PortRcvErrorDetails query failed on sw1, Lid 3 port 7\n"
        'Errors for "node1 mlx5_0"\n'
        "   GUID 0x1 port 1: [PortRcvErrors == 3] [PortXmitWa\n"
    )
    assert got.ports == [PortCounters("0x0000000000000001", 1, None, "node1 mlx5_0", {"port_receive_errors": 3})]
    assert got.problems == [
        Problem(
            1,
            "tool diagnostic (a PMA query failed)",
            "ibwarn: [4242] query_and_dump: PortRcvErrorDetails query failed on sw1, Lid 3 port 7",
        ),
        Problem(3, "unreadable counter list (truncated line?)", "GUID 0x1 port 1: [PortRcvErrors == 3] [PortXmitWa"),
    ]
    assert parse_ibqueryerrors("").problems == [Problem(0, "no ibqueryerrors port lines and no summary")]
    clean = "\n## Summary: 4 nodes checked, 0 bad nodes found\n##          8 ports checked, 0 ports have errors beyond threshold\n"
    assert parse_ibqueryerrors(clean).problems == []  # a clean fabric lists no port


def test_perfquery_blocks_become_port_records_in_bytes_with_narrow_fields_flagged() -> None:
    result = parse_perfquery_text(text("ibfabric", "perfquery_x_0x506b4b03005c2740"))
    assert result.problems == []
    records = ports(result.blocks, "0x506b4b03005c2740")
    first = records[0]
    assert (first.guid, first.port, first.lid) == ("0x506b4b03005c2740", 1, 2052)
    assert first.counters["port_transmit_discards"] == 20046
    empty = parse_perfquery_text("")
    assert empty.problems == [Problem(0, "no perfquery counter block (# Port counters: Lid L port P)")]
    stray = parse_perfquery_text("ibwarn: [1] _do_madrpc: recv failed\n")
    assert stray.problems[0] == Problem(
        1, "tool diagnostic (the query failed or is incomplete)", "ibwarn: [1] _do_madrpc: recv failed"
    )


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_no_text_makes_the_ib_parsers_raise(junk: str) -> None:
    assert parse_ibqueryerrors(junk).ports or parse_ibqueryerrors(junk).problems or "## Summary" in junk
    result = parse_perfquery_text(junk)
    assert result.blocks or result.problems


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(text("ibqueryerrors", "linux_rdma_2021_sx6036_saturated").splitlines()), max_size=30))
def test_shuffled_ibqueryerrors_lines_never_raise(lines: list[str]) -> None:
    got = parse_ibqueryerrors("\n".join(lines))
    assert all(isinstance(p, PortCounters) for p in got.ports)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_no_text_makes_the_ibstat_parsers_raise(junk: str) -> None:
    from fabricd.parsers.ibstat import parse_ibstat, parse_ibstatus

    parse_ibstat(junk)
    parse_ibstatus(junk)
    parse_ibstat("CA 'mlx5_0'\n Port 1:\n  Base lid: ²\n  Rate: ٣\n" + junk)  # unicode digits are not numbers
    [port] = parse_ibstatus("Infiniband device 'mlx5_0' port 1 status:\n\tbase lid:\t 0xzz\n")
    assert port.lid is None


def test_plain_perfquery_with_the_old_libibmad_names() -> None:
    # TACC/tacc_stats st_ib.c (2011): "# Port counters:" (PortCounters, no -x) and OFED 1.4 names.
    result = parse_perfquery_text(text("perfquery", "tacc_stats_2011_ofed14_old_names"))
    assert result.problems == []
    [block] = result.blocks
    assert (block.attribute, block.lid, block.port, block.cap_mask2) == ("basic", 936, 1, None)
    [port] = ports(result.blocks)
    assert port.counters["port_transmit_data"] == 905972985 * 4  # XmtData: words of 4 octets
    assert port.counters["port_receive_data"] == 2411533950 * 4
    assert (port.counters["port_transmit_packets"], port.counters["port_receive_packets"]) == (22945597, 26264095)
    errors = {k: v for k, v in port.counters.items() if "data" not in k and "packets" not in k}
    assert len(errors) == 12 and set(errors.values()) == {0}  # SymbolErrors .. VL15Dropped
    assert port.saturated == []


def test_plain_perfquery_data_counters_are_32_bit_and_saturate() -> None:
    # PortCounters' PortXmitData is 32 bits (IBA 16.1.3.5): all ones means it stopped counting.
    block = "# Port counters: Lid 7 port 1\nPortXmitData:....................4294967295\n"
    [port] = ports(parse_perfquery_text(block).blocks)
    assert port.saturated == ["port_transmit_data"]
    extended = block.replace("Port counters", "Port extended counters")
    assert ports(parse_perfquery_text(extended).blocks)[0].saturated == []


@pytest.mark.parametrize("case", PERFQUERY_CASES, ids=[p.name for p in PERFQUERY_CASES])
def test_perfquery_case_matches_expected(case: Path) -> None:
    result = parse_perfquery_text((case / "input.txt").read_text())
    got = {
        "blocks": [asdict(b) for b in result.blocks],
        "ports": [asdict(p) for p in ports(result.blocks)],
        "problems": [asdict(p) for p in result.problems],
    }
    if UPDATE:
        (case / "expected.json").write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads((case / "expected.json").read_text())


PROMPTS = ("# ", "$ ", "[root@sm01 ~]# ", "user@host:~$ sudo /usr/sbin/")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_capture_pasted_with_its_command_line_parses_as_without_it(prompt: str) -> None:
    # STYLE.md: a capture starts with the command that made it; it used to be "not a ... line".
    cases = [
        ("perfquery -x 2052 1", "ibfabric/perfquery_x_0x506b4b03005c2740", parse_perfquery_text),
        ("ibnetdiscover -p", "ibfabric/ibnetdiscover_test", parse_ibnetdiscover),
        ("ibtracert -G 0x001175000077ef9e 0x001175000077a00e", "ibtracert/llnl_oms_hype", parse_ibtracert),
        ("ibqueryerrors", "ibqueryerrors/linux_rdma_2021_sx6036_saturated", parse_ibqueryerrors),
    ]
    for command, case, parse in cases:
        bare = (CASES / case / "input.txt").read_text()
        assert parse(f"{prompt}{command}\n{bare}") == parse(bare), case
        assert parse(bare).problems == [], case
