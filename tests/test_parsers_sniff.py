"""A file handed to the wrong ``fabricd parse`` KIND: one failure that says what the file is and which
KIND reads it (``fabricd.parsers.sniff``), and no real capture of a KIND taken for another one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabricd.parsers.nccl import parse_nccl_runs
from fabricd.parsers.sniff import kind_of, other_kind
from tests.helpers import CASES

RAS = CASES / "ras" / "issue1730_nccl2.26.2" / "status.txt"
ETHTOOL = CASES / "ethtool" / "ethq_i40e_v2.3.2k_priority_xon_tx" / "input.txt"
PERFQUERY = CASES / "ibfabric" / "perfquery_x_0x506b4b03005c2740" / "input.txt"
IBSTAT = CASES / "ibfabric" / "gpud_ibstat_47_0_h100_all_active_2" / "input.txt"
IBQ = CASES / "ibqueryerrors" / "linux_rdma_2021_sx6036_saturated" / "input.txt"
IBNET = CASES / "ibfabric" / "ibnetdiscover_test" / "input.txt"
TRACE = CASES / "ibtracert" / "llnl_oms_hype" / "input.txt"
NCCL = CASES / "nccl" / "oci_all_reduce_2node_16xA100_rdma" / "input.txt"
TAGGED = CASES / "nccl" / "ebpf_all_reduce_mpi_2.18.0_tagged" / "input.txt"
SRUN = CASES / "nccl" / "issue290_all_reduce_2node_16xH100_srun_label" / "input.txt"


def _kind_of_case(path: Path) -> str:
    top, case = path.relative_to(CASES).parts[:2]
    if top != "ibfabric":
        return top
    return next(k for k in ("ibnetdiscover", "perfquery", "ibstat") if k in case)


CAPTURES = [
    p
    for top in ("nccl", "ras", "ethtool", "perfquery", "ibqueryerrors", "ibtracert", "ibfabric")
    for p in sorted((CASES / top).glob("*/*"))
    if p.is_file() and p.name not in ("expected.json", "command.txt")
]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(CASES)))
def test_no_capture_is_taken_for_another_kind(path: Path) -> None:
    text, kind = path.read_text(errors="replace"), _kind_of_case(path)
    assert other_kind(text, kind) is None
    assert kind_of(text) in (kind, None)


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        (RAS, "ras"),
        (ETHTOOL, "ethtool"),
        (PERFQUERY, "perfquery"),
        (IBSTAT, "ibstat"),
        (IBQ, "ibqueryerrors"),
        (IBNET, "ibnetdiscover"),
        (TRACE, "ibtracert"),
        (NCCL, "nccl"),
        (TAGGED, "nccl"),  # "[1,0]<stdout>:# nThread ..."
        (SRUN, "nccl"),  # " 0: # nThread ..."
        (CASES / "nccl" / "issue37_all_gather_no_hash_error_column_oob_failed" / "input.txt", "nccl"),  # no "#"
        (CASES / "nccl" / "nccl1_readme_all_reduce_test_4xtitanx_ms_times" / "input.txt", "nccl"),  # "bytes N"
    ],
)
def test_each_kind_is_recognized(path: Path, kind: str) -> None:
    assert kind_of(path.read_text()) == kind


def test_nccl_given_a_ras_report_names_fabricd_parse_ras() -> None:
    (run,) = parse_nccl_runs(RAS.read_text())
    assert run.status == "failed"
    assert run.error == (
        "other_kind: not NCCL-tests output: this is an NCCL RAS status report (ncclras); "
        "read it with `fabricd parse ras`"
    )
    assert run.rows == ()


@pytest.mark.parametrize(
    ("path", "hint"),
    [
        (ETHTOOL, "this is ethtool -S statistics; read it with `fabricd parse ethtool`"),
        (PERFQUERY, "this is perfquery output; read it with `fabricd parse perfquery`"),
        (IBQ, "this is ibqueryerrors output; read it with `fabricd parse ibqueryerrors`"),
        (IBNET, "this is ibnetdiscover output; read it with `fabricd parse ibnetdiscover`"),
        (TRACE, "this is ibtracert output; read it with `fabricd parse ibtracert`"),
        (IBSTAT, "this is ibstat/ibstatus output; `fabricd parse` has no KIND for it"),
    ],
)
def test_nccl_given_another_tool_names_it(path: Path, hint: str) -> None:
    (run,) = parse_nccl_runs(path.read_text())
    assert (run.status, run.error) == ("failed", f"other_kind: not NCCL-tests output: {hint}")


def test_an_nccl_log_cut_before_its_header_is_still_truncated_not_another_kind() -> None:
    (run,) = parse_nccl_runs("srun: job 42 queued and waiting for resources\n")
    assert (run.status, run.error) == ("truncated", "aborted: no result table")


def test_nccl_log_given_to_ras_names_fabricd_parse_nccl() -> None:
    # It has "NCCL version 2.25.1+cuda12.8", which the RAS parser alone took for a report's version.
    assert other_kind(NCCL.read_text(), "ras") == (
        "not an NCCL RAS status report (ncclras): this is NCCL-tests output; read it with `fabricd parse nccl`"
    )


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.sampled_from(["nccl", "ras", "ethtool", "perfquery", "ibtracert"]))
def test_never_raises(text: str, kind: str) -> None:
    found = other_kind(text, kind)
    assert found is None or found.startswith("not ")
