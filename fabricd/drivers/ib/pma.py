"""``counters/`` and ``counters_ext/``: the IBA PortCounters every InfiniBand/RoCE HCA's PMA serves.

Names and widths are the kernel's (``drivers/infiniband/core/sysfs.c``: ``pma_attrs`` = PortCounters,
``pma_attrs_ext`` = PortCountersExtended, ``PORT_PMA_ATTR(name, counter, width, offset)``). The narrow
PortCounters stop at all ones (IBA vol. 1 rel. 1.3, 16.1.3.5: "shall not wrap"); the kernel reports
them as read. ``port_xmit_data``/``port_rcv_data`` count 4-octet words (kernel ABI
``sysfs-class-infiniband``: "divided by 4"), so ``scale`` 4 gives bytes.

Before kernel 4.5 ``counters/`` always held the 32-bit PortCounters data/packet fields (saturating)
and the 64-bit ones lived in ``counters_ext/`` (procfs ``class_infiniband.go``; kernel commit 145d9c5).
Broadcom ``bnxt_re`` has no ``counters/`` at all; iWARP devices answer ``N/A (no PMA)``.
"""

from __future__ import annotations

from fabricd.drivers.ib import Counter, Overflow

WORD_BYTES = 4  # port_xmit_data / port_rcv_data count 4-octet words
SYSFS = "drivers/infiniband/core/sysfs.c"
_BOTH = f"{SYSFS}: pma_attrs and pma_attrs_ext (PortCounters)"
_EXT = f"{SYSFS}: pma_attrs_ext (PortCountersExtended, 64 bit; pma_attrs has the 32-bit PortCounters field)"
_EXT_ONLY = f"{SYSFS}: pma_attrs_ext (PortCountersExtended)"


def _narrow(raw: str, name: str, width: int, help: str, unit: str = "") -> Counter:
    return Counter(raw, name, unit, width, Overflow.SATURATES, help=help, source=_BOTH)


def _wide(raw: str, name: str, unit: str, help: str, source: str = _EXT, scale: int = 1) -> Counter:
    return Counter(raw, name, unit, 64, scale=scale, help=help, source=source)


