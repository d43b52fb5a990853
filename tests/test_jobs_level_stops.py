"""The critical level end to end through the driver: at critical (the guard's level after hysteresis, held for the
dwell: the dwell itself is tested in virtual time in test_job_core.py) work below CRITICAL already running is
stopped by the runner with the reason in the job history; CRITICAL work (here: kind ``evaluation`` marked critical
in the catalog's policy) continues. Real subprocesses, a real runner, the job core's stop effects carried out by
:meth:`JobControl.apply`."""

import trio

from p2pnode.guardcore import GuardLimits, assess
from p2pnode.jobs import JobHistory, JobRunner
from p2pnode.jobs._control import JobControl
from p2pnode.node import JobCore, JobInputs, Leadership, LocalJob, StopJob
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
    limits = GuardLimits()
    core = JobCore("n1", CATALOG, dwell_s=limits.dwell_s, interval_s=3600.0)
    control = JobControl.__new__(JobControl)  # only what carrying out a stop needs: the runner
    control.ctx, control.runner = None, runner
    sample = _sample(93.0)

    def step(level, now):
        running = {k: LocalJob(k, j.template.name, j.template.kind, started_at=0.0, stopping=j.stopping is not None)
                   for k, j in runner.jobs.items()}
        inp = JobInputs(Leadership(None, None, 0, True, {}), [], running, level=level,
                        assessment=lambda: assess(sample.to_wire(), limits))
        control.apply([e for e in core.step(inp, now) if isinstance(e, StopJob)])

    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        for name, t in CATALOG.templates.items():
            runner.start(job_id=name, template=t, params={}, gpus=(), gpu_fraction=0.0, vram_gib=0.0, term=1)
        step(3, 0.0)  # heavy (3) refuses new work but stops nothing
        step(4, 0.0)  # critical just now: new work is refused, running work waits out the dwell
        step(4, limits.dwell_s - 0.1)
        assert all(j.stopping is None for j in runner.jobs.values())
        step(4, limits.dwell_s)
        step(4, limits.dwell_s + 1.0)  # idempotent: a job being stopped is not stopped again
        with trio.fail_after(10):
            while set(runner.jobs) != {"evaluation"}:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    runs = {r["job_id"]: r["reason"] for r in history.recent()}
    why = "guard level 4 (critical: memory 93 % >= 80 %): only CRITICAL work continues"
    assert runs["selfplay"] == why and runs["training"] == why
    assert runs["evaluation"] != why
