"""The checkpoint core (issue 41, item 2; :mod:`p2pnode.synccore._checkpoints`): complete entries, signed identity,
order by (term, placement, sequence) never by file time, trust in the plan's placement only, and the newest
checkpoint per config with its holders."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec
import pytest

from p2pnode.identity import Identity
from p2pnode.synccore import (
    AssignmentBook,
    CheckpointBody,
    CheckpointDetector,
    CheckpointFile,
    CheckpointRef,
    CheckpointRefused,
    CheckpointTrust,
    DirEntry,
    FetchCheckpoint,
    StartNow,
    decode_signed_checkpoint,
    encode_signed_checkpoint,
    newest_checkpoint,
    resume_from,
    sign_checkpoint,
)
from p2pnode.synccore._checkpoints import SignedCheckpoint

ROOT = bytes(range(32))


def _file(path: str = "", size: int = 1000) -> CheckpointFile:
    return CheckpointFile(path, size, 1 << 20, ROOT)


# -- detection ----------------------------------------------------------------------------------------------------
def test_an_entry_counts_once_settled_or_marked_and_never_while_being_written() -> None:
    d = CheckpointDetector(settle_s=2.0)
    tmp = DirEntry(".step-1.pt.tmp", (("", 10, 1),))
    partial = DirEntry("step-1.pt.partial", (("", 10, 1),))
    first = DirEntry("step-1.pt", (("", 100, 5),))
    assert d.observe([tmp, partial, first], 0.0) == []
    assert d.next_deadline() == 2.0
    grown = DirEntry("step-1.pt", (("", 200, 6),))  # written in place: changed, the settle time starts again
    assert d.observe([grown], 1.5) == []
    assert d.observe([grown], 3.0) == []
    done = d.observe([grown, tmp], 3.5)
    assert [(c.name, c.seq, c.files) for c in done] == [("step-1.pt", 1, (("", 200),))]
    assert d.observe([grown], 10.0) == []  # announced once
    marked = DirEntry("step-2", (("a.safetensors", 7, 1), ("b.safetensors", 8, 1)), is_dir=True, marker=True)
    unmarked_empty = DirEntry("step-3", (), is_dir=True)
    assert [(c.name, c.seq) for c in d.observe([marked, unmarked_empty], 10.0)] == [("step-2", 2)]
    assert d.next_deadline() is None


def test_entries_complete_together_are_numbered_in_name_order_and_a_restart_keeps_the_numbers() -> None:
    d = CheckpointDetector(settle_s=0.0, announced={"step-1": 4})
    out = d.observe([DirEntry("b", (("", 1, 1),)), DirEntry("a", (("", 1, 1),)), DirEntry("step-1", (("", 1, 1),))],
                    0.0)
    assert [(c.name, c.seq) for c in out] == [("a", 5), ("b", 6)]


# -- identity -----------------------------------------------------------------------------------------------------
def test_a_signed_checkpoint_round_trips_and_hostile_bodies_do_not_decode() -> None:
    ident = Identity.generate()
    body = CheckpointBody("hex8_2p", "7-3", 2, ident.node_id, "ck", "step-2", (_file("a"), _file("b/c")))
    sc = sign_checkpoint(ident.sign, body)
    sc2, body2 = decode_signed_checkpoint(encode_signed_checkpoint(sc))
    assert (sc2, body2) == (sc, body) and body2.order == (7, 3, 2) and body2.size == 2000
    assert [body.path_of(f) for f in body.files] == ["ck/step-2/a", "ck/step-2/b/c"]
    for d in ("/abs", "../up", "a/.hidden", "a//b"):
        with pytest.raises(CheckpointRefused) as exc:
            sign_checkpoint(ident.sign, msgspec.structs.replace(body, dir=d))
        assert exc.value.reason == "bad_path"
    for name, files in [("../x", (_file(),)), ("a/b", (_file(),)), (".hidden", (_file(),)), ("x.tmp", (_file(),)),
                        ("x", (_file("../../etc/passwd"),)), ("x", (_file("/abs"),)), ("x", (_file("a/.git"),)),
                        ("x", (_file("a"), _file("a"))), ("x", (_file(""), _file("b")))]:
        bad = CheckpointBody("hex8_2p", "7-3", 2, ident.node_id, "ck/x", name, files)
        with pytest.raises(CheckpointRefused) as exc:
            sign_checkpoint(ident.sign, bad)
        assert exc.value.reason == "bad_path"
        raw = msgspec.msgpack.encode(bad)
        with pytest.raises(CheckpointRefused) as exc:
            decode_signed_checkpoint(encode_signed_checkpoint(SignedCheckpoint(raw, b"s" * 64)))
        assert exc.value.reason == "bad_path"
    with pytest.raises(CheckpointRefused) as exc:
        sign_checkpoint(ident.sign, CheckpointBody("c", "1-1", 1, "n", "ck", "x", (CheckpointFile("", 1, 3000, ROOT),)))
    assert exc.value.reason == "bad_manifest"
    for data in [b"", b"\x91", msgspec.msgpack.encode({"body": b"x", "sig": b"s" * 64}), b"\xff" * 600_000,
                 msgspec.msgpack.encode({"body": msgspec.msgpack.encode({"config": "c", "job_id": "1-1", "seq": 0,
                                                                        "origin": "n", "name": "x", "files": []}),
                                         "sig": b"s" * 64})]:
        with pytest.raises(CheckpointRefused) as exc:
            decode_signed_checkpoint(data)
        assert exc.value.reason == "malformed"


def test_order_is_term_then_placement_then_sequence_never_a_file_time() -> None:
    bodies = [CheckpointBody("c", j, s, "n", "ck", "x", (_file(),)) for j, s in
              [("2-10", 1), ("10-1", 1), ("2-9", 500), ("2-10", 2), ("1-99", 9)]]
    assert [(b.job_id, b.seq) for b in sorted(bodies, key=lambda b: b.order)] == [
        ("1-99", 9), ("2-9", 500), ("2-10", 1), ("2-10", 2), ("10-1", 1)]


# -- trust --------------------------------------------------------------------------------------------------------
class Cluster:
    """Three members with keys, and the plans the leader signed: job 5-1 of hex8_2p on a, then 5-4 on b."""

    def __init__(self) -> None:
        self.a, self.b, self.c = Identity.generate(), Identity.generate(), Identity.generate()
        self.keys = {i.node_id: i.public_key for i in (self.a, self.b, self.c)}
        self.book = AssignmentBook()
        self.book.record("hex8_2p", "5-1", self.a.node_id)
        self.book.record("hex8_2p", "5-4", self.b.node_id)
        self.book.record("hex8_2p", "run-xyz", self.c.node_id)  # a one-off run: no placement, ignored

    def trust(self) -> CheckpointTrust:
        return CheckpointTrust(self.book, self.keys.get)

    def signed(self, who: Identity, job_id: str, seq: int, config: str = "hex8_2p", size: int = 1000):
        body = CheckpointBody(config, job_id, seq, who.node_id, "ck", f"step-{seq}", (_file(size=size),))
        return sign_checkpoint(who.sign, body), body


def _refusal(trust: CheckpointTrust, sc, body) -> str:
    with pytest.raises(CheckpointRefused) as exc:
        trust.accept(sc, body)
    return exc.value.reason


def test_only_the_node_the_plan_placed_the_training_on_is_trusted() -> None:
    cl = Cluster()
    t = cl.trust()
    assert t.accept(*cl.signed(cl.a, "5-1", 1)) and t.accept(*cl.signed(cl.b, "5-4", 1))
    assert not t.accept(*cl.signed(cl.a, "5-1", 1))  # held already
    assert _refusal(t, *cl.signed(cl.c, "5-1", 9)) == "not_assigned"  # c claims a's placement
    assert _refusal(t, *cl.signed(cl.c, "5-9", 1)) == "unknown_placement"
    assert _refusal(t, *cl.signed(cl.c, "run-xyz", 1)) == "not_placement"
    assert _refusal(t, *cl.signed(cl.a, "5-1", 2, config="other")) == "unknown_placement"
    forged_sc, forged = cl.signed(cl.c, "5-4", 7)  # c signs a body that names b as its origin
    forged = msgspec.structs.replace(forged, origin=cl.b.node_id)
    forged_sc = sign_checkpoint(cl.c.sign, forged)
    assert _refusal(t, forged_sc, forged) == "bad_signature"
    unknown = CheckpointTrust(cl.book, lambda node: None)
    assert _refusal(unknown, *cl.signed(cl.a, "5-1", 1)) == "bad_signature"
    assert t.refused == {"not_assigned": 1, "unknown_placement": 2, "not_placement": 1, "bad_signature": 1}


def test_two_bodies_signed_for_one_sequence_are_a_conflict_and_neither_is_chosen() -> None:
    cl = Cluster()
    t = cl.trust()
    first = cl.signed(cl.b, "5-4", 3)
    t.accept(*first)
    other = cl.signed(cl.b, "5-4", 3, size=5)
    assert _refusal(t, *other) == "conflict"
    refs = {cl.b.node_id: [CheckpointRef("hex8_2p", "5-4", 3, cl.b.node_id, first[0].digest)]}
    assert newest_checkpoint("hex8_2p", refs, t) is None
    older = cl.signed(cl.a, "5-1", 8)
    t.accept(*older)
    refs[cl.a.node_id] = [CheckpointRef("hex8_2p", "5-1", 8, cl.a.node_id, older[0].digest)]
    assert newest_checkpoint("hex8_2p", refs, t).body == older[1]  # the one before the conflict


def test_a_replayed_older_checkpoint_is_never_fetched() -> None:
    cl = Cluster()
    t = cl.trust()
    old, new = cl.signed(cl.a, "5-1", 40), cl.signed(cl.b, "5-4", 2)
    t.accept(*new)
    t.resumed(new[1])  # this node resumed from b's checkpoint
    assert _refusal(t, *old) == "stale"
    restarted = CheckpointTrust(cl.book, cl.keys.get, floors=t.floors)  # the floor is persisted
    assert _refusal(restarted, *old) == "stale"
    assert restarted.accept(*new)  # the one it resumed from is still acceptable after a restart
    # even when a member publishes the older one with a ref claiming to be the newest, it is not chosen
    refs = {cl.c.node_id: [CheckpointRef("hex8_2p", "5-4", 99, cl.b.node_id, old[0].digest)],
            cl.b.node_id: [CheckpointRef("hex8_2p", "5-4", 2, cl.b.node_id, new[0].digest)]}
    got = newest_checkpoint("hex8_2p", refs, restarted)
    assert got is not None and got.body == new[1] and got.holders == (cl.b.node_id,)


def test_newest_is_by_order_with_every_holder_and_resume_decides_fetch_or_start() -> None:
    cl = Cluster()
    t = cl.trust()
    a1, a2, b1 = cl.signed(cl.a, "5-1", 1), cl.signed(cl.a, "5-1", 300, size=4000), cl.signed(cl.b, "5-4", 1, size=3000)
    for x in (a1, a2, b1):
        t.accept(*x)

    def ref(x):
        return CheckpointRef("hex8_2p", x[1].job_id, x[1].seq, x[1].origin, x[0].digest)

    refs = {"durable1": [ref(a1), ref(a2), ref(b1)], "durable2": [ref(b1)], cl.a.node_id: [ref(a2)]}
    got = newest_checkpoint("hex8_2p", refs, t)
    assert got.body == b1[1] and got.holders == ("durable1", "durable2")  # the later placement, whatever its seq
    assert newest_checkpoint("other", refs, t) is None
    fetch = resume_from("hex8_2p", refs, t, me=cl.c.node_id, have_bytes=1000, free_bytes=10_000, reserve_bytes=1000)
    assert isinstance(fetch, FetchCheckpoint) and fetch.need_bytes == 2000 and fetch.newest.digest == b1[0].digest
    with pytest.raises(CheckpointRefused) as exc:
        resume_from("hex8_2p", refs, t, me=cl.c.node_id, free_bytes=3500, reserve_bytes=1000)
    assert exc.value.reason == "no_space"
    assert resume_from("hex8_2p", refs, t, me="durable2") == StartNow("held", b1[0].digest)
    assert resume_from("hex8_2p", {}, t, me="x") == StartNow("no_checkpoint")
    # a ref whose body this node never accepted (fetched but refused, or never fetched) is not a checkpoint
    stranger = cl.signed(cl.c, "5-1", 999)
    refs["durable3"] = [CheckpointRef("hex8_2p", "5-1", 999, cl.a.node_id, stranger[0].digest)]
    assert newest_checkpoint("hex8_2p", refs, t).body == b1[1]


def test_the_refs_read_per_member_are_bounded() -> None:
    cl = Cluster()
    t = cl.trust()
    b1 = cl.signed(cl.b, "5-4", 1)
    t.accept(*b1)
    filler = [CheckpointRef("hex8_2p", "5-1", i + 1, cl.a.node_id, bytes(16)) for i in range(64)]
    refs = {"m": [*filler, CheckpointRef("hex8_2p", "5-4", 1, cl.b.node_id, b1[0].digest)]}
    assert newest_checkpoint("hex8_2p", refs, t) is None  # the 65th ref of one member is not read


def test_the_assignment_book_keeps_the_newest_placements_and_the_first_node_of_each() -> None:
    book = AssignmentBook()
    for s in range(40):
        book.record("c", f"3-{s}", f"n{s}")
    book.record("c", "3-39", "intruder")
    assert book.node_of("c", "3-39") == "n39" and book.node_of("c", "3-7") is None and book.node_of("c", "3-8") == "n8"
    assert book.node_of("c", "junk") is None and book.node_of("d", "3-39") is None


# -- placement proofs: a node that never saw the origin's plan part ----------------------------------------------
def _sealed_part(leader: Identity, node: str, term: int, jobs: list[tuple[str, str]]) -> bytes:
    from p2pnode.node._plandist import seal_part
    from p2pnode.snapshot import PlanJob, PlanSection

    return seal_part(leader, PlanSection(term=term, seq=3, node=node,
                                         assignments=[PlanJob(job_id=j, node=node, template=t) for j, t in jobs]))


def test_a_leader_signed_plan_part_proves_the_placement_to_a_node_that_never_saw_it() -> None:
    from p2pnode.node._ckproof import placement_prover

    leader, other_leader, a, c = (Identity.generate() for _ in range(4))
    keys = {a.node_id: a.public_key, c.node_id: c.public_key}
    prove = placement_prover({5: leader.public_key, 6: other_leader.public_key}.get,
                             {"train": "hex8_2p", "selfplay": "hex8_2p"}.get, {"train"}.__contains__)

    def trust() -> CheckpointTrust:
        return CheckpointTrust(AssignmentBook(), keys.get, prove=prove)

    def signed(who: Identity, job_id: str, proof: bytes):
        body = CheckpointBody("hex8_2p", job_id, 1, who.node_id, "ck", "step-1", (_file(),))
        return sign_checkpoint(who.sign, body, proof), body

    proof = _sealed_part(leader, a.node_id, 5, [("5-1", "train")])
    t = trust()
    assert t.accept(*signed(a, "5-1", proof))
    assert t.assignments.node_of("hex8_2p", "5-1") == a.node_id
    # c carries a's proof: the proof shows a placement on a, not on c
    assert _refusal(trust(), *signed(c, "5-1", proof)) == "not_assigned"
    # a part c forged, or one signed by the leader of another term, proves nothing
    assert _refusal(trust(), *signed(c, "5-1", _sealed_part(c, c.node_id, 5, [("5-1", "train")]))) == \
        "unknown_placement"
    assert _refusal(trust(), *signed(a, "5-1", _sealed_part(other_leader, a.node_id, 5, [("5-1", "train")]))) == \
        "unknown_placement"
    # a part of term 5 for a job id of term 6 (its term's leader did not sign it), garbage, a template not in the
    # catalog: nothing
    assert _refusal(trust(), *signed(a, "6-1", _sealed_part(leader, a.node_id, 5, [("6-1", "train")]))) == \
        "unknown_placement"
    assert _refusal(trust(), *signed(a, "5-1", b"\x92\xc4\x01x\xc4\x01y")) == "unknown_placement"
    assert _refusal(trust(), *signed(a, "5-2", _sealed_part(leader, a.node_id, 5, [("5-2", "nope")]))) == \
        "unknown_placement"
    # a term whose leader this node does not know: not trusted
    unknown_term = CheckpointTrust(AssignmentBook(), keys.get, prove=placement_prover({}.get, {"train": "hex8_2p"}.get,
                                                                                      {"train"}.__contains__))
    assert _refusal(unknown_term, *signed(a, "5-1", proof)) == "unknown_placement"
    # the proof travels with the signed checkpoint, outside the signed body (its digest is the body's)
    sc, _ = signed(a, "5-1", proof)
    sc2, _ = decode_signed_checkpoint(encode_signed_checkpoint(sc))
    assert sc2.proof == proof and sc2.digest == sign_checkpoint(a.sign, _, b"").digest


def test_a_selfplay_placement_of_the_config_proves_no_checkpoint() -> None:
    """Review H1: a node the leader gave a selfplay job of the config signs a "checkpoint" with that job's id and
    its own (genuine) placement proof; it must never become the config's newest (it would be loaded as a pickle)."""
    from p2pnode.node._ckproof import placement_prover, trains
    from p2pnode.scheduler import CheckpointSpec

    leader, trainer, selfplayer = (Identity.generate() for _ in range(3))
    keys = {n.node_id: n.public_key for n in (trainer, selfplayer)}
    catalog = {"train": SimpleNamespace(config="hex8_2p", fenced=True, checkpoint=CheckpointSpec("ck")),
               "selfplay": SimpleNamespace(config="hex8_2p", fenced=False, checkpoint=CheckpointSpec("ck")),
               "excl": SimpleNamespace(config="hex8_2p", fenced=True, checkpoint=None)}
    prove = placement_prover({7: leader.public_key}.get, lambda t: catalog[t].config if t in catalog else None,
                             lambda t: t in catalog and trains(catalog[t]))
    trust = CheckpointTrust(AssignmentBook(), keys.get, prove=prove)

    def signed(who: Identity, job_id: str, seq: int, template: str):
        body = CheckpointBody("hex8_2p", job_id, seq, who.node_id, "ck", f"step-{seq}", (_file(),))
        return sign_checkpoint(who.sign, body, _sealed_part(leader, who.node_id, 7, [(job_id, template)])), body

    good = signed(trainer, "7-1", 3, "train")
    assert trust.accept(*good)
    assert trust.assignments.template_of("hex8_2p", "7-1") == "train"
    evil = signed(selfplayer, "7-9", 999, "selfplay")
    assert _refusal(trust, *evil) == "not_training"
    assert _refusal(trust, *signed(selfplayer, "7-8", 5, "excl")) == "not_training"  # fenced, no checkpoint dir
    assert trust.refused["not_training"] == 2
    refs = {trainer.node_id: [CheckpointRef("hex8_2p", "7-1", 3, trainer.node_id, good[0].digest)],
            selfplayer.node_id: [CheckpointRef("hex8_2p", "7-9", 999, selfplayer.node_id, evil[0].digest)]}
    newest = newest_checkpoint("hex8_2p", refs, trust)
    assert newest is not None and newest.body.origin == trainer.node_id


