"""``fabricd model`` predicts what NCCL's tuner picks (fabricd/tuner.py, constants of NCCL's tuning.cc)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fabricd.perfmodel import Fabric, predict
from fabricd.tuner import choose, expected, time_seconds
from tests.helpers import CASES

H100 = Fabric()  # 8 x 400G HCAs and 8 GPUs per node


def test_a_small_all_reduce_on_16_nodes_is_a_tree_with_ll_not_a_128_rank_ring() -> None:
    # The plain alpha-beta ring: 254 steps x 8 us = 2.03 ms; NCCL would never run that.
    assert predict("all_reduce", 8, 16, H100, "ring").time_seconds == pytest.approx(2.032e-3)
    c = choose("all_reduce", 8, 16, H100)
    assert (c.algo, c.protocol) == ("tree", "LL")
    # tuning.cc: baseLat[tree][LL] + 2 x ((ranks/node - 1) x hwLat[NVLink] + log2(nodes) x hwLat[NET])
    assert c.time_seconds == pytest.approx((6.8 + 2 * (7 * 0.6 + 4 * 5.0)) * 1e-6, rel=1e-3)
    ring_ll = (6.6 + (254 - 32) * 1.0 + 32 * 2.7) * 1e-6  # ring LL: intra steps at the 1 us net overhead
    assert time_seconds("all_reduce", "ring", "LL", 8, 16, H100) == pytest.approx(ring_ll, rel=1e-3)


@pytest.mark.parametrize(
    ("op", "size", "nodes", "algo", "protocol"),
    [
        ("all_reduce", 1 << 20, 16, "tree", "LL128"),
        ("all_reduce", 8 << 30, 16, "ring", "Simple"),
        ("all_reduce", 8, 1, "ring", "LL"),  # one node: no tree (NVLink rings)
        ("all_gather", 8, 16, "ring", "LL"),  # only all_reduce has a tree
        ("all_gather", 8 << 30, 16, "ring", "Simple"),
    ],
)
def test_the_choice_moves_with_size_and_shape(op: str, size: int, nodes: int, algo: str, protocol: str) -> None:
    c = choose(op, size, nodes, H100)
    assert (c.algo, c.protocol) == (algo, protocol)


def test_inspector_records_are_judged_by_collective_name() -> None:
    got = expected("AllReduce", 8, 128, 16, 8)
    assert got is not None and (got.algo, got.protocol) == ("tree", "LL")
    assert expected("SendRecv", 8, 128, 16, 8) is None and expected("AllReduce", 8, 1, 1, 8) is None


def _model(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "fabricd", "model", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_cli_says_which_algorithm_and_protocol() -> None:
    out = _model("--nodes", "16", "--sizes", "8,8G", "--json")
    assert out.returncode == 0, out.stderr
    rows = [(p["algo"], p["protocol"], p["size_bytes"]) for p in json.loads(out.stdout)["predictions"]]
    assert rows == [("tree", "LL", 8), ("ring", "Simple", 8 << 30)]


def test_calibrate_on_a_file_that_is_not_nccl_tests_output_says_so() -> None:
    log = CASES / "jobs" / "listpids_slurm22" / "output.txt"
    out = _model("--calibrate", str(log))
    assert out.returncode == 2
    assert out.stderr == (
        f"fabricd model: {log}: not NCCL-tests output (no result table with size, time and busbw columns)\n"
    )
