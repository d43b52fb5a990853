"""Hostile input on sync's wire (issue 23): every reply a peer sends to sync, and the headers of what it pushes.

Each reply (push reply, data-channel frame, receipt list, listing) has one decoder in ``p2pnode.inputs``: garbage
raises :class:`SyncReplyRejected` with a reason (never another exception); a request header (push, block stream)
has one in ``p2pnode.sync._wire``: garbage is a ``SyncReject``. End to end, in process: a target that answers
garbage is a counted peer error (``/sync/status``, ``rejected_total`` for ``/metrics``) and the sender carries on,
its file replicated once the target answers sanely (or over HTTP when only its data channel talks garbage).
"""

import math
import os

import httpx
import msgpack
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sync_inprocess import Router, link, make_node, write

import p2pnode.sync._push as push_module
from p2pnode.errors import PeerError, SyncRejected, SyncReplyRejected
from p2pnode.identity import Identity
from p2pnode.inputs import (
    MAX_PUSH_RESULTS,
    MAX_REJECTED_BLOCKS,
    MAX_SYNC_REPLY_BYTES,
    check_push_results,
    decode_channel_frame,
    decode_listing,
    decode_push_reply,
    decode_receipts,
)
from p2pnode.sync import PushItem, SyncReject
from p2pnode.sync._refuse import REJECT_REASONS
from p2pnode.sync._wire import decode_push, decode_stream_header, encode_push, encode_stream_header
from p2pnode.synccore import Manifest, hash_block

NAN = math.nan
ROOT = bytes(range(32))
RESULT = {"path": "cfg/a.npz", "status": "need", "need": [0, 2], "rejected_blocks": [{"reason": "bad_block_hash",
          "detail": "block 1"}], "rejected_count": 1}


def pack(obj, **kw) -> bytes:
    return msgpack.packb(obj, use_bin_type=True, **kw)


def result(**change):
    r = {**RESULT, **change}
    return {k: v for k, v in r.items() if v is not ...}  # ``...`` drops a field


DEEP = b"\x91" * 100_000 + b"\xc0"  # an array nested 100,000 deep: msgspec skips an unknown field by recursing


def non_utf8_path() -> bytes:
    """A result whose path is a msgpack str holding bytes that are not UTF-8 (packed as raw, the old str type)."""
    return msgpack.packb({"files": [{"path": b"cfg/\xff\xfe.npz", "status": "have"}]}, use_bin_type=False)


def rejected(decoder, body) -> str:
    with pytest.raises(SyncReplyRejected) as exc:
        decoder(body)
    assert isinstance(exc.value, PeerError) and isinstance(exc.value, SyncRejected)
    assert exc.value.reason in REJECT_REASONS  # a label /metrics shows
    return exc.value.reason


