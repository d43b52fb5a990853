"""Distribution between in-process nodes: a durable node publishes a file, subscribers fetch it block by block from
any holder (the real services, signatures, files and hashes), wired through an httpx transport (no sockets).

Snapshots travel by direct hand-over through the typed snapshot decoder, as gossip would carry them; a gossip task
re-links every node every 20 ms while the test waits, with a deadline, for the outcome it asserts.
"""

from __future__ import annotations

import os

import httpx
import pytest
import trio
from helpers import FakeContext

from p2pnode.config import load_config
from p2pnode.identity import Identity
from p2pnode.snapshot import SCHEMA_VERSION, Snapshot, decode_snapshot, encode_snapshot
from p2pnode.sync import SyncService
from p2pnode.sync._distribute import BLOCKS_PATH, LIST_PATH, PUBLICATION_PATH
from p2pnode.synccore import block_size_for, hash_file, publisher_text, sign_publication

BS = 128 * 1024


class Node:
    def __init__(self, tmp_path, name, tags, identity=None, **sync):
        cfg = load_config(None, env={}, overrides={
            "agent": {"data_dir": tmp_path / name, "port": 0, "tags": tuple(tags)},
            "discovery": {"mdns": False},
            "sync": {"interval_s": 0.05, "settle_s": 0.0, "data_port": -1, **sync},
        })
        self.ctx = FakeContext(cfg, identity)
        self.sync = SyncService(self.ctx)
        self.dist = self.sync.distributor
        self.addr = f"{name}:80"
        self.name = name
        self.tags = list(tags)
        self.version = 0

    def snapshot(self) -> Snapshot:
        self.version += 1
        snap = Snapshot(schema=SCHEMA_VERSION, origin=self.ctx.node_id, version=self.version, addr=self.addr,
                        tags=self.tags, leaving=False, sync=self.sync.section())
        return decode_snapshot(encode_snapshot(snap))


def gossip(nodes) -> None:
    snaps = {n.name: n.snapshot() for n in nodes}
    for a in nodes:
        for b in nodes:
            if a is not b:
                a.ctx.put(snaps[b.name], b.ctx.identity.public_key)


async def body_of(reply) -> bytes:
    """A reply's bytes: msgpack as it is, a blocks stream read to its end (which closes it)."""
    if isinstance(reply, bytes):
        return reply
    return b"".join([piece async for piece in reply.chunks()])


class Router(httpx.AsyncBaseTransport):
    """Routes requests by host to the nodes' distribution routes; counts block bytes served per host."""

    def __init__(self, nodes):
        self.nodes = {n.name: n for n in nodes}
        self.block_bytes: dict[str, int] = {}

    async def handle_async_request(self, request):
        node = self.nodes[request.url.host]
        body = await request.aread()
        assert request.url.path in (PUBLICATION_PATH, BLOCKS_PATH, LIST_PATH)
        headers = {k.lower(): v for k, v in request.headers.items()}
        status, reply = await node.sync.serve_distribution(request.url.path, headers, body)
        reply = await body_of(reply)
        if request.url.path == BLOCKS_PATH and status == 200:
            self.block_bytes[node.name] = self.block_bytes.get(node.name, 0) + len(reply)
        return httpx.Response(status, content=reply)


def make_publication(op: Identity, path, name, version, to="training"):
    m = hash_file(path, block_size=block_size_for(os.path.getsize(path)))
    return sign_publication(op.sign, op.public_key, name, version, m, to)


async def wait_for(cond, nodes, timeout_s=8.0) -> None:
    with trio.fail_after(timeout_s):
        while not cond():
            gossip(nodes)
            await trio.sleep(0.02)


@pytest.fixture
def swarm(tmp_path):
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    # the publisher serves 1 MiB/s: subscribers get most blocks from each other
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned, publish_max_bytes_per_s=2**20,
                    publish_serve_streams=1)
    subs = [Node(tmp_path, f"s{i}", ["training"], publishers=pinned) for i in range(3)]
    unpinned = Node(tmp_path, "nopin", ["training"])
    other_tag = Node(tmp_path, "other", ["selfplay"], publishers=pinned)
    nodes = [pub_node, *subs, unpinned, other_tag]
    return op, pub_node, subs, unpinned, other_tag, nodes, tmp_path


async def test_publish_reaches_every_subscriber_and_peers_serve_each_other(swarm) -> None:
    op, pub_node, subs, unpinned, other_tag, nodes, tmp = swarm
    data = os.urandom(40 * BS + 777)
    src = tmp / "model.safetensors"
    src.write_bytes(data)
    router = Router(nodes)
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client, trio.open_nursery() as n:
        for node in nodes:
            node.ctx.client = client
            n.start_soon(node.dist.run)
        await wait_for(lambda: all(nd.dist.files.state_dir.joinpath("files").exists() for nd in nodes), nodes)
        await pub_node.dist.publish(src, make_publication(op, src, "model.safetensors", 1))
        await wait_for(lambda: all(("MODEL_UPDATED" in [e[0] for e in s.ctx.events]) for s in subs), nodes)
        # every subscriber sees the verified version at <subscribe_dir>/<name>
        for s in subs:
            link = s.dist.files.subscribe_dir / "model.safetensors"
            assert link.is_symlink() and link.read_bytes() == data
            assert link.stat().st_mode & 0o777 == 0o444  # read-only: no job changes it for the others
            (ev,) = [p for e, p in s.ctx.events if e == "MODEL_UPDATED"]
            assert ev["version"] == 1 and ev["name"] == "model.safetensors"
        # at least one subscriber fetched blocks from another subscriber, not only the publisher
        from_peers = {s.name: {h: b for h, b in s.dist.bytes_fetched.items() if h != pub_node.ctx.node_id}
                      for s in subs}
        assert any(from_peers.values()), from_peers
        print("block bytes served per node", router.block_bytes, "file", len(data))
        assert router.block_bytes.get("pub", 0) < 3 * len(data), router.block_bytes
        # an unpinned subscriber fetches nothing and counts why; a node of another tag does not even ask
        await wait_for(lambda: unpinned.dist.book.refused.get("unpinned", 0) >= 1, nodes)
        assert "nopin" not in router.block_bytes and unpinned.dist.bytes_fetched == {}
        assert not (unpinned.dist.files.subscribe_dir / "model.safetensors").exists()
        assert other_tag.dist.bytes_fetched == {} and not other_tag.dist.book.refused

        # a new version replaces the old one atomically; the old file goes once no job pins it
        data2 = os.urandom(12 * BS)
        src.write_bytes(data2)
        await pub_node.dist.publish(src, make_publication(op, src, "model.safetensors", 2))
        await wait_for(lambda: all(s.dist.updated == 2 for s in subs), nodes)
        for s in subs:
            assert (s.dist.files.subscribe_dir / "model.safetensors").read_bytes() == data2
        await wait_for(lambda: not any((s.dist.files.subscribe_dir / ".versions" / "model.safetensors@1").exists()
                                       for s in subs), nodes)
        # the floor is persisted: a restarted subscriber refuses the old signed publication
        view = subs[0].sync.status_view()["distribution"]
        (f,) = view["files"]
        assert f["version"] == 2 and f["state"] == "held" and f["blocks_held"] == f["blocks"]
        n.cancel_scope.cancel()
    again = Node(tmp, "s0", ["training"], publishers=[publisher_text(op.public_key)])
    again.dist.load()
    assert again.dist.book.floors == {"model.safetensors": 2}
    from p2pnode.synccore import PublicationRefused

    with pytest.raises(PublicationRefused) as ei:
        again.dist.book.accept(make_publication(op, src, "model.safetensors", 1))
    assert ei.value.reason == "stale_version"


