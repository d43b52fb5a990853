"""ClusterState, PeerBook and Gossiper as pure objects: real cores over an in-memory wire. Entries hold the typed
snapshot (schema 2) the decoder made at the wire."""


import random

import msgpack
import msgspec
import pytest
from helpers import envelope, snapshot, typed

from p2pnode.errors import RejectReason
from p2pnode.gossip import ClusterState, Gossiper, PeerBook, parse_hostport
from p2pnode.identity import Identity
from p2pnode.snapshot import Snapshot
from p2pnode.wire import WireLimits, decode_gossip, encode_gossip, seal_snapshot


def test_merge_accepts_newer_rejects_stale_and_counts():
    me, a = Identity.generate(), Identity.generate()
    st = ClusterState(me.node_id)
    r = st.merge([envelope(a, 5, membership={"incarnation": 2}, jobs={"offer": 3})], now=1.0)
    assert r.accepted == [a.node_id] and st.digest() == {a.node_id: 5}
    held = st.get(a.node_id).snapshot
    assert isinstance(held, Snapshot) and held.membership.incarnation == 2 and held.jobs.offer == 3
    r = st.merge([envelope(a, 5), envelope(a, 4)], now=2.0)  # replay, and an older copy in the same batch
    assert r.accepted == [] and sorted(x.reason for x in r.rejected) == [RejectReason.DUPLICATE, RejectReason.STALE]
    assert st.rejected[RejectReason.STALE] == 1 and st.rejected[RejectReason.DUPLICATE] == 1
    r = st.merge([envelope(a, 4)], now=2.0)
    assert [x.reason for x in r.rejected] == [RejectReason.STALE]
    assert st.get(a.node_id).received_at == 1.0
    r = st.merge([envelope(a, 6)], now=3.0)
    assert r.accepted == [a.node_id] and st.get(a.node_id).version == 6


def test_stale_is_rejected_before_verifying():
    me, a = Identity.generate(), Identity.generate()
    st = ClusterState(me.node_id)
    st.merge([envelope(a, 5)], now=0.0)
    before = st.verifications
    st.merge([envelope(a, 3)], now=0.0)
    assert st.verifications == before


def test_rest_of_batch_used_when_one_is_forged():
    me, a, b = Identity.generate(), Identity.generate(), Identity.generate()
    st = ClusterState(me.node_id)
    bad = envelope(a, 1)
    bad = msgspec.structs.replace(bad, body=bad.body[:-1] + bytes([bad.body[-1] ^ 1]))
    r = st.merge([bad, envelope(b, 1)], now=0.0)
    assert r.accepted == [b.node_id]
    assert r.rejected[0].reason is RejectReason.BAD_SIGNATURE and r.rejected[0].origin == a.node_id
    assert a.node_id not in st.digest()


def test_own_origin_never_overwritten_but_reported():
    me = Identity.generate()
    st = ClusterState(me.node_id)
    own = envelope(me, 10)
    st.set_local(own, typed(own), now=0.0)
    r = st.merge([envelope(me, 50)], now=1.0)
    assert r.accepted == [] and r.self_version_seen == 50
    assert st.get(me.node_id).version == 10
    with pytest.raises(ValueError):
        st.set_local(own, typed(own), now=2.0)


def test_delta_newest_first_and_bounded():
    me = Identity.generate()
    st = ClusterState(me.node_id)
    ids = [Identity.generate() for _ in range(5)]
    for t, ident in enumerate(ids):
        st.merge([envelope(ident, 1)], now=float(t))
    d = st.delta({})
    assert [e.origin for e in d] == [i.node_id for i in reversed(ids)]
    assert st.delta({i.node_id: 1 for i in ids}) == []
    assert [e.origin for e in st.delta({ids[0].node_id: 0})][-1] == ids[0].node_id
    one = d[0].wire_size
    assert len(st.delta({}, max_bytes=2 * one + 10)) == 2


