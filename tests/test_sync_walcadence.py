"""The backup path's cadence for a database shipped by its write-ahead log, between in-process nodes (the real
pusher, WAL shipper and routes over httpx transports, as in ``test_sync_inprocess.py``): copies are rare while the
durable target holds the log's last segment, every interval again when it refuses or shipping falls back, and a
WAL position never makes the database deletable."""

import sqlite3

import httpx
import msgspec
import trio
from test_sync_inprocess import Router, link, make_node, verify

from p2pnode.sync._walship import WAL_PATH


class WalRouter(Router):
    """:class:`Router` plus ``POST /sync/wal``; ``refuse_wal`` answers the next N segments ``out_of_order``."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.refuse_wal = 0

    async def handle_async_request(self, request):
        if request.url.path != WAL_PATH:
            return await super().handle_async_request(request)
        body = await request.aread()
        if self.refuse_wal:
            self.refuse_wal -= 1
            return httpx.Response(409, content=msgspec.msgpack.encode({"error": "out_of_order", "detail": "test"}))
        node = self.nodes[request.url.host]

        async def chunks():
            yield body

        headers = {k.lower(): v for k, v in request.headers.items()}
        status, reply = await node.sync.receive_wal(headers, str(len(body)), chunks())
        return httpx.Response(status, content=reply)


async def sync_pass(eph, d, router):
    """One push pass (its scan included) and then the WAL pass, as the agent's push loop runs them."""
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        eph.ctx.client = client
        await eph.sync.pass_once()
        await eph.sync._ship_wal(eph.sync.pusher)
    link(eph, d)


