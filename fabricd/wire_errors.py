"""The errors of decoding a batch (``fabricd/wire.py`` and its version modules): ``field`` names
what was wrong, and ingest turns each into a 4xx, never a 5xx."""

from __future__ import annotations


class WireError(ValueError):
    """A batch that cannot be decoded; ``field`` names what was wrong."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class UnsupportedVersion(WireError):
    pass


class TooLarge(WireError):
    pass