# -- the push reply -------------------------------------------------------------------------------------------------
PUSH_REPLIES = [
    ("empty", b"", "reply_malformed"),
    ("not msgpack", b"\xc1garbage", "reply_malformed"),
    ("truncated", pack({"files": [RESULT]})[:-3], "reply_malformed"),
    ("trailing bytes", pack({"files": [RESULT]}) + b"\x00", "reply_malformed"),
    ("path not UTF-8", non_utf8_path(), "reply_malformed"),
    ("an unknown field nested too deep", b"\x82\xa5files\x90\xa1x" + DEEP, "reply_malformed"),
    ("not a map", pack([RESULT]), "reply_invalid"),
    ("no files", pack({}), "reply_invalid"),
    ("files not a list", pack({"files": {"a": 1}}), "reply_invalid"),
    ("a result not a map", pack({"files": [7]}), "reply_invalid"),
    ("missing path", pack({"files": [result(path=...)]}), "reply_invalid"),
    ("missing status", pack({"files": [result(status=...)]}), "reply_invalid"),
    ("unknown status", pack({"files": [result(status="deleted")]}), "reply_invalid"),
    ("status as bytes", pack({"files": [result(status=b"need")]}), "reply_invalid"),
    ("path as int", pack({"files": [result(path=7)]}), "reply_invalid"),
    ("path with a newline", pack({"files": [result(path="cfg/a\nFAKE LOG LINE")]}), "reply_invalid"),
    ("path with DEL", pack({"files": [result(path="cfg/\x7f")]}), "reply_invalid"),
    ("path too long", pack({"files": [result(path="a" * 1025)]}), "reply_invalid"),
    ("need as text", pack({"files": [result(need=["1"])]}), "reply_invalid"),
    ("need, a non-ASCII digit", pack({"files": [result(need=["٣"])]}), "reply_invalid"),
    ("need, a superscript digit", pack({"files": [result(need=["²"])]}), "reply_invalid"),
    ("need as float", pack({"files": [result(need=[1.0])]}), "reply_invalid"),
    ("need NaN", pack({"files": [result(need=[NAN])]}), "reply_invalid"),
    ("need infinite", pack({"files": [result(need=[math.inf])]}), "reply_invalid"),
    ("need bool", pack({"files": [result(need=[True])]}), "reply_invalid"),
    ("need negative", pack({"files": [result(need=[-1])]}), "reply_invalid"),
    ("need 2^63", pack({"files": [result(need=[2**63])]}), "reply_invalid"),
    ("need 2^64-1", pack({"files": [result(need=[2**64 - 1])]}), "reply_invalid"),
    ("need not a list", pack({"files": [result(need=5)]}), "reply_invalid"),
    ("rejected_count huge", pack({"files": [result(rejected_count=2**40)]}), "reply_invalid"),
    ("rejected_count NaN", pack({"files": [result(rejected_count=NAN)]}), "reply_invalid"),
    ("rejected_count text", pack({"files": [result(rejected_count="9" * 4300)]}), "reply_invalid"),
    ("a block refusal without reason", pack({"files": [result(rejected_blocks=[{"detail": "x"}])]}),
     "reply_invalid"),
    ("a reason that is no label", pack({"files": [result(status="rejected", reason="Bad\nReason")]}),
     "reply_invalid"),
    ("a reason too long", pack({"files": [result(status="rejected", reason="a" * 65)]}), "reply_invalid"),
    ("rejected without a reason", pack({"files": [result(status="rejected")]}), "reply_invalid"),
    ("detail with an escape sequence", pack({"files": [result(status="rejected", reason="busy",
                                                               detail="\x1b[2Jowned")]}), "reply_invalid"),
    ("too many results", pack({"files": [result()] * (MAX_PUSH_RESULTS + 1)}), "reply_invalid"),
    ("too many block refusals", pack({"files": [result(rejected_blocks=[{"reason": "bad_block_hash"}] *
                                                       (MAX_REJECTED_BLOCKS + 1))]}), "reply_invalid"),
]


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in PUSH_REPLIES], ids=[c[0] for c in PUSH_REPLIES])
def test_a_hostile_push_reply_is_refused_with_its_reason(body, reason):
    assert rejected(decode_push_reply, body) == reason


def test_an_honest_push_reply_decodes_and_unknown_fields_are_ignored():
    (r,) = decode_push_reply(pack({"files": [result(new_field_of_a_newer_peer=[1, 2])]}))
    assert (r.path, r.status, r.need, r.rejected_count) == ("cfg/a.npz", "need", [0, 2], 1)
    assert [(b.reason, b.detail) for b in r.rejected_blocks] == [("bad_block_hash", "block 1")]
    (r,) = decode_push_reply(pack({"files": [{"path": "", "status": "rejected", "reason": "not_member"}]}))
    assert (r.path, r.reason, r.need, r.detail, r.rejected_count) == ("", "not_member", [], "", None)
    assert decode_push_reply(pack({"files": []})) == []


def test_results_are_checked_against_what_was_offered():
    offered = {"cfg/a.npz": 3}
    ok = decode_push_reply(pack({"files": [result(need=[0, 2]), {"path": "", "status": "rejected", "reason": "busy"}]}))
    assert check_push_results(ok, offered) == ok
    for bad in ([result(need=[3])], [result(path="cfg/b.npz")], [result(status="have", need=[99])]):
        with pytest.raises(SyncReplyRejected) as exc:
            check_push_results(decode_push_reply(pack({"files": bad})), offered)
        assert exc.value.reason == "reply_invalid"


