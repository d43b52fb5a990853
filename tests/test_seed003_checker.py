"""The pending-reason checker of ``bench/seed003_fleet.py`` (issue 38): the blockers it recomputes from a sampled
view (a node in its band, offers the plan used, the guard's cap, GPU room, tiers) and the causes it reads in a
reason, on hand-built views; and, on random fleets of seed 003's boxes planned by the leader's own planner, every
reason against the blockers recomputed from the facts of the same plan (``GET /plan?inputs=1``). Pure: no agent
is started."""

from __future__ import annotations

import importlib.util
import random
import sys
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from p2pnode.node._planinputs import plan_inputs_doc
from p2pnode.node._plans import MemberPlanInput, Planner
from p2pnode.scheduler import GpuView, NodeView, RunningJob
from p2pnode.snapshot import JobReport

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("seed003_fleet", ROOT / "bench" / "seed003_fleet.py")
bench = sys.modules["seed003_fleet"] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up
_spec.loader.exec_module(bench)

CATALOG = bench.load_catalog(bench.CATALOG)
NEEDS = bench.needs_of(CATALOG)
TEMPLATES = dict(CATALOG.templates)


def node(gpus, offer, *, level=0, tags=(), cpus=64, memory_gib=256):
    return {"gpus": list(gpus), "tags": list(tags), "declared": {"cpus": cpus, "memory_gib": memory_gib},
            "offer": offer, "level": level, "full": []}


def job(node_id, gpu, fraction, vram, template="selfplay-hex8_2p", new=False, job_id=None):
    return {"job_id": job_id or f"{node_id}-{gpu}-{vram}-{fraction}", "node": node_id, "template": template,
            "gpus": [gpu], "fraction": fraction, "vram": vram, "new": new}


def view(nodes, jobs=()):
    jobs = list(jobs)
    return {"nodes": nodes, "jobs": jobs, "ratio": 0.8, "used": Counter(j["node"] for j in jobs if j["new"])}


def test_the_floors_and_fractions_come_from_the_example_catalog():
    assert (NEEDS["selfplay-hex8_2p"].vram, NEEDS["selfplay-hex8_2p"].num_gpus) == (8, 0.25)  # 4 GiB, floor 8
    assert NEEDS["selfplay-hexagonal_2p"].vram == 32 and NEEDS["train-hexagonal_2p"].tiers == (1, 2)


def test_a_4090_holding_16_gib_is_blocked_by_the_cap_not_by_room():
    # Two 0.25-GPU selfplays at 8 GiB on each GPU: 16 of 19.2 usable GiB committed, 8 GiB of the card free.
    v = view({"n": node([24.0] * 2, offer=2)}, [job("n", g, 0.25, 8, job_id=f"{g}{k}") for g in (0, 1) for k in "ab"])
    found, per_node = bench.blockers(v, NEEDS["selfplay-hex8_2p"], TEMPLATES)
    assert found == {"cap"} and per_node == {"n": "cap"}


def test_a_gpu_with_nothing_free_even_without_the_cap_is_room():
    v = view({"n": node([24.0], offer=2)}, [job("n", 0, 0.5, 16), job("n", 0, 0.25, 8)])
    assert bench.blockers(v, NEEDS["selfplay-hex8_2p"], TEMPLATES)[0] == {"room"}


def test_a_node_offering_nothing_is_in_its_band_and_the_plans_own_assignments_use_offers():
    assert bench.blockers(view({"n": node([24.0], offer=0)}), NEEDS["selfplay-hex8_2p"], TEMPLATES)[0] == {"band"}
    v = view({"n": node([24.0] * 2, offer=1)}, [job("n", 0, 0.25, 8, new=True)])
    assert bench.blockers(v, NEEDS["selfplay-hex8_2p"], TEMPLATES)[0] == {"offers_used"}


