"""Proof against a trusted peer: fabricd reads the same numbers as prometheus-node-exporter.

node_exporter's infiniband collector (via prometheus/procfs) reads the same sysfs files. For every
counter both read, on every captured tree (tests/cases/infiniband/*) and on 20 seeded random trees,
``fabricd collect --once --format json`` must report exactly node_exporter's value (bytes already
x4), and the same state id, physical state id, rate and device strings.

The metric-name -> sysfs-file table below is checked against node_exporter's own expected output for
its fixture (``cases/infiniband/node_exporter/e2e-output.prom``), so a wrong row cannot hide.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.infiniband import InfinibandCollector
from fabricd.collector import CollectorContext
from fabricd.sim.sysfstree import KINDS, random_tree
from tests.helpers import CASES, REPO, need_binary

CASE_DIR = CASES / "infiniband"
# node_exporter 1.5 drops the whole tree when one port lacks counters/ (bnxt_re): those cases are
# left out here, as the bnxt_re kind is from the random trees.
CASE_NAMES = sorted(
    p.name
    for p in CASE_DIR.iterdir()
    if (p / "sys").is_dir() and all((port / "counters").is_dir() for port in p.glob("sys/class/infiniband/*/ports/*"))
)
E2E = CASE_DIR / "node_exporter" / "e2e-output.prom"
# node_exporter 1.5 drops the whole tree when one port lacks counters/ (bnxt_re): leave those out.
PEER_KINDS = tuple(k for k in KINDS if k != "bnxt_re")
RANDOM_SEEDS = range(20)

# node_infiniband_<metric> -> the sysfs file it is read from.
COUNTER_FILES: dict[str, str] = {
    "excessive_buffer_overrun_errors_total": "excessive_buffer_overrun_errors",
    "link_downed_total": "link_downed",
    "link_error_recovery_total": "link_error_recovery",
    "local_link_integrity_errors_total": "local_link_integrity_errors",
    "multicast_packets_received_total": "multicast_rcv_packets",
    "multicast_packets_transmitted_total": "multicast_xmit_packets",
    "port_constraint_errors_received_total": "port_rcv_constraint_errors",
    "port_constraint_errors_transmitted_total": "port_xmit_constraint_errors",
    "port_data_received_bytes_total": "port_rcv_data",
    "port_data_transmitted_bytes_total": "port_xmit_data",
    "port_discards_received_total": "port_rcv_discards",
    "port_discards_transmitted_total": "port_xmit_discards",
    "port_errors_received_total": "port_rcv_errors",
    "port_packets_received_total": "port_rcv_packets",
    "port_packets_transmitted_total": "port_xmit_packets",
    "port_receive_remote_physical_errors_total": "port_rcv_remote_physical_errors",
    "port_receive_switch_relay_errors_total": "port_rcv_switch_relay_errors",
    "port_transmit_wait_total": "port_xmit_wait",
    "symbol_error_total": "symbol_error",
    "unicast_packets_received_total": "unicast_rcv_packets",
    "unicast_packets_transmitted_total": "unicast_xmit_packets",
    "vl15_dropped_total": "VL15_dropped",
    "legacy_data_received_bytes_total": "port_rcv_data_64",
    "legacy_data_transmitted_bytes_total": "port_xmit_data_64",
    "legacy_packets_received_total": "port_rcv_packets_64",
    "legacy_packets_transmitted_total": "port_xmit_packets_64",
    "legacy_multicast_packets_received_total": "port_multicast_rcv_packets",
    "legacy_multicast_packets_transmitted_total": "port_multicast_xmit_packets",
    "legacy_unicast_packets_received_total": "port_unicast_rcv_packets",
    "legacy_unicast_packets_transmitted_total": "port_unicast_xmit_packets",
    "state_id": "state",
    "physical_state_id": "phys_state",
    "rate_bytes_per_second": "rate",
}
# node_infiniband_info label -> fabricd device_info label
INFO_LABELS = {"board_id": "board_id", "firmware_version": "firmware_version", "hca_type": "hca_type"}

Key = tuple[str, str, str]  # (device, port, sysfs counter)


def parse_node_exporter(text: str) -> tuple[dict[Key, float], dict[str, dict[str, str]]]:
    """node_infiniband_* samples as {(device, port, sysfs file): value}, and info labels per device."""
    values: dict[Key, float] = {}
    infos: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.startswith("node_infiniband_"):
                continue
            metric = s.name.removeprefix("node_infiniband_")
            if metric == "info":
                infos[s.labels["device"]] = {k: s.labels[k] for k in INFO_LABELS}
                continue
            assert metric in COUNTER_FILES, f"node_exporter metric {metric} has no row in COUNTER_FILES"
            values[(s.labels["device"], s.labels["port"], COUNTER_FILES[metric])] = s.value
    return values, infos


def fabricd_from_json(rows: list[dict[str, Any]]) -> tuple[dict[Key, float], dict[str, dict[str, str]]]:
    values = {(r["device"], r["port"], r["counter"]): float(r["value"]) for r in rows if r["source"] == "infiniband"}
    infos = {r["device"]: dict(r["labels"]) for r in rows if r["source"] == "infiniband" and r["counter"] == "info"}
    return values, infos


def assert_same(
    peer: tuple[dict[Key, float], dict[str, dict[str, str]]], ours: tuple[dict[Key, float], dict[str, dict[str, str]]]
) -> None:
    peer_values, peer_infos = peer
    our_values, our_infos = ours
    missing = sorted(set(peer_values) - set(our_values))
    assert not missing, f"node_exporter reads {missing[:5]}, fabricd does not"
    wrong = {k: (v, our_values[k]) for k, v in peer_values.items() if our_values[k] != v}
    assert not wrong, f"(node_exporter, fabricd) differ: {dict(list(wrong.items())[:5])}"
    for device, labels in peer_infos.items():
        assert {k: our_infos[device][v] for k, v in INFO_LABELS.items()} == labels


# --- the table against node_exporter's own expected output (no binary needed) ------------------


def test_table_matches_node_exporter_e2e_output() -> None:
    text = E2E.read_text()
    peer = parse_node_exporter(text)
    ctx = CollectorContext(node="n", sysfs_root=CASE_DIR / "node_exporter" / "sys")
    ours = fabricd_from_json([r.to_json() for r in InfinibandCollector(ctx).scrape()])
    lines = [ln for ln in text.splitlines() if ln.startswith("node_infiniband_")]
    assert len(peer[0]) + len(peer[1]) == len(lines)  # every sample line was compared
    assert_same(peer, ours)


# --- the real node_exporter ---------------------------------------------------------------------


class NodeExporter:
    """A running prometheus-node-exporter whose --path.sysfs is a symlink we re-point per tree."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.sysfs = workdir / "sysfs"
        self.sysfs.mkdir()
        self.port = _free_port()
        self.log = (workdir / "node_exporter.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--path.sysfs={self.sysfs}",
                "--collector.disable-defaults",
                "--collector.infiniband",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def scrape(self, sys_root: Path) -> str:
        link = self.sysfs / "class"
        tmp = self.sysfs / "class.new"
        tmp.symlink_to(sys_root.resolve() / "class")
        os.replace(tmp, link)
        return self._get()

    def _get(self) -> str:
        for _ in range(200):  # bounded wait for the listener (~10 s)
            try:
                return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
            except httpx.TransportError:
                assert self.proc.poll() is None, "node_exporter exited"
                time.sleep(0.05)
        raise AssertionError("node_exporter did not answer")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def node_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeExporter]:
    ne = NodeExporter(need_binary("prometheus-node-exporter"), tmp_path_factory.mktemp("node_exporter"))
    try:
        yield ne
    finally:
        ne.stop()


