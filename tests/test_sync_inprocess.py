"""Sync between in-process nodes: the real pusher and push route, wired through httpx transports (no sockets).

Each node is a :class:`SyncService` over a :class:`FakeContext` (no agent). Snapshots travel by direct hand-over
(as gossip would carry them: encoded and decoded by the typed snapshot decoder), so receipts, deaths and
backpressure can be set up exactly; the bytes, hashes, signatures and files are real. The router stands in for
the HTTP app's two sync routes (``POST /sync/push``, ``GET /sync/receipts``), calling what they call.
"""

import os

import httpx
import msgpack
import pytest
import trio
from helpers import FakeContext

from p2pnode.config import load_config
from p2pnode.gossip import MemberState
from p2pnode.inputs import decode_push_reply
from p2pnode.resources import ResourceSample
from p2pnode.snapshot import SCHEMA_VERSION, Snapshot, decode_snapshot, encode_snapshot
from p2pnode.sync import PushItem, SyncService, encode_push, sign_headers
from p2pnode.synccore import hash_file, rendezvous_rank


def sample(disk_percent: float = 10.0) -> ResourceSample:
    return ResourceSample(cpu_percent=1.0, cpu_count=4, load_avg=(0.0, 0.0, 0.0), mem_total_bytes=2**34,
                          mem_available_bytes=2**33, mem_used_bytes=2**33, mem_percent=50.0, disk_path="/",
                          disk_total_bytes=2**40, disk_used_bytes=int(2**40 * disk_percent / 100),
                          disk_free_bytes=int(2**40 * (1 - disk_percent / 100)), disk_percent=disk_percent)


class Node:
    """One node for sync tests: its context, its sync service, the address peers reach it at."""

    def __init__(self, tmp_path, name, tag, **sync):
        cfg = load_config(None, env={}, overrides={
            "agent": {"data_dir": tmp_path / name, "port": 0, "tags": (tag,)},
            "discovery": {"mdns": False},
            "sync": {"interval_s": 0.1, "settle_s": 0.0, "request_bytes": 2**20, **sync},
        })
        self.ctx = FakeContext(cfg)
        self.ctx.last_sample = sample()
        self.sync = SyncService(self.ctx)
        self.addr = f"{name}:80"
        self.tag = tag
        self.version = 0

    node_id = property(lambda self: self.ctx.node_id)
    identity = property(lambda self: self.ctx.identity)
    data_dir = property(lambda self: self.ctx.data_dir)
    config = property(lambda self: self.ctx.config)

    def snapshot(self) -> Snapshot:
        """A new version of this node's snapshot (its sync section as it is now), through the wire decoder."""
        self.version += 1
        snap = Snapshot(schema=SCHEMA_VERSION, origin=self.node_id, version=self.version, addr=self.addr,
                        tags=[self.tag], leaving=False, sync=self.sync.section())
        return decode_snapshot(encode_snapshot(snap))


def make_node(tmp_path, name, tag, **sync) -> Node:
    return Node(tmp_path, name, tag, **sync)


def link(a: Node, b: Node, now: float = 0.0) -> None:
    """``a`` learns ``b``'s newest snapshot (as a gossip exchange would deliver it)."""
    a.ctx.put(b.snapshot(), b.identity.public_key, received_at=now)


class Router(httpx.AsyncBaseTransport):
    """Routes requests by host to in-process nodes' sync routes; ``corrupt`` flips a byte in the next N pushes
    with blocks."""

    def __init__(self, nodes):
        self.nodes = {n.addr.split(":")[0]: n for n in nodes}
        self.corrupt = 0
        self.pushes: list[str] = []

    async def handle_async_request(self, request):
        host = request.url.host
        body = await request.aread()
        node = self.nodes[host]
        if request.url.path == "/sync/receipts":
            store = node.sync.store
            if store is None:
                return httpx.Response(404)
            receipts = await trio.to_thread.run_sync(store.receipts_for, request.url.params.get("origin", ""))
            return httpx.Response(200, content=msgpack.packb(receipts, use_bin_type=True))
        if request.url.path == "/sync/challenge":
            headers = {k.lower(): v for k, v in request.headers.items()}
            status, reply = await node.sync.answer_challenge(headers, body)
            return httpx.Response(status, content=reply)
        assert request.url.path == "/sync/push"
        self.pushes.append(host)
        n = int.from_bytes(body[:4], "big")
        if self.corrupt and len(body) > 4 + n + 1000:
            self.corrupt -= 1
            b = bytearray(body)
            b[4 + n + 500] ^= 0xFF  # a byte inside the first block, after the signature was made
            body = bytes(b)

        async def chunks():
            yield body

        headers = {k.lower(): v for k, v in request.headers.items()}
        headers["content-length"] = str(len(body))
        status, reply = await node.sync.receive_push(headers, headers["content-length"], chunks())
        return httpx.Response(status, content=reply)


