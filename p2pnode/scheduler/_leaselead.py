"""A fenced template's stop lead against the node's lease (issue 42, review 22), pure: the one rule the stop rule
(:class:`p2pnode.node._stoprules.StopRules`), admission, the job's wrapper and catalog validation use
(re-exported by :mod:`p2pnode.node._lease`). Here, below the node, so that config and the pushed-catalog book can
refuse a catalog with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["catalog_lease_problems", "checkpoint_grace_s", "lead_problem", "max_checkpoint_grace_s",
           "renewal_slack_s", "stop_lead_s"]


def renewal_slack_s(lease_s: float) -> float:
    """How far behind ``now + lease_s`` a lease renewed by every voter may read (seconds):
    ``lease_s / 4 + 3``. Derivation, for a node whose voters all ack within a second:

    * ``lease_s / 6`` (:attr:`Lease.renew_interval_s`): the quorum-th ack renews from its ping's send time, and a
      voter is pinged once per renew interval, so ``renewed_at >= now - lease_s / 6 - rtt``;
    * ``lease_s / 12``: the lease file is rewritten only when the expiry moved half a renew interval
      (:class:`p2pnode.jobs._leasefile.LeaseKeeper`), so the watchdog of the job's wrapper reads an expiry up to
      that much older;
    * 1 s: the file holds whole seconds, rounded down; 1 s: the wrapper's lead is whole seconds, rounded up;
      1 s: the ack's round trip and the step that reads it.

    A fenced job whose stop lead (:func:`stop_lead_s`) plus this slack is below ``lease_s`` is therefore never
    asked to stop, by the agent or its wrapper, while every voter acks (:func:`lead_problem` refuses the rest)."""
    return lease_s / 4.0 + 3.0


def max_checkpoint_grace_s(lease_s: float, stop_grace_s: float) -> float:
    """The longest checkpoint grace a fenced template may declare under ``lease_s`` and ``stop_grace_s``
    (seconds; below 0: none fits, the configuration is refused): ``lease_s - renewal_slack_s(lease_s) -
    stop_grace_s``, exclusive."""
    return lease_s - renewal_slack_s(lease_s) - stop_grace_s


def stop_lead_s(stop_grace_s: float, checkpoint_grace_s: float) -> float:
    """How long before the lease's expiry a fenced job is asked to stop (seconds): its checkpoint grace, then
    SIGTERM and ``stop_grace_s``, then SIGKILL; nothing of it runs at the expiry. The one rule the stop rule
    (:class:`p2pnode.node._stoprules.StopRules`), admission and the job's wrapper use."""
    return stop_grace_s + max(0.0, checkpoint_grace_s)


def lead_problem(template: str, lease_s: float, stop_grace_s: float, checkpoint_grace_s: float) -> str | None:
    """Why fenced template ``template`` cannot run under the lease (its stop lead plus
    :func:`renewal_slack_s` reaches ``lease_s``: it would be stopped as soon as it started, a start/stop loop),
    or None. ``lease_s`` 0: no lease, nothing refused."""
    if lease_s <= 0:
        return None
    lead = stop_lead_s(stop_grace_s, checkpoint_grace_s)
    slack = renewal_slack_s(lease_s)
    if lead + slack < lease_s:
        return None
    fits = max_checkpoint_grace_s(lease_s, stop_grace_s)
    need = (lead + 3.0) / 0.75
    return (f"template {template!r} is fenced by the lease: its stop lead, scheduler.stop_grace_s {stop_grace_s:g} s "
            f"+ checkpoint grace_s {checkpoint_grace_s:g} s, plus the renewal slack {slack:g} s (lease_s / 4 + 3) "
            f"reaches scheduler.lease_s {lease_s:g} s: set grace_s below {max(fits, 0.0):g} s or lease_s above "
            f"{need:g} s")


def checkpoint_grace_s(template: Any) -> float:
    """The checkpoint grace of ``template`` (``[job.checkpoint] grace_s``, issue 41), 0 where it has none: how
    long a stop waits for a checkpoint before SIGTERM's grace starts."""
    grace = getattr(getattr(template, "checkpoint", None), "grace_s", 0.0)
    return float(grace) if isinstance(grace, int | float) and math.isfinite(grace) and grace > 0 else 0.0


def catalog_lease_problems(templates: Iterable[Any], lease_s: float, stop_grace_s: float) -> list[str]:
    """Why the fenced ones of ``templates`` cannot run under ``lease_s`` (:func:`lead_problem`), one line each;
    empty when all can (or ``lease_s`` is 0: no lease kept). A catalog with any is refused: a file at start with
    a :class:`p2pnode.errors.ConfigError`, a pushed one as ``invalid_catalog``
    (:class:`p2pnode.scheduler.CatalogBook`, counted; the agent keeps its catalog)."""
    out = []
    for t in templates:
        if getattr(t, "fenced", False):
            problem = lead_problem(t.name, lease_s, stop_grace_s, checkpoint_grace_s(t))
            if problem is not None:
                out.append(problem)
    return out
