"""Broadcom NetXtreme-E/-C RoCE (``bnxt_re``) ``hw_counters/``: port level only, all 64 bit.

Source: ``drivers/infiniband/hw/bnxt_re/hw_counters.c``, ``bnxt_re_stat_descs`` (names) and the
``enum bnxt_re_hw_stats`` of ``hw_counters.h`` (order), torvalds/linux commit 73a98bc5a947. Values
are ``u64`` (``struct rdma_hw_stats``) filled by ``bnxt_re_ib_get_hw_stats``:

- ``active_*`` and ``watermark_*``: ``atomic_read`` of live objects and their high-water marks:
  levels, so gauges (``active_qps`` goes down when QPs are destroyed);
- traffic, errors and discards of the RoCE function's statistics context (``ctx_hw_stats``, le64);
- ``bnxt_re_copy_err_stats``: the firmware's RoCE error statistics (``bnxt_qplib_roce_stats``);
- ``bnxt_re_copy_ext_stats``: extended statistics, only on gen P5 and later chips
  (``BNXT_RE_NUM_EXT_COUNTERS``; older chips stop at ``oos_drop_count``, ``BNXT_RE_NUM_STD_COUNTERS``)
  and not on virtual functions: they carry ECN and CNP counts (``rx_ecn_marked_pkts``, ...);
- ``bnxt_re_copy_db_pacing_stats``: doorbell pacing, when the chip paces doorbells.

bnxt_re has no ``counters/`` folder (no PMA), so no XmitWait and no PortCounters errors.
``recoverable_errors`` is filled from the context's ``tx_bcast_pkts`` (sic, in the driver).
"""

from __future__ import annotations

from fabricd.drivers.ib import Counter, HwDriver
from fabricd.model import Kind

FILE = "drivers/infiniband/hw/bnxt_re/hw_counters.c"
_RES = f"{FILE}: bnxt_re_stat_descs, bnxt_re_ib_get_hw_stats (res_s)"
_CTX = f"{FILE}: bnxt_re_stat_descs, bnxt_re_ib_get_hw_stats (ctx_hw_stats)"
_ERR = f"{FILE}: bnxt_re_stat_descs, bnxt_re_copy_err_stats"
_EXT = f"{FILE}: bnxt_re_stat_descs, bnxt_re_copy_ext_stats (gen P5+ only)"
_PACING = f"{FILE}: bnxt_re_stat_descs, bnxt_re_copy_db_pacing_stats"
_OBJECTS = ("pds", "ahs", "qps", "rc_qps", "ud_qps", "srqs", "cqs", "mrs", "mws")
_NEWER = frozenset({"rc_qps", "ud_qps"})  # with the watermarks: added after the first release


def _gauge(raw: str, help: str, optional: bool) -> Counter:
    return Counter(raw, raw, "", 0, kind=Kind.GAUGE, help=help, source=_RES, optional=optional)


def _c(raw: str, name: str, source: str, help: str, unit: str = "", *, optional: bool = False) -> Counter:
    return Counter(raw, name, unit, 64, help=help, source=source, optional=optional)


