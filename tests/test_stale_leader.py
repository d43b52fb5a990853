"""A voter back from a stall must not act as the leader of the term it led before it (issue 42). Written after a
clean-clone CI run of ``tests/test_netns_lease.py`` whose logs showed it: voter n2 stalled for ~11 s at start-up;
the others elected term 3 meanwhile; back, n2 still held their snapshots voting for it in term 2, its probes
revived them (no new snapshot needed), so it counted a quorum of term 2, planned and started a training that the
term-3 leader had placed elsewhere, 0.13 s before the votes of term 3 reached it. Its lease was renewed at once by
the others' acks, so the lease did not fence the start. Now every ping and ack carries its sender's highest term
(Raft's rule) and a voter's higher term fences the stale leadership the moment the ack arrives: before the lease
renewal that ack brings can let the node act. Virtual time, the real cores (NodeCore, Membership, Prober, Election)
and the real probe wire."""

from __future__ import annotations

import random

import msgspec

from p2pnode.election import MAX_TERM_STEP, Candidate, Election, MemberInfo, Vote
from p2pnode.gossip import MembershipConfig, MemberState
from p2pnode.gossip._probe import Ack, Ping, PingReq, ProbeConfig, SendAck
from p2pnode.gossip._probewire import PAD_BYTES, ProbeCodec, ProbeKeys, _mac, _Packet
from p2pnode.identity import Identity
from p2pnode.node import MemoryStore, NodeCore, PublishPlan
from p2pnode.node._lease import Lease
from p2pnode.snapshot import MembershipSection

VOTERS = ("n1", "n2", "n3")
POWER = {"n1": 2000.0, "n2": 2500.0, "n3": 624.0}  # n2 (an H200) leads while it is there


class World:
    """Three voters' cores; ``held[o][m]`` is the snapshot of ``m`` that ``o`` holds (its vote); probe packets are
    delivered between running nodes as the cores' own messages, in order, at once."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, MemberInfo]] = {n: {} for n in VOTERS}
        self.version = dict.fromkeys(VOTERS, 0)
        self.stalled: set[str] = set()
        self.cores = {n: self._core(n) for n in VOTERS}
        self.leaders: dict[int, set[str]] = {}
        self.strip_terms = False

    def _core(self, n: str) -> NodeCore:
        core = NodeCore(n, config=MembershipConfig(), store=MemoryStore(), info=lambda k: self.held[n].get(k),
                        roll_candidates=lambda: (), tags=("voter",), trusted=True, known_voters=set(VOTERS),
                        probes=ProbeConfig(), probe_rng=random.Random(n))
        core.set_rank(POWER[n], 0)
        return core

    def publish(self, src: str, now: float) -> None:
        """``src``'s snapshot (its vote) reaches every running node."""
        core = self.cores[src]
        self.version[src] += 1
        for o in VOTERS:
            if o != src and o not in self.stalled:
                self.held[o][src] = MemberInfo(core.candidate, core.election.vote, ("voter",))
                self.cores[o].observe(src, self.version[src], MembershipSection(incarnation=1), False, now)

    def deliver(self, effects: list, now: float) -> None:
        queue = list(effects)
        while queue:
            e = queue.pop(0)
            if not hasattr(e, "msg"):
                continue  # a state change
            to = e.msg.to
            if to in self.stalled or e.msg.sender in self.stalled:
                continue
            msg = msgspec.structs.replace(e.msg, term=0) if self.strip_terms and hasattr(e.msg, "term") else e.msg
            queue += self.cores[to].prober.receive(msg, now)

    def step(self, now: float) -> None:
        """Every running node probes, reconciles (votes) and publishes."""
        for n in VOTERS:
            if n in self.stalled:
                continue
            core = self.cores[n]
            self.deliver(core.prober.tick(now), now)
            core.reconcile(now, now)
            self.publish(n, now)
            v = core.view
            if core.is_leader():
                self.leaders.setdefault(v.term, set()).add(n)

    def run(self, start: float, until: float, dt: float = 0.25) -> float:
        t = start
        while t < until:
            self.step(t)
            t += dt
        return t


