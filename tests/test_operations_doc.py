"""README's "Install on real nodes" and docs/operations.md: what they point to exists, and the
SQLite backup they give is a real backup of a running central (restored, it serves the same data)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import REPO
from tests.support.server import ServerProcess, encoded, ib_sample, make_batch


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def test_the_install_section_and_the_operations_guide_point_to_files_that_exist() -> None:
    readme = _section((REPO / "README.md").read_text(), "Install on real nodes")
    guide = (REPO / "docs" / "operations.md").read_text()
    paths = set(re.findall(r"`((?:deploy|docs)/[\w./-]+)`", readme + guide))
    assert {"deploy/systemd/fabricd-agent.service", "deploy/kubernetes/agent-daemonset.yaml"} <= paths
    for path in paths:
        assert (REPO / path).exists(), path
    for title in ("Sizing", "Upgrades", "Backup and restore", "Rotating tokens", "TLS between agents and the central"):
        assert f"\n## {title}\n" in guide
    assert "## When a spool grows" in guide and "## When a node goes stale" in guide


def _python_backup_command(db: Path, target: Path) -> list[str]:
    guide = (REPO / "docs" / "operations.md").read_text()
    block = re.search(r"python3 -c (\".*?\") \\\n", guide)
    assert block, "the Python backup command is gone from docs/operations.md"
    return [sys.executable, "-c", shlex.split(block.group(1))[0], str(db), str(target)]


@pytest.mark.slow
def test_the_documented_sqlite_backup_of_a_running_central_restores(tmp_path: Path) -> None:
    live = tmp_path / "live"
    server = ServerProcess(live, auth=False).start()
    try:
        body, headers = encoded(make_batch("node-1", "b-1", [ib_sample(1000.0), ib_sample(1010.0)]))
        assert httpx.post(f"{server.url}/api/v1/ingest", content=body, headers=headers, timeout=10).status_code == 200
        backup = tmp_path / "backup.db"
        proc = subprocess.run(_python_backup_command(live / "fabricd.db", backup), capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        before = httpx.get(f"{server.url}/api/v1/nodes", timeout=10).json()
    finally:
        server.stop()
    restored = tmp_path / "restored"
    restored.mkdir()
    (restored / "fabricd.db").write_bytes(backup.read_bytes())
    again = ServerProcess(restored, auth=False).start()
    try:
        after = httpx.get(f"{again.url}/api/v1/nodes", timeout=10).json()
    finally:
        again.stop()
    assert [n["node"] for n in after] == [n["node"] for n in before] == ["node-1"]
