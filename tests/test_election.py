"""Election: ranking, one vote per term, quorum and lease rules."""

import json
import time

from p2pnode.election import Candidate, Election, Vote, quorum_size, rank_key

GIB = 1024**3
H200 = Candidate("h200", 2500, 141 * GIB)
H100 = Candidate("h100", 2000, 80 * GIB)
A100 = Candidate("a100", 624, 80 * GIB)
R4090 = Candidate("r4090", 330, 24 * GIB)
NONE = Candidate("cpu", 0, 0)
ALL = [H200, H100, A100, R4090, NONE]
IDS = {c.node_id for c in ALL}


def test_rank_power_then_vram_then_id():
    assert max(ALL, key=rank_key) is H200
    a, b = Candidate("a", 330, 24 * GIB), Candidate("b", 330, 48 * GIB)
    assert max([a, b], key=rank_key) is b
    c, d = Candidate("c", 330, 24 * GIB), Candidate("d", 330, 24 * GIB)
    assert max([c, d], key=rank_key) is d


def test_quorum_is_a_majority():
    assert [quorum_size(n) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 2, 3, 3, 4]


def elect(nodes, candidates, alive=None, votes=None, voter_set=None):
    """Run update on each node of ``nodes`` once, each seeing the others' current votes."""
    votes = dict(votes or {})
    for e in nodes.values():
        if e.vote:
            votes[e.self_id] = e.vote
    for e in nodes.values():
        others = {k: v for k, v in votes.items() if k != e.self_id}
        e.update(candidates=candidates, votes=others, voter_set=voter_set or set(nodes), alive=alive or set(nodes))
        if e.vote:
            votes[e.self_id] = e.vote
    return votes


def test_all_vote_for_the_strongest_and_it_leads():
    nodes = {c.node_id: Election(c.node_id, is_voter=True) for c in ALL}
    for _ in range(2):
        elect(nodes, ALL)
    views = {n: e.view for n, e in nodes.items()}
    assert {v.leader for v in views.values()} == {"h200"}
    assert len({v.term for v in views.values()}) == 1
    assert all(v.votes_for_leader == 5 and v.quorum == 3 for v in views.values())


def test_failover_changes_candidate_with_a_higher_term_once_per_term():
    nodes = {c.node_id: Election(c.node_id, is_voter=True) for c in ALL}
    for _ in range(2):
        elect(nodes, ALL)
    old_term = nodes["h100"].view.term
    survivors = {n: e for n, e in nodes.items() if n != "h200"}
    live = [c for c in ALL if c.node_id != "h200"]
    history = {n: [e.vote] for n, e in survivors.items()}
    for _ in range(3):
        elect(survivors, live, alive=set(survivors), voter_set=IDS)
        for n, e in survivors.items():
            history[n].append(e.vote)
    views = [e.view for e in survivors.values()]
    assert {v.leader for v in views} == {"h100"} and all(v.term > old_term for v in views)
    assert all(v.voters == 5 and v.quorum == 3 for v in views)  # the dead H200 still counts in the voter set
    for votes in history.values():  # never two different candidates in one term
        per_term = {}
        for v in votes:
            assert per_term.setdefault(v.term, v.candidate) == v.candidate


def test_minority_side_has_no_leader_and_lease_needs_alive_voters():
    nodes = {c.node_id: Election(c.node_id, is_voter=True) for c in ALL}
    for _ in range(2):
        elect(nodes, ALL)
    small = {n: nodes[n] for n in ("h200", "h100")}
    big = {n: nodes[n] for n in ("a100", "r4090", "cpu")}
    # The H200 side: its voters on the other side are no longer alive in its view -> it steps down.
    for _ in range(2):
        elect(small, [H200, H100], alive=set(small), voter_set=IDS)
        elect(big, [A100, R4090, NONE], alive=set(big), voter_set=IDS)
    assert all(e.view.leader is None for e in small.values())
    assert {e.view.leader for e in big.values()} == {"a100"}
    # Heal: one leader, the strongest, in a term above both sides' terms.
    for _ in range(3):
        elect(nodes, ALL)
    assert {e.view.leader for e in nodes.values()} == {"h200"}
    assert len({e.view.term for e in nodes.values()}) == 1


def test_non_voters_follow_but_do_not_vote_and_fencing():
    voters = {n: Election(n, is_voter=True) for n in ("a100", "r4090", "cpu")}
    follower = Election("h200", is_voter=False)
    votes = {}
    for _ in range(2):
        votes = elect(voters, ALL, alive=IDS, voter_set=set(voters))
    follower.update(candidates=ALL, votes=votes, voter_set=set(voters), alive=IDS)
    assert follower.vote is None and follower.view.leader == "h200" and follower.view.voters == 3
    t = follower.view.term
    assert follower.accepts(t) and follower.accepts(t + 1) and not follower.accepts(t - 1)


def test_min_voters_keeps_a_lone_node_from_leading():
    e = Election("solo", is_voter=True, min_voters=3)
    e.update(candidates=[Candidate("solo", 1, 0)], votes={}, voter_set={"solo"}, alive={"solo"})
    assert e.vote == Vote("solo", 1) and e.view.leader is None and e.view.quorum == 2


def test_restored_vote_is_kept():
    e = Election("a", is_voter=True, vote=Vote("b", 7))
    e.update(candidates=[Candidate("b", 10, 0), Candidate("a", 1, 0)], votes={}, voter_set={"a", "b"}, alive={"a", "b"})
    assert e.vote == Vote("b", 7)
    e.update(candidates=[Candidate("a", 1, 0)], votes={}, voter_set={"a", "b"}, alive={"a"})
    assert e.vote == Vote("a", 8)


def test_voter_set_tags_and_left():
    assert Election.voter_set({"a": (["voter"], False), "b": ([], False), "c": (["voter"], True)}) == {"a"}
    assert Election.voter_set({"a": ([], False), "b": ([], True)}) == {"a"}


