"""Progress for long CLI work: a rich progress bar on a terminal, plain lines otherwise.

    with progress("eval", total=len(scenarios)) as step:
        for s in scenarios:
            run(s)
            step(note=s.name)

On a TTY the bar redraws in place. Anywhere else (CI logs, pipes, ``| tee``) a bar would fill the
log with control codes, so a plain ``label: 3/12 (25%) note`` line is printed at most once per
``every`` tenth of the work (and always for the last step), keeping a log short but alive.
Progress goes to stderr by default so that stdout stays clean for ``--json`` output.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TextIO


class Step(Protocol):
    def __call__(self, n: int = 1, note: str = "") -> None: ...


class PlainProgress:
    """Plain lines: ``label: done/total (pct) note``, at most ``lines`` of them plus the last one."""

    def __init__(self, label: str, total: int | None, stream: TextIO, lines: int = 10) -> None:
        self.label, self.total, self.stream = label, total, stream
        self.done = 0
        self._every = max(1, (total or 0) // max(lines, 1))
        self._next = self._every

    def __call__(self, n: int = 1, note: str = "") -> None:
        self.done += n
        last = self.total is not None and self.done >= self.total
        if self.done < self._next and not last:
            return
        while self._next <= self.done:
            self._next += self._every
        print(self._line(note), file=self.stream, flush=True)

    def _line(self, note: str) -> str:
        if self.total:
            head = f"{self.label}: {self.done}/{self.total} ({self.done * 100 // self.total}%)"
        else:
            head = f"{self.label}: {self.done}"
        return f"{head} {note}".rstrip()


@contextmanager
def _rich(label: str, total: int | None, stream: TextIO) -> Iterator[Step]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
    )
    with Progress(*columns, console=Console(file=stream), transient=False) as bar:
        task = bar.add_task(label, total=total, note="")

        def step(n: int = 1, note: str = "") -> None:
            bar.update(task, advance=n, note=note)

        yield step


@contextmanager
def progress(
    label: str, total: int | None = None, stream: TextIO | None = None, tty: bool | None = None
) -> Iterator[Step]:
    """Report progress of ``total`` steps (``None``: unknown); yields ``step(n=1, note="")``.

    ``tty`` overrides terminal detection (tests, ``--progress plain``)."""
    out = stream if stream is not None else sys.stderr
    if tty if tty is not None else _isatty(out):
        with _rich(label, total, out) as step:
            yield step
        return
    yield PlainProgress(label, total, out)


def quiet(n: int = 1, note: str = "") -> None:
    """A ``Step`` that reports nothing: for library code called without a progress display."""
    del n, note


def _isatty(stream: Any) -> bool:
    isatty: Callable[[], bool] | None = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
