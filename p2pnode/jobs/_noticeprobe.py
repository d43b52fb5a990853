"""The driver of a node's interruption probe (issue 41, item 3; the pure core, and the probe's output format, are
:mod:`p2pnode.node._notice`): it runs ``[agent] interruption_probe`` (argv split with :func:`shlex.split`, no
shell, stdin ``/dev/null``, a process group of its own, in a worker thread) every
``interruption_probe_interval_s``, killed with its process group after ``interruption_probe_timeout_s``, with the
scaling commands' environment (:func:`p2pnode.providers._command.clean_env`: the agent's own less every
``P2PNODE_*`` variable), its stdout read up to :data:`~p2pnode.node._notice.MAX_PROBE_BYTES`
(:func:`p2pnode.providers._command.run_bounded`), and hands what it printed, or why it failed, to the core.

When the notice changes it asks for a new snapshot (the notice is published in the ``jobs`` section,
:meth:`NoticeProbe.section_fields`: the leader places nothing more here) and wakes job control (``news``): the stop
rules stop the node's fenced jobs under the ``notice`` rule, each after its checkpoint warning
(:class:`p2pnode.node._ckwarn.CheckpointWarnings`, bounded by the notice's deadline). The probe is the operator's
own program from the node's local config: a pushed catalog never names one.
"""

from __future__ import annotations

import functools
import logging
import shlex
import time
from collections.abc import Callable
from typing import Any

import trio

from ..node._notice import MAX_PROBE_BYTES, InterruptionNotice
from ..providers._base import ProviderError
from ..providers._command import CommandTimedOut, CommandTooLong, clean_env, one_line, run_bounded

__all__ = ["NoticeProbe"]

log = logging.getLogger(__name__)


class NoticeProbe:
    """The probe of ``ctx.config.agent`` (module docstring); an empty ``interruption_probe`` runs nothing and never
    gives a notice. ``core``: the :class:`~p2pnode.node._notice.InterruptionNotice` (its ``counts`` by outcome are
    in ``/metrics``)."""

    def __init__(self, ctx: Any) -> None:
        a = ctx.config.agent
        self.ctx = ctx
        self.argv = shlex.split(a.interruption_probe)  # (validated at load: config.py)
        self.timeout_s = a.interruption_probe_timeout_s
        self.core = InterruptionNotice(a.interruption_probe_interval_s)

    @property
    def at(self) -> float:
        """When this node is gone (monotonic seconds, ``ctx.now``'s clock; ``inf``: no notice)."""
        return self.core.at

    def section_fields(self) -> dict[str, Any]:
        """The notice's fields of the ``jobs`` section (:class:`p2pnode.snapshot.JobsSection`): none without one."""
        n = self.core.notice
        if n is None:
            return {}
        return {"notice_deadline_ms": max(0, min(2**53, int(n.wall_at * 1000))), "notice_reason": n.reason}

    async def run(self, news: Callable[[], None] = lambda: None) -> None:
        """Run the probe forever (cancel it); nothing when none is configured."""
        if not self.argv:
            return
        while True:
            await trio.sleep(max(0.0, self.core.next_deadline() - self.ctx.now()))
            if await self.probe_once():
                n = self.core.notice
                if n is not None:
                    log.warning("interruption notice (%s): this node is gone in %.0f s; stopping its fenced jobs "
                                "after their checkpoint, taking no new work", n.reason, max(0.0, n.at - self.ctx.now()))
                else:
                    log.warning("interruption notice withdrawn by the probe")
                self.ctx.publish_soon()
                news()

    async def probe_once(self) -> bool:
        """One run of the probe, handed to the core: whether the notice changed."""
        now, wall = self.ctx.now(), time.time()
        run = functools.partial(run_bounded, self.argv, clean_env(), self.timeout_s, max_stdout_bytes=MAX_PROBE_BYTES)
        try:
            out = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        except CommandTimedOut:
            return self._failed("timeout", now, f"timed out after {self.timeout_s:g} s")
        except CommandTooLong:
            return self._failed("too_long", now, f"printed more than {MAX_PROBE_BYTES} bytes")
        except ProviderError as exc:
            return self._failed("failed", now, str(exc))
        malformed = self.core.counts["malformed"]
        changed = self.core.probed(out, now, wall)
        if self.core.counts["malformed"] > malformed:
            self._warn("malformed", f"not one JSON object of the documented form: {one_line(out[:200])!r}")
        return changed

    def _failed(self, reason: str, now: float, why: str) -> bool:
        changed = self.core.failed(reason, now)
        self._warn(reason, why)
        return changed

    def _warn(self, reason: str, why: str) -> None:
        """Log the 1st, 2nd, 4th, 8th ... run that failed for ``reason`` (all are counted)."""
        n = self.core.counts[reason]
        if n & (n - 1) == 0:
            log.warning("interruption probe %s (%s; not read as a notice; %d so far)", reason, why, n)
