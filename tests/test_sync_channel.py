"""The sync data channel: stream framing and authentication (pure), the store's splice receive over real socket
pairs (corrupt blocks, truncated streams, commit checks), parallel hashing, and the service's channel end to end
(in-process nodes over a fake context, on loopback sockets: streams, fallback to HTTP, garbage connections, a block
corrupted in flight)."""

import os
import socket
import threading

import pytest
import trio

import p2pnode.synccore._manifest as manifest_mod
from p2pnode.identity import Identity
from p2pnode.sync import PushItem, ReplicaStore, SyncReject
from p2pnode.sync._channel import send_stream, split_host
from p2pnode.sync._wire import (
    MAX_STREAM_HEADER,
    SIGNATURE_BYTES,
    STREAM_PREFIX_BYTES,
    decode_stream_header,
    encode_stream_header,
    stream_header_length,
)
from p2pnode.synccore import Manifest, hash_block, hash_file

KiB = 1024


def manifest_of(data: bytes, bs: int) -> Manifest:
    return Manifest.build(len(data), bs, b"".join(hash_block(data[i:i + bs]) for i in range(0, len(data), bs)))


def split(frame: bytes) -> tuple[bytes, bytes]:
    n = stream_header_length(frame[:STREAM_PREFIX_BYTES])
    return frame[STREAM_PREFIX_BYTES:STREAM_PREFIX_BYTES + n], frame[STREAM_PREFIX_BYTES + n:]


# -- framing and authentication ---------------------------------------------------------------------------------

def test_stream_header_round_trip_and_every_refusal():
    me, other = Identity.generate(), Identity.generate()
    data = os.urandom(700 * KiB)
    m = manifest_of(data, 128 * KiB)
    item = PushItem("cfg/a.npz", m, 7, [], True, "sealed")
    frame = encode_stream_header(me, item, [(0, 2), (4, 2)], now=1000.0)
    header, sig = split(frame)
    assert len(sig) == SIGNATURE_BYTES
    keys = {me.node_id: me.public_key}
    origin, got, runs = decode_stream_header(header, sig, key_of=keys.get, now=1010.0, max_skew_s=300)
    assert origin == me.node_id and runs == [(0, 2), (4, 2)]
    assert (got.path, got.manifest, got.seq, got.cls, got.commit) == ("cfg/a.npz", m, 7, "sealed", True)

    def reason(header=header, sig=sig, keys=keys, now=1010.0):
        with pytest.raises(SyncReject) as exc:
            decode_stream_header(header, sig, key_of=keys.get, now=now, max_skew_s=300)
        return exc.value.reason

    assert reason(keys={}) == "not_member"
    assert reason(keys={me.node_id: other.public_key}) == "bad_signature"  # a key that did not sign it
    tampered = bytearray(header)
    tampered[-3] ^= 1
    assert reason(header=bytes(tampered)) in ("bad_signature", "malformed")
    assert reason(now=1000.0 + 301) == "bad_signature"  # outside the clock skew window (replay)
    assert reason(sig=sig[:10]) == "bad_signature"
    assert reason(header=b"\xc1garbage") == "malformed"
    for bad_runs in ([(0, 2), (1, 1)], [(5, 2)], [(3, 0)], [(-1, 1)]):  # overlapping, beyond the file, empty
        h, s = split(encode_stream_header(me, item, bad_runs, now=1000.0))
        assert reason(header=h, sig=s) in ("block_out_of_range", "malformed")
    with pytest.raises(SyncReject) as exc:
        stream_header_length(b"HTTP/1.1")
    assert exc.value.reason == "malformed"
    with pytest.raises(SyncReject) as exc:
        stream_header_length(b"P2B1" + (MAX_STREAM_HEADER + 1).to_bytes(4, "big"))
    assert exc.value.reason == "oversized" and exc.value.status == 413


def test_split_host_handles_ipv6():
    assert split_host("10.0.0.1:8770") == "10.0.0.1"
    assert split_host("[fd00::1]:8770") == "fd00::1"


