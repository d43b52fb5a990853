"""Membership transitions, refutation, Lifeguard timer shortening: pinned on exact times."""

import math

import pytest

from p2pnode.gossip._membership import (
    PROFILES,
    IllegalTransition,
    Membership,
    MembershipConfig,
    MemberState,
    expected_confirmations,
    publish_interval_s,
    suspect_after_s,
    suspicion_timeout_s,
)

A, S, D, L = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT
CFG = MembershipConfig(gossip_interval_s=1.0, suspicion_mult=4.0, suspicion_max_timeout_mult=6.0,
                       expected_confirmations=3, min_publish_interval_s=1.0, target_verifications_per_s=100.0,
                       reconnect_window_s=100.0, left_retention_s=50.0)


def hear(m, node, version, now, *, inc=0, leaving=False, suspects=None):
    return m.observe(node, version=version, incarnation=inc, leaving=leaving, suspects=suspects or {}, now=now)


def test_formulas_match_memberlist_and_scale_with_log_n():
    assert suspicion_timeout_s(5, 0, CFG) == pytest.approx(6 * 4.0)  # max: 6 × (4 × log10(10) × 1 s)
    assert suspicion_timeout_s(5, 2, CFG) == pytest.approx(4.0)  # K = suspicion_mult - 2 = 2 confirmations: min
    mid = suspicion_timeout_s(5, 1, CFG)
    assert mid == pytest.approx(24.0 - 20.0 * math.log(2) / math.log(3))
    # memberlist caps K at SuspicionMult - 2, and expects none when fewer members than K can confirm (n - 2 < K):
    assert expected_confirmations(4, CFG) == 2 and expected_confirmations(3, CFG) == 0
    assert suspicion_timeout_s(3, 0, CFG) == pytest.approx(4.0)  # a 3-node cluster is not slowed to the maximum
    assert expected_confirmations(100, MembershipConfig(expected_confirmations=1)) == 1
    assert suspicion_timeout_s(1000, 0, CFG) == pytest.approx(6 * 4.0 * 3)  # log10(1000) = 3
    assert publish_interval_s(50, CFG) == 1.0 and publish_interval_s(1000, CFG) == 10.0
    assert suspect_after_s(10, CFG) == pytest.approx(1.0 + 4.0)
    assert set(PROFILES) == {"lan", "wan", "local-test"}


def test_alive_suspect_dead_reap_on_exact_deadlines():
    m = Membership("me", CFG)
    assert hear(m, "x", 1, 0.0)[0].new is A
    after = suspect_after_s(m.size, CFG)  # N = 2 -> log10(10) = 1
    assert m.next_deadline() == pytest.approx(after)
    assert m.tick(after - 0.01) == []
    (ev,) = m.tick(after)
    assert (ev.old, ev.new) == (A, S) and m.suspects() == {"x": 0}
    dead_at = after + suspicion_timeout_s(2, 0, CFG)
    assert m.tick(dead_at - 0.01) == []
    assert m.tick(dead_at)[0].new is D
    assert m.suspects() == {"x": 0}  # dead here: its confirmation stands while others' timers may run
    assert m.tick(dead_at + 100.0)[0].new is None and m.state_of("x") is None  # reaped after the reconnect window


def test_new_version_refreshes_and_heals_suspect_and_dead():
    m = Membership("me", CFG)
    hear(m, "x", 1, 0.0)
    m.tick(10.0)
    assert m.state_of("x") is S
    assert hear(m, "x", 2, 10.5)[0].new is A
    m.tick(100.0)
    m.tick(200.0)
    assert m.state_of("x") is D
    assert [(e.old, e.new) for e in hear(m, "x", 3, 201.0)] == [(D, A)]  # a healed partition merges
    assert hear(m, "x", 3, 202.0) == []  # same version: no news


