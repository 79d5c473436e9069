"""The metric families of the jobs and inspector collectors and of the central's join, for ``fabricd.catalogue``.

Gauges all: (name, help, labels on every series, labels on some). Jobs are info series to join on
(``* on(node) group_left(job_id) fabricd_job_info``), never a label on every sample (docs/jobs.md).
"""

from __future__ import annotations

JOB = ("node", "job_id", "user", "name", "scheduler")
AFFINITY = ("node", "gpu", "gpu_address", "hca", "path", "numa_node")
RAS = ("node", "group", "status", "errors")
RANK = ("node", "collective", "job_id", "comm", "rank")  # NCCL Inspector: one rank of a communicator

JOB_FAMILIES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    (
        "fabricd_job_info",
        "A job running on the node (value 1): its GPUs and their HCAs",
        JOB,
        ("gpus", "hcas", "namespace", "pod"),
    ),
    ("fabricd_job_running", "Jobs running on the node, as its jobs collector last saw them", ("node",), ()),
    ("fabricd_job_files_invalid", "Job files the agent could not read (each logged once)", ("node",), ()),
    ("fabricd_job_files_stale", "Job files whose job has no live process (a missed epilog)", ("node",), ()),
    (
        "fabricd_gpu_nic_affinity_info",
        "The HCA nearest each GPU on the PCIe tree (value 1); path as nvidia-smi topo: PIX, PXB, PHB, NODE, SYS",
        AFFINITY,
        (),
    ),
    ("fabricd_inspector_exec_time_seconds", "The rank's last collective: execution time (NCCL Inspector)", RANK, ()),
    ("fabricd_inspector_busbw_bytes_per_second", "The rank's last collective: bus bandwidth", RANK, ()),
    ("fabricd_inspector_algbw_bytes_per_second", "The rank's last collective: algorithm bandwidth", RANK, ()),
    ("fabricd_inspector_message_size_bytes", "The rank's last collective: message size", RANK, ()),
    ("fabricd_inspector_communicator_ranks", "Ranks of the rank's communicator (0: not said)", RANK, ()),
    ("fabricd_inspector_communicator_nodes", "Nodes of the rank's communicator (0: not said)", RANK, ()),
    ("fabricd_ras_group_ranks", "Ranks in a communicator group, by status and errors (NCCL RAS)", RAS, ()),
    ("fabricd_ras_errors_reported", "Lines in the Errors section of the last NCCL RAS report", ("node",), ()),
    ("fabricd_ras_warnings_reported", "Lines in the Warnings section of the last NCCL RAS report", ("node",), ()),
    ("fabricd_inspector_records_invalid", "NCCL Inspector records that could not be read (logged)", ("node",), ()),
)