# -- only voters move terms; the roll of a node starting for the first time (issue 22, findings 4 and 5) -------
def test_a_vote_from_outside_the_voter_set_moves_no_term_and_no_fence():
    voters = {n: Election(n, is_voter=True) for n in ("h200", "h100", "a100")}
    votes = {}
    for _ in range(2):
        votes = elect(voters, ALL, alive=IDS, voter_set=set(voters))
    term = voters["h200"].view.term
    stranger = {"cpu": Vote("cpu", term + 1)}  # a member not on the roll votes for itself one term up
    for e in voters.values():
        others = {k: v for k, v in votes.items() if k != e.self_id} | stranger
        e.update(candidates=ALL, votes=others, voter_set=set(voters), alive=IDS)
        assert e.view.highest_term == term and e.accepts(term) and e.view.leader == "h200" and e.outside_votes == 1
        assert e.vote == Vote("h200", term)  # and no voter moved to a new term for it
    follower = Election("r4090", is_voter=True)  # votes by default, but is not in the voter set: it only follows
    follower.update(candidates=ALL, votes=votes | stranger, voter_set=set(voters), alive=IDS)
    assert follower.vote is None and follower.view.leader == "h200" and follower.view.highest_term == term


def _core(node_id="new", *, roll=None, seeds=False, rolls=None, tags=("voter",), members=None):
    from p2pnode.election import MemberInfo
    from p2pnode.gossip import MembershipConfig
    from p2pnode.node import MemoryStore, NodeCore

    rolls = rolls if rolls is not None else {}
    members = members if members is not None else {}  # node id -> (tags, vote)
    info = {n: MemberInfo(Candidate(n, 10.0 if n == "r0" else 1.0, 0), vote, tuple(t))
            for n, (t, vote) in members.items()}
    core = NodeCore(node_id, config=MembershipConfig(), store=MemoryStore(), info=info.get,
                    roll_candidates=lambda: [(n, t, False) for n, (t, _) in members.items()], roll=roll,
                    tags=tags, expect_peers=seeds, seed_peers=seeds, roll_of=rolls.get, join_hold_s=3.0,
                    voter_bootstrap_s=60.0)
    return core


def _meet(core, members, now):
    from p2pnode.snapshot import MembershipSection

    for n in members:
        core.observe(n, 1 + int(now), MembershipSection(incarnation=1), False, now)


def test_a_new_node_adopts_its_peers_closed_roll_and_never_admits_fake_voters():
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    real = ["r0", "r1", "r2"]
    fakes = [f"fake{i}" for i in range(5)]
    closed = RollSection(voters=real, created_at=1.0, closed=True)
    members = {n: (["voter"], Vote("r0", 4)) for n in real} | {f: (["voter"], Vote("fake0", 4)) for f in fakes}
    core = _core(seeds=True, rolls={n: closed for n in real}, members=members)
    _meet(core, [*real, *fakes], 0.0)
    core.reconcile(0.0, 1000.0)  # nobody answered yet: it holds and admits nobody
    assert core.adoption == RollAdoption.WAITING and core.holding and core.view.leader is None
    assert not core.roll.members and core.roll_section(1000.0) is None
    core.seed_peers_answered(["r0", "r1", "r2"], all_answered=True)
    core.reconcile(0.5, 1000.5)
    assert core.adoption == RollAdoption.ADOPTED and core.roll.members == set(real) and core.roll.closed
    assert core.view.leader == "r0" and core.view.term == 4 and core.view.voters == 3
    assert set(fakes) <= core.roll.refused and "new" in core.roll.refused  # late voters wait for the operator
    assert core.store.roll["voters"] == real and core.store.roll["closed"]
    assert core.roll_section(1000.5) == RollSection(voters=real, created_at=1000.5, closed=True)


def test_conflicting_peer_rolls_are_not_adopted_and_no_peer_roll_opens_the_window():
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    members = {n: (["voter"], Vote("r0", 2)) for n in ("r0", "r1", "x")}
    a = RollSection(voters=["r0", "r1"], closed=True)
    b = RollSection(voters=["r0", "r1", "x"], closed=True)
    core = _core(seeds=True, rolls={"r0": a, "r1": b}, members=members)
    _meet(core, members, 0.0)
    core.seed_peers_answered(["r0", "r1"], all_answered=True)
    core.reconcile(0.0, 100.0)
    assert core.adoption == RollAdoption.CONFLICT and core.holding and core.view.leader is None
    assert core.roll_view()["conflict"] == {"r0": ["r0", "r1"], "r1": ["r0", "r1", "x"]} and not core.roll.members
    core.roll_of = {"r0": b, "r1": b}.get  # the operator made them agree (p2pnode node admit x)
    core.reconcile(1.0, 101.0)
    assert core.adoption == RollAdoption.ADOPTED and core.roll.members == {"r0", "r1", "x"}

    fresh = {n: (["voter"], None) for n in ("r0", "r1")}
    new_cluster = _core(seeds=True, rolls={"r0": RollSection(voters=["r0"], closed=False)}, members=fresh)
    _meet(new_cluster, fresh, 0.0)
    new_cluster.seed_peers_answered(["r0"], all_answered=False)
    new_cluster.reconcile(0.0, 100.0)
    assert new_cluster.adoption == RollAdoption.WAITING  # the other given peer may still answer: join_hold_s
    assert new_cluster.next_deadline(0.0, heartbeat=False) <= 3.0
    new_cluster.reconcile(3.0, 103.0)  # only a roll still in its window: a new cluster, the window opens here
    assert new_cluster.adoption == RollAdoption.BOOTSTRAP and new_cluster.roll.members == {"new", "r0", "r1"}

    first = _core(seeds=False, members=fresh)  # no peers given: the first node of a cluster
    _meet(first, fresh, 0.0)
    first.reconcile(0.0, 100.0)  # it watches the members it found for join_hold_s first (issue 37)
    assert first.adoption == RollAdoption.WATCHING and first.holding and not first.roll.members
    first.reconcile(3.0, 103.0)  # none of them shows a term: a new cluster, its window opens
    assert first.adoption == RollAdoption.BOOTSTRAP and first.roll.members == {"new", "r0", "r1"}

    itself = _core(seeds=True, members={})  # the only address given is its own
    itself.seed_peers_answered([], all_answered=True)
    itself.reconcile(0.0, 100.0)
    assert itself.adoption == RollAdoption.BOOTSTRAP
    itself.reconcile(3.0, 103.0)  # the join hold (expect_peers) as before
    assert itself.view.leader == "new" and itself.roll.members == {"new"}


