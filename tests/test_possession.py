"""Proof of possession: the pure policy (virtual time, plain values) and the wire (decoders with bounds, signatures,
answers from a real replica store)."""

from __future__ import annotations

import random

import msgspec
import pytest

from p2pnode.errors import SyncReplyRejected
from p2pnode.identity import Identity
from p2pnode.sync._possess import (
    MAX_CHALLENGE_BODY,
    ChallengeAnswer,
    ChallengeRequest,
    answer_limit,
    decode_answer,
    decode_challenge,
    read_proofs,
    sign_challenge,
    verify_challenge,
    withdraw_lost,
)
from p2pnode.sync._refuse import SyncReject
from p2pnode.synccore import (
    FAIL_REASONS,
    PossessionBook,
    PossessionPolicy,
    PushAgain,
    SendChallenge,
    choose_blocks,
    possession_proof,
)

ROOT = b"r" * 32
V = ("a.npz", 100, ROOT)


def book(**kw):
    return PossessionBook(PossessionPolicy(first_check_s=2.0, reverify_interval_s=3600.0, delete_window_s=600.0, **kw))


def test_a_new_receipt_is_checked_soon_after_it_first_counts_then_hourly():
    b = book()
    b.observe(10.0, {"a.npz": (100, ROOT, {"h1", "h2"})})
    assert b.next_deadline() == 12.0
    assert b.poll(11.9) == []
    sent = b.poll(12.0)
    assert sorted(c.holder for c in sent) == ["h1", "h2"] and b.sent == 2
    assert b.next_deadline() is None  # both under way
    for c in sent:
        assert b.answered(12.5, c, "passed") == []
    assert b.next_deadline() == 12.5 + 3600.0
    assert b.counted(*V, {"h1", "h2"}) == {"h1", "h2"}


def test_a_failed_holder_stops_counting_is_never_a_target_and_asks_for_a_push():
    for reason in FAIL_REASONS:
        b = book()
        b.observe(0.0, {"a.npz": (100, ROOT, {"fake", "real"})})
        sent = {c.holder: c for c in b.poll(2.0)}
        effects = b.answered(3.0, sent["fake"], reason)
        assert effects == [PushAgain("a.npz", 100, ROOT, "fake", reason)]
        b.answered(3.0, sent["real"], "passed")
        assert b.failed_holders(*V) == {"fake"}
        assert b.counted(*V, {"fake", "real"}) == {"real"}
        assert b.failed[reason] == 1
        assert b.view(*V, 4.0)["fake"] == {"state": "failed", "reason": reason, "passed_s_ago": None,
                                           "counted": False, "passes_needed": 2, "overloads": 0}


def test_a_failed_holder_is_asked_again_later_and_does_not_count_while_it_is_checked():
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"h"})})
    (c,) = b.poll(2.0)
    b.answered(2.0, c, "timeout")
    assert b.next_deadline() == 3602.0
    (c,) = b.poll(3602.0)
    assert b.failed_holders(*V) == {"h"}  # checking again: still not counted
    b.answered(3603.0, c, "passed")
    assert b.failed_holders(*V) == frozenset() and b.counted(*V, {"h"}) == {"h"}
    # counted again, but not toward a delete before a second pass in a row (asked first_check_s later)
    assert b.delete_readiness(3603.0, *V, {"h"}, r=1, durable_members=1) == "unproven"
    assert b.next_deadline() == 3605.0
    (c,) = b.poll(3605.0)
    b.answered(3605.0, c, "passed")
    assert b.delete_readiness(3605.0, *V, {"h"}, r=1, durable_members=1) == "ready"
    assert b.next_deadline() == 3605.0 + 3600.0


def test_a_file_is_deletable_only_with_r_holders_that_passed_within_the_window():
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"h1", "h2"})})
    assert not b.verified_for_delete(0.0, *V, {"h1", "h2"}, 2)  # counted, never checked
    s = {c.holder: c for c in b.poll(2.0)}
    b.answered(2.0, s["h1"], "passed")
    assert not b.verified_for_delete(2.0, *V, {"h1", "h2"}, 2)
    assert b.verified_for_delete(2.0, *V, {"h1", "h2"}, 1)
    b.answered(2.0, s["h2"], "passed")
    assert b.verified_for_delete(600.0, *V, {"h1", "h2"}, 2)
    assert not b.verified_for_delete(700.0, *V, {"h1", "h2"}, 2)  # the window passed
    # before a delete, every counted holder not passed within the window is due at once
    b.want_delete(700.0, [V])
    assert sorted(c.holder for c in b.poll(700.0)) == ["h1", "h2"]


