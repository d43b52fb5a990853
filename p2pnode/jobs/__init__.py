"""Jobs on a node: job control (acting on the plan, leading), the runner (subprocesses), the history (SQLite), and
job control's surface for the HTTP layer (:class:`JobControlSurface`).

Only :class:`CatalogPush` (every agent holds the catalog) is imported with the package; the rest on first use
(PEP 562 ``__getattr__``): an agent without a catalog runs no job control and never loads it (issue 43: about
1.5 MiB of an idle agent's RSS). The agent builds :class:`JobControl` in its constructor, before ``Agent.run``
builds msgspec's type information (:func:`p2pnode.inputs.warm_type_info`), so the classes it loads are covered.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._catalogs import CatalogPush

if TYPE_CHECKING:
    from ._control import JobControl
    from ._history import JobHistory
    from ._runner import JobRunner, RunningProcess
    from ._surface import JobControlSurface

__all__ = ["CatalogPush", "JobControl", "JobControlSurface", "JobHistory", "JobRunner", "RunningProcess"]

_LAZY = {"JobControl": "._control", "JobControlSurface": "._surface", "JobHistory": "._history",
         "JobRunner": "._runner", "RunningProcess": "._runner"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