def test_up_since_marks_a_members_current_run_for_leader_settling():
    m = Membership("me", CFG)
    hear(m, "x", 1, 0.0, inc=1)
    hear(m, "x", 2, 5.0, inc=1)  # a heartbeat of the same run
    assert m.members["x"].up_since == 0.0
    hear(m, "x", 3, 7.0, inc=2)  # a new incarnation: a restart (or a refutation)
    assert m.members["x"].up_since == 7.0
    m.tick(100.0)
    m.tick(200.0)
    assert m.state_of("x") is D
    hear(m, "x", 4, 201.0, inc=2)  # back from dead (a healed partition): a new run as far as leading goes
    assert m.members["x"].up_since == 201.0


def test_leave_is_left_not_dead_and_a_restart_is_alive_again():
    m = Membership("me", CFG)
    hear(m, "x", 1, 0.0)
    assert hear(m, "x", 2, 1.0, leaving=True)[0].new is L
    assert m.tick(40.0) == []  # left never becomes suspect
    assert m.size == 1
    assert hear(m, "x", 9, 41.0, inc=1)[0].new is A
    hear(m, "y", 1, 0.0, leaving=True)
    assert m.tick(60.0)[-1].new is None and m.state_of("y") is None  # left retention


def test_confirmations_shorten_the_suspicion_timer():
    m = Membership("me", CFG)
    for node in ("x", "c1", "c2", "c3"):
        hear(m, node, 1, 0.0)
    for v, t in enumerate((4.0, 8.0, 12.0), start=2):  # the confirmers keep talking; x is silent
        for c in ("c1", "c2", "c3"):
            hear(m, c, v, t)
    m.tick(suspect_after_s(5, CFG))
    assert m.state_of("x") is S
    suspected_at = suspect_after_s(5, CFG)
    slow = suspected_at + suspicion_timeout_s(5, 0, CFG)
    assert m.deadline_of(m.members["x"], 5) == pytest.approx(slow)
    for i, c in enumerate(("c1", "c2", "c3"), start=1):
        hear(m, c, 10 + i, suspected_at + 0.1, suspects={"x": 0})
        assert m.confirmations("x") == i
        assert m.deadline_of(m.members["x"], 5) == pytest.approx(suspected_at + suspicion_timeout_s(5, i, CFG))
    assert m.tick(suspected_at + 4.0)[0].new is D  # K = 3 confirmations: the minimum timeout


def test_accusations_of_an_older_incarnation_do_not_confirm():
    m = Membership("me", CFG)
    hear(m, "x", 1, 0.0, inc=2)
    hear(m, "c1", 1, 0.0, suspects={"x": 1})
    assert m.confirmations("x") == 0
    hear(m, "c1", 2, 0.0, suspects={"x": 2})
    assert m.confirmations("x") == 1


def test_refutation_raises_own_incarnation_once():
    m = Membership("me", CFG, incarnation=4)
    hear(m, "c1", 1, 0.0, suspects={"me": 3})  # stale accusation
    assert not m.take_refute() and m.incarnation == 4
    hear(m, "c1", 2, 1.0, suspects={"me": 4})
    assert m.incarnation == 5 and m.take_refute() and not m.take_refute()
    assert m.false_suspicions_refuted == 1


def test_illegal_transition_is_a_clear_bug():
    m = Membership("me", CFG)
    hear(m, "x", 1, 0.0)
    with pytest.raises(IllegalTransition, match="alive --reap-->"):
        m._transition("x", "reap", 1.0)


def test_own_snapshots_are_ignored():
    m = Membership("me", CFG)
    assert hear(m, "me", 1, 0.0) == [] and m.state_of("me") is A and m.members == {}


