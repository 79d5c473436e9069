"""The detection engine: samples in (event-time order), incidents whose state changed out.

    samples -> Record per (node, source, device) scrape -> signals (``signals.Extractor``)
            -> rules (``findings.Tracker``: window, for, hysteresis) -> findings
            -> detectors (hol, loss, congestion, latency; each claims what it explains)
            -> proposals -> ``IncidentBook`` (open / update / resolve / reopen / flap damping)

Everything runs on the samples' timestamps: no wall clock, so a simulated hour replays in seconds and a
test is deterministic. Evaluation (detectors + lifecycle) happens when event time moves to a new scrape
round and at the end of every ``process`` call, at most once per round unless a finding changed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fabricd.detect import congestion, hol, latency, loss
from fabricd.detect.absorb import Programs, absorb_rows
from fabricd.detect.base import PAIR_SIGNALS, EvalContext
from fabricd.detect.delays import Delays
from fabricd.detect.findings import Tracker
from fabricd.detect.incidents import IncidentBook, Proposal
from fabricd.detect.latency import BaselineParams, Baselines
from fabricd.detect.localize import Localizer, PathOracle
from fabricd.detect.responders import REPORTS, Responders
from fabricd.detect.rules import Rule, RuleSet, load_rules
from fabricd.detect.settle import Scrape
from fabricd.detect.signals import IB, SIGNALS, WANTED, Extractor, Record
from fabricd.model import Incident, IncidentKind, Kind, Labels, Sample
from fabricd.scrape_rows import ScrapeRows

# More than this share of all probed pairs bad at once is a probing failure, not a fabric fault: a
# spine down in a 2-spine fabric takes half of the inter-leaf pairs, fewer than half of all pairs.
PROBE_STORM_SHARE = 0.6
RUNS_KEPT = 8  # NCCL runs remembered per node (their hosts)
RUN_HOST = "run_host_info"  # an NCCL run's hosts (``_run_host``), read whatever its source
DEFAULT_INTERVAL_SECONDS = 10.0  # the agent's default scrape interval, until one is learned
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
        self.delays = Delays(
            Baselines(_baseline(self.rules, "rtt_queue"), round_tolerance),
            Baselines(_baseline(self.rules, "rtt"), round_tolerance),
        )
        self._rtt_rows: dict[tuple[str, str, Labels, float], list[float | None]] = {}
        self.responders = Responders()  # pairs to a node whose agent was down: unanswerable, not lost
        self.nccl = Baselines(_baseline(self.rules, "nccl"), round_tolerance)
        self.localizer = Localizer()
        self._by_signal: dict[str, list[Rule]] = {}
        for rule in self.rules.rules:
            self._by_signal.setdefault(rule.signal, []).append(rule)
        self._records: dict[tuple[str, str, str], Record] = {}
        self._programs = Programs(WANTED, RUN_HOST)  # stored scrapes' intake, by layout
        self._dirty: list[Record] = []
        self._round_ts = float("-inf")
        self.interval: float | None = None  # learned scrape interval (``_learn_interval``)
        self.run_hosts: dict[str, list[tuple[float, set[str]]]] = {}  # node -> its last NCCL runs' hosts
        self.run_scores: dict[str, dict[float, float]] = {}  # node -> run ts -> its fleet score
        self._last_eval = float("-inf")
        self._active: set[str] = set()  # the last evaluation's EvalContext.active
        self._pairs: dict[tuple[str, str], float] = {}  # probe pair -> last observed
        self._queue_scores: dict[tuple[str, str], float] = {}  # probe pair -> last rtt_queue_outlier
        self._ifaces: dict[str, set[str]] = {}  # node -> ethtool/netlink interface names
        self._ib_devices: dict[str, set[str]] = {}
        self._hca_of: dict[tuple[str, str], str] = {}

    # --- configuration -------------------------------------------------------------------------

    def set_topology(
        self,
        topology: Any,
        path_oracle: PathOracle | Mapping[tuple[str, str], Collection[str]] | None = None,
        reply_oracle: PathOracle | Mapping[tuple[str, str], Collection[str]] | None = None,
    ) -> None:
        """Use ``topology`` (``fabricd.topology.Topology``) for element ids and paths.

        ``path_oracle(src_node, dst_node)`` (or a mapping) gives the elements a probe between two
        nodes actually crosses (traceroute / ibtracert, or the switches' ECMP hash model). Without
        it every ECMP alternative is a candidate, and a fault on one leaf-spine link can only be
        narrowed down to the leaf's uplinks (docs/detection.md, blind spots).

        ``reply_oracle(src_node, dst_node)`` gives the path of the replies to those probes, from dst
        back to src (None where unknown: every ECMP alternative). Without it replies retrace the
        forward path (symmetric routing, as the simulator models it) and links have no direction.
        """
        self.localizer = Localizer(topology, path_oracle, reply_oracle)
        self._hca_of.clear()

    def inputs(self) -> dict[str, frozenset[str]]:
        """What ``_absorb`` reads: source -> neutral names (every other sample is skipped there, so a
        reader may leave it out before building it: ``fabricd.server.store.records.Keep``)."""
        return {src: names | {RUN_HOST} for src, names in WANTED.items()}

    # --- the one entry point ---------------------------------------------------------------------

    def process(self, samples: Sequence[tuple[str, Sample]]) -> list[Incident]:
        """Samples in event-time order, evaluated at each new scrape round (aligned rounds, tests)."""
        changed: dict[str, Incident] = {}
        self._absorb(_by_node(samples), changed, rounds=True)
        if self._dirty or self._round_ts > self._last_eval:
            self._evaluate(self._round_ts, changed)
        return list(changed.values())

    def process_moment(self, samples: Sequence[tuple[str, Sample]], now: float) -> list[Incident]:
        """``process_scrapes`` for samples one by one with their nodes."""
        return self.process_scrapes(_by_node(samples), now)

    def process_scrapes(self, scrapes: Sequence[Scrape], now: float, silent: Collection[str] = ()) -> list[Incident]:
        """One settled moment (``fabricd.detect.settle``): every sample up to event time ``now``, as
        the nodes' scrapes, evaluated once at ``now``. Late samples (older than earlier moments)
        are folded in. ``silent``: the nodes settlement left out of it (their agents unheard past
        the lateness), whose probe responders may be down too (``Responders.silent``)."""
        changed: dict[str, Incident] = {}
        self.responders.silent = frozenset(silent)
        self._absorb(scrapes, changed, rounds=False)
        self._round_ts = max(self._round_ts, now)
        self._evaluate(self._round_ts, changed)
        return list(changed.values())

    def _absorb(self, scrapes: Sequence[Scrape], changed: dict[str, Incident], rounds: bool) -> None:
        tol, counter, info, event = self.tol, Kind.COUNTER, Kind.INFO, Kind.EVENT
        # The record and scope of the previous sample: a scrape's samples come grouped by device
        # and port, so most samples skip the lookups (docs/storage.md, "One replica's cost").
        # Compared by value: the agents' readings repeat equal names as distinct objects.
        for node, samples in scrapes:
            if type(samples) is ScrapeRows and not rounds:  # stored rows: the layout's program
                absorb_rows(self._programs.of(samples.layout), node, samples, self._record, self._run_host)
                continue
            rec: Record | None = None
            l_src = l_dev = l_port = None
            l_ts, l_labels = 0.0, None
            scope: dict[str, float] = {}
            for s in samples:
                r = s.reading
                src = r.source
                wanted = WANTED.get(src)
                if wanted is None:
                    continue
                metric = r.name or r.counter  # the neutral name, whatever the source or driver
                kind = r.kind
                if metric not in wanted or kind is info or kind is event:
                    if metric == RUN_HOST:
                        self._run_host(node, s.ts, r.labels)
                    continue
                ts = s.ts
                if rounds and ts > self._round_ts + tol:
                    if self._dirty:
                        self._evaluate(self._round_ts, changed)
                        rec = None  # evaluation flushed the records
                    self._round_ts = ts
                if rec is None or ts != l_ts or r.device != l_dev or src != l_src:
                    l_src, l_dev, l_ts, l_port = src, r.device, ts, None
                    rec = self._record(node, src, r.device, ts)
                if r.port != l_port or r.labels != l_labels:
                    l_port, l_labels = r.port, r.labels
                    scope = rec.scopes.get(where := (r.port, r.labels)) or rec.scopes.setdefault(where, {})
                value = s.rate if kind is counter else r.value
                if value is None:
                    scope.pop(metric, None)  # no honest rate this scrape: no input (a repeat's last wins)
                else:
                    scope[metric] = value

    def _record(self, node: str, src: str, device: str, ts: float) -> Record:
        """The record of (node, source, device) for a scrape at ``ts``, marked dirty."""
        tol = self.tol
        key = (node, src, device)
        rec = self._records.get(key)
        if rec is None:
            rec = self._records[key] = Record(node, src, device, ts)
            self._learn_device(node, src, device)
        elif ts > rec.ts + tol and src == IB:
            self._learn_interval(ts - rec.ts)
        if rec.dirty and ts > rec.ts + tol:
            self.extractor.flush(rec)  # a second scrape of it in one moment (a spool replayed)
        if not rec.dirty:
            rec.ts, rec.dirty = ts, True
            self._dirty.append(rec)
        return rec

    def _run_host(self, node: str, ts: float, labels: Labels) -> None:
        """Who ran the node's NCCL-tests run at ``ts`` (straggler or victim: ``latency._stragglers``)."""
        host = dict(labels).get("host")
        if host is None:
            return
        runs = self.run_hosts.setdefault(node, [])
        if runs and runs[-1][0] == ts:
            runs[-1][1].add(host)
        else:
            runs.append((ts, {host}))
            del runs[:-RUNS_KEPT]

    def _learn_interval(self, gap: float) -> None:
        """The fleet's scrape interval, from the gaps between a port's scrapes (smoothed); detectors
        wait this long for the nodes that have not scraped since a symptom began."""
        if self.interval is None:
            self.interval = gap
        elif gap < 3 * self.interval:  # not the silence of a node that just came back
            self.interval = 0.95 * self.interval + 0.05 * gap

    def incidents(self) -> list[Incident]:
        """Incidents not yet resolved."""
        return self.book.open()

    def adopt(self, incidents: Iterable[Incident]) -> list[Incident]:
        """Open incidents stored by a previous engine become this one's (``IncidentBook.adopt``)."""
        return self.book.adopt(incidents)

    # --- signals -> rules ------------------------------------------------------------------------

    def _emit(self, signal: str, node: str, device: str, port: str, labels: Labels, ts: float, value: float) -> None:
        if signal in ("rtt_min", "rtt_p99"):
            self._pairs[(node, device)] = ts
            row = self._rtt_rows.setdefault((node, device, labels, ts), [None, None])
            row[0 if signal == "rtt_min" else 1] = value
            return
        if signal == "nccl_time":
            sizes = tuple(v for _, v in labels)
            _, fleet = self.nccl.score((device, *sizes), (node, device, *sizes), ts, value)
            self._observe("nccl_time_outlier", node, device, port, labels, ts, fleet)
            scores = self.run_scores.setdefault(node, {})
            scores[ts] = max(scores.get(ts, fleet), fleet)  # the run's slowest size
            if len(scores) > RUNS_KEPT:
                del scores[min(scores)]
            return
        if signal == "probe_loss_ratio":  # observed once the moment's responder starts are read
            self._pairs[(node, device)] = ts
            return self.responders.hold(node, device, port, labels, ts, value)
        if signal not in REPORTS:
            return self._observe(signal, node, device, port, labels, ts, value)
        self.responders.report(signal, node, ts, value)

    def _observe_delay(
        self, signal: str, node: str, device: str, port: str, labels: Labels, ts: float, value: float
    ) -> None:
        """The delay scores, off the per-sample path: the queue score is kept per pair as well."""
        if signal == "rtt_queue_outlier":
            self._queue_scores[(node, device)] = value
        self._observe(signal, node, device, port, labels, ts, value)

    def _observe(self, signal: str, node: str, device: str, port: str, labels: Labels, ts: float, value: float) -> None:
        for rule in self._by_signal.get(signal, ()):
            self.tracker.observe(rule, node, device, port, labels, ts, value)

    # --- evaluation ------------------------------------------------------------------------------

    def _flush(self) -> None:
        for rec in self._dirty:
            if rec.dirty:
                self.extractor.flush(rec)
        self._dirty.clear()
        self.responders.release("probe_loss_ratio", self._observe)
        if self._rtt_rows:
            for (node, peer, labels, ts), (low, p99) in self._rtt_rows.items():
                self.delays.add(node, peer, labels, ts, low, p99)
            self._rtt_rows.clear()
            self.delays.flush(self._observe_delay)

    def _evaluate(self, now: float, changed: dict[str, Incident]) -> None:
        self._flush()
        structural = self.tracker.take_changed()
        firing = self.tracker.firing(now)
        if firing and (structural or now > self._last_eval):
            for inc in self.book.apply(self._propose(now, firing), now):
                changed[inc.key] = inc
            self.book.touch(self._active, now)
        for inc in self.book.resolve_quiet(now):
            changed[inc.key] = inc
        self._last_eval = now

    def _propose(self, now: float, firing: list[Any]) -> list[Proposal]:
        healthy = self._healthy(now)
        pending = self.tracker.pending_findings(now)
        if probing_failed(firing, pending, healthy, self.rules.param("probe_storm_share", PROBE_STORM_SHARE)):
            # Most probed pairs went bad at once: no fabric element is crossed by all of them (pairs
            # within a leaf share none with pairs across it), so it is the probing itself (hosts
            # stalled, responders gone), not the fabric. Pair findings say nothing until it passes.
            firing = [f for f in firing if f.signal not in PAIR_SIGNALS]
            pending = [f for f in pending if f.signal not in PAIR_SIGNALS]
        ctx = EvalContext(
            now,
            firing,
            self.localizer,
            self._hca_map(),
            healthy,
            params=self.rules.params,
            rx_utilization=self._rx_utilization(),
            pending=pending,
            interval=self.interval or DEFAULT_INTERVAL_SECONDS,
            run_hosts=self.run_hosts,
            run_scores=self.run_scores,
            rtt_unsure=self._unsure(healthy),
        )
        for inc in self.book.open():
            ctx.open_elements.setdefault(inc.kind, set()).add(inc.element)
            if inc.kind not in (IncidentKind.STRAGGLER, IncidentKind.TAIL_LATENCY):
                ctx.network_nodes.update(_nodes_of(inc, self.localizer))
        out: list[Proposal] = []
        for detect in DETECTORS:
            out.extend(detect(ctx))
        self._active = ctx.active
        return out

    def _rx_utilization(self) -> dict[str, float]:
        """Last receive utilization per HCA port (context for the HOL root: the incast receiver)."""
        ports = self.extractor.ports.items()
        return {f"{node}/{dev}": c.rx_utilization for (node, dev, _), c in ports if c.rx_utilization is not None}

    def _unsure(self, healthy: list[tuple[str, str]]) -> set[tuple[str, str]]:
        """Recent pairs whose queue score sits between the rule's ``clear`` and its condition."""
        rule = next((r for r in self._by_signal.get("rtt_queue_outlier", ()) if r.clear is not None), None)
        if rule is None or rule.clear is None:
            return set()
        low = rule.clear.threshold
        return {p for p in healthy if self._queue_scores.get(p, 0.0) >= low}

    def _healthy(self, now: float) -> list[tuple[str, str]]:
        horizon = now - self.rules.lifecycle.stale_seconds
        return [p for p, ts in self._pairs.items() if ts >= horizon and not self.responders.says_nothing(p)]

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
                known = (self.localizer.element(h) for h in self.localizer.hcas(node))
                hcas = [e.device for e in known if e is not None] or sorted(self._ib_devices.get(node, ()))
                for i, name in enumerate(sorted((i for i in ifaces if i not in hcas), key=_natural)):
                    if i < len(hcas):
                        self._hca_of[(node, name)] = self.localizer.hca(node, hcas[i])
        return self._hca_of


def probing_failed(firing: list[Any], pending: list[Any], pairs: list[tuple[str, str]], share: float) -> bool:
    """Whether more than ``share`` of the recently probed pairs (at least 4) have a pair finding."""
    if len(pairs) < 4:
        return False
    bad = {(f.node, f.device) for f in (*firing, *pending) if f.signal in PAIR_SIGNALS}
    return len(bad & set(pairs)) > share * len(pairs)


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
        fleet_gate=not prefix.startswith("rtt"),  # pairs differ by path: never judged by the fleet
    )


def _by_node(samples: Sequence[tuple[str, Sample]]) -> list[tuple[str, list[Sample]]]:
    """Consecutive samples of one node as one group."""
    out: list[tuple[str, list[Sample]]] = []
    for node, s in samples:
        if out and out[-1][0] == node:
            out[-1][1].append(s)
        else:
            out.append((node, [s]))
    return out


def _natural(name: str) -> tuple[str, int]:
    """``eth2`` before ``eth10``."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return (stem, int(digits) if digits else -1)


def _nodes_of(inc: Incident, localizer: Localizer) -> set[str]:
    """The incident's host (its element's, as the topology has it) and the nodes it affects."""
    node = localizer.node_of(inc.element)
    out = {node} if node else set()
    for a in inc.affected:
        out.update(a.split("|"))
    return out
