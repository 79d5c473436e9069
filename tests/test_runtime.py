"""The collector runner: a collector that raises or hangs is timed out and reported in its health,
while the others keep running (issue 3 acceptance)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from fabricd.agent.runtime import CollectorRunner
from fabricd.collector import CollectorConfigError, CollectorContext, CollectorOptions, build_collectors
from fabricd.model import Kind, Reading


class Steady:
    name: ClassVar[str] = "steady"

    def __init__(self, ctx: CollectorContext) -> None:
        self.calls = 0

    async def collect(self) -> Sequence[Reading]:
        self.calls += 1
        return [Reading("steady", "dev0", "1", "ticks", float(self.calls), "", Kind.COUNTER)]


class Slow:
    """A source that sleeps far longer than the timeout (a hung firmware query)."""

    name: ClassVar[str] = "slow"

    def __init__(self, ctx: CollectorContext) -> None:
        pass

    async def collect(self) -> Sequence[Reading]:
        await asyncio.sleep(30)
        return []


class Broken:
    name: ClassVar[str] = "broken"

    def __init__(self, ctx: CollectorContext) -> None:
        pass

    async def collect(self) -> Sequence[Reading]:
        raise OSError(5, "Input/output error")


class BlockedThread:
    """Blocks in a thread that cannot be cancelled, like a stuck sysfs read."""

    name: ClassVar[str] = "blocked"

    def __init__(self, ctx: CollectorContext) -> None:
        self.release = threading.Event()
        self.started = 0

    async def collect(self) -> Sequence[Reading]:
        self.started += 1
        await asyncio.to_thread(self.release.wait, 5)
        return []


class WithOptions:
    name: ClassVar[str] = "opts"

    class Options(CollectorOptions):
        peers: list[str] = []
        rate_per_second: float = 10.0

    def __init__(self, ctx: CollectorContext) -> None:
        self.options = ctx.options

    async def collect(self) -> Sequence[Reading]:
        return []


REGISTRY = {
    n: f"tests.test_runtime:{c}"
    for n, c in [
        ("steady", "Steady"),
        ("slow", "Slow"),
        ("broken", "Broken"),
        ("blocked", "BlockedThread"),
        ("opts", "WithOptions"),
    ]
}
REGISTRY["missing"] = "tests.nonexistent_module:Nothing"


def _build(names: list[str]) -> CollectorRunner:
    collectors = build_collectors({n: {} for n in names}, node="n1", sysfs_root=Path("/nonexistent"), registry=REGISTRY)
    return CollectorRunner(collectors, timeout_seconds=0.2)


async def test_hung_and_failing_collectors_are_reported_and_others_keep_running() -> None:
    runner = _build(["steady", "slow", "broken"])
    for scrape in range(1, 3):
        result = await runner.scrape(ts=1000.0 + scrape)
        health = {h.collector: h for h in result.health}
        assert [r.value for r in result.readings] == [float(scrape)]
        assert health["steady"].success and health["steady"].readings == 1
        expected = "timed out after 0.2s" if scrape == 1 else "previous run still in progress"
        assert not health["slow"].success and expected in health["slow"].error
        assert health["slow"].duration_seconds < 2.0
        assert not health["broken"].success and "Input/output error" in health["broken"].error
        assert health["broken"].ts == 1000.0 + scrape
    await runner.close()


async def test_a_collector_stuck_in_a_thread_is_not_started_twice() -> None:
    runner = _build(["blocked", "steady"])
    blocked = runner.collectors["blocked"]
    assert isinstance(blocked, BlockedThread)
    first = await runner.scrape(ts=1.0)
    second = await runner.scrape(ts=2.0)
    assert blocked.started == 1
    assert {h.collector: h.success for h in second.health} == {"blocked": False, "steady": True}
    assert "previous run still in progress" in next(h.error for h in second.health if h.collector == "blocked")
    assert "timed out" in next(h.error for h in first.health if h.collector == "blocked")
    blocked.release.set()
    await asyncio.sleep(0.05)
    third = await runner.scrape(ts=3.0)
    assert all(h.success for h in third.health)
    assert blocked.started == 2
    await runner.close()


def test_unknown_collector_and_bad_options_name_the_key() -> None:
    with pytest.raises(CollectorConfigError, match=r"collectors\.nope: unknown collector"):
        build_collectors({"nope": {}}, node="n", sysfs_root=Path("/"), registry=REGISTRY)
    with pytest.raises(CollectorConfigError, match=r"collectors\.opts\.rate_per_second"):
        build_collectors({"opts": {"rate_per_second": "fast"}}, node="n", sysfs_root=Path("/"), registry=REGISTRY)
    with pytest.raises(CollectorConfigError, match=r"collectors\.opts\.bogus"):
        build_collectors({"opts": {"bogus": 1}}, node="n", sysfs_root=Path("/"), registry=REGISTRY)
    with pytest.raises(CollectorConfigError, match=r"collectors\.missing: cannot load"):
        build_collectors({"missing": {}}, node="n", sysfs_root=Path("/"), registry=REGISTRY)


def test_options_are_validated_into_the_collectors_model() -> None:
    collectors = build_collectors(
        {"opts": {"peers": ["a", "b"], "rate_per_second": "2.5"}}, node="n", sysfs_root=Path("/"), registry=REGISTRY
    )
    opts = collectors["opts"]
    assert isinstance(opts, WithOptions)
    assert opts.options.model_dump() == {"peers": ["a", "b"], "rate_per_second": 2.5}


async def test_infiniband_reads_run_off_the_loop_unless_a_replay_asks_for_inline() -> None:
    """The agent reads sysfs on a thread of the collector's own (a hw_counters read can block);
    ``fabricd eval`` swaps the executor through ``InfinibandFactories.worker`` and reads inline."""
    from collectors.infiniband import InfinibandCollector, InfinibandFactories
    from fabricd.worker import InlineWorker
    from tests.helpers import CASES

    root = CASES / "infiniband" / "gpud-h100" / "sys"
    seen: list[str] = []

    class Spy(InlineWorker):
        async def run(self, fn):  # type: ignore[no-untyped-def]
            seen.append(threading.current_thread().name)
            return await super().run(lambda: (seen.append(threading.current_thread().name), fn())[1])

    default = InfinibandCollector(CollectorContext(node="n1", sysfs_root=root))
    inline = InfinibandCollector(
        CollectorContext(node="n1", sysfs_root=root, factories=(InfinibandFactories(worker=Spy),))
    )
    try:
        threads: list[str] = []
        original = default.scrape
        default.scrape = lambda: (threads.append(threading.current_thread().name), original())[1]  # type: ignore[method-assign]
        from_thread = await default.collect()
        from_loop = await inline.collect()
    finally:
        default.close()
        inline.close()
    loop_thread = threading.current_thread().name
    assert threads == ["fabricd-infiniband"] and threads[0] != loop_thread
    assert seen == [loop_thread, loop_thread]
    assert from_loop and sorted(map(repr, from_loop)) == sorted(map(repr, from_thread))
