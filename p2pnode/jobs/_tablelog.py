"""The driver's log of the job table's transition errors (issue 39): the pure table
(:class:`p2pnode.node._table.JobTable`) counts them (``errors``) and keeps the newest (``recent_errors``); this
writes a warning for new ones, at most one per ``interval_s`` (the ones in between are summed into the next line).
The counts are also a metric (``p2pnode_job_transition_errors_total{state,event}``) and the newest are in ``GET /jobs``
(``transition_errors``)."""

from __future__ import annotations

import logging
import math

from ..node._table import JobTable

__all__ = ["TransitionLog"]

log = logging.getLogger(__name__)


class TransitionLog:
    """Logs the transition errors ``table`` counted since the last line, at most one warning per ``interval_s``
    seconds (monotonic, passed in); returns whether it logged."""

    def __init__(self, interval_s: float = 60.0) -> None:
        self.interval_s = interval_s
        self.logged = 0
        """Errors already in a log line."""
        self.last_at = -math.inf

    def check(self, table: JobTable, now: float) -> bool:
        """Log the errors counted in ``table`` since the last line (the newest of them named) when the last line
        is ``interval_s`` old."""
        total = sum(table.errors.values())
        if total <= self.logged or now - self.last_at < self.interval_s:
            return False
        new = total - self.logged
        shown = list(table.recent_errors)[-min(new, 3):]
        log.warning("job table: %d transition error(s) since the last report (a bug of ours; counted in "
                    "p2pnode_job_transition_errors_total, listed in GET /jobs): %s", new,
                    "; ".join(str(e) for e in shown))
        self.logged, self.last_at = total, now
        return True
