"""The shared subprocess runner (``fabricd.command``) with real processes: output, exit status, a
command that cannot start, and a timeout or cancellation that must leave no process behind."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fabricd.command import CommandResult, SubprocessRunner
from tests.helpers import need_binary


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (killed, waiting for whoever adopted it to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in {"Z", "X"}


async def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_output_interleaves_stdout_and_stderr_and_keeps_the_exit_status() -> None:
    sh = need_binary("sh")
    result = await SubprocessRunner().run([sh, "-c", "echo out; echo err >&2; exit 3"], timeout_seconds=10)
    assert (result.output, result.returncode, result.timed_out, result.error) == ("out\nerr\n", 3, False, "")
    assert result.duration_seconds > 0


async def test_undecodable_output_is_replaced_not_raised() -> None:
    sh = need_binary("sh")
    result = await SubprocessRunner().run([sh, "-c", r"printf 'a\377b\n'"], timeout_seconds=10)
    assert (result.output, result.returncode) == ("a\ufffdb\n", 0)


async def test_a_command_that_cannot_start_is_a_result_not_an_exception() -> None:
    result = await SubprocessRunner().run(["/nonexistent/perfquery", "-x"], timeout_seconds=10)
    assert result == CommandResult("", None, error="FileNotFoundError: No such file or directory")


async def test_a_timeout_kills_the_command_and_everything_it_started(tmp_path: Path) -> None:
    sh, sleep = need_binary("sh"), need_binary("sleep")
    pid_file = tmp_path / "child.pid"
    # sh starts a grandchild (as mpirun starts ranks) that would hold the pipe open for 30 s.
    argv = [sh, "-c", f'{sleep} 30 & echo $! > "{pid_file}"; wait']
    started = time.monotonic()
    result = await SubprocessRunner().run(argv, timeout_seconds=0.5)
    assert (result.output, result.returncode, result.timed_out, result.error) == ("", None, True, "")
    assert 0.5 <= result.duration_seconds < 10 and time.monotonic() - started < 10
    assert await _wait_gone(int(pid_file.read_text()))


async def test_cancelling_a_run_kills_its_process_group(tmp_path: Path) -> None:
    sh, sleep = need_binary("sh"), need_binary("sleep")
    pid_file = tmp_path / "child.pid"
    argv = [sh, "-c", f'{sleep} 30 & echo $! > "{pid_file}"; wait']
    task = asyncio.create_task(SubprocessRunner().run(argv, timeout_seconds=60))
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _wait_gone(int(pid_file.read_text()))