@pytest.fixture
def cluster(tmp_path):
    def build(n_durable=1, **sync):
        eph = make_node(tmp_path, "eph", "ephemeral", **sync)
        durable = [make_node(tmp_path, f"d{i}", "durable", **sync) for i in range(n_durable)]
        for d in durable:
            link(eph, d)
            link(d, eph)
        return eph, durable
    return build


async def run_pass(eph, durable, router):
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        eph.ctx.client = client
        await eph.sync.pass_once()
    for d in durable:
        link(eph, d)


async def verify(eph, router):
    """What the disk manager's pass does first: challenge the holders counted toward R (proof of possession)."""
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        eph.ctx.client = client
        await eph.sync.verify_before_delete()


def replica_root(eph):
    (f,) = eph.sync.source.files.values()
    return f.manifest.root


def write(eph, rel, data):
    p = eph.sync.root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


async def test_corrupted_block_in_flight_is_rejected_and_sent_again(cluster):
    eph, (d,) = cluster()
    data = os.urandom(3 * 2**20 + 12345)
    write(eph, "cfg/shard.npz", data)
    router = Router([eph, d])
    router.corrupt = 1
    await run_pass(eph, [d], router)
    assert d.sync.store.rejected["bad_block_hash"] == 1
    assert eph.sync.blocks_resent == 1 and eph.sync.push_rejected["bad_block_hash"] == 1
    replica = d.data_dir / "replicas" / eph.node_id / "cfg" / "shard.npz"
    assert replica.read_bytes() == data
    view = eph.sync.status_view()
    (f,) = view["files"]
    assert f["replicas"] == 1 and f["r"] == 1 and f["lag_s"] == 0.0 and f["bytes_pending"] == 0
    assert d.ctx.published_to == [eph.node_id]  # the commit is published to its origin at once
    await run_pass(eph, [d], router)  # a pass that sees R reached
    # each node's section, as its snapshot carries it (what `p2pnode status` and `/status` show)
    mine = eph.sync.section()
    assert mine.files == 1 and mine.under_replicated == 0 and mine.bytes == len(data) and mine.digest
    (rec,) = d.snapshot().sync.receipts[eph.node_id]
    assert rec[0] == "cfg/shard.npz" and rec[1] == len(data) and rec[2] == replica_root(eph)
    # what /metrics reads on the receiver
    assert d.sync.rejected_total()["bad_block_hash"] == 1 and len(d.sync.store.index) == 1
    assert d.sync.store.held_bytes() == len(data)


async def test_http_reply_alone_is_not_a_replica_and_small_appends_ride_in_one_request(cluster):
    eph, (d,) = cluster()
    p = write(eph, "cfg/games.jsonl", b'{"game": 0}\n' * 1000)
    router = Router([eph, d])
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        eph.ctx.client = client
        await eph.sync.pass_once()
        # committed on d, but d's receipt has not reached eph yet: not confirmed
        assert eph.sync.status_view()["files"][0]["replicas"] == 0
        link(eph, d)
        assert eph.sync.status_view()["files"][0]["replicas"] == 1
        with open(p, "ab") as fh:
            fh.write(b'{"game": 1}\n')
        before = len(router.pushes)
        sent = eph.sync.bytes_sent
        await eph.sync.pass_once()
    assert len(router.pushes) - before == 1  # manifest and the changed tail block in one request
    assert eph.sync.bytes_sent - sent < 200_000  # the tail block (<= 128 KiB) and the manifest, not the file
    assert (d.data_dir / "replicas" / eph.node_id / "cfg" / "games.jsonl").read_bytes() == p.read_bytes()