# -- durable holders ----------------------------------------------------------------------------------------------
def test_a_holder_holds_a_checkpoint_only_with_the_origins_signature_and_every_replica_here() -> None:
    from p2pnode.synccore import CheckpointHolding

    a, c = Identity.generate(), Identity.generate()
    files = (CheckpointFile("m", 10, 1 << 20, ROOT), CheckpointFile("o", 5, 1 << 20, bytes(32)))
    body = CheckpointBody("hex8_2p", "5-1", 3, a.node_id, "ck", "step-3", files)
    sc = sign_checkpoint(a.sign, body)
    ref = CheckpointRef("hex8_2p", "5-1", 3, a.node_id, sc.digest)
    replicas: dict[tuple[str, str], tuple[int, bytes]] = {(a.node_id, "ck/step-3/m"): (10, ROOT)}

    def replica(origin: str, path: str):
        return replicas.get((origin, path))

    h = CheckpointHolding(_placed_trust({("hex8_2p", "5-1"): a}, a, c))
    refs = {a.node_id: [ref], c.node_id: [CheckpointRef("hex8_2p", "5-1", 9, a.node_id, bytes(16))]}
    assert h.wanted(refs, lambda o: o == a.node_id, 0.0) == [ref]  # a ref another member lists for a: not asked
    assert h.wanted(refs, lambda o: False, 0.0) == []  # no replica of a here
    assert h.offer(sc, body, ref=ref, origin_key=a.public_key, replica=replica, now=0.0) == "incomplete"
    assert h.wanted(refs, lambda o: True, 1.0) == []  # backing off
    replicas[(a.node_id, "ck/step-3/o")] = (5, bytes(32))
    assert h.wanted(refs, lambda o: o == a.node_id, 31.0) == [ref]
    assert h.offer(sc, body, ref=ref, origin_key=c.public_key, replica=replica, now=31.0) == "bad_signature"
    other = sign_checkpoint(a.sign, msgspec.structs.replace(body, seq=4))
    assert h.offer(other, msgspec.structs.replace(body, seq=4), ref=ref, origin_key=a.public_key, replica=replica,
                   now=31.0) == "malformed"  # not what the ref names
    assert h.offer(sc, body, ref=ref, origin_key=a.public_key, replica=replica, now=70.0) == "held"
    assert h.refs == [ref] and h.wanted(refs, lambda o: True, 100.0) == []
    replicas[(a.node_id, "ck/step-3/o")] = (6, bytes(32))  # replaced by another version: no longer held
    assert h.refresh(replica) == [sc.digest] and h.refs == []
    assert h.refused == {"incomplete": 1, "bad_signature": 1, "malformed": 1}


