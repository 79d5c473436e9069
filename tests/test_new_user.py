"""What a new user tripped over (issue 20, item 8), each tried as they would: the real command line.

Every check runs ``python -m fabricd ...`` as a subprocess (or ``main()``), and asserts the exact
message and exit status a user sees, and that no traceback is printed.
"""

from __future__ import annotations

import re
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from fabricd import units
from fabricd.cli import build_parser, join_relative_times
from fabricd.sim.demo import Demo, DemoOptions, _banner
from fabricd.sim.scenario import load as load_scenario
from fabricd.sim.scenario import shipped
from tests.helpers import CASES, REPO
from tests.support.server import ServerProcess, free_port
from tests.test_demo import _children_of

TREE = CASES / "infiniband" / "procfs" / "sys"


def fabricd(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fabricd", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def refused(proc: subprocess.CompletedProcess[str], code: int, message: str) -> None:
    """Exit ``code``, stderr exactly ``message`` (one line), nothing on stdout, no traceback."""
    assert (proc.returncode, proc.stderr, proc.stdout) == (code, message + "\n", "")


# -- --since -2h -------------------------------------------------------------------------------


def test_relative_times_after_a_space_are_values_not_options() -> None:
    argv = ["incidents", "--since", "-2h", "--open", "--until", "-90m", "--limit", "-3"]
    assert join_relative_times(argv) == ["incidents", "--since=-2h", "--open", "--until=-90m", "--limit", "-3"]


def test_incidents_and_report_take_since_minus_2h() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    for args in (["incidents", "--since", "-2h"], ["report", "--since", "-2h", "--until", "-1h"]):
        proc = fabricd(*args, "--server", closed)
        # Parsed: it went on to call the server (exit 3, unreachable), not a usage error (2).
        assert proc.returncode == 3 and "expected one argument" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"fabricd: cannot reach {closed}")


def test_every_report_example_in_the_docs_parses() -> None:
    doc = (REPO / "docs" / "report.md").read_text()
    examples = [line.split("#")[0].split() for line in doc.splitlines() if line.startswith("fabricd report ")]
    assert len(examples) >= 3
    for example in examples:
        args = build_parser().parse_args(join_relative_times(example[1:]))
        assert args.command == "report"
    since = build_parser().parse_args(join_relative_times(shlex.split("report --since -2h --until -1h")))
    assert (since.since, since.until) == ("-2h", "-1h")


# -- --db ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url,code,message",
    [
        (
            "notaurl",
            2,
            "fabricd: --db 'notaurl' is not a database URL; e.g. sqlite:////var/lib/fabricd/fabricd.db "
            "or postgresql+psycopg://fabricd@db-host/fabricd",
        ),
        (
            "mysql://u@db-host/fabricd",
            2,
            "fabricd: --db 'mysql://u@db-host/fabricd': the driver MySQLdb is not "
            "installed; fabricd supports SQLite and PostgreSQL (postgresql+psycopg://, pip install 'fabricd[server]')",
        ),
        (
            "oracle2://u@h/db",
            2,
            "fabricd: --db 'oracle2://u@h/db': unknown database kind; fabricd supports SQLite and PostgreSQL",
        ),
        (
            "sqlite:////proc/fabricd/x.db",
            1,
            "fabricd: cannot create the folder of the database sqlite:////proc/fabricd/x.db: No such file or directory",
        ),
    ],
)
def test_a_bad_db_url_is_one_clear_line(tmp_path: Path, url: str, code: int, message: str) -> None:
    refused(fabricd("server", "--db", url, "--data-dir", str(tmp_path)), code, message)


def test_a_sqlite_file_that_cannot_be_opened_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "db.sqlite"
    folder.mkdir()  # a folder where the file should be
    proc = fabricd("server", "--db", f"sqlite:///{folder}", "--data-dir", str(tmp_path))
    refused(proc, 1, f"fabricd: cannot open the database sqlite:///{folder}: unable to open database file")


