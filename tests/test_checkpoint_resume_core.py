"""The job core fetches a training's checkpoint before starting it (issue 41, item 2): a leader's placement of a
template with ``[job.checkpoint]`` is ``fetching`` (a :class:`FetchCheckpoint`, no :class:`StartJob`), held as this
node's while the driver decides (no second start, no second spawn token), started with ``resume_from`` once the
outcome is handed back (:attr:`JobInputs.resumes`), and withdrawn (:class:`CancelFetch`) when the plan drops it.
Virtual time, no process."""

from __future__ import annotations

from test_job_core import GRACE, drive, inputs, lead, local, member, of, pjob, plan_of

from p2pnode.node import CancelFetch, FetchCheckpoint, JobCore, LocalJob, StartJob
from p2pnode.node._plandist import part_version
from p2pnode.scheduler import parse_catalog
from p2pnode.snapshot import plan_ref

CATALOG = parse_catalog({
    "job": [
        {"name": "train", "kind": "training", "config": "c", "argv": ["x"], "max_concurrency": 1,
         "resources": {"num_gpus": 1, "vram_gib": 8}, "checkpoint": {"dir": "checkpoints/{config}"}},
        {"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"], "max_concurrency": 8,
         "resources": {"num_gpus": 1, "vram_gib": 8}},
    ],
})


def core(**kw) -> JobCore:
    args = {"interval_s": 5.0, "adopt_grace_s": GRACE, "spawns_per_minute": 600.0, "fetch_checkpoints": True}
    return JobCore("b", CATALOG, **(args | kw))


def on(job_id: str, gpu: int) -> LocalJob:
    return LocalJob(job_id, "sp", "selfplay", (gpu,), 1.0, 8.0, 0.0, 1)


def acting(c: JobCore, jobs, seq: int = 1):
    p = plan_of(1, seq, jobs)
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    return [member("b"), member("a", plan=p)]


def test_a_placed_training_is_fetching_first_then_started_with_its_checkpoint():
    c = core()
    ms = acting(c, [pjob("1-1", "b", "train"), pjob("1-2", "b", "sp", gpu=1)])
    out = drive(c, inputs(lead("a"), ms), 0.0)
    (f,) = of(out, FetchCheckpoint)
    assert (f.job.job_id, f.term, f.config) == ("1-1", 1, "c")
    assert [s.job.job_id for s in of(out, StartJob)] == ["1-2"]  # no checkpoint declared: at once
    assert c.table.state("1-1") == "fetching" and "1-1" not in c.ran
    # held while the driver fetches: acted on again (a new plan, the running jobs changed) it is neither started
    # nor asked again
    ms = acting(c, [pjob("1-1", "b", "train"), pjob("1-2", "b", "sp", gpu=1), pjob("1-3", "b", "sp", gpu=2)], 2)
    out = drive(c, inputs(lead("a"), ms, {"1-2": on("1-2", 1)}), 1.0)
    assert not of(out, FetchCheckpoint) and [s.job.job_id for s in of(out, StartJob)] == ["1-3"]
    assert c.table.state("1-1") == "fetching"
    # the outcome: started with the checkpoint's path
    running = {"1-2": on("1-2", 1), "1-3": on("1-3", 2)}
    out = drive(c, inputs(lead("a"), ms, running, resumes={"1-1": "/r/c/ckpt-7"}), 2.0)
    (s,) = of(out, StartJob)
    assert (s.job.job_id, s.resume_from) == ("1-1", "/r/c/ckpt-7")
    assert c.table.state("1-1") == "starting" and "1-1" in c.ran
    # started once: the outcome handed in again changes nothing
    assert not of(drive(c, inputs(lead("a"), ms, running, resumes={"1-1": "/r/c/ckpt-7"}), 3.0), StartJob)


def test_no_checkpoint_starts_from_nothing_and_a_dropped_placement_cancels_its_fetch():
    c = core()
    ms = acting(c, [pjob("1-1", "b", "train")])
    assert of(drive(c, inputs(lead("a"), ms), 0.0), FetchCheckpoint)
    (s,) = of(drive(c, inputs(lead("a"), ms, resumes={"1-1": ""}), 1.0), StartJob)
    assert s.resume_from == ""
    d = core()
    ms = acting(d, [pjob("1-1", "b", "train")])
    drive(d, inputs(lead("a"), ms), 0.0)
    ms = acting(d, [pjob("1-2", "b", "sp")], 2)  # the leader moved the training elsewhere
    out = drive(d, inputs(lead("a"), ms), 1.0)
    assert of(out, CancelFetch) == [CancelFetch("1-1")] and [s.job.job_id for s in of(out, StartJob)] == ["1-2"]
    assert d.table.state("1-1") == "unknown"
    # an outcome that arrives after the withdrawal starts nothing
    assert not of(drive(d, inputs(lead("a"), ms, {"1-2": local("1-2")}, resumes={"1-1": "/r"}), 2.0), StartJob)


def test_admission_is_checked_again_when_the_fetch_ends_and_autonomous_or_off_starts_at_once():
    c = core()
    ms = acting(c, [pjob("1-1", "b", "train")])
    drive(c, inputs(lead("a"), ms), 0.0)
    out = drive(c, inputs(lead("a"), ms, resumes={"1-1": "/r"}, fenced_refused="lease not held"), 1.0)
    assert not of(out, StartJob) and c.table.state("1-1") == "refused"
    off = core(fetch_checkpoints=False)  # the simulator's core: no fetch
    ms = acting(off, [pjob("1-1", "b", "train")])
    assert [s.resume_from for s in of(drive(off, inputs(lead("a"), ms), 0.0), StartJob)] == [""]