def test_want_delete_does_not_re_ask_holders_that_passed_within_the_window():
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"h1"})})
    (c,) = b.poll(2.0)
    b.answered(2.0, c, "passed")
    b.want_delete(100.0, [V])
    assert b.poll(100.0) == []


def test_a_holder_that_said_absent_and_withdrew_may_take_the_file_again_and_is_checked_soon_after():
    """A real durable node that lost its copy answers ``absent`` and withdraws its receipt: it is a push target again
    (not in failed_holders), but once it claims the file again it counts only after a pass, and toward a delete after
    two in a row."""
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"h"})})
    (c,) = b.poll(2.0)
    assert b.answered(2.0, c, "absent") == [PushAgain("a.npz", 100, ROOT, "h", "absent")]
    assert b.failed_holders(*V) == {"h"}  # still claims it: neither counted nor a target
    b.observe(3.0, {"a.npz": (100, ROOT, set())})  # the holder withdrew its receipt
    assert b.failed_holders(*V) == frozenset()  # it may be given the file again
    b.observe(4.5, {"a.npz": (100, ROOT, {"h"})})  # it holds the file again (pushed)
    assert b.view(*V, 4.5)["h"]["state"] == "failed" and b.counted(*V, {"h"}) == frozenset()
    assert b.next_deadline() == 4.0  # absent, first failure: asked again first_check_s after it
    (c,) = b.poll(4.5)
    b.answered(4.6, c, "passed")
    assert b.counted(*V, {"h"}) == {"h"}
    assert b.delete_readiness(4.6, *V, {"h"}, r=1, durable_members=1) == "unproven"
    (c,) = b.poll(6.6)
    b.answered(6.6, c, "passed")
    assert b.delete_readiness(6.6, *V, {"h"}, r=1, durable_members=1) == "ready"
    b.observe(7.0, {"a.npz": (200, b"s" * 32, {"h"})})
    assert b.view(*V, 7.0) == {}  # it claims another version now
    assert b.answered(8.0, c, "passed") == []  # an answer for a record not under way is ignored


def test_inconclusive_leaves_the_holder_as_it_was_and_asks_again_soon():
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"h"})})
    (c,) = b.poll(2.0)
    assert b.answered(2.0, c, "inconclusive") == []
    assert b.view(*V, 2.0)["h"]["state"] == "unverified" and b.next_deadline() == 4.0
    with pytest.raises(ValueError):
        (c,) = b.poll(4.0)
        b.answered(4.0, c, "bogus")


def test_an_answer_is_bound_to_nonce_holder_index_and_bytes():
    n1, n2 = b"\x01" * 32, b"\x02" * 32
    p = possession_proof(n1, "h", 3, b"block")
    assert len(p) == 32
    assert p != possession_proof(n2, "h", 3, b"block")
    assert p != possession_proof(n1, "other", 3, b"block")  # a fake relaying to a real holder gets the wrong proof
    assert p != possession_proof(n1, "h", 4, b"block")
    assert p != possession_proof(n1, "h", 3, b"blocc")
    assert choose_blocks(2, random.Random(1)) == (0, 1)
    got = choose_blocks(1000, random.Random(1))
    assert len(got) == 4 and len(set(got)) == 4 and list(got) == sorted(got) and max(got) < 1000
    assert choose_blocks(0, random.Random(1)) == ()


def _req(**kw):
    d = {"origin": "o" * 16, "holder": "h" * 16, "path": "cfg/a.npz", "size": 10, "root": ROOT,
         "nonce": b"n" * 32, "blocks": [0]}
    d.update(kw)
    return msgspec.msgpack.encode(d)


