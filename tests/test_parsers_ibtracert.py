"""fabricd.parsers.ibtracert on real ibtracert output (tests/cases/ibtracert, see its ORIGIN.md):
the hops written out by hand from each capture, failures as problems, every case against its
golden expected.json, and no input raising."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricd.parsers.common import Problem
from fabricd.parsers.ibtracert import TraceEnd, TraceHop, parse_ibtracert
from tests.helpers import CASES

TRACES = CASES / "ibtracert"
CASE_DIRS = sorted(p for p in TRACES.iterdir() if (p / "command.txt").exists())
UPDATE = os.environ.get("UPDATE_GOLDEN", "") == "1"
LEAF1, LEAF2 = "0x0000000000200000", "0x0000000000200001"
SPINE1, SPINE2 = "0x0000000000200002", "0x0000000000200003"
A01 = TraceEnd("CA", "0x0000000000100000", 1, 2, 2, "gpu-a01 mlx5_0")  # node GUID (port: ...0001)


def trace(case: str) -> Any:
    return parse_ibtracert((TRACES / case / "input.txt").read_text())


def sw(out: int, guid: str, port: int, lid: int, desc: str) -> TraceHop:
    return TraceHop(out, "SW", guid, port, lid, lid, desc)


def test_cross_leaf_via_the_spine_the_lft_names() -> None:
    got = trace("ibsim_2_8_via_spine2")
    assert got.source == A01
    assert got.hops == [
        sw(1, LEAF1, 1, 1, "ib-leaf-1"),
        sw(8, SPINE2, 1, 6, "ib-spine-2"),
        sw(2, LEAF2, 8, 3, "ib-leaf-2"),
        TraceHop(2, "CA", "0x0000000000100007", 1, 8, 8, "gpu-b02 mlx5_0"),
    ]
    assert got.destination == TraceEnd("CA", "0x0000000000100006", 1, 8, 8, "gpu-b02 mlx5_0")
    assert got.complete and got.problems == []


def test_the_static_tables_spread_destinations_over_the_uplinks() -> None:
    # minhop sent LID 7 over spine-1 and LID 8 over spine-2 (ibsim/ibroute_1.txt)
    assert [h.guid for h in trace("ibsim_2_7_via_spine1").hops][:3] == [LEAF1, SPINE1, LEAF2]
    assert [(h.out_port, h.port) for h in trace("ibsim_2_7_via_spine1").hops] == [(1, 1), (7, 1), (2, 7), (1, 1)]


def test_same_leaf_back_to_a_switch_and_the_simple_format() -> None:
    same = trace("ibsim_2_5_same_leaf")
    assert same.hops == [
        sw(1, LEAF1, 1, 1, "ib-leaf-1"),
        TraceHop(2, "CA", "0x0000000000100003", 1, 5, 5, "gpu-a02 mlx5_0"),
    ]
    back = trace("ibsim_8_2_back")
    assert back.source == TraceEnd("CA", "0x0000000000100006", 1, 8, 8, "gpu-b02 mlx5_0")
    assert [(h.out_port, h.guid, h.port) for h in back.hops] == [
        (1, LEAF2, 2),
        (7, SPINE1, 2),
        (1, LEAF1, 7),
        (1, "0x0000000000100001", 1),
    ]
    to_switch = trace("ibsim_2_6_to_switch")
    assert to_switch.destination == TraceEnd("SW", SPINE2, 0, 6, 6, "ib-spine-2")
    assert [h.guid for h in to_switch.hops] == [LEAF1, SPINE2]
    simple = trace("ibsim_n_2_8_simple")
    assert simple.source == TraceEnd("", "0x0000000000100000", 1)
    assert simple.hops == [
        TraceHop(1, "", LEAF1, 1),
        TraceHop(8, "", SPINE2, 1),
        TraceHop(2, "", LEAF2, 8),
        TraceHop(2, "", "0x0000000000100007", 1),
    ]
    assert simple.destination == TraceEnd("", "0x0000000000100006", 1) and simple.problems == []


def test_a_real_director_fabric_three_switch_hops() -> None:
    got = trace("llnl_oms_hype")
    assert got.source == TraceEnd("CA", "0x001175000077ef9e", 1, 129, 129, "hype281 qib0")
    assert got.hops == [
        sw(1, "0x00066a00ec002eec", 9, 17, "ibcore1 L109"),
        sw(27, "0x00066a00eb002d14", 11, 8, "ibcore1 S205A"),
        sw(3, "0x00066a02e8001313", 36, 7, "ibcore1 L101"),
        TraceHop(9, "CA", "0x001175000077a00e", 1, 332, 332, "hype353 qib0"),
    ]
    assert got.destination == TraceEnd("CA", "0x001175000077a00e", 1, 332, 332, "hype353 qib0")


def test_failed_traces_are_incomplete_with_the_tools_words() -> None:
    down = trace("ibsim_2_8_link_down")
    assert (down.source, down.hops, down.complete) == (None, [], False)
    assert [p.message for p in down.problems] == [
        'ibwarn: sim_connect: attached as client 0 at node "ib-leaf-1"',
        "ibwarn: mad_rpc: _do_madrpc failed; dport (Lid 8)",
        "ibwarn: find_route: can't reach to/from ports",
        "ibwarn: get_route: can't find a route from src to dest",
        "ibtracert: iberror: failed: Failed to get route information",
    ]
    assert [p.message for p in trace("ibsim_2_99_no_such_lid").problems][1] == (
        "ibwarn: mad_rpc: _do_madrpc failed; dport (Lid 99)"
    )
    rerouted = trace("ibsim_2_8_rerouted")  # after the SM's next sweep: over spine-1
    assert [h.guid for h in rerouted.hops] == [LEAF1, SPINE1, LEAF2, "0x0000000000100007"]


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        ("", [Problem(0, "no ibtracert path (no From line)")]),
        (
            '[1] -> switch port {0x1}[1] lid 1-1 "x"\n',
            [Problem(1, "not an ibtracert line (or out of place)", '[1] -> switch port {0x1}[1] lid 1-1 "x"')],
        ),
    ],
)
def test_unreadable_input_is_a_problem(text: str, problems: list[Problem]) -> None:
    assert parse_ibtracert(text).problems == problems


def as_json(case: Path) -> dict[str, Any]:
    got = parse_ibtracert((case / "input.txt").read_text())
    return {**asdict(got), "complete": got.complete}


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_case_matches_expected(case: Path) -> None:
    got = as_json(case)
    if UPDATE:
        (case / "expected.json").write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads((case / "expected.json").read_text())


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_no_input_raises(text: str) -> None:
    parse_ibtracert(text)