def test_a_push_reply_beyond_its_byte_bound_is_oversized_before_it_is_parsed():
    assert rejected(decode_push_reply, bytes(MAX_SYNC_REPLY_BYTES + 1)) == "reply_oversized"


# -- data-channel frames ----------------------------------------------------------------------------------------------
FRAMES = [
    ("not msgpack", b"\xc1", "reply_malformed"),
    ("an unknown field nested too deep", b"\x81\xa1x" + DEEP, "reply_malformed"),
    ("not a map", pack([True]), "reply_invalid"),
    ("ok as text", pack({"ok": "yes"}), "reply_invalid"),
    ("ok as int", pack({"ok": 1}), "reply_invalid"),
    ("status out of range", pack({"ok": False, "status": 9999}), "reply_invalid"),
    ("status NaN", pack({"status": NAN, "files": []}), "reply_invalid"),
    ("status as text", pack({"status": "200", "files": []}), "reply_invalid"),
    ("files of garbage", pack({"status": 200, "files": [None]}), "reply_invalid"),
    ("a result with a bad need", pack({"status": 200, "files": [result(need=[-5])]}), "reply_invalid"),
    ("path not UTF-8", b"\x82\xa6status\xcc\xc8\xa5files\x91\x82\xa4path\xa2\xff\xfe\xa6status\xa4have",
     "reply_malformed"),
]


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in FRAMES], ids=[c[0] for c in FRAMES])
def test_a_hostile_data_channel_frame_is_refused_with_its_reason(body, reason):
    assert rejected(decode_channel_frame, body) == reason


def test_the_frames_a_receiver_sends_decode():
    assert decode_channel_frame(pack({"ok": True})).ok is True
    refusal = decode_channel_frame(pack({"ok": False, "status": 503, "files": [
        {"path": "", "status": "rejected", "reason": "busy", "detail": "16 streams under way"}]}))
    assert (refusal.ok, refusal.status, refusal.files[0].reason) == (False, 503, "busy")
    final = decode_channel_frame(pack({"status": 200, "files": [{"path": "a", "status": "committed", "need": []}]}))
    assert final.ok is None and final.files[0].status == "committed"


# -- receipt lists and listings -----------------------------------------------------------------------------------
RECEIPTS = [
    ("not msgpack", b"\xc1", "reply_malformed"),
    ("path not UTF-8", b"\x91\x93\xa2\xff\xfe\x05\xc4\x20" + ROOT, "reply_malformed"),
    ("not a list", pack({"a": 1}), "reply_invalid"),
    ("an entry of two", pack([["a", 5]]), "reply_invalid"),
    ("an entry of four", pack([["a", 5, ROOT, 1]]), "reply_invalid"),
    ("size as text", pack([["a", "5", ROOT]]), "reply_invalid"),
    ("size, a non-ASCII digit", pack([["a", "٥", ROOT]]), "reply_invalid"),
    ("size negative", pack([["a", -1, ROOT]]), "reply_invalid"),
    ("size 2^63", pack([["a", 2**63, ROOT]]), "reply_invalid"),
    ("size NaN", pack([["a", NAN, ROOT]]), "reply_invalid"),
    ("size bool", pack([["a", False, ROOT]]), "reply_invalid"),
    ("root of 31 bytes", pack([["a", 5, ROOT[:31]]]), "reply_invalid"),
    ("root as text", pack([["a", 5, ROOT.hex()]]), "reply_invalid"),
    ("path with a control character", pack([["a\x00b", 5, ROOT]]), "reply_invalid"),
]


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in RECEIPTS], ids=[c[0] for c in RECEIPTS])
def test_a_hostile_receipt_list_is_refused_with_its_reason(body, reason):
    assert rejected(decode_receipts, body) == reason


def test_an_honest_receipt_list_decodes():
    assert decode_receipts(pack([["cfg/a.npz", 5, ROOT]])) == [("cfg/a.npz", 5, ROOT)]


