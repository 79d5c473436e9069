"""Counter state of one simulated HCA port, with the widths and overflow rules of real hardware.

Totals are kept unbounded (floats, so fractional rates accumulate honestly); the value a file shows
is derived from the total the way the hardware presents it:

- ``counters/`` data and packet counters: 64 bit (PortCountersExtended); ``port_xmit_data`` and
  ``port_rcv_data`` count **4-octet words** (kernel ABI sysfs-class-infiniband), so the model adds
  bytes / 4.
- the narrow PortCounters **saturate** at all ones (IBA 16.1.3.5, "shall not wrap"): widths from
  the table the collector reads (``fabricd.drivers.ib.pma``: symbol_error 16, link_downed 8, ...
  port_xmit_wait 32).
- mlx5 ``hw_counters`` Q counters are 32-bit and **wrap** (``fabricd.drivers.ib.mlx5``, from
  drivers/infiniband/hw/mlx5/counters.c: query_q_counter_out fields are __be32); the congestion
  counters (np_*, rp_*) are 64-bit.
- ethtool statistics are u64 (struct ethtool_stats).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fabricd.drivers.ib import Counter, mlx5, pma
from fabricd.sim.sysfstree import MLX5_CONG_COUNTERS, MLX5_Q_COUNTERS, PORT_COUNTERS_BASE

# counters/ as on the gpud H100 capture (kernel >= 4.5: base + extended data/packet counters).
COUNTERS_DATA = tuple(c.raw for c in (*pma.DATA, *pma.EXT_ONLY))
# hw_counters/ of a ConnectX-7 port on the gpud capture: the Q counters plus rx_icrc_encapsulated
# (a 64-bit PPCNT counter) and ``lifespan`` (the cache time in ms, not a counter).
HW_EXTRA_64 = tuple(c.raw for c in mlx5.PPCNT)
LIFESPAN_MS = 12  # the value on the gpud capture
PFC_PRIORITY = 3  # RoCE traffic class with PFC enabled (the common DSCP 26 -> priority 3 setup)

WIDTH_32 = 1 << 32


@dataclass
class CounterTable:
    """Unbounded totals plus the rule that turns a total into the file's value."""

    totals: dict[str, float] = field(default_factory=dict)
    saturating: dict[str, int] = field(default_factory=dict)  # name -> width
    wrapping: dict[str, int] = field(default_factory=dict)  # name -> width
    _limits: dict[str, tuple[int, bool]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._limits = {n: ((1 << w) - 1, True) for n, w in self.saturating.items()}
        self._limits.update({n: (1 << w, False) for n, w in self.wrapping.items()})

    def add(self, name: str, amount: float) -> None:
        self.totals[name] += amount

    def value(self, name: str) -> int:
        raw = int(self.totals[name])
        limit = self._limits.get(name)
        if limit is None:
            return raw
        bound, saturates = limit
        return min(raw, bound) if saturates else raw % bound


@dataclass
class HcaPortState:
    """One HCA port: sysfs ``counters/``, ``hw_counters/``, its link state and (RoCE) ethtool stats."""

    port_id: str
    roce: bool
    counters: CounterTable
    hw: CounterTable
    ethtool: CounterTable
    up: bool = True

    @property
    def device(self) -> str:
        return self.port_id.split("/", 1)[1]

    def state_text(self) -> tuple[str, str]:
        """(``state``, ``phys_state``) file contents, as the kernel formats them."""
        return ("4: ACTIVE", "5: LinkUp") if self.up else ("1: DOWN", "2: Polling")


def new_port(port_id: str, roce: bool, rng: random.Random) -> HcaPortState:
    """A port with plausible history: large data counters, a few old errors, some counters already
    saturated (``excessive_buffer_overrun_errors`` = 15 as on the gpud capture) and 32-bit Q counters
    close enough to 2^32 that a scenario sees them wrap."""
    return HcaPortState(port_id, roce, _counters(rng), _hw(roce, rng), _ethtool(rng) if roce else CounterTable())


def _counters(rng: random.Random) -> CounterTable:
    words = rng.uniform(5e13, 2.5e14)  # the gpud capture: port_rcv_data = 230539874932483 words
    packets = words * 4 / 4096
    totals = {name: 0.0 for name in PORT_COUNTERS_BASE}
    totals.update(
        {
            "port_xmit_data": words,
            "port_rcv_data": words * rng.uniform(0.98, 1.02),
            "port_xmit_packets": packets,
            "port_rcv_packets": packets,
            "unicast_xmit_packets": packets,
            "unicast_rcv_packets": packets,
            "multicast_xmit_packets": float(rng.randrange(0, 5000)),
            "multicast_rcv_packets": float(rng.randrange(0, 5000)),
            "port_xmit_wait": rng.uniform(1e8, 1.5e9),
            "port_rcv_errors": float(rng.choice((0, 0, 0, 14))),
            "port_rcv_switch_relay_errors": float(rng.choice((0, 0, 1))),
        }
    )
    if rng.random() < 0.25:
        totals["excessive_buffer_overrun_errors"] = 15.0  # 4 bits, saturated long ago
    return CounterTable(totals, dict(PORT_COUNTERS_BASE), {})


def _hw(roce: bool, rng: random.Random) -> CounterTable:
    totals = {name: 0.0 for name in MLX5_Q_COUNTERS}
    totals.update({name: 0.0 for name in HW_EXTRA_64})
    # Minutes before a wrap at the rates the model produces, so short scenarios see 32-bit wraps.
    totals["rx_write_requests"] = WIDTH_32 - rng.uniform(1e6, 6e8)
    totals["rx_read_requests"] = rng.uniform(1e6, 1e7)
    totals["rx_dct_connect"] = rng.uniform(1e5, 5e5)
    totals["roce_adp_retrans"] = float(rng.randrange(0, 5))
    if roce:
        totals.update({name: 0.0 for name in MLX5_CONG_COUNTERS})
        totals["np_ecn_marked_roce_packets"] = rng.uniform(1e4, 1e6)
        totals["np_cnp_sent"] = totals["rp_cnp_handled"] = rng.uniform(1e3, 1e5)
    return CounterTable(totals, {}, wrapping(mlx5.DRIVER.counters, totals))


def wrapping(rows: tuple[Counter, ...], totals: dict[str, float]) -> dict[str, int]:
    """Widths of the simulated counters that wrap, from the driver's table."""
    return {c.raw: c.width for c in rows if c.raw in totals and 0 < c.width < 64 and not c.saturates}


# ``ethtool -S`` of an mlx5 port (non-queue statistics of the ConnectX-4 Lx capture in
# shared/fixtures/ethtool/ethq, from isc-projects/ethq) with PFC enabled on priority 3: the global
# pause counters give way to per-priority ones (en_stats.c pport_per_prio_pfc_stats_desc), plus the
# pause-storm watchdog counters and the per-priority congestion counters of newer drivers.
ETHTOOL_BASE = (
    "rx_packets",
    "rx_bytes",
    "tx_packets",
    "tx_bytes",
    "tx_tso_packets",
    "tx_tso_bytes",
    "rx_csum_complete",
    "rx_csum_none",
    "tx_csum_partial",
    "tx_csum_none",
    "tx_queue_stopped",
    "tx_queue_wake",
    "tx_queue_dropped",
    "rx_wqe_err",
    "rx_buff_alloc_err",
    "rx_cache_reuse",
    "link_down_events_phy",
    "rx_out_of_buffer",
    "rx_vport_unicast_packets",
    "rx_vport_unicast_bytes",
    "tx_vport_unicast_packets",
    "tx_vport_unicast_bytes",
    "rx_vport_multicast_packets",
    "rx_vport_multicast_bytes",
    "tx_vport_multicast_packets",
    "tx_vport_multicast_bytes",
    "rx_vport_broadcast_packets",
    "rx_vport_broadcast_bytes",
    "tx_vport_broadcast_packets",
    "tx_vport_broadcast_bytes",
    "rx_vport_rdma_unicast_packets",
    "rx_vport_rdma_unicast_bytes",
    "tx_vport_rdma_unicast_packets",
    "tx_vport_rdma_unicast_bytes",
    "rx_vport_rdma_multicast_packets",
    "rx_vport_rdma_multicast_bytes",
    "tx_vport_rdma_multicast_packets",
    "tx_vport_rdma_multicast_bytes",
    "tx_packets_phy",
    "rx_packets_phy",
    "rx_crc_errors_phy",
    "tx_bytes_phy",
    "rx_bytes_phy",
    "tx_multicast_phy",
    "tx_broadcast_phy",
    "rx_multicast_phy",
    "rx_broadcast_phy",
    "rx_in_range_len_errors_phy",
    "rx_out_of_range_len_phy",
    "rx_oversize_pkts_phy",
    "rx_symbol_err_phy",
    "tx_mac_control_phy",
    "rx_mac_control_phy",
    "rx_unsupported_op_phy",
    "rx_pause_ctrl_phy",
    "tx_pause_ctrl_phy",
    "rx_discards_phy",
    "tx_discards_phy",
    "tx_errors_phy",
    "rx_undersize_pkts_phy",
    "rx_fragments_phy",
    "rx_jabbers_phy",
    "rx_pcs_symbol_err_phy",
    "rx_corrected_bits_phy",
    "rx_buffer_passed_thres_phy",
    "rx_pci_signal_integrity",
    "tx_pci_signal_integrity",
    "outbound_pci_stalled_rd",
    "outbound_pci_stalled_wr",
    "tx_pause_storm_warning_events",
    "tx_pause_storm_error_events",
    "module_unplug",
    "module_bus_stuck",
    "module_high_temp",
    "module_bad_shorted",
)


def ethtool_names() -> list[str]:
    names = list(ETHTOOL_BASE)
    for p in range(8):
        names += [f"rx_prio{p}_bytes", f"rx_prio{p}_packets", f"tx_prio{p}_bytes", f"tx_prio{p}_packets"]
    p = PFC_PRIORITY
    names += [
        f"rx_prio{p}_pause",
        f"rx_prio{p}_pause_duration",
        f"tx_prio{p}_pause",
        f"tx_prio{p}_pause_duration",
        f"rx_prio{p}_pause_transition",
    ]
    for p in range(8):
        names += [f"rx_prio{p}_buf_discard", f"rx_prio{p}_cong_discard", f"rx_prio{p}_marked"]
    return names


def _ethtool(rng: random.Random) -> CounterTable:
    totals = {name: 0.0 for name in ethtool_names()}
    base = rng.uniform(1e14, 9e14)
    for name in totals:
        if name.endswith("bytes") or name.endswith("bytes_phy"):
            totals[name] = base * rng.uniform(0.01, 1.0)
        elif "packets" in name or (name.endswith("_phy") and "err" not in name and "discard" not in name):
            totals[name] = base / 4096 * rng.uniform(0.01, 1.0)
    for name in (
        "rx_crc_errors_phy",
        "rx_symbol_err_phy",
        "link_down_events_phy",
        "rx_discards_phy",
        "tx_discards_phy",
        "rx_pcs_symbol_err_phy",
        "rx_in_range_len_errors_phy",
        "rx_oversize_pkts_phy",
        "rx_undersize_pkts_phy",
        "rx_fragments_phy",
        "rx_jabbers_phy",
        "tx_errors_phy",
        "rx_unsupported_op_phy",
    ):
        totals[name] = float(rng.choice((0, 0, 0, 1, 2)))
    totals["rx_corrected_bits_phy"] = rng.uniform(0, 1e6)  # FEC corrects bits all the time
    return CounterTable(totals, {}, {})