@pytest.mark.parametrize("mapped", [False, True])
def test_parallel_hashing_equals_one_thread(tmp_path, monkeypatch, mapped):
    p = tmp_path / "f"
    data = os.urandom(3 * 2**20 + 12345)
    p.write_bytes(data)
    want = manifest_of(data, 128 * KiB)
    assert hash_file(p, block_size=128 * KiB, mapped=mapped) == want  # under the threshold: one thread
    monkeypatch.setattr(manifest_mod, "PARALLEL_HASH_BYTES", 256 * KiB)
    monkeypatch.setattr(manifest_mod, "HASH_WORKERS", 3)
    assert hash_file(p, block_size=128 * KiB, mapped=mapped) == want
    prefix = manifest_of(data[: 2 * 2**20 + 5], 128 * KiB)  # an append file: only the tail is read
    assert hash_file(p, block_size=128 * KiB, prefix=prefix, mapped=mapped) == want
    with pytest.raises(ValueError):
        hash_file(p, block_size=128 * KiB, size=len(data) + 1, mapped=mapped)


# -- the store's receive over a socket pair -------------------------------------------------------------------

def feed(sock: socket.socket, chunks: list[bytes], close: bool = True) -> threading.Thread:
    def run():
        for c in chunks:
            sock.sendall(c)
        if close:
            sock.shutdown(socket.SHUT_WR)

    th = threading.Thread(target=run)
    th.start()
    return th


def receive(store, origin, item, runs, payload: bytes, *, close=True, timeout_s=5.0):
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        t = store.open_stream(origin, item)
        th = feed(b, [payload[i:i + 300 * KiB] for i in range(0, len(payload), 300 * KiB)], close)
        try:
            bad = store.receive_stream(t, runs, a.fileno(), timeout_s=timeout_s)
        except BaseException:
            store.finish_stream(t, False, [])
            raise
        finally:
            th.join()
        return store.finish_stream(t, item.commit, bad)
    finally:
        a.close()
        b.close()


def test_streamed_blocks_are_verified_as_they_land_and_committed(tmp_path):
    store = ReplicaStore(tmp_path)
    bs = 128 * KiB
    data = os.urandom(10 * bs + 777)
    m = manifest_of(data, bs)
    item = PushItem("cfg/s.npz", m, 1)
    r = receive(store, "o1", item, [(0, m.blocks)], data)
    assert r == {"path": "cfg/s.npz", "status": "committed", "need": []}
    assert (tmp_path / "replicas" / "o1" / "cfg" / "s.npz").read_bytes() == data
    assert store.bytes_received == len(data) and store.commits == 1
    assert store.open_stream("o1", item) is None  # already this version


def test_a_corrupted_streamed_block_is_counted_kept_out_and_asked_again(tmp_path):
    store = ReplicaStore(tmp_path)
    bs = 128 * KiB
    data = os.urandom(6 * bs)
    m = manifest_of(data, bs)
    item = PushItem("cfg/c.npz", m, 1)
    bad = bytearray(data)
    bad[3 * bs + 99] ^= 0xFF
    r = receive(store, "o1", item, [(0, 6)], bytes(bad))
    assert r["status"] == "need" and r["need"] == [3] and r["http_status"] == 422
    assert r["rejected_blocks"][0]["reason"] == "bad_block_hash" and store.rejected["bad_block_hash"] == 1
    assert not (tmp_path / "replicas" / "o1" / "cfg" / "c.npz").exists()
    r = receive(store, "o1", item, [(3, 1)], data[3 * bs:4 * bs])
    assert r["status"] == "committed"
    assert (tmp_path / "replicas" / "o1" / "cfg" / "c.npz").read_bytes() == data


