"""Broadcom NetXtreme-C/E (``bnxt_en``) ``ethtool -S`` names: PFC per priority, pause, errors.

Source: ``drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c``: ``bnxt_port_stats_arr``,
``bnxt_port_stats_ext_arr`` (``rx_pfc_ena_frames_pri{p}``,
``pfc_pri{p}_rx_duration_us``, ``pfc_pri{p}_rx_transitions``), ``bnxt_rx_bytes_pri_arr`` and
``bnxt_rx_pkts_pri_arr``. ``pfc_pri{p}_*_duration_us`` are microseconds.

Port discards (``rx_stat_discard``, ``tx_stat_discard``) and PCS symbol errors (``rx_pcs_symbol_err``)
are ``bnxt_port_stats_arr`` entries; FEC blocks (``rx_fec_corrected_blocks``,
``rx_fec_uncorrectable_blocks``) are ``bnxt_port_stats_ext_arr``'s. Host-ring drops (the NIC had no
receive buffer posted on the ring) are the ring error totals: ``rx_total_ring_discards`` /
``tx_total_ring_discards`` (``bnxt_ring_err_stats_arr``, kernel 6.3+), called
``rx_total_discard_pkts`` / ``tx_total_discard_pkts`` before (``bnxt_sw_func_stats``).
"""

from __future__ import annotations

from fabricd.drivers.ethtool import US, EthtoolDriver, P, rule

DRIVER = EthtoolDriver(
    name="bnxt_en",
    kernel_drivers=("bnxt_en",),
    source="drivers/net/ethernet/broadcom/bnxt/bnxt_ethtool.c",
    rules=(
        rule(r"rx_pfc_ena_frames_pri([0-7])", "rx_pause_frames", "frames", priority=P),
        rule(r"tx_pfc_ena_frames_pri([0-7])", "tx_pause_frames", "frames", priority=P),
        rule(r"pfc_pri([0-7])_rx_duration_us", "rx_pause_duration", "seconds", US, P),
        rule(r"pfc_pri([0-7])_tx_duration_us", "tx_pause_duration", "seconds", US, P),
        rule(r"pfc_pri([0-7])_rx_transitions", "rx_pause_transitions", "events", priority=P),
        rule(r"pfc_pri([0-7])_tx_transitions", "tx_pause_transitions", "events", priority=P),
        rule(r"rx_pause_frames", "rx_pause_frames", "frames", priority="global"),
        rule(r"tx_pause_frames", "tx_pause_frames", "frames", priority="global"),
        rule(r"rx_fcs_err_frames", "rx_crc_errors", "frames"),
        rule(r"link_down_events", "link_down_events", ""),
        rule(r"rx_bytes_pri([0-7])", "rx_priority_bytes", "bytes", priority=P),
        rule(r"tx_bytes_pri([0-7])", "tx_priority_bytes", "bytes", priority=P),
        rule(r"rx_packets_pri([0-7])", "rx_priority_packets", "packets", priority=P),
        rule(r"tx_packets_pri([0-7])", "tx_priority_packets", "packets", priority=P),
        rule(r"rx_stat_discard", "rx_discards", "packets"),
        rule(r"tx_stat_discard", "tx_discards", "packets"),
        rule(r"rx_total_ring_discards", "rx_ring_discards", "packets"),
        rule(r"tx_total_ring_discards", "tx_ring_discards", "packets"),
        rule(r"rx_total_discard_pkts", "rx_ring_discards", "packets"),  # before kernel 6.3
        rule(r"tx_total_discard_pkts", "tx_ring_discards", "packets"),
        rule(r"rx_pcs_symbol_err", "rx_pcs_symbol_errors", ""),
        rule(r"rx_fec_corrected_blocks", "rx_fec_corrected_blocks", ""),
        rule(r"rx_fec_uncorrectable_blocks", "rx_fec_uncorrectable_blocks", ""),
    ),
)
