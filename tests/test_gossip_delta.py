"""Partial (recent) digests between full push-pulls (issue 42 item 2): real ClusterState and Gossiper cores over an
in-memory wire, the news log, the old full-digest format, and hostile partial digests at the decoder."""

import random

import msgpack
import pytest
from helpers import envelope, snapshot, typed

from p2pnode.errors import RejectedMessage, RejectReason
from p2pnode.gossip import ClusterState, Gossiper, PeerBook
from p2pnode.gossip._protocol import push_pull_interval, retransmit_window
from p2pnode.identity import Identity
from p2pnode.wire import decode_gossip, encode_gossip, seal_snapshot


class OldAgent(Gossiper):
    """An agent from before partial digests: it reads a message as its decoder did (the unknown ``partial`` key
    ignored, so every digest is full) and never sends a partial one."""

    def handle(self, body, now, *, remote_host=None):
        raw = msgpack.unpackb(body, raw=False)
        raw.pop("partial", None)
        return super().handle(msgpack.packb(raw, use_bin_type=True), now)


class DeltaNet:
    """``n`` Gossipers wired by direct calls. ``push_pull`` is the base full interval of each node; the nodes of
    ``legacy`` are :class:`OldAgent` s; ``group`` partitions the exchanges; ``bytes`` counts every message."""

    def __init__(self, n, *, push_pull=30.0, seed=0, fanout=3, legacy=(), loss=0.0):
        self.rng = random.Random(seed)
        self.loss = loss
        self.idents = [Identity.generate() for _ in range(n)]
        self.nodes = {}
        self.versions = {}
        self.group = {}
        self.bytes = 0
        self.partial_msgs = 0
        self.full_msgs = 0
        for i, ident in enumerate(self.idents):
            addr = f"n{i}:1"
            book = PeerBook(ident.node_id)
            book.self_addrs.add(addr)
            if i:
                book.add("n0:1", "join")
            cls = OldAgent if i in legacy else Gossiper
            self.nodes[addr] = cls(ClusterState(ident.node_id), book, self_addr=addr, fanout=fanout,
                                   rng=random.Random(self.rng.random()),
                                   push_pull_interval_s=0.0 if i in legacy else push_pull)
            self.group[addr] = 0
            self.bump(addr, now=0.0)

    def bump(self, addr, now):
        g = self.nodes[addr]
        ident = self.idents[int(addr[1:].split(":")[0])]
        v = self.versions.get(addr, 0) + 1
        self.versions[addr] = v
        env = seal_snapshot(ident, snapshot(ident, v, addr=addr))
        g.state.set_local(env, typed(env), now)

    def _send(self, target, body, now):
        self.bytes += len(body)
        if decode_gossip(body).partial:
            self.partial_msgs += 1
        else:
            self.full_msgs += 1
        reply = self.nodes[target].handle(body, now)
        self.bytes += len(reply.body)
        return reply

    def round(self, now):
        for addr, g in self.nodes.items():
            for target in g.choose_targets(now):
                if self.group[addr] != self.group[target] or self.rng.random() < self.loss:
                    g.on_failure(target, now)
                    continue
                reply = self._send(target, g.open_request(target, now), now)
                push = g.on_reply(target, reply.status, reply.content_type, reply.body, now)
                if push is not None:
                    reply = self._send(target, push, now)
                    g.on_reply(target, reply.status, reply.content_type, reply.body, now, push=False)

    def converged(self, addrs=None):
        want = {g.state.self_id: self.versions[a] for a, g in self.nodes.items()}
        return all(self.nodes[a].state.digest() == want for a in (addrs or self.nodes))

    def run_until_converged(self, start, rounds):
        for r in range(rounds):
            self.round(start + r)
            if self.converged():
                return r + 1
        return None


def test_window_and_push_pull_scale_follow_memberlist():
    assert retransmit_window(1) == 4 and retransmit_window(9) == 4 and retransmit_window(10) == 8
    assert retransmit_window(1000) == 16 and retransmit_window(2000) == 16
    assert push_pull_interval(32, 30.0) == 30.0
    assert push_pull_interval(1000, 30.0) == 180.0 and push_pull_interval(2000, 30.0) == 210.0


def test_news_log_names_recent_changes_newest_first_and_bounded():
    me, a, b, c = (Identity.generate() for _ in range(4))
    st = ClusterState(me.node_id)
    st.merge([envelope(a, 1), envelope(b, 1)], now=0.0)
    for _ in range(5):
        st.advance()
    st.merge([envelope(c, 1)], now=1.0)
    st.advance()
    assert st.recent_digest(window=3, cap=10) == {c.node_id: 1}
    assert list(st.recent_digest(window=10, cap=10)) == [c.node_id, b.node_id, a.node_id]
    assert list(st.recent_digest(window=10, cap=2)) == [c.node_id, b.node_id]
    st.merge([envelope(a, 2)], now=2.0)  # a changed again: newest now
    assert list(st.recent_digest(window=10, cap=10)) == [a.node_id, c.node_id, b.node_id]
    st.forget(a.node_id)
    assert a.node_id not in st.recent_digest(window=10, cap=10)
    assert st.versions_of([b.node_id, a.node_id]) == {b.node_id: 1, a.node_id: 0}


