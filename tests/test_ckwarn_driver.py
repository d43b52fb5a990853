"""The warning before a stop (issue 41, item 3) with real processes through the real driver
(:class:`p2pnode.jobs._control.JobControl`): a drain sends the template's checkpoint signal first and stops the job
once it wrote a new checkpoint (by atomic rename); a clean agent stop whose job writes none stops it at the
template's ``grace_s``. Waits are on conditions with deadlines, never fixed sleeps."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import trio
from helpers import FakeContext, envelope, typed

from p2pnode.config import Config, SchedulerSettings
from p2pnode.gossip import MembershipConfig
from p2pnode.identity import Identity
from p2pnode.jobs._control import JobControl
from p2pnode.node import MemoryStore, NodeCore
from p2pnode.node._ckwarn import OwnCheckpoint
from p2pnode.scheduler import parse_catalog
from p2pnode.snapshot import PlanJob

# SIGUSR1: write ckpt-2.pt by tmp file + rename, note the time; SIGTERM: note the time, exit
SCRIPT = """import os, pathlib, signal, sys, time
d, log = os.environ["P2PNODE_CHECKPOINT_DIR"], sys.argv[1]
def note(w):
    with open(log, "a") as f: f.write(f"{w} {time.time()}\\n")
def usr1(*a):
    if sys.argv[2] in ("write", "slowterm"):
        time.sleep(0.3)  # a save takes a while
        pathlib.Path(d, "ckpt-2.pt.tmp").write_bytes(b"x" * 1000)
        os.rename(os.path.join(d, "ckpt-2.pt.tmp"), os.path.join(d, "ckpt-2.pt"))
    note("U")
def term(*a):
    note("T")
    if sys.argv[2] == "slowterm":
        time.sleep(3.0)  # a slow exit, within the stop grace
    sys.exit(0)
