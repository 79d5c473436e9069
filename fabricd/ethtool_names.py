"""One vendor-neutral name for each PFC / discard / error statistic that NIC drivers spell differently.

Detectors and the simulator rely on the neutral names below; the raw driver name stays on the
reading (``Reading.counter``) so an engineer can still find it in ``ethtool -S``. Priorities become a
label (``priority="3"``); link-level (802.3x, non-PFC) pause gets ``priority="global"`` and a
driver's sum over all priorities (AMD ionic ``frames_rx_pripause``) gets ``priority="all"``.

Sources of the driver names (kernel tree, ``ethtool -S`` string tables):
- mlx5: ``drivers/net/ethernet/mellanox/mlx5/core/en_stats.c`` (``pport_per_prio_pfc_stats_desc``,
  ``pport_per_tc_prio_stats_desc``, ``pport_per_tc_congest_prio_stats_desc``, ``pport_phy_*``). The
  ``*_pause_duration`` counters are in microseconds (PPCNT register, ``rx_pause_duration`` field).
- mlx5 before the 2016 rename (kernel 4.4, fixture ``mlx5_core_older_driver_legacy_names.txt``): the
  IEEE 802.3 / RFC 2863 group names, ``pause_ctrl_rx``, ``check_seq_err``, ``in_discards``, ...
- bnxt: ``drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c`` (``bnxt_rx_port_stats_ext_arr``,
  ``bnxt_rx_bytes_pri_arr``); ``pfc_pri{p}_*_duration_us`` are microseconds.
- ionic: ``drivers/net/ethernet/pensando/ionic/ionic_stats.c`` (``ionic_port_stats_desc``);
  ``*_pripause_{p}_1us_count`` are microseconds.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

MICROSECONDS_PER_SECOND = 1_000_000


@dataclass(frozen=True, slots=True)
class Neutral:
    """Where one raw statistic lands: neutral name, unit, divisor to base units, priority label."""

    name: str
    unit: str
    divisor: int = 1  # microseconds -> seconds: 1_000_000 (a division keeps 456000 us == 0.456 s exact)
    priority: str | None = None

    @property
    def scale(self) -> float:
        return 1.0 / self.divisor

    def convert(self, raw: int) -> float:
        return raw / self.divisor


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str]
    name: str
    unit: str
    divisor: int = 1
    # None: no priority label; "{p}": the first regex group; anything else: that literal label.
    priority: str | None = None

    def apply(self, raw: str) -> Neutral | None:
        match = self.pattern.fullmatch(raw)
        if match is None:
            return None
        priority = match.group(1) if self.priority == "{p}" else self.priority
        return Neutral(self.name, self.unit, self.divisor, priority)


def _rule(regex: str, name: str, unit: str, divisor: int = 1, priority: str | None = None) -> _Rule:
    return _Rule(re.compile(regex), name, unit, divisor, priority)


P = "{p}"
US = MICROSECONDS_PER_SECOND

_RULES: tuple[_Rule, ...] = (
    # --- mlx5, per priority (present only for priorities with PFC enabled) ---
    _rule(r"rx_prio([0-7])_pause", "rx_pause_frames", "frames", priority=P),
    _rule(r"tx_prio([0-7])_pause", "tx_pause_frames", "frames", priority=P),
    _rule(r"rx_prio([0-7])_pause_duration", "rx_pause_duration", "seconds", US, P),
    _rule(r"tx_prio([0-7])_pause_duration", "tx_pause_duration", "seconds", US, P),
    _rule(r"rx_prio([0-7])_pause_transition", "rx_pause_transitions", "events", priority=P),
    _rule(r"tx_prio([0-7])_pause_transition", "tx_pause_transitions", "events", priority=P),
    _rule(r"rx_prio([0-7])_buf_discard", "rx_buffer_discards", "packets", priority=P),
    _rule(r"rx_prio([0-7])_cong_discard", "rx_congestion_discards", "packets", priority=P),
    _rule(r"rx_prio([0-7])_marked", "rx_ecn_marked_packets", "packets", priority=P),
    _rule(r"rx_prio([0-7])_bytes", "rx_priority_bytes", "bytes", priority=P),
    _rule(r"tx_prio([0-7])_bytes", "tx_priority_bytes", "bytes", priority=P),
    _rule(r"rx_prio([0-7])_packets", "rx_priority_packets", "packets", priority=P),
    _rule(r"tx_prio([0-7])_packets", "tx_priority_packets", "packets", priority=P),
    # --- mlx5, port (global pause is the same PPCNT group, also in microseconds) ---
    _rule(r"rx_global_pause", "rx_pause_frames", "frames", priority="global"),
    _rule(r"tx_global_pause", "tx_pause_frames", "frames", priority="global"),
    _rule(r"rx_global_pause_duration", "rx_pause_duration", "seconds", US, "global"),
    _rule(r"tx_global_pause_duration", "tx_pause_duration", "seconds", US, "global"),
    _rule(r"rx_global_pause_transition", "rx_pause_transitions", "events", priority="global"),
    _rule(r"tx_pause_storm_warning_events", "tx_pause_storm_warning_events", "events"),
    _rule(r"tx_pause_storm_error_events", "tx_pause_storm_error_events", "events"),
    _rule(r"rx_discards_phy", "rx_discards", "packets"),
    _rule(r"tx_discards_phy", "tx_discards", "packets"),
    _rule(r"rx_crc_errors_phy", "rx_crc_errors", "frames"),
    _rule(r"rx_symbol_err_phy", "rx_symbol_errors", ""),
    _rule(r"link_down_events_phy", "link_down_events", ""),
    _rule(r"rx_out_of_buffer", "rx_out_of_buffer", "packets"),
    # --- mlx5 legacy (pre-4.5 names of the same PPCNT fields) ---
    _rule(r"pause_ctrl_rx", "rx_pause_frames", "frames", priority="global"),
    _rule(r"pause_ctrl_tx", "tx_pause_frames", "frames", priority="global"),
    _rule(r"in_discards", "rx_discards", "packets"),
    _rule(r"out_discards", "tx_discards", "packets"),
    _rule(r"check_seq_err", "rx_crc_errors", "frames"),  # aFrameCheckSequenceErrors
    _rule(r"symbol_err", "rx_symbol_errors", ""),  # aSymbolErrorDuringCarrier
    # --- Broadcom bnxt ---
    _rule(r"rx_pfc_ena_frames_pri([0-7])", "rx_pause_frames", "frames", priority=P),
    _rule(r"tx_pfc_ena_frames_pri([0-7])", "tx_pause_frames", "frames", priority=P),
    _rule(r"pfc_pri([0-7])_rx_duration_us", "rx_pause_duration", "seconds", US, P),
    _rule(r"pfc_pri([0-7])_tx_duration_us", "tx_pause_duration", "seconds", US, P),
    _rule(r"pfc_pri([0-7])_rx_transitions", "rx_pause_transitions", "events", priority=P),
    _rule(r"pfc_pri([0-7])_tx_transitions", "tx_pause_transitions", "events", priority=P),
    _rule(r"rx_pause_frames", "rx_pause_frames", "frames", priority="global"),
    _rule(r"tx_pause_frames", "tx_pause_frames", "frames", priority="global"),
    _rule(r"rx_fcs_err_frames", "rx_crc_errors", "frames"),
    _rule(r"link_down_events", "link_down_events", ""),
    _rule(r"rx_bytes_pri([0-7])", "rx_priority_bytes", "bytes", priority=P),
    _rule(r"tx_bytes_pri([0-7])", "tx_priority_bytes", "bytes", priority=P),
    _rule(r"rx_packets_pri([0-7])", "rx_priority_packets", "packets", priority=P),
    _rule(r"tx_packets_pri([0-7])", "tx_priority_packets", "packets", priority=P),
    # --- AMD Pensando ionic ---
    _rule(r"frames_rx_pripause", "rx_pause_frames", "frames", priority="all"),
    _rule(r"frames_tx_pripause", "tx_pause_frames", "frames", priority="all"),
    _rule(r"frames_rx_pause", "rx_pause_frames", "frames", priority="global"),
    _rule(r"frames_tx_pause", "tx_pause_frames", "frames", priority="global"),
    _rule(r"rx_pripause_([0-7])_1us_count", "rx_pause_duration", "seconds", US, P),
    _rule(r"tx_pripause_([0-7])_1us_count", "tx_pause_duration", "seconds", US, P),
    _rule(r"rx_pause_1us_count", "rx_pause_duration", "seconds", US, "global"),
    _rule(r"frames_rx_pri_([0-7])", "rx_priority_packets", "packets", priority=P),
    _rule(r"frames_tx_pri_([0-7])", "tx_priority_packets", "packets", priority=P),
    _rule(r"frames_rx_bad_fcs", "rx_crc_errors", "frames"),
    _rule(r"frames_rx_dropped", "rx_discards", "packets"),
)

# The neutral names detectors may rely on, with their units (checked by a test against the rules).
NEUTRAL_UNITS: dict[str, str] = {
    "rx_pause_frames": "frames",
    "tx_pause_frames": "frames",
    "rx_pause_duration": "seconds",
    "tx_pause_duration": "seconds",
    "rx_pause_transitions": "events",
    "tx_pause_transitions": "events",
    "tx_pause_storm_warning_events": "events",
    "tx_pause_storm_error_events": "events",
    "rx_discards": "packets",
    "tx_discards": "packets",
    "rx_buffer_discards": "packets",
    "rx_congestion_discards": "packets",
    "rx_crc_errors": "frames",
    "rx_symbol_errors": "",
    "rx_ecn_marked_packets": "packets",
    "link_down_events": "",
    "rx_out_of_buffer": "packets",
    "rx_priority_bytes": "bytes",
    "tx_priority_bytes": "bytes",
    "rx_priority_packets": "packets",
    "tx_priority_packets": "packets",
}

# Per-queue / per-channel statistics: one series per ring multiplies cardinality by the queue count.
# mlx5 ``rx3_packets``/``ch3_events``; veth, virtio, ice ``rx_queue_0_*``; ionic ``tx_0_pkts``,
# ``rxq_0_napi_*``; i40e ``tx-0.packets``; bnxt ``[0]: rx_ucast_packets``. mlx5's size histograms
# (``rx_64_bytes_phy``) look like ionic queues, hence the ``_phy`` exclusion.
_QUEUE_STATS = re.compile(
    r"(?:rx|tx|ch|xdpsq|xsk)\d+_.*"
    r"|(?:rx|tx)_queue_\d+_.*"
    r"|(?:rx|tx)q?_\d+_(?!.*_phy$).*"
    r"|(?:rx|tx)-\d+\..*"
    r"|\[\d+\]:.*"
)


# A NIC has a few hundred statistic names and they do not change between scrapes: memoize the ~60
# regex rules per name (bounded: a driver inventing names cannot grow it past maxsize).
@functools.lru_cache(maxsize=16384)
def neutral(raw: str) -> Neutral | None:
    """The neutral name for a raw driver statistic, or None when fabricd has none."""
    for rule in _RULES:
        found = rule.apply(raw)
        if found is not None:
            return found
    return None


@functools.lru_cache(maxsize=16384)
def is_queue_stat(raw: str) -> bool:
    return _QUEUE_STATS.fullmatch(raw) is not None


def all_rules() -> tuple[tuple[str, str, str], ...]:
    """(regex, neutral name, unit) of every rule, for docs and the catalogue test."""
    return tuple((r.pattern.pattern, r.name, r.unit) for r in _RULES)
