"""ClusterState.verify checks a batch's signatures together (p2pnode.wire.open_envelopes, issue 43 item 3): every
outcome must be the one checking envelopes one by one gives, in the same order, with the same budget spent,
also where the member cap is reached inside a batch whose new origins partly fail."""

import random

import msgspec
import pytest
from helpers import envelope

from p2pnode.errors import RejectedMessage, RejectReason
from p2pnode.gossip import ClusterState
from p2pnode.identity import Identity
from p2pnode.wire import Envelope, encode_gossip, open_envelope, open_envelopes

_FORGERY = (RejectReason.WRONG_KEY, RejectReason.BAD_SIGNATURE, RejectReason.UNENDORSED, RejectReason.MISMATCH)


def one_by_one(st: ClusterState, envelopes: list[Envelope], budget: int) -> tuple[list, list, int]:
    """The checks of ClusterState.verify as they were before batching (one open_envelope per envelope)."""
    newest: dict[str, Envelope] = {}
    rejected: list[tuple] = []
    for env in envelopes:
        prev = newest.get(env.origin)
        if prev is None or env.version > prev.version:
            if prev is not None:
                rejected.append((RejectReason.DUPLICATE, env.origin, f"{env.origin} v{prev.version}"))
            newest[env.origin] = env
        else:
            rejected.append((RejectReason.DUPLICATE, env.origin, f"{env.origin} v{env.version}"))
    opened, verifications, held_count = [], 0, len(st)
    for env in newest.values():
        held = st.get(env.origin)
        held_version = held.version if held is not None else st._tombstones.get(env.origin)
        try:
            if held_version is not None and env.version <= held_version:
                raise RejectedMessage(RejectReason.STALE, f"{env.origin} v{env.version} <= held v{held_version}")
            if held is None and env.origin != st.self_id and held_count >= st.max_members:
                raise RejectedMessage(RejectReason.MEMBER_CAP, f"{env.origin}: {held_count} members held")
            if budget <= 0:
                raise RejectedMessage(RejectReason.OVER_BUDGET, f"{env.origin} v{env.version}")
            budget -= 1
            verifications += 1
            snap = open_envelope(env, limits=st.limits)
        except RejectedMessage as exc:
            if env.origin == st.self_id and exc.reason in _FORGERY:
                exc = RejectedMessage(RejectReason.IMPERSONATION, f"not signed by this node: {exc}")
            rejected.append((exc.reason, env.origin, exc.detail))
            continue
        if held is None and env.origin != st.self_id:
            held_count += 1
        opened.append((env, snap))
    return opened, rejected, verifications


def spoiled(rng: random.Random, env: Envelope, other: Identity) -> Envelope:
    """``env`` made to fail one of open_envelope's checks (or left whole)."""
    how = rng.choice(["whole", "whole", "sig", "key", "body", "mismatch"])
    if how == "sig":
        return msgspec.structs.replace(env, sig=bytes(64))
    if how == "key":
        return msgspec.structs.replace(env, key=other.public_key)
    if how == "body":
        return msgspec.structs.replace(env, body=env.body[:-3] + b"\xc1\xc1\xc1")
    if how == "mismatch":
        return msgspec.structs.replace(env, version=env.version + 1)
    return env


@pytest.mark.parametrize("seed", range(12))
def test_batched_verify_is_one_by_one(seed):
    rng = random.Random(seed)
    me = Identity.generate()
    pool = [Identity.generate() for _ in range(14)]
    st = ClusterState(me.node_id, max_members=rng.choice([3, 5, 8, 64]), max_verifications=rng.choice([2, 6, 100]))
    st.set_local(envelope(me, 5), open_envelope(envelope(me, 5)), now=0.0)
    st.merge([envelope(i, 3) for i in pool[:2]], now=0.0)
    st.forget(pool[1].node_id)  # a tombstone at version 3
    for _ in range(6):
        batch = []
        for _ in range(rng.randint(0, 16)):
            ident = rng.choice(pool + [me])
            batch.append(spoiled(rng, envelope(ident, rng.randint(1, 8)), rng.choice(pool)))
        budget = rng.choice([0, 1, 3, 100])
        want_opened, want_rejected, want_n = one_by_one(st, batch, budget)
        got = st.verify(batch, max_verifications=budget)
        assert [(e, s) for e, s in got.opened] == want_opened
        assert [(r.reason, r.origin, r.detail) for r in got.rejected] == want_rejected
        assert got.verifications == want_n
        st.install(got, now=1.0)