def test_forty_nodes_spread_news_by_partial_digests_only():
    net = DeltaNet(40, push_pull=1000.0, seed=5)
    assert net.run_until_converged(1.0, 15) is not None  # first exchanges are full (none made yet)
    full_before = net.full_msgs
    for k, addr in enumerate(("n7:1", "n22:1", "n39:1")):
        net.bump(addr, now=100.0 + k)
    net.partial_msgs = 0
    rounds = net.run_until_converged(100.0, 12)
    assert rounds is not None and rounds <= 8, rounds
    assert net.full_msgs == full_before and net.partial_msgs > 0  # no full exchange was due
    # The digests in those messages named only recent changes (and the sender), never all 40 members.
    g = net.nodes["n3:1"]
    digest = decode_gossip(g.open_request("n4:1", 120.0)).digest
    assert len(digest) < 40


def test_partitioned_node_converges_at_the_next_full_exchange():
    net = DeltaNet(20, push_pull=30.0, seed=11)
    assert net.run_until_converged(1.0, 15) is not None
    cut = ["n5:1", "n6:1"]
    for a in cut:
        net.group[a] = 1
    net.bump("n12:1", now=50.0)
    for r in range(30):  # long enough for every node's window to pass
        net.round(50.0 + r)
    assert not net.converged(cut) and net.converged([a for a in net.nodes if a not in cut])
    for a in cut:
        net.group[a] = 0
    # Failed exchanges make the next with that peer full; at the latest the periodic full push-pull repairs.
    assert net.run_until_converged(80.0, 40) is not None


def test_convergence_by_partial_digests_under_thirty_percent_loss():
    net = DeltaNet(30, push_pull=30.0, seed=3, loss=0.3)
    assert net.run_until_converged(1.0, 40) is not None
    for k, addr in enumerate(("n2:1", "n14:1", "n29:1")):
        net.bump(addr, now=60.0 + k)
    net.partial_msgs = 0
    assert net.run_until_converged(60.0, 40) is not None  # a full exchange at the latest after 30 s repairs
    assert net.partial_msgs > 0


def test_older_agent_full_digest_messages_still_work():
    ident = Identity.generate()
    body = encode_gossip(ident.node_id, "a:1", {ident.node_id: 3}, [])
    assert b"partial" not in body  # a full message is byte for byte the old format
    assert decode_gossip(body).partial is False
    net = DeltaNet(12, push_pull=30.0, seed=2, legacy=(3, 7))
    assert net.run_until_converged(1.0, 20) is not None
    net.bump("n3:1", now=40.0)
    net.bump("n9:1", now=40.0)
    assert net.run_until_converged(40.0, 15) is not None
    # A new node that sends a partial digest to an older agent gets a full reply, and full digests go to it since.
    new, old = net.nodes["n1:1"], net.nodes["n3:1"]
    new.next_full_at = 1000.0
    new._legacy.clear()
    body = new.open_request("n3:1", 100.0)
    assert decode_gossip(body).partial
    reply = old.handle(body, 100.0)
    assert not decode_gossip(reply.body).partial
    new.on_reply("n3:1", reply.status, reply.content_type, reply.body, 100.0)
    assert new.full_due("n3:1", 101.0) and not decode_gossip(new.open_request("n3:1", 101.0)).partial
    assert not new.full_due("n5:1", 101.0)


def test_partial_request_gets_only_named_origins_and_a_partial_digest():
    me, a, b = Identity.generate(), Identity.generate(), Identity.generate()
    st = ClusterState(me.node_id)
    st.merge([envelope(a, 5), envelope(b, 2)], now=0.0)
    g = Gossiper(st, PeerBook(me.node_id), self_addr="m:1", fanout=3, rng=random.Random(0), push_pull_interval_s=30)
    peer = Identity.generate()
    c = Identity.generate()
    st.merge([envelope(c, 3)], now=0.0)
    body = encode_gossip(peer.node_id, "p:1", {a.node_id: 1, c.node_id: 3, "unknown": 4}, [], partial=True)
    msg = decode_gossip(g.handle(body, 1.0).body)
    assert msg.partial and [e.origin for e in msg.envelopes] == [a.node_id]  # b not named: unknown, not lacking
    # Named at a version we lack: our version (0: none); named at ours (c) or older (a, sent): left out; our own
    # recent changes the peer did not name: listed.
    assert msg.digest["unknown"] == 0 and a.node_id not in msg.digest and c.node_id not in msg.digest
    assert msg.digest[b.node_id] == 2 and me.node_id not in msg.digest  # no own snapshot held here
    # The third message: a want-list with an empty digest gets the wanted envelopes and an empty digest.
    reply = decode_gossip(g.handle(encode_gossip(peer.node_id, "p:1", {}, [], partial=True,
                                                 want=[b.node_id, "unknown", b.node_id]), 2.0).body)
    assert reply.partial and reply.digest == {} and [e.origin for e in reply.envelopes] == [b.node_id]