# PortCounters: narrow and saturating, on every PMA.
BASE: tuple[Counter, ...] = (
    _narrow("symbol_error", "symbol_errors", 16, "SymbolErrorCounter: minor link errors on any lane"),
    _narrow("link_error_recovery", "link_error_recovery", 8, "LinkErrorRecoveryCounter: link retrains"),
    _narrow("link_downed", "link_downed", 8, "LinkDownedCounter: error recovery failed, the link went down"),
    _narrow("port_rcv_errors", "port_receive_errors", 16, "PortRcvErrors: received packets with errors"),
    _narrow(
        "port_rcv_remote_physical_errors",
        "port_receive_remote_physical_errors",
        16,
        "PortRcvRemotePhysicalErrors: packets marked bad (EBP) upstream",
    ),
    _narrow(
        "port_rcv_switch_relay_errors",
        "port_receive_switch_relay_errors",
        16,
        "PortRcvSwitchRelayErrors: packets a switch could not forward",
    ),
    _narrow("port_xmit_discards", "port_transmit_discards", 16, "PortXmitDiscards: outbound packets discarded"),
    _narrow(
        "port_xmit_constraint_errors",
        "port_transmit_constraint_errors",
        8,
        "PortXmitConstraintErrors: partition/raw-packet checks on send",
    ),
    _narrow(
        "port_rcv_constraint_errors",
        "port_receive_constraint_errors",
        8,
        "PortRcvConstraintErrors: partition/raw-packet checks on receive",
    ),
    _narrow(
        "local_link_integrity_errors",
        "local_link_integrity_errors",
        4,
        "LocalLinkIntegrityErrors: physical errors above LocalPhyErrors threshold",
    ),
    _narrow(
        "excessive_buffer_overrun_errors",
        "excessive_buffer_overrun_errors",
        4,
        "ExcessiveBufferOverrunErrors: flow-control periods with overrun",
    ),
    _narrow("VL15_dropped", "vl15_dropped", 16, "VL15Dropped: subnet management packets dropped"),
    _narrow(
        "port_xmit_wait",
        "port_transmit_wait",
        32,
        "PortXmitWait: ticks with data to send and nothing sent (no credits, lost arbitration)",
        unit="ticks",
    ),
)
# Data and packet counters: 64 bit from PortCountersExtended on kernels >= 4.5.
DATA: tuple[Counter, ...] = (
    _wide("port_xmit_data", "port_transmit_data", "bytes", "PortXmitData: 4-octet words sent", scale=WORD_BYTES),
    _wide("port_rcv_data", "port_receive_data", "bytes", "PortRcvData: 4-octet words received", scale=WORD_BYTES),
    _wide("port_xmit_packets", "port_transmit_packets", "packets", "PortXmitPkts: packets sent"),
    _wide("port_rcv_packets", "port_receive_packets", "packets", "PortRcvPkts: packets received"),
)
EXT_ONLY: tuple[Counter, ...] = (
    _wide("unicast_xmit_packets", "unicast_transmit_packets", "packets", "PortUnicastXmitPkts", _EXT_ONLY),
    _wide("unicast_rcv_packets", "unicast_receive_packets", "packets", "PortUnicastRcvPkts", _EXT_ONLY),
    _wide("multicast_xmit_packets", "multicast_transmit_packets", "packets", "PortMulticastXmitPkts", _EXT_ONLY),
    _wide("multicast_rcv_packets", "multicast_receive_packets", "packets", "PortMulticastRcvPkts", _EXT_ONLY),
)
# Read when present (node_exporter's fixture has it); not in the kernel's PMA attribute lists.
EXTRA: tuple[Counter, ...] = (
    _wide(
        "port_rcv_discards",
        "port_receive_discards",
        "",
        "Received packets discarded",
        "prometheus/procfs sysfs/class_infiniband.go (parsed when present)",
    ),
)
# counters_ext/ on kernels before 4.5: the extended counters, each under its own name.
_OLD = "prometheus/procfs sysfs/class_infiniband.go, parseInfiniBandCountersExt (kernels < 4.5)"
COUNTERS_EXT: tuple[Counter, ...] = (
    _wide("port_xmit_data_64", "legacy_port_transmit_data", "bytes", "PortXmitData (64)", _OLD, WORD_BYTES),
    _wide("port_rcv_data_64", "legacy_port_receive_data", "bytes", "PortRcvData (64)", _OLD, WORD_BYTES),
    _wide("port_xmit_packets_64", "legacy_port_transmit_packets", "packets", "PortXmitPkts (64)", _OLD),
    _wide("port_rcv_packets_64", "legacy_port_receive_packets", "packets", "PortRcvPkts (64)", _OLD),
    _wide("port_unicast_xmit_packets", "legacy_unicast_transmit_packets", "packets", "PortUnicastXmitPkts", _OLD),
    _wide("port_unicast_rcv_packets", "legacy_unicast_receive_packets", "packets", "PortUnicastRcvPkts", _OLD),
    _wide("port_multicast_xmit_packets", "legacy_multicast_transmit_packets", "packets", "PortMulticastXmitPkts", _OLD),
    _wide("port_multicast_rcv_packets", "legacy_multicast_receive_packets", "packets", "PortMulticastRcvPkts", _OLD),
)

COUNTERS: dict[str, Counter] = {c.raw: c for c in (*BASE, *DATA, *EXT_ONLY, *EXTRA)}
EXT: dict[str, Counter] = {c.raw: c for c in COUNTERS_EXT}
_DATA = frozenset(c.raw for c in DATA)


def legacy(c: Counter) -> Counter:
    """``counters/`` data fields next to a ``counters_ext/`` folder: the 32-bit PortCounters ones."""
    if c.raw not in _DATA:
        return c
    return Counter(c.raw, c.name, c.unit, 32, Overflow.SATURATES, c.kind, c.scale, c.help, f"{SYSFS}: pma_attrs")


def counter(folder: str, raw: str, *, legacy_kernel: bool) -> Counter | None:
    """The row of ``counters/<raw>`` or ``counters_ext/<raw>``; None for a file that is not there."""
    found = (EXT if folder == "counters_ext" else COUNTERS).get(raw)
    if found is not None and legacy_kernel and folder == "counters":
        return legacy(found)
    return found