def test_push_carries_news_and_leaves_bare_heartbeats_to_pull():
    st = ClusterState("me")
    A, B = "10.0.0.1:8770", "10.0.0.2:8770"  # fixed: a new address would be news
    a, b = Identity.generate(), Identity.generate()
    st.merge([envelope(a, 1, addr=A, membership={"incarnation": 1})], now=0.0)
    st.merge([envelope(b, 1, addr=B)], now=0.0)
    # a: a bare heartbeat (new version, new resource sample); b: news (its incarnation changed).
    st.merge([envelope(a, 2, addr=A, membership={"incarnation": 1}, resources={"cpu_percent": 55.0})], now=1.0)
    st.merge([envelope(b, 2, addr=B, membership={"incarnation": 2})], now=1.0)
    peer_digest = {a.node_id: 1, b.node_id: 1}
    assert {e.origin for e in st.delta(peer_digest)} == {a.node_id, b.node_id}  # a pull gets everything newer
    assert [e.origin for e in st.delta(peer_digest, news_only=True)] == [b.node_id]  # a push only the news
    assert [e.origin for e in st.delta({}, news_only=True)] != []  # a member the peer lacks is always news
    # News stays news for a peer that missed it, even after later bare heartbeats.
    st.merge([envelope(b, 3, addr=B, membership={"incarnation": 2}, resources={"cpu_percent": 9.0})], now=2.0)
    assert [e.origin for e in st.delta(peer_digest, news_only=True)] == [b.node_id]
    assert st.delta({a.node_id: 1, b.node_id: 2}, news_only=True) == []


def test_parse_hostport():
    assert parse_hostport("10.0.0.1:8770") == ("10.0.0.1", 8770)
    assert parse_hostport("[::1]:9") == ("::1", 9)
    assert parse_hostport("host", default_port=8770) == ("host", 8770)
    for bad in ("", ":80", "h:0", "h:x", "a:b:c", "h:70000"):
        with pytest.raises(ValueError):
            parse_hostport(bad, default_port=1)


def test_peerbook_backoff_left_and_preferred_address():
    book = PeerBook("me", base_backoff_s=1.0, max_backoff_s=4.0)
    rng = random.Random(1)
    book.add("10.0.0.1:1", "join")
    book.report("10.0.0.1:1", False, now=0.0)
    assert book.choose(3, 0.5, rng) == []
    assert book.choose(3, 1.0, rng) == ["10.0.0.1:1"]
    for _ in range(5):
        book.report("10.0.0.1:1", False, now=10.0)
    assert book.get("10.0.0.1:1").next_attempt_at == 14.0  # capped
    book.report("10.0.0.1:1", True, now=20.0, node_id="n1")
    book.add("10.0.0.9:1", "gossip", node_id="n1", advertised=True)
    assert book.choose(3, 20.0, rng) == ["10.0.0.9:1"]  # one address per node, the advertised one
    book.mark_left("n1")
    assert book.choose(3, 20.0, rng) == []
    book.add("me-addr:1", "gossip", node_id="me")
    assert book.choose(3, 20.0, rng) == []


class MemNet:
    """N Gossipers wired by direct calls; ``loss`` drops whole exchanges."""

    def __init__(self, n, *, fanout=3, seed=0, loss=0.0):
        self.rng = random.Random(seed)
        self.loss = loss
        self.idents = [Identity.generate() for _ in range(n)]
        self.nodes = {}
        self.versions = {}
        for i, ident in enumerate(self.idents):
            addr = f"n{i}:1"
            st = ClusterState(ident.node_id)
            book = PeerBook(ident.node_id)
            book.self_addrs.add(addr)
            if i:
                book.add("n0:1", "join")
            self.nodes[addr] = Gossiper(st, book, self_addr=addr, fanout=fanout, rng=random.Random(self.rng.random()))
            self.bump(addr, now=0.0)

    def bump(self, addr, now):
        g = self.nodes[addr]
        ident = self.idents[int(addr[1:].split(":")[0])]
        v = self.versions.get(addr, 0) + 1
        self.versions[addr] = v
        env = seal_snapshot(ident, snapshot(ident, v, addr=addr))
        g.state.set_local(env, typed(env), now)

    def round(self, now):
        for g in self.nodes.values():
            for target in g.choose_targets(now):
                if self.rng.random() < self.loss:
                    g.on_failure(target, now)
                    continue
                reply = self.nodes[target].handle(g.open_request(), now)
                push = g.on_reply(target, reply.status, reply.content_type, reply.body, now)
                if push is not None:
                    reply = self.nodes[target].handle(push, now)
                    g.on_reply(target, reply.status, reply.content_type, reply.body, now, push=False)

    def converged(self):
        want = {g.state.self_id: self.versions[a] for a, g in self.nodes.items()}
        return all(g.state.digest() == want for g in self.nodes.values())


def test_fifty_nodes_converge_from_one_seed_in_log_rounds():
    net = MemNet(50, seed=7)
    rounds = 0
    while not net.converged():
        rounds += 1
        net.round(float(rounds))
        assert rounds <= 12, "no convergence in 12 rounds"
    # A fresh update on one node then reaches everyone within a handful of rounds.
    net.bump("n17:1", now=100.0)
    for r in range(1, 10):
        net.round(100.0 + r)
        if net.converged():
            break
    assert net.converged()