@pytest.mark.parametrize("bad", [
    b"\xc1", b"", _req(nonce=b"short"), _req(root=b"x"), _req(blocks=list(range(17))), _req(blocks=[-1]),
    _req(blocks=[2**33]), _req(size=-1), _req(path=""), _req(path="x" * 5000), _req(holder="bad\nid"),
    msgspec.msgpack.encode([1, 2, 3]), _req(size=float("nan")),
])
def test_a_challenge_that_does_not_fit_its_bounds_is_malformed(bad):
    with pytest.raises(SyncReject) as ei:
        decode_challenge(bad)
    assert ei.value.reason == "malformed"
    with pytest.raises(SyncReject) as ei:
        decode_challenge(b"\x00" * (MAX_CHALLENGE_BODY + 1))
    assert ei.value.reason == "oversized"


def test_an_answer_is_never_larger_than_its_request_needs():
    good = msgspec.msgpack.encode(ChallengeAnswer("present", [b"p" * 32] * 4))
    assert len(good) <= answer_limit(4)
    assert decode_answer(good, 4).proofs == [b"p" * 32] * 4
    for body, n, reason in [
        (good, 3, "reply_oversized"),  # more than 3 proofs need
        (msgspec.msgpack.encode(ChallengeAnswer("present", [b"p" * 32] * 2)), 4, "reply_invalid"),
        (msgspec.msgpack.encode({"status": "maybe"}), 4, "reply_invalid"),
        (msgspec.msgpack.encode({"status": "present", "proofs": [b"p" * 31] * 4}), 4, "reply_invalid"),
        (b"\xc1\xc1", 4, "reply_malformed"),
    ]:
        with pytest.raises(SyncReplyRejected) as ei:
            decode_answer(body, n)
        assert ei.value.reason == reason
    assert decode_answer(msgspec.msgpack.encode(ChallengeAnswer("absent")), 4).status == "absent"


def test_a_challenge_is_signed_by_its_origin_and_names_its_receiver():
    origin, holder = Identity.generate(), Identity.generate()
    keys = {origin.node_id: origin.public_key}
    body = msgspec.msgpack.encode(ChallengeRequest(origin.node_id, holder.node_id, "a", 1, ROOT, b"n" * 32, [0]))
    headers = sign_challenge(origin, body, now=1000.0)

    def check(h=headers, b=body, me=holder.node_id, now=1000.0):
        return verify_challenge(h, b, me=me, key_of=keys.get, now=now, max_skew_s=300.0)

    assert check().holder == holder.node_id
    for kw, reason in [({"me": "someone-else"}, "bad_signature"),  # replayed to another node
                       ({"b": body + b"x"}, "bad_signature"), ({"now": 2000.0}, "bad_signature"),
                       ({"h": {**headers, "x-p2pnode-origin": holder.node_id}}, "not_member")]:
        with pytest.raises(SyncReject) as ei:
            check(**kw)
        assert ei.value.reason == reason, kw
    # a member signing a challenge that names another origin is refused
    keys[holder.node_id] = holder.public_key
    forged = msgspec.msgpack.encode(ChallengeRequest(origin.node_id, holder.node_id, "a", 1, ROOT, b"n" * 32, [0]))
    with pytest.raises(SyncReject) as ei:
        verify_challenge(sign_challenge(holder, forged, now=1000.0), forged, me=holder.node_id, key_of=keys.get,
                         now=1000.0, max_skew_s=300.0)
    assert ei.value.reason == "bad_signature"


def test_a_holder_answers_from_its_replica_and_withdraws_a_receipt_whose_file_is_gone(tmp_path):
    from p2pnode.sync import PushItem, ReplicaStore
    from p2pnode.synccore import hash_file

    src = tmp_path / "src.bin"
    data = random.Random(0).randbytes(300_000)
    src.write_bytes(data)
    m = hash_file(src, block_size=128 * 1024)
    store = ReplicaStore(tmp_path / "d")
    blocks = [(i, data[i * m.block_size:(i + 1) * m.block_size]) for i in range(m.blocks)]
    assert store.apply("o" * 16, PushItem("cfg/a.bin", m, 1, blocks))["status"] == "committed"
    req = ChallengeRequest("o" * 16, "me", "cfg/a.bin", m.size, m.root, b"k" * 32, [0, 2])
    ans = read_proofs(store, req, "me")
    assert ans.status == "present"
    assert ans.proofs == [possession_proof(b"k" * 32, "me", i, blocks[i][1]) for i in (0, 2)]
    assert read_proofs(store, ChallengeRequest("o" * 16, "me", "cfg/a.bin", m.size, b"z" * 32, b"k" * 32, [0]),
                       "me").status == "absent"
    with pytest.raises(SyncReject):
        read_proofs(store, ChallengeRequest("o" * 16, "me", "cfg/a.bin", m.size, m.root, b"k" * 32, [3]), "me")
    store.held.replica_path("o" * 16, "cfg/a.bin").unlink()
    assert read_proofs(store, req, "me") is None
    assert withdraw_lost(store, req) and store.receipts_for("o" * 16) == []
    # offered again, the same version is taken again (not answered "have")
    out = store.apply("o" * 16, PushItem("cfg/a.bin", m, 1, blocks))
    assert out["status"] == "committed" and read_proofs(store, req, "me").status == "present"


