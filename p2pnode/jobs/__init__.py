"""Running jobs on a node: the job runner (subprocesses) and the job history (SQLite)."""

from ._history import JobHistory
from ._runner import JobRunner, RunningProcess

__all__ = ["JobHistory", "JobRunner", "RunningProcess"]