def test_token_commands_never_create_a_database(tmp_path: Path) -> None:
    typo = tmp_path / "fabirc.db"
    proc = fabricd("token", "create", "--role", "agent", "--db", f"sqlite:///{typo}")
    refused(
        proc,
        1,
        f"fabricd: no fabricd database at sqlite:///{typo} (no such file); check --db/--data-dir, "
        "or start `fabricd server` once with them to create it",
    )
    assert not typo.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    proc = fabricd("token", "list", "--db", f"sqlite:///{empty}")
    refused(
        proc,
        1,
        f"fabricd: sqlite:///{empty} holds no fabricd schema; check --db, or start `fabricd server` once with it "
        "to create it",
    )
    with sqlite3.connect(empty) as con:  # not migrated either
        assert con.execute("SELECT name FROM sqlite_master").fetchall() == []
    refused(
        fabricd("token", "list", "--db", "notaurl"),
        2,
        "fabricd: --db 'notaurl' is not a database URL; e.g. "
        "sqlite:////var/lib/fabricd/fabricd.db or postgresql+psycopg://fabricd@db-host/fabricd",
    )


# -- agent and collect -----------------------------------------------------------------------


def test_a_bad_central_url_is_refused_at_start(tmp_path: Path) -> None:
    for url in ("htp:/oops", "http://", "central:9470", "http://h:99999"):
        proc = fabricd("agent", "--central", url, "--sysfs-root", str(TREE), "--data-dir", str(tmp_path))
        refused(
            proc,
            2,
            f"fabricd: invalid settings: central: {url!r} is not an http:// or https:// URL with a host, "
            "e.g. http://fabricd-central:9470",
        )
    assert not (tmp_path / "spool").exists()  # refused before anything was spooled


def test_a_missing_sysfs_root_is_refused_not_read_as_empty() -> None:
    for command in (["collect", "--once"], ["agent"]):
        proc = fabricd(*command, "--sysfs-root", "/nonexistent")
        refused(proc, 2, "fabricd: sysfs_root: /nonexistent is not a directory (--sysfs-root, FABRICD_SYSFS_ROOT)")


# -- settings files and hooks ----------------------------------------------------------------


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "agent.yaml"
    bad.write_text("central: http://c:9470\ntransport:\n\tcompress: false\n")
    refused(
        fabricd("agent", "-c", str(bad)),
        2,
        f"fabricd: {bad}:3:1: not valid YAML: while scanning for the next token: "
        "found character '\\t' that cannot start any token",
    )


def test_a_hook_without_kind_says_which_kinds_exist(tmp_path: Path) -> None:
    cfg = tmp_path / "server.yaml"
    cfg.write_text("hooks:\n  - url: https://ops.example/fabricd\n  - {kind: pagerduty, url: https://x.example}\n")
    refused(
        fabricd("hooks", "list", "-c", str(cfg)),
        2,
        "fabricd: invalid hook settings: hooks[0].kind: missing; each hook needs kind: webhook, alertmanager, "
        "slack; hooks[1].kind: 'pagerduty' is not a hook kind; use one of webhook, alertmanager, slack",
    )


def test_hooks_list_without_hooks_says_so(tmp_path: Path) -> None:
    refused(
        fabricd("hooks", "list"),
        0,
        "fabricd: no alert hooks configured (no settings file: pass -c server.yaml); add a 'hooks:' list "
        "(docs/prometheus.md)",
    )
    cfg = tmp_path / "server.yaml"
    cfg.write_text("listen: 127.0.0.1:9470\n")
    refused(
        fabricd("hooks", "test", "-c", str(cfg)),
        1,
        f"fabricd: no alert hooks configured in {cfg}; add a 'hooks:' list (docs/prometheus.md)",
    )


# -- sim, eval, the demo banner --------------------------------------------------------------


def test_sim_and_eval_list_every_scenario_with_its_description() -> None:
    sim, ev = fabricd("sim", "--list"), fabricd("eval", "--list")
    assert sim.returncode == ev.returncode == 0 and sim.stdout == ev.stdout
    lines = sim.stdout.splitlines()
    assert [line.split()[0] for line in lines] == shipped()
    for line in lines:
        name, description = line.split(maxsplit=1)
        assert description == " ".join(load_scenario(name).description.split()) != ""
    assert "--list" in fabricd("sim", "--help").stdout