def test_work_that_fits_somewhere_has_no_blocker_and_a_degraded_node_is_named():
    nodes = {"a": node([80.0], offer=0), "b": node([80.0], offer=1)}
    found, per_node = bench.blockers(view(nodes), NEEDS["train-hex8_2p"], TEMPLATES)
    assert found == set() and per_node == {"a": "band", "b": "fits"}
    degraded = {"a": node([80.0], offer=1, level=4)}
    assert bench.blockers(view(degraded), NEEDS["train-hex8_2p"], TEMPLATES)[0] == {"level"}


def test_the_cap_alone_keeps_a_5090_from_32_gib_work():
    # Alone, the 5090 can never take it under the cap (25.6 usable GiB); beside an H200 in its band, the band
    # is what holds the work and the 5090 is shown, not counted.
    alone = view({"5090": node([32.0], offer=1)})
    assert bench.blockers(alone, NEEDS["selfplay-hexagonal_2p"], TEMPLATES)[0] == {"cap"}
    nodes = {"5090": node([32.0], offer=1), "h200": node([141.0], offer=0)}
    found, per_node = bench.blockers(view(nodes), NEEDS["selfplay-hexagonal_2p"], TEMPLATES)
    assert found == {"band"} and per_node == {"5090": "cap_always", "h200": "band"}


def test_no_node_in_the_tiers():
    assert bench.blockers(view({"small": node([8.0], offer=4)}), NEEDS["train-hex8_2p"], TEMPLATES)[0] == {"tiers"}


@pytest.mark.parametrize(("reason", "causes"), [
    ("no node in tiers 3/2/1 has a GPU with 8 GiB free", {"room"}),
    ("waits ~38 s for 1-20 (selfplay-square19_2p) on n3 to end (predicted); no node in tiers 3/2/1 has a GPU with "
     "32 GiB free", {"room"}),
    ("no capacity offered for GPU work: this plan used every offer (5); nodes with GPUs offering none: 3 in their "
     "GPU utilization band or cordoned", {"offers_used", "band"}),
    ("no capacity offered for GPU work: nodes with GPUs offering none: 1 in their GPU utilization band or cordoned",
     {"band"}),
    ("nodes that fit are degraded (level 3 refuses NORMAL work)", {"level"}),
    ("unsatisfiable: asks 1 GPU with 32 GiB each, the most any node can commit on one GPU is 25.6 GiB",
     {"unsatisfiable", "cap"}),
    ("training may use tiers 1/2, no node is in them", {"tiers"}),
    ("nodes that fit lack 8 free CPUs", {"resources"}),
    # review of issue 38: the floor's clause holds "; " in its parentheses; read as two clauses, "it asks 4) rules out
    # 1 of them" was a cause of its own ("other"), a disagreement wherever seed 003's 4 GiB selfplay met its floor
    ("no node in tiers 3/2/1 takes it: 1 have no GPU with 0.5 of it and 8 GiB free (held by their jobs); the VRAM "
     "floor of hex8_2p (8 GiB per GPU; it asks 4) rules out 1 of them", {"room"}),
])
def test_the_causes_a_reason_names(reason, causes):
    assert bench.reason_causes(reason) == causes


# -- against the facts of the same plan (GET /plan?inputs=1) -----------------------------------------------------------
SHAPES = (("h200", [141.0], 32, 240), ("a100", [80.0] * 8, 128, 1000), ("4090", [24.0] * 8, 64, 250),
          ("5090", [32.0], 16, 64), ("cpu", [], 16, 64))


def _sample_of(r) -> dict:
    """What ``take_sample`` reads of the leader for plan round ``r``: the plan (JSON, as ``GET /plan`` encodes it)
    and the facts it was computed from (``GET /plan?inputs=1``)."""
    sec = msgspec.json.decode(msgspec.json.encode(r.section))
    inputs = msgspec.json.decode(msgspec.json.encode(plan_inputs_doc(r)))
    at = sec.get("at", 0.0)
    return {"t": 0.0, "plan": [sec["term"], sec["seq"]], "ratio": 0.8, "inputs": bench._compact_inputs(inputs),
            "assignments": [{"job_id": a["job_id"], "node": a["node"], "template": a["template"],
                             "gpus": a.get("gpus", []), "fraction": a.get("gpu_fraction", 0.0),
                             "vram": a.get("vram_gib", 0.0), "new": abs(a.get("assigned_at", 0.0) - at) < 1e-6}
                            for a in sec.get("assignments", [])],
            "pending": [{"template": p["template"], "reason": p["reason"]} for p in sec.get("pending", [])],
            "stops": [{"job_id": x["job_id"], "node": x["node"], "reason": x["reason"], "rule": x.get("rule", "plan")}
                      for x in sec.get("stops", [])]}


