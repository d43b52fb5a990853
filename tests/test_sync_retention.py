"""Replica retention on durable nodes (issue 15, item 6): the pure policy and its safety rule (a property test over
random replica sets, receipts and listings), the store under its byte cap (retires by the policy; with only copies
left refuses with 507 and raises an alert, deleting nothing), crash safety of a retirement, and ``sync gc --dry-run``.

Acceptance: a durable node whose replica folder passes its byte cap retires replicas by the policy and never
deletes a file whose only copy it holds.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from helpers import FakeContext
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pnode.config import ConfigError, load_config
from p2pnode.identity import Identity
from p2pnode.inputs import decode_push_reply
from p2pnode.resources import ResourceSample
from p2pnode.snapshot import SCHEMA_VERSION, Snapshot, SyncSection, decode_snapshot, encode_snapshot
from p2pnode.sync import PushItem, ReplicaStore, SyncReject, SyncService, encode_push, sign_headers
from p2pnode.sync._index import receipts_digest
from p2pnode.synccore import (
    Held,
    Manifest,
    RetentionPolicy,
    effective_r,
    hash_block,
    listing_digest,
    note_unlisted,
    outranks,
    plan_retention,
)

DAY = 86400.0
ROOTS = [bytes([i]) * 32 for i in range(3)]


# -- the pure policy ---------------------------------------------------------------------------------------------

def held(origin, path, size=100, root=ROOTS[0], seq=1, at=0.0):
    return Held(origin, path, size, root, seq, at)


def names_where(me, other, origin, want_above, n, prefix="f"):
    """``n`` paths for which ``other`` ranks above ``me`` (``want_above``) or below."""
    out, i = [], 0
    while len(out) < n:
        p = f"{prefix}{i}.npz"
        if outranks(other, me, f"{origin}/{p}") == want_above:
            out.append(p)
        i += 1
    return out


def test_listed_files_stay_unlisted_ones_retire_after_k_and_d_only_with_a_higher_ranked_copy():
    me, up = "me", "up"
    a, b, c, e = names_where(me, up, "o", True, 4)
    (low,) = names_where(me, up, "o", False, 1)
    hs = [held("o", a, seq=1), held("o", b, seq=2), held("o", c, seq=3), held("o", low, seq=4),
          held("o", "listed.npz", seq=5), held("o", "alone.npz", seq=6), held("o", e, seq=7)]
    confirmed = {("o", p): frozenset({up}) for p in (a, b, c, e, low, "listed.npz")}
    listing = {"listed.npz": ROOTS[0]}
    since = {("o", a): 0.0, ("o", b): 0.0, ("o", c): 9 * DAY, ("o", low): 0.0, ("o", "alone.npz"): 0.0,
             ("o", e): 0.0}
    policy = RetentionPolicy(keep_versions=1, keep_days=5, replication_factor=1)
    plan = plan_retention(hs, me=me, policy=policy, listings={"o": listing}, confirmed_by=confirmed,
                          durable={me, up}, unlisted_since=since, now=10 * DAY)
    why = {d.held.path: (d.action, d.reason) for d in plan.retire + plan.keep}
    assert why["listed.npz"] == ("keep", "listed")
    assert why[e] == ("keep", "keep_versions")  # the newest unlisted one (seq 7), whatever its age
    assert why[c] == ("keep", "keep_days")  # unlisted for 1 day of 5
    assert why[a] == why[b] == ("retire", "retired")
    assert why[low] == ("keep", "highest_holder")  # the other copy ranks below: it goes there, not here
    assert why["alone.npz"] == ("keep", "only_copy")  # past K and D, but nobody else holds it
    plan = plan_retention(hs, me=me, policy=RetentionPolicy(replication_factor=1), listings={"o": listing},
                          confirmed_by=confirmed, durable={me, up}, unlisted_since=since, now=10 * DAY)
    why = {d.held.path: (d.action, d.reason, d.only_copy) for d in plan.retire + plan.keep}
    assert why["alone.npz"] == ("keep", "only_copy", True) and why[e] == ("retire", "retired", False)
    assert [d.held.path for d in plan.only_copies] == ["alone.npz"]
    assert not plan.full and plan.after_bytes == plan.held_bytes - 100 * len(plan.retire)


def test_an_unknown_listing_keeps_everything_and_the_cap_takes_replicas_r_others_hold_oldest_first():
    me, u1, u2 = "me", "u1", "u2"
    paths = [p for p in names_where(me, u1, "o", True, 40) if outranks(u2, me, f"o/{p}")][:3]
    hs = [held("o", p, size=100, at=float(i)) for i, p in enumerate(paths)] + [held("o", "one.npz", at=-1.0)]
    both = {("o", p): frozenset({u1, u2}) for p in paths}
    base = dict(me=me, listings={"o": None}, durable={me, u1, u2}, unlisted_since={}, now=0.0)
    plan = plan_retention(hs, policy=RetentionPolicy(replication_factor=2), confirmed_by=both, **base)
    assert not plan.retire and {d.reason for d in plan.keep} == {"listed", "only_copy"}
    plan = plan_retention(hs, policy=RetentionPolicy(cap_bytes=250, replication_factor=2), confirmed_by=both, **base)
    assert [(d.held.path, d.reason) for d in plan.retire] == [(paths[0], "over_cap"), (paths[1], "over_cap")]
    assert plan.after_bytes == 200 and not plan.full
    one = {k: frozenset({u1}) for k in both}  # R = 2 others needed: one is not enough
    plan = plan_retention(hs, policy=RetentionPolicy(cap_bytes=250, replication_factor=2), confirmed_by=one, **base)
    assert not plan.retire and plan.full and {d.reason for d in plan.keep} == {"below_r", "only_copy"}


def test_note_unlisted_stamps_first_sightings_and_forgets_listed_and_gone_files():
    since = note_unlisted([("o", "a"), ("o", "b"), ("p", "x")], {"o": {"b": ROOTS[0]}, "p": None},
                          {("o", "a"): 5.0, ("p", "x"): 7.0, ("o", "gone"): 1.0}, 100.0)
    assert since == {("o", "a"): 5.0, ("p", "x"): 7.0}
    assert note_unlisted([("o", "c")], {"o": {}}, {}, 100.0) == {("o", "c"): 100.0}


NODES = ["me", "n1", "n2", "n3", "n4"]
PATHS = ["a", "b", "c", "d", "e", "f"]


@st.composite
def worlds(draw):
    hs = []
    for o in ("o1", "o2"):
        for p in PATHS:
            if draw(st.booleans()):
                hs.append(Held(o, p, draw(st.integers(1, 1000)), ROOTS[draw(st.integers(0, 2))],
                               draw(st.integers(1, 50)), draw(st.floats(0, 1e6))))
    listings = {o: draw(st.none() | st.dictionaries(st.sampled_from(PATHS), st.sampled_from(ROOTS)))
                for o in ("o1", "o2")}
    confirmed = {h.key: frozenset(draw(st.sets(st.sampled_from(NODES)))) for h in hs}
    since = {h.key: draw(st.floats(0, 2e6)) for h in hs if draw(st.booleans())}
    policy = RetentionPolicy(cap_bytes=draw(st.integers(0, 6000)), keep_versions=draw(st.integers(0, 3)),
                             keep_days=draw(st.sampled_from([0.0, 1.0, 30.0])),
                             replication_factor=draw(st.integers(1, 4)))
    durable = draw(st.sets(st.sampled_from(NODES)))
    return hs, listings, confirmed, since, policy, durable


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_property_never_an_only_copy_and_the_cap_holds_when_enough_may_go(world):
    hs, listings, confirmed, since, policy, durable = world
    plan = plan_retention(hs, me="me", policy=policy, listings=listings, confirmed_by=confirmed, durable=durable,
                          unlisted_since=since, now=2e6)
    assert sorted(d.held.key for d in plan.retire + plan.keep) == sorted(h.key for h in hs)
    total = sum(h.size for h in hs)
    assert plan.held_bytes == total and plan.after_bytes == total - sum(d.held.size for d in plan.retire)
    known = set(durable) | {"me"}

    def only_copy(h):
        listing = listings.get(h.origin)
        return not (confirmed[h.key] - {"me"}) and not (listing is not None and listing.get(h.path) == h.root)

    def above(h):
        return {n for n in confirmed[h.key] - {"me"} if outranks(n, "me", f"{h.origin}/{h.path}")}

    def r(h):
        return effective_r(policy.replication_factor, len(known - {h.origin}))

    for d in plan.retire:
        assert not only_copy(d.held) and not d.only_copy  # the safety rule
        assert above(d.held)  # some higher-ranked durable member confirms this very version
        if d.reason == "over_cap":
            assert len(above(d.held)) >= r(d.held)
        else:
            assert d.reason == "retired" and listings[d.held.origin] is not None
            assert d.held.path not in listings[d.held.origin]
    for d in plan.keep:
        assert d.only_copy == only_copy(d.held)
    # the cap: honoured whenever what may go (retired, or R higher-ranked copies elsewhere) covers the excess
    may_go = {d.held.key for d in plan.retire if d.reason == "retired"}
    may_go |= {h.key for h in hs if not only_copy(h) and len(above(h)) >= r(h)}
    if policy.cap_bytes > 0 and total - sum(h.size for h in hs if h.key in may_go) <= policy.cap_bytes:
        assert plan.after_bytes <= policy.cap_bytes and not plan.full
    if plan.full:
        assert may_go <= {d.held.key for d in plan.retire}


@st.composite
def fleets(draw):
    files = {}
    for o in ("o1", "o2"):
        for p in PATHS:
            holders = draw(st.sets(st.sampled_from(NODES), min_size=1))
            files[(o, p)] = (holders, draw(st.integers(1, 1000)))
    listings = {o: draw(st.none() | st.dictionaries(st.sampled_from(PATHS), st.just(ROOTS[0])))
                for o in ("o1", "o2")}
    return files, listings, draw(st.integers(0, 3000)), draw(st.integers(1, 3))


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_property_durable_nodes_planning_at_once_from_the_same_receipts_never_delete_every_copy(fleet):
    files, listings, cap, r = fleet
    policy = RetentionPolicy(cap_bytes=cap, replication_factor=r)
    gone: dict[tuple[str, str], set[str]] = {k: set() for k in files}
    for node in NODES:
        hs = [Held(o, p, size, ROOTS[0], 1, 0.0) for (o, p), (holders, size) in files.items() if node in holders]
        confirmed = {(o, p): frozenset(holders - {node}) for (o, p), (holders, _) in files.items()}
        plan = plan_retention(hs, me=node, policy=policy, listings=listings, confirmed_by=confirmed,
                              durable=set(NODES), unlisted_since={}, now=1e9)
        for d in plan.retire:
            gone[d.held.key].add(node)
    for key, (holders, _) in files.items():
        assert holders - gone[key], f"every copy of {key} retired at once"


# -- config ------------------------------------------------------------------------------------------------------

def test_config_fields_env_and_validation(tmp_path):
    cfg = load_config(None, env={"P2PNODE_SYNC_RETENTION_CAP_BYTES": "1000", "P2PNODE_SYNC_RETENTION_KEEP_DAYS": "2"})
    y = cfg.sync
    assert (y.retention_cap_bytes, y.retention_keep_days, y.retention_keep_versions, y.retention_interval_s) == \
        (1000, 2.0, 16, 600.0)
    for bad in ({"retention_cap_bytes": -1}, {"retention_keep_versions": -1}, {"retention_keep_days": -1.0},
                {"retention_interval_s": 0.0}, {"retention_keep_days": float("nan")}):
        with pytest.raises(ConfigError, match="retention"):
            load_config(None, env={}, overrides={"sync": bad})


# -- the store under its cap -------------------------------------------------------------------------------------

def sample() -> ResourceSample:
    return ResourceSample(cpu_percent=1.0, cpu_count=4, load_avg=(0.0, 0.0, 0.0), mem_total_bytes=2**34,
                          mem_available_bytes=2**33, mem_used_bytes=2**33, mem_percent=50.0, disk_path="/",
                          disk_total_bytes=2**40, disk_used_bytes=2**36, disk_free_bytes=2**40 - 2**36,
                          disk_percent=6.25)


def manifest_of(data: bytes, bs: int = 128 * 1024) -> tuple[Manifest, list[tuple[int, bytes]]]:
    hashes = b"".join(hash_block(data[i:i + bs]) for i in range(0, len(data), bs))
    m = Manifest.build(len(data), bs, hashes)
    return m, [(i, data[i * bs:(i + 1) * bs]) for i in range(m.blocks)]


class World:
    """A durable node (real :class:`SyncService` and :class:`ReplicaStore` on ``tmp_path``) that holds replicas
    of origin ``o``; other durable members whose receipts it reads; ``o``'s listing served over a mock
    transport (``GET /sync/manifest``), bound to its snapshot by digest."""

    def __init__(self, tmp_path, **sync):
        cfg = load_config(None, env={}, overrides={
            "agent": {"data_dir": tmp_path / "d", "port": 0, "tags": ("durable",)},
            "discovery": {"mdns": False},
            "sync": {"data_port": -1, "replication_factor": 1, "retention_keep_versions": 0,
                     "retention_keep_days": 0.0, **sync},
        })
        self.ctx = FakeContext(cfg)
        self.ctx.last_sample = sample()
        self.sync = SyncService(self.ctx)
        self.origin = Identity.generate()
        self.o = self.origin.node_id
        self.peers = {name: Identity.generate() for name in ("h1", "h2")}
        self.listing: dict[str, bytes] = {}
        self.manifest_gets = 0
        self.version = 0
        self.ctx.client = httpx.AsyncClient(transport=httpx.MockTransport(self._serve))

    def _serve(self, request):
        assert request.url.path == "/sync/manifest"
        self.manifest_gets += 1
        return httpx.Response(200, json={"files": [{"path": p, "root": r.hex()}
                                                   for p, r in sorted(self.listing.items())]})

    def put(self, ident, tags, sync):
        self.version += 1
        snap = Snapshot(schema=SCHEMA_VERSION, origin=ident.node_id, version=self.version, addr="10.0.0.1:80",
                        tags=tags, leaving=False, sync=sync)
        self.ctx.put(decode_snapshot(encode_snapshot(snap)), ident.public_key)

    def origin_lists(self, listing):
        self.listing = dict(listing)
        self.put(self.origin, ["ephemeral"], SyncSection(digest=listing_digest(listing), files=len(listing)))

    def peer_confirms(self, name, paths):
        recs = sorted([[p, self.sizes[p], self.roots[p]] for p in paths], key=lambda r: r[0])
        self.put(self.peers[name], ["durable"], SyncSection(
            receipts={self.o: [tuple(r) for r in recs]} if recs else {},
            receipt_digests={self.o: receipts_digest(recs)} if recs else {}))

    def commit(self, files):
        self.sizes, self.roots = {}, {}
        for seq, (path, data) in enumerate(files.items(), 1):
            m, blocks = manifest_of(data)
            assert self.sync.store.apply(self.o, PushItem(path, m, seq, blocks))["status"] == "committed"
            self.sizes[path], self.roots[path] = m.size, m.root

    def above(self, name, path):
        return outranks(self.peers[name].node_id, self.ctx.node_id, f"{self.o}/{path}")

    def replica(self, path):
        return self.ctx.data_dir / "replicas" / self.o / path


def paths_above(w, name, n, prefix):
    out, i = [], 0
    while len(out) < n:
        p = f"{prefix}{i}/x.npz"
        if w.above(name, p):
            out.append(p)
        i += 1
    return out


async def test_past_its_cap_a_durable_node_retires_by_the_policy_and_keeps_its_only_copies(tmp_path):
    w = World(tmp_path, retention_cap_bytes=250_000)
    deleted, extra = paths_above(w, "h1", 2, "p")
    files = {deleted: os.urandom(100_000), extra: os.urandom(100_000), "keep/b.npz": os.urandom(100_000),
             "keep/c.npz": os.urandom(100_000)}
    w.commit(files)
    w.origin_lists({p: w.roots[p] for p in (extra, "keep/b.npz", "keep/c.npz")})  # the origin deleted one file
    w.peer_confirms("h1", [deleted, extra])
    w.put(w.peers["h2"], ["durable"], SyncSection())
    plan = await w.sync.retention_pass()
    assert [(d.held.path, d.reason) for d in plan.retire] == [(deleted, "retired"), (extra, "over_cap")]
    assert not w.replica(deleted).exists() and not w.replica(extra).exists()
    assert not w.replica(deleted).parent.exists()  # its folder, left empty, went too
    assert w.replica("keep/b.npz").read_bytes() == files["keep/b.npz"]
    store = w.sync.store
    assert store.held_bytes() == 200_000 and sorted(p for _, p in store.index) == ["keep/b.npz", "keep/c.npz"]
    assert [r[0] for r in store.receipts_for(w.o)] == ["keep/b.npz", "keep/c.npz"]  # receipts withdrawn
    assert {r[0] for r in w.sync.section().receipts[w.o]} == {"keep/b.npz", "keep/c.npz"}
    assert w.sync.section().receipt_digests[w.o] == receipts_digest(store.receipts_for(w.o))
    assert w.ctx.published >= 1 and w.manifest_gets == 1 and not w.ctx.events
    w.sync.inbound.admit()  # within the cap: new data welcome
    view = w.sync.status_view()["retention"]
    assert view["passes"] == 1 and view["last_pass"]["retired_count"] == 2 and not view["full"]
    assert view["plan"]["retire_count"] == 0 and view["plan"]["held_bytes"] == 200_000
    reopened = ReplicaStore(w.ctx.data_dir)  # what a restart finds: the same
    assert sorted(p for _, p in reopened.index) == ["keep/b.npz", "keep/c.npz"]
    await w.ctx.client.aclose()


async def test_past_its_cap_with_only_copies_it_refuses_with_507_raises_an_alert_and_deletes_nothing(tmp_path):
    w = World(tmp_path, retention_cap_bytes=150_000)
    (x,) = paths_above(w, "h1", 1, "x")
    files = {x: os.urandom(100_000), "y.npz": os.urandom(100_000)}
    w.commit(files)
    w.origin_lists({})  # the origin deleted both: this node holds the only copies
    w.peer_confirms("h1", [])
    plan = await w.sync.retention_pass()
    assert not plan.retire and plan.full and len(plan.only_copies) == 2
    assert all(w.replica(p).read_bytes() == d for p, d in files.items())
    assert [n for n, _ in w.ctx.events] == ["BACKPRESSURE_ACTIVATED"]
    payload = w.ctx.events[0][1]
    assert payload["cause"] == "replica_cap" and payload["only_copies"] == 2 and payload["cap_bytes"] == 150_000
    with pytest.raises(SyncReject) as exc:
        w.sync.inbound.admit()
    assert exc.value.status == 507 and exc.value.reason == "backpressure"
    # a real push is refused before its body is read
    m, blocks = manifest_of(b"new data")
    body = encode_push([PushItem("new.npz", m, 9, blocks)])
    headers = {k.lower(): v for k, v in sign_headers(w.origin, "POST", "/sync/push", body).items()}

    async def chunks():
        yield body

    status, reply = await w.sync.receive_push(headers, str(len(body)), chunks())
    assert status == 507 and decode_push_reply(reply)[0].reason == "backpressure"
    view = w.sync.status_view()
    assert view["retention"]["full"] and view["retention"]["refused"] == {"replica_cap": 2}
    assert view["received"]["refused_requests"]["backpressure"] == 1  # the push (admit() alone counts no request)
    assert view["retention"]["plan"]["only_copy_count"] == 2 and not view["retention"]["plan"]["retire"]
    assert not w.replica("new.npz").exists()
    # another durable node, ranked above, confirms one of them: it may go now, and there is room again
    w.peer_confirms("h1", [x])
    plan = await w.sync.retention_pass()
    assert [(d.held.path, d.reason) for d in plan.retire] == [(x, "retired")] and not plan.full
    assert not w.replica(x).exists() and w.replica("y.npz").read_bytes() == files["y.npz"]
    assert [n for n, _ in w.ctx.events] == ["BACKPRESSURE_ACTIVATED", "BACKPRESSURE_RELEASED"]
    w.sync.inbound.admit()
    await w.ctx.client.aclose()


def test_a_retirement_cut_short_by_a_crash_leaves_a_consistent_store(tmp_path, monkeypatch):
    for crash in ("after_rename", "after_index"):
        d = tmp_path / crash
        store = ReplicaStore(d)
        m, blocks = manifest_of(os.urandom(50_000))
        assert store.apply("o", PushItem("a/f.npz", m, 1, blocks))["status"] == "committed"
        if crash == "after_rename":
            monkeypatch.setattr(store.held, "_save", lambda: (_ for _ in ()).throw(KeyboardInterrupt))
        else:  # the index is written; the unlink of the copy in the trash is what the crash cuts short
            monkeypatch.setattr("pathlib.Path.unlink", lambda self, missing_ok=False: (_ for _ in ()).throw(
                KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            store.retire("o", "a/f.npz", m.root)
        monkeypatch.undo()
        again = ReplicaStore(d)  # the restart
        assert not again.index and again.receipts_for("o") == []
        assert not (d / "replicas" / "o" / "a" / "f.npz").exists() and not list((d / ".sync" / "trash").iterdir())
        assert again.retire("o", "a/f.npz", m.root) == 0


def test_retire_leaves_a_newer_version_alone(tmp_path):
    store = ReplicaStore(tmp_path)
    m, blocks = manifest_of(os.urandom(10_000))
    store.apply("o", PushItem("f.npz", m, 1, blocks))
    assert store.retire("o", "f.npz", b"\x01" * 32) == 0 and (tmp_path / "replicas" / "o" / "f.npz").exists()
    assert store.retire("o", "f.npz", m.root) == 10_000 and store.retirement.retired_bytes == 10_000


def test_the_listing_digest_is_the_one_pushers_sign(tmp_path):
    cfg = load_config(None, env={}, overrides={"agent": {"data_dir": tmp_path, "port": 0, "tags": ("ephemeral",)},
                                               "discovery": {"mdns": False}, "sync": {"settle_s": 0.0}})
    svc = SyncService(FakeContext(cfg))
    (svc.root / "a").mkdir(parents=True)
    (svc.root / "a" / "x.npz").write_bytes(b"x" * 1000)
    (svc.root / "b.npz").write_bytes(b"y" * 10)
    svc.source.scan(1e12)
    assert svc.section().digest == listing_digest({f.path: f.manifest.root for f in svc.source.files.values()})


def test_the_policy_imports_without_trio_or_httpx():
    script = textwrap.dedent("""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("trio", "httpx", "anyio", "psutil", "pynvml"):
                    raise ImportError(name)
        sys.meta_path.insert(0, Block())
        import p2pnode.synccore
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- the CLI -----------------------------------------------------------------------------------------------------