def test_convergence_under_thirty_percent_loss():
    net = MemNet(30, seed=3, loss=0.3)
    for r in range(1, 40):
        net.round(float(r))
        if net.converged():
            break
    assert net.converged()


def test_handle_statuses_and_rejected_list():
    a, b, c = Identity.generate(), Identity.generate(), Identity.generate()
    g = Gossiper(ClusterState(a.node_id), PeerBook(a.node_id), self_addr="a:1", fanout=3, rng=random.Random(0))
    ok = g.handle(encode_gossip(b.node_id, "b:1", {}, [envelope(b, 1)]), now=0.0)
    assert ok.status == 200
    stale = g.handle(encode_gossip(b.node_id, "b:1", {}, [envelope(b, 1)]), now=0.0)
    assert stale.status == 409 and decode_gossip(stale.body).rejected == [(b.node_id, "stale")]
    forged = envelope(c, 1)
    forged = msgspec.structs.replace(forged, sig=bytes(64))
    mixed = g.handle(encode_gossip(b.node_id, "b:1", {}, [forged, envelope(b, 2)]), now=0.0)
    assert mixed.status == 422
    assert decode_gossip(mixed.body).rejected == [(c.node_id, "bad_signature")]
    assert g.state.get(b.node_id).version == 2  # the rest of the batch was used
    bad = g.handle(b"\xc1", now=0.0)
    assert bad.status == 400 and bad.content_type == "application/json"
    big = Gossiper(ClusterState("x", limits=WireLimits(max_body_bytes=8192, max_snapshot_bytes=1024)), PeerBook("x"),
                   self_addr="x:1", fanout=1, rng=random.Random(0))
    assert big.handle(b"\x00" * 9000, now=0.0).status == 413
    assert big.handle(msgpack.packb({"schema": 9, "from": "q"}), now=0.0).status == 422


def test_peer_book_learns_addresses_only_from_signed_snapshots():
    a, b = Identity.generate(), Identity.generate()
    g = Gossiper(ClusterState(a.node_id), PeerBook(a.node_id), self_addr="a:1", fanout=3, rng=random.Random(0))
    for i in range(500):  # unauthenticated: the stated addr of a message never enters the book
        g.handle(encode_gossip(b.node_id, f"10.66.{i // 250}.{i % 250}:9000", {}, []), now=0.0)
    forged = msgspec.structs.replace(envelope(b, 1, addr="10.7.7.7:1"), sig=bytes(64))
    g.handle(encode_gossip(b.node_id, "10.1.2.3:9000", {}, [forged]), now=0.0)
    assert len(g.peers) == 0
    g.handle(encode_gossip(b.node_id, "10.1.2.3:9000", {}, [envelope(b, 2, addr="10.8.8.8:8770")]), now=0.0)
    assert [p.addr for p in g.peers.all()] == ["10.8.8.8:8770"]  # the address b signed, not the one it stated


def test_own_id_unsigned_by_us_is_impersonation_and_moves_no_counter():
    me, other = Identity.generate(), Identity.generate()
    g = Gossiper(ClusterState(me.node_id), PeerBook(me.node_id), self_addr="a:1", fanout=3, rng=random.Random(0))
    own = envelope(me, 5)
    g.state.set_local(own, typed(own), now=0.0)
    real = envelope(me, 2**53 - 2)
    fakes = [msgspec.structs.replace(real, sig=bytes(64)), msgspec.structs.replace(real, key=other.public_key),
             msgspec.structs.replace(envelope(other, 2**53 - 2), origin=me.node_id)]
    for fake in fakes:
        reply = g.handle(encode_gossip(other.node_id, "", {}, [fake]), now=1.0)
        assert reply.status == 422
    assert g.state.rejected[RejectReason.IMPERSONATION] == 3 and g.last_self_version_seen is None
    g.handle(encode_gossip(other.node_id, "", {}, [envelope(me, 40)]), now=1.0)  # truly ours (a former run)
    assert g.last_self_version_seen == 40
    wire_max = seal_snapshot(me, snapshot(me, 2**53))  # above the typed bound: never accepted
    g.handle(encode_gossip(other.node_id, "", {}, [wire_max]), now=1.0)
    assert g.last_self_version_seen == 40