RESOURCES: tuple[Counter, ...] = (
    *(_gauge(f"active_{o}", f"Live {o} (atomic count)", o in _NEWER) for o in _OBJECTS),
    *(_gauge(f"watermark_{o}", f"High-water mark of live {o}", True) for o in _OBJECTS),
    _c("resize_cq_cnt", "cq_resizes", _RES, "CQ resizes", optional=True),
)
CONTEXT: tuple[Counter, ...] = (
    _c("rx_pkts", "rx_unicast_packets", _CTX, "rx_ucast_pkts of the RoCE stats context", "packets"),
    _c("rx_bytes", "rx_unicast_bytes", _CTX, "rx_ucast_bytes of the RoCE stats context", "bytes"),
    _c("tx_pkts", "tx_unicast_packets", _CTX, "tx_ucast_pkts of the RoCE stats context", "packets"),
    _c("tx_bytes", "tx_unicast_bytes", _CTX, "tx_ucast_bytes of the RoCE stats context", "bytes"),
    _c("recoverable_errors", "recoverable_errors", _CTX, "Filled from tx_bcast_pkts by the driver"),
    _c("tx_roce_errors", "rdma_tx_errors", _CTX, "tx_error_pkts", "packets", optional=True),
    _c("tx_roce_discards", "rdma_tx_discards", _CTX, "tx_discard_pkts", "packets", optional=True),
    _c("rx_roce_errors", "rdma_rx_errors", _CTX, "rx_error_pkts", "packets"),
    _c("rx_roce_discards", "rdma_rx_discards", _CTX, "rx_discard_pkts", "packets"),
)
ERRORS: tuple[Counter, ...] = tuple(
    _c(raw, name, _ERR, help, "packets" if name.endswith("_packets") else "")
    for raw, name, help in (
        ("to_retransmits", "local_ack_timeouts", "Retransmissions after an ACK timeout"),
        ("seq_err_naks_rcvd", "rx_sequence_error_naks", "Sequence-error NAKs received"),
        ("max_retry_exceeded", "transport_retries_exceeded", "Retry limit exceeded"),
        ("rnr_naks_rcvd", "rx_rnr_naks", "RNR NAKs received"),
        ("missing_resp", "missing_responses", "Responses never received"),
        ("unrecoverable_err", "unrecoverable_errors", "Unrecoverable errors"),
        ("bad_resp_err", "bad_response_errors", "Bad responses"),
        ("local_qp_op_err", "local_qp_operation_errors", "Local QP operation errors"),
        ("local_protection_err", "local_protection_errors", "Local protection errors"),
        ("mem_mgmt_op_err", "memory_management_operation_errors", "Memory management operation errors"),
        ("remote_invalid_req_err", "requester_remote_invalid_requests", "Remote invalid request errors"),
        ("remote_access_err", "requester_remote_access_errors", "Remote access errors"),
        ("remote_op_err", "remote_operation_errors", "Remote operation errors"),
        ("dup_req", "rx_duplicate_requests", "Duplicate requests"),
        ("res_exceed_max", "responder_max_exceeded_errors", "Responder: outstanding limit exceeded"),
        ("res_length_mismatch", "responder_local_length_errors", "Responder: length mismatch"),
        ("res_exceeds_wqe", "responder_wqe_exceeded_errors", "Responder: message exceeds the WQE"),
        ("res_opcode_err", "responder_opcode_errors", "Responder: opcode errors"),
        ("res_rx_invalid_rkey", "responder_rx_invalid_rkey_errors", "Responder: invalid R_Key (rx)"),
        ("res_rx_domain_err", "responder_rx_domain_errors", "Responder: domain errors (rx)"),
        ("res_rx_no_perm", "responder_rx_permission_errors", "Responder: no permission (rx)"),
        ("res_rx_range_err", "responder_rx_range_errors", "Responder: range errors (rx)"),
        ("res_tx_invalid_rkey", "responder_tx_invalid_rkey_errors", "Responder: invalid R_Key (tx)"),
        ("res_tx_domain_err", "responder_tx_domain_errors", "Responder: domain errors (tx)"),
        ("res_tx_no_perm", "responder_tx_permission_errors", "Responder: no permission (tx)"),
        ("res_tx_range_err", "responder_tx_range_errors", "Responder: range errors (tx)"),
        ("res_irrq_oflow", "responder_irrq_overflows", "Responder: IRRQ overflows"),
        ("res_unsup_opcode", "responder_unsupported_opcode_errors", "Responder: unsupported opcodes"),
        ("res_unaligned_atomic", "responder_unaligned_atomic_errors", "Responder: unaligned atomics"),
        ("res_rem_inv_err", "responder_remote_invalidate_errors", "Responder: remote invalidate errors"),
        ("res_mem_err", "responder_memory_errors", "Responder: memory errors (res_mem_error)"),
        ("res_srq_err", "responder_srq_errors", "Responder: SRQ errors"),
        ("res_cmp_err", "responder_completion_errors", "Responder: completion errors"),
        ("res_invalid_dup_rkey", "responder_invalid_duplicate_rkey_errors", "Responder: invalid dup R_Key"),
        ("res_wqe_format_err", "responder_wqe_format_errors", "Responder: WQE format errors"),
        ("res_cq_load_err", "responder_cq_load_errors", "Responder: CQ load errors"),
        ("res_srq_load_err", "responder_srq_load_errors", "Responder: SRQ load errors"),
        ("res_tx_pci_err", "responder_tx_pci_errors", "Responder: PCI errors (tx)"),
        ("res_rx_pci_err", "responder_rx_pci_errors", "Responder: PCI errors (rx)"),
        # res_oos_drop_count, or the extended rx_out_of_sequence on gen P5+: the last standard counter.
        ("oos_drop_count", "out_of_sequence_packets", "Out-of-sequence packets dropped"),
    )
)
EXTENDED: tuple[Counter, ...] = tuple(
    _c(raw, name, _EXT, help, unit, optional=True)
    for raw, name, unit, help in (
        ("tx_atomic_req", "tx_atomic_requests", "", "Atomic requests sent"),
        ("tx_read_req", "tx_read_requests", "", "READ requests sent"),
        ("tx_read_resp", "tx_read_responses", "", "READ responses sent"),
        ("tx_write_req", "tx_write_requests", "", "WRITE requests sent"),
        ("tx_send_req", "tx_send_requests", "", "SEND requests sent"),
        ("tx_roce_only_pkts", "rdma_tx_packets", "packets", "RoCE packets sent"),
        ("tx_roce_only_bytes", "rdma_tx_bytes", "bytes", "RoCE bytes sent"),
        ("rx_atomic_req", "rx_atomic_requests", "", "Atomic requests received"),
        ("rx_read_req", "rx_read_requests", "", "READ requests received"),
        ("rx_read_resp", "rx_read_responses", "", "READ responses received"),
        ("rx_write_req", "rx_write_requests", "", "WRITE requests received"),
        ("rx_send_req", "rx_send_requests", "", "SEND requests received"),
        ("rx_roce_only_pkts", "rdma_rx_packets", "packets", "RoCE packets received"),
        ("rx_roce_only_bytes", "rdma_rx_bytes", "bytes", "RoCE bytes received"),
        ("rx_roce_good_pkts", "rdma_rx_good_packets", "packets", "RoCE packets received without error"),
        ("rx_roce_good_bytes", "rdma_rx_good_bytes", "bytes", "RoCE bytes received without error"),
        ("rx_out_of_buffer", "rx_out_of_buffer", "packets", "Drops for lack of a receive buffer"),
        ("tx_cnp_pkts", "tx_cnp_packets", "packets", "CNPs sent (tx_cnp)"),
        ("rx_cnp_pkts", "rx_cnp_packets", "packets", "CNPs received (rx_cnp)"),
        ("rx_ecn_marked_pkts", "rx_ecn_marked_roce_packets", "packets", "ECN CE-marked packets received"),
    )
)
PACING: tuple[Counter, ...] = (
    _c("pacing_reschedule", "doorbell_pacing_reschedules", _PACING, "Doorbell pacing reschedules", optional=True),
    _c("pacing_complete", "doorbell_pacing_completions", _PACING, "Doorbell pacing completions", optional=True),
    _c("pacing_alerts", "doorbell_pacing_alerts", _PACING, "Doorbell pacing alerts", optional=True),
    Counter(
        "db_fifo_register",
        "doorbell_fifo_register",
        "",
        0,
        kind=Kind.GAUGE,
        help="readl of the doorbell FIFO register",
        source=_PACING,
        optional=True,
    ),
)

DRIVER = HwDriver(
    name="bnxt_re",
    counters=(*RESOURCES, *CONTEXT, *ERRORS, *EXTENDED, *PACING),
    source=FILE,
    # The IB device's parent is the PCI function bound to bnxt_en (main.c: ibdev->dev.parent =
    # &rdev->en_dev->pdev->dev); the kernel names it bnxt_re<N> (ib_register_device "bnxt_re%d").
    kernel_drivers=("bnxt_en",),
    device_prefixes=("bnxt_re",),
)
