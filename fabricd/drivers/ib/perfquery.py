"""``perfquery`` / ``ibqueryerrors`` field names: the IBA PMA attributes read over MADs, by their
libibmad names (rdma-core ``libibmad/fields.c``: ``PortXmitData``, ``SymbolErrorCounter``, ...).

Neutral names match the ``counters/`` table (``fabricd.drivers.ib.pma``), so a switch port read by
perfquery and an HCA port read from sysfs land in the same series names.
"""

from __future__ import annotations

from dataclasses import dataclass

WORD_BYTES = 4  # PortXmitData/PortRcvData count 4-octet words (IBA 16.1.4.11; DOMAIN.md)


@dataclass(frozen=True, slots=True)
class PerfSpec:
    name: str
    unit: str = ""
    width: int = 64
    saturates: bool = False
    scale: int = 1


# perfquery -x prints PortCountersExtended. On ports whose CapabilityMask2 has
# IsAdditionalPortCountersExtendedSupported it also prints the error counters after CounterSelect2,
# and those are the 64-bit fields of the extended attribute (IBA 1.3 16.1.4.11), not the narrow
# saturating PortCounters ones. Neutral names match the infiniband (sysfs) collector.
PERFQUERY_X: dict[str, PerfSpec] = {
    "PortXmitData": PerfSpec("port_transmit_data", "bytes", scale=WORD_BYTES),
    "PortRcvData": PerfSpec("port_receive_data", "bytes", scale=WORD_BYTES),
    "PortXmitPkts": PerfSpec("port_transmit_packets", "packets"),
    "PortRcvPkts": PerfSpec("port_receive_packets", "packets"),
    "PortUnicastXmitPkts": PerfSpec("unicast_transmit_packets", "packets"),
    "PortUnicastRcvPkts": PerfSpec("unicast_receive_packets", "packets"),
    "PortMulticastXmitPkts": PerfSpec("multicast_transmit_packets", "packets"),
    "PortMulticastRcvPkts": PerfSpec("multicast_receive_packets", "packets"),
    "SymbolErrorCounter": PerfSpec("symbol_errors"),
    "LinkErrorRecoveryCounter": PerfSpec("link_error_recovery"),
    "LinkDownedCounter": PerfSpec("link_downed"),
    "PortRcvErrors": PerfSpec("port_receive_errors"),
    "PortRcvRemotePhysicalErrors": PerfSpec("port_receive_remote_physical_errors"),
    "PortRcvSwitchRelayErrors": PerfSpec("port_receive_switch_relay_errors"),
    "PortXmitDiscards": PerfSpec("port_transmit_discards"),
    "PortXmitConstraintErrors": PerfSpec("port_transmit_constraint_errors"),
    "PortRcvConstraintErrors": PerfSpec("port_receive_constraint_errors"),
    "LocalLinkIntegrityErrors": PerfSpec("local_link_integrity_errors"),
    "ExcessiveBufferOverrunErrors": PerfSpec("excessive_buffer_overrun_errors"),
    "VL15Dropped": PerfSpec("vl15_dropped"),
    # Ticks with data to send and no credit: the IB congestion signal (DOMAIN.md).
    "PortXmitWait": PerfSpec("port_transmit_wait", "ticks"),
    "QP1Dropped": PerfSpec("qp1_dropped"),
}
# PortRcvErrorDetails (perfquery -E): 16-bit PMA counters, which stop at all ones (IBA 16.1.4.3).
PERFQUERY_E: dict[str, PerfSpec] = {
    raw: PerfSpec(name, "", 16, True)
    for raw, name in {
        "PortLocalPhysicalErrors": "port_local_physical_errors",
        "PortMalformedPktErrors": "port_malformed_packet_errors",
        "PortBufferOverrunErrors": "port_buffer_overrun_errors",
        "PortDLIDMappingErrors": "port_dlid_mapping_errors",
        "PortVLMappingErrors": "port_vl_mapping_errors",
        "PortLoopingErrors": "port_looping_errors",
    }.items()
}
# Without IsAdditionalPortCountersExtendedSupported (CapabilityMask2 bit 1) the extended attribute
# has no error counters and perfquery fills them from the base PortCounters, whose fields are narrow
# and stop at all ones (IBA 16.1.3.5; widths as in DOMAIN.md).
IS_ADDL_PORT_CTR_EXT_SUP = 0x2
PORT_COUNTERS_WIDTHS: dict[str, int] = {
    "SymbolErrorCounter": 16,
    "LinkErrorRecoveryCounter": 8,
    "LinkDownedCounter": 8,
    "PortRcvErrors": 16,
    "PortRcvRemotePhysicalErrors": 16,
    "PortRcvSwitchRelayErrors": 16,
    "PortXmitDiscards": 16,
    "PortXmitConstraintErrors": 8,
    "PortRcvConstraintErrors": 8,
    "LocalLinkIntegrityErrors": 4,
    "ExcessiveBufferOverrunErrors": 4,
    "VL15Dropped": 16,
    "QP1Dropped": 16,
    "PortXmitWait": 32,
}


