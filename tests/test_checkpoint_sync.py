"""Checkpoints between in-process nodes (issue 41): the real sync services of an ephemeral and a durable node
(the harness of ``tests/test_sync_inprocess.py``: real files, hashes, signatures and pushes through httpx
transports, snapshots through the typed decoder). The ephemeral node's training writes checkpoints; they reach the
durable node as replicas; the durable node fetches the signed checkpoint from its origin, holds it whole and lists
it; a third node that trusts the plan's placement (by the proof the checkpoint carries) finds the newest one and
its holder, and refuses one the plan did not place."""

from __future__ import annotations

import os

import httpx
import pytest
from test_sync_inprocess import Router, link, make_node, run_pass

from p2pnode._files import open_beneath
from p2pnode.identity import Identity
from p2pnode.node._ckproof import placement_prover
from p2pnode.node._plandist import seal_part
from p2pnode.snapshot import (
    SCHEMA_VERSION,
    JobReport,
    JobsSection,
    PlanJob,
    PlanSection,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
)
from p2pnode.synccore import (
    AssignmentBook,
    CheckpointRefused,
    CheckpointTrust,
    FetchCheckpoint,
    StartNow,
    decode_signed_checkpoint,
    hash_file,
    newest_checkpoint,
    resume_from,
)

DIR = "ck/hex8_2p"


class CheckpointRouter(Router):
    """The harness's router, plus ``GET /sync/checkpoint`` and ``/sync/checkpoint/file`` (what the routes call)."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.file_reads: list[str] = []

    async def handle_async_request(self, request):
        if request.url.path == "/sync/checkpoint":
            node = self.nodes[request.url.host]
            data = node.sync.checkpoint_bytes(bytes.fromhex(request.url.params["digest"]))
            return httpx.Response(404 if data is None else 200, content=data or b"")
        if request.url.path == "/sync/checkpoint/file":  # what the route streams: the file from the offset on
            self.file_reads.append(request.url.host)
            node = self.nodes[request.url.host]
            p = request.url.params
            found = node.sync.checkpoint_file(bytes.fromhex(p["digest"]), int(p["file"]))
            if found is None:
                return httpx.Response(404)
            base, rel, size, block_size = found
            if p.get("part") == "hashes":
                return httpx.Response(200, content=hash_file(base / rel, block_size=block_size).hashes)
            with os.fdopen(open_beneath(base, rel, size=size), "rb") as fh:
                fh.seek(int(p["offset"]))
                return httpx.Response(200, content=fh.read(size - int(p["offset"])))
        return await super().handle_async_request(request)


def knows_leader(node, leader: Identity, term: int = 5) -> None:
    """``node`` saw ``leader`` elected in ``term`` (its key from its snapshot) and has the catalog's ``train``
    template of hex8_2p (a training with a checkpoint): what its checkpoint trust needs to check a proof."""
    node.ctx.put(decode_snapshot(encode_snapshot(Snapshot(schema=SCHEMA_VERSION, origin=leader.node_id, version=1,
                                                          addr="leader:80", tags=[], leaving=False))),
                 leader.public_key)
    board = node.sync.checkpoint_board
    board.leader_of_term = {term: leader.node_id}.get
    board.config_of_template = {"train": "hex8_2p"}.get
    board.trains_template = {"train"}.__contains__


def runs(node, job_id: str) -> None:
    """``node``'s own snapshot says it runs ``job_id`` of hex8_2p (what its job control publishes)."""
    snap = Snapshot(schema=SCHEMA_VERSION, origin=node.node_id, version=1000, addr=node.addr, tags=[node.tag],
                    leaving=False, jobs=JobsSection(running=[JobReport(job_id=job_id, template="train",
                                                                        config="hex8_2p")]))
    node.ctx.put(decode_snapshot(encode_snapshot(snap)), node.identity.public_key)


def write_checkpoint(node, name: str, data: bytes) -> None:
    d = node.sync.root / DIR
    d.mkdir(parents=True, exist_ok=True)
    (d / f".{name}.tmp").write_bytes(data)
    os.replace(d / f".{name}.tmp", d / name)