class Writer:
    def __init__(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.con = sqlite3.connect(path, isolation_level=None)
        self.con.execute("PRAGMA journal_mode=WAL")
        self.con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
        self.rows = 0

    def insert(self, n=10):
        self.con.execute("BEGIN")
        for _ in range(n):
            self.con.execute("INSERT INTO t (v) VALUES (randomblob(300))")
        self.con.execute("COMMIT")
        self.rows += n


def wal_rows(d, eph):
    p = d.data_dir / "walreplicas" / eph.node_id / "cfg" / "live.db"
    r = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
    try:
        assert r.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return r.execute("SELECT count(*) FROM t").fetchone()[0]
    finally:
        r.close()


async def setup(tmp_path, **sync):
    eph = make_node(tmp_path, "eph", "ephemeral", replication_factor=1, **sync)
    d = make_node(tmp_path, "d0", "durable", replication_factor=1, **sync)
    link(eph, d)
    link(d, eph)
    w = Writer(eph.sync.root / "cfg" / "live.db")
    w.insert()
    router = WalRouter([eph, d])
    await sync_pass(eph, d, router)  # the first copy (pushed) and the first WAL snapshot
    await sync_pass(eph, d, router)  # the receipt seen
    return eph, d, w, router


def backups(eph):
    return eph.sync.status_view()["sent"]["sqlite_backups"]


async def test_a_wal_current_database_is_copied_rarely_and_never_deletable_on_its_wal_position(tmp_path):
    eph, d, w, router = await setup(tmp_path)
    assert backups(eph) == 1 and wal_rows(d, eph) == w.rows
    (f,) = eph.sync.status_view()["files"]
    assert f["replicas"] == 1 and f["carried_by"] == "wal"
    await verify(eph, router)
    assert eph.sync.replicated_predicate()("data/cfg/live.db")  # the copy's version, R receipts, challenged
    for _ in range(20):  # a change every interval: the log carries each, the backup path copies none
        w.insert()
        await sync_pass(eph, d, router)
        assert wal_rows(d, eph) == w.rows
    view = eph.sync.status_view()
    assert view["sent"]["sqlite_backups"] == 1 and view["sent"]["sqlite_backups_deferred"] == 20
    (f,) = view["files"]
    assert f["carried_by"] == "wal" and f["lag_s"] == 0.0  # not lagging for its rare copy
    per = view["wal"]["sent"]["files"]["cfg/live.db"]
    assert per["current"] == [d.node_id] and per["targets"][d.node_id]["seq"] == per["seq"]
    # the WAL replica is current, yet the live database is past the receipted copy: nothing may delete it
    await verify(eph, router)
    assert not eph.sync.replicated_predicate()("data/cfg/live.db")
    assert eph.sync.protected_predicate()("data/cfg/live.db")
    assert d.sync.retention_plan().retire == []  # and the durable side retires nothing on it


async def test_a_refusing_target_makes_the_copy_due_at_once_and_the_interval_zero_copies_every_time(tmp_path):
    eph, d, w, router = await setup(tmp_path)
    for _ in range(3):
        w.insert()
        await sync_pass(eph, d, router)
    assert backups(eph) == 1
    router.refuse_wal = 1
    w.insert()
    await sync_pass(eph, d, router)  # the segment refused: the next scan copies
    assert eph.sync.status_view()["files"][0]["carried_by"] == "backup"
    w.insert()
    await sync_pass(eph, d, router)  # copied at once; the snapshot brings the target back
    assert backups(eph) == 2 and wal_rows(d, eph) == w.rows
    for _ in range(5):  # the copy came after the refusal, the target is current again: rare again
        w.insert()
        await sync_pass(eph, d, router)
    assert backups(eph) == 2 and eph.sync.status_view()["files"][0]["carried_by"] == "wal"
    # out of WAL mode: the backup path every interval
    w.con.execute("PRAGMA journal_mode=DELETE")
    for _ in range(3):
        w.insert()
        await sync_pass(eph, d, router)
    assert backups(eph) == 5 and eph.sync.status_view()["files"][0]["carried_by"] == "backup"


async def test_wal_backup_interval_zero_copies_every_change(tmp_path):
    eph, d, w, router = await setup(tmp_path, wal_backup_interval_s=0.0)
    for _ in range(5):
        w.insert()
        await sync_pass(eph, d, router)
    assert backups(eph) == 6 and wal_rows(d, eph) == w.rows
    assert eph.sync.status_view()["files"][0]["carried_by"] == "backup"



async def test_a_reader_holding_the_replica_past_the_wait_costs_a_retry_not_a_snapshot(tmp_path):
    """The 1 GiB run between two agents (``bench/sync_wal.py --agents``): a reader copying the replica held its
    lock 7 s, past the receiver's wait (5 s), the target answered ``busy``, and the sender started again with a
    whole 1 GiB snapshot. A ``busy`` leaves the replica where it was: the segment is offered again at the next
    pass, with the one after it, and nothing else is sent."""
    eph, d, w, router = await setup(tmp_path)
    sender = eph.sync.wal.senders["cfg/live.db"]
    replica = d.sync.wal_in.replicas.replica(eph.node_id, "cfg/live.db")
    replica.lock_timeout_s = 0.05
    reader = sqlite3.connect(f"file:{replica.path}?mode=ro", uri=True)
    reader.execute("BEGIN")
    held = reader.execute("SELECT count(*) FROM t").fetchone()[0]
    w.insert()
    await sync_pass(eph, d, router)  # the apply waits 0.05 s for the reader, then answers busy
    assert d.sync.wal_in.replicas.refused["busy"] == 1 and eph.sync.wal.stats["refused:busy"] == 1
    assert len(eph.sync.wal.pending["cfg/live.db"]) == 1
    reader.execute("COMMIT")
    reader.close()
    assert held == w.rows - 10
    w.insert()
    await sync_pass(eph, d, router)  # the kept segment, then the new one
    assert wal_rows(d, eph) == w.rows and not eph.sync.wal.pending
    for _ in range(3):
        w.insert()
        await sync_pass(eph, d, router)
        assert wal_rows(d, eph) == w.rows
    assert sender.stats["snapshots"] == 1  # the first one only
    per = eph.sync.status_view()["wal"]["sent"]["files"]["cfg/live.db"]
    assert per["current"] == [d.node_id] and per["targets"][d.node_id]["seq"] == per["seq"]


async def test_a_wal_pass_under_way_is_marked_on_its_standing(tmp_path):
    """While a database's segments are being posted its standing says since when the pass is under way (so a slow
    segment does not age its targets out, :func:`p2pnode.synccore.current_targets`); after the pass it says none."""
    eph, d, w, router = await setup(tmp_path)
    seen = []
    handle = router.handle_async_request

    async def spy(request):
        if request.url.path == WAL_PATH:
            seen.append(eph.sync.wal.standing["cfg/live.db"].pass_started_at)
        return await handle(request)

    router.handle_async_request = spy
    w.insert()
    await sync_pass(eph, d, router)
    assert len(seen) == 1 and seen[0] is not None
    assert eph.sync.wal.standing["cfg/live.db"].pass_started_at is None


async def test_segments_kept_for_a_busy_target_are_bounded_in_bytes_not_only_in_count(tmp_path, monkeypatch):
    """Review of issue 40 (MEDIUM): the segments kept for a ``busy`` target were bounded by count alone (32), each
    held in memory, and a ``frames`` segment holds up to 16,384 pages (64 MiB of 4 KiB pages, 1 GiB of 64 KiB
    pages): a reader holding the replica for minutes could make the sender hold GiBs per database. Now the kept
    payloads are bounded in bytes too (``MAX_PENDING_BYTES``, here made 1.5 segments' worth): past it the sender
    starts again with a snapshot, and the replica still ends equal to the source once the reader lets go."""
    from p2pnode.sync import _walship

    eph, d, w, router = await setup(tmp_path)
    sender = eph.sync.wal.senders["cfg/live.db"]
    replica = d.sync.wal_in.replicas.replica(eph.node_id, "cfg/live.db")
    replica.lock_timeout_s = 0.05
    reader = sqlite3.connect(f"file:{replica.path}?mode=ro", uri=True)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM t").fetchone()
    w.insert(200)  # about 60 KiB of random rows: one segment
    await sync_pass(eph, d, router)
    (seg,) = eph.sync.wal.pending["cfg/live.db"]
    monkeypatch.setattr(_walship, "MAX_PENDING_BYTES", len(seg.payload) * 3 // 2, raising=False)
    snapshots = sender.stats["snapshots"]
    for _ in range(4):
        w.insert(200)
        await sync_pass(eph, d, router)
        held = sum(len(s.payload) for s in eph.sync.wal.pending.get("cfg/live.db", [])
                   if isinstance(s.payload, bytes))
        assert held <= len(seg.payload) * 3 // 2, held
    assert sender.stats["snapshots"] > snapshots  # the bound gave way to a snapshot
    reader.execute("COMMIT")
    reader.close()
    for _ in range(2):
        w.insert()
        await sync_pass(eph, d, router)
    assert wal_rows(d, eph) == w.rows and not eph.sync.wal.pending


async def test_a_target_that_never_answers_cannot_hold_a_wal_pass_and_its_standing_as_current(tmp_path):
    """Review of issue 40 (MEDIUM): while a WAL pass is under way its targets' freshness is measured up to the pass's
    start, and the pass had no whole-request deadline (httpx's timeouts are per read or write: a target that
    trickles its reading or its answer defeats them), so a member that never finished answering kept every
    database's targets current for as long as it liked: the backup path copied only every
    ``wal_backup_interval_s`` and no WAL pass ran again. Now a segment not answered within twice the receiver's own
    deadline fails like an unreachable target: a fallback, the backup copy due at once."""
    eph, d, w, router = await setup(tmp_path, request_timeout_s=0.2)
    handle = router.handle_async_request
    stalled = trio.Event()

    async def never(request):
        if request.url.path == WAL_PATH:
            stalled.set()
            await trio.sleep_forever()  # reads the body, then never answers
        return await handle(request)

    router.handle_async_request = never
    w.insert()
    with trio.move_on_after(30):  # a deadline for the test only: the post fails after about 0.4 s
        await sync_pass(eph, d, router)
    assert stalled.is_set()
    assert eph.sync.wal.stats["failed"] == 1
    assert eph.sync.wal.standing["cfg/live.db"].pass_started_at is None  # the pass ended
    assert eph.sync.wal.backup_due("cfg/live.db")


async def test_a_snapshot_kept_for_a_busy_target_drops_the_segments_before_it(tmp_path):
    """Review of issue 40: a snapshot applies on any older replica, so the segments kept before it for a ``busy``
    target are dropped (before, the kept ones were offered again first, each answered ``busy`` again, and the
    snapshot waited behind them; several kept snapshots each held a whole copy in the staging folder). A
    snapshot is renamed over the replica without its lock, so it goes in even while the reader stays."""
    eph, d, w, router = await setup(tmp_path)
    sender = eph.sync.wal.senders["cfg/live.db"]
    replica = d.sync.wal_in.replicas.replica(eph.node_id, "cfg/live.db")
    replica.lock_timeout_s = 0.05
    reader = sqlite3.connect(f"file:{replica.path}?mode=ro", uri=True)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM t").fetchone()
    w.insert()
    await sync_pass(eph, d, router)
    assert [s.header.kind for s in eph.sync.wal.pending["cfg/live.db"]] == ["frames"]
    sender.max_segment_frames = 1  # the next loss of frames is more than a segment: a snapshot
    w.insert()
    other = sqlite3.connect(eph.sync.root / "cfg" / "live.db", isolation_level=None)
    other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    other.close()
    await sync_pass(eph, d, router)
    assert sender.stats["snapshots"] == 2 and eph.sync.wal.stats["refused:busy"] == 1
    assert not eph.sync.wal.pending and not list(eph.sync.wal.staging_dir.iterdir())
    reader.execute("COMMIT")
    reader.close()
    assert wal_rows(d, eph) == w.rows
    sender.max_segment_frames = 16384
    w.insert()
    await sync_pass(eph, d, router)
    assert wal_rows(d, eph) == w.rows and not eph.sync.wal.pending