HEX = ROOT.hex()
LISTINGS = [
    ("not JSON", b"{files: []}", "reply_malformed"),
    ("a NaN token", b'{"files": [], "n": NaN}', "reply_malformed"),
    ("an unknown field nested too deep", b'{"files": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "reply_malformed"),
    ("path not UTF-8", b'{"files": [{"path": "\xff\xfe", "root": "' + HEX.encode() + b'"}]}', "reply_malformed"),
    ("no files", b"{}", "reply_invalid"),
    ("files not a list", b'{"files": 5}', "reply_invalid"),
    ("root upper-case", b'{"files": [{"path": "a", "root": "' + HEX.upper().encode() + b'"}]}', "reply_invalid"),
    ("root of non-ASCII digits", ('{"files": [{"path": "a", "root": "' + "٣" * 64 + '"}]}').encode(),
     "reply_invalid"),
    ("root short", b'{"files": [{"path": "a", "root": "abcd"}]}', "reply_invalid"),
    ("root as a number", b'{"files": [{"path": "a", "root": 1e400}]}', "reply_invalid"),
    ("path with a control character", b'{"files": [{"path": "a\\u0007", "root": "' + HEX.encode() + b'"}]}',
     "reply_invalid"),
    ("path missing", b'{"files": [{"root": "' + HEX.encode() + b'"}]}', "reply_invalid"),
]


@pytest.mark.parametrize(("body", "reason"), [c[1:] for c in LISTINGS], ids=[c[0] for c in LISTINGS])
def test_a_hostile_listing_is_refused_with_its_reason(body, reason):
    assert rejected(decode_listing, body) == reason


def test_an_honest_listing_decodes_ignoring_the_fields_retention_does_not_read():
    body = b'{"files": [{"path": "cfg/a.npz", "root": "' + HEX.encode() + b'", "size": 5, "seq": 9}], "node": "x"}'
    assert decode_listing(body) == {"cfg/a.npz": ROOT}


# -- any bytes, any msgpack value: a value or SyncReplyRejected, nothing else ---------------------------------------
_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.floats()
            | st.text(max_size=8) | st.binary(max_size=8)
            | st.sampled_from(["cfg/a.npz", "", "have", "need", "committed", "rejected", "busy", "files", "path",
                               "status", "ok", "reason"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.sampled_from(["files", "path", "status", "need", "reason", "detail",
                                                          "ok", "rejected_blocks", "rejected_count", "root"]),
                                         inner, max_size=6), max_leaves=24)
DECODERS = [decode_push_reply, decode_channel_frame, decode_receipts, decode_listing]


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=256) | _values.map(lambda v: pack(v)))
def test_every_reply_decoder_answers_any_input_with_a_value_or_a_typed_refusal(body):
    for decode in DECODERS:
        try:
            decode(body)
        except SyncReplyRejected:
            pass


# -- request headers a peer pushes (the receiver's decoders in sync._wire) -----------------------------------------
def manifest_of(data: bytes, bs: int = 128 * 1024) -> Manifest:
    return Manifest.build(len(data), bs, b"".join(hash_block(data[i:i + bs]) for i in range(0, len(data), bs)))


DATA = os.urandom(300_000)
M = manifest_of(DATA)
FILE = {"path": "cfg/a.npz", "size": M.size, "block_size": M.block_size, "hashes": M.hashes, "root": M.root,
        "seq": 3, "cls": "sealed", "commit": True}


def push_body(**change) -> bytes:
    f = {k: v for k, v in {**FILE, "blocks": [[0, 10]], **change}.items() if v is not ...}
    header = pack({"files": [f]})
    return len(header).to_bytes(4, "big") + header + DATA[:10]


def test_the_push_body_on_the_wire_is_the_documented_msgpack_and_decodes_as_before():
    item = PushItem("cfg/a.npz", M, 3, [(0, DATA[:10])], True, "sealed")
    assert encode_push([item]) == push_body()  # the same bytes as ever (docs/protocol.md)
    (got,) = decode_push(push_body())
    assert (got.path, got.manifest, got.seq, got.cls, got.commit) == ("cfg/a.npz", M, 3, "sealed", True)
    assert [(i, bytes(d)) for i, d in got.blocks] == [(0, DATA[:10])]
    (old,) = decode_push(push_body(cls=..., commit=...))  # a sender that leaves the defaults out
    assert (old.cls, old.commit) == ("sealed", True)
    (odd,) = decode_push(push_body(path="cfg/\x01odd"))  # a path is the store's to refuse (path_escape), not here
    assert odd.path == "cfg/\x01odd"


