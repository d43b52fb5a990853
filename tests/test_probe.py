"""SWIM probes (p2pnode.gossip._probe) over Membership, and the authenticated probe wire (_probewire): virtual time,
exact deadlines, real cores."""

import random
from collections import Counter

import pytest

from p2pnode.gossip._membership import Membership, MembershipConfig, MemberState, suspicion_timeout_s
from p2pnode.gossip._newspush import NewsPush
from p2pnode.gossip._probe import (
    Ack,
    Nack,
    Ping,
    PingReq,
    ProbeConfig,
    Prober,
    SendAck,
    SendNack,
    SendPing,
    SendPingReq,
)
from p2pnode.gossip._probewire import MAX_PACKET_BYTES, ProbeCodec, ProbeKeys
from p2pnode.identity import Identity
from p2pnode.keyring import Keyring
from p2pnode.sim._swim import SwimCluster, detection, memberlist_bound, memberlist_detection_s

A, S, D = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD
CFG = MembershipConfig()  # lan: interval 1 s, suspicion_mult 4, max mult 6, K capped at 2
PCFG = ProbeConfig()  # interval 1 s, timeout 0.5 s, 3 indirect checks


def member_view(self_id, others, *, inc=0):
    m = Membership(self_id, CFG, adopt_suspicions=True)
    for o in others:
        m.observe(o, version=1, incarnation=inc, leaving=False, suspects={}, now=0.0)
    return m


def sends(effects, kind):
    return [e.msg for e in effects if isinstance(e, kind)]


def test_a_silent_member_is_suspect_after_one_interval_and_dead_after_the_suspicion_timeout():
    m = member_view("a", ["b"])
    p = Prober(m, PCFG, rng=random.Random(1))
    (ping,) = sends(p.tick(0.0), SendPing)
    assert (ping.to, ping.incarnation, ping.suspected) == ("b", 0, False)
    assert p.next_deadline() == pytest.approx(0.5)  # the probe timeout
    assert sends(p.tick(0.5), SendPingReq) == []  # nobody else to ask
    assert p.next_deadline() == pytest.approx(1.0)  # the interval's end
    assert p.tick(0.99) == [] and m.state_of("b") is A
    out = p.tick(1.0)
    assert [(e.node_id, e.new) for e in out if not isinstance(e, SendPing)] == [("b", S)]
    assert m.suspects() == {"b": 0}  # our own accusation, in our snapshot
    assert sends(out, SendPing)[0].suspected  # the next probe tells b it is suspected (it may refute)
    dead_at = 1.0 + suspicion_timeout_s(2, 0, CFG)  # N = 2: K = 0, the minimum, 4 s
    assert dead_at == pytest.approx(5.0)
    assert m.tick(dead_at - 0.01) == [] and m.tick(dead_at)[0].new is D
    assert p.probes_failed >= 1 and p.score >= 1  # a failed probe with no relay to nack: local health worsens


def test_an_ack_ends_the_probe_and_heals_local_health():
    m = member_view("a", ["b"])
    p = Prober(m, PCFG, rng=random.Random(1))
    p.score = 3
    (ping,) = sends(p.tick(0.0), SendPing)
    assert p.next_deadline() == pytest.approx(0.5)
    assert p.receive(Ack(ping.seq, "b", "a", 0), 0.1) == []
    assert p.score == 2 and p.next_deadline() == pytest.approx(1.0)
    assert m.members["b"].last_acked_at == 0.1
    assert p.receive(Ack(ping.seq, "b", "a", 0), 0.2) == [] and p.unexpected == 1  # a duplicate