NOT_COUNTERS = frozenset({"PortSelect", "CounterSelect", "CounterSelect2"})

# Plain ``perfquery`` (no ``-x``) reads the base PortCounters attribute, whose data and packet
# counters are 32 bits wide and stop at all ones too (IBA 16.1.3.5; libibmad fields.c
# ``IB_PC_XMT_BYTES_F`` .. ``IB_PC_RCV_PKTS_F``: ``{192, 32, ...}`` .. ``{288, 32, ...}``).
BASIC_DATA_WIDTHS: dict[str, int] = {"PortXmitData": 32, "PortRcvData": 32, "PortXmitPkts": 32, "PortRcvPkts": 32}

# libibmad before the 2009 rename to the IBA names (OFED 1.4 and older) printed PortCounters under
# short names: ``SymbolErrors:....0``, ``XmtData:....905972985`` (a capture in TACC/tacc_stats
# ``st_ib.c``, 2011; the old ``fields.c`` table). Same fields, same widths: read as the new names.
LEGACY_NAMES: dict[str, str] = {
    "SymbolErrors": "SymbolErrorCounter",
    "LinkRecovers": "LinkErrorRecoveryCounter",
    "LinkDowned": "LinkDownedCounter",
    "RcvErrors": "PortRcvErrors",
    "RcvRemotePhysErrors": "PortRcvRemotePhysicalErrors",
    "RcvSwRelayErrors": "PortRcvSwitchRelayErrors",
    "XmtDiscards": "PortXmitDiscards",
    "XmtConstraintErrors": "PortXmitConstraintErrors",
    "RcvConstraintErrors": "PortRcvConstraintErrors",
    "LinkIntegrityErrors": "LocalLinkIntegrityErrors",
    "ExcBufOverrunErrors": "ExcessiveBufferOverrunErrors",
    "XmtData": "PortXmitData",
    "RcvData": "PortRcvData",
    "XmtPkts": "PortXmitPkts",
    "RcvPkts": "PortRcvPkts",
}


def ceiling(width: int) -> int:
    """The value a saturating counter of ``width`` bits stops at (all ones)."""
    return (1 << width) - 1


# PortXmitDiscardDetails (ibqueryerrors --details, next to PortRcvErrorDetails): 16-bit PMA counters
# that stop at all ones too (IBA 16.1.4.4; libibmad fields.c IB_PC_XMT_INACT_DISC_F..).
PORT_XMIT_DISCARD_DETAILS: dict[str, PerfSpec] = {
    raw: PerfSpec(name, "", 16, True)
    for raw, name in {
        "PortInactiveDiscards": "port_inactive_discards",
        "PortNeighborMTUDiscards": "port_neighbor_mtu_discards",
        "PortSwLifetimeLimitDiscards": "port_switch_lifetime_limit_discards",
        "PortSwHOQLifetimeLimitDiscards": "port_switch_hoq_lifetime_limit_discards",
    }.items()
}
DETAILS: dict[str, PerfSpec] = {**PERFQUERY_E, **PORT_XMIT_DISCARD_DETAILS}


def narrow_spec(raw: str, basic: bool = False) -> PerfSpec | None:
    """The field as the base PortCounters attribute has it: narrow and saturating (None: 64-bit only).
    ``basic``: a plain ``perfquery`` block, where the data and packet counters are narrow too."""
    raw = LEGACY_NAMES.get(raw, raw)
    widths = {**PORT_COUNTERS_WIDTHS, **BASIC_DATA_WIDTHS} if basic else PORT_COUNTERS_WIDTHS
    spec, width = PERFQUERY_X.get(raw), widths.get(raw)
    if spec is None or width is None:
        return None
    return PerfSpec(spec.name, spec.unit, width, True, spec.scale)
