"""The settlement's left-out nodes as ``fabricd_detection_node_left_out`` (``ServerMetrics``): the
detection loop exports them after every step, so a node already out is not set again."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from fabricd.detect.settle import SettlementState
from fabricd.server.metrics import ServerMetrics


def state(*left_out: str) -> SettlementState:
    return SettlementState(100.0, 5.0, 4, tuple(left_out), 0, 1.0)


def out(registry: CollectorRegistry) -> dict[str, float]:
    return {
        s.labels["node"]: s.value
        for m in registry.collect()
        if m.name == "fabricd_detection_node_left_out"
        for s in m.samples
    }


def test_left_out_nodes_come_and_go_from_the_gauge() -> None:
    registry = CollectorRegistry()
    metrics = ServerMetrics(registry)
    metrics.observe_settlement(state("a", "b"), 101.0, 0)
    assert out(registry) == {"a": 1.0, "b": 1.0}
    metrics.observe_settlement(state("b", "c"), 102.0, 0)
    assert out(registry) == {"b": 1.0, "c": 1.0}
    metrics.observe_settlement(state("b", "c"), 103.0, 0)
    assert out(registry) == {"b": 1.0, "c": 1.0}
    metrics.observe_settlement(state(), 104.0, 0)
    assert out(registry) == {}
    metrics.observe_settlement(state("a"), 105.0, 0)
    assert out(registry) == {"a": 1.0}
    assert registry.get_sample_value("fabricd_detection_nodes_left_out") == 1.0
