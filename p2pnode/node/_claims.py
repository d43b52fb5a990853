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
  disagreement, as before (:meth:`p2pnode.scheduler._planstate._PlanState._broken_gangs`);
* a report of any job id the plan gives to **another node** is ignored (``job_claimed_elsewhere``): the real node's
  report stands, so a fake cannot move a job in the plan (which would stop it on its real node);
* an ``ended`` entry for a job id the plan gives to another node is ignored (``ended_claimed_elsewhere``): a fake
  cannot end a just-assigned gang member by saying it ended before its node reported it running.

* a report (without a gang slot) of a job id of the leader's **own current term** above every id it issued in
  that term (its sequence, and the highest of that term in the carried plan, for a leader restarted within its
  term) is ignored (``job_unissued``): the plan never gave it to anyone, and believing it would raise the
  leader's job sequence to whatever a member reports (up to 2^53-1).

Other job ids absent from the plan (a job re-adopted by an agent that came back, one started under another leader)
are adopted as before, gang members excepted. With no plan at all (a new leader whose predecessor died with its plan:
it planned without it after the hold), nothing can be checked, and the reports are adopted as they come (trust on
first use): a fake slot claimed in that window, as a rank twice, still ends its gang as a disagreement. From that
leader's first plan on, its own plan is the reference.

Each ignored claim is counted once per plan that saw it, per (member, reason, job id), in a
:class:`ClaimLedger` the leader keeps (``GET /jobs`` ``suspicious_claims``, metric
``p2pnode_claims_ignored_total{reason}``), bounded per (member, reason) and in members: one member's flood of
claims pushes out only its own older entries, never those naming another member.
"""

from __future__ import annotations

import msgspec

from ..snapshot import JobReport, PlanJob

__all__ = ["CLAIM_REASONS", "MAX_CLAIMS_PER_REASON", "MAX_CLAIM_MEMBERS", "MAX_SUSPICIOUS_CLAIMS", "ClaimLedger",
           "SuspiciousClaim", "claim_refusal", "ended_refusal"]

CLAIM_REASONS = ("gang_claim_unplanned", "job_claimed_elsewhere", "ended_claimed_elsewhere", "job_unissued")
"""Why a member's claim was ignored (:mod:`p2pnode.node._claims` docstring)."""
MAX_CLAIMS_PER_REASON = 16
"""Distinct job ids a leader keeps per (member, reason), at most: that member's oldest seen goes first."""
MAX_CLAIM_MEMBERS = 64
"""Members a leader keeps entries for, at most: the member seen longest ago goes first."""
MAX_SUSPICIOUS_CLAIMS = MAX_CLAIM_MEMBERS * len(CLAIM_REASONS) * MAX_CLAIMS_PER_REASON
"""Entries a leader keeps at most (the product of the bounds above). Totals by reason are kept apart and never
shrink."""


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
    """The claims a leader ignored: per member (at most :data:`MAX_CLAIM_MEMBERS`, those seen last) and per
    reason the newest :data:`MAX_CLAIMS_PER_REASON` job ids, and the totals by reason (every ignored claim, per
    plan that saw it). ``members``: member -> ``(reason, job id)`` -> entry, both in the order of last sight."""

    members: dict[str, dict[tuple[str, str], SuspiciousClaim]] = msgspec.field(default_factory=dict)
    totals: dict[str, int] = msgspec.field(default_factory=dict)

    def note(self, member: str, reason: str, job_id: str, now: float, *, gang: str = "", rank: int = -1) -> None:
        """Count one ignored claim of ``member`` (``now``: monotonic seconds)."""
        mine = self.members.pop(member, None)  # re-inserted: the dict's order is the order of last sight
        if mine is None:
            mine = {}
        self.members[member] = mine
        while len(self.members) > MAX_CLAIM_MEMBERS:
            del self.members[next(iter(self.members))]
        key = (reason, job_id)
        e = mine.pop(key, None)
        if e is None:
            e = SuspiciousClaim(member, reason, job_id, gang, rank, first_at=now)
        e.count += 1
        e.last_at = now
        mine[key] = e
        self.totals[reason] = self.totals.get(reason, 0) + 1
        same = [k for k in mine if k[0] == reason]
        for k in same[:max(0, len(same) - MAX_CLAIMS_PER_REASON)]:
            del mine[k]

    def __len__(self) -> int:
        return sum(len(mine) for mine in self.members.values())

    def view(self) -> list[dict[str, object]]:
        """The entries, most recently seen first, as plain maps (``GET /jobs`` ``suspicious_claims``)."""
        out = [e for mine in reversed(self.members.values()) for e in reversed(mine.values())]
        out.sort(key=lambda e: -e.last_at)  # (stable: among one plan's, the last noted first)
        return [msgspec.structs.asdict(e) for e in out]


def claim_refusal(report: JobReport, node_id: str, planned: PlanJob | None, has_plan: bool = True,
                  issued: tuple[int, int] = (0, 0)) -> str | None:
    """Why the leader ignores ``report`` from member ``node_id`` (None: it counts). ``planned``: the carried plan's
    entry for the report's job id (None: none); ``has_plan``: whether there is a carried plan at all (without one,
    every report counts); ``issued``: ``(term, seq)``, the leader's current term and the highest sequence it
    issued in it (term 0: not checked). See the module docstring for the rules."""
    if not has_plan:
        return None
    if planned is not None and planned.node != node_id:
        return "gang_claim_unplanned" if report.gang is not None else "job_claimed_elsewhere"
    if report.gang is None:
        pid = report.plan_id  # (a gang slot of an id never issued is a gang claim the plan does not back, below)
        if planned is None and pid is not None and issued[0] and pid.term == issued[0] and pid.seq > issued[1]:
            return "job_unissued"
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
