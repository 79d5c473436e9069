"""``fabricd agent`` as an operator runs it: config errors, SIGTERM, the local /metrics."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
from pathlib import Path

import httpx
import pytest

from fabricd import __version__
from fabricd.agent.main import run_agent
from fabricd.settings import AgentSettings
from fabricd.transport.spool import unpack
from fabricd.wire import decode
from tests.helpers import CASES, REPO, need_binary
from tests.test_transport_central_double import CentralDouble, free_port, until

SYSFS = CASES / "infiniband" / "procfs" / "sys"


def test_an_unknown_collector_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = AgentSettings(node="n1", data_dir=tmp_path, collectors={"infiniband": {}, "nosuch": {}})
    assert run_agent(settings) == 2
    assert "collectors.nosuch: unknown collector" in capsys.readouterr().err


def test_a_bad_collector_option_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = AgentSettings(node="n1", data_dir=tmp_path, collectors={"infiniband": {"no_such_option": 1}})
    assert run_agent(settings) == 2
    assert "collectors.infiniband.no_such_option" in capsys.readouterr().err


def test_a_busy_metrics_port_exits_2_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        listen = f"127.0.0.1:{busy.getsockname()[1]}"
        settings = AgentSettings(node="n1", data_dir=tmp_path, sysfs_root=SYSFS, metrics_listen=listen)
        assert run_agent(settings) == 2
    assert f"metrics_listen: cannot serve on {listen!r}" in capsys.readouterr().err


async def _agent(tmp_path: Path, central: str, metrics_port: int) -> asyncio.subprocess.Process:
    sysfs = tmp_path / "sys"
    if not sysfs.exists():
        shutil.copytree(SYSFS, sysfs)
    # The batch window is long, so only the SIGTERM flush can deliver what was scraped.
    env = dict(os.environ, FABRICD_TRANSPORT__BATCH_MAX_SECONDS="600", FABRICD_TRANSPORT__TIMEOUT_SECONDS="2")
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fabricd",
        "agent",
        "--central",
        central,
        "--node",
        "node-7",
        "--sysfs-root",
        str(sysfs),
        "--interval",
        "0.3",
        "--data-dir",
        str(tmp_path / "data"),
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
        cwd=REPO,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )


async def _metrics_once_rates_exist(port: int) -> str:
    """The agent's /metrics once a second scrape has produced rates."""
    async with httpx.AsyncClient() as client:
        for _ in range(300):
            try:
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            except httpx.TransportError:
                text = ""
            if "fabricd_infiniband_vl15_dropped_per_second{" in text:  # a counter's rate: 2nd scrape
                return text
            await asyncio.sleep(0.05)
    raise AssertionError("the agent never served rates on /metrics")


async def _stop(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode if proc.returncode is not None else -1, err.decode()


async def test_sigterm_sends_the_pending_batch_and_exits_0(tmp_path: Path) -> None:
    central = CentralDouble()
    await central.start()
    port = free_port()
    proc = await _agent(tmp_path, central.url, port)
    try:
        metrics = await _metrics_once_rates_exist(port)
        assert central.order == []  # nothing sent yet: the batch is still open
        code, log = await _stop(proc)
        await until(lambda: len(central.order) == 1, seconds=5)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await central.stop()
    assert code == 0, log
    batch = central.batches[central.order[0]]
    assert batch.node == "node-7" and len({s.ts for s in batch.samples}) >= 2
    assert {h.collector for h in batch.health} == {"infiniband"}
    # the local /metrics shows both the agent's own health and what it scraped
    assert 'fabricd_agent_batches_sent_total{node="node-7"} 0.0' in metrics.splitlines()
    assert 'fabricd_collector_success{collector="infiniband",node="node-7"} 1.0' in metrics.splitlines()
    assert 'fabricd_agent_info{node="node-7",version="' + __version__ + '"} 1.0' in metrics.splitlines()
    assert 'node="node-7"' in metrics and "fabricd_infiniband_" in metrics
    lint = await asyncio.create_subprocess_exec(
        need_binary("promtool"),
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await lint.communicate(metrics.encode())
    assert lint.returncode == 0, out.decode()  # promtool's lint: names, suffixes, help texts


async def test_sigterm_while_the_central_is_down_spools_the_pending_batch(tmp_path: Path) -> None:
    port = free_port()
    proc = await _agent(tmp_path, f"http://127.0.0.1:{free_port()}", port)
    try:
        await _metrics_once_rates_exist(port)
        code, log = await _stop(proc)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 0, log
    files = sorted((tmp_path / "data" / "spool").glob("*.batch"))
    assert len(files) == 1
    spooled = unpack(files[0].read_bytes())
    batch = decode(spooled.body, gzipped=spooled.gzip)
    assert batch.node == "node-7" and len({s.ts for s in batch.samples}) >= 2
    assert "central unreachable" in log
