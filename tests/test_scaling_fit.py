"""Scaling buys only classes whose usable capacity fits the waiting work (issue 38, item 3), on the pure core.

A class is judged by its usable VRAM per GPU (the GPU's memory under the guard's limit, as the planner commits it:
p2pnode.scheduler._gpucap), its instances per node count (fractions per GPU), a class that can take none of the
waiting work is never bought and its verdict says why, and each scale-up names the templates it is for. The
acceptance line: classes 1xH100 and 1x5090, selfplay needing 32 GiB per GPU, buys 1xH100 (the leader bought
2 x 1x5090, whose 32 GiB leave 25.6 usable, and the planner refused the work there).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import msgspec
import pytest

from p2pnode.cli._status import scaling_lines
from p2pnode.config import ScalingSettings
from p2pnode.jobs._scaling import scaling_policy
from p2pnode.scheduler import ClusterView, GpuView, NodeView, catalog_from_text, load_catalog, plan
from p2pnode.scheduler._scaling import (
    ClassPolicy,
    FleetNode,
    ProviderList,
    ScalingCore,
    ScalingPolicy,
    class_shape,
    class_takes,
    evaluate_scaling,
)
from p2pnode.snapshot import PlanPending, ScalingAction, ScalingSection, ScalingVerdict

H100, R5090, R4090 = "1xH100", "1x5090", "1x4090"
SELFPLAY = "selfplay-hexagonal_2p"


def catalog(*jobs: tuple[str, float, float, int]):
    """A catalog of selfplay templates ``(name, num_gpus, vram_gib, max_concurrency)``."""
    text = "".join(f'''
[[job]]
name = "{name}"
kind = "selfplay"
config = "c{i}"
argv = ["true"]
max_concurrency = {conc}
[job.resources]
num_gpus = {gpus}
vram_gib = {vram}
''' for i, (name, gpus, vram, conc) in enumerate(jobs))
    return catalog_from_text(text, source="test", base_dir=".")


def policy(classes: dict[str, ClassPolicy] | None = None, **kw) -> ScalingPolicy:
    base = dict(provider="local", cooldown_s=30.0, up_after_s=20.0, idle_timeout_s=60.0, max_step=8,
                classes=classes or {H100: ClassPolicy(0, 8, 2.5), R5090: ClassPolicy(0, 8, 0.7)})
    base.update(kw)
    return ScalingPolicy(**base)


def voters(k: int = 2) -> list[FleetNode]:
    """Hand-started busy voters of no configured class (the fleet has a quorum; they count toward nothing)."""
    return [FleetNode(node_id=f"v{i}", node_class="1xH200", gpus=1, gpu_used=1.0, running=(("other", 5.0),),
                      voter=True) for i in range(k)]


def waiting(*names: str, wait_s: float = 90.0) -> list[PlanPending]:
    return [PlanPending(template=n, reason="no capacity", wait_s=wait_s) for n in names]


def verdicts(p: ScalingPolicy, cat, pending, fleet=None, **kw) -> dict[str, ScalingVerdict]:
    return {v.node_class: v for v in evaluate_scaling(p, voters() if fleet is None else fleet, pending, cat, None,
                                                      1000.0, **kw)}


def test_selfplay_needing_32_gib_buys_the_h100_never_the_5090():
    cat = catalog((SELFPLAY, 1, 32, 1))
    vs = verdicts(policy(), cat, waiting(SELFPLAY))
    assert (vs[H100].verdict, vs[H100].count) == ("up", 1)
    assert vs[H100].for_templates == [SELFPLAY] and vs[H100].queued == 1
    assert f"not 1x5090: 25.6 GiB usable per GPU < 32 GiB {SELFPLAY}" in vs[H100].reason
    assert vs[R5090].verdict == "hold" and vs[R5090].queued == 0 and vs[R5090].for_templates == []
    assert f"no waiting work it can take (25.6 GiB usable per GPU < 32 GiB {SELFPLAY})" in vs[R5090].reason
    # what decided is the guard's cap: judged by its full 32 GiB, the cheaper 5090 would have been bought
    full = verdicts(policy(vram_limit_ratio=1.0), cat, waiting(SELFPLAY))
    assert full[R5090].verdict == "up" and full[H100].verdict == "hold"


def test_the_leader_never_buys_the_5090_while_the_work_waits():
    """The core over an hour of steps: the work stays waiting (the provider is slow), actions go one per cooldown,
    every one of them is 1xH100 and names the work it is for."""
    cat = catalog((SELFPLAY, 1, 32, 4))
    core = ScalingCore(policy(max_step=1))
    core.lead(1, [], 0.0)
    actions = []
    for step in range(360):
        wall = 100.0 + 10.0 * step
        for e in core.step(voters(), waiting(SELFPLAY), cat, None, wall):
            if isinstance(e, ProviderList):  # the nodes asked for are still booting
                core.listed([(a.id, "", "starting", a.node_class) for a in actions for _ in range(a.count)], "", wall)
                continue
            actions.append(e.action)
            core.result(e.action.id, "", wall)
    assert actions and {a.node_class for a in actions} == {H100}
    assert all(a.for_templates == [SELFPLAY] and SELFPLAY in a.reason for a in actions)
    assert sum(a.count for a in actions) == 4  # the nodes asked for count as starting: 4 instances, 4 nodes


EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "examples" / "catalog.toml"


def test_the_example_catalogs_hexagonal_selfplay_buys_h100s():
    """The acceptance line with the example catalog itself (its floors and tiers): 4 instances wanted, 4 x 1xH100."""
    cat = load_catalog(EXAMPLE)
    vs = verdicts(policy(), cat, waiting(SELFPLAY))
    assert (vs[H100].verdict, vs[H100].count, vs[H100].for_templates) == ("up", 4, [SELFPLAY])
    assert vs[R5090].verdict == "hold" and "25.6 GiB usable per GPU < 32 GiB" in vs[R5090].reason


@pytest.mark.parametrize("ratio", [0.8, 1.0])
def test_scaling_and_the_planner_agree_on_an_empty_node_of_each_class(ratio):
    """For every example template (gangs and hard tags aside) and class: scaling's instances per node are what the
    planner places on one empty node of the class under the same cap (a training: one per config, so at least
    one), and zero exactly when the planner leaves it unsatisfiable."""
    cat = load_catalog(EXAMPLE)
    checked = 0
    for cls in (H100, R5090, R4090, "8x4090", "2x3090", "1x3060", "1xL40S", "8xA100"):
        shape = class_shape(cls)
        node = NodeView("x", tuple(GpuView(i, shape.vram_gib) for i in range(shape.gpus)), offer=64, cpus=256.0,
                        memory_gib=2048.0, vram_limit_ratio=ratio, host="h")
        for name, t in cat.templates.items():
            if t.gang is not None or any(a.hard for a in t.placement.affinity) or t.resources.custom:
                continue
            t = msgspec.structs.replace(t, max_concurrency=64)
            one = dataclasses.replace(cat, templates={name: t})
            p = plan(ClusterView(nodes={"x": node}), one, {}, 0.0, term=1)
            placed = sum(1 for a in p.assignments if a.template == name)
            takes, why = class_takes(t, shape, one, ratio)
            if t.kind == "training":
                assert (takes > 0) == (placed > 0), (cls, name, why)
            else:
                assert takes == placed, (cls, name, takes, placed)
            assert (takes == 0) == any(x.reason.startswith("unsatisfiable") for x in p.pending), (cls, name, why)
            checked += 1
    assert checked >= 48


def test_work_that_fits_both_buys_the_cheaper_class():
    cat = catalog(("selfplay-small", 1, 16, 1))
    vs = verdicts(policy(), cat, waiting("selfplay-small"))
    assert (vs[R5090].verdict, vs[R5090].count) == ("up", 1) and vs[R5090].for_templates == ["selfplay-small"]
    assert vs[H100].verdict == "hold" and "cannot" not in vs[H100].reason and "not 1x" not in vs[R5090].reason


@pytest.mark.parametrize("cls,ratio,per_gpu,nodes", [
    (R4090, 0.8, 2, 4),  # 19.2 GiB usable: 2 instances of 8 GiB per GPU (the quarter alone would say 4)
    (R4090, 1.0, 3, 3),  # 24 GiB: 3 per GPU, 8 instances on 3 nodes
    (H100, 0.8, 4, 2),  # 64 GiB: 4 per GPU, the quarter's limit
])
def test_a_fractional_job_counts_its_instances_per_gpu(cls, ratio, per_gpu, nodes):
    cat = catalog(("quarter", 0.25, 8, 8))
    assert class_takes(cat.templates["quarter"], class_shape(cls), cat, ratio) == (per_gpu, "")
    vs = verdicts(policy({cls: ClassPolicy(0, 16, 1.0)}, vram_limit_ratio=ratio), cat, waiting("quarter"))
    assert (vs[cls].verdict, vs[cls].count) == ("up", nodes)


def test_four_quarter_gpu_jobs_fill_one_gpu():
    cat = catalog(("quarter", 0.25, 4, 4))
    assert verdicts(policy(), cat, waiting("quarter"))[R5090].count == 1  # 25.6 GiB hold 6 x 4 GiB; 4 by fraction
    assert class_takes(cat.templates["quarter"], class_shape("8xH100"), cat, 0.8) == (32, "")


def test_whole_gpu_jobs_pack_whole_per_node():
    cat = catalog(("three", 3, 40, 3))
    assert class_takes(cat.templates["three"], class_shape("4xH100"), cat, 0.8) == (1, "")
    vs = verdicts(policy({"4xH100": ClassPolicy(0, 8, 9.0)}), cat, waiting("three"))
    assert vs["4xH100"].count == 3  # one 3-GPU job to a 4-GPU node (not 9 GPUs / 4 = 2.25 nodes)
    n, why = class_takes(cat.templates["three"], class_shape(H100), cat, 0.8)
    assert n == 0 and why == "1 GPU per node < 3 three"


def test_work_no_class_can_take_buys_nothing_and_each_class_says_why():
    cat = catalog(("huge", 1, 70, 1))
    vs = verdicts(policy(), cat, waiting("huge"))
    assert all(v.verdict == "hold" and v.queued == 0 for v in vs.values())
    assert "64.0 GiB usable per GPU < 70 GiB huge" in vs[H100].reason
    assert "25.6 GiB usable per GPU < 70 GiB huge" in vs[R5090].reason


def test_a_catalog_floor_counts_against_the_usable_vram():
    text = f'''
[policy]
vram_floors_gib = {{ "c0" = 30 }}
[[job]]
name = "{SELFPLAY}"
kind = "selfplay"
config = "c0"
argv = ["true"]
max_concurrency = 1
[job.resources]
num_gpus = 1
vram_gib = 8
'''
    cat = catalog_from_text(text, source="test", base_dir=".")
    vs = verdicts(policy(), cat, waiting(SELFPLAY))
    assert vs[H100].verdict == "up" and f"25.6 GiB usable per GPU < 30 GiB {SELFPLAY}" in vs[R5090].reason


def big_box(vram: float, gpus: int = 1, k: int = 1) -> list[FleetNode]:
    """Busy members of a class named otherwise than <n>x<MODEL> (its shape comes from them), with the voters."""
    return [*voters(), *(FleetNode(node_id=f"b{i}", node_class="big-box", gpus=gpus, gpu_used=float(gpus),
                                   running=(("other", 5.0),), voter=True, vram_gib=vram) for i in range(k))]


@pytest.mark.parametrize("vram", [math.nan, math.inf, -math.inf, 1e300, -80.0, 0.0, 5000.0])
def test_a_members_vram_out_of_bounds_gives_no_shape_and_buys_nothing(vram):
    cat = catalog(("huge", 1, 70, 1))
    p = policy({"big-box": ClassPolicy(0, 8, 0.1)})
    assert class_shape("big-box", big_box(80.0), {"big-box": vram}) is None
    assert class_shape("big-box", big_box(vram)) is None
    for fleet, vram_of in ((big_box(80.0), {"big-box": vram}), (big_box(vram), None)):
        v = verdicts(p, cat, waiting("huge"), fleet, vram_of=vram_of)["big-box"]
        assert v.verdict == "hold" and "no known shape" in v.reason


def test_a_members_sane_vram_shapes_its_class_and_huge_gpu_counts_do_not():
    cat = catalog(("huge", 1, 70, 1))
    p = policy({"big-box": ClassPolicy(0, 8, 0.1)})
    assert verdicts(p, cat, waiting("huge"), big_box(80.0), vram_of={"big-box": 96.0})["big-box"].verdict == "up"
    assert verdicts(p, cat, waiting("huge"), big_box(96.0))["big-box"].verdict == "up"  # 76.8 GiB usable
    v = verdicts(p, cat, waiting("huge"), big_box(80.0))["big-box"]  # 64 GiB usable < 70
    assert v.verdict == "hold" and "64.0 GiB usable per GPU < 70 GiB huge" in v.reason
    mixed = [*big_box(96.0), FleetNode(node_id="c0", node_class="big-box", gpus=1, vram_gib=80.0, voter=True,
                                       gpu_used=1.0, running=(("other", 1.0),))]
    assert class_shape("big-box", mixed).vram_gib == 80.0  # the smallest member: a new node may be one of those
    assert class_shape("big-box", big_box(96.0, gpus=10**9)) is None


def test_a_nan_or_out_of_range_ratio_never_crashes_and_never_buys_on_nan():
    cat = catalog((SELFPLAY, 1, 32, 1))
    vs = verdicts(policy(vram_limit_ratio=math.nan), cat, waiting(SELFPLAY))
    assert all(v.verdict == "hold" for v in vs.values())
    vs = verdicts(policy(vram_limit_ratio=7.0), cat, waiting(SELFPLAY))  # clamped to 1: the full 32 GiB
    assert vs[R5090].verdict == "up"


def test_for_templates_are_distinct_and_bounded():
    names = [f"sp{i}" for i in range(12)]
    cat = catalog(*[(n, 1, 8, 1) for n in names])
    v = verdicts(policy(), cat, waiting(*names, *names))[R5090]
    assert v.verdict == "up" and v.queued == 24 and v.for_templates == names[:8]
    sec = ScalingSection(verdicts=[v], ledger=[ScalingAction(id="1-1-1", op="up", node_class=R5090, term=1, at=1.0,
                                                             count=4, for_templates=names[:8])])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(sec), type=ScalingSection) == sec
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(msgspec.msgpack.encode({**msgspec.to_builtins(v), "for_templates": names}),
                               type=ScalingVerdict)
    # a section from a leader without the field decodes (the field is new)
    old = msgspec.to_builtins(sec)
    for x in (*old["verdicts"], *old["ledger"]):
        del x["for_templates"]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=ScalingSection).ledger[0].for_templates == []


def test_status_names_what_an_action_is_for():
    sc = {"classes": [H100], "provider": "local", "verdicts": [],
          "ledger": [{"id": "1-1-1", "op": "up", "count": 1, "node_class": H100, "state": "done",
                      "for_templates": [SELFPLAY]}]}
    assert any(f"up 1 x 1xH100 for {SELFPLAY}: done" in line for line in scaling_lines(sc))


def test_the_driver_passes_the_guards_cap_into_the_policy():
    s = ScalingSettings(provider="local")
    assert scaling_policy(s).vram_limit_ratio == 0.8
    assert scaling_policy(s, vram_limit_ratio=0.9).vram_limit_ratio == 0.9