def test_the_demo_banner_says_which_fault_where_and_when() -> None:
    options = DemoOptions(listen="127.0.0.1:9470", speed=2.0)
    demo = Demo(options, sim=SimpleNamespace(scenario=load_scenario("demo")))
    banner = _banner(demo, [f"node-{i:03d}" for i in range(16)])
    # demo.yaml: congestion at leaf-02~spine-01 from 75 s to 2 h, at twice real time
    assert "  fault        congestion at leaf-02~spine-01, from 0m38s to 1h00m from now (severity 0.7)\n" in banner
    fixture = _banner(Demo(DemoOptions(fixture=True)), ["demo-node-001"])
    assert "  no fault is injected: the captured tree is static\n" in fixture


# -- units -----------------------------------------------------------------------------------


def test_every_view_formats_units_one_way() -> None:
    assert units.throughput(30e9) == "240 Gb/s"  # bytes/s in, bits/s out, as link rates are named
    assert units.throughput(50e9) == "400 Gb/s"
    assert units.throughput(None) == "-"
    assert units.rate(11_400.0, "ticks") == "11.4k ticks/s"
    assert units.rate(3.0, "errors") == "3 errors/s"
    assert units.percent(0.123) == "12.3%"
    assert units.si(0.00025) == "0.00025"


# -- the demo's processes --------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow
def test_a_sigkilled_demo_takes_its_server_and_agents_with_it(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "demo.out").open("w")
    args = ["demo", "--fixture", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d")]
    demo = subprocess.Popen([sys.executable, "-m", "fabricd", *args], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while "fabricd demo is running" not in (tmp_path / "demo.out").read_text():
            assert demo.poll() is None and time.monotonic() < deadline, (tmp_path / "demo.out").read_text()
            time.sleep(0.2)
        children = _children_of(demo.pid)
        assert len(children) == 2  # the central service and one agent
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        demo.send_signal(signal.SIGKILL)
        demo.wait(10)
        deadline = time.monotonic() + 30
        while any(map(_alive, children)) or not _port_free(port):
            assert time.monotonic() < deadline, f"still running: {[p for p in children if _alive(p)]}"
            time.sleep(0.2)
    finally:
        for pid in [demo.pid, *children]:
            if _alive(pid):
                subprocess.run(["kill", "-9", str(pid)], check=False)
        log.close()


def test_a_demo_whose_port_is_taken_says_so_before_starting_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = fabricd("demo", "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"), timeout=30)
    refused(
        proc,
        1,
        f"fabricd demo: 127.0.0.1:{port} is already in use (another fabricd demo or server?): stop it, or pick "
        "another address with --listen (Address already in use)",
    )
    assert not (tmp_path / "d").exists()


# -- /docs on an air-gapped cluster ----------------------------------------------------------


@pytest.mark.slow
def test_api_docs_load_every_asset_from_the_service_itself(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, auth=False).start()
    try:
        for page in ("/docs", "/redoc"):
            html = httpx.get(server.url + page, timeout=10)
            assert html.status_code == 200 and "text/html" in html.headers["content-type"]
            assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text)
            assets += re.findall(r"""url: ?["']([^"']+)["']""", html.text)
            assert assets and all(a.startswith("/") for a in assets), f"{page} loads from elsewhere: {assets}"
            for asset in assets:
                got = httpx.get(server.url + asset, timeout=10)
                assert got.status_code == 200, asset
            scripts = [a for a in assets if a.endswith(".js")]
            assert scripts and all(len(httpx.get(server.url + s, timeout=10).content) > 500_000 for s in scripts)
        spec = httpx.get(server.url + "/openapi.json", timeout=10).json()
        assert spec["paths"]["/api/v1/ingest"]
    finally:
        server.stop()