def _fleet_rounds(seed: int, rounds: int = 6) -> list[dict]:
    """A random fleet of seed 003's boxes planned ``rounds`` times by one leader (random offers, levels, full GPUs,
    cordons; at the first plan some running lists unknown; most assignments reported running at the next round, some
    ended): each plan's reasons checked by the bench against the facts of that same plan."""
    rng = random.Random(seed)
    boxes = []
    for i in range(rng.randint(2, 7)):
        name, gpus, cpus, mem = rng.choice(SHAPES)
        boxes.append((f"{name}-{i}", gpus, cpus, mem, rng.random() < 0.5))
    planner, previous, out = Planner(CATALOG), None, []
    running = {nid: [JobReport(job_id=f"{nid}-{g}-{k}", template="selfplay-hex8_2p", gpus=[g], gpu_fraction=0.25,
                               vram_gib=8.0) for g in range(8) if rng.random() < 0.5 for k in "ab"]
               for nid, *_ in boxes if nid.startswith("4090")}  # the 4090s: 16 of 19.2 GiB committed
    for k in range(rounds):
        members = []
        for nid, gpus, cpus, mem, eph in boxes:
            v = NodeView(nid, tuple(GpuView(i, g, full=rng.random() < 0.05) for i, g in enumerate(gpus)),
                         tags=frozenset({"ephemeral" if eph else "durable"}), ephemeral=eph,
                         offer=rng.choice([0, 0, 1, 2, 4, 8]) if gpus else 0, cpu_offer=rng.choice([0, 2]),
                         level=rng.choice([0, 0, 0, 1, 2, 3, 4]), cpus=cpus, memory_gib=mem, vram_limit_ratio=0.8)
            known = k > 0 or rng.random() < 0.7  # a leader's first plan may not hold every running list yet
            members.append(MemberPlanInput(nid, v, running=tuple(running.get(nid, ())), running_known=known))
        cordoned = {b[0] for b in boxes if rng.random() < 0.1}
        r = planner.lead(1, members, previous, {}, 5.0 * k, 1000.0 + 5.0 * k, cordoned=cordoned)
        previous = r.section
        s = _sample_of(r)
        out += bench.check_reasons(s, bench.inputs_view(s, TEMPLATES), NEEDS, TEMPLATES, {}, tuple(s["plan"]), True)
        stopped = {x.job_id for x in r.section.stops}
        running = {}
        for a in r.section.assignments:
            if a.job_id not in stopped and rng.random() >= 0.15:
                running.setdefault(a.node, []).append(JobReport(job_id=a.job_id, template=a.template, gpus=a.gpus,
                                                                gpu_fraction=a.gpu_fraction, vram_gib=a.vram_gib,
                                                                term=1))
    return out


def test_every_reason_agrees_with_the_blockers_recomputed_from_the_same_plans_facts():
    """The acceptance line (issue 38: every pending reason agrees with the planner's accounting), on random fleets of
    seed 003's boxes: the bench's own ``blockers()`` over the facts the leader serves for that plan version
    (``GET /plan?inputs=1``) finds exactly the causes each reason names."""
    checks = [c for seed in range(120) for c in _fleet_rounds(seed)]
    bad = [c for c in checks if not c["strict"]]
    assert not bad, bad[:3]
    found = Counter(x for c in checks for x in c["found"])
    assert len(checks) >= 2000 and all(found[c] >= 20 for c in ("band", "offers_used", "level", "cap", "room")), found
    assert sum(1 for c in checks if c["late_room"]) <= len(checks) // 100  # room a preemption made: rare
    assert found["held"] >= 20  # a new training waits for running lists not fetched yet


