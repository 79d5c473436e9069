"""NVIDIA/Mellanox mlx5 Ethernet (``mlx5_core``) ``ethtool -S`` names: PFC, pause, discards, errors.

Source: ``drivers/net/ethernet/mellanox/mlx5/core/en_stats.c``: ``pport_per_prio_pfc_stats_desc``
(per priority, present only where PFC is enabled), ``pport_per_tc_prio_stats_desc``,
``pport_per_tc_congest_prio_stats_desc``, ``pport_phy_statistical_stats_desc`` and the ``*_phy`` 802.3
groups. The ``*_pause_duration`` counters are in microseconds (PPCNT register, ``rx_pause_duration``
field); global (802.3x) pause is the same PPCNT group.

Before the 2016 rename (kernel 4.4, fixture ``ethq_mlx5_older_driver_legacy_names``) the same PPCNT
fields had their IEEE 802.3 / RFC 2863 group names: ``pause_ctrl_rx``, ``check_seq_err``,
``in_discards``, ... mlx5's ``rx_pause_ctrl_phy`` is left unmapped: it counts the same 802.3x frames as
``rx_global_pause`` and two sources must not feed one series.
"""

from __future__ import annotations

from fabricd.drivers.ethtool import US, EthtoolDriver, P, rule

PER_PRIORITY = (
    rule(r"rx_prio([0-7])_pause", "rx_pause_frames", "frames", priority=P),
    rule(r"tx_prio([0-7])_pause", "tx_pause_frames", "frames", priority=P),
    rule(r"rx_prio([0-7])_pause_duration", "rx_pause_duration", "seconds", US, P),
    rule(r"tx_prio([0-7])_pause_duration", "tx_pause_duration", "seconds", US, P),
    rule(r"rx_prio([0-7])_pause_transition", "rx_pause_transitions", "events", priority=P),
    rule(r"tx_prio([0-7])_pause_transition", "tx_pause_transitions", "events", priority=P),
    rule(r"rx_prio([0-7])_buf_discard", "rx_buffer_discards", "packets", priority=P),
    rule(r"rx_prio([0-7])_cong_discard", "rx_congestion_discards", "packets", priority=P),
    rule(r"rx_prio([0-7])_marked", "rx_ecn_marked_packets", "packets", priority=P),
    # pport_per_prio_traffic_stats_desc: the port's receive discards of that priority.
    rule(r"rx_prio([0-7])_discards", "rx_priority_discards", "packets", priority=P),
    rule(r"rx_prio([0-7])_bytes", "rx_priority_bytes", "bytes", priority=P),
    rule(r"tx_prio([0-7])_bytes", "tx_priority_bytes", "bytes", priority=P),
    rule(r"rx_prio([0-7])_packets", "rx_priority_packets", "packets", priority=P),
    rule(r"tx_prio([0-7])_packets", "tx_priority_packets", "packets", priority=P),
)
PORT = (
    rule(r"rx_global_pause", "rx_pause_frames", "frames", priority="global"),
    rule(r"tx_global_pause", "tx_pause_frames", "frames", priority="global"),
    rule(r"rx_global_pause_duration", "rx_pause_duration", "seconds", US, "global"),
    rule(r"tx_global_pause_duration", "tx_pause_duration", "seconds", US, "global"),
    rule(r"rx_global_pause_transition", "rx_pause_transitions", "events", priority="global"),
    rule(r"tx_pause_storm_warning_events", "tx_pause_storm_warning_events", "events"),
    rule(r"tx_pause_storm_error_events", "tx_pause_storm_error_events", "events"),
    rule(r"rx_discards_phy", "rx_discards", "packets"),
    rule(r"tx_discards_phy", "tx_discards", "packets"),
    rule(r"rx_crc_errors_phy", "rx_crc_errors", "frames"),
    rule(r"rx_symbol_err_phy", "rx_symbol_errors", ""),
    rule(r"link_down_events_phy", "link_down_events", ""),
    rule(r"rx_out_of_buffer", "rx_out_of_buffer", "packets"),
    # pport_phy_statistical_stats_desc: PCS-layer symbol errors and FEC-corrected bits.
    rule(r"rx_pcs_symbol_err_phy", "rx_pcs_symbol_errors", ""),
    rule(r"rx_corrected_bits_phy", "rx_fec_corrected_bits", ""),
)
LEGACY = (  # pre-4.5 names of the same PPCNT fields
    rule(r"pause_ctrl_rx", "rx_pause_frames", "frames", priority="global"),
    rule(r"pause_ctrl_tx", "tx_pause_frames", "frames", priority="global"),
    rule(r"in_discards", "rx_discards", "packets"),
    rule(r"out_discards", "tx_discards", "packets"),
    rule(r"check_seq_err", "rx_crc_errors", "frames"),  # aFrameCheckSequenceErrors
    rule(r"symbol_err", "rx_symbol_errors", ""),  # aSymbolErrorDuringCarrier
)

DRIVER = EthtoolDriver(
    name="mlx5",
    kernel_drivers=("mlx5_core",),
    source="drivers/net/ethernet/mellanox/mlx5/core/en_stats.c",
    rules=(*PER_PRIORITY, *PORT, *LEGACY),
)