async def test_blocks_served_only_to_members_and_only_accepted_roots(swarm, tmp_path) -> None:
    op, pub_node, subs, *_ , nodes, tmp = swarm
    src = tmp / "m.bin"
    src.write_bytes(os.urandom(3 * BS))
    pub_node.dist.load()
    pub = make_publication(op, src, "m.bin", 1)
    await pub_node.dist.publish(src, pub)
    import msgspec

    from p2pnode.sync import sign_headers

    body = msgspec.msgpack.encode({"root": pub.root, "indices": [0]})
    stranger = Identity.generate()
    status, _ = await pub_node.sync.serve_distribution(BLOCKS_PATH, sign_headers(stranger, "POST", BLOCKS_PATH, body),
                                                       body)
    assert status == 403 and pub_node.dist.serve_refused == {"not_member": 1}
    gossip(nodes)
    s = subs[0]
    status, reply = await pub_node.sync.serve_distribution(BLOCKS_PATH, sign_headers(s.ctx.identity, "POST",
                                                                                     BLOCKS_PATH, body), body)
    assert status == 200 and await body_of(reply) == src.read_bytes()[:BS]
    bad = msgspec.msgpack.encode({"root": b"x" * 32, "indices": [0]})
    status, _ = await pub_node.sync.serve_distribution(BLOCKS_PATH, sign_headers(s.ctx.identity, "POST",
                                                                                 BLOCKS_PATH, bad), bad)
    assert status == 404
    # a tampered body under a valid header signature
    status, _ = await pub_node.sync.serve_distribution(BLOCKS_PATH, sign_headers(s.ctx.identity, "POST",
                                                                                 BLOCKS_PATH, body), bad)
    assert status == 401
    assert pub_node.dist.serve_refused == {"not_member": 1, "unknown_root": 1, "bad_signature": 1}


async def test_a_subscriber_stopped_mid_fetch_resumes_from_its_verified_blocks(tmp_path) -> None:
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned, publish_max_bytes_per_s=2**20,
                    publish_serve_streams=1)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    data = os.urandom(24 * BS)
    src = tmp_path / "ckpt.safetensors"
    src.write_bytes(data)
    nodes = [pub_node, sub]
    router = Router(nodes)
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client, trio.open_nursery() as n:
        for node in nodes:
            node.ctx.client = client
        n.start_soon(pub_node.dist.run)
        stop = trio.CancelScope()

        async def run_sub():
            with stop:
                await sub.dist.run()

        n.start_soon(run_sub)
        await wait_for(lambda: pub_node.dist.files.state_dir.joinpath("files").exists(), nodes)
        await pub_node.dist.publish(src, make_publication(op, src, "ckpt.safetensors", 1))
        await wait_for(lambda: (p := sub.dist.plans.get("ckpt.safetensors")) is not None and len(p.have) >= 6, nodes)
        stop.cancel()  # the agent stops mid-fetch (its partial file and state stay on disk)
        await wait_for(lambda: stop.cancelled_caught, nodes)
        had = len(sub.dist.plans["ckpt.safetensors"].have)
        assert 6 <= had < 24 and sub.dist.files.partial_path(sub.dist.holdings["ckpt.safetensors"].pub).exists()

        again = Node(tmp_path, "s0", ["training"], identity=sub.ctx.identity, publishers=pinned)
        again.addr = sub.addr
        again.version = sub.version
        again.ctx.client = client
        nodes[1] = again
        router.nodes["s0"] = again
        n.start_soon(again.dist.run)
        await wait_for(lambda: again.dist.updated == 1, nodes)
        assert (again.dist.files.subscribe_dir / "ckpt.safetensors").read_bytes() == data
        assert sum(again.dist.bytes_fetched.values()) <= (24 - had) * BS  # the verified blocks were not fetched again
        n.cancel_scope.cancel()


async def test_a_publish_folder_goes_out_signed_with_the_node_key(tmp_path) -> None:
    folder = tmp_path / "outbox"
    folder.mkdir()
    pub_node = Node(tmp_path, "pub", ["durable"], publish=str(folder), publish_to="training")
    sub = Node(tmp_path, "s0", ["training"], publishers=[publisher_text(pub_node.ctx.identity.public_key)])
    other = Node(tmp_path, "s1", ["training"], publishers=[publisher_text(Identity.generate().public_key)])
    nodes = [pub_node, sub, other]
    data = os.urandom(5 * BS + 3)
    (folder / "best.safetensors").write_bytes(data)
    (folder / ".hidden").write_bytes(b"x")
    async with httpx.AsyncClient(transport=Router(nodes), base_url="http://x") as client, trio.open_nursery() as n:
        for node in nodes:
            node.ctx.client = client
            n.start_soon(node.dist.run)
        await wait_for(lambda: sub.dist.updated == 1, nodes)
        assert (sub.dist.files.subscribe_dir / "best.safetensors").read_bytes() == data
        (ev,) = [p for e, p in sub.ctx.events if e == "MODEL_UPDATED"]
        assert ev["publisher"] == publisher_text(pub_node.ctx.identity.public_key)
        await wait_for(lambda: other.dist.book.refused.get("unpinned", 0) >= 1, nodes)
        assert [h.pub.name for h in pub_node.dist.holdings.values()] == ["best.safetensors"]
        n.cancel_scope.cancel()