async def test_push_route_rejects_strangers_escapes_and_oversize(cluster, tmp_path):
    eph, (d,) = cluster()
    from p2pnode.identity import Identity

    stranger = Identity.generate()
    data = os.urandom(1000)
    (tmp_path / "f").write_bytes(data)
    m = hash_file(tmp_path / "f", block_size=128 * 1024)
    async with httpx.AsyncClient(transport=Router([d]), base_url="http://d") as c:
        async def push(ident, path):
            body = encode_push([PushItem(path, m, 1, [(0, data)])])
            return await c.post("http://d0/sync/push", content=body,
                                headers=sign_headers(ident, "POST", "/sync/push", body))

        r = await push(stranger, "ok.npz")
        assert r.status_code == 403 and decode_push_reply(r.content)[0].reason == "not_member"
        r = await push(eph.identity, "../../escape.npz")
        assert r.status_code == 400 and decode_push_reply(r.content)[0].reason == "path_escape"
        r = await c.post("http://d0/sync/push", content=b"x" * (d.config.sync.max_request_bytes + 1))
        assert r.status_code == 413
        r = await push(eph.identity, "ok.npz")
        assert r.status_code == 200 and decode_push_reply(r.content)[0].status == "committed"
        counts = d.sync.rejected_total()
    assert counts["not_member"] == 1 and counts["path_escape"] == 1 and counts["oversized"] == 1
    assert not list(tmp_path.rglob("escape.npz"))


async def test_a_dead_or_left_member_may_not_push(cluster, tmp_path):
    eph, (d,) = cluster()
    data = os.urandom(1000)
    (tmp_path / "f").write_bytes(data)
    m = hash_file(tmp_path / "f", block_size=128 * 1024)
    async with httpx.AsyncClient(transport=Router([d])) as c:
        for state in (MemberState.DEAD, MemberState.LEFT):
            d.ctx.states[eph.node_id] = state
            body = encode_push([PushItem("ok.npz", m, 1, [(0, data)])])
            r = await c.post("http://d0/sync/push", content=body,
                             headers=sign_headers(eph.identity, "POST", "/sync/push", body))
            assert r.status_code == 403 and decode_push_reply(r.content)[0].reason == "not_member"
    assert d.sync.rejected["not_member"] == 2


async def test_backpressure_moves_the_file_to_the_next_durable_member(cluster):
    eph, durable = cluster(n_durable=2, replication_factor=1)
    write(eph, "cfg/a.npz", os.urandom(200_000))
    key = f"{eph.node_id}/cfg/a.npz"
    first_id = rendezvous_rank(key, [d.node_id for d in durable])[0]
    first = next(d for d in durable if d.node_id == first_id)
    second = next(d for d in durable if d.node_id != first_id)
    first.ctx.last_sample = sample(disk_percent=99.0)
    router = Router([eph, *durable])
    await run_pass(eph, durable, router)
    assert first.sync.rejected["backpressure"] == 1 and eph.sync.status_view()["refusing"] == [first_id]
    await run_pass(eph, durable, router)
    assert eph.sync.status_view()["files"][0]["confirmed_by"] == [second.node_id]
    assert not (first.data_dir / "replicas").joinpath(eph.node_id).exists()


async def test_dead_target_is_replaced_by_the_next_in_rendezvous_order_and_cleaner_waits_for_r(cluster):
    eph, durable = cluster(n_durable=3)
    data = os.urandom(500_000)
    write(eph, "cfg/b.npz", data)
    router = Router([eph, *durable])
    pred = eph.sync.replicated_predicate()
    assert not pred("data/cfg/b.npz")
    await run_pass(eph, durable, router)
    f = eph.sync.status_view()["files"][0]
    ranked = rendezvous_rank(f"{eph.node_id}/cfg/b.npz", [d.node_id for d in durable])
    assert f["r"] == 2 and f["confirmed_by"] == sorted(ranked[:2])
    assert not eph.sync.replicated_predicate()("data/cfg/b.npz")  # receipts alone: not until they pass a challenge
    await verify(eph, router)
    assert eph.sync.replicated_predicate()("data/cfg/b.npz")
    pushes = len(router.pushes)
    await run_pass(eph, durable, router)  # sees R reached; nothing to send
    assert len(router.pushes) == pushes
    # the first target dies: its receipt stops counting, the third in the ranking gets the file
    victim = ranked[0]
    live = [d for d in durable if d.node_id != victim]
    eph.ctx.states[victim] = MemberState.DEAD
    assert not eph.sync.replicated_predicate()("data/cfg/b.npz")  # one counting replica: below R
    events_before = [name for name, _ in eph.ctx.events]
    await run_pass(eph, live, router)
    f = eph.sync.status_view()["files"][0]
    assert f["confirmed_by"] == sorted(ranked[1:3]) and f["replicas"] == 2
    third = next(d for d in durable if d.node_id == ranked[2])
    assert router.pushes[-1] == third.addr.split(":")[0]
    names = [name for name, _ in eph.ctx.events]
    assert "UNDER_REPLICATED" in names and "UNDER_REPLICATED" not in events_before
    assert (third.data_dir / "replicas" / eph.node_id / "cfg" / "b.npz").read_bytes() == data
    await verify(eph, router)
    assert eph.sync.replicated_predicate()("data/cfg/b.npz")
    await run_pass(eph, live, router)  # sees R again
    assert [name for name, _ in eph.ctx.events][-1] == "REPLICATION_RESTORED"
    # a change makes every receipt stale: not deletable until confirmed again
    write(eph, "cfg/b.npz", data + b"more")
    await trio.to_thread.run_sync(eph.sync.source.scan, 1e12)
    assert not eph.sync.replicated_predicate()("data/cfg/b.npz")