async def test_a_checkpoint_reaches_a_durable_holder_and_a_third_node_trusts_only_the_placement(tmp_path):
    eph = make_node(tmp_path, "eph", "ephemeral")
    d = make_node(tmp_path, "d0", "durable")
    link(eph, d)
    link(d, eph)
    router = CheckpointRouter([eph, d])
    leader = Identity.generate()
    eph.sync.set_checkpoint_globs((("hex8_2p", f"{DIR}/**"),))
    proof = seal_part(leader, PlanSection(term=5, seq=2, node=eph.node_id,
                                          assignments=[PlanJob(job_id="5-1", node=eph.node_id, template="train")]))
    eph.sync.checkpoints.proof_of = {"5-1": proof}.get
    runs(eph, "5-1")
    write_checkpoint(eph, "step-100.pt", os.urandom(300_000))
    write_checkpoint(eph, "step-200.pt", os.urandom(200_000))
    # settle_s is 0 in the harness: a pass pushes the files, the checkpoint pass after it announces them
    for _ in range(2):
        await run_pass(eph, [d], router)
        await eph.sync._checkpoint_pass()
    refs = eph.sync.section().checkpoints
    assert sorted(r.seq for r in refs) == [1, 2] and {r.origin for r in refs} == {eph.node_id}
    link(d, eph)
    knows_leader(d, leader)
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        d.ctx.client = client
        assert await d.sync.checkpoint_holder.pass_once()
    held = d.sync.section().checkpoints
    assert sorted(r.digest for r in held) == sorted(r.digest for r in refs)  # the durable node holds both whole
    # d restarts: who led term 5 is not known yet, so nothing is held, but nothing is removed either; once the
    # leader is known again, the next pass holds both (review H4: a holder's checkpoints are trusted ones)
    from p2pnode.sync._checkpoints import CheckpointHolder

    leaders: dict[int, bytes] = {}
    again = CheckpointHolder(d.ctx, d.sync.store, d.sync.checkpoint_holder.dir.parent, timeout_s=1.0,
                             trust=CheckpointTrust(AssignmentBook(), {eph.node_id: eph.identity.public_key}.get,
                                                   prove=placement_prover(leaders.get, {"train": "hex8_2p"}.get,
                                                                          {"train"}.__contains__)))
    again.load()
    assert again.book.held == {} and len(again.pending) == 2 and len(list(again.dir.glob("*.ck"))) == 2
    leaders[5] = leader.public_key
    d.ctx.members = lambda live=True: []  # (no member lists anything: only what was held before is offered)
    assert await again.pass_once()
    assert sorted(again.book.held) == sorted(r.digest for r in refs) and again.pending == {}
    # a third node: it never saw eph's plan part; it trusts the placement the leader of term 5 signed
    trust = CheckpointTrust(AssignmentBook(), {eph.node_id: eph.identity.public_key}.get,
                            prove=placement_prover({5: leader.public_key}.get, {"train": "hex8_2p"}.get,
                                                   {"train"}.__contains__))
    for r in held:
        sc, body = decode_signed_checkpoint(d.sync.checkpoint_bytes(r.digest))
        assert trust.accept(sc, body)
    published = {d.node_id: held}  # eph is gone: only the durable node's list is left
    newest = newest_checkpoint("hex8_2p", published, trust)
    assert newest.body.seq == 2 and newest.body.name == "step-200.pt" and newest.holders == (d.node_id,)
    got = resume_from("hex8_2p", published, trust, me="third", free_bytes=10**9)
    assert got.need_bytes == 200_000
    # the replicas the fetch will read are where the signed body says
    for f in newest.body.files:
        replica = d.data_dir / "replicas" / eph.node_id / newest.body.path_of(f)
        assert replica.stat().st_size == f.size
    # a checkpoint signed by eph for a job the plan did not give it: held bytes or not, never trusted
    other = CheckpointTrust(AssignmentBook(), {eph.node_id: eph.identity.public_key}.get,
                            prove=placement_prover({5: Identity.generate().public_key}.get, {"train": "hex8_2p"}.get,
                                                   {"train"}.__contains__))
    sc, body = decode_signed_checkpoint(d.sync.checkpoint_bytes(newest.digest))
    with pytest.raises(CheckpointRefused) as exc:
        other.accept(sc, body)
    assert exc.value.reason == "unknown_placement"
    assert newest_checkpoint("hex8_2p", published, other) is None and isinstance(
        resume_from("hex8_2p", published, other, me="third"), StartNow)