async def test_a_hostile_member_listing_bad_names_and_old_versions_changes_nothing(tmp_path) -> None:
    """A member lists a publication named ``../evil`` (validly signed by the pinned key) and a replayed older
    version of a file the subscriber holds: the first is refused (``bad_name``) and never gets a path, the second is
    never fetched, and the subscriber's current version stays."""
    import msgspec

    from p2pnode.identity import verify_signature
    from p2pnode.sync._distfiles import Holding
    from p2pnode.synccore import publication_signing_bytes

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    evil = Node(tmp_path, "evil", ["durable"], publishers=pinned)
    nodes = [pub_node, sub, evil]
    src = tmp_path / "model.bin"
    old = os.urandom(2 * BS)
    src.write_bytes(old)
    v1 = make_publication(op, src, "model.bin", 1)
    old_copy = tmp_path / "old.bin"
    old_copy.write_bytes(old)
    new = os.urandom(3 * BS)
    src.write_bytes(new)
    v2 = make_publication(op, src, "model.bin", 2)
    # "../evil" signed by the pinned key itself (sign_publication refuses such a name: sign by hand)
    good = make_publication(op, src, "x", 9)
    bad = msgspec.structs.replace(good, name="../evil", sig=op.sign(publication_signing_bytes("../evil", 9, good.root,
                                                                                             good.to)))
    assert verify_signature(op.public_key, bad.sig, publication_signing_bytes("../evil", 9, bad.root, bad.to))
    async with httpx.AsyncClient(transport=Router(nodes), base_url="http://x") as client, trio.open_nursery() as n:
        for node in nodes:
            node.ctx.client = client
            n.start_soon(node.dist.run)
        await wait_for(lambda: all(nd.dist.files.state_dir.joinpath("files").exists() for nd in nodes), nodes)
        await pub_node.dist.publish(src, v2)
        await wait_for(lambda: sub.dist.updated == 1, nodes)
        # the hostile member now lists the replayed v1 (it holds the bytes) and the "../evil" publication
        evil.dist.holdings["model.bin"] = Holding(v1, old_copy, None, origin=True)
        evil.dist.holdings["../evil"] = Holding(bad, src, None, origin=True)
        await wait_for(lambda: sub.dist.book.refused.get("bad_name", 0) >= 1, nodes)
        seen = sub.dist.passes
        await wait_for(lambda: sub.dist.passes >= seen + 3, nodes)  # three more passes: nothing else happens
        assert sub.dist.updated == 1 and sub.dist.book.floors == {"model.bin": 2}
        assert (sub.dist.files.subscribe_dir / "model.bin").read_bytes() == new
        assert evil.ctx.node_id not in sub.dist.bytes_fetched
        assert not list(sub.dist.files.state_dir.joinpath("partial").iterdir())
        assert not (tmp_path / "s0" / "evil").exists() and not (sub.dist.files.subscribe_dir.parent / "evil").exists()
        n.cancel_scope.cancel()


async def test_the_previous_version_stays_while_a_job_started_under_it_runs(tmp_path) -> None:
    import time as _time

    from p2pnode.snapshot import JobReport, JobsSection

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    nodes = [pub_node, sub]
    src = tmp_path / "m.bin"
    jobs: list[JobReport] = []

    def own_snapshot() -> None:  # what the node core would publish: this node's running jobs
        snap = sub.snapshot()
        snap = Snapshot(schema=SCHEMA_VERSION, origin=snap.origin, version=snap.version, addr=snap.addr,
                        tags=snap.tags, leaving=False, sync=snap.sync, jobs=JobsSection(running=list(jobs)))
        sub.ctx.put(decode_snapshot(encode_snapshot(snap)), sub.ctx.identity.public_key)

    versions = sub.dist.files.subscribe_dir / ".versions"
    async with httpx.AsyncClient(transport=Router(nodes), base_url="http://x") as client, trio.open_nursery() as n:
        for node in nodes:
            node.ctx.client = client
            n.start_soon(node.dist.run)
        await wait_for(lambda: all(nd.dist.files.state_dir.joinpath("files").exists() for nd in nodes), nodes)
        for version in (1, 2):
            src.write_bytes(os.urandom(2 * BS))
            await pub_node.dist.publish(src, make_publication(op, src, "m.bin", version))
            await wait_for(lambda v=version: sub.dist.updated == v, nodes)
            if version == 1:  # a job starts while v1 is current
                jobs.append(JobReport(job_id="selfplay-1", template="selfplay", started_at=_time.time()))
                own_snapshot()
        seen = sub.dist.passes
        await wait_for(lambda: (own_snapshot(), sub.dist.passes >= seen + 3)[1], nodes)
        assert (versions / "m.bin@1").exists()  # the job started under v1 still runs: v1 stays
        assert (sub.dist.files.subscribe_dir / "m.bin").read_bytes() == src.read_bytes()
        jobs.clear()  # it ended
        await wait_for(lambda: (own_snapshot(), not (versions / "m.bin@1").exists())[1], nodes)
        assert (versions / "m.bin@2").exists()
        n.cancel_scope.cancel()


async def test_after_a_restart_old_versions_and_stale_partial_files_go(tmp_path) -> None:
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    node = Node(tmp_path, "s0", ["training"], publishers=pinned)
    node.dist.load()
    files = node.dist.files
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(BS + 1))
    v2 = make_publication(op, src, "m.bin", 2)
    (files.subscribe_dir / ".versions" / "m.bin@1").write_bytes(b"old")
    (files.subscribe_dir / ".versions" / "m.bin@2").write_bytes(src.read_bytes())
    files.switch(v2)
    (files.state_dir / "partial" / "other@3.part").write_bytes(b"x")
    files.save_state({"m.bin": 2}, [v2])
    again = Node(tmp_path, "s0", ["training"], identity=node.ctx.identity, publishers=pinned)
    again.dist.load()
    assert again.dist.keeper.previous.keys() == {("m.bin", 1)} and again.dist.book.floors == {"m.bin": 2}
    assert not (files.state_dir / "partial" / "other@3.part").exists()
    await again.dist.pass_once()  # no job runs: the old version goes, the current one stays
    assert not (files.subscribe_dir / ".versions" / "m.bin@1").exists()
    assert (files.subscribe_dir / "m.bin").read_bytes() == src.read_bytes()


def _own_jobs(node, reports) -> None:
    """Put this node's own snapshot with ``reports`` as its running jobs (inline up to INLINE_RUNNING)."""
    from p2pnode.snapshot import SCHEMA_VERSION, Snapshot, decode_snapshot, encode_snapshot, jobs_section

    snap = node.snapshot()
    snap = Snapshot(schema=SCHEMA_VERSION, origin=snap.origin, version=snap.version, addr=snap.addr,
                    tags=snap.tags, leaving=False, sync=snap.sync, jobs=jobs_section(list(reports)))
    node.ctx.put(decode_snapshot(encode_snapshot(snap)), node.ctx.identity.public_key)


