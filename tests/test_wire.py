"""Envelopes and gossip messages: every bad input is a RejectedMessage with its reason, nothing leaks. Snapshots
are schema 2 (typed sections); a schema-1 snapshot is refused as ``bad_schema``."""


import msgpack
import msgspec
import pytest
from helpers import envelope, snapshot

from p2pnode.errors import RejectedMessage, RejectReason
from p2pnode.identity import Identity
from p2pnode.snapshot import SCHEMA_VERSION, MembershipSection, Resources, Snapshot, VoteWire
from p2pnode.wire import WireLimits, decode_gossip, encode_gossip, open_envelope, seal_snapshot


@pytest.fixture
def ident():
    return Identity.generate()


def reason_of(fn, *args, **kw):
    with pytest.raises(RejectedMessage) as info:
        fn(*args, **kw)
    return info.value.reason


def test_roundtrip(ident):
    env = envelope(ident, 7, membership={"incarnation": 3, "suspects": {"x": 2}})
    snap = open_envelope(env)
    assert isinstance(snap, Snapshot) and snap.origin == ident.node_id and snap.version == 7
    assert snap.membership == MembershipSection(incarnation=3, suspects={"x": 2}) and snap.vote is None
    msg = decode_gossip(encode_gossip(ident.node_id, "1.2.3.4:8770", {"x": 3}, [env]))
    assert msg.sender == ident.node_id and msg.digest == {"x": 3} and msg.envelopes == [env]