def _placed_trust(placed: dict[tuple[str, str], Identity], *members: Identity) -> CheckpointTrust:
    book = AssignmentBook()
    for (config, job_id), node in placed.items():
        book.record(config, job_id, node.node_id, "train")
    return CheckpointTrust(book, {m.node_id: m.public_key for m in members}.get)


def test_a_holder_keeps_the_newest_few_per_config() -> None:
    from p2pnode.synccore import CheckpointHolding
    from p2pnode.synccore._checkpoints import KEPT_PER_CONFIG

    a = Identity.generate()
    h = CheckpointHolding(_placed_trust({("c", "5-1"): a}, a))
    for seq in range(1, 8):
        body = CheckpointBody("c", "5-1", seq, a.node_id, "ck", f"s{seq}", (_file("", 1),))
        sc = sign_checkpoint(a.sign, body)
        assert h.offer(sc, body, ref=None, origin_key=a.public_key, replica=lambda o, p: (1, ROOT), now=0.0) == "held"
    assert KEPT_PER_CONFIG == 3  # the default guard.checkpoint_keep: listed checkpoints are ones the disk keeps
    assert [r.seq for r in h.refs] == [7, 6, 5]


def test_a_member_never_placed_evicts_no_honest_checkpoint_from_a_holder() -> None:
    """Review H4: bodies a member signs for configs it was never placed on (job ids like ``999999-n``, claimed
    newest) are refused before they are ranked; honest ones stay held. A trusted origin fills at most its quota."""
    from p2pnode.snapshot import MAX_CHECKPOINT_REFS
    from p2pnode.synccore import CheckpointHolding
    from p2pnode.synccore._ckholding import MAX_HELD_PER_ORIGIN

    honest, hostile, busy = (Identity.generate() for _ in range(3))
    configs = [f"cfg{i}" for i in range(8)]
    placed = {(c, "12-3"): honest for c in configs} | {(f"b{i}", "12-4"): busy for i in range(40)}
    h = CheckpointHolding(_placed_trust(placed, honest, hostile, busy))
    every = lambda origin, path: (1000, ROOT)  # noqa: E731 - every file is a replica here
    for c in configs:
        b = CheckpointBody(c, "12-3", 40, honest.node_id, f"ck/{c}", "step-40.pt", (_file(),))
        sc = sign_checkpoint(honest.sign, b)
        assert h.offer(sc, b, ref=CheckpointRef(c, "12-3", 40, honest.node_id, sc.digest), replica=every,
                       now=0.0) == "held"
    for i in range(MAX_CHECKPOINT_REFS):
        c = configs[i % len(configs)]
        b = CheckpointBody(c, f"999999-{i + 1}", 1, hostile.node_id, "junk", f"x{i}", (_file(),))
        sc = sign_checkpoint(hostile.sign, b)
        assert h.offer(sc, b, ref=CheckpointRef(c, b.job_id, 1, hostile.node_id, sc.digest), replica=every,
                       now=0.0) == "unknown_placement"
    assert sum(1 for _, b in h.held.values() if b.origin == honest.node_id) == len(configs)
    assert h.refused["unknown_placement"] == MAX_CHECKPOINT_REFS
    # a trusted trainer of many configs takes no more than its quota, and evicts no config's only checkpoint
    for i in range(40):
        b = CheckpointBody(f"b{i}", "12-4", 1, busy.node_id, f"ck/b{i}", "s1", (_file(),))
        h.offer(sign_checkpoint(busy.sign, b), b, ref=None, replica=every, now=0.0)
    assert sum(1 for _, b in h.held.values() if b.origin == busy.node_id) == MAX_HELD_PER_ORIGIN
    assert sum(1 for _, b in h.held.values() if b.origin == honest.node_id) == len(configs)