signal.signal(signal.SIGUSR1, usr1)
signal.signal(signal.SIGTERM, term)
pathlib.Path(d, "ckpt-1.pt").write_bytes(b"old")
note("R")
while True: time.sleep(0.05)
"""


def _control(tmp_path, mode, grace_s):
    log, script = tmp_path / "log", tmp_path / "job.py"
    script.write_text(SCRIPT)
    ctx = FakeContext(Config(scheduler=SchedulerSettings(interval_s=120.0)), data_dir=tmp_path,
                      clock=trio.current_time)
    ctx.put(typed(envelope(ctx.identity, 1)), b"")
    core = NodeCore(ctx.node_id, config=MembershipConfig(), store=MemoryStore(), info=lambda n: None,
                    roll_candidates=list)
    cat = parse_catalog({"job": [{"name": "ck", "kind": "training", "config": "c", "env": ["PATH"],
                                  "preemptible": True, "argv": [sys.executable, str(script), str(log), mode],
                                  "checkpoint": {"dir": "ck/{config}", "signal": "SIGUSR1", "grace_s": grace_s}}]})
    return ctx, JobControl(ctx, core, cat), log


async def _until(pred, timeout=30):
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


def _events(log):
    return [(w, float(t)) for w, t in (line.split() for line in log.read_text().splitlines())]


async def test_a_drain_waits_for_the_checkpoint_the_signal_asked_for(tmp_path):
    ctx, jc, log = _control(tmp_path, "write", 60)
    asked = []
    execute = jc.apply
    jc.apply = lambda effects: (asked.extend(type(e).__name__ for e in effects), execute(effects))
    jc.stops.execute = jc.apply
    async with trio.open_nursery() as nursery:
        await nursery.start(jc.runner.run)
        await nursery.start(jc.drive)
        jc.start(PlanJob(job_id="1-1", node=ctx.node_id, template="ck"), 1)
        await _until(lambda: log.exists() and "R" in log.read_text())
        ckdir = jc.runner.jobs["1-1"].checkpoint_dir
        jc.operator.intents.drain(0.0, time.time())
        jc.news()
        await _until(lambda: "1-1" not in jc.runner.jobs)
        nursery.cancel_scope.cancel()
    ev = dict(_events(log))
    assert set(ev) == {"R", "U", "T"}
    assert ev["U"] <= ev["T"]  # the stop came after the checkpoint was written
    assert sorted(p.name for p in Path(ckdir).iterdir()) == ["ckpt-1.pt", "ckpt-2.pt"]
    assert jc.stops.warnings.counts == {"signalled": 1, "confirmed": 0, "local": 1, "deadline": 0}
    row = jc.history.recent()[0]
    assert (row["job_id"], row["reason"], row["exit_status"]) == ("1-1", "node drained by the operator: deadline "
                                                                   "passed", 0)
    assert jc.core.table.get("1-1").rule == "drain"


async def test_an_agent_stop_waits_grace_s_at_most_for_a_checkpoint_that_never_comes(tmp_path):
    ctx, jc, log = _control(tmp_path, "ignore", 1)
    async with trio.open_nursery() as nursery:
        await nursery.start(jc.runner.run)
        jc.start(PlanJob(job_id="1-1", node=ctx.node_id, template="ck"), 1)
        await _until(lambda: log.exists() and "R" in log.read_text())
        t0 = time.time()
        await jc.shutdown()
        nursery.cancel_scope.cancel()
    ev = dict(_events(log))
    assert set(ev) == {"R", "U", "T"}
    assert ev["T"] - t0 >= 1.0 - 0.05  # held to the grace (1 s), then the normal stop
    assert jc.stops.warnings.counts == {"signalled": 1, "confirmed": 0, "local": 0, "deadline": 1}
    row = jc.history.recent()[0]
    assert (row["reason"], row["exit_status"]) == ("stopped: agent shutdown", 0)


async def test_a_drain_waits_for_a_durable_replica_of_the_new_checkpoint(tmp_path):
    """With a durable member in the cluster, the new local checkpoint is not enough: the stop is released once
    that member's signed snapshot lists this node's ref of it (same config, job, seq and digest)."""
    ctx, jc, log = _control(tmp_path, "write", 60)
    durable, digest = Identity.generate(), bytes(range(16))
    ctx.put(typed(envelope(durable, 1, tags=["durable"])), b"")
    jc.stops.replicas.own = lambda: [OwnCheckpoint("c", "1-1", 2, digest, "ckpt-2.pt")]  # sync signed it
    async with trio.open_nursery() as nursery:
        await nursery.start(jc.runner.run)
        await nursery.start(jc.drive)
        jc.start(PlanJob(job_id="1-1", node=ctx.node_id, template="ck"), 1)
        await _until(lambda: log.exists() and "R" in log.read_text())
        jc.operator.intents.drain(0.0, time.time())
        jc.news()
        await _until(lambda: "ckpt-2.pt" in getattr(jc.stops.warnings.held.get("1-1"), "fresh", ()))
        assert "1-1" in jc.runner.jobs and "T" not in log.read_text()  # written here, no replica yet: held
        ref = {"config": "c", "job_id": "1-1", "seq": 2, "origin": ctx.node_id, "digest": digest}
        ctx.put(typed(envelope(durable, 2, tags=["durable"], sync={"checkpoints": [ref]})), b"")
        await _until(lambda: "1-1" not in jc.runner.jobs)
        nursery.cancel_scope.cancel()
    ev = dict(_events(log))
    assert ev["U"] <= ev["T"]
    assert jc.stops.warnings.counts == {"signalled": 1, "confirmed": 1, "local": 0, "deadline": 0}



async def test_an_agent_stop_holds_past_the_old_1_8_s_bound_for_a_slow_durable_replica(tmp_path):
    """A clean agent stop (issue 41): :meth:`StopDriver.begin_close` bounds the hold by the job's ``grace_s`` (not
    the CLI's old 1.8 s) and marks the node gone soon; the durable member's confirmation, 2.5 s after the stop
    began (a slow replica), still releases the job's stop, which then runs."""
    ctx, jc, log = _control(tmp_path, "write", 60)
    durable, digest = Identity.generate(), bytes(range(16))
    ctx.put(typed(envelope(durable, 1, tags=["durable"])), b"")
    jc.stops.replicas.own = lambda: [OwnCheckpoint("c", "1-1", 2, digest, "ckpt-2.pt")]  # sync signed it
    closed = trio.Event()

    async def close():
        await jc.shutdown()
        closed.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(jc.runner.run)
        await nursery.start(jc.drive)
        jc.start(PlanJob(job_id="1-1", node=ctx.node_id, template="ck"), 1)
        await _until(lambda: log.exists() and "R" in log.read_text())
        t0 = trio.current_time()
        assert not jc.stops.noticed
        until = jc.stops.begin_close(t0, 1000.0, 1.8, 60.0)
        assert until == t0 + 60  # the template's grace_s
        assert jc.stops.noticed and jc.stops.notice_fields() == {"notice_deadline_ms": int((1000.0 + 61.8) * 1000),
                                                                 "notice_reason": "agent stop"}
        nursery.start_soon(close)
        await _until(lambda: "ckpt-2.pt" in getattr(jc.stops.warnings.held.get("1-1"), "fresh", ()))
        await trio.sleep_until(t0 + 2.5)  # the replica is slow: it confirms 2.5 s after the stop began
        assert "1-1" in jc.runner.jobs and "T" not in log.read_text() and not closed.is_set()  # still held
        ref = {"config": "c", "job_id": "1-1", "seq": 2, "origin": ctx.node_id, "digest": digest}
        ctx.put(typed(envelope(durable, 2, tags=["durable"], sync={"checkpoints": [ref]})), b"")
        await _until(closed.is_set)
        nursery.cancel_scope.cancel()
    ev = dict(_events(log))
    assert ev["U"] <= ev["T"]
    assert jc.stops.warnings.counts == {"signalled": 1, "confirmed": 1, "local": 0, "deadline": 0}
    row = jc.history.recent()[0]
    assert (row["reason"], row["exit_status"]) == ("stopped: agent shutdown", 0)


