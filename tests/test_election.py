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
