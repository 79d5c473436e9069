"""Rolling upgrades with real processes: ``fabricd server`` (N) and ``fabricd agent`` at N and N-1.

An N-1 agent is this agent told to write wire version 2 (``transport.wire_version: 2``), byte for
byte what the previous release sent (tests/test_wire.py pins the v2 layout). Each test counts what
the central stored per series and scrape, straight from its SQLite file, as the acceptance tests
do (tests/test_agent_acceptance.py): nothing lost, nothing twice, nothing quarantined.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fabricd.transport.spool import QUARANTINE, unpack
from fabricd.wire import decode
from tests.test_agent_acceptance import Agent, Central, Proc, assert_each_scrape_once, drained, gaps, wait_for

pytestmark = pytest.mark.slow
PREVIOUS = {"FABRICD_TRANSPORT__WIRE_VERSION": "2"}  # N-1: version 3 is this release's


@pytest.fixture
def started() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    yield procs
    for proc in procs:
        if proc.alive():
            proc.kill9()


def spooled_versions(agent: Agent) -> list[int | None]:
    out = []
    for path in sorted(agent.spool.glob("*.batch")):
        sb = unpack(path.read_bytes())
        out.append(decode(sb.body, "application/json" if sb.json else "application/msgpack", sb.gzip).schema_version)
    return out


def assert_nothing_quarantined(agent: Agent) -> None:
    folder = agent.spool / QUARANTINE
    assert not folder.exists() or list(folder.iterdir()) == []
    assert agent.metric("fabricd_agent_spool_quarantined_total") in (0.0, float("nan"))


def test_an_n_minus_1_agent_against_an_n_server_loses_nothing(tmp_path: Path, started: list[Proc]) -> None:
    central = Central(tmp_path)
    agent = Agent(tmp_path, central, **PREVIOUS)
    started += [central, agent]
    central.start()
    agent.start()
    wait_for("5 scrapes stored", lambda: len(central.scrapes("node-1")) >= 5)
    assert agent.metric("fabricd_agent_batches_dropped_total", reason="rejected") == 0
    assert_nothing_quarantined(agent)
    assert agent.term() == 0
    scrapes = assert_each_scrape_once(central, "node-1")
    assert gaps(scrapes) == []
    assert "wire_version=2" in agent.text()
    assert "unsupported_schema_version" not in central.text() + agent.text()


def test_an_n_agent_sends_the_n_minus_1_batches_its_spool_holds(tmp_path: Path, started: list[Proc]) -> None:
    central = Central(tmp_path)  # down while the old agent runs: everything it scrapes is spooled
    old = Agent(tmp_path, central, **PREVIOUS)
    started += [central, old]
    old.start()
    wait_for("4 batches spooled", lambda: old.metric("fabricd_agent_spool_batches") >= 4)
    assert old.term() == 0  # the upgrade: stop the old release ...
    assert set(spooled_versions(old)) == {2}
    spooled = set().union(*old.spooled_timestamps().values())
    new = Agent(tmp_path, central)  # ... start the new one on the same spool
    started.append(new)
    central.start()
    new.start()
    wait_for("the spool to drain", drained(new))
    sent = new.metric("fabricd_agent_batches_sent_total")
    wait_for("live version 3 batches", lambda: new.metric("fabricd_agent_batches_sent_total") >= sent + 3)
    # The spool gauge reaches 0 when the last batch is taken, before the central acknowledges it:
    # wait for the central to hold them (a loaded machine stopped the agent with one in flight).
    wait_for("every spooled scrape stored", lambda: spooled <= set(central.scrapes("node-1")))
    assert_nothing_quarantined(new)
    assert new.term() == 0
    scrapes = assert_each_scrape_once(central, "node-1")
    assert spooled <= set(scrapes), "a version 2 batch from the spool was lost"
    # One hole at most: the seconds between the old agent's stop and the new one's first scrape.
    holes = gaps(scrapes)
    assert len(holes) <= 1 and all(start >= max(spooled) for start, _ in holes)
    assert "wire_version=3" in new.text()
    assert "unsupported_schema_version" not in central.text() + new.text()