def fabricd_collect(sys_root: Path) -> list[dict[str, Any]]:
    """What ``fabricd collect --once --format json`` prints for this sysfs root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICD_")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fabricd",
            "collect",
            "--once",
            "--format",
            "json",
            "--sysfs-root",
            str(sys_root),
            "--collector",
            "infiniband",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def _compare(node_exporter: NodeExporter, sys_root: Path) -> int:
    text = node_exporter.scrape(sys_root)
    assert 'node_scrape_collector_success{collector="infiniband"} 1' in text or "node_infiniband" not in text
    peer = parse_node_exporter(text)
    assert_same(peer, fabricd_from_json(fabricd_collect(sys_root)))
    return len(peer[0])


@pytest.mark.binaries
@pytest.mark.parametrize("case", CASE_NAMES)
def test_parity_on_captured_trees(node_exporter: NodeExporter, case: str) -> None:
    assert _compare(node_exporter, CASE_DIR / case / "sys") > 10  # node_exporter read this tree


@pytest.mark.binaries
@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_parity_on_random_trees(node_exporter: NodeExporter, tmp_path: Path, seed: int) -> None:
    devices = random_tree(tmp_path, random.Random(seed), kinds=PEER_KINDS)
    text = node_exporter.scrape(tmp_path)
    if devices:  # node_exporter must have accepted the tree, or the comparison proves nothing
        assert 'node_scrape_collector_success{collector="infiniband"} 1' in text
    compared = _compare(node_exporter, tmp_path)
    assert compared >= 3 * sum(len(d.ports) for d in devices.values())  # state, phys state, rate
