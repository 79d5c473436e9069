"""Running an external command with a timeout: the one subprocess seam of the collectors.

STYLE.md keeps shelling out to the collectors that have no other way in (NCCL-tests, the
infiniband-diags fabric tools), always with a timeout and behind a one-method interface that tests
and the simulator swap: ``CommandRunner.run(argv, timeout_seconds) -> CommandResult``. A failure
to start, a non-zero exit and a timeout are all values of the result, never exceptions, so a
collector reports them as readings or log lines instead of dying.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class CommandResult:
    output: str  # stdout and stderr interleaved: the tools print their failures on stderr
    returncode: int | None  # None when the process was killed at the timeout or never started
    timed_out: bool = False
    error: str = ""  # why the process could not start
    duration_seconds: float = 0.0


class CommandRunner(Protocol):
    async def run(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult: ...


class SubprocessRunner:
    """Runs argv in a session of its own, so a timeout kills ``mpirun`` and every rank it started."""

    async def run(self, argv: Sequence[str], timeout_seconds: float) -> CommandResult:
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            return CommandResult("", None, error=f"{type(exc).__name__}: {exc.strerror or exc}")
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout_seconds)
        except TimeoutError:
            await _kill_group(proc)
            return CommandResult("", None, timed_out=True, duration_seconds=time.monotonic() - started)
        except asyncio.CancelledError:
            await _kill_group(proc)  # the agent is stopping: leave no ranks behind
            raise
        text = out.decode("utf-8", errors="replace")
        return CommandResult(text, proc.returncode, duration_seconds=time.monotonic() - started)


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # The whole session: the command's children (ranks, ssh) hold the pipe open otherwise.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()