def test_a_stream_cut_mid_way_keeps_its_verified_blocks_and_a_silent_one_times_out(tmp_path):
    store = ReplicaStore(tmp_path)
    bs = 128 * KiB
    data = os.urandom(8 * bs)
    m = manifest_of(data, bs)
    item = PushItem("cfg/t.npz", m, 1)
    with pytest.raises(ConnectionError):
        receive(store, "o1", item, [(0, 8)], data[: 5 * bs + 1000])  # the sender died inside block 5
    assert not (tmp_path / "replicas" / "o1" / "cfg" / "t.npz").exists()
    # a restart finds blocks 0-4 on disk (hashed from the partial file) and needs only the rest
    store2 = ReplicaStore(tmp_path)
    r = store2.apply("o1", PushItem("cfg/t.npz", m, 1, []))
    assert r["need"] == [5, 6, 7]
    with pytest.raises(TimeoutError):
        receive(store2, "o1", item, [(5, 3)], data[5 * bs: 6 * bs], close=False, timeout_s=0.3)
    r = receive(store2, "o1", item, [(6, 2)], data[6 * bs:])
    assert r["status"] == "committed" and (tmp_path / "replicas" / "o1" / "cfg" / "t.npz").read_bytes() == data


def test_while_a_file_streams_other_writers_of_it_are_refused_and_other_files_go_on(tmp_path):
    store = ReplicaStore(tmp_path)
    bs = 128 * KiB
    data, other = os.urandom(3 * bs), os.urandom(bs)
    m, mo = manifest_of(data, bs), manifest_of(other, bs)
    t = store.open_stream("o1", PushItem("cfg/big.npz", m, 1))
    r = store.apply("o1", PushItem("cfg/big.npz", m, 1, [(0, data[:bs])]))
    assert r["status"] == "rejected" and r["reason"] == "busy" and r["http_status"] == 503
    with pytest.raises(SyncReject):
        store.open_stream("o1", PushItem("cfg/big.npz", m, 1))  # a second stream of the same file
    assert store.apply("o1", PushItem("cfg/small.npz", mo, 1, [(0, other)]))["status"] == "committed"
    assert store.finish_stream(t, True, [])["need"] == [0, 1, 2]
    assert store.apply("o1", PushItem("cfg/big.npz", m, 1, [(0, data[:bs])]))["status"] == "need"


def test_commit_re_reads_blocks_not_hashed_from_the_file(tmp_path):
    """Blocks pushed over HTTP are checked in memory before their write: the commit re-hashes them from the file,
    and a partial file changed behind the store's back is refused (corrupt_on_commit), never renamed in."""
    store = ReplicaStore(tmp_path)
    bs = 128 * KiB
    data = os.urandom(4 * bs)
    m = manifest_of(data, bs)
    blocks = [(i, data[i * bs:(i + 1) * bs]) for i in range(4)]
    r = store.apply("o1", PushItem("cfg/h.npz", m, 1, blocks[:3], commit=False))
    assert r["status"] == "need"
    part = next((tmp_path / ".sync" / "incoming" / "o1").glob("*.part"))
    with open(part, "r+b") as fh:  # damage a verified block on disk
        fh.seek(10)
        fh.write(b"\x00\x01\x02")
    r = store.apply("o1", PushItem("cfg/h.npz", m, 1, blocks[3:]))
    assert r["status"] == "rejected" and r["reason"] == "corrupt_on_commit"
    assert not (tmp_path / "replicas" / "o1" / "cfg" / "h.npz").exists()
    r = store.apply("o1", PushItem("cfg/h.npz", m, 1, []))
    assert r["need"] == [0]  # only the damaged block is asked for again
    assert store.apply("o1", PushItem("cfg/h.npz", m, 1, blocks[:1]))["status"] == "committed"


# -- the service's channel (in-process nodes, real loopback sockets) -------------------------------------------

from test_sync_inprocess import Router, link, make_node  # noqa: E402  (shared helpers)


def put(node, path: str, data: bytes) -> None:
    p = node.sync.root / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)


async def start_channel(d):
    async with trio.open_nursery() as n:
        await n.start(d.sync.inbound.serve_channel)
        n.cancel_scope.cancel()


def test_send_stream_to_a_closed_port_raises_connection_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        send_stream("127.0.0.1", port, b"", str(tmp_path / "x"), manifest_of(b"", 128 * KiB), [],
                    connect_timeout_s=1, timeout_s=1)