def test_send_challenge_is_a_plain_value():
    assert SendChallenge("h", "p", 1, ROOT) == SendChallenge("h", "p", 1, ROOT)


@pytest.mark.parametrize("var,value", [("P2PNODE_SYNC_CHALLENGE_TIMEOUT_S", "0"),
                                       ("P2PNODE_SYNC_CHALLENGE_WINDOW_S", "0.5"),
                                       ("P2PNODE_SYNC_CHALLENGE_INTERVAL_S", "1e9")])
def test_challenge_settings_out_of_their_bounds_are_refused(var, value):
    from p2pnode.config import ConfigError, load_config

    assert load_config(None, env={}).sync.challenge_window_s == 600.0
    with pytest.raises(ConfigError, match="challenge"):
        load_config(None, env={var: value})


def test_a_new_version_of_a_file_keeps_the_schedule_of_a_holder_that_passed_for_the_old_one():
    """A live database gets a new version every pass: a holder that passed keeps its hourly schedule for the new
    one (no challenge per version), but a delete of the new version still needs a pass for it."""
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"h", "new"})})
    for c in b.poll(2.0):
        b.answered(2.0, c, "passed")
    v2 = ("a.npz", 120, b"s" * 32)
    b.observe(10.0, {"a.npz": (120, b"s" * 32, {"h", "new"})})
    assert b.next_deadline() == 3602.0 and b.poll(100.0) == []
    assert not b.verified_for_delete(100.0, *v2, {"h", "new"}, 1)
    b.want_delete(100.0, [v2])
    assert sorted(c.holder for c in b.poll(100.0)) == ["h", "new"]
    b.observe(200.0, {"a.npz": (130, b"t" * 32, {"h", "other"})})  # a holder new to the file: checked soon
    assert b.view("a.npz", 130, b"t" * 32, 200.0)["other"]["state"] == "unverified"
    assert b.next_deadline() == 202.0


LIVE = [(100 + k, bytes([k]) * 32) for k in range(60)]  # a live database: a new version every second


def live_claims(k, holders):
    size, root = LIVE[k]
    return {"a.db": (size, root, set(holders))}


def test_a_fake_copying_each_new_receipt_of_a_live_file_is_challenged_on_time_and_stays_failed_across_versions():
    """Finding 1: the schedule and the failure belong to (path, holder), not to a version: a file that changes
    within first_check_s does not reset them, so the fake is challenged 2 s after its first claim, fails, and counts
    for no later version for challenge_interval_s; the real holder, which passed, counts throughout."""
    b = book()
    b.observe(0.0, live_claims(0, {"real"}))
    (c,) = b.poll(2.0)
    b.answered(2.0, c, "passed")
    t, fails = 3.0, []
    b.observe(t, live_claims(3, {"real", "fake"}))  # the fake starts copying receipts
    for k in range(4, 60):
        t = float(k)
        b.observe(t, live_claims(k, {"real", "fake"}))
        for c in b.poll(t):
            assert c.holder == "fake" and t == 5.0  # once, first_check_s after its first claim
            fails += b.answered(t + 0.5, c, "wrong_hash")
        size, root = LIVE[k]
        if t >= 6.0:
            assert b.counted("a.db", size, root, {"real", "fake"}) == {"real"}
            assert "fake" in b.failed_holders("a.db", size, root)
    assert [e.reason for e in fails] == ["wrong_hash"] and b.sent == 2
    assert b.next_deadline() == 3602.0  # the real holder, hourly
    b.observe(3605.0, live_claims(59, {"real", "fake"}))
    assert [c.holder for c in b.poll(3605.0)] == ["real"]
    assert [c.holder for c in b.poll(3605.5)] == ["fake"]  # asked again an hour after its failure, not before


