"""NVIDIA/Mellanox ConnectX-3 (``mlx4_en``) ``ethtool -S`` names: per-priority and global pause,
their durations and transitions, per-priority traffic, CRC errors.

Source: ``drivers/net/ethernet/mellanox/mlx4/en_ethtool.c``, ``main_strings`` ("priority flow control
statistics rx/tx": ``rx_pause_prio_%d``, ``rx_pause_duration_prio_%d``, ``rx_pause_transition_prio_%d``;
"flow control statistics": ``rx_pause``, ``rx_pause_duration``, ``rx_pause_transition``; per-priority
``rx_prio_%d_packets``/``_bytes``). The durations come from the firmware's flow-control counters
(``mlx4_en_port.c``), in microseconds like mlx5's PPCNT ones.
"""

from __future__ import annotations

from fabricd.drivers.ethtool import US, EthtoolDriver, P, rule

DRIVER = EthtoolDriver(
    name="mlx4_en",
    kernel_drivers=("mlx4_en",),
    source="drivers/net/ethernet/mellanox/mlx4/en_ethtool.c",
    rules=(
        rule(r"rx_pause_prio_([0-7])", "rx_pause_frames", "frames", priority=P),
        rule(r"tx_pause_prio_([0-7])", "tx_pause_frames", "frames", priority=P),
        rule(r"rx_pause_duration_prio_([0-7])", "rx_pause_duration", "seconds", US, P),
        rule(r"tx_pause_duration_prio_([0-7])", "tx_pause_duration", "seconds", US, P),
        rule(r"rx_pause_transition_prio_([0-7])", "rx_pause_transitions", "events", priority=P),
        rule(r"tx_pause_transition_prio_([0-7])", "tx_pause_transitions", "events", priority=P),
        rule(r"rx_pause", "rx_pause_frames", "frames", priority="global"),
        rule(r"tx_pause", "tx_pause_frames", "frames", priority="global"),
        rule(r"rx_pause_duration", "rx_pause_duration", "seconds", US, "global"),
        rule(r"tx_pause_duration", "tx_pause_duration", "seconds", US, "global"),
        rule(r"rx_pause_transition", "rx_pause_transitions", "events", priority="global"),
        rule(r"tx_pause_transition", "tx_pause_transitions", "events", priority="global"),
        rule(r"rx_prio_([0-7])_packets", "rx_priority_packets", "packets", priority=P),
        rule(r"tx_prio_([0-7])_packets", "tx_priority_packets", "packets", priority=P),
        rule(r"rx_prio_([0-7])_bytes", "rx_priority_bytes", "bytes", priority=P),
        rule(r"tx_prio_([0-7])_bytes", "tx_priority_bytes", "bytes", priority=P),
        rule(r"rx_crc_errors", "rx_crc_errors", "frames"),
    ),
)
