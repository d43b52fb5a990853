"""A gang of a training with ``[job.checkpoint]`` resumes from its config's newest checkpoint (issue 41, items 2 and
4): every member of a newly placed gang fetches it before it starts (:class:`FetchCheckpoint`, each member for
itself, so every rank gets ``P2PNODE_RESUME_FROM``); a gang of a template without a checkpoint starts at once. The
gang's checkpoints are its rank-0 member's: a member of another rank announces none
(:func:`p2pnode.sync._checkpoints.checkpoint_writers`), and its placement proves none (refused ``not_training``).
Virtual time, no process."""

from __future__ import annotations

from types import SimpleNamespace

from test_checkpoints_core import _file, _refusal
from test_job_core import GRACE, drive, inputs, lead, member, of

from p2pnode.identity import Identity
from p2pnode.node import FetchCheckpoint, JobCore, StartJob
from p2pnode.node._ckproof import gang_writer, placement_prover, trains
from p2pnode.node._plandist import part_version, seal_part
from p2pnode.scheduler import CheckpointSpec, parse_catalog
from p2pnode.snapshot import GangSlot, JobReport, PlanJob, PlanSection, plan_digest, plan_ref
from p2pnode.sync._checkpoints import checkpoint_writers
from p2pnode.synccore import (
    AssignmentBook,
    CheckpointBody,
    CheckpointRef,
    CheckpointTrust,
    newest_checkpoint,
    sign_checkpoint,
)

CATALOG = parse_catalog({
    "job": [
        {"name": "ddp", "kind": "training", "config": "c", "engine": "process", "argv": ["x"],
         "gang": {"members": 2}, "resources": {"num_gpus": 1, "vram_gib": 8},
         "checkpoint": {"dir": "checkpoints/{config}"}},
        {"name": "ddp-plain", "kind": "training", "config": "d", "engine": "process", "argv": ["x"],
         "gang": {"members": 2}, "resources": {"num_gpus": 1, "vram_gib": 8}},
    ],
})


def slot(gid: str, rank: int, size: int = 2, min_size: int = 0) -> GangSlot:
    return GangSlot(id=gid, rank=rank, size=size, master="10.0.0.1", master_port=29400, port_base=29400 + 64 * rank,
                    ports=64, engine="process", min_size=min_size)


def gjob(job_id: str, template: str, gang: GangSlot, gpu: int = 0, node: str = "b") -> PlanJob:
    return PlanJob(job_id=job_id, node=node, template=template, gpus=[gpu], gpu_fraction=1.0, vram_gib=8.0, term=1,
                   gang=gang)


def acting(c: JobCore, jobs: list[PlanJob]):
    p = PlanSection(term=1, seq=1, digest=plan_digest(jobs, []), at=0.0, assignments=jobs)
    c.fetched(("part", "a"), part_version(plan_ref(p)), p)
    return [member("b"), member("a", plan=p)]


def test_every_member_of_a_checkpointing_gang_fetches_first_and_a_plain_gang_starts_at_once():
    c = JobCore("b", CATALOG, interval_s=5.0, adopt_grace_s=GRACE, spawns_per_minute=600.0, fetch_checkpoints=True)
    # b holds rank 0 of gang 1-1 (its rank 1 is elsewhere), rank 1 of gang 1-5, rank 1 of a plain gang, and a
    # member given back to a running elastic gang (rank 2 of 2:3)
    ms = acting(c, [gjob("1-1", "ddp", slot("1-1", 0)), gjob("1-6", "ddp", slot("1-5", 1), gpu=1),
                    gjob("1-8", "ddp-plain", slot("1-7", 1), gpu=2), gjob("1-12", "ddp", slot("1-9", 2, 3, 2), gpu=3)])
    out = drive(c, inputs(lead("a"), ms), 0.0)
    assert sorted((f.job.job_id, f.config, f.job.gang.rank) for f in of(out, FetchCheckpoint)) == \
        [("1-1", "c", 0), ("1-12", "c", 2), ("1-6", "c", 1)]
    assert [s.job.job_id for s in of(out, StartJob)] == ["1-8"]
    assert c.table.state("1-1") == c.table.state("1-6") == "fetching"
    # each member starts with its own outcome: the same checkpoint's path on every rank
    out = drive(c, inputs(lead("a"), ms, resumes={"1-1": "/r/c/step-9", "1-6": "/r/c/step-9", "1-12": ""}), 1.0)
    assert sorted((s.job.job_id, s.resume_from) for s in of(out, StartJob)) == \
        [("1-1", "/r/c/step-9"), ("1-12", ""), ("1-6", "/r/c/step-9")]
    assert {s.job.gang.id for s in of(out, StartJob)} == {"1-1", "1-5", "1-9"}
    # off (the simulator's core): the gang starts at once
    off = JobCore("b", CATALOG, interval_s=5.0, adopt_grace_s=GRACE, spawns_per_minute=600.0)
    ms = acting(off, [gjob("1-1", "ddp", slot("1-1", 0))])
    assert [s.resume_from for s in of(drive(off, inputs(lead("a"), ms), 0.0), StartJob)] == [""]


def test_only_the_rank_0_member_of_a_gang_announces_its_checkpoints():
    def report(job_id: str, gang: GangSlot | None) -> JobReport:
        return JobReport(job_id=job_id, template="ddp", config="c", gang=gang)

    running = [report("3-1", slot("3-1", 0, 3, 2)), report("3-2", slot("3-1", 1, 3, 2)),
               report("3-4", slot("3-1", 2, 3, 2)), report("3-9", None)]
    assert checkpoint_writers(running) == [("3-1", "c"), ("3-9", "c")]
    assert gang_writer(None) and gang_writer(slot("1-1", 0)) and not gang_writer(slot("1-1", 1))