def test_relative_sync_root_is_made_absolute_and_the_default_root_is_data_in_the_data_dir(tmp_path, monkeypatch):
    """Found running the demo with ``--data-dir e``: jobs ran with cwd ``e`` and wrote to ``e/e/data``, where sync
    (looking at ``e/data``) never saw their files. The data dir comes absolute from the node; sync's own root too."""
    monkeypatch.chdir(tmp_path)
    for root, want in (("", tmp_path / "rel" / "data"), ("mine", tmp_path / "mine")):
        cfg = load_config(None, env={}, overrides={"agent": {"data_dir": "rel", "port": 0, "tags": ("ephemeral",)},
                                                   "discovery": {"mdns": False}, "sync": {"root": root}})
        svc = SyncService(FakeContext(cfg))
        assert svc.root == want and svc.root.is_absolute()


def test_a_node_with_neither_role_has_an_empty_section_and_zero_counters(tmp_path):
    n = make_node(tmp_path, "plain", "gpu")
    assert n.sync.section() == n.snapshot().sync == type(n.sync.section())()
    view = n.sync.status_view()
    assert view["files"] == [] and view["sent"]["bytes"] == 0 and view["received"] == {"refused_requests": {}}
    assert n.sync.bytes_sent == n.sync.streams_sent == n.sync.channel_fallbacks == 0 and n.sync.channel is None
    assert not n.sync.replicated_predicate()("data/x")


class TamperingRouter(Router):
    """Like Router, but changes one root in every ``GET /sync/receipts`` reply (a forged or corrupted list)."""

    async def handle_async_request(self, request):
        resp = await super().handle_async_request(request)
        if request.url.path != "/sync/receipts":
            return resp
        recs = msgpack.unpackb(await resp.aread())
        if recs:
            recs[-1][2] = bytes(32)
        return httpx.Response(200, content=msgpack.packb(recs, use_bin_type=True))


@pytest.mark.parametrize("tamper", [False, True])
async def test_receipts_beyond_the_snapshot_are_fetched_and_count_only_if_they_match_its_digest(cluster, tamper):
    eph, (d,) = cluster(max_receipts=2)
    files = {f"cfg/s{i}.npz": os.urandom(10_000 + i) for i in range(6)}
    for rel, data in files.items():
        write(eph, rel, data)
    router = (TamperingRouter if tamper else Router)([eph, d])
    for _ in range(3):
        await run_pass(eph, [d], router)
    assert d.sync.store.commits == 6
    snap = d.snapshot().sync
    assert len(snap.receipts[eph.node_id]) == 2  # the snapshot carries only the newest two
    assert set(snap.receipt_digests) == {eph.node_id}
    view = eph.sync.status_view()
    confirmed = sorted(f["path"] for f in view["files"] if f["replicas"] == 1)
    await verify(eph, router)
    ok = eph.sync.replicated_predicate()
    rel = lambda p: (eph.sync.root / p).relative_to(eph.data_dir).as_posix()  # noqa: E731
    if not tamper:
        assert confirmed == sorted(files) and view["sent"]["receipt_fetches"] >= 1
        assert all(ok(rel(p)) for p in files)  # the disk manager may now take every one of them
    else:  # the forged list is dropped: only the two receipts in the signed snapshot count
        assert len(confirmed) == 2 and eph.sync.rejected["receipts_mismatch"] >= 1
        assert sum(ok(rel(p)) for p in files) == 2
    # a new commit changes the digest: the list is fetched again
    before = eph.sync.receipt_fetches
    write(eph, "cfg/s6.npz", os.urandom(5000))
    for _ in range(2):
        await run_pass(eph, [d], router)
    if not tamper:
        assert eph.sync.receipt_fetches > before
        assert all(f["replicas"] == 1 for f in eph.sync.status_view()["files"])