def back_from_stall(*, terms: bool) -> tuple[World, float, int]:
    """n2 leads, stalls 15 s while n1 and n3 elect n1 in a higher term, comes back, finds its members silent
    (suspect), and pings them for its lease; their acks revive them. ``terms=False``: the acks say no term (the
    code before this fix, or an older agent)."""
    w = World()
    w.strip_terms = not terms
    t = w.run(0.0, 5.0)
    n1, n2, n3 = (w.cores[n] for n in VOTERS)
    assert {c.view.leader for c in (n1, n2, n3)} == {"n2"} and n2.is_leader()
    old = n2.view.term
    w.stalled = {"n2"}  # n2's process stops: it neither sends, nor receives, nor steps
    t = w.run(t, t + 15.0)
    assert n1.membership.members["n2"].state is MemberState.DEAD
    assert n1.view.leader == "n1" and n3.view.leader == "n1" and n1.view.term > old
    # Back, before any newer snapshot reaches it: its copies of n1's and n3's snapshots still vote for it in its
    # old term. They have been silent: suspect, so no quorum...
    w.stalled = set()
    n2.reconcile(t, t)
    assert n2.view.leader is None and {m.state for m in n2.membership.members.values()} == {MemberState.SUSPECT}
    # ...until its lease pings are acked, reviving both; each is a DirectAck, which the probe driver hands to the
    # lease after the prober took the ack (so after any term it carried was adopted).
    lease = Lease("n2", lease_s=8.0, stop_lead_s=2.0)
    lease.set_voters(VOTERS)
    assert not lease.held(t)  # it ran out during the stall
    n2.prober.keep_direct_acks = True
    for voter in ("n1", "n3"):
        w.deliver(n2.prober.ping(voter, t), t)
    for a in n2.prober.take_direct_acks():
        lease.acked(a.node, a.sent_at, t)
    assert lease.held(t)  # renewed: what lets a node start its exclusive work
    n2.reconcile(t, t)
    assert {m.state for m in n2.membership.members.values()} == {MemberState.ALIVE}
    return w, t, old


def test_a_voter_back_from_a_stall_is_fenced_by_the_acks_that_renew_its_lease():
    plan = msgspec.defstruct("Plan", [("term", int)])
    # Before: the acks that renew its lease revive the members whose stale votes make it leader of its old term,
    # and it acts on its own plan of that term (the start CI saw).
    w, t, old = back_from_stall(terms=False)
    n2 = w.cores["n2"]
    assert n2.view.leader == "n2" and n2.view.term == old and n2.is_leader()
    assert n2.acting_plan(plan(old)) is not None
    # Now: the same acks carry the term the others elected; n2 adopts it as it takes them, so nothing of its old
    # term is acted on, and it never leads that term again.
    w, t, old = back_from_stall(terms=True)
    n1, n2, n3 = (w.cores[n] for n in VOTERS)
    assert n2.election.highest_term == n1.election.highest_term > old
    assert not n2.is_leader() and n2.acting_plan(plan(old)) is None
    assert n2.prober.term == n2.election.highest_term  # and it says the new term in its own probes from now on
    # Then the votes arrive and the cluster settles on one leader per term (n2 again, the strongest, later).
    w.leaders.clear()
    w.run(t + 0.25, t + 20.0)
    assert {c.view.leader for c in (n1, n2, n3)} == {"n2"} and n2.view.term >= old + 2  # above n1's term
    assert all(len(who) == 1 for who in w.leaders.values()), w.leaders


