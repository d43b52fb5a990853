"""The leader's takeover of a silent holder's fenced work, counted from the holder's last sign of life (issue 42
item 3): :class:`p2pnode.node._lease.AckLog` and :func:`p2pnode.node._lease.last_sign` with the holder's
:class:`p2pnode.node._lease.Lease`, in virtual time. Three voters: ``h`` holds the lease and the training, ``l``
leads, ``v`` votes. Links are cut and healed per pair; clocks run at different rates within the drift margin;
snapshots carry each node's ack report to the leader after a delay. Checked: the holder's stop always precedes the
leader's re-placement (the safety property), a voter that still hears the holder keeps the job held, and after a
clean cut the job moves within ``lease_s`` + the margins + one publication period, not from the dead
declaration."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import pytest

from p2pnode.node._lease import DRIFT_RATE, AckLog, Lease, last_sign, takeover_after_s

LEASE_S = 10.0
STOP_LEAD_S = 3.0
SUSPICION_S = 5.0
"""The leader declares the holder dead this long after its last ping reached the leader (SWIM's suspicion)."""
DT = 0.05


def test_ack_log_reports_ages_rounded_down_and_a_horizon():
    log = AckLog(100.0, max_entries=2)
    log.gave("a", 101.0)
    log.gave("b", 102.5)
    assert log.report(103.0) == ({"a": 2000, "b": 500}, 3000)  # every ack since the start is listed
    log.gave("c", 103.0)  # "a" dropped: the horizon shrinks to its ack
    assert log.report(103.0004) == ({"b": 500, "c": 0}, 2000)
    log.gave("b", 104.0)  # newest again: "c" is now the oldest
    assert list(log.report(104.0)[0]) == ["c", "b"]


def test_last_sign_counts_only_reports_held_since_the_dead_declaration():
    dead = 50.0
    assert last_sign("h", dead, []) == dead
    assert last_sign("h", dead, [(49.0, {"h": 0}, 9000, -math.inf)]) == dead  # stale: counts as the declaration
    assert last_sign("h", dead, [(52.0, {"h": 10_000}, 60_000, 0.0)]) == 42.0  # heard at 42 at the latest
    assert last_sign("h", dead, [(52.0, {}, 30_000, 0.0)]) == 22.0  # not in a report vouching for 30 s
    assert last_sign("h", dead, [(52.0, {"h": 10_000}, 60_000, 0.0), (53.0, {"h": 1000}, 60_000, 0.0)]) == 52.0
    assert last_sign("h", dead, [(52.0, {"h": 10_000}, 60_000, 0.0), (45.0, {"h": 10_000}, 60_000, 0.0)]) == dead
    assert last_sign("h", dead, [(52.0, {"x": 0}, 0, 0.0)]) == 52.0  # vouches for nothing: counts when seen
    assert last_sign("h", dead, [(52.0, {"h": 10_000}, 60_000, 52.5)]) == math.inf  # back since: wait for news
    assert last_sign("h", dead, [(-math.inf, {}, 0, 0.0)]) == dead  # no report at all


@dataclass
class _World:
    """Real time ``t``; each node's monotonic clock runs at its own rate; ``cut``: the pairs cut now."""

    rate: dict[str, float]
    delay: float = 0.1
    publish_s: float = 1.0
    t: float = 0.0
    cut: set[frozenset[str]] = field(default_factory=set)

    def now(self, node: str) -> float:
        return self.t * self.rate[node] + 1000.0

    def linked(self, a: str, b: str) -> bool:
        return frozenset((a, b)) not in self.cut


@dataclass
class _Run:
    stopped_at: float | None = None  # real time the holder's lease expired: its job gone (the stop rule)
    replaced_at: float | None = None  # real time the leader re-placed it
    dead_at: float | None = None  # real time the leader declared the holder dead


def _run(w: _World, until: float, schedule) -> _Run:
    """Step the three nodes until ``until`` (real seconds) or the re-placement. ``schedule(w)`` sets ``w.cut``."""
    lease = Lease("h", lease_s=LEASE_S, stop_lead_s=STOP_LEAD_S)
    lease.set_voters(("h", "l", "v"))
    logs = {n: AckLog(w.now(n)) for n in ("l", "v")}
    inflight: list[tuple[float, str, object]] = []  # (deliver at real t, kind, payload)
    held_by_l: tuple[float, dict[str, int], int] = (-math.inf, {}, 0)  # v's newest report, when l first held it
    heard_l = w.now("l")  # l's last ping from h (its own SWIM view), l's clock
    dead_since: float | None = None
    run = _Run()
    holding = True
    next_publish = 0.0
    v_back = -math.inf  # when v last turned alive to l (their link came up)
    v_linked = True
    lease.acked("l", w.now("h"), w.now("h"))
    lease.acked("v", w.now("h"), w.now("h"))
    while w.t < until and run.replaced_at is None:
        schedule(w)
        for voter, _ in lease.due(w.now("h")):  # h pings its voters; each ack renews from the send
            if w.linked("h", voter):
                inflight.append((w.t + w.delay, "ping", (voter, w.now("h"))))
        if w.t >= next_publish:  # v publishes its report; l gets it if linked
            next_publish += w.publish_s
            if w.linked("v", "l"):
                inflight.append((w.t + w.delay, "snap", logs["v"].report(w.now("v"))))
        due, inflight = [x for x in inflight if x[0] <= w.t], [x for x in inflight if x[0] > w.t]
        for _, kind, payload in due:
            if kind == "ping":
                voter, sent = payload
                logs[voter].gave("h", w.now(voter))
                if voter == "l":
                    heard_l = w.now("l")
                if w.linked(voter, "h"):
                    inflight.append((w.t + w.delay, "ack", (voter, sent)))
            elif kind == "ack":
                voter, sent = payload
                lease.acked(voter, sent, w.now("h"))
            else:
                ages, horizon = payload
                held_by_l = (w.now("l"), ages, horizon)
        if holding and w.now("h") >= lease.expires_at(w.now("h")):  # asked to stop at stop_at, gone by now
            holding, run.stopped_at = False, w.t
        now_l = w.now("l")
        if dead_since is None and now_l - heard_l >= SUSPICION_S:
            dead_since, run.dead_at = now_l, w.t
        elif dead_since is not None and now_l - heard_l < SUSPICION_S:
            dead_since = None  # alive again (a refutation): its jobs are a live member's
        if w.linked("l", "v") and not v_linked:
            v_back = w.now("l")  # v alive to l again (its probe acks), before its next report comes
        v_linked = w.linked("l", "v")
        leads = v_linked  # the leader needs its quorum, l and v: a voter cut away takes the leadership with it
        if dead_since is not None and leads:
            own = (now_l, *logs["l"].report(now_l), -math.inf)
            sign = last_sign("h", dead_since, [own, (*held_by_l, v_back)])
            if now_l >= sign + takeover_after_s(LEASE_S):
                run.replaced_at = w.t
        w.t = round(w.t + DT, 6)
    return run


def _cut_at(at: float, pairs: list[tuple[str, str]], heal: float = math.inf):
    def schedule(w: _World) -> None:
        w.cut = {frozenset(p) for p in pairs} if at <= w.t < heal else set()
    return schedule


SLOW_HOLDER = {"h": 1.0 - DRIFT_RATE / 2, "l": 1.0 + DRIFT_RATE / 2, "v": 1.0}
"""The worst drift the margin allows: the holder's clock slow, the leader's fast."""


@pytest.mark.parametrize("publish_s", [0.5, 1.0, 2.0])
def test_a_clean_cut_moves_the_job_within_lease_plus_margins_after_the_last_ack(publish_s):
    w = _World(rate=SLOW_HOLDER, publish_s=publish_s)
    run = _run(w, 60.0, _cut_at(20.0, [("h", "l"), ("h", "v")]))
    assert run.stopped_at is not None and run.replaced_at is not None and run.dead_at is not None
    assert run.stopped_at < run.replaced_at  # the holder gave up first
    assert run.replaced_at - 20.0 <= takeover_after_s(LEASE_S) * (1 + DRIFT_RATE) + publish_s + 2 * w.delay + DT
    # the dead declaration's count (the previous rule) would be later by about the suspicion timeout
    assert run.replaced_at < run.dead_at + takeover_after_s(LEASE_S) - SUSPICION_S / 2


def test_a_voter_that_still_hears_the_holder_keeps_the_job_held():
    w = _World(rate=SLOW_HOLDER)
    run = _run(w, 120.0, _cut_at(20.0, [("h", "l")]))  # only the leader's link to the holder is cut
    assert run.dead_at is not None  # the leader alone takes it for dead...
    assert run.replaced_at is None and run.stopped_at is None  # ...but v's acks renew the lease and show it


def test_when_the_last_voter_loses_the_holder_too_the_holder_stops_first():
    def schedule(w: _World) -> None:
        w.cut = {frozenset(("h", "l"))} if w.t >= 20.0 else set()
        if w.t >= 50.0:
            w.cut.add(frozenset(("h", "v")))

    run = _run(_World(rate=SLOW_HOLDER), 120.0, schedule)
    assert run.stopped_at is not None and run.replaced_at is not None
    assert 50.0 < run.stopped_at < run.replaced_at  # counted from v's last ack at 50, not the declaration at 25
    assert run.replaced_at - 50.0 <= takeover_after_s(LEASE_S) * (1 + DRIFT_RATE) + 1.0 + 2 * 0.1 + DT


@pytest.mark.parametrize("seed", range(60))
def test_seeded_partitions_the_holder_always_stops_before_the_job_moves(seed):
    rng = random.Random(seed)
    rates = {**SLOW_HOLDER, "v": 1.0 + rng.uniform(-DRIFT_RATE / 2, DRIFT_RATE / 2)}
    w = _World(rate=rates, delay=rng.uniform(0.001, 0.4), publish_s=rng.choice([0.5, 1.0, 2.0, 3.0]))
    pairs = [("h", "l"), ("h", "v"), ("l", "v")]
    spans = {p: sorted(rng.uniform(5.0, 90.0) for _ in range(2 * rng.randint(0, 3))) for p in pairs}

    def schedule(w: _World) -> None:  # each pair cut over its own random spans, healed between them
        w.cut = {frozenset(p) for p, s in spans.items() if any(a <= w.t < b for a, b in zip(s[::2], s[1::2]))}

    run = _run(w, 120.0, schedule)
    if run.replaced_at is not None:
        assert run.stopped_at is not None and run.stopped_at < run.replaced_at


# -- the leader's plan (JobCore) ------------------------------------------------------------------------------------
def _planner(reports: dict[str, tuple[float, dict[str, int], int]], dead_since: float):
    """A leader ``a`` with voter ``c`` and a holder ``b`` declared dead at ``dead_since`` with a training; each of
    ``a`` and ``c`` reports ``(seen_at, acks, horizon_ms)``. Returns ``planned(now)``: the newest plan's
    assignments, the core stepped at each of its deadlines before."""
    import msgspec

    from p2pnode.gossip import MemberState
    from p2pnode.node import PublishPlan
    from tests.test_job_core import core, drive, inputs, lead, member, of, report

    def reporting(m, nid):
        seen_at, acks, horizon = reports[nid]
        return msgspec.structs.replace(m, seen_at=seen_at, acks=acks, acks_horizon_ms=horizon)

    c = core("a", settle_s=0.0, orphan_grace_s=120.0, lease_s=LEASE_S, interval_s=1.0)
    ms = [reporting(member("a"), "a"), reporting(member("c"), "c"),
          member("b", state=MemberState.DEAD, since=dead_since, running=[report("1-1", "train")])]
    last: list = []

    def planned(now):
        t = c.next_deadline() if last else now
        while t < now:
            last.extend(of(drive(c, inputs(lead("a"), ms), t), PublishPlan))
            t = c.next_deadline()
        last.extend(of(drive(c, inputs(lead("a"), ms), now), PublishPlan))
        return {j.job_id: (j.template, j.node) for j in last[-1].section.assignments}
    return planned


def test_the_leader_counts_from_the_latest_ack_a_member_reports_not_from_the_declaration():
    # b declared dead at 20; a last acked b at 14 (reported at 21, 7 s ago), c at 15 (its report held since 21)
    planned = _planner({"a": (21.0, {"b": 7000}, 60_000), "c": (21.0, {"b": 6000}, 60_000)}, dead_since=20.0)
    bound = 15.0 + takeover_after_s(LEASE_S)
    assert planned(21.0)["1-1"] == ("train", "b")
    assert planned(bound - 0.01)["1-1"] == ("train", "b")  # c's ack may have renewed b's lease until 25
    # freed by the next plan (plans every interval_s), before 20 + takeover (the dead declaration's count)
    assert "1-1" not in planned(bound + 1.01) and bound + 1.01 < 20.0 + takeover_after_s(LEASE_S)


def test_the_leader_waits_for_a_voter_that_still_acks_the_holder_or_whose_report_predates_the_declaration():
    fresh = _planner({"a": (21.0, {"b": 7000}, 60_000), "c": (30.0, {"b": 0}, 60_000)}, dead_since=20.0)
    assert fresh(30.0 + takeover_after_s(LEASE_S) - 0.01)["1-1"] == ("train", "b")  # c heard b at 30
    stale = _planner({"a": (21.0, {"b": 7000}, 60_000), "c": (19.0, {"b": 6000}, 60_000)}, dead_since=20.0)
    assert stale(20.0 + takeover_after_s(LEASE_S) - 0.01)["1-1"] == ("train", "b")  # c's report: held before
    assert "1-1" not in stale(20.0 + takeover_after_s(LEASE_S) + 1.01)  # the declaration's count, as before


def test_an_ack_log_not_started_vouches_for_nothing():
    log = AckLog()
    assert log.report(5.0) == ({}, 0)  # read as "may have acked anyone up to the report"
    log.start(5.0)
    log.start(9.0)  # no effect once started
    assert log.report(7.0) == ({}, 2000)


def test_an_ack_log_reports_only_acks_within_a_max_age_and_says_so():
    log = AckLog(0.0)
    log.gave("a", 1.0)
    log.gave("b", 9.0)
    assert log.report(10.0, max_age_s=5.0) == ({"b": 1000}, 5000)  # "a" acked before 5 s ago, if at all
    assert log.report(10.0) == ({"a": 9000, "b": 1000}, 10_000)