async def test_a_version_current_before_a_restart_stays_while_a_job_started_under_it_runs(tmp_path) -> None:
    """Review H1: the version switched in before an agent restart counts as current since before the restart, so
    the job re-adopted after it (started under that version) keeps it when the next version lands."""
    import time

    from p2pnode.snapshot import JobReport

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    node = Node(tmp_path, "s0", ["training"], publishers=pinned)
    node.dist.load()
    f = node.dist.files
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(BS + 1))
    v2 = make_publication(op, src, "m.bin", 2)
    (f.subscribe_dir / ".versions" / "m.bin@2").write_bytes(src.read_bytes())
    f.switch(v2)
    f.save_state({"m.bin": 2}, [v2])
    job_start = time.time() - 100
    again = Node(tmp_path, "s0", ["training"], identity=node.ctx.identity, publishers=pinned)
    again.dist.load()
    assert again.dist.book.current["m.bin"].version == 2
    src.write_bytes(os.urandom(BS + 2))
    v3 = make_publication(op, src, "m.bin", 3)
    (f.subscribe_dir / ".versions" / "m.bin@3").write_bytes(src.read_bytes())
    f.switch(v3)
    again.dist.keeper.switched("m.bin", 3, time.time())
    _own_jobs(again, [JobReport(job_id="selfplay-1", template="selfplay", started_at=job_start)])
    await again.dist.pass_once()
    assert (f.subscribe_dir / ".versions" / "m.bin@2").exists()
    _own_jobs(again, [])
    await again.dist.pass_once()
    assert not (f.subscribe_dir / ".versions" / "m.bin@2").exists()  # the job ended: it goes


async def test_no_version_is_removed_while_the_running_list_is_not_inline(tmp_path) -> None:
    """Review H2: beyond INLINE_RUNNING jobs the own snapshot lists none (the list travels by digest); removing
    versions then would judge by no jobs at all, so nothing is removed until the list is whole again."""
    import time

    from p2pnode.snapshot import INLINE_RUNNING, JobReport

    node = Node(tmp_path, "s1", ["training"], publishers=[publisher_text(Identity.generate().public_key)])
    node.dist.load()
    f = node.dist.files
    t0 = time.time()
    node.dist.keeper.switched("m.bin", 1, t0 - 50)
    (f.subscribe_dir / ".versions" / "m.bin@1").write_bytes(b"v1")
    (f.subscribe_dir / ".versions" / "m.bin@2").write_bytes(b"v2")
    node.dist.keeper.switched("m.bin", 2, t0)
    jobs = [JobReport(job_id=f"sp-{i}", template="selfplay", started_at=t0 - 10) for i in range(INLINE_RUNNING + 1)]
    _own_jobs(node, jobs)
    await node.dist.pass_once()
    assert (f.subscribe_dir / ".versions" / "m.bin@1").exists()
    _own_jobs(node, [])
    await node.dist.pass_once()
    assert not (f.subscribe_dir / ".versions" / "m.bin@1").exists()


async def test_a_publisher_key_removed_before_a_restart_is_obeyed_no_longer(tmp_path) -> None:
    """Review H4: publications read back at start pass today's checks: one whose key is no longer in
    ``sync.publishers`` is neither current, held, served nor resumed, and the refusal is counted."""
    op = Identity.generate()
    node = Node(tmp_path, "s0", ["training"], publishers=[publisher_text(op.public_key)])
    node.dist.load()
    f = node.dist.files
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(BS + 1))
    v1 = make_publication(op, src, "m.bin", 1)
    (f.subscribe_dir / ".versions" / "m.bin@1").write_bytes(src.read_bytes())
    f.switch(v1)
    f.save_state({"m.bin": 1}, [v1])
    other = publisher_text(Identity.generate().public_key)
    again = Node(tmp_path, "s0", ["training"], identity=node.ctx.identity, publishers=[other])
    again.dist.load()
    assert "m.bin" not in again.dist.book.current and "m.bin" not in again.dist.holdings
    assert again.dist.book.refused["unpinned"] == 1
    assert again.dist.book.floors["m.bin"] == 1  # the floor stays: v1 is never taken again from anyone


# -- review findings (hostile review of issue 40) -----------------------------------------------------------------
async def _serving(nodes, router=None):
    """An httpx client over ``router`` (or a new Router) handed to every node."""
    router = router or Router(nodes)
    client = httpx.AsyncClient(transport=router, base_url="http://x")
    for node in nodes:
        node.ctx.client = client
    return client


async def test_more_than_one_page_of_publications_all_reach_a_subscriber(tmp_path) -> None:
    """Review M3: the snapshot lists 64 publications; the rest are paged from ``POST /sync/dist/list``, so every
    one of 70 small published files is discovered and fetched."""
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    nodes = [pub_node, sub]
    pub_node.dist.load()
    data = {}
    for i in range(70):
        src = tmp_path / f"f{i:03d}.bin"
        data[src.name] = os.urandom(100 + i)
        src.write_bytes(data[src.name])
        await pub_node.dist.publish(src, make_publication(op, src, src.name, 1))
    sec = pub_node.sync.section()
    assert len(sec.published) == 64 and sec.published_total == 70 and sec.published_digest
    async with await _serving(nodes), trio.open_nursery() as n:
        for node in nodes:
            n.start_soon(node.dist.run)
        await wait_for(lambda: sub.dist.updated == 70, nodes, timeout_s=30)
        for name, raw in data.items():
            assert (sub.dist.files.subscribe_dir / name).read_bytes() == raw
        n.cancel_scope.cancel()


async def test_a_member_serving_a_tampered_copy_first_blocks_nothing(tmp_path) -> None:
    """Review M1: a member lists the real publication but serves it with a forged signature and wrong bytes; it
    is asked first. Only that member is refused for that publication: the subscriber still takes it from the
    publisher and its copy is the publisher's bytes."""
    import msgspec

    from p2pnode.sync._distfiles import Holding

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    evil = Node(tmp_path, "evil", ["durable"], publishers=pinned)
    nodes = [pub_node, sub, evil]
    src = tmp_path / "model.bin"
    data = os.urandom(6 * BS)
    src.write_bytes(data)
    pub = make_publication(op, src, "model.bin", 1)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(6 * BS))
    forged = msgspec.structs.replace(pub, sig=bytes(64))
    pub_node.dist.load()
    evil.dist.load()
    await pub_node.dist.publish(src, pub)
    evil.dist.holdings["model.bin"] = Holding(forged, junk, None, origin=True)
    async with await _serving(nodes), trio.open_nursery() as n:
        n.start_soon(sub.dist.run)
        # the subscriber hears of the evil member first, and only of it
        await wait_for(lambda: sub.dist.book.refused.get("bad_signature", 0) >= 1, [sub, evil])
        evil.dist.holdings["model.bin"] = Holding(pub, junk, None, origin=True)  # now it serves junk blocks
        await wait_for(lambda: sub.dist.updated == 1, nodes)
        assert (sub.dist.files.subscribe_dir / "model.bin").read_bytes() == data
        n.cancel_scope.cancel()