def test_an_unusable_vote_or_roll_file_never_stops_the_node(tmp_path):
    from p2pnode.node import RollAdoption
    from p2pnode.node._persist import load_roll, load_vote
    from p2pnode.statefiles import report_for

    def roll(text):
        (tmp_path / "voters.json").write_text(text)
        return load_roll(tmp_path / "voters.json", trusted=False, bootstrap_s=60.0)

    def vote(text):
        (tmp_path / "vote.json").write_text(text)
        return load_vote(tmp_path / "vote.json")

    assert load_roll(tmp_path / "voters.json", trusted=False, bootstrap_s=60.0) is None  # missing
    for bad in ('{"voters": "x"}', "garbage", "[1]", '{"voters": ["a", "b\\u0000c"]}', '{"voters": ["a", 12]}'):
        assert roll(bad) is None, bad  # unusable: the node adopts its peers' roll as a new node would
    ok = roll('{"voters": ["a", "b"], "removed": ["c", "\\u00b2\\n", 5], "created_at": 1e400, "closed": false}')
    assert ok.members == {"a", "b"} and ok.removed == {"c"} and ok.closed  # a bad created_at reads as closed
    ok = roll('{"voters": ["a"], "created_at": 5.0}')
    assert ok.members == {"a"} and ok.created_at == 5.0 and not ok.closed
    assert vote('{"candidate": "a", "term": 3}') == Vote("a", 3)
    for bad in ('{"candidate": "a", "term": "\\u00b2"}', '{"candidate": "a", "term": 1e400}',
                '{"candidate": "a", "term": ' + "9" * 400 + "}", '{"candidate": "a\\nb", "term": 1}', "[]"):
        assert vote(bad) is None, bad
    counts = report_for(tmp_path).view()
    assert counts["voters.json"]["malformed"] >= 3 and counts["voters.json"]["bad_entry"] >= 3  # same drops once
    assert counts["vote.json"]["malformed"] >= 3
    core = _core(seeds=True, roll=roll("garbage"))
    assert core.adoption == RollAdoption.WAITING


async def test_the_agent_ties_its_join_address_to_a_member_and_adopts_its_roll(tmp_path):
    """The agent's wiring: the member behind a ``--join`` address (tied to it once it answered with its signed
    snapshot) publishes a closed roll; fake members tagged ``voter`` that reached the new node first are refused."""
    from helpers import envelope

    from p2pnode.agent import Agent
    from p2pnode.config import load_config
    from p2pnode.identity import Identity
    from p2pnode.wire import encode_gossip

    a = Agent(load_config(None, env={}, overrides={"agent": {"data_dir": tmp_path, "port": 0, "join": ["127.0.0.1:9"]},
                                                  "election": {"voter_bootstrap_s": 600.0}}))
    a.sample()
    a.publish()
    real = [Identity.generate() for _ in range(3)]
    fakes = [Identity.generate() for _ in range(5)]
    roll = {"voters": sorted(r.node_id for r in real), "created_at": 1.0, "closed": True}

    def push(ident, **extra):
        a.gossiper.handle(encode_gossip(ident.node_id, "", {}, [envelope(ident, 1, **extra)]), now=a.now())

    for f in fakes:
        push(f, tags=["voter"], vote={"candidate": fakes[0].node_id, "term": 3})
    for r in real:
        push(r, tags=["voter"], vote={"candidate": real[0].node_id, "term": 3}, roll=roll)
    a.reconcile()
    assert a.core.holding and a.core.view.leader is None and not a.core.roll.members  # no join peer known yet
    a.gossip.add_seeds(tmp_path)
    a.reconcile()
    assert a.core.holding and a.core.view.leader is None and not a.core.roll.members  # the join peer is silent
    a.peers.report("127.0.0.1:9", True, a.now(), node_id=real[1].node_id)  # it answered, as real[1]
    a.reconcile()
    assert a.core.adoption == "adopted" and a.core.roll.members == {r.node_id for r in real}
    assert {f.node_id for f in fakes} <= a.core.roll.refused and a.core.view.leader == real[0].node_id
    assert a.build_snapshot(99).roll.closed and (tmp_path / "voters.json").exists()


# -- leader eligibility (issue 25): an ephemeral box does not lead while an eligible node is alive ----------------

def test_eligibility_follows_the_ephemeral_tag_unless_the_operator_marked_the_node():
    from p2pnode.election import is_eligible

    assert is_eligible("a", ("durable",)) and is_eligible("a", ())
    assert not is_eligible("a", ("ephemeral", "voter"))
    assert is_eligible("a", ("ephemeral",), eligible={"a"})
    assert not is_eligible("a", ("durable",), ineligible={"a"})
    assert not is_eligible("a", (), eligible={"a"}, ineligible={"a"})  # a mark that stops leading wins


def test_voters_prefer_an_eligible_candidate_and_fall_back_to_the_strongest():
    spot = Candidate("spot", 2640, 192 * GIB)  # 8 x RTX 4090: outranks the H200 on power
    nodes = {n: Election(n, is_voter=True) for n in ("spot", "h200", "a100")}
    cands = [spot, H200, A100]
    votes: dict = {}
    for _ in range(2):
        for e in nodes.values():
            e.update(candidates=cands, votes={k: v for k, v in votes.items() if k != e.self_id},
                     voter_set=set(nodes), alive=set(nodes), eligible={"h200", "a100"})
            votes[e.self_id] = e.vote
    assert {e.view.leader for e in nodes.values()} == {"h200"}
    lone = Election("spot", is_voter=True)  # nobody eligible in sight: the strongest leads
    lone.update(candidates=[spot, R4090], votes={}, voter_set={"spot"}, alive={"spot"}, eligible=set())
    assert lone.vote.candidate == "spot"


def _spot_cluster(**kw):
    from p2pnode.sim import ClusterSim

    # n0: ephemeral 8 x RTX 4090 (2,640), n1: durable H200 (2,500), n2: durable A100 (624); all three vote.
    return ClusterSim(3, powers=[2640.0, 2500.0, 624.0], voters=[0, 1, 2],
                      tags={0: ("ephemeral",), 1: ("durable",), 2: ("durable",)}, seed=3, **kw)


def _settle(c, until):
    c.run_until(until)
    return c.agreed_leader([i for i in range(c.n) if c.running[i]])


