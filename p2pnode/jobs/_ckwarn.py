"""The driver side of the warning before a stop (issue 41, item 3; the pure core is
:class:`p2pnode.node._ckwarn.CheckpointWarnings`): it lists a job's checkpoint dir (one ``scandir``, and a
directory entry's ``.complete`` marker) when a stop is asked and while the stop is held, and builds the core's
:class:`~p2pnode.node._ckwarn.WarnSpec` from the job's template. It signals nothing itself: the executor
(:meth:`p2pnode.jobs._control.JobControl.apply`) carries out the core's :class:`~p2pnode.node._ckwarn.SignalJob`
through :meth:`p2pnode.jobs.JobRunner.signal_job`.
"""

from __future__ import annotations

import os
import stat

from ..node._ckwarn import Listed, WarnSpec, complete_names
from ..synccore._checkpoints import COMPLETE_MARKER

__all__ = ["LIST_EVERY_S", "MAX_LISTED", "list_dir", "warn_spec"]

LIST_EVERY_S = 0.5
"""How often a held stop's checkpoint dir is listed (seconds): a new entry is seen at most this late."""
MAX_LISTED = 10_000
"""At most this many entries of a dir are read (more: the rest are not seen; the stop waits to its deadline)."""


def list_dir(path: str) -> list[Listed]:
    """The entries of the checkpoint dir ``path`` ("" or unreadable: none), at most :data:`MAX_LISTED`."""
    out: list[Listed] = []
    if not path:
        return out
    try:
        with os.scandir(path) as it:
            for e in it:
                if len(out) >= MAX_LISTED:
                    break
                try:
                    is_dir = stat.S_ISDIR(e.stat(follow_symlinks=False).st_mode)
                except OSError:
                    continue
                out.append(Listed(e.name, is_dir, is_dir and os.path.lexists(os.path.join(e.path, COMPLETE_MARKER))))
    except OSError:
        return out
    return out


def warn_spec(job: object, stop_grace_s: float) -> WarnSpec | None:
    """The core's view of the runner's job ``job`` (a :class:`p2pnode.jobs._runner.RunningProcess`): None when its
    template has no ``[job.checkpoint]`` or its dir is unknown (a re-adopted job: the dir is rendered at start)."""
    ck = getattr(job.template, "checkpoint", None)  # type: ignore[attr-defined]
    path = getattr(job, "checkpoint_dir", "")
    if ck is None or not path:
        return None
    return WarnSpec(ck.signal, ck.grace_s, stop_grace_s, complete_names(list_dir(path)))
