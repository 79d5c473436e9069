"""The collective performance model: closed-form cases, calibration, and the real multi-node fixtures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fabricd.parsers.nccl import parse_nccl_output
from fabricd.perfmodel import (
    Fabric,
    Observation,
    busbw_factor,
    calibrate,
    observations_from_run,
    parse_rate,
    parse_size,
    predict,
    sizes_range,
)

CASES = Path(__file__).parent / "cases" / "model"
GiB = 2**30
# Both fixture clusters have 1.6 Tb/s of GPU network per node (tests/cases/model/ORIGIN.md).
FIXTURE_FABRIC = Fabric(link_rate_bytes_per_second=parse_rate("200G"), hcas_per_node=8, gpus_per_node=8)


def test_busbw_factors_follow_nccl_tests() -> None:
    assert busbw_factor("all_reduce", 16) == pytest.approx(2 * 15 / 16)
    for op in ("all_gather", "reduce_scatter", "alltoall"):
        assert busbw_factor(op, 8) == pytest.approx(7 / 8)
    for op in ("broadcast", "reduce", "sendrecv"):
        assert busbw_factor(op, 8) == 1.0
    with pytest.raises(ValueError, match="unknown op"):
        busbw_factor("allreduce", 8)


def test_ring_all_reduce_closed_form() -> None:
    f = Fabric(alpha_seconds=5e-6, efficiency=1.0, hcas_per_node=4, link_rate_bytes_per_second=50e9)
    n, nodes = 1 * GiB, 4
    p = nodes * f.gpus_per_node
    b = 4 * 50e9
    expected = 2 * (p - 1) * 5e-6 + 2 * (p - 1) / p * n / b
    pred = predict("all_reduce", n, nodes, f, "ring")
    assert pred.time_seconds == pytest.approx(expected)
    assert pred.busbw_bytes_per_second == pytest.approx(n / expected * 2 * (p - 1) / p)
    # Large messages: ring busbw tends to the node's network bandwidth.
    huge = predict("all_reduce", 2**40, nodes, f, "ring")
    assert huge.busbw_bytes_per_second == pytest.approx(b, rel=1e-3)


def test_tree_all_reduce_latency_is_logarithmic_and_bandwidth_hierarchical() -> None:
    f = Fabric(alpha_seconds=1e-5, efficiency=1.0)
    nodes, p = 16, 128
    n = 8 * GiB
    t = predict("all_reduce", n, nodes, f, "tree").time_seconds
    assert t == pytest.approx(2 * math.ceil(math.log2(p)) * 1e-5 + 2 * (nodes - 1) / nodes * n / f.node_bandwidth)
    assert (
        predict("all_reduce", 8, nodes, f, "tree").time_seconds
        < predict("all_reduce", 8, nodes, f, "ring").time_seconds
    )


def test_sendrecv_and_single_node() -> None:
    f = Fabric(alpha_seconds=2e-6, efficiency=0.5)
    assert predict("sendrecv", GiB, 2, f).time_seconds == pytest.approx(2e-6 + GiB / f.node_bandwidth)
    single = predict("all_reduce", 2**40, 1, f)
    assert single.busbw_bytes_per_second == pytest.approx(f.nvlink_bytes_per_second, rel=1e-3)


def test_oversubscription_only_hurts_traffic_that_leaves_the_leaf() -> None:
    f = Fabric(efficiency=1.0, nodes_per_leaf=16, oversubscription=4.0, alpha_seconds=0.0)
    within = predict("alltoall", GiB, 16, f).algbw_bytes_per_second
    across = predict("alltoall", GiB, 32, f)
    nonblocking = predict("alltoall", GiB, 32, replace(f, oversubscription=1.0))
    share = 16 / 31
    bw = min(f.node_bandwidth, f.node_bandwidth / 4 / share)
    assert across.time_seconds == pytest.approx(31 / 32 * GiB / bw)
    assert across.algbw_bytes_per_second < nonblocking.algbw_bytes_per_second < within * 1.1
    # A ring crosses leaves at one node per leaf: oversubscription 4 leaves it untouched.
    assert predict("all_reduce", GiB, 32, f).time_seconds == pytest.approx(
        predict("all_reduce", GiB, 32, replace(f, oversubscription=1.0)).time_seconds
    )


def test_sizes_and_rates_parse_like_nccl_tests_and_sysfs() -> None:
    assert sizes_range("8:64") == [8, 16, 32, 64]
    assert sizes_range("8:8G")[-1] == 8 * GiB and len(sizes_range("8:8G")) == 31
    assert sizes_range("1M,4M") == [2**20, 4 * 2**20]
    assert parse_size("64K") == 65536
    assert parse_rate("400 Gb/sec (4X NDR)") == 50e9  # Gb/s × 125,000,000 (procfs convention)
    assert parse_rate("200G") == 25e9
    with pytest.raises(ValueError, match="bad size"):
        parse_size("lots")


def test_calibration_recovers_known_parameters() -> None:
    truth = replace(FIXTURE_FABRIC, alpha_seconds=12e-6, efficiency=0.8)
    obs = [
        Observation("all_reduce", 4, s, predict("all_reduce", s, 4, truth).time_seconds) for s in sizes_range("8:8G")
    ]
    cal = calibrate(obs, FIXTURE_FABRIC)
    assert cal.alpha_seconds == pytest.approx(12e-6, rel=0.02)
    assert cal.efficiency == pytest.approx(0.8, rel=0.01)
    assert cal.median_relative_error < 0.01


def _fixture_obs(name: str, algo: str) -> list[Observation]:
    run = parse_nccl_output((CASES / name).read_text())
    nodes = len({r.host for r in run.ranks})
    assert nodes == 2
    return observations_from_run(run, nodes, algo, op="all_reduce")


def test_real_fixtures_large_message_predictions_within_12_percent() -> None:
    """Calibrate on the A3 Mega run (2 x 8 H100; NCCL's hierarchical tree, the run's busbw of 339 GB/s
    exceeds the 200 GB/s node injection rate, which only a hierarchical algorithm can do), then
    predict the OCI run (2 x 8 A100, ring: its busbw of ~190 GB/s sits at the node rate) from that
    calibration alone. Tolerance: 12 % of the measured bus bandwidth at messages >= 1 GiB (the worst case,
    -10.4 % on OCI at 1 GiB, is the ring latency term charged at the network alpha; docs/model.md)."""
    a3 = _fixture_obs("a3mega_all_reduce_perf_2node_16xH100.txt", "tree")
    cal = calibrate(a3, FIXTURE_FABRIC)
    assert 0.75 < cal.efficiency < 0.95
    fitted = replace(FIXTURE_FABRIC, alpha_seconds=cal.alpha_seconds, efficiency=cal.efficiency)
    checked = 0
    for name, algo in (
        ("a3mega_all_reduce_perf_2node_16xH100.txt", "tree"),
        ("oci-hpc-oke_all_reduce_perf_2node_16xA100_rdma.txt", "ring"),
    ):
        run = parse_nccl_output((CASES / name).read_text())
        for row in run.rows:
            if row.placement == "out_of_place" and row.size_bytes >= GiB:
                assert row.busbw_bytes_per_second is not None
                pred = predict("all_reduce", row.size_bytes, 2, fitted, algo).busbw_bytes_per_second
                assert pred == pytest.approx(row.busbw_bytes_per_second, rel=0.12), (name, row.size_bytes)
                checked += 1
    assert checked == 4 + 3


def test_cli_json_and_calibration(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fabricd",
            "model",
            "--json",
            "--link-rate",
            "200G",
            "--nodes",
            "2,4",
            "--sizes",
            "1G",
            "--algo",
            "tree",
            "--calibrate-algo",
            "tree",
            "--calibrate",
            str(CASES / "a3mega_all_reduce_perf_2node_16xH100.txt"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = json.loads(out.stdout)
    assert doc["calibration"]["observations"] == len(_fixture_obs("a3mega_all_reduce_perf_2node_16xH100.txt", "tree"))
    assert [p["nodes"] for p in doc["predictions"]] == [2, 4]
    assert doc["predictions"][0]["busbw_bytes_per_second"] > doc["predictions"][1]["busbw_bytes_per_second"]
    bad = subprocess.run([sys.executable, "-m", "fabricd", "model", "--sizes", "huge"], capture_output=True, text=True)
    assert bad.returncode == 2 and "bad size" in bad.stderr