def test_three_voters_the_h200_leads_and_after_it_the_a100_not_the_spot_box():
    for open_rolls in (False, True):
        c = _spot_cluster(open_rolls=open_rolls)
        assert _settle(c, 10.0) == c.ids[1]  # H200, not the stronger spot box
        c.kill(1)
        assert _settle(c, 60.0) == c.ids[2]  # the A100 (624) before the spot box (2,640)
        assert all(len(v) == 1 for v in c.counters.leaders_per_term.values())


def test_an_ephemeral_node_leads_when_the_only_eligible_node_dies():
    from p2pnode.sim import ClusterSim

    # Voters n0-n2 are all ephemeral; n3, a durable A100, is not a voter and the only eligible node.
    c = ClusterSim(4, powers=[330.0, 2640.0, 51.0, 624.0], voters=[0, 1, 2],
                   tags={0: ("ephemeral",), 1: ("ephemeral",), 2: ("ephemeral",), 3: ("durable",)}, seed=5)
    assert _settle(c, 10.0) == c.ids[3]  # a non-voter may lead: the voters elect it
    c.kill(3)
    assert _settle(c, 60.0) == c.ids[1]  # then the strongest ephemeral one, not nobody


def test_a_mark_set_on_one_voter_reaches_every_voter_and_moves_leadership():
    c = _spot_cluster(open_rolls=True)
    assert _settle(c, 10.0) == c.ids[1]
    assert c.cores[2].change_eligibility(c.ids[1], "ineligible", c.now)  # the H200 should not lead: told to n2 only
    assert _settle(c, 30.0) == c.ids[2]
    assert all(core.roll.ineligible == {c.ids[1]} for core in c.cores)  # merged from n2's roll by n0 and n1
    assert c.cores[0].change_eligibility(c.ids[0], "eligible", c.now)  # the spot box may after all: told to n0
    stamp = c.cores[0].roll.marks[c.ids[0]].stamp
    assert c.cores[0].change_eligibility(c.ids[0], "eligible", c.now)  # again: stamped anew (the latest word)
    assert c.cores[0].roll.marks[c.ids[0]].stamp > stamp
    assert _settle(c, 50.0) == c.ids[0]
    assert all(core.roll.eligible == {c.ids[0]} and core.roll.ineligible == {c.ids[1]} for core in c.cores)
    assert c.cores[1].change_eligibility(c.ids[1], "cleared", c.now)  # unmark both: tags decide again
    assert c.cores[2].change_eligibility(c.ids[0], "cleared", c.now)
    assert _settle(c, 70.0) == c.ids[1]
    assert all(not core.roll.ineligible and not core.roll.eligible for core in c.cores)
    roll = c.cores[0].roll_section(70.0)
    assert [(m.node, m.state) for m in roll.marks] == sorted([(c.ids[0], "cleared"), (c.ids[1], "cleared")])
    assert [m["node"] for m in c.cores[2].store.roll["marks"]] == sorted([c.ids[0], c.ids[1]])  # persisted
    assert all(len(v) == 1 for v in c.counters.leaders_per_term.values())


def test_a_voter_down_when_the_mark_was_set_takes_it_when_back():
    c = _spot_cluster(open_rolls=True)
    assert _settle(c, 10.0) == c.ids[1]
    c.kill(2)  # the A100 is down while the operator marks the H200
    for i in (0, 1):
        assert c.cores[i].change_eligibility(c.ids[1], "ineligible", c.now)
    assert _settle(c, 40.0) == c.ids[0]  # no eligible node alive: the strongest, the spot box
    c.restart(2)  # back with its roll of before: no mark
    assert c.cores[2].roll.ineligible == set()
    assert _settle(c, 80.0) == c.ids[2]  # it took the mark from the voters; the A100 is eligible again
    assert all(core.roll.wire_marks() == c.cores[0].roll.wire_marks() for core in c.cores)
    assert all(len(v) == 1 for v in c.counters.leaders_per_term.values())


def test_marks_travel_with_the_roll_a_new_node_adopts_and_in_voters_json():
    from p2pnode.election import VoterRoll
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import EligibilityMark, RollSection

    real = ["r0", "r1"]
    marks = [EligibilityMark("r0", "ineligible", 5000), EligibilityMark("r1", "eligible", 4000)]
    older = [EligibilityMark("r0", "eligible", 1000)]  # r1 missed the newer mark on r0
    rolls = {"r0": RollSection(voters=real, created_at=1.0, closed=True, marks=marks),
             "r1": RollSection(voters=real, created_at=1.0, closed=True, marks=older),
             # a seed that is no voter publishes the same roll with marks of its own: not taken
             "s9": RollSection(voters=real, created_at=1.0, closed=True, marks=[EligibilityMark("r0", "eligible",
                                                                                               99_000)])}
    members = {"r0": (["voter"], Vote("r0", 3)), "r1": (["voter", "ephemeral"], Vote("r0", 3))}
    members["s9"] = (["durable"], None)
    core = _core(seeds=True, rolls=rolls, members=members)
    _meet(core, [*real, "s9"], 0.0)
    core.seed_peers_answered([*real, "s9"], all_answered=True)
    core.reconcile(0.0, 100.0)
    assert core.adoption == RollAdoption.ADOPTED
    assert core.roll.eligible == {"r1"} and core.roll.ineligible == {"r0"}  # the newer mark on r0 won
    back = VoterRoll.from_wire(core.roll.to_wire(), trusted=False)
    assert back.eligible == {"r1"} and back.ineligible == {"r0"} and back.members == set(real)
    old = VoterRoll.from_wire({"voters": real, "closed": True}, trusted=False)  # a voters.json from before
    assert old.marks == {} and old.eligible == set()
    import json
    import tempfile
    from pathlib import Path

    from p2pnode.node._persist import load_roll  # voters.json read back at start keeps the marks

    path = Path(tempfile.mkdtemp()) / "voters.json"
    doc = core.roll.to_wire()
    doc["marks"].append({"node": "x\u0007", "state": "eligible", "stamp": 1})  # a bad entry is dropped alone
    doc["marks"].append({"node": "r2", "state": "leader", "stamp": 1})
    path.write_text(json.dumps(doc))
    loaded = load_roll(path, trusted=False, bootstrap_s=60.0)
    assert loaded.eligible == {"r1"} and loaded.ineligible == {"r0"} and len(loaded.marks) == 2
    import pytest

    with pytest.raises(ValueError, match="voter roll"):
        VoterRoll.from_wire({"voters": real, "marks": [{"node": "x" * 65, "state": "eligible", "stamp": 1}]},
                            trusted=False)
    with pytest.raises(ValueError, match="voter roll"):
        VoterRoll.from_wire({"voters": real, "marks": [{"node": "a", "state": "eligible", "stamp": 1}] * 65},
                            trusted=False)