async def test_a_second_signal_releases_the_held_stop_at_once(tmp_path):
    ctx, jc, log = _control(tmp_path, "ignore", 60)
    closed = trio.Event()

    async def close():
        await jc.shutdown()
        closed.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(jc.runner.run)
        jc.start(PlanJob(job_id="1-1", node=ctx.node_id, template="ck"), 1)
        await _until(lambda: log.exists() and "R" in log.read_text())
        jc.stops.begin_close(trio.current_time(), 1000.0, 1.8, 60.0)
        nursery.start_soon(close)
        await _until(lambda: "1-1" in jc.stops.warnings.held)
        jc.stops.cut(trio.current_time())  # the second signal
        await _until(closed.is_set)
        nursery.cancel_scope.cancel()
    assert set(dict(_events(log))) == {"R", "U", "T"}
    assert jc.stops.warnings.counts == {"signalled": 1, "confirmed": 0, "local": 0, "deadline": 1}


def test_own_checkpoints_names_each_signed_ref_by_its_announced_entry():
    from types import SimpleNamespace

    from p2pnode.jobs._ckconfirm import own_checkpoints
    from p2pnode.snapshot import CheckpointRef

    me = Identity.generate().node_id
    refs = [CheckpointRef("c", "1-1", 2, me, b"\x02" * 16), CheckpointRef("c", "1-1", 1, me, b"\x01" * 16),
            CheckpointRef("d", "1-2", 1, me, b"\x03" * 16)]  # d's entry is not announced (an older state file)
    origin = SimpleNamespace(refs=refs, announced={("c", "ck/c"): {"a.pt": ("1-1", 1), "b.pt": ("1-1", 2)}})
    assert own_checkpoints(origin) == [OwnCheckpoint("c", "1-1", 2, b"\x02" * 16, "b.pt"),
                                       OwnCheckpoint("c", "1-1", 1, b"\x01" * 16, "a.pt")]


def test_the_driver_reads_the_replicas_before_it_judges_a_listing(tmp_path):
    """The first listing after a stop is held already sees the new entry: it must be judged against the members'
    news of now (a durable member: wait for its replica), not the empty news before any (release at once)."""
    from types import SimpleNamespace

    from p2pnode.jobs._stops import StopDriver
    from p2pnode.node import StopJob
    from p2pnode.node._ckwarn import Replica, ReplicaNews, SignalJob

    (tmp_path / "old.pt").write_bytes(b"x")
    ck = SimpleNamespace(signal="SIGUSR1", grace_s=60.0)
    job = SimpleNamespace(checkpoint_dir=str(tmp_path), ended=False, template=SimpleNamespace(checkpoint=ck))
    done: list = []
    digest = b"\x05" * 16
    news = ReplicaNews(1, (OwnCheckpoint("c", "1-1", 2, digest, "new.pt"),))
    drv = StopDriver(SimpleNamespace(jobs={"1-1": job}, grace_s=1.0), done.extend, replicas=lambda: news)
    stop = StopJob("1-1", "drained", "drain")
    assert drv.gate([stop], 0.0) == [SignalJob("1-1", "SIGUSR1", "drain")]
    (tmp_path / "new.pt").write_bytes(b"y")
    drv.release(0.5)
    assert done == [] and "1-1" in drv.warnings.held  # written here, no durable replica yet
    news = ReplicaNews(1, news.own, (Replica("d", "c", "1-1", 2, digest),))
    drv.release(1.0)
    assert done == [stop] and drv.warnings.counts["confirmed"] == 1


