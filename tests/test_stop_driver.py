"""The stop rules wired into the real job-control driver (issue 39): :class:`p2pnode.jobs._control.JobControl`
steps :class:`p2pnode.node._stoprules.StopRules` beside its core, wakes at their deadline, feeds them the runner's
memory samples and the operator's intents, and carries their stops out through ``JobControl.apply``: real
processes, a maximum runtime, an operator stop, a drain of preemptible work, a memory limit, a clean agent stop."""

from __future__ import annotations

import sys
import time

import trio
from helpers import FakeContext, envelope, typed

from p2pnode.config import Config
from p2pnode.gossip import MembershipConfig
from p2pnode.jobs._control import JobControl
from p2pnode.node import MemoryStore, NodeCore
from p2pnode.scheduler import parse_catalog
from p2pnode.snapshot import PlanJob

HOG = f"{sys.executable} -c 'import time; b = bytearray(200 * 2**20); b[::4096] = b\"x\" * len(b[::4096]); " \
      "time.sleep(30)'"


def _catalog():
    def job(name, argv, **kw):
        return {"name": name, "kind": "selfplay", "config": name, "argv": argv, "env": ["PATH"], **kw}

    return parse_catalog({"job": [
        job("short", ["sleep", "30"], max_runtime_s=0.5),
        job("long", ["sleep", "30"], preemptible=False),
        job("pre", ["sleep", "30"], preemptible=True),
        job("hog", ["sh", "-c", HOG], resources={"memory_gib": 0.1}),
    ]})


def _control(tmp_path):
    ctx = FakeContext(Config(), data_dir=tmp_path, clock=trio.current_time)
    ctx.put(typed(envelope(ctx.identity, 1)), b"")
    core = NodeCore(ctx.node_id, config=MembershipConfig(), store=MemoryStore(), info=lambda n: None,
                    roll_candidates=list)
    jc = JobControl(ctx, core, _catalog())
    jc.runner.memory_check_interval_s = 0.1
    return ctx, jc


async def _drive(jc, *, task_status=trio.TASK_STATUS_IGNORED):
    """JobControl.run's loop without its fetcher, scaler and engine probe: step, then wait for news or the earlier
    of the core's and the stop rules' deadlines."""
    task_status.started()
    while True:
        jc._wake = trio.Event()
        jc.step()
        with trio.move_on_at(min(jc.core.next_deadline(), jc.stops.next_deadline())):
            await jc._wake.wait()


async def _until(pred, timeout=20):
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


def _start(jc, ctx, job_id, template):
    jc.start(PlanJob(job_id=job_id, node=ctx.node_id, template=template), 1)


async def test_every_stop_rule_reaches_a_real_process_through_the_one_executor(tmp_path):
    ctx, jc = _control(tmp_path)
    asked = []
    execute = jc.apply
    jc.apply = lambda effects: (asked.extend(e for e in effects if type(e).__name__ == "StopJob"), execute(effects))
    jc.stops.execute = jc.apply
    async with trio.open_nursery() as nursery:
        await nursery.start(jc.runner.run)
        await nursery.start(_drive, jc)
        t0 = trio.current_time()
        for job_id, template in (("1-1", "short"), ("1-2", "long"), ("1-3", "pre"), ("1-4", "hog"), ("1-5", "long")):
            _start(jc, ctx, job_id, template)
        jc.news()
        await _until(lambda: "1-1" not in jc.runner.jobs)  # max runtime: the driver woke at the rules' deadline
        assert trio.current_time() - t0 >= 0.5
        await _until(lambda: "1-4" not in jc.runner.jobs)  # memory limit, from the runner's samples
        assert jc.operator.stop_job("1-2")
        jc.news()
        await _until(lambda: "1-2" not in jc.runner.jobs)  # the operator's stop, an intent the rules carry out
        jc.operator.intents.drain(0.0, time.time())
        jc.news()
        await _until(lambda: "1-3" not in jc.runner.jobs)  # drained: the preemptible job stops, the other runs on
        assert "1-5" in jc.runner.jobs
        await jc.shutdown()  # a clean agent stop, through the same executor
        assert not jc.runner.jobs
        nursery.cancel_scope.cancel()
    runs = {r["job_id"]: r["reason"] for r in jc.history.recent()}
    assert runs["1-1"] == "maximum runtime reached"
    # the RSS samples, or where the host gives the job a memory cgroup, the kernel's OOM kill the runner reports
    assert runs["1-4"] in ("memory limit: killed by the kernel at its cgroup limit of 0.1 GiB (memory_gib of hog)",) \
        or runs["1-4"].startswith("memory limit: RSS ") and runs["1-4"].endswith("GiB > 0.1 GiB (memory_gib of hog)")
    assert runs["1-2"] == "stopped by the operator"
    assert runs["1-3"] == "node drained by the operator: deadline passed"
    assert runs["1-5"] == "stopped: agent shutdown"
    rules = [(e.job_id, e.rule) for e in asked]  # each asked once (max runtime and memory in either order)
    assert sorted(rules) == [("1-1", "max_runtime"), ("1-2", "operator"), ("1-3", "drain"), ("1-4", "memory_limit"),
                             ("1-5", "agent_stop")]
    table = {j: (jc.core.table.get(j).rule if jc.core.table.get(j) else None) for j, _ in rules}
    assert table == dict(rules), table  # the job table records each stop by its rule
