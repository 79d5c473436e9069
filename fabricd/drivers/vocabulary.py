"""The neutral names: one name, unit, kind and meaning per quantity, whatever driver counts it.

Every driver table in ``fabricd.drivers`` maps raw driver names into this vocabulary and nothing
else (``tests/test_drivers.py`` checks names, units and kinds). Detectors, derived signals
(``fabricd.signal_table``), the catalogue, the dashboards and the report read these names, so a new
driver is a new table, never a change there. ``Reading.name`` carries the neutral name,
``Reading.counter`` the driver's own (so an engineer still finds it in ``ethtool -S`` or sysfs).

Units are the base units readings carry (``bytes``, ``seconds``, ``ticks``, ``packets``, ``frames``,
``events``); ``""`` is a count of something the name says (errors, requests, NAKs, queue pairs).
The Prometheus family is ``fabricd_<source>_<name>[_<unit suffix>]`` (``fabricd.naming``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricd.model import Kind


@dataclass(frozen=True, slots=True)
class Term:
    """One neutral name: what it counts (or measures), in which unit."""

    name: str
    unit: str
    meaning: str
    kind: Kind = Kind.COUNTER


def _terms(*terms: Term) -> dict[str, Term]:
    out: dict[str, Term] = {}
    for t in terms:
        if t.name in out:
            raise ValueError(f"neutral name {t.name!r} defined twice")
        out[t.name] = t
    return out


def _c(name: str, unit: str, meaning: str) -> Term:
    return Term(name, unit, meaning)


def _g(name: str, unit: str, meaning: str) -> Term:
    return Term(name, unit, meaning, Kind.GAUGE)


# --- NIC statistics (ethtool -S): per interface, or per priority (label ``priority``) ----------------
ETHTOOL = (
    _c("rx_pause_frames", "frames", "PFC/pause frames received"),
    _c("tx_pause_frames", "frames", "PFC/pause frames sent"),
    _c("rx_pause_duration", "seconds", "Time the port was paused by its peer (converted from us)"),
    _c("tx_pause_duration", "seconds", "Time the port paused its peer (converted from us)"),
    _c("rx_pause_transitions", "events", "Transitions into the paused state (receive side)"),
    _c("tx_pause_transitions", "events", "Transitions into the pausing state (transmit side)"),
    _c("tx_pause_storm_warning_events", "events", "Times PFC storm prevention warned (the NIC kept pausing)"),
    _c("tx_pause_storm_error_events", "events", "Times PFC storm prevention stopped sending pauses: drops may follow"),
    _c("rx_discards", "packets", "Received packets discarded by the port (mlx5 rx_discards_phy)"),
    _c("tx_discards", "packets", "Transmit packets discarded, head-of-line drops included (mlx5 tx_discards_phy)"),
    _c("rx_buffer_discards", "packets", "Packets dropped for lack of receive buffer, per priority"),
    _c("rx_congestion_discards", "packets", "Packets dropped by congestion control, per priority"),
    _c("rx_crc_errors", "frames", "Received frames with a bad FCS"),
    _c("rx_symbol_errors", "", "PHY symbol errors"),
    _c("rx_ecn_marked_packets", "packets", "Received packets marked ECN CE, per priority"),
    _c("link_down_events", "", "Link down events reported by the PHY (flaps)"),
    _c("rx_priority_bytes", "bytes", "Bytes received per priority"),
    _c("tx_priority_bytes", "bytes", "Bytes sent per priority"),
    _c("rx_priority_packets", "packets", "Packets received per priority"),
    _c("tx_priority_packets", "packets", "Packets sent per priority"),
    _c("rx_pause_resume_frames", "frames", "XON frames received: the peer lifted its pause (Intel ice, i40e)"),
    _c("tx_pause_resume_frames", "frames", "XON frames sent: the port lifted its pause of the peer (Intel ice, i40e)"),
    _c(
        "rx_priority_discards",
        "packets",
        "Received packets of one priority the port discarded (mlx5 rx_prioN_discards)",
    ),
    _c("rx_ring_discards", "packets", "Packets dropped on a host receive ring with no buffer posted (bnxt_en)"),
    _c("tx_ring_discards", "packets", "Packets dropped on a host transmit ring (bnxt_en)"),
    _c("rx_pcs_symbol_errors", "", "Symbol errors counted by the PCS layer (before FEC correction)"),
    _c("rx_fec_corrected_blocks", "", "FEC blocks received with errors the FEC corrected"),
    _c("rx_fec_uncorrectable_blocks", "", "FEC blocks received with errors the FEC could not correct: frames lost"),
    _c("rx_fec_corrected_bits", "", "Bits the FEC corrected (mlx5 rx_corrected_bits_phy)"),
)
# Both ethtool (mlx5 rx_out_of_buffer) and hw_counters (mlx5 out_of_buffer, bnxt_re rx_out_of_buffer).
SHARED = (
    _c(
        "rx_out_of_buffer",
        "packets",
        "Received packets dropped for lack of a receive buffer (an empty ring or no posted receive WQE)",
    ),
)

# --- InfiniBand PMA (counters/, counters_ext/): IBA vol. 1 16.1.3.5 PortCounters, 16.1.4 Extended ---
PMA = (
    _c("symbol_errors", "", "Minor link errors detected on a physical lane (sysfs symbol_error)"),
    _c("link_error_recovery", "", "Successful link error recovery procedures (link retrains)"),
    _c("link_downed", "", "Times the link failed its error recovery and went down (a flap)"),
    _c("port_receive_errors", "", "Received packets with errors (sysfs port_rcv_errors)"),
    _c("port_receive_remote_physical_errors", "", "Received packets marked with the EBP delimiter"),
    _c("port_receive_switch_relay_errors", "", "Received packets that could not be forwarded"),
    _c("port_transmit_discards", "", "Outbound packets discarded (port down or congested)"),
    _c("port_transmit_constraint_errors", "", "Outbound packets not sent due to partition/constraint checks"),
    _c("port_receive_constraint_errors", "", "Inbound packets discarded due to partition/constraint checks"),
    _c("local_link_integrity_errors", "", "Times local physical errors exceeded the threshold"),
    _c("excessive_buffer_overrun_errors", "", "Consecutive flow-control update periods with buffer overrun"),
    _c("vl15_dropped", "", "Incoming VL15 (subnet management) packets dropped"),
    _c(
        "port_transmit_wait",
        "ticks",
        "Ticks the port had data to send but sent none (XmitWait): the InfiniBand congestion signal",
    ),
    _c("port_transmit_data", "bytes", "Data bytes transmitted (sysfs port_xmit_data x 4 octets)"),
    _c("port_receive_data", "bytes", "Data bytes received (sysfs port_rcv_data x 4 octets)"),
    _c("port_transmit_packets", "packets", "Packets transmitted"),
    _c("port_receive_packets", "packets", "Packets received"),
    _c("unicast_transmit_packets", "packets", "Unicast packets transmitted"),
    _c("unicast_receive_packets", "packets", "Unicast packets received"),
    _c("multicast_transmit_packets", "packets", "Multicast packets transmitted"),
    _c("multicast_receive_packets", "packets", "Multicast packets received"),
    _c("port_receive_discards", "", "Received packets discarded"),
    _c("legacy_port_transmit_data", "bytes", "Data bytes transmitted, pre-4.5 counters_ext/"),
    _c("legacy_port_receive_data", "bytes", "Data bytes received, pre-4.5 counters_ext/"),
    _c("legacy_port_transmit_packets", "packets", "Packets transmitted, pre-4.5 counters_ext/"),
    _c("legacy_port_receive_packets", "packets", "Packets received, pre-4.5 counters_ext/"),
    _c("legacy_unicast_transmit_packets", "packets", "Unicast packets transmitted, pre-4.5 counters_ext/"),
    _c("legacy_unicast_receive_packets", "packets", "Unicast packets received, pre-4.5 counters_ext/"),
    _c("legacy_multicast_transmit_packets", "packets", "Multicast packets transmitted, pre-4.5 counters_ext/"),
    _c("legacy_multicast_receive_packets", "packets", "Multicast packets received, pre-4.5 counters_ext/"),
)

# --- InfiniBand port attributes (state, phys_state, rate files; not driver tables) ------------------
PORT = (
    _g("port_state", "", "Logical port state id (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER)"),
    _g("port_physical_state", "", "Physical port state id (5 LinkUp, 2 Polling, 3 Disabled, ...)"),
    _g("link_rate", "bytes_per_second", "Link signalling rate (sysfs rate, Gb/s x 125,000,000)"),
)

# --- RDMA driver counters (hw_counters/): congestion control (DCQCN roles: NP receives CE marks and
# sends CNPs, RP receives CNPs and slows down), transport loss and retransmission, errors, requests.
CONGESTION = (
    _c("rx_ecn_marked_roce_packets", "packets", "RoCEv2 packets received with ECN congestion experienced (CE)"),
    _c("tx_cnp_packets", "packets", "Congestion notification packets sent as notification point (we saw CE)"),
    _c("rx_cnp_packets", "packets", "CNPs received and acted on as reaction point (our flows were slowed down)"),
    _c("rx_cnp_ignored_packets", "packets", "CNPs received and ignored (should stay 0 with congestion control on)"),
)
TRANSPORT = (
    _c("out_of_sequence_packets", "packets", "Packets received out of sequence: an earlier one was lost"),
    _c("rx_sequence_error_naks", "", "Sequence-error NAKs received: the responder saw a gap, we retransmit"),
    _c("implied_nak_sequence_errors", "", "Implied NAK sequence errors (a later response arrived first)"),
    _c("local_ack_timeouts", "", "ACK timeouts on the requester (each one a retransmission)"),
    _c("rx_duplicate_requests", "", "Duplicate requests received (the peer retransmitted)"),
    _c("rx_rnr_naks", "", "Receiver-not-ready NAKs received (the peer had no receive posted)"),
    _c("transport_retries_exceeded", "", "Requests that exceeded the transport retry limit (QP to error)"),
    _c("rnr_retries_exceeded", "", "Requests that exceeded the RNR retry limit"),
    _c("roce_adaptive_retransmissions", "", "Adaptive retransmissions (RoCE)"),
    _c("roce_adaptive_retransmission_timeouts", "", "Adaptive retransmission timeouts (RoCE)"),
    _c("roce_slow_restarts", "", "RoCE slow restarts"),
    _c("roce_slow_restart_cnps", "", "CNPs sent during slow restart"),
    _c("roce_slow_restart_transitions", "", "Transitions to slow restart"),
    _c("rx_icrc_errors", "packets", "RoCE packets received with an invalid ICRC"),
    _c("missing_responses", "", "Responses that never arrived (requester)"),
)
ERRORS = (
    _c("requester_cqe_errors", "", "Requester completions with error"),
    _c("responder_cqe_errors", "", "Responder completions with error"),
    _c("requester_cqe_flush_errors", "", "Requester completions flushed with error"),
    _c("responder_cqe_flush_errors", "", "Responder completions flushed with error"),
    _c("responder_local_length_errors", "", "Responder local length errors (message longer than the buffer)"),
    _c("requester_remote_invalid_requests", "", "Remote invalid request errors seen by the requester"),
    _c("requester_remote_access_errors", "", "Remote access errors seen by the requester"),
    _c("responder_remote_access_errors", "", "Remote access errors seen by the responder"),
    _c("remote_operation_errors", "", "Remote operation errors seen by the requester"),
    _c("bad_response_errors", "", "Unexpected or malformed responses"),
    _c("unrecoverable_errors", "", "Unrecoverable transport errors"),
    _c("recoverable_errors", "", "Recoverable errors (bnxt_re fills it from the context's tx_bcast_pkts)"),
    _c("local_qp_operation_errors", "", "Local QP operation errors"),
    _c("local_protection_errors", "", "Local protection errors"),
    _c("memory_management_operation_errors", "", "Memory management operation errors"),
    _c("responder_max_exceeded_errors", "", "Requests beyond the responder's outstanding limit"),
    _c("responder_wqe_exceeded_errors", "", "Messages longer than the responder's receive WQE"),
    _c("responder_opcode_errors", "", "Responder opcode errors"),
    _c("responder_rx_invalid_rkey_errors", "", "Responder: invalid R_Key on receive"),
    _c("responder_rx_domain_errors", "", "Responder: protection domain mismatch on receive"),
    _c("responder_rx_permission_errors", "", "Responder: access not permitted on receive"),
    _c("responder_rx_range_errors", "", "Responder: address out of range on receive"),
    _c("responder_tx_invalid_rkey_errors", "", "Responder: invalid R_Key on transmit"),
    _c("responder_tx_domain_errors", "", "Responder: protection domain mismatch on transmit"),
    _c("responder_tx_permission_errors", "", "Responder: access not permitted on transmit"),
    _c("responder_tx_range_errors", "", "Responder: address out of range on transmit"),
    _c("responder_irrq_overflows", "", "Responder inbound read request queue overflows"),
    _c("responder_unsupported_opcode_errors", "", "Responder: unsupported opcode"),
    _c("responder_unaligned_atomic_errors", "", "Responder: unaligned atomic operation"),
    _c("responder_remote_invalidate_errors", "", "Responder: remote invalidate errors"),
    _c("responder_memory_errors", "", "Responder memory errors"),
    _c("responder_srq_errors", "", "Responder shared receive queue errors"),
    _c("responder_completion_errors", "", "Responder completion errors"),
    _c("responder_invalid_duplicate_rkey_errors", "", "Responder: invalid R_Key on a duplicate request"),
    _c("responder_wqe_format_errors", "", "Responder: malformed WQE"),
    _c("responder_cq_load_errors", "", "Responder: completion queue context load errors"),
    _c("responder_srq_load_errors", "", "Responder: shared receive queue context load errors"),
    _c("responder_tx_pci_errors", "", "Responder: PCIe errors on transmit"),
    _c("responder_rx_pci_errors", "", "Responder: PCIe errors on receive"),
)
TRAFFIC = (
    _c("rx_write_requests", "", "RDMA write requests received"),
    _c("rx_read_requests", "", "RDMA read requests received"),
    _c("rx_atomic_requests", "", "Atomic requests received"),
    _c("rx_send_requests", "", "Send requests received"),
    _c("rx_read_responses", "", "RDMA read responses received"),
    _c("rx_dct_connects", "", "DCT connect requests received"),
    _c("tx_write_requests", "", "RDMA write requests sent"),
    _c("tx_read_requests", "", "RDMA read requests sent"),
    _c("tx_atomic_requests", "", "Atomic requests sent"),
    _c("tx_send_requests", "", "Send requests sent"),
    _c("tx_read_responses", "", "RDMA read responses sent"),
    _c("rdma_rx_packets", "packets", "RDMA (RoCE) packets received, other traffic of the port excluded"),
    _c("rdma_rx_bytes", "bytes", "RDMA (RoCE) bytes received, other traffic of the port excluded"),
    _c("rdma_tx_packets", "packets", "RDMA (RoCE) packets sent, other traffic of the port excluded"),
    _c("rdma_tx_bytes", "bytes", "RDMA (RoCE) bytes sent, other traffic of the port excluded"),
    _c("rdma_rx_good_packets", "packets", "RDMA (RoCE) packets received without error"),
    _c("rdma_rx_good_bytes", "bytes", "RDMA (RoCE) bytes received without error"),
    _c("rdma_rx_errors", "packets", "RDMA (RoCE) packets received with errors"),
    _c("rdma_rx_discards", "packets", "RDMA (RoCE) packets discarded on receive"),
    _c("rdma_tx_errors", "packets", "RDMA (RoCE) packets that failed to transmit"),
    _c("rdma_tx_discards", "packets", "RDMA (RoCE) packets discarded on transmit"),
    _c("rx_unicast_packets", "packets", "Unicast packets received by the RDMA function's statistics context"),
    _c("rx_unicast_bytes", "bytes", "Unicast bytes received by the RDMA function's statistics context"),
    _c("tx_unicast_packets", "packets", "Unicast packets sent by the RDMA function's statistics context"),
    _c("tx_unicast_bytes", "bytes", "Unicast bytes sent by the RDMA function's statistics context"),
)
_OBJECTS = (
    ("pds", "protection domains"),
    ("ahs", "address handles"),
    ("qps", "queue pairs"),
    ("rc_qps", "RC queue pairs"),
    ("ud_qps", "UD queue pairs"),
    ("srqs", "shared receive queues"),
    ("cqs", "completion queues"),
    ("mrs", "memory regions"),
    ("mws", "memory windows"),
)
RESOURCES = (  # levels, not counters (bnxt_re active_qps is an atomic count of live objects)
    *(_g(f"active_{r}", "", f"{what[0].upper()}{what[1:]} in use now") for r, what in _OBJECTS),
    *(_g(f"watermark_{r}", "", f"Most {what} in use at once since the driver loaded") for r, what in _OBJECTS),
    _c("cq_resizes", "", "Completion queue resizes"),
    _c("doorbell_pacing_reschedules", "", "Doorbell pacing reschedules (the doorbell FIFO was filling)"),
    _c("doorbell_pacing_completions", "", "Doorbell pacing completions"),
    _c("doorbell_pacing_alerts", "", "Doorbell pacing alerts"),
    _g("doorbell_fifo_register", "", "Doorbell FIFO occupancy register (raw register value)"),
)

VOCABULARY: dict[str, Term] = _terms(
    *ETHTOOL, *SHARED, *PMA, *PORT, *CONGESTION, *TRANSPORT, *ERRORS, *TRAFFIC, *RESOURCES
)


def term(name: str) -> Term:
    """The term of a neutral name; KeyError names it when a table maps outside the vocabulary."""
    found = VOCABULARY.get(name)
    if found is None:
        raise KeyError(f"{name!r} is not a neutral name (fabricd.drivers.vocabulary)")
    return found