def test_flipped_body_byte_is_bad_signature(ident):
    env = envelope(ident, 1)
    body = bytearray(env.body)
    body[len(body) // 2] ^= 0x01
    assert reason_of(open_envelope, msgspec.structs.replace(env, body=bytes(body))) is RejectReason.BAD_SIGNATURE


def test_flipped_signature_byte_is_bad_signature(ident):
    env = envelope(ident, 1)
    sig = bytearray(env.sig)
    sig[0] ^= 0x80
    assert reason_of(open_envelope, msgspec.structs.replace(env, sig=bytes(sig))) is RejectReason.BAD_SIGNATURE


def test_wrong_key_is_rejected(ident):
    other = Identity.generate()
    env = envelope(ident, 1)
    # Someone else's key presented for our origin: the key does not derive the origin id.
    assert reason_of(open_envelope, msgspec.structs.replace(env, key=other.public_key)) is RejectReason.WRONG_KEY
    # A snapshot signed by `other` that claims to be ident's: the origin cannot match other's key.
    forged_body = msgpack.packb(snapshot(ident, 2), use_bin_type=True)
    forged = msgspec.structs.replace(env, version=2, key=other.public_key, body=forged_body,
                                     sig=other.sign(forged_body))
    assert reason_of(open_envelope, forged) is RejectReason.WRONG_KEY


def test_a_typed_snapshot_seals_as_its_plain_map(ident):
    typed = Snapshot(schema=SCHEMA_VERSION, origin=ident.node_id, version=4, addr="10.0.0.1:8770", tags=["voter"],
                     leaving=False,
                     resources=Resources(cpu_percent=1.0), vote=VoteWire(candidate=ident.node_id, term=2))
    env = seal_snapshot(ident, typed)
    assert env.version == 4 and open_envelope(env) == typed
    assert open_envelope(seal_snapshot(ident, snapshot(ident, 4, addr="10.0.0.1:8770", tags=["voter"],
                                                       vote={"candidate": ident.node_id, "term": 2}))) == typed


def test_outer_version_must_match_signed_version(ident):
    env = envelope(ident, 3)
    assert reason_of(open_envelope, msgspec.structs.replace(env, version=4)) is RejectReason.MISMATCH


def test_oversized_snapshot(ident):
    env = envelope(ident, 1, blob="x" * 5000)
    assert reason_of(open_envelope, env, limits=WireLimits(max_snapshot_bytes=4096)) is RejectReason.OVERSIZED


@pytest.mark.parametrize("schema", [99, 1, 0, 2, 4])
def test_unknown_snapshot_schema(ident, schema):
    env = seal_snapshot(ident, snapshot(ident, 1, schema=schema))
    assert reason_of(open_envelope, env) is RejectReason.BAD_SCHEMA


def test_a_schema_1_snapshot_without_its_jobs_is_bad_schema(ident):
    """The flat fields of schema 1 at the top of a schema-1 snapshot: refused for its schema."""
    flat = snapshot(ident, 1, schema=1, incarnation=3, suspects={"x": 1}, refused=[], offer=2, catalog_digest="d",
                    signals={"x_2p": {"at": 1e9, "quality": 0.5}}, plan={"term": 1, "seq": 1, "jobs": []})
    assert reason_of(open_envelope, seal_snapshot(ident, flat)) is RejectReason.BAD_SCHEMA


def test_a_schema_1_snapshot_of_an_old_agent_is_bad_schema(ident):
    """What a 0.1 agent publishes (its jobs as a list): refused for its schema, not for a field's type."""
    flat = snapshot(ident, 1, schema=1, incarnation=3, suspects={}, refused=[], offer=0, signals={},
                    jobs=[{"job_id": "j", "template": "t", "gpus": [0], "term": 1}])
    assert reason_of(open_envelope, seal_snapshot(ident, flat)) is RejectReason.BAD_SCHEMA


def test_schema_1_fields_in_a_schema_2_snapshot_are_dropped(ident):
    """The flat fields of schema 1 are unknown at the top of schema 2 (a newer agent may add fields): dropped,
    never read as the sections they moved into."""
    snap = open_envelope(seal_snapshot(ident, snapshot(ident, 1, incarnation=2**63 - 1, suspects={"x": -1},
                                                       refused="no", offer=10**12, catalog_digest=b"\xff",
                                                       signals={"x_2p": {"at": float("nan")}})))
    assert snap.membership == MembershipSection() and snap.jobs.offer == 0 and snap.jobs.signals == {}


@pytest.mark.parametrize(
    "field, value",
    [("version", "7"), ("tags", "gpu"), ("resources", []), ("leaving", 1), ("addr", 5),
     # schema 1's shapes where a schema-2 section belongs
     ("jobs", []), ("membership", 3), ("vote", "x"), ("plan", []), ("sync", []), ("guard", 1), ("events", {})],
)
def test_wrong_types_in_signed_snapshot(ident, field, value):
    snap = snapshot(ident, 1)
    snap[field] = value
    body = msgpack.packb(snap, use_bin_type=True)
    env = envelope(ident, 1)
    env = msgspec.structs.replace(env, body=body, sig=ident.sign(body))
    assert reason_of(open_envelope, env) is RejectReason.BAD_TYPE


def test_signed_garbage_body_is_malformed(ident):
    body = b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    env = msgspec.structs.replace(envelope(ident, 1), body=body, sig=ident.sign(body))
    assert reason_of(open_envelope, env) is RejectReason.MALFORMED


def test_token_mode_requires_endorsement(ident):
    assert reason_of(open_envelope, envelope(ident, 1), token="s3cret") is RejectReason.UNENDORSED
    assert reason_of(open_envelope, envelope(ident, 1, token="other"), token="s3cret") is RejectReason.UNENDORSED
    assert open_envelope(envelope(ident, 1, token="s3cret"), token="s3cret").version == 1


def test_message_malformed_and_oversized():
    assert reason_of(decode_gossip, b"\x93\x01") is RejectReason.MALFORMED  # truncated array
    assert reason_of(decode_gossip, b"\xc1") is RejectReason.MALFORMED
    limits = WireLimits(max_body_bytes=1024, max_snapshot_bytes=512)
    assert reason_of(decode_gossip, b"\x00" * 2048, limits) is RejectReason.OVERSIZED


@pytest.mark.parametrize(
    "msg, reason",
    [
        ([1, 2, 3], RejectReason.BAD_TYPE),
        ({"schema": 2, "from": "a"}, RejectReason.BAD_SCHEMA),
        ({"schema": 1}, RejectReason.BAD_TYPE),
        ({"schema": 1, "from": "a", "digest": {"x": "1"}}, RejectReason.BAD_TYPE),
        ({"schema": 1, "from": "a", "digest": {"x": -1}}, RejectReason.BAD_TYPE),
        ({"schema": 1, "from": "a", "envelopes": {"no": "list"}}, RejectReason.BAD_TYPE),
        ({"schema": 1, "from": "a", "addr": 12}, RejectReason.BAD_TYPE),
    ],
)
def test_message_wrong_types(msg, reason):
    assert reason_of(decode_gossip, msgpack.packb(msg)) is reason


def test_integer_map_keys_are_malformed_not_a_crash():
    data = msgpack.packb({"schema": 1, "from": "a", "digest": {1: 2}})
    assert reason_of(decode_gossip, data) is RejectReason.MALFORMED


def test_bad_envelope_does_not_spoil_the_batch(ident):
    good = envelope(ident, 1)
    raw = msgpack.packb(
        {
            "schema": 1,
            "from": "peer",
            "addr": "",
            "digest": {},
            "envelopes": [good.to_wire(), {"origin": "x", "version": "one"}, 17, {**good.to_wire(), "sig": b"short"}],
        },
        use_bin_type=True,
    )
    msg = decode_gossip(raw)
    assert msg.envelopes == [good]
    assert [b.reason for b in msg.bad_envelopes] == [RejectReason.BAD_TYPE] * 3
    assert msg.bad_envelopes[0].origin == "x"


def test_seal_refuses_foreign_origin(ident):
    with pytest.raises(ValueError):
        seal_snapshot(ident, snapshot(Identity.generate(), 1))


def test_text_that_is_not_utf8_is_malformed_at_every_msgspec_decoder():
    """msgspec raises ``UnicodeDecodeError`` (neither of its own errors) for a string holding a lone surrogate's
    bytes; found by the route fuzzer of issue 22. Every decoder says ``malformed`` instead of leaking it."""
    from p2pnode.inputs import InputError, VotersBody, decode_json
    from p2pnode.snapshot import decode_snapshot

    bad = b"\xed\xa0\x80"
    gossip = encode_gossip("abcd", "", {}, []).replace(b"\xa4abcd", b"\xa4" + bad + b"a")
    body = msgpack.packb({"schema": 3, "origin": "a", "version": 1, "addr": "", "tags": [], "leaving": False})
    for decode, data in ((lambda d: decode_gossip(d, WireLimits()), gossip),
                         (decode_snapshot, body.replace(b"\xa1a", b"\xa3" + bad))):
        with pytest.raises(RejectedMessage) as e:
            decode(data)
        assert e.value.reason.value == "malformed"
    with pytest.raises(InputError) as e:
        decode_json(b'{"node_id": "' + bad + b'", "action": "admit"}', VotersBody)
    assert e.value.reason == "malformed" and e.value.status == 400


DEEP = b"\x91" * 5_000 + b"\xc0"  # a msgpack value nested 5,000 lists deep (within the snapshot size limit)


def test_a_signed_snapshot_nesting_an_unknown_field_too_deep_is_malformed_not_a_crash(ident):
    """A member signs a body whose unknown field nests deeper than msgspec skips: msgspec raises RecursionError,
    which every decoder at the boundary turns into its malformed reason (it once escaped ``decode_snapshot``)."""
    from p2pnode.inputs import InputError, decode_json, decode_msgpack
    from p2pnode.node._plandist import open_running
    from p2pnode.snapshot import decode_snapshot

    env = envelope(ident, 7)
    n = len(msgpack.unpackb(env.body))
    head = 1 if env.body[0] >> 4 == 0x8 else 3  # fixmap or map16: the entries follow the header
    more = bytes([0x80 | n + 1]) if n + 1 < 16 else b"\xde" + (n + 1).to_bytes(2, "big")
    body = more + env.body[head:] + b"\xa3zzz" + DEEP  # one more key, whose value nests deep
    assert reason_of(decode_snapshot, body) is RejectReason.MALFORMED
    signed = msgspec.structs.replace(env, body=body, sig=ident.sign(body))
    assert reason_of(open_envelope, signed) is RejectReason.MALFORMED
    with pytest.raises(InputError) as e:
        decode_json(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", dict)
    assert e.value.reason == "malformed"
    with pytest.raises(InputError):
        decode_msgpack(DEEP, dict)
    with pytest.raises(RejectedMessage):
        open_running(DEEP, "digest")
    with pytest.raises(RejectedMessage):
        decode_gossip(b"\x81\xa3zzz" + DEEP)