def test_the_node_core_reads_accusations_from_the_membership_section():
    """A peer's incarnation and suspicions travel in its ``membership`` section (schema 2): the node core feeds
    them to the same rules, refutes an accusation of itself once and publishes the raised incarnation."""
    from p2pnode.node import MemoryStore, NodeCore
    from p2pnode.snapshot import MembershipSection

    store = MemoryStore()
    core = NodeCore("me", config=CFG, store=store, info=lambda n: None, roll_candidates=lambda: [], incarnation=4)
    assert core.observe("c1", 1, MembershipSection(incarnation=2, suspects={"me": 3}), False, 0.0)[0].new is A
    core.reconcile(0.0, 0.0)
    assert core.membership_section() == MembershipSection(incarnation=4)  # a stale accusation: no refutation
    core.observe("c1", 2, MembershipSection(incarnation=2, suspects={"me": 4}), False, 1.0)
    core.reconcile(1.0, 1.0)
    assert core.membership_section().incarnation == 5 and store.incarnation == 5 and core.publish_due(1.0)
    core.observe("x", 1, MembershipSection(incarnation=7), False, 1.0)
    core.observe("c1", 3, MembershipSection(incarnation=2, suspects={"x": 6}), False, 1.0)  # older incarnation
    assert core.membership.confirmations("x") == 0
    core.observe("c1", 4, MembershipSection(incarnation=2, suspects={"x": 7}), False, 1.0)
    assert core.membership.confirmations("x") == 1
    assert core.observe("c1", 5, MembershipSection(incarnation=2), True, 2.0)[0].new is L  # leaving: left


def test_a_restarted_node_holds_its_persisted_vote_until_it_hears_the_cluster():
    """A node back with a persisted vote for another member does not vote for itself in a new term while it is
    alone in its view (that bumped the cluster's term twice on every restart); it holds the vote until a live
    member is heard, or for ``join_hold_s`` when nobody answers."""
    from p2pnode.election import Vote, VoterRoll
    from p2pnode.node import MemoryStore, NodeCore
    from p2pnode.snapshot import MembershipSection

    def core(vote, roll=True):  # restarted: its roll is persisted too (a fresh node first watches: issue 37)
        c = NodeCore("me", config=CFG, store=MemoryStore(), info=lambda n: None, roll_candidates=lambda: [],
                     vote=vote, join_hold_s=3.0, roll=VoterRoll(trusted=False) if roll else None)
        c.set_rank(2000.0, 80 * 2**30)
        return c

    back = core(Vote("leader", 7))
    back.reconcile(0.0, 0.0)
    back.reconcile(2.9, 2.9)
    assert back.election.vote == Vote("leader", 7) and back.election.view.leader is None  # held
    back.observe("leader", 1, MembershipSection(incarnation=1), False, 3.0)
    back.reconcile(3.0, 3.0)  # heard: the election runs (and with no vote of "leader" seen, ranks itself)
    assert back.election.vote is not None and back.election.vote.candidate == "me"

    alone = core(Vote("leader", 7))
    alone.reconcile(0.0, 0.0)
    alone.reconcile(3.0, 3.0)  # nobody answered within the hold: it votes as before
    assert alone.election.vote == Vote("me", 8)

    fresh = core(None, roll=False)  # nothing persisted: alone, it watches for join_hold_s, then elects itself
    fresh.reconcile(0.0, 0.0)
    assert fresh.election.vote is None and fresh.roll_view()["adoption"] == "watching"
    fresh.reconcile(3.0, 3.0)
    assert fresh.election.vote == Vote("me", 1)


def test_a_node_given_join_addresses_does_not_elect_itself_before_it_meets_them():
    """Nodes started together with each other's addresses used to elect themselves in term 1 before they met
    (a brief leader per node). With ``expect_peers`` the vote waits for a live member or ``join_hold_s``."""
    from p2pnode.election import Vote, VoterRoll
    from p2pnode.node import MemoryStore, NodeCore
    from p2pnode.snapshot import MembershipSection

    def core():
        c = NodeCore("me", config=CFG, store=MemoryStore(), info=lambda n: None, roll_candidates=lambda: [],
                     expect_peers=True, join_hold_s=3.0, roll=VoterRoll(trusted=False))
        c.set_rank(2000.0, 80 * 2**30)
        return c

    met = core()
    met.reconcile(0.0, 0.0)
    assert met.election.vote is None and met.election.view.leader is None
    met.observe("seed", 1, MembershipSection(incarnation=1), False, 1.0)
    met.reconcile(1.0, 1.0)
    assert met.election.vote is not None  # heard a live member: the election runs

    lonely = core()  # every join address down: after the hold it bootstraps alone, as before
    lonely.reconcile(0.0, 0.0)
    assert lonely.holding and lonely.next_deadline(0.1, heartbeat=False) == 3.0  # the driver wakes for the end
    lonely.reconcile(3.0, 3.0)
    assert lonely.election.vote == Vote("me", 1) and lonely.election.view.leader == "me" and not lonely.holding