def test_a_failed_holder_that_withdraws_and_republishes_is_not_asked_again_early_nor_counted():
    """Finding 1: withdrawing the receipt for a round and republishing it changes nothing: the failure and its
    schedule are kept for challenge_interval_s; answering ``absent`` instead backs off 4x per failure."""
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"fake"})})
    (c,) = b.poll(2.0)
    b.answered(2.0, c, "wrong_hash")
    for t in range(3, 600):
        b.observe(float(t), {"a.npz": (100, ROOT, {"fake"} if t % 2 else set())})
        assert b.poll(float(t)) == [] and b.counted(*V, {"fake"}) == frozenset()
    assert b.view(*V, 601.0)["fake"]["state"] == "failed"
    # absent, withdrawn, republished: each failure waits four times longer
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"fake"})})
    t, asked = 0.0, []
    while t < 2000.0:
        b.observe(t, {"a.npz": (100, ROOT, {"fake"})})
        for c in b.poll(t):
            asked.append(t)
            b.answered(t, c, "absent")
            b.observe(t, {"a.npz": (100, ROOT, set())})
        t += 0.5
    assert asked == [2.0, 4.0, 12.0, 44.0, 172.0, 684.0]


def test_a_holder_with_half_the_blocks_needs_hours_to_count_toward_a_delete():
    """Finding 1, the lottery: a holder keeping half the blocks passes one challenge of 4 blocks with p = 1/16; it
    must pass two in a row after a failure, and each failure costs it challenge_interval_s. Played with a seeded
    random over 200 virtual hours, it reaches a delete rarely, never within hours of trying."""
    rng = random.Random(7)
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"half"})})
    t, ready_at = 0.0, None
    while t < 200 * 3600.0 and ready_at is None:
        d = b.next_deadline()
        assert d is not None
        t = max(t, d)
        b.observe(t, {"a.npz": (100, ROOT, {"half"})})
        for c in b.poll(t):
            b.answered(t, c, "passed" if rng.random() < (1 / 16) else "wrong_hash")
        if b.delete_readiness(t, *V, {"half"}, r=1, durable_members=1) == "ready":
            ready_at = t
    assert ready_at is None or ready_at > 24 * 3600.0, ready_at
    assert b.failed["wrong_hash"] >= 24


def test_overloaded_is_inconclusive_never_a_failure_and_a_holder_that_only_says_so_stops_counting():
    """Finding 2: a holder whose slots an attacker keeps busy answers 503 until the timeout: nothing is learnt (no
    failure, no push), it is asked again later with a growing wait, and a delete waits for a pass; after
    OVERLOADS_UNCOUNTED in a row it stops counting until it passes."""
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"h"})})
    (c,) = b.poll(2.0)
    b.answered(2.0, c, "passed")
    b.want_delete(1000.0, [V])
    dues = []
    for _ in range(3):
        (c,) = b.poll(b.next_deadline() or 1000.0)
        assert b.answered(c and 1000.0 + len(dues), c, "overloaded") == []
        dues.append(b.next_deadline())
        assert b.delete_readiness(1000.0 + len(dues), *V, {"h"}, r=1, durable_members=1) != "ready"
    assert dues == [1002.0, 1005.0, 1010.0]  # 2, 4, 8 s after each
    assert b.failed == dict.fromkeys(FAIL_REASONS, 0) and b.overloaded == 3
    assert b.failed_holders(*V) == {"h"} and b.view(*V, 1010.0)["h"]["counted"] is False
    (c,) = b.poll(1010.0)
    b.answered(1010.0, c, "passed")
    assert b.counted(*V, {"h"}) == {"h"}
    assert b.delete_readiness(1010.0, *V, {"h"}, r=1, durable_members=1) == "ready"  # never failed: one pass does


def test_delete_readiness_is_the_one_rule():
    b = book()
    assert b.delete_readiness(0.0, *V, set(), r=2, durable_members=2) == "short"
    b.observe(0.0, {"a.npz": (100, ROOT, {"h1", "h2"})})
    assert b.delete_readiness(0.0, *V, {"h1", "h2"}, r=2, durable_members=2) == "unproven"
    assert b.delete_readiness(0.0, *V, {"h1", "h2"}, r=2, durable_members=0) == "short"
    s = {c.holder: c for c in b.poll(2.0)}
    b.answered(2.0, s["h1"], "passed")
    assert b.delete_readiness(2.0, *V, {"h1", "h2"}, r=2, durable_members=2) == "unproven"
    assert b.delete_readiness(2.0, *V, {"h1", "h2"}, r=2, durable_members=1) == "ready"  # R capped at 1
    b.answered(2.0, s["h2"], "timeout")
    assert b.delete_readiness(2.0, *V, {"h1", "h2"}, r=2, durable_members=2) == "short"