def test_a_late_token_mode_node_takes_the_marks_of_every_member():
    from p2pnode.election import MemberInfo
    from p2pnode.gossip import MembershipConfig
    from p2pnode.node import MemoryStore, NodeCore
    from p2pnode.snapshot import EligibilityMark, RollSection

    # Token mode, no member tagged voter: every endorsed member votes, so every member's marks count.
    members = ["m0", "m1"]
    rolls = {"m0": RollSection(marks=[EligibilityMark("m1", "ineligible", 2000)]), "m1": None}
    info = {n: MemberInfo(Candidate(n, 10.0 if n == "m1" else 1.0, 0), None, ()) for n in members}
    core = NodeCore("new", config=MembershipConfig(), store=MemoryStore(), info=info.get,
                    roll_candidates=lambda: [(n, (), False) for n in members], trusted=True, roll_of=rolls.get,
                    join_hold_s=0.0)
    _meet(core, members, 0.0)
    core.reconcile(0.0, 100.0)
    assert core.roll.ineligible == {"m1"} and core.store.roll["marks"][0]["node"] == "m1"
    core.reconcile(0.5, 100.5)
    assert core.election.vote.candidate == "m0"  # the strongest eligible: never m1
    assert core.roll_section(100.5).marks == [EligibilityMark("m1", "ineligible", 2000)]  # passed on

    # Members claim the voter tag: only the voters the roll admits are sources, never another member.
    tagged = {"v0": ("voter",), "x1": ()}
    rolls2 = {"v0": RollSection(voters=["v0"], marks=[EligibilityMark("x1", "eligible", 3000)]),
              "x1": RollSection(marks=[EligibilityMark("v0", "ineligible", 9000)])}
    info2 = {n: MemberInfo(Candidate(n, 1.0, 0), None, t) for n, t in tagged.items()}
    core2 = NodeCore("new", config=MembershipConfig(), store=MemoryStore(), info=info2.get,
                     roll_candidates=lambda: [(n, t, False) for n, t in tagged.items()], trusted=True,
                     roll_of=rolls2.get, join_hold_s=0.0)
    _meet(core2, list(tagged), 0.0)
    core2.reconcile(0.0, 100.0)
    assert core2.roll.members == {"v0"} and set(core2.roll.marks) == {"x1"}  # x1's own marks: not a voter's


def test_marks_merge_in_any_order_to_the_same_newest_64():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from p2pnode.election import VoterRoll
    from p2pnode.snapshot import MARKS_MAX, EligibilityMark

    mark = st.builds(EligibilityMark, st.sampled_from([f"n{i}" for i in range(90)]),
                     st.sampled_from(["eligible", "ineligible", "cleared"]), st.integers(0, 200))

    @settings(max_examples=150, deadline=None)
    @given(st.lists(mark, max_size=160), st.randoms(use_true_random=False))
    def check(marks, rnd):
        one = VoterRoll(trusted=False)
        one.merge(marks, wall=1000.0)
        shuffled = list(marks)
        rnd.shuffle(shuffled)
        cut = rnd.randrange(len(shuffled) + 1)
        a, b = VoterRoll(trusted=False), VoterRoll(trusted=False)  # two members, each hearing half, then each other
        a.merge(shuffled[:cut], wall=1000.0)
        b.merge(shuffled[cut:], wall=1000.0)
        a.merge(b.wire_marks(), wall=1000.0)
        b.merge(a.wire_marks(), wall=1000.0)
        assert a.marks == b.marks == one.marks
        assert not one.merge(marks, wall=1000.0)  # idempotent
        assert len(one.marks) <= MARKS_MAX
        for n, m in one.marks.items():  # the newest mark per node, the newest nodes kept
            assert m == max((x for x in marks if x.node == n), key=lambda x: (x.stamp, x.state))

    check()


def test_marks_are_bounded_and_a_future_stamp_is_ignored():
    from p2pnode.snapshot import MARKS_MAX, EligibilityMark

    core = _core(members={})
    core.reconcile(0.0, 90.0)
    core.reconcile(3.0, 93.0)  # alone past join_hold_s: its own roll (issue 37: a fresh node watches first)
    for i in range(MARKS_MAX):
        assert core.change_eligibility(f"n{i}", "eligible", 100.0 + i) and core.roll.forgotten == []
    assert core.change_eligibility("n5", "ineligible", 200.0)  # moving a mark is not a new one
    assert core.roll.forgotten == [] and len(core.roll.marks) == MARKS_MAX
    assert not core.change_eligibility("extra", "cleared", 200.0)  # nothing held to clear: no room taken
    assert core.change_eligibility("extra", "ineligible", 201.0)  # the oldest mark is forgotten
    assert [m.node for m in core.roll.forgotten] == ["n0"] and "n0" not in core.roll.marks
    assert len(core.roll.marks) == MARKS_MAX and "extra" in core.roll.ineligible
    assert core.roll.marks["extra"].stamp > core.roll.marks["n5"].stamp  # above every stamp held
    assert len(core.roll_section(201.0).marks) == MARKS_MAX
    roll = core.roll
    far = EligibilityMark("n7", "ineligible", int((300.0 + 601.0) * 1000))  # 601 s ahead of this clock
    assert not roll.merge([far], wall=300.0) and roll.marks_ignored == 1 and "n7" in roll.eligible
    assert roll.merge([far], wall=302.0) and "n7" in roll.ineligible  # the clock caught up
    assert core.roll_view()["marks_ignored"] == 1
    # A clock that ran ahead and was set right: what it stamped ahead is forgotten, not kept outranking the rest.
    assert core.change_eligibility("n9", "ineligible", 5000.0) and "n9" in roll.ineligible
    assert core.change_eligibility("n8", "eligible", 303.0)  # the clock set right: n9's mark is from the future
    assert "n9" not in roll.marks and roll.marks["n8"].stamp < 5000 * 1000
    # Re-marking keeps a mark among the newest 64: the oldest other one is forgotten first.
    oldest = min(roll.marks.values(), key=lambda m: m.stamp).node
    assert core.change_eligibility(oldest, roll.marks[oldest].state, 304.0)
    assert roll.marks[oldest].stamp == max(m.stamp for m in roll.marks.values())


