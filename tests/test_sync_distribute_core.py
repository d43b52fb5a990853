"""Distribution's pure core: signed publications, the accept rules (hostile ones included), fetch plans in virtual
time, and which previous versions may go (p2pnode/synccore/_distribute.py)."""

from __future__ import annotations

import os
import random

import msgspec
import pytest

from p2pnode.identity import Identity
from p2pnode.synccore import (
    FetchPlan,
    FetchPolicy,
    HolderHealth,
    Manifest,
    Publication,
    PublicationBook,
    PublicationRefused,
    VersionKeeper,
    check_publication_name,
    decode_publication,
    encode_publication,
    hash_block,
    publisher_text,
    sign_publication,
)

BS = 128 * 1024


def manifest_of(data: bytes, bs: int = BS) -> Manifest:
    hashes = b"".join(hash_block(data[i : i + bs]) for i in range(0, len(data), bs))
    return Manifest.build(len(data), bs, hashes)


def publish(ident: Identity, name: str, version: int, data: bytes) -> Publication:
    return sign_publication(ident.sign, ident.public_key, name, version, manifest_of(data))


@pytest.fixture
def op() -> Identity:
    return Identity.generate()


def refused(book: PublicationBook, pub: Publication, **kw: int) -> str:
    with pytest.raises(PublicationRefused) as ei:
        book.accept(pub, **kw)
    return ei.value.reason


def test_round_trip_and_accept(op: Identity) -> None:
    pub = publish(op, "model.safetensors", 3, os.urandom(300_000))
    back = decode_publication(encode_publication(pub))
    assert back == pub and back.manifest.blocks == 3
    book = PublicationBook([publisher_text(op.public_key)])
    assert book.accept(back, free_bytes=10**9, reserve_bytes=10**6) is True
    assert book.accept(back) is False  # the same one again: nothing new, nothing refused
    assert book.floors == {"model.safetensors": 3} and book.serves(pub.root) == pub
    assert not book.refused


def test_unpinned_publisher_refused_by_default(op: Identity) -> None:
    pub = publish(op, "m.pt", 1, b"x" * 1000)
    assert refused(PublicationBook([]), pub) == "unpinned"
    other = Identity.generate()
    book = PublicationBook([publisher_text(other.public_key)])
    assert refused(book, pub) == "unpinned"
    assert book.refused == {"unpinned": 1} and not book.current


def test_forged_signature_and_swapped_manifest(op: Identity) -> None:
    book = PublicationBook([publisher_text(op.public_key)])
    pub = publish(op, "m.pt", 2, b"a" * 5000)
    evil = manifest_of(b"b" * 5000)
    # a member swaps in other bytes under the publisher's signature: the root is signed, so it fails
    swapped = msgspec.structs.replace(pub, hashes=evil.hashes, root=evil.root)
    assert refused(book, swapped) == "bad_signature"
    # the right root with other hashes: the manifest does not add up
    torn = msgspec.structs.replace(pub, hashes=evil.hashes)
    assert refused(book, torn) == "bad_manifest"
    assert refused(book, msgspec.structs.replace(pub, version=3)) == "bad_signature"
    assert refused(book, msgspec.structs.replace(pub, name="n.pt")) == "bad_signature"
    assert refused(book, msgspec.structs.replace(pub, to="selfplay")) == "bad_signature"  # redirected
    assert book.refused == {"bad_signature": 4, "bad_manifest": 1}


def test_replayed_older_version_refused_and_floor_persists(op: Identity) -> None:
    keys = [publisher_text(op.public_key)]
    book = PublicationBook(keys)
    v1 = publish(op, "m.pt", 1, b"one" * 100)
    v2 = publish(op, "m.pt", 2, b"two" * 100)
    assert book.accept(v2)
    assert refused(book, v1) == "stale_version"
    # a restarted node reads its persisted floor: the old one stays refused, and so does another root at v2
    again = PublicationBook(keys, floors=book.floors)
    assert refused(again, v1) == "stale_version"
    other_v2 = publish(op, "m.pt", 2, b"other" * 100)
    assert refused(again, other_v2) == "stale_version"
    assert again.accept(v2, restoring=True)  # what it held itself before the restart
    assert again.accept(publish(op, "m.pt", 3, b"three"))


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "", ".hidden", "x\x00y", "a\\b", "tab\there", "é" * 200,
                                  "x" * 201])
def test_names_are_one_component(op: Identity, name: str) -> None:
    with pytest.raises(PublicationRefused) as ei:
        check_publication_name(name)
    assert ei.value.reason == "bad_name"
    with pytest.raises(PublicationRefused):
        publish(op, name, 1, b"x")


