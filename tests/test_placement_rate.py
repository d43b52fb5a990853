"""Issue 15: placement rate (an empty fleet fills within seconds of the leader's first plan), planning on
demand (:func:`plan_due`) and the planner's "unsatisfiable" reason."""

from __future__ import annotations

from p2pnode.scheduler import ClusterView, GpuView, NodeView, parse_catalog, plan
from p2pnode.scheduler._plan import next_plan_at, plan_due
from p2pnode.sim._sched import run_placement_rate


def test_an_empty_200_x_8_fleet_is_full_within_30_virtual_seconds():
    r = run_placement_rate(200, 8, 60, seed=3, horizon_s=120)
    assert r["violation_count"] == 0, r["violations"]
    assert r["fully_placed_s"] is not None and r["fully_placed_s"] <= 30.0
    assert r["free_whole_gpus"] == 0 and r["placed_gpu_share"] >= 0.99


def test_the_old_rate_takes_longer_than_30_seconds():
    r = run_placement_rate(200, 8, 60, seed=3, horizon_s=300, min_gap_s=None, max_assignments=128)
    assert r["violation_count"] == 0 and r["fully_placed_s"] is not None and r["fully_placed_s"] > 30.0


def test_plan_due_plans_on_demand_but_never_within_the_gap():
    assert plan_due(0.0, None, interval_s=5.0)
    assert not plan_due(3.0, 0.0, interval_s=5.0, min_gap_s=1.0)
    assert plan_due(5.0, 0.0, interval_s=5.0, min_gap_s=1.0)
    assert not plan_due(0.5, 0.0, interval_s=5.0, min_gap_s=1.0, capacity_changed=True)
    assert plan_due(1.0, 0.0, interval_s=5.0, min_gap_s=1.0, capacity_changed=True)
    assert plan_due(1.0, 0.0, interval_s=5.0, min_gap_s=1.0, budget_used=True)
    assert next_plan_at(0.0, interval_s=5.0, min_gap_s=1.0) == 5.0
    assert next_plan_at(0.0, interval_s=5.0, min_gap_s=1.0, capacity_changed_at=0.2) == 1.0
    assert next_plan_at(0.0, interval_s=5.0, min_gap_s=1.0, capacity_changed_at=2.5) == 2.5
    assert next_plan_at(0.0, interval_s=5.0, min_gap_s=1.0, budget_used=True) == 1.0


def _catalog(**resources):
    return parse_catalog({"job": [{"name": "j", "kind": "selfplay", "config": "c", "argv": ["x"],
                                   "max_concurrency": 4, "resources": {"num_gpus": 1, "vram_gib": 8, **resources}}]})


def _node(nid, vram=24.0, gpus=1, **kw):
    return NodeView(nid, tuple(GpuView(i, vram) for i in range(gpus)), offer=4, **kw)


def test_a_request_no_node_could_take_is_unsatisfiable_not_no_capacity():
    fleet = ClusterView({"a": _node("a", cpus=64, memory_gib=256), "b": _node("b", cpus=32, memory_gib=128)})
    cases = [
        ({"num_cpus": 1000}, "unsatisfiable: asks 1000 CPUs, the largest node has 64"),
        ({"memory_gib": 1024}, "unsatisfiable: asks 1024 GiB of memory, the largest node has 256 GiB"),
        ({"num_gpus": 4}, "unsatisfiable: asks 4 GPUs, the largest node has 1"),
        ({"vram_gib": 40}, "unsatisfiable: asks 1 GPU with 40 GiB each"),
        ({"custom": {"nvlink": 1}}, "unsatisfiable: asks 1 of custom resource 'nvlink', no node has it"),
    ]
    for req, reason in cases:
        p = plan(fleet, _catalog(**req), {}, 0.0, term=1)
        assert not p.assignments and p.pending[0].reason.startswith(reason), (req, p.pending)
    # Satisfiable but busy: not "unsatisfiable".
    busy = ClusterView({"a": NodeView("a", (GpuView(0, 24.0),), offer=0, cpus=64)})
    p = plan(busy, _catalog(num_cpus=8), {}, 0.0, term=1)
    assert not p.pending[0].reason.startswith("unsatisfiable")
    # Nodes that do not account CPUs (0) never make a CPU request unsatisfiable.
    p = plan(ClusterView({"a": _node("a")}), _catalog(num_cpus=1000), {}, 0.0, term=1)
    assert p.assignments


def test_hard_affinity_nobody_carries_is_unsatisfiable():
    c = parse_catalog({"job": [{"name": "j", "kind": "selfplay", "config": "c", "argv": ["x"],
                                "resources": {"num_gpus": 1, "vram_gib": 8},
                                "placement": {"affinity": [{"tag": "nvlink", "hard": True}]}}]})
    p = plan(ClusterView({"a": _node("a")}), c, {}, 0.0, term=1)
    assert p.pending[0].reason.startswith("unsatisfiable: ") and "nvlink" in p.pending[0].reason