def test_indirect_probe_through_relays_and_the_relay_side():
    m = member_view("a", ["b", "c", "d", "e"])
    p = Prober(m, PCFG, rng=random.Random(3))
    (ping,) = sends(p.tick(0.0), SendPing)
    target = ping.to
    reqs = sends(p.tick(0.5), SendPingReq)
    assert len(reqs) == 3 and {r.target for r in reqs} == {target} and target not in {r.to for r in reqs}
    # one relay nacks, another relays the target's ack: the probe succeeded
    assert p.receive(Nack(ping.seq, reqs[0].to, "a"), 0.6) == []
    assert p.receive(Ack(ping.seq, reqs[1].to, "a", 5, target), 0.7) == []
    assert m.state_of(target) is A and p.probes_failed == 0 and p.indirect_probes == 1
    assert m.members[target].incarnation == 0  # a relay's word is a sign of life, never an incarnation
    # an ack "of the target" from someone we did not ask is not trusted
    p2 = Prober(member_view("a", ["b", "c"]), PCFG, rng=random.Random(3))
    (ping2,) = sends(p2.tick(0.0), SendPing)
    p2.tick(0.5)
    assert p2.receive(Ack(ping2.seq, "zz", "a", 0, ping2.to), 0.6) == [] and p2.unexpected == 1

    # The relay: pings the target by id, relays its ack with the target's incarnation, or nacks on timeout.
    r = Prober(member_view("c", ["a", "b"]), PCFG, rng=random.Random(4))
    (rping,) = sends(r.receive(PingReq(7, "a", "c", "b", 0), 10.0), SendPing)
    assert rping.to == "b"
    (relayed,) = sends(r.receive(Ack(rping.seq, "b", "c", 2), 10.1), SendAck)
    assert (relayed.seq, relayed.to, relayed.node, relayed.incarnation) == (7, "a", "b", 2)
    (rping,) = sends(r.receive(PingReq(8, "a", "c", "b", 2), 11.0), SendPing)
    assert r.next_deadline() == pytest.approx(11.5)
    (nack,) = sends(r.tick(11.5), SendNack)
    assert (nack.seq, nack.to) == (8, "a")
    (nack,) = sends(r.receive(PingReq(9, "a", "c", "unknown", 0), 12.0), SendNack)  # not a member we hold
    assert r.relays_refused == 1


def test_round_robin_probes_each_member_once_per_pass_and_takes_in_new_members():
    others = [f"m{i}" for i in range(10)]
    m = member_view("a", others)
    p = Prober(m, PCFG, rng=random.Random(9))
    t, passes = 0.0, []
    for _ in range(3):
        seen = []
        for _ in range(10):
            (ping,) = sends(p.tick(t), SendPing)
            seen.append(ping.to)
            p.receive(Ack(ping.seq, ping.to, "a", 0), t + 0.01)
            t += 1.0
        assert sorted(seen) == others  # every member once per pass
        passes.append(seen)
    assert passes[0] != passes[1]  # reshuffled each pass
    m.observe("new", version=1, incarnation=0, leaving=False, suspects={}, now=t)
    seen = []
    for _ in range(11):
        (ping,) = sends(p.tick(t), SendPing)
        seen.append(ping.to)
        p.receive(Ack(ping.seq, ping.to, "a", 0), t + 0.01)
        t += 1.0
    assert "new" in seen  # inserted into the current or next pass, probed within one pass


def test_a_member_this_node_cannot_address_is_never_probed_so_never_suspected_by_a_probe():
    others = [f"m{i}" for i in range(5)]
    m = member_view("a", others)
    p = Prober(m, PCFG, rng=random.Random(3))
    p.reachable = lambda node_id: node_id != "m2"  # e.g. it advertises a DNS name the dial policy refuses
    t, seen = 0.0, []
    for _ in range(400):
        for e in p.tick(t):
            if isinstance(e, SendPing):
                seen.append(e.msg.to)
        t += 0.25  # no ack: every probe fails (and local health stretches the interval)
    assert "m2" not in seen and set(seen) == {"m0", "m1", "m3", "m4"}
    assert m.members["m2"].state is MemberState.ALIVE and m.members["m0"].state is not MemberState.ALIVE


def test_ping_req_flood_is_bounded_by_max_relays():
    r = Prober(member_view("c", ["a", "b"]), ProbeConfig(max_relays=4), rng=random.Random(4))
    out = [e for i in range(10) for e in r.receive(PingReq(i, "a", "c", "b", 0), 1.0)]
    assert len(sends(out, SendPing)) == 4 and len(sends(out, SendNack)) == 6 and r.relays_refused == 6


