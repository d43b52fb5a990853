"""An agent restart with real processes (issue 39): the job-control driver (:class:`p2pnode.jobs._control.
JobControl`, its runner and its loop ``JobControl.drive``) is stopped the way ``kill -9`` stops it (its tasks
cancelled with the jobs left running, nothing written after the last commit), and a new one starts on the same data
dir: a stop the operator asked for and the agent never carried out is carried out after the restart, and a stop
under way is carried out again with its rule; the job table is restored from the ledger. Waits are on conditions,
with deadlines. Last, the whole agent killed with ``kill -9`` and started again."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3

import trio
from agents import AgentProc, free_port, wait_until
from helpers import FakeContext, envelope, typed

from p2pnode.config import Config, SchedulerSettings
from p2pnode.gossip import MembershipConfig
from p2pnode.jobs._control import JobControl
from p2pnode.node import MemoryStore, NodeCore, StopJob
from p2pnode.scheduler import parse_catalog
from p2pnode.snapshot import PlanJob

CATALOG = parse_catalog({"job": [
    {"name": "long", "kind": "selfplay", "config": "long", "argv": ["sleep", "30"], "env": ["PATH"]},
    # a job that ignores SIGTERM: its stop takes the SIGKILL after the grace period
    {"name": "stubborn", "kind": "selfplay", "config": "stubborn", "env": ["PATH"],
     "argv": ["sh", "-c", "trap '' TERM; sleep 30"]},
]})


def _control(tmp_path, grace_s: float) -> tuple[FakeContext, JobControl]:
    ctx = FakeContext(Config(scheduler=SchedulerSettings(interval_s=120.0, on_agent_stop="leave",
                                                         stop_grace_s=grace_s)),
                      data_dir=tmp_path, clock=trio.current_time)
    ctx.put(typed(envelope(ctx.identity, 1)), b"")
    core = NodeCore(ctx.node_id, config=MembershipConfig(), store=MemoryStore(), info=lambda n: None,
                    roll_candidates=list)
    return ctx, JobControl(ctx, core, CATALOG)


async def _until(pred, timeout=20):
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


def _killed(jc: JobControl) -> None:
    """The agent is gone (its tasks were cancelled): what it committed stays on disk, nothing else."""
    jc.runner.ledger.close()
    jc.history.close()


@contextlib.contextmanager
def _reaped(pids: list[int]):
    try:
        yield
    finally:
        for pid in pids:  # a failed test leaves no job behind
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


async def test_an_operator_stop_accepted_before_a_kill_is_carried_out_after_the_restart(tmp_path):
    pids: list[int] = []
    with _reaped(pids):
        ctx, jc = _control(tmp_path, 5.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(jc.runner.run)  # no driver loop: the stop is accepted, never carried out
            jc.start(PlanJob(job_id="1-1", node=ctx.node_id, template="long"), 1)
            jc.start(PlanJob(job_id="1-2", node=ctx.node_id, template="long"), 1)
            pids += [j.proc.pid for j in jc.runner.jobs.values()]
            assert jc.operator.stop_job("1-1")  # what the HTTP route answers 2xx on
            nursery.cancel_scope.cancel()
        assert jc.runner.jobs["1-1"].stopping is None and jc.core.table.state("1-1") == "starting"
        _killed(jc)

        ctx, jc = _control(tmp_path, 5.0)
        assert jc.operator.stop_intents == {"1-1"}  # read back from the ledger
        async with trio.open_nursery() as nursery:
            await nursery.start(jc.runner.run)
            await nursery.start(jc.drive)
            assert set(jc.runner.jobs) == {"1-1", "1-2"} and jc.runner.readopted == 2
            await _until(lambda: "1-1" not in jc.runner.jobs)  # the stop rules carried the intent out
            await _until(lambda: not jc.operator.stop_intents)
            assert jc.runner.ledger.query("SELECT count(*) FROM stop_intents") == [(0,)]  # removed once carried out
            assert "1-2" in jc.runner.jobs and jc.core.table.state("1-2") == "running"
            nursery.cancel_scope.cancel()
        r = jc.core.table.get("1-1")
        assert (r.state, r.rule, r.outcome) == ("ended", "operator", "stopped")
        assert {x["job_id"]: x["reason"] for x in jc.history.recent()}["1-1"] == "stopped by the operator"
        _killed(jc)


async def test_a_job_whose_operator_stop_was_kept_and_which_died_with_the_agent_ends_stopped(tmp_path):
    """Review of issue 39: the stop's intent was kept (the route answered) but the record was still running when the
    agent was killed, and the job died with it (its SIGTERM under way, say): restored, it ends ``stopped`` by the
    operator, not ``failed``."""
    pids: list[int] = []
    with _reaped(pids):
        ctx, jc = _control(tmp_path, 5.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(jc.runner.run)
            jc.start(PlanJob(job_id="1-1", node=ctx.node_id, template="long"), 1)
            pids += [j.proc.pid for j in jc.runner.jobs.values()]
            assert jc.operator.stop_job("1-1")
            nursery.cancel_scope.cancel()
        _killed(jc)
        os.killpg(pids[0], signal.SIGTERM)
        os.waitpid(pids[0], 0)  # (our child: reaped, so it is gone, not a zombie)
        await _until(lambda: not _alive(pids[0]))

        ctx, jc = _control(tmp_path, 5.0)
        async with trio.open_nursery() as nursery:
            await nursery.start(jc.runner.run)
            await nursery.start(jc.drive)
            await _until(lambda: jc.core.table.state("1-1") == "ended" and not jc.operator.stop_intents)
            nursery.cancel_scope.cancel()
        r = jc.core.table.get("1-1")
        assert (r.state, r.rule, r.outcome, r.reason) == ("ended", "operator", "stopped", "stopped by the operator")
        assert jc.runner.ledger.query("SELECT count(*) FROM stop_intents") == [(0,)]
        _killed(jc)


async def test_a_stop_under_way_at_the_kill_is_carried_out_again_with_its_rule(tmp_path):
    pids: list[int] = []
    with _reaped(pids):
        ctx, jc = _control(tmp_path, 60.0)  # the first agent never reaches its SIGKILL
        async with trio.open_nursery() as nursery:
            await nursery.start(jc.runner.run)
            await nursery.start(jc.drive)
            jc.start(PlanJob(job_id="1-1", node=ctx.node_id, template="stubborn"), 1)
            pids.append(jc.runner.jobs["1-1"].proc.pid)
            await _until(lambda: jc.core.table.state("1-1") == "running")
            jc.apply([StopJob("1-1", "maximum runtime reached", "max_runtime")])
            await _until(lambda: jc.runner.jobs["1-1"].termed)  # SIGTERM sent, ignored
            nursery.cancel_scope.cancel()
        assert jc.core.table.state("1-1") == "stopping"
        _killed(jc)

        ctx, jc = _control(tmp_path, 0.5)
        async with trio.open_nursery() as nursery:
            await nursery.start(jc.runner.run)
            assert jc.core.table.state("1-1") == "stopping" and jc.records.restored == 1
            await nursery.start(jc.drive)
            await _until(lambda: "1-1" not in jc.runner.jobs)  # stopped again: SIGTERM, then SIGKILL
            nursery.cancel_scope.cancel()
        r = jc.core.table.get("1-1")
        assert (r.state, r.rule, r.outcome, r.reason) == ("ended", "max_runtime", "stopped", "maximum runtime reached")
        row = jc.history.recent()[0]  # (no exit status: the SIGKILL took its wrapper, not our child, too)
        assert (row["job_id"], row["rule"], row["reason"], row["outcome"]) == (
            "1-1", "max_runtime", "maximum runtime reached", "stopped")
        _killed(jc)


AGENT_CATALOG = """
[[job]]
name = "work"
kind = "selfplay"
config = "c"
max_concurrency = 1
argv = ["sleep", "600"]
[job.resources]
num_cpus = 0.1
"""
AGENT_ENV = {"P2PNODE_GOSSIP_PROFILE": "local-test", "P2PNODE_SCHEDULER_INTERVAL_S": "1",
             "P2PNODE_CPU_MAX_PERCENT": "0", "P2PNODE_CPU_WARN_PERCENT": "100"}


def test_a_real_agent_killed_with_9_restores_its_table_and_re_adopts_the_job(tmp_path):
    """The whole agent: its job runs, ``kill -9``, restart: the job is re-adopted (same id and pid), its record
    was read back from the ledger (``running``, no transition error), and a clean stop then ends it."""
    cat = tmp_path / "catalog.toml"
    cat.write_text(AGENT_CATALOG)
    data = tmp_path / "n0"
    p = AgentProc(data, free_port(), "--no-mdns", "--catalog", str(cat), "--tag", "durable", "--tag", "voter",
                  env={**os.environ, **AGENT_ENV}).start()
    pid = None
    try:
        p.wait_ready()
        first = wait_until(lambda: p.get("/jobs")["running"], 60, what="a job running")[0]
        pid = first["pid"]
        records = tmp_path / "records.db"
        p.stop(signal.SIGKILL)
        os.kill(pid, 0)  # the job outlived its agent
        p.start()
        p.wait_ready()
        again = wait_until(lambda: p.get("/jobs")["running"], 30, what="the job re-adopted")[0]
        assert (again["job_id"], again["pid"]) == (first["job_id"], pid)
        jobs = p.get("/jobs")
        assert not jobs["transition_errors"], jobs["transition_errors"]
        assert "job table: 1 records restored from the ledger" in p.log.read_text()
        shutil.copy(data / "jobs" / "ledger.db", records)  # (a copy: the agent holds the file)
        for suffix in ("-wal", "-shm"):
            if (data / "jobs" / f"ledger.db{suffix}").exists():
                shutil.copy(data / "jobs" / f"ledger.db{suffix}", f"{records}{suffix}")
        con = sqlite3.connect(records)
        states = dict(con.execute("SELECT job_id, json_extract(record, '$.state') FROM job_records"))
        con.close()
        assert states.get(first["job_id"]) == "running", states
        assert p.stop() < 15 and p.proc.returncode == 0  # a clean stop ends the job (on_agent_stop = "stop")
        wait_until(lambda: not _alive(pid), 10, what="the job's end")
    finally:
        p.kill()
        if pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
