"""Jobs on a node: job control (acting on the plan, leading), the runner (subprocesses), the history (SQLite), and
job control's surface for the HTTP layer (:class:`JobControlSurface`)."""

from ._catalogs import CatalogPush
from ._control import JobControl
from ._history import JobHistory
from ._runner import JobRunner, RunningProcess
from ._surface import JobControlSurface

__all__ = ["CatalogPush", "JobControl", "JobControlSurface", "JobHistory", "JobRunner", "RunningProcess"]