async def test_a_checkpoint_listed_before_its_files_arrive_is_held_at_the_next_pass(tmp_path):
    """The origin lists a checkpoint as soon as it signs it, usually before its files are replicas on the durable
    node (``incomplete``): the holder keeps the fetched signed checkpoint and offers it again at its next pass (one
    runs when a replica is committed), without fetching it again and without the 30 s backoff (issue 41: a node
    holding its stop for this confirmation waited for its next checkpoint)."""
    eph = make_node(tmp_path, "eph", "ephemeral")
    d = make_node(tmp_path, "d0", "durable")
    link(eph, d)
    link(d, eph)
    router = CheckpointRouter([eph, d])
    gets: list[str] = []
    handle = router.handle_async_request

    async def counting(request):
        if request.url.path == "/sync/checkpoint":
            gets.append(request.url.params["digest"])
        return await handle(request)

    router.handle_async_request = counting
    leader = Identity.generate()
    eph.sync.set_checkpoint_globs((("hex8_2p", f"{DIR}/**"),))
    proof = seal_part(leader, PlanSection(term=5, seq=2, node=eph.node_id,
                                          assignments=[PlanJob(job_id="5-1", node=eph.node_id, template="train")]))
    eph.sync.checkpoints.proof_of = {"5-1": proof}.get
    runs(eph, "5-1")
    write_checkpoint(eph, "step-100.pt", os.urandom(100_000))
    for _ in range(2):
        await run_pass(eph, [d], router)
        await eph.sync._checkpoint_pass()
    (ref,) = eph.sync.section().checkpoints
    link(d, eph)
    knows_leader(d, leader)
    holder = d.sync.checkpoint_holder
    here = holder.replica
    holder.replica = lambda origin, path: None  # the files are still on their way
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        d.ctx.client = client
        assert not await holder.pass_once()
        assert list(holder.waiting) == [ref.digest] and holder.book.held == {} and gets == [ref.digest.hex()]
        holder.replica = here  # committed
        assert await holder.pass_once()
    assert list(holder.book.held) == [ref.digest] and holder.waiting == {}
    assert gets == [ref.digest.hex()]  # not fetched again
    assert (holder.dir / f"{ref.digest.hex()}.ck").exists()
    assert [r.digest for r in d.sync.section().checkpoints] == [ref.digest]


def _waiting(holder, origin, n, first=0):
    """``n`` checkpoints of ``origin`` waiting for their files (stand-ins: what ``CheckpointHolder._wait`` reads)."""
    from types import SimpleNamespace

    for i in range(first, first + n):
        sc = SimpleNamespace(digest=f"{origin}-{i}".encode())
        holder._wait(sc, SimpleNamespace(origin=origin, dir="ck/c", name=f"step-{i}"), None)


def test_only_a_commit_of_a_waiting_checkpoints_file_wakes_the_checkpoint_pass(tmp_path):
    """Review M4: a commit wakes the checkpoint pass only when a checkpoint waiting for its files has the committed
    path (before: every commit from any origin, with nothing waiting, started a full pass)."""
    d = make_node(tmp_path, "d0", "durable")
    d.sync.inbound.committed("someone", ("data/x.bin",))
    assert not d.sync._checkpoints_wanted.is_set()  # nothing waits
    _waiting(d.sync.checkpoint_holder, "eph", 1)
    d.sync.inbound.committed("eph", ("data/x.bin", "ck/c/step-9"))
    d.sync.inbound.committed("other", ("ck/c/step-0/model.pt",))
    assert not d.sync._checkpoints_wanted.is_set()  # not a file of the waiting one
    d.sync.inbound.committed("eph", ("ck/c/step-0/shard/model.pt",))
    assert d.sync._checkpoints_wanted.is_set()
    d.sync._checkpoints_wanted = type(d.sync._checkpoints_wanted)()
    d.sync.inbound.committed("eph", ("ck/c/step-0",))  # a checkpoint of one file: the entry itself
    assert d.sync._checkpoints_wanted.is_set()