def test_with_indirect_acks_a_member_whose_direct_path_fails_is_not_suspected():
    sim = SwimCluster(5, seed=2)
    ids = list(sim.nodes)
    sim.blocked |= {(ids[0], ids[1]), (ids[1], ids[0])}  # a <-> b lost both ways (e.g. a firewall)
    sim.run_until(60.0)
    assert [e for e in sim.events if e[3] == "suspect"] == []
    assert sum(n.prober.indirect_probes for n in sim.nodes.values()) > 0


def test_a_member_whose_udp_is_dropped_is_not_suspected_thanks_to_the_stream_fallback():
    sim = SwimCluster(5, seed=4)
    sim.datagrams_blocked.add(next(iter(sim.nodes)))  # TCP only, as some marketplaces map
    sim.run_until(60.0)
    assert [e for e in sim.events if e[3] == "suspect"] == []


@pytest.mark.parametrize("seed", [1, 3])
def test_the_real_codec_carries_relays_fallbacks_and_refutations_without_a_rejection(seed):
    sim = SwimCluster(8, seed=seed, codec=True, loss=0.05)
    ids = list(sim.nodes)
    sim.blocked |= {(ids[0], ids[1]), (ids[1], ids[0])}
    sim.datagrams_blocked.add(ids[2])
    sim.run_until(40.0)
    # (with 5 % loss, a cut link and a relay without UDP, a rare suspicion is SWIM's own; it is refuted)
    assert [e for e in sim.events if e[3] == "dead"] == []
    assert sum(n.prober.indirect_probes for n in sim.nodes.values()) > 0
    assert sum((c.rejected for c in sim.codecs.values()), start=Counter()) == Counter()
    sim.kill(ids[3])
    sim.run_until(80.0)
    assert set(sim.first(ids[3], "dead")) == set(ids) - {ids[3]}


def test_refutation_by_a_higher_incarnation():
    a = member_view("a", ["b"])
    pa = Prober(a, PCFG, rng=random.Random(1))
    b = member_view("b", ["a"])
    pb = Prober(b, PCFG, rng=random.Random(2))
    pa.tick(0.0)
    pa.tick(0.5)
    (ping,) = sends(pa.tick(1.0), SendPing)  # b did not answer: suspect; the next probe says so
    assert a.state_of("b") is S and ping.suspected and ping.incarnation == 0
    (ack,) = sends(pb.receive(ping, 1.1), SendAck)
    assert ack.incarnation == 1 and b.incarnation == 1 and b.take_refute()  # b refutes and republishes
    assert pb.score == 1  # Lifeguard: being suspected worsens b's own local health
    changes = pa.receive(ack, 1.2)
    assert [(c.node_id, c.old, c.new) for c in changes] == [("b", S, A)] and a.members["b"].incarnation == 1
    assert a.suspects() == {}
    # an ack claiming an incarnation far above ours is not a refutation (bounded steps)
    c = member_view("c", ["b"])
    assert c.acked("b", 10_000, 1.0) == [] and c.implausible_suspicions == 1