def _mdns_only(real_rolls, *, fakes=10, pinned=False):
    """A fresh node with no operator-given peer (mDNS finds only) in front of a cluster of three voters with a
    leader (term 4) and ``fakes`` members tagged voter (no term, or one of their own). ``pinned``: the fakes'
    voter tags do not count (what the role gate leaves of them where operator keys are pinned: no certificate)."""
    real = ["r0", "r1", "r2"]
    members = {n: (["voter"], Vote("r0", 4)) for n in real}
    members |= {f"fake{i}": ([] if pinned else ["voter"], None) for i in range(fakes)}
    core = _core(seeds=False, rolls=real_rolls, members=members)
    return core, members, real


def test_a_fresh_node_found_by_mdns_adopts_the_certified_vouched_roll_and_never_opens_its_window():
    """Issue 37, attack 2, operator keys pinned: without --join the node used to open its own bootstrap window
    and admit every member tagged voter, fakes included. Now it adopts the closed roll a quorum of that roll's own
    certified voters publishes; fakes (their voter tags not certified) never get on it."""
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    closed = RollSection(voters=["r0", "r1", "r2"], created_at=1.0, closed=True)
    core, members, real = _mdns_only({n: closed for n in ("r0", "r1", "r2")}, pinned=True)
    core.pinned = True
    _meet(core, members, 0.0)
    for t in (0.0, 1.0, 2.0):
        core.reconcile(t, 1000.0 + t)
        assert core.adoption == RollAdoption.ADOPTED
        assert not any(f.startswith("fake") for f in core.roll.members)
    assert core.roll.members == set(real) and core.roll.closed
    core.reconcile(3.5, 1003.5)
    assert core.view.leader == "r0" and core.view.term == 4 and core.view.voters == 3
    assert core.roll_view()["adoption"] == RollAdoption.ADOPTED


def test_open_mode_a_fresh_node_found_by_mdns_adopts_nothing_and_follows_the_one_vouched_roll():
    """Open mode (review of issue 37): a found roll is never adopted, since any member may claim the voter tag.
    After join_hold_s the node follows, as a non-voter, the leader of the one closed roll a quorum of its voters
    publishes: no roll kept or published, no vote, never its own window."""
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    closed = RollSection(voters=["r0", "r1", "r2"], created_at=1.0, closed=True)
    core, members, _real = _mdns_only({n: closed for n in ("r0", "r1", "r2")})
    _meet(core, members, 0.0)
    for t in (0.0, 1.0, 2.0):
        core.reconcile(t, 1000.0 + t)
        assert core.adoption == RollAdoption.WATCHING and core.holding and core.view.leader is None
    for t in (3.0, 4.0, 200.0):
        _meet(core, members, t)
        core.reconcile(t, 1000.0 + t)
        assert core.adoption == RollAdoption.FOLLOWING and not core.holding
        assert core.view.leader == "r0" and core.view.term == 4 and core.view.voters == 3
        assert not core.roll.members and core.election.vote is None and core.roll_section(1000.0 + t) is None
        assert core.store.roll is None and core.roll_view()["following"] == ["r0", "r1", "r2"]
    gone = _core(seeds=False, rolls={}, members={})  # a follower cut off from the cluster: never its own window
    gone.adoption, gone._followed = RollAdoption.FOLLOWING, frozenset({"r0", "r1", "r2"})
    gone.reconcile(10.0, 1010.0)
    assert gone.adoption == RollAdoption.FOLLOWING and gone.view.leader is None and gone.holding
    assert not gone.roll.members and gone.roll_view()["following"] == []
    # The operator acts on this node (p2pnode node admit): the roll it follows is adopted, with the admission.
    assert core.change_voter("new", admit=True, wall=1201.0)
    assert core.adoption == RollAdoption.ADOPTED and core.roll.members == {"r0", "r1", "r2", "new"}
    assert core.roll.closed and core.store.roll["voters"] == ["new", "r0", "r1", "r2"]


def test_open_mode_an_untagged_cluster_is_established_too_a_found_node_follows_it_never_a_fake():
    """Open mode with no member tagged ``voter`` (the default: every member votes): three untagged voters at term 4
    with a closed roll, ten untagged fakes voting in term 1. A fresh node found by mDNS sees an established cluster
    (every member counts, as the roll does where none is tagged), so it never opens its own window (which would put
    the fakes on its roll and follow one of them): it follows r0 as a non-voter, from join_hold_s on."""
    from p2pnode.election import Vote
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    real = ["r0", "r1", "r2"]
    closed = RollSection(voters=real, created_at=1.0, closed=True)
    members = {n: ([], Vote("r0", 4)) for n in real} | {f"fake{i}": ([], Vote("fake0", 1)) for i in range(10)}
    core = _core(seeds=False, rolls={n: closed for n in real}, members=members, tags=())
    for t in (0.0, 1.0, 2.0, 3.0, 4.0, 70.0, 200.0):
        _meet(core, members, t)
        core.reconcile(t, 1000.0 + t)
        assert core.adoption in (RollAdoption.WATCHING, RollAdoption.FOLLOWING), (t, core.adoption)
        assert not core.roll.members and core.view.leader in (None, "r0")
    assert core.adoption == RollAdoption.FOLLOWING and core.view.leader == "r0" and core.view.term == 4


