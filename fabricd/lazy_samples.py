"""A ``Sequence[Sample]`` whose samples are built on first use: the base of the store's and the
wire's column-shaped views (``scrape_rows.ScrapeRows``, ``wire_columns.SampleColumns``).

A consumer that iterates one gets exactly the samples a list would hold, built once; a hot consumer
reads the subclass's rows or columns instead and never pays for a sample object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from fabricd.model import Sample


class LazySamples(Sequence[Sample]):
    """Subclasses set ``_built`` to None and build the list in ``_build_samples``."""

    __slots__ = ("_built",)
    _built: list[Sample] | None

    def _build_samples(self) -> list[Sample]:
        raise NotImplementedError

    def samples(self) -> list[Sample]:
        """The samples (built once)."""
        if self._built is None:
            self._built = self._build_samples()
        return self._built

    @overload
    def __getitem__(self, i: int) -> Sample: ...

    @overload
    def __getitem__(self, i: slice) -> list[Sample]: ...

    def __getitem__(self, i: int | slice) -> Sample | list[Sample]:
        return self.samples()[i]

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples())