def test_offers_are_counted_as_the_capacity_model_counts_them():
    """A fractional job opening an empty GPU spends the node's offer for that GPU; more fractions there spend
    none; a whole-GPU job spends one; a preemption gives a node whose offers were spent one back."""
    hexagonal = "selfplay-hexagonal_2p"  # a whole GPU, 32 GiB
    sample = {"ratio": 0.8, "inputs": {"nodes": {"n": {"gpus": [80.0] * 3, "full": [], "ratio": 0.8, "tags": [],
                                                       "declared": {"cpus": 0, "memory_gib": 0}, "offer": 2,
                                                       "level": 0, "cordoned": False}},
                                       "running": [job("n", 2, 1.0, 64, template=hexagonal, job_id="old")]},
              "assignments": [job("n", 0, 0.25, 8, new=True, job_id="a"), job("n", 0, 0.25, 8, new=True, job_id="b"),
                              job("n", 1, 1.0, 64, template=hexagonal, new=True, job_id="c")],
              "stops": []}
    v = bench.inputs_view(sample, TEMPLATES)
    assert v["offer_left"] == {"n": 0} and v["opened"]["n"] == {0}
    # the opened GPU still takes a fraction without an offer; a whole GPU needs one: none left
    found, per_node = bench.blockers(v, NEEDS["selfplay-hex8_2p"], TEMPLATES)
    assert found == set() and per_node == {"n": "fits"}
    assert bench.blockers(v, NEEDS[hexagonal], TEMPLATES)[0] == {"offers_used"}
    sample["stops"] = [{"job_id": "old", "node": "n", "reason": f"preempted by {hexagonal} (priority 60 vs 50)",
                        "rule": "plan"}]
    sample["inputs"]["nodes"]["n"]["offer"] = 1
    v = bench.inputs_view(sample, TEMPLATES)
    assert v["offer_left"] == {"n": 0} and "old" not in {j["job_id"] for j in v["jobs"]}


def _box(nid, vram, n, *, durable=False, offer=3, ratio=0.8, full=(), level=0):
    return NodeView(nid, tuple(GpuView(i, vram, full=i in full) for i in range(n)), ephemeral=not durable,
                    tags=frozenset({"durable" if durable else "ephemeral"}), offer=offer, vram_limit_ratio=ratio,
                    level=level)


def _planned_and_checked(jobs, nodes, running, seed):
    """Plan ``nodes`` (running ``running``) with catalog ``jobs`` (the planner's own ``plan``), and check every
    pending reason with the bench's checker against the facts of that plan (``GET /plan?inputs=1``'s shapes)."""
    from p2pnode.scheduler import ClusterView, Signals, parse_catalog, plan

    policy = {"vram_floors_gib": {"square8*": 8, "hex8*": 8}, "priorities": {"training": "high"},
              "tiers": {"training": [1, 2], "selfplay": [3, 2, 1]}}
    c = parse_catalog({"job": jobs, "policy": policy})
    signals = {cfg: Signals(config=cfg, curriculum_weight=2.0, elo_velocity=100.0, data_age_s=36000.0, quality=1.0)
               for cfg in ("hex8_2p", "square8_2p")}
    p = plan(ClusterView(nodes, tuple(running)), c, signals, 0.0, term=1, seed=seed)
    given = {j.job_id for j in running}
    facts = {nid: {"gpus": [g.vram_gib for g in v.gpus], "full": [g.index for g in v.gpus if g.full],
                   "ratio": v.vram_limit_ratio, "tags": sorted(v.tags), "declared": {"cpus": 0, "memory_gib": 0},
                   "offer": v.offer, "level": v.level, "cordoned": False} for nid, v in nodes.items()}
    sample = {"t": 0.0, "plan": [1, 1], "ratio": 0.8, "stops": [],
              "inputs": {"nodes": facts, "held_configs": [], "complete": True,
                         "running": [job(j.node_id, j.gpus[0], j.gpu_fraction, j.vram_gib, template=j.template,
                                         job_id=j.job_id) for j in running]},
              "assignments": [job(a.node_id, a.gpus[0], a.gpu_fraction, a.vram_gib, template=a.template,
                                  job_id=a.job_id, new=a.job_id not in given) for a in p.assignments],
              "pending": [{"template": q.template, "reason": q.reason} for q in p.pending]}
    templates = dict(c.templates)
    return bench.check_reasons(sample, bench.inputs_view(sample, templates), bench.needs_of(c), templates, {},
                               (1, 1), True)