async def run_pair(tmp_path, *, corrupt: int = 0, dead_port: bool = False, garbage: bool = False,
                   die: bool = False):
    d = make_node(tmp_path, "d", "durable", data_port=0)
    e = make_node(tmp_path, "e", "ephemeral", data_port=0)
    d.addr = "127.0.0.1:1"  # the host part is what the channel uses; HTTP goes through the router below
    router = Router([d, e])
    e.ctx.client = __import__("httpx").AsyncClient(transport=router)
    data = os.urandom(3 * 2**20 + 5)
    put(e, "cfg/big.npz", data)
    async with trio.open_nursery() as n:
        await n.start(d.sync.run)
        assert d.sync.data_port
        if dead_port:
            real = d.sync.data_port
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                d.sync.data_port = s.getsockname()[1]  # advertised, nobody listening
        link(e, d)
        link(d, e)
        if garbage:
            with trio.fail_after(5):
                s = await trio.open_tcp_stream("127.0.0.1", d.sync.data_port)
                await s.send_all(b"GET / HTTP/1.1\r\n\r\n")
                reply = await s.receive_some(4096)
                await s.aclose()
            assert reply and b"malformed" in reply
        sends = []
        orig = socket.socket.sendfile
        if corrupt or die:
            def corrupting(self, file, offset=0, count=None):
                if sends:
                    return orig(self, file, offset, count)
                sends.append(offset)
                chunk = bytearray(os.pread(file.fileno(), count, offset))
                if die:  # half a block, then the sender is gone
                    self.sendall(chunk[: 200 * KiB])
                    raise ConnectionResetError("the sender died")
                chunk[1000] ^= 0xFF
                self.sendall(chunk)
                return count

            socket.socket.sendfile = corrupting
        try:
            with trio.fail_after(30):
                while True:
                    await e.sync.pass_once()
                    link(e, d)
                    f = e.sync.status_view()["files"][0]
                    if f["replicas"] == 1:
                        break
                    await trio.sleep(0.05)
        finally:
            socket.socket.sendfile = orig
        n.cancel_scope.cancel()
    if dead_port:
        d.sync.data_port = real
    rep = tmp_path / "d" / "replicas" / e.node_id / "cfg" / "big.npz"
    assert rep.read_bytes() == data
    return d, e, router


async def test_blocks_stream_over_the_data_channel(tmp_path):
    d, e, router = await run_pair(tmp_path)
    sent = e.sync.status_view()["sent"]
    assert sent["streams"] >= 1 and sent["channel_fallbacks"] == 0
    assert d.sync.channel.streams >= 1 and d.sync.channel.stream_bytes >= 3 * 2**20
    assert len(router.pushes) <= 2  # HTTP carried the manifests only
    assert e.sync.streams_sent == 1 and e.sync.channel_fallbacks == 0  # what /metrics reads


async def test_an_unreachable_data_channel_falls_back_to_http(tmp_path):
    d, e, router = await run_pair(tmp_path, dead_port=True)
    sent = e.sync.status_view()["sent"]
    assert sent["channel_fallbacks"] == 1 and sent["streams"] == 0
    assert d.sync.channel.streams == 0 and len(router.pushes) >= 3  # blocks went in HTTP pushes


async def test_garbage_on_the_data_port_is_refused_and_counted(tmp_path):
    d, e, _ = await run_pair(tmp_path, garbage=True)
    assert d.sync.rejected["malformed"] == 1


async def test_a_sender_dying_mid_stream_leaves_the_receiver_serving_and_the_next_stream_resumes(tmp_path):
    d, e, _ = await run_pair(tmp_path, die=True)
    assert e.sync.status_view()["sent"]["request_failures"] == 1
    assert d.sync.channel.streams == 2 and d.sync.store.commits == 1
    assert d.sync.store.bytes_received == 3 * 2**20 + 5  # the block cut in half was not counted, nothing twice


async def test_a_block_corrupted_in_flight_on_the_channel_is_rejected_and_sent_again(tmp_path):
    d, e, _ = await run_pair(tmp_path, corrupt=1)
    assert d.sync.store.rejected["bad_block_hash"] == 1
    assert e.sync.status_view()["sent"]["blocks_resent"] == 1