HOSTILE_PUSH = [
    ("size negative", {"size": -1}), ("size 2^63", {"size": 2**63}), ("size bool", {"size": True}),
    ("size as text", {"size": "300000"}), ("size NaN", {"size": NAN}), ("block size 0", {"block_size": 0}),
    ("seq beyond the counters", {"seq": 2**60}), ("seq negative", {"seq": -3}), ("root short", {"root": ROOT[:5]}),
    ("hashes as text", {"hashes": "00"}), ("unknown class", {"cls": "zip"}), ("commit as int", {"commit": 1}),
    ("a block index negative", {"blocks": [[-1, 10]]}), ("a block index as text", {"blocks": [["0", 10]]}),
    ("a block length NaN", {"blocks": [[0, NAN]]}), ("a block of three", {"blocks": [[0, 10, 1]]}),
    ("path as bytes", {"path": b"cfg/a.npz"}), ("path beyond 4 KiB", {"path": "a" * 5000}), ("no root", {"root": ...}),
]


@pytest.mark.parametrize("change", [c[1] for c in HOSTILE_PUSH], ids=[c[0] for c in HOSTILE_PUSH])
def test_a_hostile_push_header_is_malformed(change):
    with pytest.raises(SyncReject) as exc:
        decode_push(push_body(**change))
    assert exc.value.reason == "malformed" and exc.value.status == 400


def test_a_push_header_whose_path_is_not_utf8_or_whose_files_overflow_is_malformed():
    header = msgpack.packb({"files": [{**FILE, "path": b"\xff\xfe"}]}, use_bin_type=False)
    many = pack({"files": [FILE] * 4097})
    deep = b"\x82\xa5files\x90\xa1x" + DEEP
    for body in (len(header).to_bytes(4, "big") + header, push_body()[:4] + bytes(8),
                 len(many).to_bytes(4, "big") + many, len(deep).to_bytes(4, "big") + deep):
        with pytest.raises(SyncReject) as exc:
            decode_push(body)
        assert exc.value.reason == "malformed"


def stream_header(me: Identity, **change) -> tuple[bytes, bytes]:
    raw = {"origin": me.node_id, "time": 1000.0, "file": FILE, "runs": [[0, 2]], **change}
    header = pack({k: v for k, v in raw.items() if v is not ...})
    return header, me.sign(b"p2pnode-sync-stream-v1\n" + header)


def test_a_hostile_stream_header_is_refused_before_or_after_its_signature():
    me = Identity.generate()
    keys = {me.node_id: me.public_key}

    def reason(**change) -> str:
        header, sig = stream_header(me, **change)
        with pytest.raises(SyncReject) as exc:
            decode_stream_header(header, sig, key_of=keys.get, now=1010.0, max_skew_s=300)
        return exc.value.reason

    header, sig = stream_header(me)
    origin, item, runs = decode_stream_header(header, sig, key_of=keys.get, now=1010.0, max_skew_s=300)
    assert (origin, item.manifest, runs) == (me.node_id, M, [(0, 2)])
    # the encoder writes the documented map, key for key: the same bytes on the wire as ever
    assert encode_stream_header(me, PushItem("cfg/a.npz", M, 3), [(0, 2)], now=1000.0)[8:-64] == header
    # before the signature: who and when
    for change in ({"time": NAN}, {"time": "1000"}, {"time": True}, {"time": 1e300}, {"time": ...},
                   {"origin": 7}, {"origin": ""}, {"origin": "x\ny"}, {"origin": "a" * 65}, {"origin": ...}):
        assert reason(**change) == "bad_signature", change
    # after it: what (a member's signed garbage)
    for change in ({"file": ...}, {"file": 5}, {"file": {**FILE, "size": 2**63}}, {"file": {**FILE, "seq": NAN}},
                   {"runs": ...}, {"runs": [[0, "2"]]}, {"runs": [[0, NAN]]}, {"runs": "all"}):
        assert reason(**change) == "malformed", change
    with pytest.raises(SyncReject) as exc:
        decode_stream_header(b"\x81\xa6origin" + DEEP, sig, key_of=keys.get, now=1010.0, max_skew_s=300)
    assert exc.value.reason == "malformed"
    assert reason(runs=[[1, 9]]) == "block_out_of_range"
    assert reason(runs=[[0, 0]]) == "block_out_of_range"


