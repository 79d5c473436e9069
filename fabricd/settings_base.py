"""The building blocks of every settings section: a strict model and a documented field."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def doc(default: Any, description: str, **constraints: Any) -> Any:
    """A field with its meaning: docs/configuration.md and deploy/config/*.yaml are generated from it."""
    if callable(default):
        return Field(default_factory=default, description=description, **constraints)
    return Field(default=default, description=description, **constraints)
