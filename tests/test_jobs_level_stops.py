"""JobControl.enforce_level: at critical (the guard's level after hysteresis) work below CRITICAL already running
is stopped with the reason in the job history; CRITICAL work (here: kind ``evaluation`` marked critical in the
catalog's policy) continues. Real subprocesses, a real runner; the node context is a small fake."""

from types import SimpleNamespace

import trio

from p2pnode.guard import GuardLimits
from p2pnode.jobs import JobHistory, JobRunner
from p2pnode.jobs._control import JobControl
from p2pnode.resources import ResourceSample
from p2pnode.scheduler import parse_catalog

CATALOG = parse_catalog({
    "policy": {"priorities": {"evaluation": "critical", "training": "high"}},
    "job": [{"name": kind, "kind": kind, "config": "c", "argv": ["sleep", "30"], "env": ["PATH"]}
            for kind in ("selfplay", "training", "evaluation")],
})


def _sample(mem_percent):
    return ResourceSample(cpu_percent=5.0, cpu_count=8, load_avg=(0.1, 0.1, 0.1), mem_total_bytes=64 * 2**30,
                          mem_available_bytes=0, mem_used_bytes=0, mem_percent=mem_percent, disk_path="/",
                          disk_total_bytes=1, disk_used_bytes=0, disk_free_bytes=1, disk_percent=10.0)


async def test_critical_level_stops_running_work_below_critical(tmp_path):
    history = JobHistory(tmp_path / "jobs.db")
    runner = JobRunner(node_id="n1", data_dir=tmp_path / "d", history=history, grace_s=1.0)
    clock = [0.0]
    ctx = SimpleNamespace(last_sample=_sample(93.0), degradation_level=3, now=lambda: clock[0])
    control = JobControl.__new__(JobControl)  # only what enforce_level reads
    control.ctx, control.catalog, control.runner, control.limits = ctx, CATALOG, runner, GuardLimits()
    control._critical_since = None
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        for name, t in CATALOG.templates.items():
            runner.start(job_id=name, template=t, params={}, gpus=(), gpu_fraction=0.0, vram_gib=0.0, term=1)
        control.enforce_level()  # heavy (3) refuses new work but stops nothing
        assert all(j.stopping is None for j in runner.jobs.values())
        ctx.degradation_level = 4
        control.enforce_level()  # critical just now: new work is refused, running work waits out the dwell
        clock[0] = GuardLimits().dwell_s - 0.1
        control.enforce_level()
        assert all(j.stopping is None for j in runner.jobs.values())
        ctx.degradation_level = 3  # a spike that passed: the dwell starts again at the next critical
        control.enforce_level()
        ctx.degradation_level = 4
        clock[0] += 1.0
        control.enforce_level()
        assert all(j.stopping is None for j in runner.jobs.values())
        clock[0] += GuardLimits().dwell_s
        control.enforce_level()
        control.enforce_level()  # idempotent: a job being stopped is not stopped again
        with trio.fail_after(10):
            while set(runner.jobs) != {"evaluation"}:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    runs = {r["job_id"]: r["reason"] for r in history.recent()}
    why = "guard level 4 (critical: memory 93 % >= 80 %): only CRITICAL work continues"
    assert runs["selfplay"] == why and runs["training"] == why
    assert runs["evaluation"] != why