# -- end to end: a target answering garbage is a counted peer error; the sender carries on -------------------------
class GarbageRouter(Router):
    """Like Router, but answers ``replies[path]`` (a list of ``(status, body)``, used up one per request) in place of
    the node behind it: the push is never applied there."""

    def __init__(self, nodes, **replies):
        super().__init__(nodes)
        self.replies = {"/sync/" + k: list(v) for k, v in replies.items()}

    async def handle_async_request(self, request):
        queue = self.replies.get(request.url.path)
        if queue:
            await request.aread()
            status, body = queue.pop(0)
            return httpx.Response(status, content=body)
        return await super().handle_async_request(request)


async def run_pass(eph, router):
    async with httpx.AsyncClient(transport=router, base_url="http://x") as client:
        eph.ctx.client = client
        await eph.sync.pass_once()


GARBAGE = [
    ("not msgpack", 200, b"\xc1<html>502 Bad Gateway</html>", "reply_malformed"),
    ("not UTF-8", 200, non_utf8_path(), "reply_malformed"),
    ("wrong types", 200, pack({"files": [{"path": "cfg/a.npz", "status": "need", "need": ["0"]}]}), "reply_invalid"),
    ("NaN", 200, pack({"files": [{"path": "cfg/a.npz", "status": "need", "need": [NAN]}]}), "reply_invalid"),
    ("a block beyond the file", 200, pack({"files": [{"path": "cfg/a.npz", "status": "need", "need": [10**6]}]}),
     "reply_invalid"),
    ("files not offered", 200, pack({"files": [{"path": f"etc/{i}", "status": "have"} for i in range(100)]}),
     "reply_invalid"),  # one bad reply, counted once
    ("a refusal without a reason", 400, pack({"files": [{"path": "", "status": "rejected"}]}),
     "reply_invalid"),
    ("huge", 200, b"\x00" * 5000, "reply_oversized"),
]


@pytest.mark.parametrize(("status", "body", "reason"), [g[1:] for g in GARBAGE], ids=[g[0] for g in GARBAGE])
async def test_a_target_answering_garbage_is_a_counted_peer_error_and_the_sender_carries_on(
        tmp_path, monkeypatch, status, body, reason):
    monkeypatch.setattr(push_module, "MAX_SYNC_REPLY_BYTES", 4096)  # "huge" without 64 MiB of test traffic
    eph = make_node(tmp_path, "eph", "ephemeral")
    d = make_node(tmp_path, "d0", "durable")
    link(eph, d)
    link(d, eph)
    data = os.urandom(300_000)
    write(eph, "cfg/a.npz", data)
    await run_pass(eph, GarbageRouter([eph, d], push=[(status, body)]))  # no exception: the pass ran through
    view = eph.sync.status_view()
    assert eph.sync.rejected_total()[reason] == 1  # what /metrics reads: p2pnode_sync_rejected_total{reason}
    assert view["received"]["refused_requests"] == {reason: 1}  # /sync/status (and `p2pnode sync status`)
    assert view["sent"]["request_failures"] == 1 and view["files"][0]["replicas"] == 0
    assert sum(view["sent"]["rejected_by_targets"].values()) == 0  # garbage is not a target's refusal
    # the target answers sanely again: the next pass replicates the file
    await run_pass(eph, Router([eph, d]))
    link(eph, d)
    assert eph.sync.status_view()["files"][0]["replicas"] == 1
    assert (d.data_dir / "replicas" / eph.node_id / "cfg" / "a.npz").read_bytes() == data
    assert eph.sync.rejected_total()[reason] == 1 and eph.ctx.quarantined == []


async def test_a_refusal_reason_this_node_does_not_know_is_counted_as_other(tmp_path):
    eph = make_node(tmp_path, "eph", "ephemeral")
    d = make_node(tmp_path, "d0", "durable")
    link(eph, d)
    write(eph, "cfg/a.npz", os.urandom(1000))
    reply = pack({"files": [{"path": "cfg/a.npz", "status": "rejected", "reason": "quantum_flux", "detail": "?"}]})
    await run_pass(eph, GarbageRouter([eph, d], push=[(422, reply)]))
    assert eph.sync.push_rejected == {"other": 1} and not eph.sync.rejected  # a refusal, not a bad reply


