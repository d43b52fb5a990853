"""The stop rules wired into the real job-control driver (issue 39): :class:`p2pnode.jobs._control.JobControl`
steps :class:`p2pnode.node._stoprules.StopRules` beside its core, wakes at their deadline, feeds them the runner's
memory samples and the operator's intents, and carries their stops out through ``JobControl.apply``: real
processes, a maximum runtime, an operator stop, a drain of preemptible work, a memory limit, a clean agent stop.
The tests drive ``JobControl.drive``, the loop ``JobControl.run`` runs: a driver that never woke at the rules'
deadline fails the maximum-runtime bound (the scheduler interval, the core's own wake-up, is set far off)."""

from __future__ import annotations

import os
import signal
import sys
import time

import trio
from helpers import FakeContext, envelope, typed

from p2pnode.config import Config, SchedulerSettings
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
    # the core's own periodic wake-up (the scheduler interval) far off: only the rules' deadline stops a job in time
    ctx = FakeContext(Config(scheduler=SchedulerSettings(interval_s=120.0)), data_dir=tmp_path,
                      clock=trio.current_time)
    ctx.put(typed(envelope(ctx.identity, 1)), b"")
    core = NodeCore(ctx.node_id, config=MembershipConfig(), store=MemoryStore(), info=lambda n: None,
                    roll_candidates=list)
    jc = JobControl(ctx, core, _catalog())
    jc.runner.memory_check_interval_s = 0.1
    return ctx, jc


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
        await nursery.start(jc.drive)  # JobControl.run's own loop (without its fetcher, scaler, engine probe)
        t0 = trio.current_time()
        _start(jc, ctx, "1-1", "short")  # alone: no other job's start, end or memory sample wakes the loop
        jc.news()
        await _until(lambda: "1-1" not in jc.runner.jobs)  # max runtime: the driver woke at the rules' deadline
        # not before its maximum runtime, and not much after (the wake-up at the rules' deadline, on a loaded box)
        assert 0.5 <= trio.current_time() - t0 < 0.5 + 10
        for job_id, template in (("1-2", "long"), ("1-3", "pre"), ("1-4", "hog"), ("1-5", "long")):
            _start(jc, ctx, job_id, template)
        jc.news()
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


async def test_a_clean_agent_stop_sends_each_job_one_sigterm(tmp_path):
    """JobControl.shutdown asks each job to stop through apply (SIGTERM, SIGKILL after the grace period) and then
    waits in the runner's shutdown, which signals only the jobs no stop signalled yet: a job that takes a second
    SIGTERM as "abort now" keeps its graceful stop."""
    terms, ready = tmp_path / "terms", tmp_path / "ready"
    script = (f"import signal, time, pathlib\n"
              f"def h(*a):\n    open({str(terms)!r}, 'a').write('T\\n')\n"
              f"signal.signal(signal.SIGTERM, h)\npathlib.Path({str(ready)!r}).touch()\n"
              f"t = time.time()\nwhile time.time() - t < 3: time.sleep(0.02)\n")
    ctx, jc = _control(tmp_path)
    jc.set_catalog(parse_catalog({"job": [{"name": "t", "kind": "selfplay", "config": "t", "env": ["PATH"],
                                           "argv": [sys.executable, "-c", script]}]}))
    jc.runner.grace_s = 1.5
    async with trio.open_nursery() as nursery:
        await nursery.start(jc.runner.run)
        _start(jc, ctx, "1-1", "t")
        await _until(ready.exists)
        await jc.shutdown()
        nursery.cancel_scope.cancel()
    assert terms.read_text().count("T") == 1  # one SIGTERM, then SIGKILL after the grace period
    row = jc.history.recent()[0]
    assert (row["job_id"], row["reason"], row["exit_status"]) == ("1-1", "stopped: agent shutdown", -9)


async def test_an_operator_stop_while_the_agent_leaves_is_carried_out(tmp_path):
    """``p2pnode jobs stop`` while the agent leaves (nothing new starts then): the stop rules are still stepped
    by the driver's loop, and the operator's stop is carried out before the jobs are left for re-adoption."""
    ctx, jc = _control(tmp_path)
    jc.runner.on_agent_stop = "leave"
    async with trio.open_nursery() as nursery:
        await nursery.start(jc.runner.run)
        await nursery.start(jc.drive)
        _start(jc, ctx, "1-1", "long")
        _start(jc, ctx, "1-2", "long")
        ctx.leaving = True
        jc.news()
        assert jc.operator.stop_job("1-1")
        jc.news()
        await _until(lambda: "1-1" not in jc.runner.jobs)
        await jc.shutdown()
        assert list(jc.runner.jobs) == ["1-2"]  # left running for re-adoption
        leftover = jc.runner.jobs["1-2"].proc
        nursery.cancel_scope.cancel()
    os.killpg(leftover.pid, signal.SIGKILL)
    leftover.wait()
    runs = {r["job_id"]: r["reason"] for r in jc.history.recent()}
    assert runs == {"1-1": "stopped by the operator", "1-2": None}
