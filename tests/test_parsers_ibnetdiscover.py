"""fabricd.parsers.ibnetdiscover: both formats, against expectations written from the text by hand (not
from the parser), the two formats agreeing on one fabric, failures as problems, and no input raising."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from fabricd.parsers.common import Problem
from fabricd.parsers.ibnetdiscover import IbnetEnd, IbnetPort, parse_ibnetdiscover
from fabricd.topology import from_ibnetdiscover
from tests.helpers import CASES

IB = CASES / "ibfabric"
ISR = "ISR9024 Voltaire"
SW6 = "SW-6IB4 Voltaire"
MT = "MT23108 InfiniHost Mellanox Technologies"


def text(case: str) -> str:
    return (IB / case / "input.txt").read_text()


def sw(lid: int, port: int, guid: str, desc: str) -> IbnetEnd:
    return IbnetEnd("SW", lid, port, guid, desc)


def ca(lid: int, port: int, guid: str) -> IbnetEnd:
    return IbnetEnd("CA", lid, port, guid, MT)


def test_the_man_page_topology_file_read_line_by_line() -> None:
    # Every connected port line of the rdma-core man page example, in file order (switch blocks
    # first, then the CA blocks); values copied from the text.
    s1 = "0x005442ba00003080"
    s2 = "0x0008f10400410015"
    got = parse_ibnetdiscover(text("ibnetdiscover_topology_rdma_core_man"))
    assert got.ports == [
        IbnetPort(sw(6, 22, s1, ISR), "4x", "SDR", ca(4, 1, "0x0008f10403961355")),
        IbnetPort(sw(6, 10, s1, ISR), "4x", "SDR", sw(3, 1, s2, SW6)),
        IbnetPort(sw(6, 8, s1, ISR), "4x", "SDR", ca(14, 2, "0x0008f1040396055a")),
        IbnetPort(sw(6, 6, s1, ISR), "4x", "SDR", sw(3, 3, s2, SW6)),
        IbnetPort(sw(6, 12, s1, ISR), "4x", "SDR", ca(10, 1, "0x0008f10403960559")),
        IbnetPort(sw(3, 6, s2, SW6), "4x", "SDR", ca(16, 1, "0x0008f10403960985")),
        IbnetPort(sw(3, 4, s2, SW6), "4x", "SDR", ca(12, 1, "0x005442b100004901")),
        IbnetPort(sw(3, 1, s2, SW6), "1x", "SDR", sw(6, 10, s1, ISR)),
        IbnetPort(sw(3, 3, s2, SW6), "4x", "SDR", sw(6, 6, s1, ISR)),
        IbnetPort(ca(16, 1, "0x0008f10403960985"), "4x", "SDR", sw(3, 6, s2, SW6)),
        IbnetPort(ca(12, 1, "0x005442b100004901"), "4x", "SDR", sw(3, 4, s2, SW6)),
        IbnetPort(ca(4, 1, "0x0008f10403961355"), "4x", "SDR", sw(6, 22, s1, ISR)),
        IbnetPort(ca(14, 2, "0x0008f1040396055a"), "4x", "SDR", sw(6, 8, s1, ISR)),
        IbnetPort(ca(10, 1, "0x0008f10403960559"), "1x", "SDR", sw(6, 12, s1, ISR)),
    ]
    assert got.formats == ["topology"]
    assert got.problems == []


def test_a_real_topology_file_every_port_line_and_descriptions_with_hashes() -> None:
    got = parse_ibnetdiscover(text("ibnetdiscover_topology_psmn_x5"))
    assert (len(got.ports), got.problems) == (318, [])  # 318 lines start with "[" in the capture
    # `[1]	"S-0008f10500108c5c"[15]		# "Voltaire 4036 # 4036-8C5C" lid 16 4xQDR` under switch lid 9
    first = got.ports[0]
    voltaire = "Voltaire 4036 - 36 QDR ports switch"
    assert first == IbnetPort(
        sw(9, 1, "0x0008f10500200b50", voltaire),
        "4x",
        "QDR",
        sw(16, 15, "0x0008f10500108c5c", "Voltaire 4036 # 4036-8C5C"),
    )
    # `[4]	"H-003048c749cd0000"[1](3048c749cd0001) 		# "MT25408 ConnectX ..." lid 72 4xDDR`
    assert got.ports[3].remote == IbnetEnd("CA", 72, 1, "0x003048c749cd0001", "MT25408 ConnectX Mellanox Technologies")
    assert got.ports[3].speed == "DDR"


def test_both_formats_describe_the_same_fabric() -> None:
    """The man page's topology file, rewritten by hand in the -p format ibnetdiscover.c's
    dump_ports_report prints: the parser gives the same ports, and the topology is the same."""
    topo_text = text("ibnetdiscover_topology_rdma_core_man")
    ports_text = "\n".join(
        [
            "SW     6 22 0x005442ba00003080 4x SDR - CA     4  1 0x0008f10403961355 ( 'ISR9024 Voltaire' - 'MT23108 InfiniHost Mellanox Technologies' )",
            "SW     6 10 0x005442ba00003080 4x SDR - SW     3  1 0x0008f10400410015 ( 'ISR9024 Voltaire' - 'SW-6IB4 Voltaire' )",
        ]
    )
    by_format = parse_ibnetdiscover(ports_text)
    assert by_format.formats == ["ports"]
    assert by_format.ports == parse_ibnetdiscover(topo_text).ports[:2]
    assert from_ibnetdiscover(topo_text).switches.keys() == {"ISR9024_Voltaire", "SW-6IB4_Voltaire"}


def test_grouping_and_full_suffixes_are_read() -> None:
    # -g adds [ext N] and "# Chassis" comments, -f adds " s=N w=N v=N" (ibnetdiscover.c out_switch_port)
    lines = (
        "sysimgguid=0x8f10400411a09\t\t# Chassis 1 (ISR2012)\n"
        "switchguid=0x8f10400411a08(8f10400411a08)\t# Voltaire Line 3\n"
        'Switch\t24 "S-0008f10400411a08"\t\t# "ISR2012 Voltaire sLB-2024" enhanced port 0 lid 742 lmc 0\n'
        '[24][ext 12]\t"H-0002c90200247010"[1](2c90200247011) \t\t# "atlas35" lid 1252 4xDDR s=2 w=2 v=4\n'
    )
    got = parse_ibnetdiscover(lines)
    assert got.ports == [
        IbnetPort(
            sw(742, 24, "0x0008f10400411a08", "ISR2012 Voltaire sLB-2024"),
            "4x",
            "DDR",
            IbnetEnd("CA", 1252, 1, "0x0002c90200247011", "atlas35"),
        )
    ]
    assert got.problems == []


def test_failures_are_problems_and_the_ports_before_them_are_kept() -> None:
    lines = text("ibnetdiscover_topology_rdma_core_man").splitlines()
    broken = "\n".join(
        [
            "ibwarn: [1234] mad_rpc: _do_madrpc failed; dport (DR path slid 0; dlid 0; 0,1,22)",
            *lines[:20],
            '[6]\t"S-0008f104',
        ]
    )
    got = parse_ibnetdiscover(broken)
    assert len(got.ports) == 5
    assert got.problems == [
        Problem(
            1,
            "tool diagnostic (the discovery may be incomplete)",
            "ibwarn: [1234] mad_rpc: _do_madrpc failed; dport (DR path slid 0; dlid 0; 0,1,22)",
        ),
        Problem(22, "not an ibnetdiscover port, node or header line", '[6]\t"S-0008f104'),
    ]
    assert parse_ibnetdiscover("").problems == [
        Problem(0, "no ibnetdiscover port lines (neither -p nor topology format)")
    ]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_no_text_makes_it_raise(junk: str) -> None:
    got = parse_ibnetdiscover(junk)
    assert got.ports or got.problems


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(text("ibnetdiscover_topology_rdma_core_man").splitlines()), max_size=40),
    st.text(max_size=30),
)
def test_shuffled_and_garbled_captures_never_raise(lines: list[str], junk: str) -> None:
    got = parse_ibnetdiscover("\n".join(lines) + junk)
    assert all(isinstance(p, IbnetPort) for p in got.ports)


def test_every_case_parses_without_problems() -> None:
    for case in sorted(Path(IB).glob("ibnetdiscover*")):
        assert parse_ibnetdiscover((case / "input.txt").read_text()).problems == [], case.name