def test_adopted_suspicion_is_shortened_by_confirmations_capped_at_k():
    m = member_view("me", ["x", "c1", "c2", "c3", "c4"])
    ev = m.observe("c1", version=2, incarnation=0, leaving=False, suspects={"x": 0}, now=10.0)
    assert [(e.node_id, e.new) for e in ev] == [("x", S)]
    assert m.suspects() == {}  # adopted, not our accusation: our snapshot does not confirm it
    n = m.size  # 6: K = min(3, 4 - 2) = 2
    x = m.members["x"]
    assert m.deadline_of(x, n) == pytest.approx(10.0 + suspicion_timeout_s(n, 0, CFG))  # the first accuser: max
    assert suspicion_timeout_s(n, 0, CFG) == pytest.approx(24.0)
    m.observe("c2", version=2, incarnation=0, leaving=False, suspects={"x": 0}, now=11.0)
    assert m.deadline_of(x, n) == pytest.approx(10.0 + suspicion_timeout_s(n, 1, CFG))
    m.probe_failed("x", 0, 12.0)  # our own probe fails too: a confirmation
    assert m.suspects() == {"x": 0}
    assert m.deadline_of(x, n) == pytest.approx(10.0 + 4.0)  # K = 2 confirmations: the minimum
    m.observe("c3", version=2, incarnation=0, leaving=False, suspects={"x": 0}, now=12.5)
    assert m.deadline_of(x, n) == pytest.approx(14.0)  # capped: more confirmations change nothing
    assert [e for e in m.tick(13.99) if e.node_id == "x"] == []
    assert [e.new for e in m.tick(14.0) if e.node_id == "x"] == [D]
    # an accusation of an older incarnation is void
    m2 = member_view("me", ["x", "c1"], inc=3)
    assert m2.observe("c1", version=2, incarnation=3, leaving=False, suspects={"x": 2}, now=1.0) == []