def test_one_origin_fills_at_most_its_share_of_the_waiting_checkpoints(tmp_path):
    """Review M4: :attr:`CheckpointHolder.waiting` takes at most ``MAX_WAITING_PER_ORIGIN`` of one origin (before:
    one origin could fill all 64 and turn the fix off for the others); its index follows it."""
    from p2pnode.sync._checkpoints import MAX_WAITING_PER_ORIGIN

    holder = make_node(tmp_path, "d0", "durable").sync.checkpoint_holder
    _waiting(holder, "busy", 64)
    _waiting(holder, "quiet", 1)
    assert len(holder.waiting) == MAX_WAITING_PER_ORIGIN + 1 and holder.awaits("quiet", "ck/c/step-0/a")
    for digest in list(holder.waiting):
        holder._unwait(digest)
    assert not holder.awaits("quiet", "ck/c/step-0/a") and holder._waiting_at == {} and holder._waiting_of == {}


async def test_checkpoint_passes_woken_by_a_burst_of_commits_are_spaced(tmp_path, autojump_clock):
    """Review M4: a burst of commits (one every 10 ms for 1 s, each of a waiting checkpoint's file) runs a pass at
    most every ``CHECKPOINT_PASS_GAP_S`` (before: about one per commit, each a full scan on the trio thread)."""
    import trio

    from p2pnode.sync._servicecheckpoints import CHECKPOINT_PASS_GAP_S

    d = make_node(tmp_path, "d0", "durable")
    holder, starts = d.sync.checkpoint_holder, []

    async def pass_once():
        starts.append(trio.current_time())
        return False

    async def nothing():
        return None

    holder.pass_once, d.sync.checkpoint_board.pass_once = pass_once, nothing
    _waiting(holder, "eph", 1)
    async with trio.open_nursery() as n:
        n.start_soon(d.sync._checkpoints_loop)
        while not starts:
            await trio.sleep(0.01)
        for _ in range(100):
            d.sync.inbound.committed("eph", ("ck/c/step-0/model.pt",))
            await trio.sleep(0.01)
        n.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert 3 <= len(gaps) <= 1.0 / CHECKPOINT_PASS_GAP_S + 1 and min(gaps) >= CHECKPOINT_PASS_GAP_S - 1e-9


async def test_every_node_learns_the_newest_trusted_checkpoint_and_its_holders(tmp_path):
    eph = make_node(tmp_path, "eph", "ephemeral")
    d = make_node(tmp_path, "d0", "durable")
    t = make_node(tmp_path, "t", "ephemeral")  # the node the next plan gives the training
    link(eph, d)
    link(d, eph)
    router = CheckpointRouter([eph, d])
    leader = Identity.generate()
    eph.sync.set_checkpoint_globs((("hex8_2p", f"{DIR}/**"),))
    eph.sync.checkpoints.proof_of = {"5-1": seal_part(leader, PlanSection(
        term=5, seq=2, node=eph.node_id, assignments=[PlanJob(job_id="5-1", node=eph.node_id, template="train")]))}.get
    runs(eph, "5-1")
    write_checkpoint(eph, "step-100.pt", os.urandom(100_000))
    for _ in range(2):
        await run_pass(eph, [d], router)
        await eph.sync._checkpoint_pass()
    link(d, eph)
    knows_leader(d, leader)
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        d.ctx.client = client
        assert await d.sync.checkpoint_holder.pass_once()
        # t knows the leader of term 5 (its key from its snapshot) and the durable node; eph is gone
        t.ctx.put(decode_snapshot(encode_snapshot(Snapshot(schema=SCHEMA_VERSION, origin=leader.node_id, version=1,
                                                           addr="leader:80", tags=[], leaving=False))),
                  leader.public_key)
        link(t, d)
        t.ctx.put(decode_snapshot(encode_snapshot(Snapshot(schema=SCHEMA_VERSION, origin=eph.node_id, version=999,
                                                           addr=eph.addr, tags=["ephemeral"], leaving=False))),
                  eph.identity.public_key)  # its last snapshot, without its checkpoints (it was preempted)
        board = t.sync.checkpoint_board
        board.config_of_template = {"train": "hex8_2p"}.get
        board.trains_template = {"train"}.__contains__
        t.ctx.client = client
        assert await board.pass_once() == 0  # who led term 5 is not known here yet: nothing trusted
        assert board.trust.refused == {"unknown_placement": 1} and board.view()["newest"] == {}
        board.leader_of_term = {5: leader.node_id}.get
        assert await board.pass_once() == 0  # refused a moment ago: asked again after the backoff
        t.ctx._clock = lambda: 31.0  # (the harness's context: time 0.0 unless given a clock)
        assert await board.pass_once() == 1
    view = board.view()["newest"]["hex8_2p"]
    assert (view["job_id"], view["seq"], view["name"], view["holders"]) == ("5-1", 1, "step-100.pt", [d.node_id])
    assert isinstance(resume_from("hex8_2p", board.refs_by_member(), board.trust, me=t.node_id), FetchCheckpoint)
    assert "checkpoints" in t.sync.status_view()