def test_open_mode_fakes_publishing_a_closed_roll_of_themselves_never_get_on_a_found_nodes_roll():
    """The fake-roll variant: ten fakes tagged voter publish a closed roll of themselves and vote in it (term 1),
    more publishers than the real cluster's three. The fresh node found by mDNS adopts neither roll, follows no
    leader (two vouched rolls: it cannot tell which is real; ``conflict`` names both) and casts no vote; given
    seeds (a restart with --join) it adopts the real roll."""
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    fakes = [f"fake{i}" for i in range(10)]
    real_roll = RollSection(voters=["r0", "r1", "r2"], created_at=1.0, closed=True)
    fake_roll = RollSection(voters=fakes, created_at=1.0, closed=True)
    rolls = {n: real_roll for n in ("r0", "r1", "r2")} | {f: fake_roll for f in fakes}
    core, members, _real = _mdns_only(rolls)
    members |= {f: (["voter"], Vote("fake0", 1)) for f in fakes}
    core = _core(seeds=False, rolls=rolls, members=members)
    _meet(core, members, 0.0)
    for t in (0.0, 2.0, 3.0, 10.0, 500.0):
        _meet(core, members, t)
        core.reconcile(t, 1000.0 + t)
        assert core.adoption in (RollAdoption.WATCHING, RollAdoption.FOLLOWING) and core.holding
        assert not core.roll.members and core.view.leader is None and core.election.vote is None
        assert core.roll_section(1000.0 + t) is None and core.store.roll is None
    view = core.roll_view()
    assert view["following"] == [] and sorted(map(sorted, view["conflict"].values())) == [sorted(fakes),
                                                                                            ["r0", "r1", "r2"]]
    assert not core.change_voter("new", admit=True, wall=1501.0) and not core.roll.members  # no roll to change
    seeded = _core(seeds=True, rolls=rolls, members=members)  # restarted with --join r0
    _meet(seeded, members, 0.0)
    seeded.seed_peers_answered(["r0"], all_answered=True)
    seeded.reconcile(0.0, 1000.0)
    seeded.reconcile(1.0, 1001.0)
    assert seeded.adoption == RollAdoption.ADOPTED and seeded.roll.members == {"r0", "r1", "r2"}
    assert seeded.view.leader == "r0" and seeded.view.term == 4


def test_an_uncertified_member_showing_a_term_keeps_no_fresh_node_waiting():
    """Review of issue 37: with an operator key pinned, one fake showing term 1 and a closed roll of itself, its
    voter tag not certified, used to keep every fresh node found by mDNS watching for ever. Only members whose
    counted tags include voter are an established cluster: the node opens its own window."""
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    members = {"fake0": (["lead=uncertified"], Vote("fake0", 1))}  # what the role gate leaves of its tags
    core = _core(seeds=False, rolls={"fake0": RollSection(voters=["fake0"], closed=True)}, members=members)
    core.pinned = True
    _meet(core, members, 0.0)
    core.reconcile(0.0, 1000.0)
    core.reconcile(3.0, 1003.0)
    assert core.adoption == RollAdoption.BOOTSTRAP and core.roll.members == {"new"}
    assert core.view.leader == "new"


def test_a_fresh_node_that_sees_a_term_but_no_vouched_roll_stays_a_non_voter():
    """Members with a term but no closed roll a quorum of its voters publishes (one member's roll of fakes, or
    terms only): the node counts no roll, casts no vote and sees no leader; it never opens its own window."""
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    fake_roll = RollSection(voters=[f"fake{i}" for i in range(10)] + ["r0"], closed=True)
    core, members, _real = _mdns_only({"fake0": fake_roll, "fake1": fake_roll})
    _meet(core, members, 0.0)
    for t in (0.0, 3.0, 10.0, 200.0):
        core.reconcile(t, 1000.0 + t)
        assert core.adoption in (RollAdoption.WATCHING, RollAdoption.FOLLOWING) and core.holding
        assert not core.roll.members and core.view.leader is None and core.election.vote is None
        assert core.roll_section(1000.0 + t) is None


def test_a_node_whose_own_window_is_open_yields_to_a_certified_cluster_it_meets_late():
    """mDNS found nobody within join_hold_s (a slow network): the window opened. With operator keys pinned, when
    an existing cluster's certified vouched closed roll appears while that window is still open, the node takes
    it. In open mode it keeps its own roll (a found roll is never adopted): --join joins that cluster."""
    from p2pnode.election import MemberInfo
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    real = ["r0", "r1", "r2"]
    closed = RollSection(voters=real, created_at=1.0, closed=True)
    for pinned in (True, False):
        members: dict = {}
        rolls: dict = {}
        core = _core(seeds=False, rolls=rolls, members=members)
        core.pinned = pinned
        core.info = lambda n, members=members: (MemberInfo(Candidate(n, 10.0 if n == "r0" else 1.0, 0),
                                                           members[n][1], tuple(members[n][0]))
                                                if n in members else None)
        core.reconcile(0.0, 1000.0)
        core.reconcile(3.0, 1003.0)
        assert core.adoption == RollAdoption.BOOTSTRAP and core.roll.members == {"new"}
        members |= {"fake0": ([] if pinned else ["voter"], None)}
        _meet(core, members, 4.0)
        core.reconcile(4.0, 1004.0)
        assert ("fake0" in core.roll.members) != pinned  # open window, open mode: what the window admits
        members |= {n: (["voter"], Vote("r0", 4)) for n in real}
        rolls |= {n: closed for n in real}
        _meet(core, members, 5.0)
        core.reconcile(5.0, 1005.0)
        if pinned:
            assert core.adoption == RollAdoption.ADOPTED and core.roll.members == set(real) and core.roll.closed
            core.reconcile(6.0, 1006.0)
            assert core.view.leader == "r0" and core.view.term == 4
        else:
            assert core.adoption == RollAdoption.BOOTSTRAP and "new" in core.roll.members  # its own window's


def test_a_fresh_node_joins_a_cluster_still_forming_by_its_own_window():
    """Nodes started together: the others (given this one's address) opened their windows and voted before this
    node's watch ended. Their rolls are still open: a cluster forming, not an established one, so its own window
    opens and it counts them (found in tests/test_operator.py: it used to wait out their 120 s windows)."""
    from p2pnode.node import RollAdoption
    from p2pnode.snapshot import RollSection

    forming = RollSection(voters=["new", "r0", "r1"], created_at=100.0, closed=False)
    members = {n: ([], Vote("new", 1)) for n in ("r0", "r1")}
    core = _core(seeds=False, rolls={"r0": forming, "r1": forming}, members=members, tags=())
    _meet(core, members, 0.0)
    core.reconcile(0.0, 100.0)
    assert core.adoption == RollAdoption.WATCHING
    core.reconcile(3.0, 103.0)
    assert core.adoption == RollAdoption.BOOTSTRAP and core.roll.members == {"new", "r0", "r1"}
    assert core.view.leader == "new"