def test_hostile_name_in_a_signed_publication_refused(op: Identity) -> None:
    # a publication signed over "../etc" (by a pinned key even) never gets a path
    good = publish(op, "ok", 1, b"x")
    raw = msgspec.msgpack.encode(msgspec.structs.replace(good, name="../etc"))
    book = PublicationBook([publisher_text(op.public_key)])
    assert refused(book, decode_publication(raw)) == "bad_name"


def test_oversize_against_free_disk(op: Identity) -> None:
    book = PublicationBook([publisher_text(op.public_key)])
    pub = publish(op, "big.pt", 1, os.urandom(1_000_000))
    assert refused(book, pub, free_bytes=1_200_000, reserve_bytes=300_000) == "no_space"
    # a resumed partial file already holds part of it
    assert book.accept(pub, free_bytes=1_200_000, reserve_bytes=300_000, have_bytes=200_000)


@pytest.mark.parametrize("blob", [b"", b"\xc1", b"\x80", msgspec.msgpack.encode({"name": "x"}), b"\x92" * 50_000,
                                  b"\xdb\xff\xff\xff\xff"])
def test_malformed_never_crashes(blob: bytes) -> None:
    with pytest.raises(PublicationRefused) as ei:
        decode_publication(blob)
    assert ei.value.reason == "malformed"


def test_decoder_bounds(op: Identity) -> None:
    pub = publish(op, "m", 1, b"x")
    d = msgspec.to_builtins(pub)
    for field, value in [("version", 0), ("version", 2**60), ("sig", b"x" * 63), ("publisher", "rsa:abc"),
                         ("block_size", 2**30), ("root", b"r" * 31)]:
        bad = dict(d, **{field: value})
        with pytest.raises(PublicationRefused):
            decode_publication(msgspec.msgpack.encode(bad))


# -- fetch plans -------------------------------------------------------------------------------------------------
def test_fetch_plan_caps_streams_and_resumes(op: Identity) -> None:
    pub = publish(op, "m", 1, os.urandom(BS * 40))
    pol = FetchPolicy(streams_per_holder=2, max_streams=3, blocks_per_request=4, request_timeout_s=10)
    plan = FetchPlan(pub, me="sub1", publisher="pubr", policy=pol, have={0, 1, 2})
    assert plan.next_requests(0.0) == []  # nobody known yet
    plan.holder_has("pubr", None)
    reqs = plan.next_requests(0.0)
    assert [r.holder for r in reqs] == ["pubr", "pubr"]  # two streams to one holder at most
    assert all(len(r.indices) == 4 for r in reqs)
    assert not {0, 1, 2} & {i for r in reqs for i in r.indices}  # resumed blocks are not asked again
    plan.holder_has("sub2", range(0, 40, 2))
    more = plan.next_requests(0.0)
    assert [r.holder for r in more] == ["sub2"] and plan.in_flight == 3  # max_streams
    assert all(i % 2 == 0 for i in more[0].indices)
    assert plan.next_deadline() == 10.0
    late = plan.on_timer(10.0)
    assert len(late) == 3 and plan.in_flight == 0 and plan.backoff_until == {"pubr": 20.0, "sub2": 20.0}
    assert plan.next_requests(15.0) == [] and plan.next_deadline() == 20.0
    assert plan.next_requests(20.0)
    assert plan.progress() == (3, 40, 3 * BS)


def test_peers_before_the_publisher_and_rendezvous_spread(op: Identity) -> None:
    pub = publish(op, "m", 1, os.urandom(BS * 64))
    plan = FetchPlan(pub, me="s1", publisher="P", policy=FetchPolicy(streams_per_holder=64, max_streams=64,
                                                                      blocks_per_request=1))
    for h in ("P", "a", "b", "c"):
        plan.holder_has(h, None)
    reqs = plan.next_requests(0.0)
    by = {}
    for r in reqs:
        by[r.holder] = by.get(r.holder, 0) + 1
    assert "P" not in by and len(reqs) == 64
    assert min(by.values()) >= 10  # rendezvous spreads the blocks over the three peers


def test_rarest_first(op: Identity) -> None:
    pub = publish(op, "m", 1, os.urandom(BS * 8))
    plan = FetchPlan(pub, me="s1", publisher="P", policy=FetchPolicy(max_streams=1, blocks_per_request=1))
    plan.holder_has("P", None)
    plan.holder_has("a", {0, 1, 2, 3, 4, 5, 6})  # block 7 only the publisher has
    assert plan.next_requests(0.0)[0].indices == (7,)