async def test_the_newest_checkpoint_is_fetched_from_its_holders_verified_resumed_and_a_bad_replica_refused(tmp_path):
    from p2pnode.sync._ckfetch import CheckpointFetch

    eph = make_node(tmp_path, "eph", "ephemeral", replication_factor=2)
    d0, d1 = make_node(tmp_path, "d0", "durable"), make_node(tmp_path, "d1", "durable")
    for d in (d0, d1):
        link(eph, d)
        link(d, eph)
    router = CheckpointRouter([eph, d0, d1])
    eph.sync.set_checkpoint_globs((("hex8_2p", f"{DIR}/**"),))
    leader = Identity.generate()
    eph.sync.checkpoints.proof_of = {"5-1": seal_part(leader, PlanSection(
        term=5, seq=2, node=eph.node_id, assignments=[PlanJob(job_id="5-1", node=eph.node_id, template="train")]))}.get
    for d in (d0, d1):
        knows_leader(d, leader)
    runs(eph, "5-1")
    model, optim = os.urandom(700_000), os.urandom(90_000)
    step = eph.sync.root / DIR / "step-7"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(model)
    (step / "optim.safetensors").write_bytes(optim)
    (step / ".complete").write_bytes(b"")
    for _ in range(2):
        await run_pass(eph, [d0, d1], router)
        await eph.sync._checkpoint_pass()
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        for d in (d0, d1):
            link(d, eph)
            d.ctx.client = client
            assert await d.sync.checkpoint_holder.pass_once()
        (ref,) = d0.sync.section().checkpoints
        sc, body = decode_signed_checkpoint(d0.sync.checkpoint_bytes(ref.digest))
        # d0's replica of the model rots after it was held; the fetch must refuse it and read d1's
        rotten = d0.data_dir / "replicas" / eph.node_id / body.path_of(body.files[0])
        data = bytearray(rotten.read_bytes())
        data[500_000] ^= 0xFF  # (past what the earlier, cut-short fetch already has)
        rotten.write_bytes(bytes(data))
        t = make_node(tmp_path, "t", "ephemeral")
        link(t, d0)
        link(t, d1)
        t.ctx.client = client
        from p2pnode.synccore import NewestCheckpoint

        newest = NewestCheckpoint(ref.digest, body, (d0.node_id, d1.node_id))
        dest = t.sync.root / "resume"
        # a fetch cut short before: half of the model file is already here
        partial = dest / ".partial" / ref.digest.hex()
        partial.mkdir(parents=True)
        (partial / "0").write_bytes(model[:300_000])
        seen = []
        fetch = CheckpointFetch(t.ctx, newest, dest, timeout_s=10.0, progress=lambda done, total: seen.append(done))
        path = await fetch.run()
    assert path == dest / "step-7" and (path / ".complete").exists()
    assert (path / "model.safetensors").read_bytes() == model and (path / "optim.safetensors").read_bytes() == optim
    # d0's block hashes of its rotten model do not match the signed root: refused when it is tried (holders are
    # tried in random order), and the model read from d1
    assert fetch.refused in ({}, {"bad_hashes": 1})
    assert seen[-1] == len(model) + len(optim) and seen == sorted(seen)
    # resumed: the whole blocks of the half-fetched file verified, only the rest read, and the optimizer
    kept = 300_000 // body.files[0].block_size * body.files[0].block_size
    assert fetch.bytes_fetched == (len(model) - kept) + len(optim)
    assert not (dest / ".partial" / ref.digest.hex()).exists()