def test_a_confirmer_that_declared_the_suspect_dead_keeps_confirming():
    """Found by ``bench/election_netns.py`` (issue 42): in a 2 | 3 partition the three of the majority accused the
    leader within a second, the first to declare it dead stopped listing it, and the others' timers fell back to
    the one-confirmation and unconfirmed timeouts (21-29 s to agree on a new leader). A node keeps listing a member
    it accused and declared dead for the longest suspicion timeout, so its confirmation stands; an accuser that
    only heard the accusation, a member back alive and an expired verdict are not listed."""
    window = suspicion_timeout_s(5, 0, CFG)
    c1 = Membership("c1", CFG)
    for node in ("x", "me", "c2", "c3"):
        hear(c1, node, 1, 0.0)
    silent = suspect_after_s(5, CFG)
    for t in (silent / 2, silent):  # the others keep talking; x is silent
        for node in ("me", "c2", "c3"):
            hear(c1, node, int(t * 10) + 2, t)
    c1.tick(silent)
    assert c1.suspects() == {"x": 0}  # its own accusation
    for node in ("c2", "c3"):  # two confirmations at c1: the minimum timeout there
        hear(c1, node, 100, silent + 0.1, suspects={"x": 0})
    dead_at = silent + suspicion_timeout_s(5, 2, CFG)
    assert [e.new for e in c1.tick(dead_at)] == [D]
    assert c1.suspects() == {"x": 0}  # dead here, still confirming
    me = Membership("me", CFG)  # an observer whose suspicion started with c1's and counts on it
    for node in ("x", "c1", "c2", "c3"):
        hear(me, node, 1, 0.0)
    for node in ("c1", "c2", "c3"):
        hear(me, node, 5, silent)
    me.tick(silent)
    hear(me, "c1", 6, dead_at, suspects=c1.suspects())
    assert me.confirmations("x") == 1
    assert me.deadline_of(me.members["x"], 5) == pytest.approx(silent + suspicion_timeout_s(5, 1, CFG))
    for node in ("me", "c2", "c3"):  # (the others kept alive at c1 until the window's end)
        hear(c1, node, 200, dead_at + window - 0.1)
    c1.tick(dead_at + window)
    assert c1.suspects() == {}  # the verdict is older than any timer of that suspicion
    hear(c1, "x", 2, dead_at + window + 1.0)  # back alive: never listed again
    assert c1.state_of("x") is not D and c1.suspects() == {}


@pytest.mark.parametrize("seed", range(6))
def test_a_resting_tick_fires_exactly_when_one_that_always_scans_does(seed):
    """A tick that finds nothing due rests until the earliest deadline it saw (until something moves a deadline
    earlier: a confirmation, a new member, a refutation). Fed the same seeded stream of snapshots (heartbeats,
    accusations, incarnations, leaves, new members), it returns the same changes at the same ticks as a
    membership made to scan every member at every tick."""
    import random

    rng = random.Random(seed)
    resting, scanning = Membership("me", CFG), Membership("me", CFG)
    names = [f"n{i}" for i in range(8)]
    versions = dict.fromkeys(names, 0)
    incs = dict.fromkeys(names, 0)
    now, fired = 0.0, 0
    for _ in range(600):
        now += rng.choice((0.05, 0.3, 1.0, 2.5))
        for node in rng.sample(names, rng.randrange(0, 3)):
            if rng.random() < 0.3:
                continue  # silent this time: some members go suspect, then dead
            versions[node] += 1
            if rng.random() < 0.05:
                incs[node] += 1
            accused = {t: incs[t] for t in rng.sample(names, rng.randrange(0, 3)) if t != node}
            leaving = rng.random() < 0.01
            for m in (resting, scanning):
                hear(m, node, versions[node], now, inc=incs[node], leaving=leaving, suspects=dict(accused))
        scanning._quiet_until = -math.inf  # never rests
        got, want = resting.tick(now), scanning.tick(now)
        assert got == want, now
        assert resting.size == scanning.size == 1 + sum(1 for x in scanning.members.values() if x.state is not L)
        fired += len(want)
    assert fired > 20  # the stream does move members through suspect, dead and reaped


