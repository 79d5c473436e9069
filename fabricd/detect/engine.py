"""The detection engine: samples in (event-time order), incidents whose state changed out.

    samples -> Record per (node, source, device) scrape -> signals (``signals.Extractor``)
            -> rules (``findings.Tracker``: window, for, hysteresis) -> findings
            -> detectors (hol, loss, congestion, latency; each claims what it explains)
            -> proposals -> ``IncidentBook`` (open / update / resolve / reopen / flap damping)

Everything runs on the samples' timestamps: no wall clock, so a simulated hour replays in seconds
and a test is deterministic. Evaluation (detectors + lifecycle) happens when event time moves to a
new scrape round and at the end of every ``process`` call, at most once per round unless a finding
changed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fabricd.detect import congestion, hol, latency, loss
from fabricd.detect.base import EvalContext
from fabricd.detect.findings import Tracker
from fabricd.detect.incidents import IncidentBook, Proposal
from fabricd.detect.latency import BaselineParams, Baselines
from fabricd.detect.localize import Localizer, PathOracle
from fabricd.detect.rules import Rule, RuleSet, load_rules
from fabricd.detect.signals import IB, SIGNALS, WANTED, Extractor, Record
from fabricd.model import Incident, IncidentKind, Kind, Labels, Sample

# Detectors in precedence order: a root cause found first claims the symptoms it explains.
DETECTORS = (hol.propose, loss.propose, congestion.propose, latency.propose)


class DetectionEngine:
    def __init__(
        self, rules: RuleSet | None = None, rule_paths: Iterable[Path] | None = None, round_tolerance: float = 0.5
    ) -> None:
        self.rules = rules if rules is not None else load_rules(rule_paths, SIGNALS)
        self.tol = round_tolerance  # samples this close in time belong to one scrape round
        self.tracker = Tracker(self.rules.lifecycle.stale_seconds)
        self.book = IncidentBook(self.rules.lifecycle)
        self.extractor = Extractor(self._emit)
        self.rtt = Baselines(_baseline(self.rules, "rtt"), round_tolerance)
        self.nccl = Baselines(_baseline(self.rules, "nccl"), round_tolerance)
        self.localizer = Localizer()
        self._by_signal: dict[str, list[Rule]] = {}
        for rule in self.rules.rules:
            self._by_signal.setdefault(rule.signal, []).append(rule)
        self._records: dict[tuple[str, str, str], Record] = {}
        self._dirty: list[Record] = []
        self._round_ts = float("-inf")
        self._last_eval = float("-inf")
        self._pairs: dict[tuple[str, str], float] = {}  # probe pair -> last observed
        self._ifaces: dict[str, set[str]] = {}  # node -> ethtool/netlink interface names
        self._ib_devices: dict[str, set[str]] = {}
        self._hca_of: dict[tuple[str, str], str] = {}

    # --- configuration -------------------------------------------------------------------------

    def set_topology(
        self, topology: Any, path_oracle: PathOracle | Mapping[tuple[str, str], Collection[str]] | None = None
    ) -> None:
        """Use ``topology`` (``fabricd.topology.Topology``) for element ids and paths.

        ``path_oracle(src_node, dst_node)`` (or a mapping) gives the elements a probe between two
        nodes actually crosses (traceroute / ibtracert, or the switches' ECMP hash model). Without
        it every ECMP alternative is a candidate, and a fault on one leaf-spine link can only be
        narrowed down to the leaf's uplinks (docs/detection.md, blind spots).
        """
        self.localizer = Localizer(topology, path_oracle)
        self._hca_of.clear()

    # --- the one entry point ---------------------------------------------------------------------

    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        changed: dict[str, Incident] = {}
        records, tol = self._records, self.tol
        for node, s in samples:
            r = s.reading
            src = r.source
            wanted = WANTED.get(src)
            if wanted is None:
                continue
            metric = r.name or r.counter  # the neutral name, whatever the source or driver
            if metric not in wanted or r.kind is Kind.INFO or r.kind is Kind.EVENT:
                continue
            ts = s.ts
            if ts > self._round_ts + tol:
                if self._dirty:
                    self._evaluate(self._round_ts, changed)
                self._round_ts = ts
            key = (node, src, r.device)
            rec = records.get(key)
            if rec is None:
                rec = records[key] = Record(node, src, r.device, ts)
                self._learn_device(node, src, r.device)
            if not rec.dirty:
                rec.ts, rec.dirty = ts, True
                self._dirty.append(rec)
            scope = rec.scopes.get(where := (r.port, r.labels))
            if scope is None:
                scope = rec.scopes[where] = {}
            value = s.rate if r.kind is Kind.COUNTER else r.value
            if value is None:
                scope.pop(metric, None)  # no honest rate this scrape: no input (a repeat's last wins)
            else:
                scope[metric] = value
        if self._dirty or self._round_ts > self._last_eval:
            self._evaluate(self._round_ts, changed)
        return list(changed.values())

    def incidents(self) -> list[Incident]:
        """Incidents not yet resolved."""
        return self.book.open()

    # --- signals -> rules ------------------------------------------------------------------------

    def _emit(self, signal: str, node: str, device: str, port: str, labels: Labels, ts: float, value: float) -> None:
        if signal == "rtt_p99":
            self._pairs[(node, device)] = ts
            own, _ = self.rtt.score(("rtt",), (node, device), ts, value)
            self._observe(
                "rtt_p99_outlier", node, device, port, labels, ts, own if self._ready_rtt(node, device) else 0.0
            )
            return
        if signal == "nccl_time":
            _, fleet = self.nccl.score(
                (device, *(v for _, v in labels)), (node, device, *(v for _, v in labels)), ts, value
            )
            self._observe("nccl_time_outlier", node, device, port, labels, ts, fleet)
            return
        if signal == "probe_loss_ratio":
            self._pairs[(node, device)] = ts
        self._observe(signal, node, device, port, labels, ts, value)

    def _ready_rtt(self, node: str, peer: str) -> bool:
        return self.rtt.series_median((node, peer)) is not None

    def _observe(self, signal: str, node: str, device: str, port: str, labels: Labels, ts: float, value: float) -> None:
        for rule in self._by_signal.get(signal, ()):
            self.tracker.observe(rule, node, device, port, labels, ts, value)

    # --- evaluation ------------------------------------------------------------------------------

    def _flush(self) -> None:
        for rec in self._dirty:
            self.extractor.flush(rec)
        self._dirty.clear()

    def _evaluate(self, now: float, changed: dict[str, Incident]) -> None:
        self._flush()
        structural = self.tracker.take_changed()
        firing = self.tracker.firing(now)
        if firing and (structural or now > self._last_eval):
            for inc in self.book.apply(self._propose(now, firing), now):
                changed[inc.key] = inc
        for inc in self.book.resolve_quiet(now):
            changed[inc.key] = inc
        self._last_eval = now

    def _propose(self, now: float, firing: list[Any]) -> list[Proposal]:
        ctx = EvalContext(
            now,
            firing,
            self.localizer,
            self._hca_map(),
            self._healthy(now),
            params=self.rules.params,
            rx_utilization=self._rx_utilization(),
        )
        for inc in self.book.open():
            ctx.open_elements.setdefault(inc.kind, set()).add(inc.element)
            if inc.kind not in (IncidentKind.STRAGGLER, IncidentKind.TAIL_LATENCY):
                ctx.network_nodes.update(_nodes_of(inc))
        out: list[Proposal] = []
        for detect in DETECTORS:
            out.extend(detect(ctx))
        return out

    def _rx_utilization(self) -> dict[str, float]:
        """Last receive utilization per HCA port (context for the HOL root: the incast receiver)."""
        return {
            f"{node}/{dev}": c.rx_utilization
            for (node, dev, _), c in self.extractor.ports.items()
            if c.rx_utilization is not None
        }

    def _healthy(self, now: float) -> list[tuple[str, str]]:
        horizon = now - self.rules.lifecycle.stale_seconds
        return [p for p, ts in self._pairs.items() if ts >= horizon]

    # --- device names -> HCA port ids -----------------------------------------------------------

    def _learn_device(self, node: str, source: str, device: str) -> None:
        if source == IB:
            self._ib_devices.setdefault(node, set()).add(device)
        elif source in ("ethtool", "netlink"):
            self._ifaces.setdefault(node, set()).add(device)
        self._hca_of.clear()

    def _hca_map(self) -> dict[tuple[str, str], str]:
        """Interface names map to HCAs: by name when they match, else by sorted position (the
        kernel names a multi-port NIC's netdevs in PCI order, as it numbers mlx5_N)."""
        if not self._hca_of:
            for node, ifaces in self._ifaces.items():
                hcas = [h.split("/", 1)[1] for h in self.localizer.hcas(node)] or sorted(self._ib_devices.get(node, ()))
                for i, name in enumerate(sorted((i for i in ifaces if i not in hcas), key=_natural)):
                    if i < len(hcas):
                        self._hca_of[(node, name)] = f"{node}/{hcas[i]}"
        return self._hca_of


def _baseline(rules: RuleSet, prefix: str) -> BaselineParams:
    d = BaselineParams()
    p = rules.param
    return BaselineParams(
        history=int(p(f"{prefix}_history", d.history)),
        min_history=int(p(f"{prefix}_min_history", d.min_history)),
        refresh_every=int(p(f"{prefix}_refresh_every", d.refresh_every)),
        rel_floor=p(f"{prefix}_rel_floor", d.rel_floor),
        abs_floor=p(f"{prefix}_abs_floor", d.abs_floor),
        exclude_above=p(f"{prefix}_exclude_above", d.exclude_above),
    )


def _natural(name: str) -> tuple[str, int]:
    """``eth2`` before ``eth10``."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return (stem, int(digits) if digits else -1)


def _nodes_of(inc: Incident) -> set[str]:
    out = {inc.element.split("/", 1)[0]} if inc.element.startswith("node") else set()
    for a in inc.affected:
        out.update(a.split("|"))
    return out
