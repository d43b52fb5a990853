"""Election: ranking, one vote per term, quorum and lease rules."""

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
    first.reconcile(0.0, 100.0)
    assert first.adoption == RollAdoption.KEPT and first.roll.members == {"new", "r0", "r1"}

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