async def test_a_holder_that_claims_a_receipt_without_the_file_fails_its_challenge_and_the_file_goes_elsewhere(
        cluster):
    """Proof of possession in process (attack 3): a durable member whose signed snapshot claims the file (size and
    root copied from the manifest) but holds nothing answers ``absent``; it stops counting, is never pushed to, the
    file goes to the next durable member, and only that one's passed challenge makes the file deletable."""
    from p2pnode.snapshot import SyncSection

    eph, (liar, honest) = cluster(n_durable=2, replication_factor=1)
    data = os.urandom(400_000)
    write(eph, "cfg/c.npz", data)
    await trio.to_thread.run_sync(eph.sync.source.scan, 1e12)
    (f,) = eph.sync.source.files.values()

    def lie():
        liar.version += 1
        snap = Snapshot(schema=SCHEMA_VERSION, origin=liar.node_id, version=liar.version, addr=liar.addr,
                        tags=["durable"], leaving=False,
                        sync=SyncSection(receipts={eph.node_id: [("cfg/c.npz", f.manifest.size, f.manifest.root)]}))
        eph.ctx.put(decode_snapshot(encode_snapshot(snap)), liar.identity.public_key, received_at=0.0)

    lie()
    router = Router([eph, liar, honest])
    await run_pass(eph, [honest], router)
    assert router.pushes == []  # the claim counts for now: R reached, nothing pushed
    assert eph.sync.status_view()["files"][0]["confirmed_by"] == [liar.node_id]
    assert not eph.sync.replicated_predicate()("data/cfg/c.npz")  # but nothing deletable on a claim alone
    await verify(eph, router)  # the disk manager's pass challenges it first
    view = eph.sync.status_view()
    (vf,) = view["files"]
    assert vf["holders"][liar.node_id]["state"] == "failed" and vf["holders"][liar.node_id]["reason"] == "absent"
    assert vf["confirmed_by"] == [] and view["challenges"]["failed"]["absent"] == 1
    assert liar.sync.status_view()["challenges"]["served_absent"] == 1
    assert not eph.sync.replicated_predicate()("data/cfg/c.npz")
    lie()
    await run_pass(eph, [honest], router)  # pushed again, to the honest member, never to the liar
    assert set(router.pushes) == {honest.addr.split(":")[0]}
    assert (honest.data_dir / "replicas" / eph.node_id / "cfg" / "c.npz").read_bytes() == data
    assert not eph.sync.replicated_predicate()("data/cfg/c.npz")  # the new holder not challenged yet
    await verify(eph, router)
    vf = eph.sync.status_view()["files"][0]
    assert vf["holders"][honest.node_id]["state"] == "verified" and vf["confirmed_by"] == [honest.node_id]
    assert eph.sync.replicated_predicate()("data/cfg/c.npz")


async def test_a_holder_answers_at_most_4_challenges_of_one_origin_at_once_and_counts_the_rest(cluster, monkeypatch):
    import threading

    import msgspec

    from p2pnode.sync import _possess

    eph, (d,) = cluster()
    release = threading.Event()

    def slow(store, req, me):
        release.wait(10)
        return _possess.ChallengeAnswer("absent")

    monkeypatch.setattr(_possess, "read_proofs", slow)
    statuses, asked = [], []

    async def ask():
        asked.append(1)
        nonce = bytes([len(asked)]) + b"n" * 31  # each its own (a nonce answered once is refused "replayed")
        req = _possess.ChallengeRequest(eph.node_id, d.node_id, "a.npz", 1, b"r" * 32, nonce, [0])
        body = msgspec.msgpack.encode(req)
        statuses.append((await d.sync.answer_challenge(_possess.sign_challenge(eph.identity, body), body))[0])

    async with trio.open_nursery() as n:
        for _ in range(4):
            n.start_soon(ask)
        await trio.testing.wait_all_tasks_blocked()
        await ask()  # the fifth, while four are under way
        assert statuses == [503] and d.sync.rejected["overloaded"] == 1
        release.set()
    assert statuses == [503, 200, 200, 200, 200]
    assert d.sync.status_view()["challenges"]["served"] == 4