async def test_tampered_blocks_are_counted_against_their_holder_and_fetched_elsewhere(tmp_path) -> None:
    """Review M1, the blocks: a member lists the publication as held whole (so it is asked before the publisher)
    and serves wrong bytes for every block. Each is counted against that member (``bad_blocks`` in the status),
    which is asked no more for it, and every block comes from the publisher."""
    from p2pnode.sync._distfiles import Holding

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    evil = Node(tmp_path, "evil", ["durable"], publishers=pinned)
    nodes = [pub_node, sub, evil]
    src = tmp_path / "model.bin"
    data = os.urandom(6 * BS)
    src.write_bytes(data)
    pub = make_publication(op, src, "model.bin", 1)
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(6 * BS))
    pub_node.dist.load()
    await pub_node.dist.publish(src, pub)
    evil.dist.holdings["model.bin"] = Holding(pub, junk, None)
    evil.dist.book.current["model.bin"] = pub
    router = Router(nodes)
    async with await _serving(nodes, router), trio.open_nursery() as n:
        n.start_soon(sub.dist.run)
        await wait_for(lambda: sub.dist.updated == 1, nodes)
        assert (sub.dist.files.subscribe_dir / "model.bin").read_bytes() == data
        bad = sub.dist.view()["bad_blocks"]
        assert list(bad) == [evil.ctx.node_id] and 1 <= bad[evil.ctx.node_id] <= 6
        assert router.block_bytes["evil"] == bad[evil.ctx.node_id] * BS
        assert sub.dist.bytes_fetched == {pub_node.ctx.node_id: len(data)}
        n.cancel_scope.cancel()


async def test_a_member_that_never_answers_stalls_no_discovery(tmp_path) -> None:
    """Review M2: a member lists three publications and never answers. Its entries are checked in their own
    tasks, so another member's publication arrives while it hangs; when its requests time out it backs off and is
    not asked again pass after pass."""
    from p2pnode.sync._distfiles import Holding

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned, request_timeout_s=1.0)
    slow = Node(tmp_path, "slow", ["durable"], publishers=pinned)
    nodes = [pub_node, sub, slow]
    for i in range(3):
        f = tmp_path / f"x{i}"
        f.write_bytes(os.urandom(100))
        slow.dist.holdings[f"x{i}"] = Holding(make_publication(op, f, f"x{i}", 1), f, None, origin=True)
    src = tmp_path / "good.bin"
    src.write_bytes(os.urandom(3 * BS))
    pub_node.dist.load()
    await pub_node.dist.publish(src, make_publication(op, src, "good.bin", 1))
    release = trio.Event()
    asked: list[str] = []

    class Hanging(Router):
        async def handle_async_request(self, request):
            if request.url.host == "slow":
                asked.append(request.url.path)
                await release.wait()
            return await super().handle_async_request(request)

    async with await _serving(nodes, Hanging(nodes)), trio.open_nursery() as n:
        n.start_soon(sub.dist.run)
        await wait_for(lambda: len(asked) == 3, [sub, slow])  # the slow member is heard of first
        await wait_for(lambda: sub.dist.updated == 1, nodes)  # while it still hangs
        assert not release.is_set()
        await wait_for(lambda: slow.ctx.node_id in sub.dist.backoff.failing and not sub.dist._considering, nodes)
        seen = sub.dist.passes
        await wait_for(lambda: sub.dist.passes >= seen + 5, nodes)
        assert len(asked) == 3  # backing off: not asked again
        release.set()
        n.cancel_scope.cancel()


async def test_a_member_listing_forged_publications_takes_no_more_than_its_share(tmp_path, monkeypatch) -> None:
    """Review M2, again: a member heard of first lists 20 publications with forged signatures and answers at once.
    Members' entries are taken in turn, so the publisher's is asked in the first pass, not after the forger's 20;
    the forger backs off after its first refusals and is not asked for the rest."""
    import msgspec

    from p2pnode.sync import _distlisting
    from p2pnode.sync._distfiles import Holding
    from p2pnode.sync._distribute import MAX_CONSIDERING_PER_MEMBER

    monkeypatch.setattr(_distlisting, "MEMBER_BACKOFF_S", (600.0, 600.0))  # no second chance while the test runs
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    evil = Node(tmp_path, "evil", ["durable"], publishers=pinned)
    nodes = [pub_node, sub, evil]
    for i in range(20):
        f = tmp_path / f"e{i:02}"
        f.write_bytes(os.urandom(100))
        forged = msgspec.structs.replace(make_publication(op, f, f"e{i:02}", 1), sig=bytes(64))
        evil.dist.holdings[f"e{i:02}"] = Holding(forged, f, None, origin=True)
    src = tmp_path / "good.bin"
    src.write_bytes(os.urandom(3 * BS))
    pub_node.dist.load()
    await pub_node.dist.publish(src, make_publication(op, src, "good.bin", 1))
    asked: list[str] = []

    class Recording(Router):
        async def handle_async_request(self, request):
            if request.url.path == PUBLICATION_PATH:
                asked.append(request.url.host)
            return await super().handle_async_request(request)

    gossip([sub, evil])  # the forger is the first member the subscriber knows
    gossip(nodes)
    async with await _serving(nodes, Recording(nodes)), trio.open_nursery() as n:
        n.start_soon(sub.dist.run)
        await wait_for(lambda: sub.dist.updated == 1, nodes)
        assert asked.index("pub") <= MAX_CONSIDERING_PER_MEMBER  # asked among the first, in turn with the forger
        seen = sub.dist.passes
        await wait_for(lambda: sub.dist.passes >= seen + 5, nodes)
        assert asked.count("evil") <= MAX_CONSIDERING_PER_MEMBER  # then backing off: not asked for the rest
        assert sub.dist.book.refused["bad_signature"] == asked.count("evil")
        assert evil.ctx.node_id in sub.dist.backoff.failing
        n.cancel_scope.cancel()


async def test_a_member_claiming_every_block_and_never_answering_holds_few_requests(tmp_path) -> None:
    """Review L4, across fetches: a member lists 16 publications as held whole (ranked before the publisher) and
    never answers a block request. Four publications are fetched at once, and a holder that timed out in one fetch
    backs off in all, so it is asked for blocks 4 times at most (not once per publication, 16 connections of the
    shared client held for a whole request timeout) and every copy arrives from the publisher."""
    import msgspec

    from p2pnode.sync._distfiles import Holding
    from p2pnode.sync._distribute import MAX_FETCHING

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    evil = Node(tmp_path, "evil", ["durable"], publishers=pinned)
    nodes = [pub_node, sub, evil]
    pub_node.dist.load()
    data = {}
    for i in range(16):
        f = tmp_path / f"m{i:02}"
        data[f.name] = os.urandom(2 * BS)
        f.write_bytes(data[f.name])
        pub = make_publication(op, f, f.name, 1)
        await pub_node.dist.publish(f, pub)
        evil.dist.holdings[f.name] = Holding(pub, f, None)  # listed as held whole, not as its publisher
        evil.dist.book.current[f.name] = pub
    sub.dist.policy = msgspec.structs.replace(sub.dist.policy, request_timeout_s=1.0)
    release = trio.Event()
    asked: list[str] = []
    under_way = {"now": 0, "most": 0}

    class Mute(Router):
        async def handle_async_request(self, request):
            if request.url.host == "evil" and request.url.path == BLOCKS_PATH:
                asked.append(request.url.path)
                under_way["now"] += 1
                under_way["most"] = max(under_way["most"], under_way["now"])
                try:
                    await release.wait()
                finally:
                    under_way["now"] -= 1
            return await super().handle_async_request(request)

    async with await _serving(nodes, Mute(nodes)), trio.open_nursery() as n:
        n.start_soon(sub.dist.run)
        await wait_for(lambda: sub.dist.updated == 16, nodes, timeout_s=30)
        assert 1 <= len(asked) <= MAX_FETCHING * sub.dist.policy.streams_per_holder
        assert under_way["most"] <= MAX_FETCHING * sub.dist.policy.streams_per_holder
        for name, raw in data.items():
            assert (sub.dist.files.subscribe_dir / name).read_bytes() == raw
        release.set()
        n.cancel_scope.cancel()


