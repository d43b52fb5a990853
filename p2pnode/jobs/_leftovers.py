"""What an ended job left behind in its session (:func:`p2pnode.jobs._ledger.session_leftovers`): SIGKILLed by
:func:`reap_leftovers` once the job's wrapper ended, so that a gang member's engine processes never outlive it,
nor does a shell's background child."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import Any

from ._ledger import session_leftovers

__all__ = ["reap_leftovers"]

log = logging.getLogger("p2pnode.jobs._runner")


def reap_leftovers(job: Any) -> int:
    """SIGKILL what ``job`` (a :class:`p2pnode.jobs.RunningProcess`) left in its session once its wrapper ended:
    the number of processes killed (0 for a job with no process or no recorded start time: its session cannot be
    told apart)."""
    if job.start_ticks is None or job.proc is None:
        return 0
    killed = 0
    for pid in session_leftovers(job.proc.pid, job.start_ticks):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            killed += 1
            log.info("job %s left process %d behind: killed", job.job_id, pid)
    return killed