async def test_hold_out_wakes_when_its_held_stop_is_released_elsewhere(autojump_clock):
    """Review M2: :meth:`StopDriver.hold_out` sleeps until the next listing or held deadline, and returns as soon as
    the held stop is released elsewhere (here a second signal, :meth:`StopDriver.cut`), not at its next 0.5 s poll."""
    from types import SimpleNamespace

    from p2pnode.jobs._stops import StopDriver
    from p2pnode.node import StopJob
    from p2pnode.node._ckwarn import WarnSpec

    done = []
    stops = StopDriver(SimpleNamespace(jobs={}, grace_s=1.0), done.extend)
    t0 = trio.current_time()
    stops.warnings.stop(StopJob("1-1", "stopped: agent shutdown", "agent_stop"), WarnSpec("SIGUSR1", 60.0), t0)
    assert "1-1" in stops.warnings.held

    async def second_signal():
        await trio.sleep(0.2)
        stops.cut(trio.current_time())

    async with trio.open_nursery() as n:
        n.start_soon(second_signal)
        await stops.hold_out(trio.current_time)
        returned = trio.current_time() - t0
    assert [e.job_id for e in done] == ["1-1"] and returned == 0.2  # before: 0.5, the next poll


async def test_an_agent_stop_leaves_after_a_job_slow_to_exit_within_its_bound(tmp_path):
    """Review M2: the deadline :meth:`p2pnode.agent.Agent.stop` returns (where the CLI cancels what is left) covers
    the jobs' exit after the hold (``scheduler.stop_grace_s``), so the leave still runs after a job that takes 3 s
    to exit on SIGTERM (before: the holds' bound + 1.8 s, and the final ``leaving`` snapshot was never published)."""
    from p2pnode.agent import Agent
    from p2pnode.config import load_config

    log, script = tmp_path / "log", tmp_path / "job.py"
    script.write_text(SCRIPT)
    (tmp_path / "catalog.toml").write_text(
        f'[[job]]\nname = "ck"\nkind = "training"\nconfig = "c"\nenv = ["PATH"]\n'
        f'argv = ["{sys.executable}", "{script}", "{log}", "slowterm"]\nmax_concurrency = 1\n'
        f'[job.resources]\nnum_gpus = 1\nvram_gib = 8\n'
        f'[job.checkpoint]\ndir = "ck/{{config}}"\nsignal = "SIGUSR1"\ngrace_s = 1\n')
    agent = Agent(load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0, "catalog": str(tmp_path / "catalog.toml"),
                  "fake_gpus": "1xA100", "sample_interval_s": 0.3},
        "discovery": {"mdns": False}, "scheduler": {"interval_s": 1.0, "max_close_hold_s": 0.8}}))
    async with trio.open_nursery() as n:
        await n.start(agent.run)
        await _until(lambda: log.exists() and "R" in log.read_text(), 60)
        t0 = trio.current_time()
        deadline = agent.stop()
        n.cancel_scope.deadline = deadline  # as the CLI does
    assert set(dict(_events(log))) == {"R", "U", "T"}
    assert agent.core.leaving  # the final snapshot was published: the leave ran
    row = agent.jobs.history.recent()[0]
    assert (row["reason"], row["exit_status"]) == ("stopped: agent shutdown", 0)
    tail = agent.config.scheduler.stop_grace_s + 5.0 + agent.config.gossip.leave_timeout_s + 0.8
    assert agent.close_tail_s() == tail  # the jobs' exit (SIGKILL and its wait), then the leave
    assert t0 + 0.8 + tail <= deadline <= t0 + 0.8 + tail + 0.5  # the hold: the node's max_close_hold_s
