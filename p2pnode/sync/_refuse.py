"""Refusals of sync input: the closed set of reasons, the exception that carries one, and a log that stays quiet
under a flood.

:class:`SyncReject` is :class:`p2pnode.errors.SyncRejected` (one error tree: it sits under
:class:`p2pnode.errors.PeerError` beside the gossip :class:`p2pnode.errors.RejectedMessage`). Every refusal is
counted by its reason (``p2pnode_sync_rejected_total{reason}``); :class:`RefusalLog` logs a few of them.
"""

from __future__ import annotations

import logging
from collections import Counter

from ..errors import SyncRejected

__all__ = ["REFUSAL_LOG_INTERVAL_S", "REJECT_REASONS", "RefusalLog", "SyncReject"]

log = logging.getLogger(__name__)

SyncReject = SyncRejected
"""The name sync uses for :class:`p2pnode.errors.SyncRejected` (``reason``, ``detail``, HTTP ``status``)."""

REJECT_REASONS: tuple[str, ...] = SyncRejected.REASONS
"""Counted reasons for refusing sync input (``p2pnode_sync_rejected_total{reason}``)."""

REFUSAL_LOG_INTERVAL_S = 10.0
"""A refusal is logged at most once per reason in this many seconds (all are counted)."""


class RefusalLog:
    """Logs refusals (``what: reason: detail``) at most once per reason per ``interval_s`` seconds, with the
    number left unlogged since: a flood of bad input is counted in full but costs a few log lines."""

    def __init__(self, what: str, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self.what = what
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def __call__(self, exc: SyncRejected, now: float) -> None:
        """Log ``exc`` unless its reason was logged less than ``interval_s`` before ``now`` (monotonic s)."""
        last = self._last.get(exc.reason)
        if last is not None and now - last < self.interval_s:
            self._quiet[exc.reason] += 1
            return
        self._last[exc.reason] = now
        more = self._quiet.pop(exc.reason, 0)
        log.info("%s: %s%s", self.what, exc, f" (and {more} more like it)" if more else "")
