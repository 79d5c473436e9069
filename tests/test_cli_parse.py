"""``fabricd parse`` through the real CLI entry (``fabricd.cli.main`` and the installed console script):
every KIND, every format, stdin, the exit codes 0/1/2, and the JSON validated against docs/schemas/.
Expected values are read off the input text by hand."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fabricd.cli import main
from tests.helpers import CASES, REPO

FABRICD = Path(sys.executable).parent / "fabricd"
SCHEMAS = REPO / "docs" / "schemas"
MLX4 = CASES / "ethtool" / "blog_mlx4_cx3_pfc_prio3_grep" / "input.txt"
ABORT = CASES / "nccl" / "issue369_all_reduce_cuda_busy_abort" / "input.txt"
RCCL = CASES / "nccl" / "rccl_all_reduce_2node_16xMI308X_version_block" / "input.txt"
SRUN = CASES / "nccl" / "issue290_all_reduce_2node_16xH100_srun_label" / "input.txt"
MULTI = CASES / "nccl" / "assembled_three_runs_with_banners" / "input.txt"
PERF_E = CASES / "ibfabric" / "perfquery_E_0x7cfe9003009ce5b0_1" / "input.txt"
IBQ = CASES / "ibqueryerrors" / "linux_rdma_2021_sx6036_saturated" / "input.txt"
MAN = CASES / "ibfabric" / "ibnetdiscover_topology_rdma_core_man" / "input.txt"
OCI = CASES / "nccl" / "oci_all_reduce_2node_16xA100_rdma" / "input.txt"


def fabricd(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["parse", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def schema(kind: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMAS / f"parse-{kind}.schema.json").read_text()))


def test_nccl_failed_run_is_a_record_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = fabricd(capsys, "nccl", ABORT)
    assert json.loads(out) == [
        {
            "file": str(ABORT),
            "op": "all_reduce",
            "tool": "nccl-tests",
            "versions": {"tests": "2.17.8", "nccl": "2.26.6"},  # nccl-library=22606
            "status": "failed",
            "error": "cuda_failure: common.cu:1304 'CUDA-capable device(s) is/are busy or unavailable'",
            "nranks": 8,
            "avg_busbw_gbps": None,
            "rows": [],
        }
    ]
    assert (code, err) == (1, "")


def test_nccl_rccl_json_rows_match_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fabricd(capsys, "nccl", RCCL)
    [run] = json.loads(out)
    jsonschema.validate([run], schema("nccl"))
    assert code == 0
    assert {k: run[k] for k in ("op", "tool", "status", "error", "nranks", "avg_busbw_gbps")} == {
        "op": "all_reduce",  # "# Collective test starting: all_reduce_perf"
        "tool": "rccl-tests",
        "status": "ok",
        "error": None,
        "nranks": 16,
        "avg_busbw_gbps": 95.233,
    }
    assert run["versions"] == {
        "tests": "develop_deprecated:40b1b17",
        "rccl": "2.27.7-HEAD:0d2c4fd",
        "hip": "7.2.26015-fc0010cf6a",
        "rocm": "7.2.0.0-43-fc0010cf6a",
    }
    assert len(run["rows"]) == 22  # 1 KiB .. 2 GiB
    # "     1048576        262144     float     sum      -1    70.21   14.94   28.00      0    136.2    7.70   14.44      0"
    assert run["rows"][10] == {
        "size_bytes": 1048576,
        "count": 262144,
        "dtype": "float",
        "redop": "sum",
        "root": -1,
        "out_of_place": {"time_us": 70.21, "algbw_gbps": 14.94, "busbw_gbps": 28.0, "wrong": 0},
        "in_place": {"time_us": 136.2, "algbw_gbps": 7.7, "busbw_gbps": 14.44, "wrong": 0},
    }


def test_nccl_srun_label_csv_with_the_op_from_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fabricd(capsys, "nccl", SRUN, "--op", "all_reduce", "--format", "csv")
    lines = out.splitlines()
    assert lines[0] == (
        "file,op,tool,status,error,nranks,avg_busbw_gbps,size_bytes,count,dtype,redop,root,"
        "out_of_place_time_us,out_of_place_algbw_gbps,out_of_place_busbw_gbps,out_of_place_wrong,"
        "in_place_time_us,in_place_algbw_gbps,in_place_busbw_gbps,in_place_wrong"
    )
    assert len(lines) == 12  # header + 11 sizes (8 MiB .. 8 GiB)
    # " 0:      8388608       2097152     float     sum      -1    215.3   38.96   73.04    N/A    180.0 ..."
    assert (
        lines[1]
        == f"{SRUN},all_reduce,nccl-tests,ok,,16,142.735,8388608,2097152,float,sum,-1,215.3,38.96,73.04,,180.0,46.6,87.38,"
    )
    assert code == 0


def test_nccl_several_runs_in_one_file_and_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fabricd(capsys, "nccl", MULTI, "--format", "json")
    runs = json.loads(out)
    assert [(r["op"], r["avg_busbw_gbps"], len(r["rows"])) for r in runs] == [
        ("all_reduce", 68.4048, 34),
        ("all_gather", 58.2651, 34),
        ("alltoall", 58.6481, 34),
    ]
    assert runs[2]["rows"][0]["redop"] is None  # alltoall leaves the redop cell blank
    code, out, _ = fabricd(capsys, "nccl", ABORT, "--format", "table")
    error = "cuda_failure: common.cu:1304 'CUDA-capable device(s) is/are busy or unavailable'"
    # file op tool status error nranks, then avg_busbw_gbps and the 13 size columns empty ("-")
    assert out.splitlines()[1].split() == [
        str(ABORT),
        "all_reduce",
        "nccl-tests",
        "failed",
        *error.split(),
        "8",
        *["-"] * 14,
    ]
    assert code == 1


def test_nccl_op_from_the_file_name(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "all_gather_perf-4242.log"
    shutil.copy(SRUN, log)  # the text names no op
    code, out, _ = fabricd(capsys, "nccl", log)
    assert [r["op"] for r in json.loads(out)] == ["all_gather"]
    assert code == 0


def test_ethtool_mlx4_neutral_names_and_base_units(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = fabricd(capsys, "ethtool", MLX4, "--driver", "mlx4_en")
    doc = json.loads(out)
    jsonschema.validate(doc, schema("ethtool"))
    p3 = {"priority": "3"}
    assert doc == {
        "driver": "mlx4_en",
        "interface": "eth1",  # "# ethtool -S eth1 | grep prio_3"
        "stats": [
            {"raw": "rx_prio_3_packets", "name": "rx_priority_packets", "labels": p3, "value": 5152, "unit": "packets"},
            {"raw": "rx_prio_3_bytes", "name": "rx_priority_bytes", "labels": p3, "value": 424080, "unit": "bytes"},
            {
                "raw": "tx_prio_3_packets",
                "name": "tx_priority_packets",
                "labels": p3,
                "value": 328209,
                "unit": "packets",
            },
            {"raw": "tx_prio_3_bytes", "name": "tx_priority_bytes", "labels": p3, "value": 361752914, "unit": "bytes"},
            {"raw": "rx_pause_prio_3", "name": "rx_pause_frames", "labels": p3, "value": 14812, "unit": "frames"},
            {
                "raw": "rx_pause_duration_prio_3",
                "name": "rx_pause_duration",
                "labels": p3,
                "value": 0,
                "unit": "seconds",
            },
            {
                "raw": "rx_pause_transition_prio_3",
                "name": "rx_pause_transitions",
                "labels": p3,
                "value": 0,
                "unit": "events",
            },
            {"raw": "tx_pause_prio_3", "name": "tx_pause_frames", "labels": p3, "value": 0, "unit": "frames"},
            # 47848 us of pausing the peer
            {
                "raw": "tx_pause_duration_prio_3",
                "name": "tx_pause_duration",
                "labels": p3,
                "value": 0.047848,
                "unit": "seconds",
            },
            {
                "raw": "tx_pause_transition_prio_3",
                "name": "tx_pause_transitions",
                "labels": p3,
                "value": 7406,
                "unit": "events",
            },
        ],
    }
    assert (code, err) == (0, "")


def test_ethtool_a_pasted_session_with_ethtool_i_first_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    capture = CASES / "ethtool" / "ethq7_be2net_driver_info_then_stats_prompts" / "input.txt"
    code, out, err = fabricd(capsys, "ethtool", capture)
    doc = json.loads(out)
    assert (code, err, doc["driver"], doc["interface"], len(doc["stats"])) == (0, "", "be2net", "eth0", 37)


def test_ethtool_unmapped_stats_are_kept_and_bad_lines_are_failure_records(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    capture = tmp_path / "eth0.txt"
    capture.write_text("NIC statistics:\n     rx_prio3_discards: 12\n     tx_queue_0_pkts: 7\n     rx_crc_errors_ph\n")
    code, out, err = fabricd(capsys, "ethtool", capture, "--format", "csv")
    assert out == (
        "file,driver,interface,raw,name,labels,value,unit\n"
        f"{capture},,,rx_prio3_discards,rx_priority_discards,priority=3,12,packets\n"
        f"{capture},,,tx_queue_0_pkts,,,7,\n"
    )
    assert [json.loads(line) for line in err.splitlines()] == [
        {"file": str(capture), "line": 4, "error": "not an ethtool 'name: value' statistic", "text": "rx_crc_errors_ph"}
    ]
    assert code == 1


def test_perfquery_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fabricd(capsys, "perfquery", PERF_E)
    names = ("local_physical", "malformed_packet", "buffer_overrun", "dlid_mapping", "vl_mapping", "looping")
    assert json.loads(out) == {
        "ports": [
            {
                "guid": None,  # perfquery -E prints only the LID ("# PortRcvErrorDetails counters: Lid 1719 port 1")
                "port": 1,
                "lid": 1719,
                "name": None,
                "counters": {f"port_{n}_errors": 0 for n in names},
                "saturated": [],
            }
        ]
    }
    assert code == 0


def test_ibqueryerrors_csv_names_the_saturated_counters(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fabricd(capsys, "ibqueryerrors", IBQ, "--format", "csv")
    lines = out.splitlines()
    assert lines[:4] == [
        "guid,port,lid,name,counter,value,saturated",
        "0x7cfe900300179b31,1,,dl380g7 mlx4_0,vl15_dropped,14,False",
        "0x7cfe900300179b31,1,,dl380g7 mlx4_0,port_transmit_wait,4294967295,True",
        "0x7cfe900300179b32,2,,dl380g7 mlx4_0,port_transmit_wait,2,False",
    ]
    assert "0x0002c903006e29b0,5,,MF0;ys23ib4:SX6036/U1,symbol_errors,65535,True" in lines
    assert len(lines) == 1 + 44  # one row per [Name == value] item of the capture
    assert code == 0
    code, out, _ = fabricd(capsys, "ibqueryerrors", IBQ)
    jsonschema.validate(json.loads(out), schema("ibqueryerrors"))


def test_ibnetdiscover_topology_file_gives_the_topology_document(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = fabricd(capsys, "ibnetdiscover", MAN)
    doc = json.loads(out)
    jsonschema.validate(doc, schema("ibnetdiscover"))
    switches = {e["id"]: (e["tier"], e["guid"]) for e in doc["elements"] if e["type"] == "switch"}
    assert switches == {
        "ISR9024_Voltaire": ("leaf", "0x005442ba00003080"),
        "SW-6IB4_Voltaire": ("leaf", "0x0008f10400410015"),
    }
    # The man page's five CAs all describe themselves as "MT23108 InfiniHost Mellanox Technologies":
    # five HCAs, told apart by their GUIDs (one node per HCA, not one merged node).
    assert sorted((link["a"], link["b"]) for link in doc["links"]) == [
        ("ISR9024_Voltaire", "SW-6IB4_Voltaire"),
        ("MT23108-0x0008f10403960559/InfiniHost_Mellanox_Technologies", "ISR9024_Voltaire"),
        ("MT23108-0x0008f1040396055a/InfiniHost_Mellanox_Technologies", "ISR9024_Voltaire"),
        ("MT23108-0x0008f10403960985/InfiniHost_Mellanox_Technologies", "SW-6IB4_Voltaire"),
        ("MT23108-0x0008f10403961355/InfiniHost_Mellanox_Technologies", "ISR9024_Voltaire"),
        ("MT23108-0x005442b100004901/InfiniHost_Mellanox_Technologies", "SW-6IB4_Voltaire"),
    ]
    assert code == 0
    code, out, _ = fabricd(capsys, "ibnetdiscover", MAN, "--format", "table")
    assert out.splitlines()[1].split() == [
        "SW",
        "6",
        "22",
        "0x005442ba00003080",
        "ISR9024",
        "Voltaire",
        "4x",
        "SDR",
        "CA",
        "4",
        "1",
        "0x0008f10403961355",
        "MT23108",
        "InfiniHost",
        "Mellanox",
        "Technologies",
    ]


def test_ibtracert_json_and_one_csv_row_per_hop(capsys: pytest.CaptureFixture[str]) -> None:
    traces = CASES / "ibtracert"
    ok, down = traces / "ibsim_2_8_via_spine2" / "input.txt", traces / "ibsim_2_8_link_down" / "input.txt"
    code, out, err = fabricd(capsys, "ibtracert", str(ok), str(down))
    doc = json.loads(out)
    jsonschema.validate(doc, schema("ibtracert"))
    assert [(t["complete"], [h["desc"] for h in t["hops"]]) for t in doc] == [
        (True, ["ib-leaf-1", "ib-spine-2", "ib-leaf-2", "gpu-b02 mlx5_0"]),
        (False, []),
    ]
    assert code == 1  # the failed trace's ibwarn lines, one failure record each
    assert [json.loads(line)["line"] for line in err.splitlines()] == [1, 2, 3, 4, 5]
    code, out, _ = fabricd(capsys, "ibtracert", str(ok), "--format", "csv")
    assert out.splitlines()[:3] == [
        "file,hop,out_port,type,guid,port,lid,desc",
        f"{ok},0,,CA,0x0000000000100000,1,2,gpu-a01 mlx5_0",
        f"{ok},1,1,SW,0x0000000000200000,1,1,ib-leaf-1",
    ]
    assert code == 0


def test_sysfs_root_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    port = tmp_path / "sys" / "class" / "infiniband" / "mlx4_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    for name, text in {"rate": "40 Gb/sec (4X QDR)\n", "state": "4: ACTIVE\n", "link_layer": "InfiniBand\n"}.items():
        (port / name).write_text(text)
    (port / "counters" / "port_xmit_data").write_text("4631917\n")
    (port / "counters" / "port_xmit_wait").write_text("4294967295\n")
    (port / "counters" / "symbol_error").write_text("N/A (no PMA)\n")
    code, out, err = fabricd(capsys, "sysfs", tmp_path)
    doc = json.loads(out)
    jsonschema.validate(doc, schema("sysfs"))
    assert doc == {
        "devices": [
            {
                "device": "mlx4_0",
                "port": 1,
                "link_layer": "InfiniBand",
                "rate_bps": 40_000_000_000,
                "state": "ACTIVE",
                "counters": {"port_transmit_data": 4631917 * 4, "port_transmit_wait": 4294967295},
                "saturated": ["port_transmit_wait"],  # the 32-bit PortCounters field at all ones
            }
        ]
    }
    assert (code, err) == (0, "")


RAS_OK = CASES / "ras" / "issue1730_nccl2.26.2" / "status.txt"
RAS_RANGE = CASES / "ras" / "nccl_docs_ras_incomplete_ranks_per_node_range" / "status.txt"


def test_ras_status_report_one_record_per_file_and_a_group_with_errors_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = fabricd(capsys, "ras", RAS_OK)
    doc = json.loads(out)
    jsonschema.validate(doc, schema("ras"))
    assert doc == [
        {
            "file": str(RAS_OK),
            "nccl_version": "2.26.2",
            "groups": [
                {
                    "group": 0,
                    "comms": 1,
                    "nodes": 32,
                    "ranks_per_node": 8,
                    "ranks_per_comm": 256,
                    "ranks": 256,
                    "status": "RUNNING",
                    "errors": "OK",
                    "ranks_per_node_max": None,
                }
            ],
            "errors": [],
            "warnings": [],
        }
    ]
    assert (code, err) == (0, "")
    # "Ranks per node" 7-8 (the NCCL docs' INCOMPLETE example): a range, and an error, so exit 1
    code, out, err = fabricd(capsys, "ras", RAS_RANGE, "--format", "csv")
    assert out.splitlines() == [
        "file,nccl_version,group,comms,nodes,ranks_per_node,ranks_per_node_max,ranks_per_comm,ranks,status,errors",
        f"{RAS_RANGE},,0,1,4,7,8,32,32,RUNNING,INCOMPLETE",
    ]
    assert (code, err) == (1, "")


def test_ras_a_dead_process_with_no_communicator_left_exits_1_without_a_not_a_report_record(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = CASES / "ras" / "nccl_example08_2.30.7_exit_dead_no_comm_data" / "status.txt"
    code, out, err = fabricd(capsys, "ras", dead)
    doc = json.loads(out)
    jsonschema.validate(doc, schema("ras"))
    assert (doc[0]["groups"], doc[0]["errors"][0], code, err) == ([], "DEAD", 1, "")
    # the table pasted without its title: its group is read, its MISMATCH is the failure
    table = CASES / "ras" / "nccl_example08_2.30.7_sleep_mismatch_table_only" / "status.txt"
    code, out, err = fabricd(capsys, "ras", table, "--format", "csv")
    assert out.splitlines()[1:] == [f"{table},,0,1,2,4,,8,8,RUNNING,MISMATCH"]
    assert (code, err) == (1, "")


def test_ras_on_something_else_is_a_failure_record_not_an_empty_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = fabricd(capsys, "ras", MLX4)
    assert json.loads(out) == [{"file": str(MLX4), "nccl_version": None, "groups": [], "errors": [], "warnings": []}]
    (record,) = [json.loads(line) for line in err.splitlines()]
    assert record == {
        "file": str(MLX4),
        "line": 0,
        "error": "not an NCCL RAS status report (ncclras): this is ethtool -S statistics; "
        "read it with `fabricd parse ethtool`",
        "text": "# ethtool -S eth1 | grep prio_3",
    }
    assert code == 1


def test_nccl_given_a_ras_report_is_a_failed_run_naming_parse_ras(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = fabricd(capsys, "nccl", RAS_OK)
    doc = json.loads(out)
    jsonschema.validate(doc, schema("nccl"))
    assert doc == [
        {
            "file": str(RAS_OK),
            "op": None,
            "tool": "nccl-tests",
            "versions": {"nccl": "2.26.2"},  # "NCCL version 2.26.2 compiled with CUDA 12.4"
            "status": "failed",  # was "truncated", error "aborted: no result table"
            "error": "other_kind: not NCCL-tests output: this is an NCCL RAS status report (ncclras); "
            "read it with `fabricd parse ras`",
            "nranks": None,
            "avg_busbw_gbps": None,
            "rows": [],
        }
    ]
    assert (code, err) == (1, "")
    # a report pasted from its table's header only (NVIDIA's RAS example) is recognized too
    table = CASES / "ras" / "nccl_example08_2.30.7_sleep_mismatch_table_only" / "status.txt"
    code, out, err = fabricd(capsys, "nccl", table)
    assert json.loads(out)[0]["error"].endswith(
        "this is an NCCL RAS status report (ncclras); read it with `fabricd parse ras`"
    )


def test_ras_given_an_nccl_tests_log_fails_naming_parse_nccl(capsys: pytest.CaptureFixture[str]) -> None:
    # Its "NCCL version 2.25.1+cuda12.8" line was read as a report's version: exit 0, no group, no failure.
    code, out, err = fabricd(capsys, "ras", OCI)
    assert json.loads(out) == [{"file": str(OCI), "nccl_version": None, "groups": [], "errors": [], "warnings": []}]
    (record,) = [json.loads(line) for line in err.splitlines()]
    assert record["error"] == (
        "not an NCCL RAS status report (ncclras): this is NCCL-tests output; read it with `fabricd parse nccl`"
    )
    assert code == 1


def test_perfquery_given_an_ethtool_dump_is_one_failure_not_one_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = fabricd(capsys, "perfquery", MLX4, PERF_E)
    assert [p["port"] for p in json.loads(out)["ports"]] == [1]  # the perfquery file still parses
    assert [json.loads(line) for line in err.splitlines()] == [
        {
            "file": str(MLX4),
            "line": 0,
            "error": "not perfquery output: this is ethtool -S statistics; read it with `fabricd parse ethtool`",
            "text": "# ethtool -S eth1 | grep prio_3",
        }
    ]
    assert code == 1


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as bad_kind:
        main(["parse", "iblinkinfo", str(MAN)])
    with pytest.raises(SystemExit) as bad_format:
        main(["parse", "nccl", str(ABORT), "--format", "yaml"])
    assert (bad_kind.value.code, bad_format.value.code) == (2, 2)
    capsys.readouterr()
    code, out, err = fabricd(capsys, "nccl", tmp_path / "missing.log")
    assert (code, out, err) == (2, "", f"fabricd parse: {tmp_path / 'missing.log'}: No such file or directory\n")
    code, out, err = fabricd(capsys, "sysfs", MAN)
    assert (code, out, err) == (2, "", f"fabricd parse: {MAN}: not a folder (sysfs takes a root folder)\n")


def test_the_console_script_reads_stdin() -> None:
    proc = subprocess.run(
        [str(FABRICD), "parse", "perfquery", "-", "--format", "table"],
        input=PERF_E.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.stdout.splitlines()[:2] == [
        "guid  port  lid   name  counter                       value  saturated",
        "-     1     1719  -     port_local_physical_errors    0      False",
    ]
    assert (proc.returncode, proc.stderr) == (0, "")
    empty = subprocess.run(
        [str(FABRICD), "parse", "ibnetdiscover", "-"], input="", capture_output=True, text=True, timeout=60
    )
    assert json.loads(empty.stdout) == {"version": 1, "link_layer": "infiniband", "elements": [], "links": []}
    assert [json.loads(line) for line in empty.stderr.splitlines()] == [
        {"file": "-", "line": 0, "error": "no ibnetdiscover port lines (neither -p nor topology format)", "text": ""}
    ]
    assert empty.returncode == 1


def test_sysfs_on_the_procfs_tree_matches_what_procfs_expects(capsys: pytest.CaptureFixture[str]) -> None:
    # prometheus/procfs's own test values for this tree (../shared/fixtures/README.md §1)
    code, out, _ = fabricd(capsys, "sysfs", CASES / "infiniband" / "procfs" / "sys")
    doc = json.loads(out)
    jsonschema.validate(doc, schema("sysfs"))
    ports = {(d["device"], d["port"]): d for d in doc["devices"]}
    assert sorted(ports) == [("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)]
    hfi = ports[("hfi1_0", 1)]
    assert (hfi["rate_bps"], hfi["state"]) == (100_000_000_000, "ACTIVE")  # "100 Gb/sec (4X EDR)"
    assert (hfi["counters"]["port_receive_data"], hfi["counters"]["port_transmit_data"]) == (
        1380366808104,
        1094233306172,
    )
    assert ports[("mlx4_0", 2)]["counters"]["port_transmit_wait"] == 3846
    assert ports[("mlx5_0", 1)]["counters"]["port_transmit_data"] == 11523046035392
    assert code == 0
