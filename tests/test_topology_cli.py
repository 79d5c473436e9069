"""``fabricd topology discover|show|push|diff`` on public ibnetdiscover captures and real lldpd JSON,
against a real central (issue 16 §1). The document is checked against docs/topology.schema.json."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fabricd.cli import main
from fabricd.server import db
from fabricd.server.store.storage import Storage
from tests.helpers import CASES, REPO
from tests.support.server import ServerProcess

SCHEMA = json.loads((REPO / "docs" / "topology.schema.json").read_text())
IB = CASES / "ibfabric"
MAN = IB / "ibnetdiscover_topology_rdma_core_man" / "input.txt"  # the topology-file format
PORTS = IB / "ibnetdiscover_test" / "input.txt"  # the -p format


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def discover(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code, out, err = run(capsys, "topology", "discover", *args)
    assert (code, err) == (0, "")
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    return doc


def links(doc: dict[str, Any]) -> set[tuple[str, str, tuple[tuple[str, str], ...]]]:
    return {(x["a"], x["b"], tuple((c["a_port"], c["b_port"]) for c in x.get("cables", []))) for x in doc["links"]}


def test_discover_reads_the_topology_file_format(capsys: pytest.CaptureFixture[str]) -> None:
    doc = discover(capsys, "--ibnetdiscover", str(MAN))
    assert {(e["id"], e["tier"]) for e in doc["elements"] if e["type"] == "switch"} == {
        ("ISR9024_Voltaire", "leaf"),
        ("SW-6IB4_Voltaire", "leaf"),
    }
    # Every CA describes itself "MT23108 InfiniHost Mellanox Technologies": one id per port, by its guid.
    hca = "InfiniHost_Mellanox_Technologies"
    assert links(doc) == {
        (f"MT23108-0x0008f10403961355/{hca}", "ISR9024_Voltaire", (("1", "22"),)),
        (f"MT23108-0x0008f1040396055a/{hca}", "ISR9024_Voltaire", (("2", "8"),)),
        (f"MT23108-0x0008f10403960559/{hca}", "ISR9024_Voltaire", (("1", "12"),)),
        (f"MT23108-0x0008f10403960985/{hca}", "SW-6IB4_Voltaire", (("1", "6"),)),
        (f"MT23108-0x005442b100004901/{hca}", "SW-6IB4_Voltaire", (("1", "4"),)),
        ("ISR9024_Voltaire", "SW-6IB4_Voltaire", (("6", "3"), ("10", "1"))),
    }
    assert (doc["version"], doc["link_layer"]) == (1, "infiniband")


def test_discover_reads_the_ports_format_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(PORTS.read_text()))
    doc = discover(capsys, "--ibnetdiscover", "-")
    assert links(doc) == {
        ("o0001/HCA-1", "ib-i1l1s01", (("1", "10"),)),
        ("o0002/HCA-1", "ib-i1l1s01", (("1", "11"),)),
        ("p0001/HCA-1", "ib-i4l1s01", (("1", "35"),)),
        ("ib-i1l1s01", "ib-i1l2s01", (("1", "1"),)),
    }
    tiers = {e["id"]: e["tier"] for e in doc["elements"] if e["type"] == "switch"}
    assert tiers == {"ib-i1l1s01": "leaf", "ib-i4l1s01": "leaf", "ib-i1l2s01": "spine", "ib-i7l2s01": "spine"}


def test_discover_refuses_what_is_not_ibnetdiscover_output(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "junk.txt").write_text("hello\n")
    code, out, err = run(capsys, "topology", "discover", "--ibnetdiscover", str(tmp_path / "junk.txt"))
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == (
        "fabricd: no ports in the ibnetdiscover output (is it ibnetdiscover's -p or topology output?)"
    )
    code, _, err = run(capsys, "topology", "discover", "--ibnetdiscover", str(tmp_path / "missing.txt"))
    assert (code, err) == (1, f"fabricd: {tmp_path / 'missing.txt'}: No such file or directory\n")
    code, _, err = run(capsys, "topology", "discover")
    assert (code, err) == (
        2,
        "fabricd: topology discover needs --ibnetdiscover FILE, --run, --lldp NODE=FILE or --central\n",
    )


def test_discover_from_lldp_of_both_ends(capsys: pytest.CaptureFixture[str]) -> None:
    lldp = CASES / "lldp"
    doc = discover(
        capsys,
        "--lldp",
        f"gpu-a17={lldp / 'lldpctl_two_neighbours.json'}",
        "--lldp",
        f"ib-leaf-3={lldp / 'lldpctl_switch_side.json'}",
    )
    assert links(doc) == {
        ("gpu-a17/tpa0", "ib-leaf-3", (("tpa0", "tpb0"),)),
        ("gpu-a17/tpa1", "ib-leaf-3", (("tpa1", "tpb1"),)),
    }
    assert [(e["id"], e["type"]) for e in doc["elements"]] == [
        ("ib-leaf-3", "switch"),  # it routes (LLDP capability Router): a switch, from what it says
        ("gpu-a17/tpa0", "hca_port"),
        ("gpu-a17/tpa1", "hca_port"),
    ]


def test_show_renders_switches_hosts_and_links_with_ports(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = discover(capsys, "--ibnetdiscover", str(PORTS))
    (tmp_path / "t.json").write_text(json.dumps(doc))
    code, out, _ = run(capsys, "topology", "show", str(tmp_path / "t.json"))
    assert code == 0
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    assert rows == [
        ["ib-i1l1s01", "leaf", "0x7cfe9003009ce5b0", "3"],
        ["ib-i4l1s01", "leaf", "0x506b4b03005c2740", "1"],
        ["ib-i1l2s01", "spine", "0x7cfe900300b07320", "1"],
        ["ib-i7l2s01", "spine", "0x08c0eb0300add20e", "0"],
        ["o0001", "HCA-1"],
        ["o0002", "HCA-1"],
        ["p0001", "HCA-1"],
        ["o0001/HCA-1", "1", "ib-i1l1s01", "10"],
        ["o0002/HCA-1", "1", "ib-i1l1s01", "11"],
        ["p0001/HCA-1", "1", "ib-i4l1s01", "35"],
        ["ib-i1l1s01", "1", "ib-i1l2s01", "1"],
    ]


# --- against a real central ---------------------------------------------------------------------------


class Central:
    def __init__(self, server: ServerProcess, admin: str) -> None:
        self.server, self.admin = server, admin

    def run(self, capsys: pytest.CaptureFixture[str], verb: str, *args: str) -> tuple[int, str, str]:
        return run(capsys, "topology", verb, *args, "--server", self.server.url, "--token", self.admin)


@pytest.fixture(scope="module")
def central(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Central]:
    data: Path = tmp_path_factory.mktemp("topology") / "data"
    engine = db.make_engine(f"sqlite:///{data / 'fabricd.db'}")
    db.prepare(engine)
    admin = Storage.open(engine).tokens.create("admin", time.time(), note="topology")[1]
    engine.dispose()
    server = ServerProcess(data, extra=["--log-level", "warning"]).start()
    try:
        yield Central(server, admin)
    finally:
        server.stop()


@pytest.mark.slow
def test_push_show_and_diff_against_the_central(
    central: Central, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = discover(capsys, "--ibnetdiscover", str(PORTS))
    path = tmp_path / "fabric.json"
    path.write_text(json.dumps(doc))
    code, out, _ = central.run(capsys, "diff", str(path))  # nothing stored yet: all of it is new
    assert (code, out.splitlines()) == (
        0,
        [
            "switch_added    ib-i1l1s01  leaf",
            "switch_added    ib-i1l2s01  spine",
            "switch_added    ib-i4l1s01  leaf",
            "switch_added    ib-i7l2s01  spine",
            "host_added      o0001  HCA-1",
            "host_added      o0002  HCA-1",
            "host_added      p0001  HCA-1",
            "link_added      ib-i1l1s01~ib-i1l2s01  1-1",
            "link_added      o0001/HCA-1~ib-i1l1s01  1-10",
            "link_added      o0002/HCA-1~ib-i1l1s01  1-11",
            "link_added      p0001/HCA-1~ib-i4l1s01  1-35",
        ],
    )
    assert central.run(capsys, "push", str(path)) == (0, "topology stored: 7 elements, 4 links\n", "")
    assert central.run(capsys, "diff", str(path)) == (0, "no change\n", "")
    code, out, _ = central.run(capsys, "show", "--json")
    assert json.loads(out)["links"] == doc["links"]

    changed = copy.deepcopy(doc)
    changed["elements"].append({"id": "ib-i9l1s01", "type": "switch", "tier": "leaf", "guid": "0x1"})
    for link in changed["links"]:
        if link["a"] == "o0002/HCA-1":
            link["b"], link["cables"] = "ib-i9l1s01", [{"a_port": "1", "b_port": "1"}]
        if link["a"] == "ib-i1l1s01":
            link["cables"] = [{"a_port": "2", "b_port": "1"}]
    changed["links"] = [x for x in changed["links"] if x["a"] != "p0001/HCA-1"]
    path.write_text(json.dumps(changed))
    code, out, _ = central.run(capsys, "diff", str(path), "--json")
    assert (code, json.loads(out)) == (
        0,
        [
            {"kind": "switch_added", "element": "ib-i9l1s01", "detail": "leaf"},
            {"kind": "recabled", "element": "o0002/HCA-1", "detail": "was on ib-i1l1s01, now on ib-i9l1s01"},
            {"kind": "link_removed", "element": "p0001/HCA-1~ib-i4l1s01", "detail": "1-35"},
            {"kind": "cable_changed", "element": "ib-i1l1s01~ib-i1l2s01", "detail": "ports 1-1 -> 2-1"},
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (
            lambda d: d["links"].append({"a": "o0001/HCA-1", "b": "ib-nowhere"}),
            "topology: links[4] (o0001/HCA-1~ib-nowhere): unknown end ib-nowhere (declare it in elements)",
        ),
        (lambda d: d.update(version=2), "topology: version 2: this fabricd reads topology documents of version 1"),
        (
            lambda d: d["elements"].append(dict(d["elements"][0])),
            "topology: elements[7]: 'ib-i1l1s01' is declared twice",
        ),
        (
            lambda d: d["links"].append({"a": "o0001/HCA-1", "b": "ib-i4l1s01"}),
            "topology: links[4] (o0001/HCA-1~ib-i4l1s01): o0001/HCA-1 is already cabled to ib-i1l1s01"
            " (one HCA port, one cable)",
        ),
    ],
)
def test_push_of_an_invalid_document_is_refused_with_the_reason(
    central: Central, capsys: pytest.CaptureFixture[str], tmp_path: Path, edit: Any, reason: str
) -> None:
    doc = discover(capsys, "--ibnetdiscover", str(PORTS))
    assert central.run(capsys, "push", _write(tmp_path, doc))[0] == 0
    bad = copy.deepcopy(doc)
    edit(bad)
    code, out, err = central.run(capsys, "push", _write(tmp_path, bad))
    assert (code, out, err) == (1, "", f"fabricd: server said 422 invalid_request: {reason}\n")
    code, out, _ = central.run(capsys, "show", "--json")
    assert json.loads(out)["links"] == doc["links"]  # the last good one stays


def _write(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    return str(path)