async def test_at_most_two_files_travel_to_one_target_at_a_time(tmp_path):
    d = make_node(tmp_path, "d", "durable", data_port=0)
    e = make_node(tmp_path, "e", "ephemeral", data_port=0)
    d.addr = "127.0.0.1:1"
    e.ctx.client = __import__("httpx").AsyncClient(transport=Router([d, e]))
    files = {f"cfg/s{i}.npz": os.urandom(2**20 + i) for i in range(8)}
    for path, data in files.items():
        put(e, path, data)
    live, peak = [0], [0]
    orig = e.sync.pusher.blocks.send_blocks

    async def counting(*args):
        live[0] += 1
        peak[0] = max(peak[0], live[0])
        try:
            await trio.sleep(0.05)  # hold the slot a little, so overlaps would show
            return await orig(*args)
        finally:
            live[0] -= 1

    e.sync.pusher.blocks.send_blocks = counting
    async with trio.open_nursery() as n:
        await n.start(d.sync.run)
        e.sync.pusher.nursery = n  # block transfers in the background, as under run()
        link(e, d)
        link(d, e)
        with trio.fail_after(30):
            while not all(f["replicas"] == 1 for f in e.sync.status_view()["files"]) or len(
                    e.sync.status_view()["files"]) < len(files):
                await e.sync.pass_once()
                link(e, d)
                await trio.sleep(0.05)
        n.cancel_scope.cancel()
    assert peak[0] == 2  # transfers overlapped, two at a time, never more
    for path, data in files.items():
        assert (tmp_path / "d" / "replicas" / e.node_id / path).read_bytes() == data


def test_a_verified_block_sent_again_and_cut_off_does_not_count_any_more(tmp_path):
    """A (misbehaving) sender re-sends a verified block and the stream breaks inside it: the block's bytes in the
    partial file are no longer known good, so it is asked for again rather than trusted at commit."""
    store = ReplicaStore(tmp_path)
    bs = 128 * KiB
    data = os.urandom(3 * bs)
    m = manifest_of(data, bs)
    item = PushItem("cfg/r.npz", m, 1, commit=False)
    assert receive(store, "o1", item, [(0, 2)], data[: 2 * bs])["need"] == [2]
    garbage = os.urandom(1000)
    with pytest.raises(ConnectionError):
        receive(store, "o1", item, [(1, 1)], garbage)
    r = store.apply("o1", PushItem("cfg/r.npz", m, 1, [(2, data[2 * bs:])]))
    assert r["status"] == "need" and r["need"] == [1]
    assert store.apply("o1", PushItem("cfg/r.npz", m, 1, [(1, data[bs: 2 * bs])]))["status"] == "committed"
    assert (tmp_path / "replicas" / "o1" / "cfg" / "r.npz").read_bytes() == data


def test_a_reply_lists_at_most_64_rejected_blocks_and_counts_them_all(tmp_path):
    store = ReplicaStore(tmp_path)
    bs = 16 * KiB
    data = os.urandom(100 * bs)
    m = manifest_of(data, bs)
    r = receive(store, "o1", PushItem("cfg/many.npz", m, 1), [(0, 100)], os.urandom(len(data)))
    assert r["rejected_count"] == 100 and len(r["rejected_blocks"]) == 64 and r["need"] == list(range(100))
    assert store.rejected["bad_block_hash"] == 100


@pytest.mark.parametrize("sync, ok", [
    ({"receipt_digests": {"abc": "0123456789abcdef"}, "data_port": 8771}, True),
    ({"receipt_digests": {"abc": "x" * 33}}, False),
    ({"receipt_digests": ["abc"]}, False),
    ({"receipt_digests": {f"o{i}": "d" for i in range(2000)}}, False),
    ({"data_port": 0}, False),
    ({"data_port": 70000}, False),
    ({"data_port": "8771"}, False),
])
def test_snapshot_sync_fields_are_validated(sync, ok):
    from p2pnode.errors import RejectedMessage
    from p2pnode.wire import _check_sync

    if ok:
        _check_sync(sync)
    else:
        with pytest.raises(RejectedMessage):
            _check_sync(sync)
