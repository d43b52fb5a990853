"""A module imported where it is first used, not where it is named: :func:`lazy_module`. Pure.

For a library only some paths of an agent use (``sqlite3``: job records, the guard's database check, WAL shipping),
so that an agent that never takes them never maps it (issue 43: an idle agent's RSS). A module using it writes::

    if TYPE_CHECKING:
        import sqlite3
    else:
        sqlite3 = lazy_module("sqlite3")

and reads ``sqlite3.connect``, ``except sqlite3.Error`` as before: the first attribute read imports the module
(through :func:`importlib.import_module`, under the interpreter's import lock, so threads may race to it), later
reads cost one ``sys.modules`` look-up more than a plain global. ``except sqlite3.Error`` imports it only when an
exception reaches that clause. Nothing is put in ``sys.modules`` until then.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["LazyModule", "lazy_module"]


class LazyModule:
    """A stand-in for the module ``name``: each attribute read is the real module's (imported at the first)."""

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_module(name: str) -> Any:
    """A :class:`LazyModule` for ``name`` (typed ``Any``: type-check against the real import under
    ``TYPE_CHECKING``, as the module docstring shows). An unknown name raises ``ModuleNotFoundError`` at the first
    attribute read, not here."""
    return LazyModule(name)
