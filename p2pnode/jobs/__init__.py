"""Jobs on a node: job control (acting on the plan, leading), the runner (subprocesses), the history (SQLite)."""

from ._control import JobControl
from ._history import JobHistory
from ._runner import JobRunner, RunningProcess

__all__ = ["JobControl", "JobHistory", "JobRunner", "RunningProcess"]
