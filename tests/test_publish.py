"""Sealing this node's own snapshot within its bounds, and what the agent counts and logs about it."""

import logging

import msgspec
from helpers import envelope, typed

from p2pnode.identity import Identity
from p2pnode.node._publish import PublishStats, seal_within_bounds
from p2pnode.wire import seal_snapshot


def test_a_snapshot_too_big_goes_out_without_its_plan_and_one_too_big_even_so_not_at_all(caplog):
    caplog.set_level(logging.WARNING, logger="p2pnode")
    ident = Identity.generate()
    snap = typed(envelope(ident, 3, plan={"term": 2, "seq": 5, "digest": "d" * 16, "jobs": 10}))
    full = len(seal_snapshot(ident, snap, token=None).body)
    bare = len(seal_snapshot(ident, msgspec.structs.replace(snap, plan=None), token=None).body)
    assert bare < full
    stats = PublishStats()

    def publish(limit):
        return stats.record(seal_within_bounds(ident, snap, token=None, max_snapshot_bytes=limit), limit)

    for _ in range(2):
        sealed = publish(full - 1)
        assert sealed.plan_omitted and sealed.snapshot.plan is None and len(sealed.envelope.body) == bare
    assert stats.plans_omitted == 2 and caplog.text.count("without the plan until the plan fits") == 1  # once
    sealed = publish(full)
    assert not sealed.plan_omitted and sealed.snapshot.plan == snap.plan
    assert "the plan fits in the snapshot again" in caplog.text
    assert publish(bare - 1) is None  # even without the plan: not published, counted, logged
    assert stats.unpublishable == 1 and "not published" in caplog.text
    assert stats.max_published_bytes == full and stats.plans_omitted == 2


def test_a_section_that_fails_its_decoder_is_left_out_and_the_heartbeat_goes_out(caplog):
    """Finding 2 of issue 22: a one-off run whose tag holds a newline made the node's own snapshot fail every
    decoder, so it stopped heartbeating. Now only the broken section is left out; membership and vote go out."""
    from p2pnode.snapshot import MembershipSection, OperatorSection, RunRequest, VoteWire, decode_snapshot

    caplog.set_level(logging.WARNING, logger="p2pnode")
    ident = Identity.generate()
    good = typed(envelope(ident, 7))
    bad_run = msgspec.structs.replace(RunRequest(id="a-1", template="t"), tag="x\ny")  # replace() skips validation
    snap = msgspec.structs.replace(good, operator=OperatorSection(cordoned=True, runs=[bad_run]),
                                   membership=MembershipSection(incarnation=3, suspects={"b" * 8: 2}),
                                   vote=VoteWire(candidate="c" * 8, term=4))
    stats = PublishStats()
    for _ in range(3):
        sealed = stats.record(seal_within_bounds(ident, snap, token=None, max_snapshot_bytes=1 << 20), 1 << 20)
        assert sealed is not None and sealed.left_out == ("operator",)
        back = decode_snapshot(sealed.envelope.body)  # what every peer decodes
        assert back.operator == OperatorSection() and back.membership == snap.membership and back.vote == snap.vote
        assert back.resources == snap.resources and back.version == snap.version
    assert stats.sections_left_out == {"operator": 3}
    assert caplog.text.count("published without operator") == 1  # logged once per change
    sealed = stats.record(seal_within_bounds(ident, good, token=None, max_snapshot_bytes=1 << 20), 1 << 20)
    assert sealed.left_out == () and "decodes whole again" in caplog.text