def _sp(name, config, priority, cap, gpus, vram):
    return {"name": name, "kind": "selfplay", "config": config, "argv": ["x"], "priority": priority,
            "max_concurrency": cap, "resources": {"num_gpus": gpus, "vram_gib": vram}}


def _train(gpus, vram):
    return {"name": "train", "kind": "training", "config": "square19_2p", "argv": ["x"], "priority": 70,
            "resources": {"num_gpus": gpus, "vram_gib": vram}}


def test_a_displaced_template_that_waits_rather_than_strand_gpu_time_is_not_a_disagreement():
    """Review of issue 38 (MEDIUM): a template taken back for a stable kind waits rather than strand GPU time on a node
    that would take it, and its reason says so ("n0 would take it only by stranding GPU time"); the checker found
    that node (and any other such) free for it at the plan's end and reported the reason as disagreeing with the
    facts (17 of 33 such reasons on random fleets). Those nodes are not blockers; the others are still checked."""
    jobs = [_train(1, 8), _sp("sp0", "hex8_2p", 40, 5, 0.25, 8), _sp("sp1", "square8_2p", 60, 2, 0.25, 4)]
    nodes = {"n0": _box("n0", 12.0, 4, full=(0,)), "n1": _box("n1", 32.0, 1, ratio=1.0), "n2": _box("n2", 80.0, 1),
             "n3": _box("n3", 80.0, 4, durable=True, offer=1, ratio=1.0)}
    running = [RunningJob("r-n0-3", "sp0", "n0", (3,), 0.25, 4.0), RunningJob("r-n3-2", "sp1", "n3", (2,), 0.5, 4.0)]
    (check,) = [c for c in _planned_and_checked(jobs, nodes, running, 7) if c["template"] == "sp1"]
    assert check["reason"].startswith("its placement on n3 went to train") and bench.STRANDING in check["reason"]
    assert check["strict"] and check["found"] == ["offers_used", "room"], check
    assert "n0" in check["stranding"] and check["per_node"]["n3"] == "offers_used", check


def test_room_a_stable_kinds_displacement_left_late_is_not_a_disagreement():
    """Review of issue 38 (MEDIUM): a stable kind took a whole-GPU placement back on n3 and holds half of the GPU, so
    n3 has room for a half-GPU template looked for before (when n3 was full); the planner counts the nodes that held
    it then (as after a preemption), the checker excused only a preemption's room and reported a disagreement."""
    jobs = [_train(0.5, 8), _sp("sp0", "hex8_2p", 50, 4, 1.0, 12), _sp("sp1", "square8_2p", 40, 5, 0.5, 12)]
    nodes = {"n0": _box("n0", 16.0, 1, offer=2), "n1": _box("n1", 12.0, 2, durable=True, ratio=1.0, level=2),
             "n2": _box("n2", 80.0, 4, durable=True, offer=0, ratio=1.0, full=(3,)),
             "n3": _box("n3", 80.0, 1, durable=True, offer=1), "n4": _box("n4", 48.0, 1, durable=True)}
    running = [RunningJob("r-n1-1", "sp1", "n1", (1,), 0.5, 4.0), RunningJob("r-n2-2", "sp1", "n2", (2,), 0.25, 4.0)]
    checks = {c["template"]: c for c in _planned_and_checked(jobs, nodes, running, 1055)}
    assert checks["sp0"]["reason"].startswith("its placement on n3 went to train"), checks["sp0"]
    sp1 = checks["sp1"]
    assert sp1["per_node"]["n3"] == "fits" and sp1["late_room"] == ["n3"], sp1
    assert sp1["strict"] and sp1["found"] == ["band", "room"], sp1
