"""The central's stop, bounded: a shutdown that has not finished by its deadline ends the process.

A stop waits for work in threads that no cancellation reaches: the last write of the latest
values, a batch in the writer, a hook's delivery. Measured: a PostgreSQL session holding a lock on
``latest_chunks`` (a hand-run ``LOCK TABLE``, another process's migration) kept a central that had
been sent SIGTERM in its shutdown write for as long as the lock was held (40 s in the experiment,
without bound in principle); ``make bench``'s bus rows once saw a central ignore SIGTERM for 120 s
(docs/benchmarks.md). A supervisor then kills it (systemd after ``TimeoutStopSec``, Kubernetes
after ``terminationGracePeriodSeconds``) and nothing says where it hung.

So the shutdown runs against a deadline (``shutdown_timeout_seconds``). Past it the process logs
an error, writes every thread's stack to stderr (``faulthandler``: where it hung, for the bug
report) and exits with ``EXIT_CODE``, which a supervisor reports as a failed stop. What that exit
leaves undone is what a kill leaves, and the store is built for a kill: a batch not acknowledged
is retried by its agent, the latest values are rebuilt from the points stored since their last
write (docs/storage.md), and the incidents are in the database.

The deadline starts when uvicorn begins to stop (``BoundedServer``: connections drained for up to
``timeout_graceful_shutdown``, then the lifespan's cleanup) and runs on a daemon thread that is
never cancelled: it also covers the interpreter's exit, which waits for the worker threads the
event loop handed blocking calls to, and a process that exits in time takes it along.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import TextIO

import uvicorn

from fabricd import logs

EXIT_CODE = 70  # EX_SOFTWARE (sysexits.h): the stop failed, unlike SIGTERM's clean 0
log = logging.getLogger("fabricd.server")


class Deadline:
    """Ends the process ``seconds`` after ``start``, unless it has ended by then."""

    def __init__(
        self,
        seconds: float,
        stream: TextIO | None = None,
        exit: Callable[[int], object] = os._exit,  # os._exit: sys.exit would wait for the hung threads
    ) -> None:
        self.seconds, self.stream, self.exit = seconds, stream, exit

    def start(self) -> None:
        timer = threading.Timer(self.seconds, self.expire)
        timer.daemon, timer.name = True, "shutdown-deadline"
        timer.start()

    def expire(self) -> None:
        stream = self.stream or sys.stderr
        logs.event(
            log,
            logging.ERROR,
            "shutdown did not finish in time; exiting with every thread's stack on stderr",
            timeout_seconds=self.seconds,
            exit_code=EXIT_CODE,
        )
        stream.flush()
        faulthandler.dump_traceback(file=stream, all_threads=True)
        stream.flush()
        self.exit(EXIT_CODE)


class BoundedServer(uvicorn.Server):
    """``uvicorn.Server`` whose shutdown runs against ``deadline``."""

    def __init__(self, config: uvicorn.Config, deadline: Deadline) -> None:
        super().__init__(config)
        self.deadline = deadline

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.deadline.start()
        await super().shutdown(sockets)