@pytest.mark.parametrize("seed", range(6))
def test_the_columnar_table_scanned_by_numpy_and_fed_in_batches_acts_as_one_fed_member_by_member(seed, monkeypatch):
    """The member table's two scans (a Python loop for small tables, one numpy pass from ``NUMPY_SCAN_AT`` slots
    on) and the two inputs (``observe`` per snapshot, ``heard_many`` per batch, whose plain heartbeats skip the
    call) give the same changes at the same ticks, the same resting deadline, the same members in the same order
    and the same published suspects, over a seeded stream with accusations, refutations, probes (SWIM mode on odd
    seeds), leaves, reaps and members heard again after a reap (whose slots then come out of order)."""
    import random

    from p2pnode.gossip import _members
    from p2pnode.gossip._members import MemberIndex

    rng = random.Random(seed)
    swim = seed % 2 == 1
    names = [f"n{i}" for i in range(12)]
    shared = MemberIndex(list(reversed(names)))  # slots opposite to the order of first hearing
    one, batched = (Membership("me", CFG, adopt_suspicions=swim, index=ix) for ix in (None, shared))
    versions, incs = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
    now, fired = 0.0, 0
    for _ in range(600):
        now += rng.choice((0.05, 0.3, 1.0, 2.5, 30.0))
        batch = []
        for node in rng.sample(names, rng.randrange(0, 4)):
            if rng.random() < 0.3:
                continue
            versions[node] += 1
            if rng.random() < 0.05:
                incs[node] += 1
            accused = {t: incs.get(t, one.incarnation) for t in rng.sample(names + ["me"], rng.randrange(0, 3))
                       if t != node}
            if rng.random() < 0.7:
                accused = {}
            batch.append((node, versions[node], incs[node], rng.random() < 0.01, accused))
        for node, v, inc, gone, sus in batch:
            hear(one, node, v, now, inc=inc, leaving=gone, suspects=sus)
        batched.heard_many(*(list(c) for c in zip(*batch)), now) if batch else None
        if swim and rng.random() < 0.2:
            node, ack = rng.choice(names), rng.random() < 0.5
            for m in (one, batched):
                m.acked(node, incs[node], now) if ack else m.probe_failed(node, incs[node], now)
        monkeypatch.setattr(_members, "NUMPY_SCAN_AT", 10**9)
        got = one.tick(now)
        monkeypatch.setattr(_members, "NUMPY_SCAN_AT", 0)
        assert batched.tick(now) == got, now
        assert one._quiet_until == batched._quiet_until and one.suspects() == batched.suspects()
        assert list(one.members) == list(batched.members) and one.members == batched.members
        assert one.incarnation == batched.incarnation and one.news == batched.news
        fired += len(got)
    assert fired > 20 and not batched.members.table.ordered


def test_met_leaves_the_state_observe_of_each_leaves():
    """``met`` (the simulator's start: members heard all at once, by columns) against ``observe`` of each."""
    names = [f"n{i}" for i in range(700)]
    one, bulk = Membership("me", CFG), Membership("me", CFG)
    for x in names:
        hear(one, x, 3, 2.0, inc=1)
    bulk.met(names, 3, 1, 2.0)
    assert list(bulk.members) == names and bulk.members == one.members
    assert (bulk.size, bulk.changes, bulk.news) == (one.size, one.changes, one.news) == (701, 700, 0)
    assert bulk.tick(2.5) == one.tick(2.5) == [] and bulk.next_deadline() == one.next_deadline()
    with pytest.raises(ValueError):
        bulk.met(["n3"], 4, 1, 3.0)