def test_withdrawn_records_are_bounded(monkeypatch):
    from p2pnode.synccore import _possession

    monkeypatch.setattr(_possession, "MAX_WITHDRAWN", 10)
    b = book()
    for k in range(30):
        b.observe(float(k), {f"f{k}": (1, ROOT, {"h"})})  # each file claimed once, then withdrawn (gone)
    b.observe(31.0, {})
    assert sum(len(r) for r in b._records.values()) == 10 and b.forgotten == 20
    assert set(b._records) == {f"f{k}" for k in range(20, 30)}  # the newest kept
    b.observe(31.0 + 3601.0, {})
    assert b._records == {}


def _server(tmp_path, origin, holder):
    """A real ChallengeServer over a real replica store holding one 3-block file of ``origin``."""
    import types

    import trio

    from p2pnode.config import load_config
    from p2pnode.sync import PushItem, ReplicaStore
    from p2pnode.sync._possess import ChallengeServer
    from p2pnode.synccore import hash_file

    src = tmp_path / "src.bin"
    data = random.Random(0).randbytes(300_000)
    src.write_bytes(data)
    m = hash_file(src, block_size=128 * 1024)
    store = ReplicaStore(tmp_path / "d")
    blocks = [(i, data[i * m.block_size:(i + 1) * m.block_size]) for i in range(m.blocks)]
    store.apply(origin.node_id, PushItem("cfg/a.bin", m, 1, blocks))
    refused = []
    ctx = types.SimpleNamespace(node_id=holder.node_id, publish_to=lambda o: None)
    srv = ChallengeServer(ctx, load_config(None, env={}).sync, store, {origin.node_id: origin.public_key}.get,
                          lambda o: trio.Lock(), refused.append)
    return srv, m, refused


async def test_a_holder_refuses_a_replayed_challenge_and_one_over_its_byte_budget(tmp_path, monkeypatch):
    """Finding 2, the holder's side: a signed challenge sent again is refused ``replayed`` (counted), and an origin
    asking for more bytes per second than its budget gets ``over_budget`` (503: the origin asks again later, and a
    challenge refused so until its timeout is inconclusive, never a failure)."""
    from p2pnode.sync import _possess

    origin, holder = Identity.generate(), Identity.generate()
    srv, m, refused = _server(tmp_path, origin, holder)

    def challenge(nonce):
        body = msgspec.msgpack.encode(ChallengeRequest(origin.node_id, holder.node_id, "cfg/a.bin", m.size, m.root,
                                                       nonce, [0, 1, 2]))
        return sign_challenge(origin, body), body

    h, body = challenge(b"1" * 32)
    status, out = await srv.answer(h, body)
    assert status == 200 and msgspec.msgpack.decode(out)["status"] == "present"
    status, out = await srv.answer(h, body)
    assert status == 409 and msgspec.msgpack.decode(out)["error"] == "replayed" and refused == ["replayed"]
    monkeypatch.setattr(_possess, "CHALLENGE_BYTES_PER_ORIGIN_S", 1)  # the bucket refills at 1 B/s from here
    monkeypatch.setattr(_possess, "CHALLENGE_BYTES_BURST", 2 * m.size)
    srv._budget.clear()
    answered = [(await srv.answer(*challenge(bytes([n]) * 32)))[0] for n in range(3)]
    assert answered == [200, 200, 503] and refused[-1] == "over_budget"
    # refused for its budget, the nonce was not taken: the same challenge is answered once the budget allows
    srv._budget.clear()
    assert (await srv.answer(*challenge(bytes([2]) * 32)))[0] == 200