async def test_a_slot_freed_in_discovery_is_used_at_once_not_an_interval_later(tmp_path) -> None:
    """Discovery checks a few publications at once; when one is done and more wait, the next pass runs at once.
    With a 60 s pass interval, all 24 of one member's publications still arrive well before it (a pass per
    interval would check 4 or 8 of them)."""
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned, interval_s=60.0)
    nodes = [pub_node, sub]
    pub_node.dist.load()
    for i in range(24):
        f = tmp_path / f"m{i:02}"
        f.write_bytes(os.urandom(1000 + i))
        await pub_node.dist.publish(f, make_publication(op, f, f.name, 1))
    gossip(nodes)  # heard of before the first pass
    async with await _serving(nodes), trio.open_nursery() as n:
        n.start_soon(sub.dist.run)
        await wait_for(lambda: sub.dist.updated == 24, nodes, timeout_s=30)
        assert sub.dist.passes < 24 * 2 + 2  # one pass per freed slot at most, not a spinning loop
        n.cancel_scope.cancel()


async def test_what_members_hold_is_read_again_per_interval_not_per_request(tmp_path) -> None:
    """Review M7, the driver's side: a fetch of 48 blocks, one per request, reads the members' listings (a walk of
    every member's entries on the event loop) once per HOLDERS_REFRESH_S, not once per request."""
    import msgspec

    from p2pnode.sync._distribute import HOLDERS_REFRESH_S

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    nodes = [pub_node, sub]
    pub_node.dist.load()
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(48 * BS))
    pub = make_publication(op, src, "m.bin", 1)
    assert pub.manifest.blocks == 48
    await pub_node.dist.publish(src, pub)
    sub.dist.policy = msgspec.structs.replace(sub.dist.policy, blocks_per_request=1, max_streams=1)
    reads = [0]
    refresh = sub.dist.listings.tell_holders

    def counted(plan, bits):
        reads[0] += 1
        refresh(plan, bits)

    sub.dist.listings.tell_holders = counted
    async with await _serving(nodes), trio.open_nursery() as n:
        n.start_soon(sub.dist.run)
        await wait_for(lambda: "m.bin" in sub.dist.plans, nodes)
        start = trio.current_time()
        await wait_for(lambda: sub.dist.updated == 1, nodes, timeout_s=30)
        elapsed = trio.current_time() - start
        assert reads[0] <= 2 + elapsed / HOLDERS_REFRESH_S, (reads, elapsed)
        n.cancel_scope.cancel()


async def test_the_status_walks_the_members_entries_once_not_once_a_file(tmp_path) -> None:
    """Review M7, ``GET /sync/status``: the distribution view of 30 held files walks each member's entries once
    (it was once per file, on the event loop: 200 files x 100 members x their entries) and still names every
    holder of every file."""
    from p2pnode.sync._distfiles import Holding

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    other = Node(tmp_path, "other", ["durable"], publishers=pinned)
    pub_node.dist.load()
    for i in range(30):
        f = tmp_path / f"m{i:02}"
        f.write_bytes(os.urandom(BS + i))
        pub = make_publication(op, f, f.name, 1)
        await pub_node.dist.publish(f, pub)
        other.dist.holdings[f.name] = Holding(pub, f, {0})  # one of its two blocks
        other.dist.book.current[f.name] = pub
    gossip([pub_node, other])
    walks = [0]
    entries = pub_node.dist.listings.entries

    def counted(node_id):
        walks[0] += 1
        return entries(node_id)

    pub_node.dist.listings.entries = counted
    view = pub_node.dist.view()
    assert walks[0] == 1
    assert len(view["files"]) == 30
    assert all(f["holders"] == {other.ctx.node_id: {"blocks": 1, "serves": True}} for f in view["files"])


async def test_a_lost_state_file_loses_no_floor(tmp_path) -> None:
    """Review M4: with ``state.msgpack`` unreadable, the floors come back from ``.versions/`` and the current
    link, so a replayed older publication is still refused."""
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    node = Node(tmp_path, "s0", ["training"], publishers=pinned)
    node.dist.load()
    f = node.dist.files
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(BS + 1))
    v1 = make_publication(op, src, "m.bin", 1)
    v5 = make_publication(op, src, "m.bin", 5)
    (f.subscribe_dir / ".versions" / "m.bin@3").write_bytes(b"old")
    (f.subscribe_dir / ".versions" / "m.bin@5").write_bytes(src.read_bytes())
    f.switch(v5)
    (f.state_dir / "state.msgpack").write_bytes(b"\xc1 not msgpack")
    again = Node(tmp_path, "s0", ["training"], identity=node.ctx.identity, publishers=pinned)
    again.dist.load()
    assert again.dist.book.floors == {"m.bin": 5}
    from p2pnode.synccore import PublicationRefused

    with pytest.raises(PublicationRefused):
        again.dist.book.accept(v1)


async def test_a_name_too_long_for_its_paths_is_refused_and_discovery_goes_on(tmp_path) -> None:
    """Review L1: a 240-byte name (signed by the pinned key) would make a partial file name over NAME_MAX; it is
    refused (``bad_name``) and the next publication still arrives."""
    import msgspec

    from p2pnode.sync._distfiles import Holding
    from p2pnode.synccore import publication_signing_bytes

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    nodes = [pub_node, sub]
    pub_node.dist.load()
    src = tmp_path / "a.bin"
    src.write_bytes(os.urandom(BS))
    good = make_publication(op, src, "a.bin", 2**40)
    long = "a" * 240
    bad = msgspec.structs.replace(good, name=long, sig=op.sign(publication_signing_bytes(long, 2**40, good.root,
                                                                                        good.to)))
    pub_node.dist.holdings[long] = Holding(bad, src, None, origin=True)
    async with await _serving(nodes), trio.open_nursery() as n:
        for node in nodes:
            n.start_soon(node.dist.run)
        await wait_for(lambda: sub.dist.book.refused.get("bad_name", 0) >= 1, nodes)
        other = tmp_path / "b.bin"
        other.write_bytes(os.urandom(BS))
        await pub_node.dist.publish(other, make_publication(op, other, "b.bin", 1))
        await wait_for(lambda: sub.dist.updated == 1, nodes)
        assert (sub.dist.files.subscribe_dir / "b.bin").read_bytes() == other.read_bytes()
        n.cancel_scope.cancel()