def test_hostile_partial_digests_are_bounded():
    me, a = Identity.generate(), Identity.generate()
    st = ClusterState(me.node_id)
    st.merge([envelope(a, 5)], now=0.0)
    g = Gossiper(st, PeerBook(me.node_id), self_addr="m:1", fanout=3, rng=random.Random(0), push_pull_interval_s=30)
    bound = st.limits.max_partial_digest_entries
    huge = {f"x{i}": 1 for i in range(bound + 1)}
    for body in (encode_gossip("p", "", huge, [], partial=True),
                 msgpack.packb({"schema": 1, "from": "p", "digest": huge, "partial": True, "envelopes": [1]})):
        with pytest.raises(RejectedMessage) as exc:
            decode_gossip(body)
        assert exc.value.reason is RejectReason.BAD_TYPE
        assert g.handle(body, 1.0).status == 422
    assert decode_gossip(encode_gossip("p", "", huge, [])).partial is False  # the full bound is the old one
    for bad in ({"a": -1}, {"a": float("nan")}, {"a": 2**60}, {"a": "1"}):
        body = msgpack.packb({"schema": 1, "from": "p", "digest": bad, "partial": True})
        with pytest.raises(RejectedMessage):
            decode_gossip(body)
    with pytest.raises(RejectedMessage):
        decode_gossip(msgpack.packb({"schema": 1, "from": "p", "digest": {}, "partial": "yes"}))
    # Duplicate keys in the map: one entry survives, no crash.
    dup = b"\x84\xa6schema\x01\xa4from\xa1p\xa6digest\x82\xa1a\x01\xa1a\x07\xa7partial\xc3"
    assert len(decode_gossip(dup).digest) == 1
    # A digest naming the bound of origins we lack: the reply names at most the bound.
    named = {f"x{i}": 3 for i in range(bound - 1)} | {a.node_id: 0}
    reply = g.handle(encode_gossip("p", "", named, [], partial=True), 1.0)
    msg = decode_gossip(reply.body)
    assert reply.status == 200 and msg.partial and len(msg.digest) <= bound
    assert [e.origin for e in msg.envelopes] == [a.node_id]
    # A want-list over the bound is refused as a whole; at the bound it gets only the envelopes we hold.
    with pytest.raises(RejectedMessage):
        decode_gossip(encode_gossip("p", "", {}, [], partial=True, want=[f"x{i}" for i in range(bound + 1)]))
    want = [f"x{i}" for i in range(bound - 1)] + [a.node_id]
    msg = decode_gossip(g.handle(encode_gossip("p", "", {}, [], partial=True, want=want), 1.0).body)
    assert [e.origin for e in msg.envelopes] == [a.node_id] and msg.digest == {}
    for bad_want in (["x" * 65], [""], [3], "abc"):
        with pytest.raises(RejectedMessage):
            decode_gossip(msgpack.packb({"schema": 1, "from": "p", "digest": {}, "partial": True, "want": bad_want}))


def test_partial_messages_are_smaller_than_full_ones():
    net = DeltaNet(60, push_pull=1000.0, seed=9)
    assert net.run_until_converged(1.0, 15) is not None
    g = net.nodes["n10:1"]
    full = net.nodes["n11:1"].open_request()  # no address: a full message, as before
    for r in range(20):  # quiet rounds: the news log empties out of the window
        net.round(200.0 + r)
    partial = g.open_request("n12:1", 300.0)
    assert decode_gossip(partial).partial and len(partial) * 10 < len(full)


def test_a_failed_periodic_full_exchange_is_due_again_and_failed_peers_do_not_delay_it():
    me = Identity.generate()
    st = ClusterState(me.node_id)
    own = envelope(me, 1)
    st.set_local(own, typed(own), 0.0)
    g = Gossiper(st, PeerBook(me.node_id), self_addr="m:1", fanout=3, rng=random.Random(0), push_pull_interval_s=30)
    assert not decode_gossip(g.open_request("dead:1", 0.0)).partial  # the first exchange: full, periodic
    g.on_failure("dead:1", 0.5)
    assert g.full_due("live:1", 1.0)  # the periodic one did not happen: the next exchange is full
    assert not decode_gossip(g.open_request("live:1", 1.0)).partial
    g.on_failure("live:1", 1.5)
    g.open_request("live:1", 2.0)
    g._periodic_addr = None
    g.next_full_at = 40.0
    # A dead peer dialled again and again gets full requests (it failed last), but they do not move the timer.
    for t in (5.0, 10.0, 20.0, 35.0):
        assert not decode_gossip(g.open_request("dead:1", t)).partial
        g.on_failure("dead:1", t)
        assert g.next_full_at == 40.0
    assert decode_gossip(g.open_request("live:1", 39.0)).partial is False  # live:1 failed last: full
    assert g.full_due("other:1", 40.0)