def test_member_cap_and_verification_budget_reject_before_verifying():
    me = Identity.generate()
    st = ClusterState(me.node_id, max_members=4, max_verifications=2)
    ids = [Identity.generate() for _ in range(6)]
    r = st.merge([envelope(i, 1) for i in ids], now=0.0)
    assert len(r.accepted) == 2 and st.verifications == 2
    assert sorted(x.reason for x in r.rejected) == [RejectReason.OVER_BUDGET] * 4
    for _ in range(3):
        st.merge([envelope(i, 2) for i in ids], now=1.0)
    assert len(st) == 4 and st.rejected[RejectReason.MEMBER_CAP] >= 2
    dup = [envelope(ids[0], v) for v in range(3, 4000)]  # one origin, thousands of copies: one verification
    before = st.verifications
    r = st.merge(dup, now=2.0)
    assert st.verifications - before == 1 and r.accepted == [ids[0].node_id]


def test_peerbook_is_bounded_and_keeps_answering_peers():
    book = PeerBook("me", max_addrs=3)
    book.add("good:1", "gossip")
    book.report("good:1", True, now=0.0, node_id="g")
    book.add("j:1", "join")
    book.add("x:1", "gossip")
    assert book.add("y:1", "gossip") is not None  # evicted x:1, the address that never answered
    assert {p.addr for p in book.all()} == {"good:1", "j:1", "y:1"}
    book.report("y:1", True, now=0.0, node_id="y")
    assert book.add("z:1", "gossip") is None and book.dropped == 1
    assert len(book) == 3


async def test_the_peers_file_is_rewritten_only_when_the_set_of_good_peers_changes(tmp_path):
    """Every ``peers_file_interval_s`` the writer compares the peers that answered with what it last wrote: the
    same set in another order of recency is not written again (no thread, no two fsyncs on an idle agent)."""
    import trio

    from p2pnode.agent import Agent
    from p2pnode.config import load_config
    from p2pnode.discovery import PEERS_FILE

    cfg = load_config(None, overrides={"agent": {"data_dir": str(tmp_path / "d"), "bind": "127.0.0.1"},
                                       "discovery": {"mdns": False, "peers_file_interval_s": 0.1}})
    agent = Agent(cfg)
    book, path = agent.peers, tmp_path / "d" / PEERS_FILE
    writes = []
    real = agent.gossip.save_peers

    def counting(data_dir, peers=None, learned=None):
        writes.append(sorted(a for a, _ in peers))
        return real(data_dir, peers, learned)

    agent.gossip.save_peers = counting
    for addr in ("10.0.0.1:8770", "10.0.0.2:8770", "10.0.0.3:8770"):
        book.add(addr, "join")
    book.report("10.0.0.1:8770", True, 0.0, node_id="a")
    book.report("10.0.0.2:8770", True, 0.0, node_id="b")

    async def written(n):  # the write runs in a worker thread
        with trio.fail_after(10):
            while len(writes) < n or not path.exists():
                await trio.sleep(0.05)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.gossip.peers_file_loop, tmp_path / "d")
        await written(1)
        assert writes == [["10.0.0.1:8770", "10.0.0.2:8770"]]
        book.report("10.0.0.1:8770", True, 40.0)  # answered again: newer first, the same set
        await trio.sleep(1.0)  # ten more intervals
        assert len(writes) == 1
        book.report("10.0.0.3:8770", True, 95.0, node_id="c")
        await written(2)
        assert writes[-1] == ["10.0.0.1:8770", "10.0.0.2:8770", "10.0.0.3:8770"]
        nursery.cancel_scope.cancel()


def test_an_address_that_answered_as_one_member_is_never_relabelled_by_another_members_claim():
    """Found in review of issue 22: a fake member whose signed snapshot advertised a seed's join address re-labelled
    that address, and a new node took the fake for its seed (and adopted the fake's voter roll). What ties an
    operator-given address to a member is who answered when we dialled it (``answered_as``), nothing claimed."""
    book = PeerBook("me")
    book.add("10.0.0.1:8770", "join")
    book.add("10.0.0.1:8770", "gossip", node_id="fake", advertised=True)  # a claim before any answer: a hint only
    assert book.get("10.0.0.1:8770").answered_as is None
    book.report("10.0.0.1:8770", True, 1.0, node_id="seed")  # dialled, and the seed answered
    assert book.get("10.0.0.1:8770").answered_as == "seed" and book.get("10.0.0.1:8770").node_id == "seed"
    book.add("10.0.0.1:8770", "gossip", node_id="fake", advertised=True)  # a later claim changes nothing
    p = book.get("10.0.0.1:8770")
    assert p.answered_as == "seed" and p.node_id == "seed"
    book.report("10.0.0.1:8770", False, 2.0)  # a failure forgets nothing
    assert book.get("10.0.0.1:8770").answered_as == "seed"