def test_a_placed_origin_minting_checkpoints_holds_no_more_memory_in_a_nodes_trust() -> None:
    """Review M4: accepted bodies and conflicts are kept per config to the newest few (and the floor's)."""
    from p2pnode.synccore._checkpoints import KEPT_ACCEPTED_PER_CONFIG, MAX_CONFLICTS_PER_CONFIG

    a = Identity.generate()
    trust = _placed_trust({("c", "7-1"): a, ("d", "7-2"): a}, a)
    trust.floors["c"] = (7, 1, 3)
    for seq in range(3, 101):
        body = CheckpointBody("c", "7-1", seq, a.node_id, "ck", f"s{seq}", (_file(),))
        assert trust.accept(sign_checkpoint(a.sign, body), body)
    body = CheckpointBody("d", "7-2", 1, a.node_id, "ck", "s1", (_file(),))
    assert trust.accept(sign_checkpoint(a.sign, body), body)
    kept = sorted(b.seq for b in trust.accepted.values() if b.config == "c")
    assert kept == [3, *range(101 - KEPT_ACCEPTED_PER_CONFIG, 101)]  # the floor's, and the newest
    assert len(trust._by_key) == len(trust.accepted) == KEPT_ACCEPTED_PER_CONFIG + 2
    # two bodies signed for each of many keys: the conflicts kept are bounded too
    for seq in range(101, 101 + 2 * MAX_CONFLICTS_PER_CONFIG):
        for name in ("x", "y"):
            body = CheckpointBody("c", "7-1", seq, a.node_id, "ck", f"{name}{seq}", (_file(),))
            try:
                trust.accept(sign_checkpoint(a.sign, body), body)
            except CheckpointRefused:
                pass
    assert 0 < len(trust.conflicts) <= MAX_CONFLICTS_PER_CONFIG
    assert sum(1 for b in trust.accepted.values() if b.config == "c") <= KEPT_ACCEPTED_PER_CONFIG + 1


def test_a_directory_without_its_marker_is_never_announced_however_long_it_settles() -> None:
    """Review M5: a sharded save that pauses between files must not be announced with its first files only."""
    d = CheckpointDetector(settle_s=2.0)
    shard1 = ("config.json", 500, 1)
    assert d.observe([DirEntry("step-100", (shard1,), is_dir=True)], 0.0) == []
    assert d.observe([DirEntry("step-100", (shard1,), is_dir=True)], 500.0) == []
    assert d.next_deadline() is None  # nothing waits to settle
    whole = (shard1, ("model-00001.safetensors", 5 << 30, 2))
    (done,) = d.observe([DirEntry("step-100", whole, is_dir=True, marker=True)], 501.0)
    assert done.files == (("config.json", 500), ("model-00001.safetensors", 5 << 30))
