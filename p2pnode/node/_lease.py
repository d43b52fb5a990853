"""A node's lease on its exclusive work (issue 42 item 3), sans-IO: ``now`` passed in (monotonic seconds), no
clock, no trio, no file.

The rule (Chubby's, and Kleppmann's "the holder gives up before anyone else may take over"):

* The node holds the lease while it hears a **quorum** of the voter set (:func:`p2pnode.election.quorum_size`).
  A voter is heard only by its **direct ack to a ping this node sent** (:meth:`Lease.acked`); the ack renews from
  the ping's **send** time, never its receive time, so a slow ack shortens the lease, never lengthens it. Relayed
  acks (a ping-req's) and relayed snapshots never renew it. This node, when it is a voter itself, counts as heard
  at ``now``.
* ``renewed_at``: the quorum-th latest send time among the voters' acks (this node's ``now`` included when it
  votes); the lease expires at ``renewed_at + lease_s`` (:attr:`Lease.expires_at`).
* Fenced jobs must be gone by then: the stop rule ``lease_expired``
  (:class:`p2pnode.node._stoprules.StopRules`) asks them to stop at :attr:`Lease.stop_at` =
  ``expires_at − stop_lead_s`` (``stop_lead_s`` = ``scheduler.stop_grace_s`` + the checkpoint grace: SIGTERM,
  the grace, SIGKILL; nothing runs at ``expires_at``).
* The leader re-places a silent holder's fenced work only :func:`takeover_after_s` after the holder's last sign
  of life: ``lease_s`` plus a margin for clock-rate drift (:data:`DRIFT_RATE`) and :data:`MARGIN_S`.
* **The last sign of life** (:func:`last_sign`) is the latest direct ack any member reports having given the
  holder. Every node keeps an :class:`AckLog` of the direct acks it gave (bounded, :data:`MAX_ACK_REPORTS`) and
  publishes its ages in its signed snapshot (``jobs.acks``: node id -> age in ms when the snapshot was built, and
  ``acks_horizon_ms``: every ack given within that age is listed). The leader reads a report as
  ``seen_at − age``, ``seen_at`` being when it first held that snapshot (its own monotonic clock): the snapshot
  was built at or before ``seen_at``, so this is never earlier than the ack really was, and no wall clock, so no
  clock skew, enters the bound. Why that is safe: the holder's lease is renewed only from the *send* time of a
  ping a voter acked directly, and a ping is sent before it is acked; so the holder's newest renewal is no later
  than the newest ack any voter gave it, and on its own clock it stops by that renewal + ``lease_s``; the
  leader waits ``lease_s × (1 + DRIFT_RATE) + MARGIN_S`` from an upper bound of that ack. A report first seen
  before the holder was declared dead (``dead_since``), a member that published none since, or an age the
  report cannot vouch for, counts as ``dead_since`` (the previous rule: count from the dead declaration), so
  stale reports only ever delay a takeover. A node reports only acks within :func:`takeover_after_s` (an older
  one delays nothing; its horizon says so), and only with a lease kept. The premise, shared with the dead
  declaration it replaces: a member that still hears the holder says so in a report the leader holds before it
  plans (a voter that still acks the holder keeps its job held). The leader's own quorum gives that for a voter:
  a voter cut from the leader takes the leadership with it, and a member back (alive or suspect again) since the
  report the leader holds of it is waited for until its next report; SWIM's refutation makes a holder still
  heard alive anyway.
  ``tests/test_lease_takeover.py`` checks the rule in virtual time against seeded cuts of every link, at the
  worst clock drift the margin allows: the holder's lease has always run out when the leader re-places its work.
* A restarted agent carries on the lease its last run held (:meth:`Lease.restore`: the expiry it wrote, on the
  wall clock), so a restart within ``lease_s`` re-adopts its fenced jobs; past it, they are stopped.

:meth:`Lease.due` names the voters to ping for renewal now (each every :attr:`Lease.renew_interval_s`, apart from
the SWIM round-robin, whose turn comes for a given voter only once per pass over all members);
:meth:`Lease.next_deadline` says when to ask again. State is bounded by the voter set.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ..election import quorum_size
from ..scheduler._leaselead import (
    catalog_lease_problems,
    checkpoint_grace_s,
    lead_problem,
    max_checkpoint_grace_s,
    renewal_slack_s,
    stop_lead_s,
)

__all__ = ["DRIFT_RATE", "MARGIN_S", "MAX_ACK_REPORTS", "RENEWALS_PER_LEASE", "AckLog", "Lease",
           "catalog_lease_problems", "checkpoint_grace_s", "last_sign", "lead_problem", "max_checkpoint_grace_s",
           "renewal_slack_s", "stop_lead_s", "takeover_after_s"]

NEVER = math.inf
DRIFT_RATE = 0.01
"""The most two nodes' monotonic clocks may run apart, as a rate (1 %: far above the 500 ppm NTP allows a clock
to slew and the ~100 ppm quartz drifts; Chubby's and Kleppmann's margin)."""
MARGIN_S = 2.0
"""Seconds added to the takeover bound: a dead member's state time rounds to the step that saw it, and a plan is
made at a step."""
RENEWALS_PER_LEASE = 6
"""Pings to each voter per ``lease_s``: five may be lost before the stop lead (a third of the lease by default)
is reached."""

MAX_ACK_REPORTS = 64
"""Members whose latest direct ack one node reports at most (the newest; an older one is dropped and the report's
horizon shrinks to it)."""


def takeover_after_s(lease_s: float) -> float:
    """Seconds after a holder's last sign of life before the leader may place its fenced work elsewhere:
    ``lease_s × (1 + DRIFT_RATE) + MARGIN_S`` (the holder, on its own clock, stopped it by ``lease_s``)."""
    return lease_s * (1.0 + DRIFT_RATE) + MARGIN_S


class Lease:
    """One node's lease (module docstring). ``self_id``: this node; ``lease_s``: the lease duration;
    ``stop_lead_s``: how long before expiry fenced jobs are asked to stop; ``min_voters``: the election's minimum
    voter count (a quorum is never below ``min_voters // 2 + 1``). Counters: ``renewals`` (acks that moved a
    voter's renewal), ``ignored`` (acks from non-voters or with a send time in the future)."""

    def __init__(self, self_id: str, *, lease_s: float, stop_lead_s: float, min_voters: int = 1) -> None:
        if not (lease_s > 0 and math.isfinite(lease_s)):
            raise ValueError("lease_s must be a positive number of seconds")
        if not (0 <= stop_lead_s < lease_s):
            raise ValueError("stop_lead_s must be at least 0 and below lease_s")
        self.self_id = self_id
        self.lease_s = lease_s
        self.stop_lead_s = stop_lead_s
        self.min_voters = max(1, min_voters)
        self.voters: frozenset[str] = frozenset()
        self._acked: dict[str, float] = {}
        """Voter -> the send time of the newest ping of ours it acked directly (monotonic seconds)."""
        self._pinged: dict[str, float] = {}
        """Voter -> when we last pinged it for renewal."""
        self._restored = -NEVER
        """An expiry carried over from the last run (monotonic seconds on this run's clock)."""
        self._now = -NEVER
        self.renewals = 0
        self.ignored = 0

    @property
    def renew_interval_s(self) -> float:
        """Seconds between renewal pings to one voter: ``lease_s / RENEWALS_PER_LEASE``."""
        return self.lease_s / RENEWALS_PER_LEASE

    def set_voters(self, voters: Iterable[str]) -> None:
        """The voter set now (the election's). Acks of members no longer voters are forgotten."""
        self.voters = frozenset(voters)
        self._acked = {k: v for k, v in self._acked.items() if k in self.voters}
        self._pinged = {k: v for k, v in self._pinged.items() if k in self.voters}

    def restore(self, expires_at: float) -> None:
        """The expiry the last run of this agent held (monotonic seconds on this run's clock: the wall-clock
        expiry it wrote, mapped back). The lease holds until then at least, unless renewed further."""
        self._restored = expires_at

    def acked(self, voter: str, sent_at: float, now: float) -> bool:
        """``voter`` acked, directly, a ping this node sent at ``sent_at``. True when it moved the voter's renewal
        (a voter, a send time not in the future, newer than the one held)."""
        self._now = max(self._now, now)
        if voter not in self.voters or voter == self.self_id or sent_at > now:
            self.ignored += 1
            return False
        if sent_at <= self._acked.get(voter, -NEVER):
            return False
        self._acked[voter] = sent_at
        self.renewals += 1
        return True

    def renewed_at(self, now: float) -> float:
        """The quorum-th latest renewal among the voters (``now`` for this node when it votes; ``-inf``: no
        quorum heard yet)."""
        times = [t for v, t in self._acked.items() if v in self.voters]
        if self.self_id in self.voters:
            times.append(now)
        need = quorum_size(max(len(self.voters), self.min_voters))
        if len(times) < need:
            return -NEVER
        return sorted(times, reverse=True)[need - 1]

    def expires_at(self, now: float) -> float:
        """When the lease runs out (monotonic seconds; ``-inf``: never held this run nor restored)."""
        return max(self.renewed_at(now) + self.lease_s, self._restored)

    def stop_at(self, now: float) -> float:
        """When fenced jobs are asked to stop: :meth:`expires_at` − ``stop_lead_s`` (monotonic seconds)."""
        return self.expires_at(now) - self.stop_lead_s

    def held(self, now: float) -> bool:
        """Whether fenced jobs may run at ``now`` (before :meth:`stop_at`)."""
        return now < self.stop_at(now)

    def due(self, now: float) -> list[tuple[str, bool]]:
        """The voters (other than this node) to ping for renewal at ``now``, sorted, each with whether its last
        ping went unanswered (:meth:`unanswered`: send this one over the stream transport); each marked pinged."""
        self._now = max(self._now, now)
        out = [(v, self.unanswered(v)) for v in sorted(self.voters) if v != self.self_id
               and now >= self._pinged.get(v, -NEVER) + self.renew_interval_s]
        for v, _ in out:
            self._pinged[v] = now
        return out

    def unanswered(self, voter: str) -> bool:
        """Whether ``voter`` has not acked the last renewal ping sent to it (the driver sends the next one over the
        stream transport: a member whose datagrams are dropped still renews the lease)."""
        pinged = self._pinged.get(voter)
        return pinged is not None and self._acked.get(voter, -NEVER) < pinged

    def next_deadline(self) -> float:
        """When :meth:`due` next names a voter (monotonic seconds; ``inf``: no other voter)."""
        times = [self._pinged.get(v, -NEVER) + self.renew_interval_s for v in self.voters if v != self.self_id]
        return min(times, default=NEVER)


class AckLog:
    """The direct acks this node gave (a ping from the member itself, answered), newest per member, at most
    ``max_entries`` (the oldest dropped first). ``started``: when this node began answering pings (monotonic
    seconds; acks before it are unknown; ``inf``: not yet, :meth:`start`). State is bounded by ``max_entries``."""

    def __init__(self, started: float = NEVER, *, max_entries: int = MAX_ACK_REPORTS) -> None:
        self.max_entries = max_entries
        self._gave: dict[str, float] = {}
        self._horizon = started
        """Every ack given since this time is in ``_gave`` (the start, or the newest dropped ack)."""

    def start(self, now: float) -> None:
        """This node begins answering pings at ``now`` (no effect once started)."""
        self._horizon = min(self._horizon, now)

    def gave(self, node: str, now: float) -> None:
        """This node answered a ping ``node`` sent it directly, at ``now``."""
        self.start(now)
        self._gave.pop(node, None)
        self._gave[node] = now  # insertion order: oldest first
        while len(self._gave) > self.max_entries:
            oldest = next(iter(self._gave))
            self._horizon = max(self._horizon, self._gave.pop(oldest))

    def report(self, now: float, max_age_s: float = NEVER) -> tuple[dict[str, int], int]:
        """``({member: age in ms}, horizon in ms)`` at ``now``: the ages rounded down (a report reads as at
        least as recent as the ack was), the horizon (every ack given within it is listed) rounded down too.
        ``max_age_s``: acks older are left out and the horizon is at most that (the leader's takeover bound: an
        older ack delays nothing)."""
        ages = {k: max(0, math.floor((now - t) * 1000)) for k, t in self._gave.items() if now - t <= max_age_s}
        horizon = min(now - self._horizon, max_age_s)
        return ages, max(0, math.floor(horizon * 1000)) if horizon > 0 else 0


def last_sign(holder: str, dead_since: float,
              reports: Iterable[tuple[float, Mapping[str, int], int, float]]) -> float:
    """The holder's last sign of life (monotonic seconds on the leader's clock; module docstring): the latest of
    ``(seen_at, ages_ms, horizon_ms, back_at)`` reports, one per member (the leader's own included, seen at
    ``now``), each read as ``seen_at − age`` of ``holder``'s entry; with no entry, ``seen_at − horizon`` (its ack,
    if any, came before the horizon); a report first seen before ``dead_since`` counts as ``dead_since``. No
    report (``seen_at`` ``-inf``): ``dead_since``. ``back_at``: when a live reporter last turned alive or suspect
    (``-inf``: not live); a report held from before that is from before it was away, when it may have heard the
    holder: ``inf`` (wait for its next report)."""
    sign = -NEVER
    for seen_at, ages, horizon_ms, back_at in reports:
        if seen_at == -NEVER:
            sign = max(sign, dead_since)
            continue
        if back_at > seen_at:
            return NEVER
        if seen_at < dead_since:
            sign = max(sign, dead_since)
            continue
        age = ages.get(holder)
        sign = max(sign, seen_at - (age if age is not None else horizon_ms) / 1000.0)
    return sign if sign > -NEVER else dead_since