async def test_block_requests_are_bounded_and_a_truncated_copy_answers_409(tmp_path) -> None:
    """Review M5 and L3: a request for more than 16 MiB of blocks is refused (413, ``too_large``) before anything
    is read; a held file truncated on disk answers 409 ``damaged`` (not a 500), and the copy is verified again."""
    import msgspec

    from p2pnode.sync import sign_headers

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    pub_node.dist.load()
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:
        fh.truncate(2 * 16 * 2**20 + 1)  # sparse: three blocks of 16 MiB
    m = hash_file(big, block_size=16 * 2**20)
    pub = sign_publication(op.sign, op.public_key, "big.bin", 1, m, "training")
    await pub_node.dist.publish(big, pub)
    gossip([pub_node, sub])

    async def ask(indices):
        body = msgspec.msgpack.encode({"root": pub.root, "indices": indices})
        return await pub_node.sync.serve_distribution(
            BLOCKS_PATH, sign_headers(sub.ctx.identity, "POST", BLOCKS_PATH, body), body)

    status, _ = await ask([0, 1, 2])
    assert status == 413 and pub_node.dist.serve_refused == {"too_large": 1}
    status, reply = await ask([2])
    assert status == 200 and await body_of(reply) == b"\x00"
    os.truncate(pub_node.dist.holdings["big.bin"].path, 100)
    status, _ = await ask([1])
    assert status == 409 and pub_node.dist.serve_refused["damaged"] == 1
    assert "big.bin" in pub_node.dist.damaged
    assert all(e.name != "big.bin" for e in pub_node.dist.section_entries())  # no longer listed as held
    await pub_node.dist.pass_once()  # verified again: still damaged, still refused
    assert "big.bin" in pub_node.dist.damaged


async def test_free_disk_is_checked_for_every_fetch_under_way_together(tmp_path, monkeypatch) -> None:
    """Review L2: two publications that each fit the free disk but not together: the second waits (``no_space``,
    asked again each pass) until the first is written, then arrives."""
    import shutil
    from collections import namedtuple

    import p2pnode.sync._distribute as dist_mod

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned, publish_max_bytes_per_s=2**20)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    nodes = [pub_node, sub]
    pub_node.dist.load()
    size = 2 * 2**20
    Usage = namedtuple("Usage", "total used free")
    total = int(size * 1.5 / (sub.ctx.config.guard.disk_max_percent / 100.0))  # room for 1.5 files past the reserve
    real = shutil.disk_usage

    def fake(path):
        return Usage(total, 0, total) if str(path).startswith(str(sub.dist.files.subscribe_dir)) else real(path)

    monkeypatch.setattr(dist_mod.shutil, "disk_usage", fake)
    for name in ("a.bin", "b.bin"):
        src = tmp_path / name
        src.write_bytes(os.urandom(size))
        await pub_node.dist.publish(src, make_publication(op, src, name, 1))
    async with await _serving(nodes), trio.open_nursery() as n:
        for node in nodes:
            n.start_soon(node.dist.run)
        await wait_for(lambda: sub.dist.book.refused.get("no_space", 0) >= 1, nodes)
        assert len([h for h in sub.dist.holdings.values() if h.have is not None]) == 1  # one accepted, one waits
        await wait_for(lambda: sub.dist.updated == 2, nodes, timeout_s=30)
        n.cancel_scope.cancel()


async def test_a_kill_after_the_floor_was_saved_but_before_the_partial_file_resumes(tmp_path) -> None:
    """Found by bench/sync_kill.py: a subscriber killed after it saved a publication (and its floor) but before its
    partial file existed came back with the floor and nothing to fetch, so that file never arrived. It resumes."""
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    pub_node.dist.load()
    sub.dist.load()
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(3 * BS))
    pub = make_publication(op, src, "m.bin", 1)
    await pub_node.dist.publish(src, pub)
    sub.dist.files.save_state({"m.bin": 1}, [pub])  # the state as saved just before the kill; no partial file
    again = Node(tmp_path, "s0", ["training"], identity=sub.ctx.identity, publishers=pinned)
    again.addr = sub.addr
    nodes = [pub_node, again]
    async with await _serving(nodes), trio.open_nursery() as n:
        for node in nodes:
            n.start_soon(node.dist.run)
        await wait_for(lambda: again.dist.updated == 1, nodes)
        assert (again.dist.files.subscribe_dir / "m.bin").read_bytes() == src.read_bytes()
        n.cancel_scope.cancel()


async def test_a_kill_between_a_versions_rename_and_its_switch_switches_it_at_start(tmp_path) -> None:
    """Found by bench/sync_kill.py (200 small files, 4 of 20 seeds): a subscriber killed after a verified version
    was renamed into ``.versions/`` but before the link was switched came back holding that version with the link
    still naming the one before (or nothing), for ever. At start the link is switched to the held version and
    ``MODEL_UPDATED`` emitted; a link already right is left alone."""
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    sub.dist.load()
    f = sub.dist.files
    pubs = {}
    for name in ("a.bin", "b.bin", "c.bin"):
        src = tmp_path / name
        src.write_bytes(os.urandom(BS + 7))
        pubs[name] = (make_publication(op, src, name, 1), make_publication(op, src, name, 2))
        (f.subscribe_dir / ".versions" / f"{name}@1").write_bytes(src.read_bytes())
        (f.subscribe_dir / ".versions" / f"{name}@2").write_bytes(src.read_bytes())
    f.switch(pubs["a.bin"][0])  # a: the link still names v1
    f.switch(pubs["c.bin"][1])  # c: switched before the kill; b: no link yet
    f.save_state({n: 2 for n in pubs}, [v2 for _, v2 in pubs.values()])
    again = Node(tmp_path, "s0", ["training"], identity=sub.ctx.identity, publishers=pinned)
    async with trio.open_nursery() as n:
        n.start_soon(again.dist.run)
        await wait_for(lambda: again.dist.passes >= 1, [again])
        n.cancel_scope.cancel()
    for name in pubs:
        assert os.readlink(f.subscribe_dir / name) == f".versions/{name}@2"
    assert sorted(p["name"] for e, p in again.ctx.events if e == "MODEL_UPDATED") == ["a.bin", "b.bin"]
    assert again.dist.updated == 2