async def test_a_garbage_receipt_list_is_counted_and_only_the_signed_receipts_count(tmp_path):
    eph = make_node(tmp_path, "eph", "ephemeral", max_receipts=2)
    d = make_node(tmp_path, "d0", "durable", max_receipts=2)
    link(eph, d)
    link(d, eph)
    for i in range(4):
        write(eph, f"cfg/s{i}.npz", os.urandom(5000 + i))
    await run_pass(eph, Router([eph, d]))
    assert d.sync.store.commits == 4
    link(eph, d)  # d's snapshot: two receipts and the digest of all four, so eph fetches the list next pass
    bad = pack([["cfg/s0.npz", "٥", ROOT]] * 3)
    await run_pass(eph, GarbageRouter([eph, d], receipts=[(200, bad)]))
    assert eph.sync.rejected["reply_invalid"] == 1
    assert eph.sync.status_view()["sent"]["receipt_fetch_failures"] == 1
    assert sum(f["replicas"] for f in eph.sync.status_view()["files"]) == 2  # the two in d's signed snapshot
    await run_pass(eph, Router([eph, d]))  # d answers sanely: the full list counts
    await run_pass(eph, Router([eph, d]))
    assert all(f["replicas"] == 1 for f in eph.sync.status_view()["files"])


async def test_a_garbage_listing_is_counted_and_retention_keeps_the_replicas(tmp_path):
    eph = make_node(tmp_path, "eph", "ephemeral")
    d = make_node(tmp_path, "d0", "durable")
    link(eph, d)
    link(d, eph)
    write(eph, "cfg/a.npz", os.urandom(5000))
    await run_pass(eph, Router([eph, d]))
    write(eph, "cfg/b.npz", os.urandom(5000))  # listed by eph, not held by d: d must fetch eph's listing
    await trio.to_thread.run_sync(eph.sync.source.scan, 1e12)
    link(d, eph)  # d learns eph's listing digest
    router = GarbageRouter([eph, d], manifest=[(200, b'{"files": [{"path": "cfg/a.npz", "root": NaN}]}')])
    async with httpx.AsyncClient(transport=router) as client:
        d.ctx.client = client
        plan = await d.sync.retention_pass()
    assert d.sync.rejected["reply_malformed"] == 1 and d.sync.retention_view()["fetch_failures"] == 1
    assert not plan.retire and len(d.sync.store.index) == 1


async def test_a_data_channel_answering_garbage_is_counted_and_the_file_goes_over_http(tmp_path):
    d = make_node(tmp_path, "d", "durable")
    e = make_node(tmp_path, "e", "ephemeral")
    d.addr = "127.0.0.1:1"  # the channel's host; HTTP goes through the router
    data = os.urandom(400_000)
    write(e, "cfg/big.npz", data)
    frames = []

    async def liar(stream):  # reads the signed header, answers a frame that is no frame
        async with stream:
            frames.append(await stream.receive_some(65536))
            body = pack({"ok": "sure", "files": [{"path": "cfg/big.npz", "status": "need", "need": [-1]}]})
            await stream.send_all(len(body).to_bytes(4, "big") + body)

    async with trio.open_nursery() as n:
        (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
        n.start_soon(trio.serve_listeners, liar, [listener])
        d.sync.data_port = listener.socket.getsockname()[1]  # advertised in d's snapshot
        link(e, d)
        link(d, e)
        router = Router([d, e])
        with trio.fail_after(20):
            for _ in range(4):
                await run_pass(e, router)
                link(e, d)
                if e.sync.status_view()["files"][0]["replicas"] == 1:
                    break
        n.cancel_scope.cancel()
    assert frames and frames[0].startswith(b"P2B1")
    sent = e.sync.status_view()["sent"]
    assert e.sync.rejected["reply_invalid"] == 1 and sent["channel_fallbacks"] == 1 and sent["streams"] == 0
    assert (d.data_dir / "replicas" / e.node_id / "cfg" / "big.npz").read_bytes() == data