def serve_json(view):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(view).encode()
            self.send_response(200 if self.path == "/sync/status" else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


async def test_sync_gc_dry_run_lists_what_would_go_and_the_only_copies(tmp_path, capsys):
    from p2pnode.cli import main

    w = World(tmp_path, retention_cap_bytes=250_000)
    (deleted,) = paths_above(w, "h1", 1, "p")
    w.commit({deleted: os.urandom(100_000), "only.npz": os.urandom(100_000), "kept.npz": os.urandom(100_000)})
    w.origin_lists({"kept.npz": w.roots["kept.npz"]})
    w.peer_confirms("h1", [deleted])
    await w.sync.retention_inputs.refresh(w.sync.store.held_replicas())  # what a pass fetches first
    view = json.loads(json.dumps(w.sync.status_view()))
    server = serve_json(view)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["sync", "gc", "--dry-run", "--url", url]) == 0
        out = capsys.readouterr().out
        assert "would retire (1)" in out and deleted in out and "origin deleted it" in out
        assert "kept: only copies (1)" in out and "only.npz" in out and "no other durable node" in out
        assert main(["sync", "gc", "--dry-run", "--json", "--url", url]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert [d["path"] for d in plan["retire"]] == [deleted] and plan["retire"][0]["reason"] == "retired"
        assert [d["path"] for d in plan["only_copies"]] == ["only.npz"] and not plan["full"]
    finally:
        server.shutdown()
    assert all(w.replica(p).exists() for p in (deleted, "only.npz", "kept.npz"))  # a dry run deletes nothing
    server = serve_json({**view, "keeps": False, "retention": None})
    try:
        assert main(["sync", "gc", "--dry-run", "--url", f"http://127.0.0.1:{server.server_address[1]}"]) == 1
        assert "keeps no replicas" in capsys.readouterr().err
    finally:
        server.shutdown()
    await w.ctx.client.aclose()