async def test_the_same_bytes_published_under_two_names_both_arrive(tmp_path) -> None:
    """Found in review of the review fixes: two publications with one root (the same file as ``latest.bin`` and
    ``v7.bin``) were served by root alone, so one name's publication came back for the other and was refused."""
    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    nodes = [pub_node, sub]
    pub_node.dist.load()
    src = tmp_path / "m.bin"
    src.write_bytes(os.urandom(2 * BS))
    for name in ("latest.bin", "v7.bin"):
        await pub_node.dist.publish(src, make_publication(op, src, name, 1))
    async with await _serving(nodes), trio.open_nursery() as n:
        for node in nodes:
            n.start_soon(node.dist.run)
        await wait_for(lambda: sub.dist.updated == 2, nodes)
        for name in ("latest.bin", "v7.bin"):
            assert (sub.dist.files.subscribe_dir / name).read_bytes() == src.read_bytes()
        assert not sub.dist.book.refused
        n.cancel_scope.cancel()


async def test_a_blocks_reply_streams_a_piece_at_a_time_and_holds_its_slot_until_it_ends(tmp_path) -> None:
    """Review M5: a request for 16 blocks of 1 MiB was answered with the whole 16 MiB built in memory (twice: the
    buffer and its copy), 8 requests at once by default. Now the reply is read, paced and sent a piece of at most
    1 MiB at a time (peak memory while serving and reading it whole: a few MiB), the bytes are the file's, and the
    request's serving slot is held until the reply ends (closed unread too)."""
    import tracemalloc

    import blake3
    import msgspec

    from p2pnode.sync import sign_headers

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned, publish_serve_streams=1)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    pub_node.dist.load()
    src = tmp_path / "model.bin"
    src.write_bytes(os.urandom(16 * 2**20))
    pub = sign_publication(op.sign, op.public_key, "model.bin", 1, hash_file(src, block_size=2**20), "training")
    await pub_node.dist.publish(src, pub)
    gossip([pub_node, sub])

    async def ask(indices):
        body = msgspec.msgpack.encode({"root": pub.root, "indices": indices})
        return await pub_node.sync.serve_distribution(
            BLOCKS_PATH, sign_headers(sub.ctx.identity, "POST", BLOCKS_PATH, body), body)

    tracemalloc.start()
    try:
        status, reply = await ask(list(range(16)))
        assert status == 200
        assert (await ask([0]))[0] == 503  # its one serving slot is taken while the reply is under way
        h, got, largest = blake3.blake3(), 0, 0
        pieces = [reply] if isinstance(reply, bytes) else reply.chunks()
        if isinstance(reply, bytes):
            largest = len(reply)
            h.update(reply)
            got = len(reply)
        else:
            async for piece in pieces:
                largest = max(largest, len(piece))
                h.update(piece)
                got += len(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == 16 * 2**20 and h.digest() == blake3.blake3(src.read_bytes()).digest()
    assert largest <= 2**20 and peak < 4 * 2**20, (largest, peak)
    status, reply = await ask([3])  # the slot is free again once the reply ended
    assert status == 200
    reply.close()  # a reply never read (the client left before it started) frees its slot when closed
    status, reply = await ask([4])
    assert status == 200 and await body_of(reply) == src.read_bytes()[4 * 2**20:5 * 2**20]
    assert pub_node.dist.server.bytes_served == 17 * 2**20


async def _one_block_server(tmp_path, **sync):
    """A publisher holding one 64 KiB block and a member asking for it: (publisher, ask)."""
    import msgspec

    from p2pnode.sync import sign_headers

    op = Identity.generate()
    pinned = [publisher_text(op.public_key)]
    pub_node = Node(tmp_path, "pub", ["durable"], publishers=pinned, publish_serve_streams=1, **sync)
    sub = Node(tmp_path, "s0", ["training"], publishers=pinned)
    pub_node.dist.load()
    src = tmp_path / "small.bin"
    src.write_bytes(os.urandom(64 * 1024))
    pub = sign_publication(op.sign, op.public_key, "small.bin", 1, hash_file(src, block_size=64 * 1024), "training")
    await pub_node.dist.publish(src, pub)
    gossip([pub_node, sub])

    async def ask(indices):
        body = msgspec.msgpack.encode({"root": pub.root, "indices": indices})
        return await pub_node.sync.serve_distribution(
            BLOCKS_PATH, sign_headers(sub.ctx.identity, "POST", BLOCKS_PATH, body), body)

    return pub_node, ask


def _fds_on(path) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass
    return n


_SCOPE = {"type": "http", "asgi": {"spec_version": "2.1", "version": "3.0"}}


async def test_a_member_that_stops_reading_a_blocks_reply_holds_its_slot_no_longer_than_a_piece_deadline(tmp_path):
    """Review of issue 40 (MEDIUM): the serving slot is now held until the reply ends, and hypercorn has no send
    timeout, so a member that opened a blocks request and never read the body held a slot for ever
    (``publish_serve_streams``, 8 by default: eight such requests stop a node serving anyone). Now each piece must
    be taken within ``request_timeout_s`` plus its bytes at 256 KiB/s: the reply is cut, counted ``too_slow``, its
    file closed and the slot free again."""
    from p2pnode.http._dist_route import _BlocksReply

    pub_node, ask = await _one_block_server(tmp_path, request_timeout_s=0.1)
    status, reply = await ask([0])
    assert status == 200
    sent = []

    async def receive():
        await trio.sleep_forever()  # connected, never hanging up

    async def send(message):
        sent.append(message["type"])
        if message["type"] == "http.response.body":
            await trio.sleep_forever()  # the socket's buffers full: the client does not read

    response = _BlocksReply(reply)
    with trio.move_on_after(20):  # a deadline for the test only: the cut comes after about 0.35 s
        await response(_SCOPE, receive, send)
    assert sent == ["http.response.start", "http.response.body"]
    assert pub_node.dist.serve_refused["too_slow"] == 1
    assert _fds_on(pub_node.dist.holdings["small.bin"].path) == 0
    assert (await ask([0]))[0] == 200  # the one slot is free again


async def test_a_client_gone_mid_reply_frees_its_slot_and_file_at_once_and_a_cancelled_request_leaks_no_slot(
        tmp_path):
    """Review of issue 40 (LOW): a client that hung up mid-reply freed its slot but left the file open until the
    reply's generator was collected; and a request cancelled while its file was stat'ed (after it took its slot)
    kept the slot for ever (only a refusal gave it back)."""
    from p2pnode.http._dist_route import _BlocksReply

    pub_node, ask = await _one_block_server(tmp_path)
    path = pub_node.dist.holdings["small.bin"].path
    status, reply = await ask([0])
    gone = trio.Event()

    async def receive():
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body":
            gone.set()
            await trio.sleep_forever()

    response = _BlocksReply(reply)
    with trio.move_on_after(20):
        await response(_SCOPE, receive, send)
    assert reply.closed and _fds_on(path) == 0  # the response object still alive: closed by the route, not GC
    with trio.CancelScope() as cs:
        cs.cancel()
        await ask([0])
    status, reply = await ask([0])
    assert status == 200, status  # the cancelled request's slot came back
    reply.close()
