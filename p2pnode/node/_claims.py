"""Members' claims about planned work, checked against the plan before the leader believes them (issue 37, item 4).
Sans-IO.

A signed snapshot proves who speaks, not that what it says is true. A member's running list says which jobs run
there and, for a gang member, which gang slot (gang id, rank) it holds; its ``ended`` list says which gang members
ended there. The leader gave every such job to one node in one plan (a job id is ``<term>-<seq>``, so the id
names the term), and it carries that plan from plan to plan while the job runs. So:

* a report of a **gang slot** counts only when the carried plan gives that job id to that node as a member of
  that gang (:func:`claim_refusal`); anything else (no plan entry, another node's job, another gang's id, a job
  planned without a gang) is ignored for the gang's state and counted against the member as
  ``gang_claim_unplanned``. It is never read as a disagreement: a fake "rank 0" of a real gang's id ends nothing.
  A planned node that reports its own slot inconsistently (another size or rank) still ends its gang as a
  disagreement, as before (:meth:`p2pnode.scheduler._plan._Planning._broken_gangs`);
* a report of any job id the plan gives to **another node** is ignored (``job_claimed_elsewhere``): the real node's
  report stands, so a fake cannot move a job in the plan (which would stop it on its real node);
* an ``ended`` entry for a job id the plan gives to another node is ignored (``ended_claimed_elsewhere``): a fake
  cannot end a just-assigned gang member by saying it ended before its node reported it running.

Job ids absent from the plan (a job re-adopted by an agent that came back, one started under another leader) are
adopted as before, gang members excepted. With no plan at all (a new leader whose predecessor died with its plan:
it planned without it after the hold), nothing can be checked, and the reports are adopted as they come (trust on
first use): a fake slot claimed in that window, as a rank twice, still ends its gang as a disagreement. From that
leader's first plan on, its own plan is the reference.

Each ignored claim is counted once per plan that saw it, per (member, reason, job id), in a
:class:`ClaimLedger` the leader keeps (``GET /jobs`` ``suspicious_claims``, metric
``p2pnode_claims_ignored_total{reason}``).
"""

from __future__ import annotations

import msgspec

from ..snapshot import JobReport, PlanJob

__all__ = ["CLAIM_REASONS", "MAX_SUSPICIOUS_CLAIMS", "ClaimLedger", "SuspiciousClaim", "claim_refusal",
           "ended_refusal"]

CLAIM_REASONS = ("gang_claim_unplanned", "job_claimed_elsewhere", "ended_claimed_elsewhere")
"""Why a member's claim was ignored (:mod:`p2pnode.node._claims` docstring)."""
MAX_SUSPICIOUS_CLAIMS = 256
"""Distinct (member, reason, job id) entries a leader keeps, at most: the oldest seen goes first. Totals by reason
are kept apart and never shrink."""


class SuspiciousClaim(msgspec.Struct):
    """One claim a member made that the plan does not back: ``member`` (node id), ``reason`` (one of
    :data:`CLAIM_REASONS`), the ``job_id`` it named, the gang slot it claimed (``gang`` id and ``rank``; "" and -1
    without one), ``count``: plans that saw it and ignored it, ``first_at`` / ``last_at``: monotonic seconds
    (the leader's clock) of the first and last of them."""

    member: str
    reason: str
    job_id: str
    gang: str = ""
    rank: int = -1
    count: int = 0
    first_at: float = 0.0
    last_at: float = 0.0


class ClaimLedger(msgspec.Struct):
    """The claims a leader ignored: per (member, reason, job id) the newest :data:`MAX_SUSPICIOUS_CLAIMS`, and the
    totals by reason (every ignored claim, per plan that saw it)."""

    entries: dict[tuple[str, str, str], SuspiciousClaim] = msgspec.field(default_factory=dict)
    totals: dict[str, int] = msgspec.field(default_factory=dict)

    def note(self, member: str, reason: str, job_id: str, now: float, *, gang: str = "", rank: int = -1) -> None:
        """Count one ignored claim of ``member`` (``now``: monotonic seconds)."""
        key = (member, reason, job_id)
        e = self.entries.pop(key, None)  # re-inserted: the dict's order is the order of last sight
        if e is None:
            e = SuspiciousClaim(member, reason, job_id, gang, rank, first_at=now)
        e.count += 1
        e.last_at = now
        self.entries[key] = e
        self.totals[reason] = self.totals.get(reason, 0) + 1
        while len(self.entries) > MAX_SUSPICIOUS_CLAIMS:
            del self.entries[next(iter(self.entries))]

    def view(self) -> list[dict[str, object]]:
        """The entries, most recently seen first, as plain maps (``GET /jobs`` ``suspicious_claims``)."""
        return [msgspec.structs.asdict(e) for e in reversed(self.entries.values())]


def claim_refusal(report: JobReport, node_id: str, planned: PlanJob | None, has_plan: bool = True) -> str | None:
    """Why the leader ignores ``report`` from member ``node_id`` (None: it counts). ``planned``: the carried plan's
    entry for the report's job id (None: none); ``has_plan``: whether there is a carried plan at all (without one,
    every report counts). See the module docstring for the rules."""
    if not has_plan:
        return None
    if planned is not None and planned.node != node_id:
        return "gang_claim_unplanned" if report.gang is not None else "job_claimed_elsewhere"
    if report.gang is None:
        return None
    if planned is None or planned.gang is None or planned.gang.id != report.gang.id:
        return "gang_claim_unplanned"
    return None


def ended_refusal(job_id: str, node_id: str, planned: PlanJob | None) -> str | None:
    """Why the leader ignores member ``node_id``'s report that ``job_id`` ended (None: it counts): the plan gives
    that job to another node."""
    if planned is not None and planned.node != node_id:
        return "ended_claimed_elsewhere"
    return None