async def test_the_guard_goes_on_assessing_while_challenges_before_a_delete_are_under_way(tmp_path, autojump_clock):
    """Finding 5: the guard's preparation before a cleanup (the challenges, up to challenge_timeout_s + 5 s) runs
    in its own task: assessment goes on every check_interval_s meanwhile, and no second pass starts on top."""
    import trio

    from p2pnode.drivers._guard import GuardDriver
    from p2pnode.guardcore import GuardLimits
    from p2pnode.resources import ResourceSample

    full = ResourceSample(cpu_percent=1.0, cpu_count=4, load_avg=(0.0, 0.0, 0.0), mem_total_bytes=2**34,
                          mem_available_bytes=2**33, mem_used_bytes=2**33, mem_percent=50.0, disk_path="/",
                          disk_total_bytes=2**40, disk_used_bytes=int(2**40 * 0.8), disk_free_bytes=int(2**40 * 0.2),
                          disk_percent=80.0)
    g = GuardDriver(GuardLimits(check_interval_s=1.0, cleanup="dry-run"), node_id="n", data_dir=tmp_path,
                    now=trio.current_time, on_news=lambda: None)
    checks, prepared, release = [], [], trio.Event()

    def sample():
        checks.append(trio.current_time())
        return full

    async def prepare():
        prepared.append(trio.current_time())
        await release.wait()  # the holders take their time to answer

    async with trio.open_nursery() as n:
        n.start_soon(g.run, sample, lambda: (lambda p: False), lambda: (lambda p: False), prepare)
        await trio.sleep(10.5)
        assert len(checks) == 10 and prepared == [1.0] and g.cleanups_skipped == 9 and g.last_cleanup is None
        release.set()
        while g.last_cleanup is None:  # the pass runs in a worker thread
            await trio.sleep(0.1)
        while len(prepared) < 2:
            await trio.sleep(0.1)
        assert prepared[1] > 10.5  # the next check past the warning level starts the next pass
        n.cancel_scope.cancel()


async def test_the_challengers_per_holder_limits_of_departed_members_are_pruned():
    """Finding 3: ``Challenger._per_holder`` keeps no entry for a holder no longer a member (unless a challenge of it
    is under way)."""
    import types

    import trio

    from p2pnode.config import load_config
    from p2pnode.sync._possess import CHALLENGES_PER_HOLDER, Challenger

    ctx = types.SimpleNamespace(member=lambda h: object() if h == "here" else None)
    ch = Challenger(ctx, load_config(None, env={}).sync, None, types.SimpleNamespace(book=book()), lambda: None)
    ch._per_holder = {h: trio.Semaphore(CHALLENGES_PER_HOLDER) for h in ("here", "gone", "gone-busy")}
    ch._per_holder["gone-busy"].acquire_nowait()
    ch.prune()
    assert set(ch._per_holder) == {"here", "gone-busy"}


def test_a_claim_no_challenge_could_check_stops_counting_but_a_holder_that_passed_keeps_counting():
    """A small log appended faster than a challenge lands makes every challenge of it inconclusive: a holder that
    never passed for the file stops counting after OVERLOADS_UNCOUNTED of them in a row (nobody could check its
    claim), one that passed before keeps counting; neither is failed."""
    b = book()
    b.observe(0.0, {"a.npz": (100, ROOT, {"old", "new"})})
    s = {c.holder: c for c in b.poll(2.0)}
    b.answered(2.0, s["old"], "passed")
    b.answered(2.0, s["new"], "inconclusive")
    b.want_delete(3600.0, [V])
    for t in (4.0, 6.0, 3600.0, 3602.0, 3604.0):
        for c in b.poll(t):
            b.answered(t, c, "inconclusive")
    assert b.counted(*V, {"old", "new"}) == {"old"} and b.failed == dict.fromkeys(FAIL_REASONS, 0)
    assert b.view(*V, 3604.0)["new"]["state"] == "unverified" and b.view(*V, 3604.0)["old"]["counted"] is True
    assert b.failed_holders(*V) == {"new"}  # while it claims the current version: not a push target either
    b.observe(3605.0, {"a.npz": (100, ROOT, {"old"})})  # it lags behind (holds an older version): pushed to again
    assert b.failed_holders(*V) == frozenset()
    b.observe(3605.5, {"a.npz": (100, ROOT, {"old", "new"})})
    (c,) = [c for c in b.poll(3606.0) if c.holder == "new"]
    b.answered(3606.0, c, "passed")
    assert b.counted(*V, {"old", "new"}) == {"old", "new"}