def test_failed_block_backs_off_the_holder(op: Identity) -> None:
    pub = publish(op, "m", 1, os.urandom(BS * 4))
    plan = FetchPlan(pub, me="s1", policy=FetchPolicy(blocks_per_request=4, backoff_s=5))
    plan.holder_has("bad", None)
    (req,) = plan.next_requests(0.0)
    assert req.holder == "bad" and req.indices == (0, 1, 2, 3)
    plan.holder_has("good", None)
    plan.block_verified(0, "bad")
    plan.block_failed(1, "bad", 1.0)  # a block that did not match its hash
    plan.request_ended(req, 1.0)
    reqs = plan.next_requests(1.0)
    assert [r.holder for r in reqs] == ["good"] and reqs[0].indices == (1, 2, 3)
    assert plan.failures == {"bad": 1} and plan.bytes_from == {"bad": BS}


def test_a_holder_that_sent_a_tampered_block_is_never_asked_again(op: Identity) -> None:
    """Review M1: a holder serving a tampered block is bad for this publication only, for good (not just backed
    off); the blocks go to the other holders, and a fetch with only that holder waits rather than asking it."""
    pub = publish(op, "m", 1, os.urandom(BS * 4))
    plan = FetchPlan(pub, me="s1", policy=FetchPolicy(blocks_per_request=4, backoff_s=5))
    plan.holder_has("bad", None)
    (req,) = plan.next_requests(0.0)
    plan.block_failed(0, "bad", 1.0)
    plan.request_ended(req, 1.0)
    assert plan.next_requests(1000.0) == []  # long after any backoff: still not asked
    plan.holder_has("good", None)
    reqs = plan.next_requests(1000.0)
    assert [r.holder for r in reqs] == ["good"] and reqs[0].indices == (0, 1, 2, 3)
    other = FetchPlan(publish(op, "n", 1, os.urandom(BS)), me="s1")
    other.holder_has("bad", None)
    assert [r.holder for r in other.next_requests(0.0)] == ["bad"]  # another publication: asked as before


def test_requests_are_bounded_by_bytes(op: Identity) -> None:
    """Review M5: a request asks for ``max_request_bytes`` of blocks at most (one block always fits)."""
    pub = publish(op, "m", 1, os.urandom(BS * 7))
    plan = FetchPlan(pub, me="s1", policy=FetchPolicy(blocks_per_request=16, max_request_bytes=2 * BS + 1,
                                                      max_streams=8, streams_per_holder=8))
    plan.holder_has("h", None)
    reqs = plan.next_requests(0.0)
    assert sorted(len(r.indices) for r in reqs) == [1, 2, 2, 2] and sum(len(r.indices) for r in reqs) == 7
    one = FetchPlan(pub, me="s1", policy=FetchPolicy(blocks_per_request=16, max_request_bytes=1))
    one.holder_has("h", None)
    assert all(len(r.indices) == 1 for r in one.next_requests(0.0))


def test_planning_stops_once_every_holder_is_busy(op: Identity) -> None:
    """Review M7: with 20,000 blocks and two holders of one stream each, a call looks at a few blocks, not every
    block against every holder (the rarest-first order is kept while what holders have stays the same)."""
    data = os.urandom(16 * 20_000)
    pub = sign_publication(op.sign, op.public_key, "m", 1, manifest_of(data, 16))
    plan = FetchPlan(pub, me="s1", policy=FetchPolicy(streams_per_holder=1, max_streams=8, blocks_per_request=4))
    plan.holder_has("a", None)
    plan.holder_has("b", None)
    calls = [0]
    best = plan._best_holder

    def counted(*a):
        calls[0] += 1
        return best(*a)

    plan._best_holder = counted
    reqs = plan.next_requests(0.0)
    assert len(reqs) == 2 and calls[0] <= 8
    calls[0] = 0
    assert plan.next_requests(0.0) == [] and calls[0] == 0  # both busy: nothing scanned
    plan.holder_has("a", None)  # told again, unchanged: the order is kept
    assert plan._ranked is not None


def test_a_holder_whose_requests_time_out_backs_off_longer_each_time(op: Identity) -> None:
    """Review L4 (anti-snubbing): a holder that claims every block and never answers backs off ``backoff_s``,
    then twice, four times as long; a block from it ends the streak."""
    pub = publish(op, "m", 1, os.urandom(BS * 8))
    plan = FetchPlan(pub, me="s1", policy=FetchPolicy(request_timeout_s=5, backoff_s=10, streams_per_holder=1))
    plan.holder_has("mute", None)
    now, waits = 0.0, []
    for _ in range(3):
        assert [r.holder for r in plan.next_requests(now)] == ["mute"]
        now += 5
        plan.on_timer(now)
        waits.append(plan.backoff_until["mute"] - now)
        now = plan.backoff_until["mute"]
    assert waits == [10, 20, 40]
    (req,) = plan.next_requests(now)
    plan.block_verified(req.indices[0], "mute")
    plan.request_ended(req, now)
    assert "mute" not in plan.snubs