def test_cap_reached_inside_a_batch_frees_the_places_of_failed_new_origins():
    me, others = Identity.generate(), [Identity.generate() for _ in range(4)]
    st = ClusterState(me.node_id, max_members=2)
    forged = msgspec.structs.replace(envelope(others[0], 1), sig=bytes(64))
    got = st.verify([forged, envelope(others[1], 1), envelope(others[2], 1), envelope(others[3], 1)])
    assert [e.origin for e, _ in got.opened] == [others[1].node_id, others[2].node_id]
    assert [r.reason for r in got.rejected] == [RejectReason.BAD_SIGNATURE, RejectReason.MEMBER_CAP]
    assert got.verifications == 3


def test_open_envelopes_gives_each_envelopes_outcome():
    a, b = Identity.generate(), Identity.generate()
    envs = [envelope(a, 1), msgspec.structs.replace(envelope(b, 1), sig=bytes(64)),
            msgspec.structs.replace(envelope(b, 2), key=a.public_key), envelope(b, 3)]
    out = open_envelopes(envs)
    assert out[0] == open_envelope(envs[0]) and out[3] == open_envelope(envs[3])
    assert [o.reason for o in out[1:3]] == [RejectReason.BAD_SIGNATURE, RejectReason.WRONG_KEY]
    assert open_envelopes([]) == []


def test_encoded_envelopes_are_the_old_maps():
    """encode_gossip encodes Envelope structs in C: the bytes are the msgpack maps Envelope.to_wire gave."""
    import msgpack

    a = Identity.generate()
    envs = [envelope(a, 1), msgspec.structs.replace(envelope(a, 2), endorsement=bytes(range(32)))]
    old = msgpack.packb({"schema": 1, "from": "x", "addr": "", "digest": {"q": 2**40},
                         "envelopes": [e.to_wire() for e in envs], "partial": True}, use_bin_type=True)
    assert encode_gossip("x", "", {"q": 2**40}, envs, partial=True) == old


def test_open_role_gate_gives_check_cert_results_and_keeps_its_bookkeeping():
    """With no operator key pinned RoleGate.check hands out one of four shared results (issue 43 item 3): each
    equal to check_cert's for the same tags, remembered per member within max_members, never counted refused; and
    a member's held view is its snapshot, as effective_tags (unchanged tags) made it."""
    from p2pnode.certs import RoleGate, check_cert, effective_tags

    rng = random.Random(7)
    gate = RoleGate(max_members=5)
    pool = ["voter", "durable", "lead", "ephemeral", "lead=uncertified", "zone=a", "voterx", ""]
    for i in range(300):
        tags = [rng.choice(pool) for _ in range(rng.randrange(5))]
        node = f"n{rng.randrange(9)}"
        got = gate.check(node, tags, None, 1e9 + i)
        assert got == check_cert(node, tags, None, {}, 1e9 + i)
        assert gate.check_of(node) is got and len(gate._checks) <= 5
        assert effective_tags(tags, got) == tags
    assert not any(gate.refused.values())
    st = ClusterState("self", roles=RoleGate())
    ident = Identity.generate()
    env = envelope(ident, 1, tags=["voter", "zone=a"])
    assert not st.merge([env], now=1.0).rejected
    entry = st.get(ident.node_id)
    assert entry.raw is None and entry.snapshot.tags == ["voter", "zone=a"] and entry.roles_until == float("inf")


def test_digest_and_delta_follow_every_change_of_the_held_entries():
    """ClusterState keeps the digest as a map beside its entries (issue 43 item 3): after random merges, local
    installs, forgets and quarantines it is, key for key and in order, the entries' versions, and delta is the
    entries newer than a digest."""
    rng = random.Random(3)
    me = Identity.generate()
    st = ClusterState(me.node_id, max_members=6)
    idents = [Identity.generate() for _ in range(8)]
    versions = dict.fromkeys([i.node_id for i in idents], 0)
    local = 0
    for step in range(200):
        op = rng.random()
        if op < 0.6:
            batch = []
            for ident in rng.sample(idents, 3):
                versions[ident.node_id] += rng.choice((0, 1, 1, 2))
                batch.append(envelope(ident, max(1, versions[ident.node_id])))
            st.merge(batch, now=float(step))
        elif op < 0.7:
            local += 1
            env = envelope(me, local)
            st.set_local(env, open_envelope(env), now=float(step))
        elif op < 0.85:
            st.forget(rng.choice(idents).node_id)
        else:
            st.quarantine(rng.choice(idents).node_id, "test")
        held = {e.origin: e.version for e in st.unordered()}
        assert st.digest() == held and list(st.digest()) == list(held)
        st.digest().clear()  # a new map each time: what a caller does with it never reaches the state
        assert st.digest() == held
        peer = {o: v - rng.choice((0, 1)) for o, v in held.items() if rng.random() < 0.7}
        assert {e.origin for e in st.delta(peer)} == {o for o, v in held.items() if peer.get(o, -1) < v}