def test_a_ping_carries_the_term_too_and_only_voters_move_it_by_bounded_steps():
    e = Election("a", is_voter=True, vote=Vote("a", 3))
    cands = [Candidate(n, p, 0) for n, p in (("a", 3.0), ("b", 2.0), ("c", 1.0))]
    e.update(candidates=cands, votes={"b": Vote("a", 3), "c": Vote("a", 3)}, voter_set={"a", "b", "c"},
             alive={"a", "b", "c"})
    assert e.leads("a")
    assert not e.observe_term("stranger", 9) and e.outside_terms == 1  # not a voter: moves nothing
    assert not e.observe_term("a", 9) and e.highest_term == 3  # its own term is its own business
    assert not e.observe_term("b", 3 + MAX_TERM_STEP + 1) and e.implausible_terms == 1  # a forged jump
    assert not e.observe_term("b", 2) and e.leads("a")  # older: nothing
    assert e.observe_term("b", 4) and e.highest_term == 4 and e.view.highest_term == 4
    assert not e.leads("a") and not e.accepts(3)

    # The prober hands a higher term of a ping to its owner before answering it, and answers with its own.
    w = World()
    w.run(0.0, 3.0)
    n3 = w.cores["n3"]
    before = n3.election.highest_term
    ping = Ping(10**6, "n1", "n3", 1, False, before + 2)
    (ack,) = n3.prober.receive(ping, 3.0)
    assert n3.election.highest_term == before + 2 and ack.msg.term == before + 2
    # A relay's ack carries the relay's own term (the relayed target's says nothing about it).
    relay = w.cores["n2"]
    (fwd,) = relay.prober.receive(PingReq(77, "n1", "n2", "n3", 1), 3.0)
    (back,) = n3.prober.receive(fwd.msg, 3.0)
    assert back.msg.term == before + 2
    (relayed,) = [e for e in relay.prober.receive(back.msg, 3.0) if isinstance(e, SendAck)]
    assert relayed.msg.node == "n3" and relayed.msg.term == relay.election.highest_term == before + 2


def _old_layout_body(kind: str, a: str, b: str) -> bytes:
    """A ping or ack body as agents before the term field encoded it (no trailing term)."""
    if kind == "ping":
        return msgspec.msgpack.encode([1, 7, a, b, 0, False, 1_000_000, bytes(PAD_BYTES)])
    return msgspec.msgpack.encode([3, 7, a, b, 0, None, 1_000_000])


def _pair() -> tuple[str, str, ProbeCodec, ProbeCodec]:
    ia, ib = Identity.generate(), Identity.generate()
    a, b = ia.node_id, ib.node_id
    pubs = {a: ia.public_key, b: ib.public_key}
    return a, b, ProbeCodec(ProbeKeys(a, ia.private_key, pubs.get)), ProbeCodec(ProbeKeys(b, ib.private_key, pubs.get))


def _sealed_old(codec: ProbeCodec, to: str, kind: str) -> bytes:
    body = _old_layout_body(kind, codec.self_id, to)
    return msgspec.msgpack.encode(_Packet("", body, _mac(codec.keys.key(to, ""), "", body)))


def test_the_term_is_a_trailing_field_older_agents_and_this_one_read_each_other():
    a, b, ca, cb = _pair()
    ping = ca.open(_sealed_old(cb, a, "ping"), "h", 0.0, 1_000_000)  # an older agent's ping
    assert isinstance(ping, Ping) and ping.term == 0  # says no term
    # The reply carries the largest term and incarnation and still fits the older ping's size (no amplification).
    reply = ca.seal(Ack(7, a, b, 2**53 - 1, None, 2**50), 1_000_001)
    assert reply is not None and len(reply) <= len(_sealed_old(cb, a, "ping"))
    fields = msgspec.msgpack.decode(msgspec.msgpack.decode(reply, type=_Packet).body)
    assert fields[:6] == [3, 7, a, b, 2**53 - 1, None] and fields[7:] == [2**50]  # the older layout, then the term
    # An older agent's ack (no term) to a ping of ours: term 0.
    assert cb.open(ca.seal(Ping(9, a, b, 0, False, 4), 1_000_002), "h", 0.0, 1_000_002) is not None
    body = msgspec.msgpack.encode([3, 9, b, a, 0, None, 1_000_003])
    old_ack = msgspec.msgpack.encode(_Packet("", body, _mac(cb.keys.key(a, ""), "", body)))
    ack = ca.open(old_ack, "h", 0.0, 1_000_003)
    assert isinstance(ack, Ack) and ack.term == 0


