"""Hostile voters against the real node cores (issue 22, findings 4 and 5), on :class:`ClusterSim` in open mode.

* ``fake_voters``: three real voters (closed rolls) elect a leader; five fake members tagged ``voter``, refused
  by those rolls, vote for a fake node in the current term while a new node starts for the first time, joining
  through the real voters. The new node must adopt the real voters' roll, never admit the fakes.
* ``higher_term``: a member that is not on the roll publishes one vote for itself one term above the leader's,
  then goes silent. No node may raise its term (and fence the leader's plans) for it.

Each run checks, over every node's ``leaders_by_term`` (and every leader view seen at every round), that no term
had two leaders; that every real node and the new node follow the real leader; and that the real leader's plan
of its term passes every real node's fence (:meth:`p2pnode.node.NodeCore.acting_plan`) at every round after the
attack, and the new node's at the end.
"""

from __future__ import annotations

import random
import time
from typing import Any

from ..election import Vote
from ..gossip import MembershipConfig
from ..snapshot import PlanRef
from ._cluster import ClusterSim

__all__ = ["SCENARIOS", "run_false_voters"]

SCENARIOS = ("fake_voters", "higher_term")
REAL = 3
FAKES = 5
ATTACK_AT_S = 12.0
END_S = 45.0


def _one(scenario: str, seed: int, cfg: MembershipConfig | None) -> dict[str, Any]:
    fakes = list(range(REAL, REAL + FAKES)) if scenario == "fake_voters" else [REAL]
    new = REAL + len(fakes) if scenario == "fake_voters" else None
    n = REAL + len(fakes) + (1 if new is not None else 0)
    powers = [2000.0, 624.0, 330.0] + [0.0] * len(fakes) + ([51.0] if new is not None else [])
    tags: dict[int, tuple[str, ...]] = {f: ("voter",) for f in fakes} if scenario == "fake_voters" else {}
    if new is not None:
        tags[new] = ("voter",)  # it claims the tag too: a late voter waits for the operator
    sim = ClusterSim(n, seed=seed, cfg=cfg, powers=powers, vram=[int(p * 1e8) for p in powers],
                     voters=list(range(REAL)), open_rolls=True, tags=tags, absent=(new,) if new is not None else ())
    real_ids = sim.ids[:REAL]
    sim.run_until(ATTACK_AT_S)
    leader, term = sim.leader_views(list(range(REAL)))[0]
    out: dict[str, Any] = {"leader_before": leader is not None and leader == sim.ids[0]}
    before = PlanRef(term=term or 0, seq=1)
    fenced_rounds = 0

    def run_checked(t: float) -> int:
        """Rounds until ``t``; how many of them some real node fenced the real leader's plan of its term."""
        fenced = 0
        while sim.now < t - 1e-9:
            sim.round()
            fenced += any(sim.cores[i].acting_plan(before) is None for i in range(REAL))
        return fenced

    if new is not None:
        target = sim.ids[fakes[0]]
        for f in fakes:
            sim.forge_vote(f, Vote(target, term or 1))
        fenced_rounds += run_checked(ATTACK_AT_S + 1.0)
        sim.start(new, seeds=list(range(REAL)))
        fenced_rounds += run_checked(END_S)
    else:
        x = fakes[0]
        sim.forge_vote(x, Vote(sim.ids[x], (term or 0) + 1))
        fenced_rounds += run_checked(ATTACK_AT_S + 2.0)  # spread to every node, then silent
        sim.kill(x)
        fenced_rounds += run_checked(END_S)
    per_term: dict[int, set[str]] = {}
    for t, leaders in sim.counters.leaders_per_term.items():
        per_term.setdefault(t, set()).update(leaders)
    for i in range(n):
        if sim.running[i]:
            for t, lead in sim.cores[i].leaders_by_term.items():
                per_term.setdefault(t, set()).add(lead)
    followers = list(range(REAL)) + ([new] if new is not None else [])
    views = {i: sim.cores[i].view for i in followers}
    final_leader, final_term = views[0].leader, views[0].term
    ref = PlanRef(term=final_term or 0, seq=1)
    out.update(
        two_leaders_in_a_term=any(len(v) > 1 for v in per_term.values()),
        follows_real_leader=all(v.leader == final_leader and v.term == final_term for v in views.values())
        and final_leader in real_ids,
        fenced=fenced_rounds > 0 or any(sim.cores[i].acting_plan(ref) is None for i in followers),
        fakes_on_a_roll=any(sim.ids[f] in sim.cores[i].roll.members for f in fakes for i in followers),
        new_adoption=sim.cores[new].adoption if new is not None else None,
        final_term=final_term,
        term_before=term,
    )
    return out


def run_false_voters(scenario: str, runs: int = 20, *, seed: int = 0, cfg: MembershipConfig | None = None) -> dict:
    """``runs`` seeded runs of ``scenario`` (:data:`SCENARIOS`, see the module docstring). Returns how many runs
    had two leaders in one term (``two_leaders_in_a_term``); a real node or the new node not following the real
    leader at the end (``not_following``); the real leader's plan fenced on a real node at any round after the
    attack, or on any node at the end (``fenced``); a fake on a real or the new node's roll (``fakes_on_a_roll``);
    no leader before the attack (``no_leader_before``). ``adoption``: the new node's roll adoption per run;
    ``terms``: the real leader's term before the attack and at the end, per run."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    rng = random.Random(seed)
    t0 = time.perf_counter()
    counts = {"two_leaders_in_a_term": 0, "not_following": 0, "fenced": 0, "fakes_on_a_roll": 0,
              "no_leader_before": 0}
    adoption: list[str | None] = []
    terms: list[tuple[int | None, int | None]] = []
    for _ in range(runs):
        r = _one(scenario, rng.randrange(1 << 30), cfg)
        counts["two_leaders_in_a_term"] += r["two_leaders_in_a_term"]
        counts["not_following"] += not r["follows_real_leader"]
        counts["fenced"] += r["fenced"]
        counts["fakes_on_a_roll"] += r["fakes_on_a_roll"]
        counts["no_leader_before"] += not r["leader_before"]
        adoption.append(r["new_adoption"])
        terms.append((r["term_before"], r["final_term"]))
    return {"scenario": scenario, "runs": runs, **counts, "adoption": adoption, "terms": terms,
            "wall_s": round(time.perf_counter() - t0, 2)}