@pytest.mark.parametrize("n", [5, 100])
def test_detection_time_matches_memberlists_formula(n):
    r = detection(n, seed=7)
    formula = memberlist_detection_s(n, CFG)
    assert formula == pytest.approx(4.0 if n == 5 else 8.0)
    spread = CFG.gossip_interval_s * max(1, -(-len(f"{n - 1:b}") // 2))  # ceil(log4 N) rounds of push-pull
    assert r["suspect_first_s"] <= 3 * PCFG.probe_interval_s  # some node probes it within about one interval
    assert r["dead_first_s"] >= formula  # never sooner than the minimum suspicion timeout
    # everyone: the probe, the accusation's spread, K confirmations' probes, then the minimum timeout
    assert r["dead_all_s"] <= r["suspect_first_s"] + spread + 2 * PCFG.probe_interval_s + formula
    assert r["false_suspicions"] == 0


def test_detection_formula_at_1000_members_for_one_observer():
    """N = 1,000 (a full cluster is bench material): one observer's real Membership, accusations arriving as
    other members' failed probes do (about one a second), dies min-timeout after the first it heard."""
    ids = [f"n{i:04d}" for i in range(1000)]
    m = member_view(ids[0], ids[1:])
    assert memberlist_detection_s(1000, CFG) == pytest.approx(12.0)
    for i, accuser in enumerate(ids[2:5]):
        m.observe(accuser, version=2, incarnation=0, leaving=False, suspects={ids[1]: 0}, now=1.0 + i)
    assert m.next_deadline() == pytest.approx(13.0)  # before any heartbeat silence (10 s + 12 s at N = 1,000)
    assert m.tick(12.99) == [] and m.tick(13.0)[0].new is D


def test_memberlists_bound_adds_the_probe_the_suspicion_and_the_dead_messages_spread():
    b = memberlist_bound(1000)
    assert (b.first_probe_s, b.failed_probe_s, b.suspicion_s) == (1.0, 1.0, pytest.approx(12.0))
    assert b.dissemination_rounds == 8 and b.dissemination_s == pytest.approx(1.6)  # log4 1000 + ln 1000 / 3
    assert b.total_s == pytest.approx(15.6)
    assert memberlist_bound(2000).total_s == pytest.approx(17.0, abs=0.01)
    assert memberlist_bound(100).total_s == pytest.approx(11.0)


def test_news_push_owes_two_pushes_per_news_spaced_and_after_our_own_publication():
    p = NewsPush(0.2)
    p.note(0)
    assert not p.due(0.0) and p.next_deadline() is None  # nothing new: an idle cluster pushes nothing
    p.note(1)
    assert not p.due(0.0, publishing=True)  # our news travels in our next snapshot: the push waits for it
    assert p.due(0.0)
    p.pushed(0.0)
    assert not p.due(0.1) and p.next_deadline() == pytest.approx(0.2)
    p.note(2)  # news while a push is owed: carried by the owed pushes, two again from here
    assert p.due(0.2)
    p.pushed(0.2)
    p.pushed(0.4)
    assert p.pending == 0 and not p.due(10.0) and p.pushes == 3
    p.note(2)
    assert not p.due(10.0)  # the same news again is no news
    off = NewsPush(0.0)
    off.note(5)
    assert not off.due(1.0)


def test_membership_news_is_an_accusation_short_of_k_or_a_refutation():
    m = member_view("me", ["x", "c1", "c2", "c3", "c4"])  # N = 6: K = 2, so 1 + 2 accusers are worth pushing
    assert m.news == 0
    m.observe("c1", version=2, incarnation=0, leaving=False, suspects={"x": 0}, now=1.0)
    assert m.news == 1
    m.observe("c1", version=3, incarnation=0, leaving=False, suspects={"x": 0}, now=1.5)
    assert m.news == 1  # the same accusation again (a heartbeat)
    m.observe("c2", version=2, incarnation=0, leaving=False, suspects={"x": 0}, now=2.0)
    m.observe("c3", version=2, incarnation=0, leaving=False, suspects={"x": 0}, now=2.0)
    assert m.news == 3
    m.observe("c4", version=2, incarnation=0, leaving=False, suspects={"x": 0}, now=2.0)
    assert m.news == 3  # a fourth accuser: K confirmations held already (memberlist stops re-broadcasting)
    m.probe_failed("x", 0, 3.0)
    assert m.news == 4  # our own accusation: in our next snapshot, pushed
    m.observe("x", version=2, incarnation=1, leaving=False, suspects={}, now=4.0)
    assert m.news == 5  # x refuted (a higher incarnation): pushed on
    m.observe("c1", version=4, incarnation=0, leaving=False, suspects={"me": 0}, now=5.0)
    assert m.refute_needed and m.news == 6  # accused ourselves: the refutation is news


def test_node_core_pushes_relayed_news_at_once_and_its_own_after_publishing():
    from p2pnode.node import MemoryStore, NodeCore
    from p2pnode.snapshot import MembershipSection

    core = NodeCore("me", config=CFG, store=MemoryStore(), info=lambda n: None, roll_candidates=lambda: [],
                    probes=PCFG, probe_rng=random.Random(1))
    for o in ("x", "c1", "c2"):
        core.observe(o, 1, MembershipSection(incarnation=0), False, 0.0)
    core.reconcile(0.0, 0.0)
    core.published(0.0, {})
    assert not core.push_due(0.5)
    core.observe("c1", 2, MembershipSection(incarnation=0, suspects={"x": 0}), False, 1.0)  # an accusation
    assert core.push_due(1.0)  # a relay: nothing of ours to publish first
    core.pushed(1.0)
    assert not core.push_due(1.1) and core.news_push.next_deadline() == pytest.approx(1.2)
    assert core.next_deadline(1.1) <= 1.2  # the driver wakes for it
    core.pushed(1.2)
    core.membership.probe_failed("x", 0, 2.0)  # our own accusation
    core.want_publish()  # (the agent's probe driver asks for the publication)
    assert not core.push_due(2.0)  # ... which the push must carry
    core.reconcile(2.1, 2.1)
    assert core.publish_due(2.1)
    core.published(2.1, core.membership.suspects())
    assert core.push_due(2.1)


@pytest.mark.parametrize("seed", [1, 2])
def test_pushed_news_spreads_an_accusation_to_everyone_within_a_fraction_of_a_round(seed):
    """Virtual time, 50 real probe + membership cores: a killed member's first accusation reaches every survivor
    by the agent's news push (NewsPush) well within one gossip round; by the rounds alone it took 2-5 s."""
    def spread(push):
        sim = SwimCluster(50, seed=seed, push=push)
        victim = sim.ids[0]
        sim.run_until(3.0)
        sim.kill(victim)
        sim.run_until(20.0)
        suspected = sim.first(victim, "suspect", after=3.0)
        dead = sim.first(victim, "dead", after=3.0)
        assert len(suspected) == len(dead) == 49
        return max(suspected.values()) - min(suspected.values()), max(dead.values()) - min(suspected.values()), sim

    pushed, dead_after, sim = spread(True)
    assert pushed <= 0.5 * CFG.gossip_interval_s
    b = memberlist_bound(50)
    assert dead_after <= b.suspicion_s + b.dissemination_s  # memberlist's, from the first suspicion on
    assert sim.push_exchanges <= 50 * 17 * 3  # bounded: within a push (3 exchanges) per node per second
    rounds_only, _, _ = spread(False)
    assert rounds_only >= CFG.gossip_interval_s and rounds_only > 3 * pushed


# -- the wire ----------------------------------------------------------------------------------------------------
class Pair:
    def __init__(self, *, keyring=None, keyring_b=None):
        self.a, self.b = Identity.generate(), Identity.generate()
        pubs = {self.a.node_id: self.a.public_key, self.b.node_id: self.b.public_key}
        self.ka = ProbeKeys(self.a.node_id, self.a.private_key, pubs.get, lambda: keyring)
        self.kb = ProbeKeys(self.b.node_id, self.b.private_key, pubs.get, lambda: keyring_b or keyring)
        self.ca, self.cb = ProbeCodec(self.ka), ProbeCodec(self.kb)


def test_probe_packets_round_trip_small_and_acks_never_larger_than_requests():
    for ring in (None, Keyring.of(["correct horse battery staple"])):
        p = Pair(keyring=ring)
        a, b = p.a.node_id, p.b.node_id
        ping = Ping(5, a, b, 3, True)
        pkt = p.ca.seal(ping, 1_000_000)
        assert len(pkt) < 128
        assert p.cb.open(pkt, "10.0.0.1", 0.0, 1_000_000) == ping
        ack = Ack(5, b, a, 2**40, None)  # an incarnation that grew a lot still fits: the request is padded
        reply = p.cb.seal(ack, 1_000_001)
        assert reply is not None and len(reply) <= len(pkt)
        assert p.ca.open(reply, "10.0.0.2", 0.0, 1_000_001) == ack
        assert p.cb.seal(ack, 1_000_002) is None  # a request is answered once
        req = PingReq(6, a, b, "x" * 16, 0)
        rpkt = p.ca.seal(req, 1_000_002)
        assert p.cb.open(rpkt, "10.0.0.1", 0.0, 1_000_002) == req
        rel = p.cb.seal(Ack(6, b, a, 2**40, "x" * 16), 1_000_003)  # the relayed ack: within the ping-req's size
        assert rel is not None and len(rel) <= len(rpkt)
        assert p.cb.seal(Nack(77, b, a), 1_000_004) is None  # answers nothing we opened
        assert p.cb.rejected["unsolicited_reply"] == 2


def test_forged_replayed_stale_misdirected_and_oversized_probes_are_rejected_and_counted():
    p = Pair(keyring=Keyring.of(["correct horse battery staple"]))
    a, b = p.a.node_id, p.b.node_id
    wall = 5_000_000
    good = p.ca.seal(Ping(1, a, b, 0), wall)
    assert p.cb.open(good, "h", 0.0, wall) is not None
    assert p.cb.open(good, "h", 0.1, wall + 10) is None  # the same packet again
    tampered = bytearray(p.ca.seal(Ping(2, a, b, 0), wall))
    tampered[-1] ^= 1
    assert p.cb.open(bytes(tampered), "h", 0.2, wall) is None
    assert p.cb.open(p.ca.seal(Ping(3, a, b, 0), wall - 60_000), "h", 0.3, wall) is None  # outside the window
    # another cluster's token: a valid MAC under a key we do not hold
    other = Pair(keyring=Keyring.of(["another cluster token!!"]))
    other.ca.keys = ProbeKeys(a, p.a.private_key, p.ka.public_key_of, lambda: Keyring.of(["another cluster token!!"]))
    assert p.cb.open(other.ca.seal(Ping(4, a, b, 0), wall), "h", 0.4, wall) is None
    stranger = Identity.generate()  # not a member: no signed snapshot, no public key held
    sk = ProbeKeys(stranger.node_id, stranger.private_key, {b: p.b.public_key}.get)
    assert p.cb.open(ProbeCodec(sk).seal(Ping(1, stranger.node_id, b, 0), wall), "h", 0.45, wall) is None
    assert p.cb.open(p.ca.seal(Ping(5, a, a, 0), wall) or b"", "h", 0.5, wall) is None  # names another receiver
    assert p.cb.open(b"\x93" + b"\x00" * (MAX_PACKET_BYTES + 1), "h", 0.6, wall) is None
    assert p.cb.open(b"\xc1garbage", "h", 0.7, wall) is None
    assert dict(p.cb.rejected) == {"replay": 1, "bad_mac": 1, "stale": 1, "unknown_key": 1, "unknown_sender": 1,
                                   "wrong_receiver": 1, "oversized": 1, "malformed": 1}
    # open mode keys: the pair's identities only, so a third member cannot forge a probe between a and b
    o = Pair()
    assert o.cb.open(o.ca.seal(Ping(1, o.a.node_id, o.b.node_id, 0), wall), "h", 0.0, wall) is not None
    assert o.ka.send_key_id() == "" and o.ka.key(o.b.node_id, "") == o.kb.key(o.a.node_id, "")


def test_keyring_rotation_accepts_any_installed_token():
    old, new = "old cluster token 1234", "new cluster token 5678"
    sender = Keyring.of([new, old], primary=new)
    receiver = Keyring.of([old, new], primary=old)
    p = Pair(keyring=sender, keyring_b=receiver)
    assert p.cb.open(p.ca.seal(Ping(1, p.a.node_id, p.b.node_id, 0), 1000), "h", 0.0, 1000) is not None


def test_a_flood_from_one_source_is_rate_limited_and_counted():
    p = Pair()
    a, b = p.a.node_id, p.b.node_id
    codec = ProbeCodec(p.kb, rate_per_s=10.0, burst=20.0)
    wall = 9_000_000
    ok = sum(codec.open(p.ca.seal(Ping(i, a, b, 0), wall), "10.0.0.9", 0.0, wall) is not None for i in range(200))
    assert ok == 20 and codec.rejected["rate_limited"] == 180
    assert codec.open(p.ca.seal(Ping(500, a, b, 0), wall), "10.0.0.8", 0.0, wall) is not None  # others unaffected
    assert codec.open(p.ca.seal(Ping(501, a, b, 0), wall), "10.0.0.9", 1.0, wall) is not None  # refilled


def test_replay_memory_is_bounded_and_never_reopens_a_forgotten_packet():
    p = Pair()
    a, b = p.a.node_id, p.b.node_id
    codec = ProbeCodec(p.kb, max_seen=8, rate_per_s=1e6, burst=1e6)
    pkts = [p.ca.seal(Ping(i, a, b, 0), 1000 + i) for i in range(20)]
    assert all(codec.open(x, "h", 0.0, 1020) is not None for x in pkts)
    assert len(codec._seen) <= 8
    assert all(codec.open(x, "h", 0.0, 1020) is None for x in pkts)  # replay or stale, never accepted twice


def test_arbitrary_bytes_never_raise_and_are_counted():
    p = Pair()
    rng = random.Random(5)
    codec = ProbeCodec(p.kb, rate_per_s=1e6, burst=1e6)
    good = p.ca.seal(Ping(1, p.a.node_id, p.b.node_id, 0), 1000)
    tried = 0
    for i in range(2000):
        if i % 2:
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 600)))
        else:  # a valid packet with bytes flipped, cut or extended
            data = bytearray(good)
            for _ in range(rng.randrange(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data[: rng.randrange(len(data) + 1)]) if i % 3 == 0 else bytes(data)
        if data == good:  # a "mutation" that changed nothing
            continue
        tried += 1
        assert codec.open(data, "h", 0.0, 1000) is None
    assert sum(codec.rejected.values()) == tried > 1900 and codec.accepted == 0


def test_a_relayed_ack_of_the_suspected_incarnation_keeps_the_accusation_until_a_refutation():
    # a suspects x (its probe failed); its next direct ping (which says "suspected") is lost, a relay's ping (which
    # does not) is acked at the same incarnation. The suspicion ends only by a refutation, so a must keep accusing
    # x in its snapshot: else x, which never heard the accusation, never refutes and is declared dead while alive.
    a = member_view("a", ["x", "r"])
    pa = Prober(a, PCFG, rng=random.Random(1))
    assert a.probe_failed("x", 0, 1.0) and a.state_of("x") is S and a.suspects() == {"x": 0}
    t = 2.0
    while True:  # run a's probes until it probes x (r answers its own)
        pings = sends(pa.tick(t), SendPing)
        if pings[0].to == "x":
            break
        pa.receive(Ack(pings[0].seq, "r", "a", 0), t + 0.1)
        t += 1.0
    ping = pings[0]
    assert ping.suspected  # lost on the way
    (req,) = sends(pa.tick(t + 0.5), SendPingReq)
    r = Prober(member_view("r", ["a", "x"]), PCFG, rng=random.Random(4))
    (rping,) = sends(r.receive(req, t + 0.55), SendPing)
    assert not rping.suspected  # the relay's ping does not say it
    x = member_view("x", ["a", "r"])
    px = Prober(x, PCFG, rng=random.Random(5))
    (xack,) = sends(px.receive(rping, t + 0.6), SendAck)
    assert xack.incarnation == 0 and x.incarnation == 0  # x has not heard of any accusation
    (relayed,) = sends(r.receive(xack, t + 0.65), SendAck)
    pa.receive(relayed, t + 0.7)
    assert a.state_of("x") is S  # a sign of life, not a refutation
    assert a.suspects() == {"x": 0}  # still accused in a's snapshot: x hears it ...
    x.observe("a", version=3, incarnation=0, leaving=False, suspects=a.suspects(), now=t + 1.0)
    assert x.incarnation == 1  # ... and refutes
    changes = a.observe("x", version=3, incarnation=x.incarnation, leaving=False, suspects={}, now=t + 1.1)
    assert [(c.node_id, c.new) for c in changes] == [("x", A)] and a.suspects() == {}


def test_a_member_back_from_an_older_incarnation_file_is_not_declared_dead_while_alive():
    # x restored its data dir from a backup: it publishes incarnation 10 while peers hold 30 (over
    # MAX_INCARNATION_STEP above: x ignores an accusation of 30 as implausible and cannot refute it). Its newer
    # signed version is its own word on its incarnation, so accusations follow it and x can refute them.
    a = Membership("a", CFG, adopt_suspicions=True)
    a.observe("x", version=100, incarnation=30, leaving=False, suspects={}, now=0.0)
    x = Membership("x", CFG, incarnation=10, adopt_suspicions=True)
    a.observe("x", version=101, incarnation=10, leaving=False, suspects={}, now=0.5)
    assert a.probe_failed("x", a.members["x"].incarnation, 1.0) and a.state_of("x") is S
    x.observe("a", version=5, incarnation=0, leaving=False, suspects=a.suspects(), now=1.1)
    assert x.incarnation == 11 and x.implausible_suspicions == 0  # refuted
    assert [(c.node_id, c.new) for c in a.observe("x", version=102, incarnation=x.incarnation, leaving=False,
                                                   suspects={}, now=1.2)] == [("x", A)]
    t, v = 1.2, 102
    while t < 60.0:  # x keeps publishing: it never dies at a
        t, v = t + 1.0, v + 1
        a.observe("x", version=v, incarnation=x.incarnation, leaving=False, suspects={}, now=t)
        assert all(c.node_id != "x" for c in a.tick(t))
    # an older version at the lower incarnation is no news (only newer versions are x's word)
    assert a.observe("x", version=50, incarnation=1, leaving=False, suspects={}, now=t) == []
    assert a.members["x"].incarnation == 11