def test_acks_of_a_term_too_far_above_to_adopt_renew_no_lease():
    """A stall across more terms than a message may move ours (MAX_TERM_STEP): the acks' term is refused, so they
    must not renew the lease either, or the node would lead its old term with a lease held (a hostile review's
    finding)."""
    w = World()
    t = w.run(0.0, 5.0)
    n1, n2, n3 = (w.cores[n] for n in VOTERS)
    old = n2.view.term
    w.stalled = {"n2"}
    t = w.run(t, t + 15.0)
    flip = 0
    while n1.election.highest_term <= old + MAX_TERM_STEP + 1:  # leadership flapping between n1 and n3
        flip ^= 1
        n1.set_rank(3000.0 if flip else 500.0, 0)
        n3.set_rank(500.0 if flip else 3000.0, 0)
        t = w.run(t, t + 2.0)
    w.stalled = set()
    n2.reconcile(t, t)
    lease = Lease("n2", lease_s=8.0, stop_lead_s=2.0)
    lease.set_voters(VOTERS)
    n2.prober.keep_direct_acks = True
    for voter in ("n1", "n3"):
        w.deliver(n2.prober.ping(voter, t), t)
    assert n2.election.highest_term == old and n2.election.implausible_terms == 2  # not adopted...
    assert n2.prober.take_direct_acks() == [] and n2.prober.acks_unadopted >= 2  # ...so they renew nothing
    assert not lease.held(t)


def test_a_term_heard_whose_vote_never_comes_does_not_fence_the_cluster_for_good():
    """n3, cut off from snapshots but not from probes (an MTU black hole), votes for itself in a higher term and
    says so in its lease pings; its vote never arrives. The majority, fenced by that term, votes for its leader
    again above it after the term hold, and acts again; no term churn after (a hostile review's finding)."""
    w = World()
    t = w.run(0.0, 5.0)
    n1, n2, n3 = (w.cores[n] for n in VOTERS)
    old = n2.view.term
    w.stalled = {"n3"}  # n3 hears nothing and publishes nothing to the others...
    for _ in range(40):  # ...but steps: it declares the others dead and votes for itself in a new term
        t += 0.5
        n3.reconcile(t, t)
    assert n3.election.vote.candidate == "n3" and n3.election.vote.term > old
    w.stalled = set()
    w.deliver(n3.prober.ping("n1", t), t)  # its lease pings get through (then it stays cut off)
    w.deliver(n3.prober.ping("n2", t), t)
    assert n1.election.highest_term == n3.election.vote.term and n1.election.superseded()
    w.stalled = {"n3"}
    w.leaders.clear()
    t = w.run(t, t + 10.0)
    assert n1.view.leader == n2.view.leader == "n2" and n2.is_leader() and not n1.election.superseded()
    assert n2.view.term == n3.election.vote.term + 1 and n1.election.reaffirmed + n2.election.reaffirmed >= 1
    settled = n2.view.term
    t = w.run(t, t + 30.0)
    assert n2.view.term == settled and all(len(who) == 1 for who in w.leaders.values())  # no churn, one a term


def test_a_leader_fenced_by_a_higher_term_plans_nothing():
    from test_job_core import core, drive, inputs, lead, member, of

    ms = [member("c", offer=4), member("a", offer=4)]
    assert of(drive(core("c", settle_s=0.0, interval_s=1.0), inputs(lead("c", 2), ms), 0.0), PublishPlan)
    fenced = core("c", settle_s=0.0, interval_s=1.0)
    assert of(drive(fenced, inputs(lead("c", 2, highest=3), ms), 0.0), PublishPlan) == []
    assert fenced.my_plan is None