def test_a_holder_that_timed_out_in_one_fetch_backs_off_in_all(op: Identity) -> None:
    """Review L4, across fetches: plans sharing one :class:`HolderHealth`; a holder whose request timed out in one
    is passed over by the others until its backoff ends, and a busy answer's short backoff does not cut it."""
    health = HolderHealth()
    policy = FetchPolicy(request_timeout_s=5, backoff_s=10, streams_per_holder=1)
    a = FetchPlan(publish(op, "a", 1, os.urandom(BS * 2)), me="s1", policy=policy, health=health)
    b = FetchPlan(publish(op, "b", 1, os.urandom(BS * 2)), me="s1", policy=policy, health=health)
    c = FetchPlan(publish(op, "c", 1, os.urandom(BS * 2)), me="s1", policy=policy, health=health)
    a.holder_has("mute", None)
    b.holder_has("mute", None)
    b.holder_has("ok", None)
    c.holder_has("mute", None)
    assert [r.holder for r in a.next_requests(0.0)] == ["mute"]
    a.on_timer(5.0)
    assert health.backoff_until == {"mute": 15.0}
    assert [r.holder for r in b.next_requests(5.0)] == ["ok"]  # another fetch passes it over
    health.back_off("mute", 5.2)  # a busy answer's 0.2 s
    assert health.backoff_until == {"mute": 15.0}
    assert c.next_requests(14.9) == [] and c.next_deadline() == 15.0  # its only holder backs off
    assert [r.holder for r in c.next_requests(15.0)] == ["mute"]


def swarm(n_subs: int, blocks: int, seed: int, pinned: set[str]) -> tuple[dict[str, FetchPlan], dict[str, int]]:
    """Virtual-time swarm: one publisher P holding everything, subscribers s0.. fetching; each request takes one
    tick, holders' possession is refreshed every tick (as a snapshot would). Returns plans and bytes served."""
    op = Identity.generate()
    pub = publish(op, "model", 1, random.Random(seed).randbytes(BS * blocks))
    subs = [f"s{i}" for i in range(n_subs)]
    plans: dict[str, FetchPlan] = {}
    for s in subs:
        book = PublicationBook([publisher_text(op.public_key)] if s in pinned else [])
        try:
            book.accept(pub)
        except PublicationRefused:
            continue
        plans[s] = FetchPlan(pub, me=s, publisher="P", policy=FetchPolicy(streams_per_holder=2, max_streams=4,
                                                                          blocks_per_request=2))
    served: dict[str, int] = {}
    now = 0.0
    while not all(p.done for p in plans.values()) and now < 10_000:
        for s, plan in plans.items():
            plan.holder_has("P", None)
            for other, op_plan in plans.items():
                if other != s:
                    plan.holder_has(other, set(op_plan.have))
        started = [(s, r) for s, plan in plans.items() for r in plan.next_requests(now)]
        now += 1.0
        for s, r in started:
            for i in r.indices:
                plans[s].block_verified(i, r.holder)
                served[r.holder] = served.get(r.holder, 0) + pub.manifest.block_len(i)
            plans[s].request_ended(r, now)
    return plans, served


def test_swarm_spares_the_publisher() -> None:
    plans, served = swarm(4, 64, seed=1, pinned={"s0", "s1", "s2", "s3"})
    size = 64 * BS
    assert all(p.done for p in plans.values()) and len(plans) == 4
    assert served["P"] <= 2 * size, served  # the acceptance bound: at most 2 copies from the publisher
    assert sum(1 for s in plans if any(h != "P" for h in plans[s].bytes_from)) >= 3  # peers served each other


def test_swarm_unpinned_subscriber_fetches_nothing() -> None:
    plans, served = swarm(3, 16, seed=2, pinned={"s0", "s1"})
    assert set(plans) == {"s0", "s1"} and "s2" not in served


def test_version_keeper() -> None:
    k = VersionKeeper()
    k.switched("m", 1, at=100.0)
    k.switched("m", 2, at=200.0)
    k.switched("m", 3, at=300.0)
    jobs = {"j0": 50.0, "j1": 150.0, "j2": 250.0, "j3": 350.0}  # started before v1, under v1, v2, v3
    assert k.removable(jobs.values()) == []  # v1 pinned by j1, v2 by j2
    del jobs["j1"]
    assert k.removable(jobs.values()) == [("m", 1)]
    del jobs["j2"]
    assert k.removable(jobs.values()) == [("m", 2)]
    assert k.removable(jobs.values()) == [] and k.current == {"m": (3, 300.0)}
    k.switched("m", 4, at=400.0)
    assert k.removable(jobs.values()) == []  # v3 is pinned by j3
    assert k.removable([]) == [("m", 3)]