def test_a_checkpoint_of_a_gang_member_above_rank_0_is_never_accepted():
    """A rank-1 member's node signs its checkpoint dir's entry with its own genuine placement proof (a later
    placement seq than rank 0's): it must not become the config's newest; rank 0's is."""
    leader, rank0, rank1 = (Identity.generate() for _ in range(3))
    keys = {n.node_id: n.public_key for n in (rank0, rank1)}
    catalog = {"ddp": SimpleNamespace(config="c", fenced=True, checkpoint=CheckpointSpec("ck"))}
    prove = placement_prover({4: leader.public_key}.get, lambda t: catalog[t].config if t in catalog else None,
                             lambda t: t in catalog and trains(catalog[t]))
    trust = CheckpointTrust(AssignmentBook(), keys.get, prove=prove)

    def signed(who: Identity, job_id: str, gang: GangSlot, seq: int):
        part = PlanSection(term=4, seq=3, node=who.node_id,
                           assignments=[PlanJob(job_id=job_id, node=who.node_id, template="ddp", gang=gang)])
        body = CheckpointBody("c", job_id, seq, who.node_id, "ck", f"step-{seq}", (_file(),))
        return sign_checkpoint(who.sign, body, seal_part(leader, part)), body

    good = signed(rank0, "4-1", slot("4-1", 0), 2)
    assert trust.accept(*good)
    evil = signed(rank1, "4-2", slot("4-1", 1), 7)
    assert _refusal(trust, *evil) == "not_training"
    # an elastic gang's member that joined later (a higher placement seq) proves nothing either
    assert _refusal(trust, *signed(rank1, "4-5", slot("4-1", 2, 3, 2), 1)) == "not_training"
    assert trust.refused["not_training"] == 2
    refs = {rank0.node_id: [CheckpointRef("c", "4-1", 2, rank0.node_id, good[0].digest)],
            rank1.node_id: [CheckpointRef("c", "4-2", 7, rank1.node_id, evil[0].digest)]}
    newest = newest_checkpoint("c", refs, trust)
    assert newest is not None and newest.body.origin == rank0.node_id


def test_two_members_of_a_gang_on_one_node_fetch_the_checkpoint_once(tmp_path):
    """``strict_pack`` or a multi-GPU node: both members of a gang are this node's. Their decisions run one at a time
    (one ``.partial`` folder per digest); the second resumes from the copy the first fetched."""
    import trio
    from test_checkpoint_resume_driver import Board, body, driver, job, run_with, until

    async def scenario(n):
        transfers = []

        async def fetch(newest, dest, progress):
            transfers.append(newest.body.name)
            await trio.sleep(5)  # a transfer that takes a while: the other member's decision waits for it
            (dest / newest.body.name).write_bytes(b"x" * 10)
            return dest / newest.body.name

        r, _ = driver(tmp_path, Board(body(1), body(2)), fetch)
        await n.start(r.run)
        r.apply(job("4-1"))
        r.apply(job("4-2"))
        await until(lambda: {"4-1", "4-2"} <= set(r.results), "both decided")
        assert r.results["4-1"] == r.results["4-2"] == str(tmp_path / "resume" / "c" / "step-2")
        assert transfers == ["step-2"] and (r.counts["resumed"], r.counts["shared"]) == (1, 1)
        assert not r._locks  # the config's lock goes with its last decision

    run_with(tmp_path, scenario)


def test_a_member_fetching_its_checkpoint_is_reported_so_the_leaders_gang_table_keeps_the_gang(tmp_path):
    """While a member fetches, its node reports it in its running list with its gang slot (no pid): the leader's
    gang table counts it as started, however long the fetch takes, and never ends the gang for it."""
    from p2pnode.jobs._ckresume import CheckpointResume
    from p2pnode.node._gangevents import GangMember, Placed
    from p2pnode.node._gangs import GangTable, observe
    from p2pnode.scheduler._planview import RunningJob

    c = JobCore("b", CATALOG, interval_s=5.0, adopt_grace_s=GRACE, spawns_per_minute=600.0, fetch_checkpoints=True)
    ms = acting(c, [gjob("1-6", "ddp", slot("1-5", 1))])
    assert of(drive(c, inputs(lead("a"), ms), 0.0), FetchCheckpoint) and c.table.state("1-6") == "fetching"
    r = CheckpointResume(node_id="b", data_dir=tmp_path, news=lambda: None, observe=lambda ev, now: None,
                         now=lambda: 0.0)
    (rep,) = r.reports(c.table, CATALOG)
    assert (rep.job_id, rep.config, rep.pid, rep.gang) == ("1-6", "c", None, slot("1-5", 1))
    t = GangTable(grace_s=30.0)
    t.apply(Placed("1-5", "ddp", 2, (GangMember(0, "1-5", "a"), GangMember(1, "1-6", "b"))), 0.0)
    rank0 = RunningJob("1-5", "ddp", "a", (0,), 1.0, 8.0, 0.0, 1, None, slot("1-5", 0))
    fetching = RunningJob(rep.job_id, rep.template, "b", tuple(rep.gpus), rep.gpu_fraction, rep.vram_gib, 0.0,
                          rep.term, None, rep.gang)
    for now in (1.0, 600.0, 3600.0):  # a long fetch
        observe(t, (rank0, fetching), {"1-5", "1-6"}, set(), set(), set(), now)
        assert t.state("1-5") == "running", t.get("1-5")
