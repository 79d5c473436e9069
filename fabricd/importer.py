"""Resolve ``"package.module:Attr"`` strings lazily (the shape of uvicorn's ``importer.py``)."""

from __future__ import annotations

import importlib
from typing import Any


class ImportFromStringError(Exception):
    pass


def import_from_string(spec: str) -> Any:
    module_name, _, attrs = spec.partition(":")
    if not module_name or not attrs:
        raise ImportFromStringError(f'import string "{spec}" must be in format "<module>:<attribute>"')
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportFromStringError(f'could not import module "{module_name}": {exc}') from exc
    for attr in attrs.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError as exc:
            raise ImportFromStringError(f'attribute "{attr}" not found in module "{module_name}"') from exc
    return obj