def test_a_member_gone_soon_is_no_candidate_while_another_is():
    """A member whose snapshot carries a notice (an interruption notice, or a clean stop under way:
    ``MemberInfo.leaving_soon``) is not voted for while any other member can lead; alone, it still leads."""
    from p2pnode.election import MemberInfo, election_inputs
    from p2pnode.gossip import Membership

    m = Membership("me")
    for n in ("h200", "a100"):
        m.observe(n, version=1, incarnation=1, leaving=False, suspects={}, now=0.0)
    strong = {"h200": MemberInfo(Candidate("h200", 2500.0, 0), None, ("voter",), leaving_soon=True),
              "a100": MemberInfo(Candidate("a100", 624.0, 0), None, ("voter",))}
    me = MemberInfo(Candidate("me", 1.0, 0), None, ("voter",))
    inputs = election_inputs(m, self_info=me, self_left=False, info=strong.get)
    assert {c.node_id for c in inputs["candidates"]} == {"me", "a100"} and "h200" not in inputs["eligible"]
    e = Election("me", is_voter=True)
    e.update(**inputs)
    assert e.vote.candidate == "a100"
    going = MemberInfo(Candidate("me", 1.0, 0), None, ("voter",), leaving_soon=True)
    alone = election_inputs(Membership("me"), self_info=going, self_left=False, info=strong.get)
    assert [c.node_id for c in alone["candidates"]] == ["me"]  # nobody else: it still leads
    everyone = {n: MemberInfo(Candidate(n, 1.0, 0), None, (), leaving_soon=True) for n in ("h200", "a100")}
    inputs = election_inputs(m, self_info=going, self_left=False, info=everyone.get)
    assert len(inputs["candidates"]) == 3  # all gone soon: as before


async def test_a_node_with_a_probe_notice_votes_as_its_peers_see_it_so_two_voters_elect_a_leader(tmp_path):
    """Review H1 (issue 41): a node's own ``leaving_soon`` is the predicate its peers read from its snapshot (a
    notice in its ``jobs`` section), its probe's notice included, not only a clean stop: an H200 with a probe notice
    votes for the A100 as the A100 does, so two voters elect a leader (before: each voted for itself, no leader for
    the notice's whole window)."""
    from helpers import envelope

    from p2pnode.agent import Agent
    from p2pnode.config import load_config
    from p2pnode.identity import Identity
    from p2pnode.wire import encode_gossip

    (tmp_path / "catalog.toml").write_text('[[job]]\nname = "t"\nkind = "selfplay"\nconfig = "c"\nargv = ["true"]\n')
    cfg = load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0, "tags": ["voter"], "fake_gpus": "1xH200",
                  "catalog": str(tmp_path / "catalog.toml"), "interruption_probe": "true"},
        "discovery": {"mdns": False}})
    b = Identity.generate()
    a_id = Agent(cfg).node_id  # its key, then the roll of the two voters it kept
    roll = {"voters": sorted([a_id, b.node_id]), "created_at": 1.0, "closed": True}
    (tmp_path / "d" / "voters.json").write_text(json.dumps(roll))
    a = Agent(cfg)
    a100 = {"name": "NVIDIA A100-SXM4-80GB", "mem_total_bytes": 80 * GIB}
    version = 0

    def push_b(term, candidate):
        nonlocal version
        version += 1
        a.gossiper.handle(encode_gossip(b.node_id, "", {}, [envelope(
            b, version, tags=["voter"], vote={"candidate": candidate, "term": term},
            resources={"cpu_percent": 1.0, "gpus": [a100]})]), now=a.now())

    a.sample()
    a.publish()
    push_b(1, b.node_id)
    a.reconcile()
    a.reconcile()
    assert a.core.view.leader is None or a.core.view.leader == a.node_id  # the H200 is the stronger
    notice = a.jobs.stops.notices.core
    assert notice.probed(b'{"notice": true, "deadline_s": 600, "reason": "spot"}', a.now(), time.time())
    a.publish()
    assert a.build_snapshot(10**6).jobs.notice_deadline_ms is not None  # what B reads: A is gone soon
    push_b(2, b.node_id)  # B excludes A and votes for itself above A's term
    for _ in range(3):
        a.reconcile()
        push_b(max(2, a.core.election.highest_term), b.node_id)
    assert a.core.election.vote.candidate == b.node_id
    assert a.core.view.leader == b.node_id


def test_a_member_gone_soon_still_outranks_an_ineligible_one():
    """Review M3: the "gone soon" filter keeps eligibility first: an eligible H200 with a notice still leads before
    an A100 tagged ``voter`` and ``ephemeral`` (ineligible; before: the filter dropped the H200, eligibility emptied
    and the A100 led); beside an eligible member that stays, the H200 is dropped; with nobody eligible, any member
    that stays leads first."""
    from p2pnode.election import MemberInfo, election_inputs
    from p2pnode.gossip import Membership

    def vote(infos, me_info):
        m = Membership(me_info.candidate.node_id)
        for n in infos:
            m.observe(n, version=1, incarnation=1, leaving=False, suspects={}, now=0.0)
        e = Election(me_info.candidate.node_id, is_voter=True)
        e.update(**election_inputs(m, self_info=me_info, self_left=False, info=infos.get))
        return e.vote.candidate

    h200 = MemberInfo(Candidate("h200", 2500.0, 0), None, ("voter",), leaving_soon=True)
    spot = MemberInfo(Candidate("a100", 624.0, 0), None, ("voter", "ephemeral"))
    assert vote({"h200": h200}, spot) == "h200"
    assert vote({"a100": spot}, h200) == "h200"  # the H200 itself, as its peer
    durable = MemberInfo(Candidate("l40", 362.0, 0), None, ("voter",))
    assert vote({"h200": h200, "l40": durable}, spot) == "l40"
    spot_h200 = MemberInfo(Candidate("h200", 2500.0, 0), None, ("voter", "ephemeral"), leaving_soon=True)
    assert vote({"h200": spot_h200}, spot) == "a100"  # nobody eligible: the one that stays
