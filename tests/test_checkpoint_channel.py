"""A checkpoint file over a durable holder's data channel (issue 41's fetch, ``p2pnode/sync/_ckchannel.py``): real
sockets on loopback, the holder's real :class:`StreamServer`; each block checked against the signed manifest as it
lands, a bad block refused and the rest fetched from another holder, a refused read read over HTTP instead."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import httpx
import msgspec
import pytest
import trio

from p2pnode.reqauth import AUTH_HEADER
from p2pnode.sync._channel import StreamServer
from p2pnode.sync._ckchannel import READ_MAGIC, CheckpointReads, ReadRequest, _Refused, read_request_length
from p2pnode.sync._ckfetch import CheckpointFetch
from p2pnode.sync._refuse import SyncReject
from p2pnode.synccore import CheckpointBody, CheckpointFile, NewestCheckpoint, hash_file

BS = 1 << 16
BIG = bytes(range(256)) * 4096 * 4  # 4 MiB, 64 blocks
DIGEST = b"\x01" * 16


def _server(reads: CheckpointReads) -> StreamServer:
    s = StreamServer(SimpleNamespace(), key_of=lambda o: None, admit=lambda: None, lock_of=lambda o: trio.Lock(),
                     on_commit=lambda o: None, count=reads.count, now=lambda: 0.0, max_skew_s=60, timeout_s=5)
    s.reads = reads
    return s


def _member(addr: str, durable: bool) -> SimpleNamespace:
    return SimpleNamespace(addr=addr, snapshot=SimpleNamespace(tags=["durable"] if durable else ["ephemeral"]))


def _http(hashes: bytes, reads: list[str]):
    """The holders' HTTP port: the block hashes, and the file (honest) from any offset."""

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.params.get("part") == "hashes":
            return httpx.Response(200, content=hashes)
        off = int(req.url.params["offset"])
        reads.append(f"{req.url.host}@{off // BS}")
        return httpx.Response(200, content=BIG[off:])
    return handler


async def _fetch(tmp_path: Path, holder_file: bytes, *, auth: str, holders: tuple[str, ...]):
    src = tmp_path / "src.bin"
    src.write_bytes(BIG)
    m = hash_file(src, block_size=BS)
    (tmp_path / "held.bin").write_bytes(holder_file)
    body = CheckpointBody("hex8_2p", "7-1", 3, "honest", "ck", "step-3.pt", (CheckpointFile("", len(BIG), BS, m.root),))
    newest = NewestCheckpoint(DIGEST, body, holders)
    counts: Counter[str] = Counter()
    reads = CheckpointReads(
        authenticate=lambda header, method, target: None if header == "good" and method == "GET" else "bad_sig",
        checkpoint_file=lambda d, i: (tmp_path, "held.bin", len(BIG), BS) if d == DIGEST and i == 0 else None,
        count=lambda reason: counts.update([reason]), timeout_s=5)
    http_reads: list[str] = []
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, _server(reads).handle, listeners)
        members = {"durable": _member("127.0.0.1:1", True), "other": _member("other:1", False)}
        sections = {"durable": SimpleNamespace(data_port=port)}
        async with httpx.AsyncClient(transport=httpx.MockTransport(_http(m.hashes, http_reads))) as client:
            ctx = SimpleNamespace(client=client, member=members.get, section=lambda node, kind: sections.get(node))
            fetch = CheckpointFetch(ctx, newest, tmp_path / "dest", timeout_s=5,
                                    sign_read=lambda method, target, receiver: {AUTH_HEADER: auth})
            got = await fetch.run()
        nursery.cancel_scope.cancel()
    return got, fetch, reads, counts, http_reads


async def test_a_checkpoint_file_comes_over_the_holders_data_channel_every_block_checked(tmp_path: Path) -> None:
    got, fetch, reads, counts, http_reads = await _fetch(tmp_path, BIG, auth="good", holders=("durable",))
    assert got.read_bytes() == BIG
    assert http_reads == [] and reads.reads == 1 and reads.read_bytes == len(BIG)
    assert fetch.refused == {} and not counts
    assert not (tmp_path / "dest" / ".partial").exists() or list((tmp_path / "dest" / ".partial").iterdir()) == []


async def test_a_bad_block_on_the_channel_is_refused_and_the_next_holder_resumes_after_the_verified_ones(
        tmp_path: Path) -> None:
    spoiled = bytearray(BIG)
    spoiled[40 * BS + 100] ^= 0xFF  # block 40 of the durable holder's replica
    got, fetch, reads, counts, http_reads = await _fetch(tmp_path, bytes(spoiled), auth="good",
                                                         holders=("durable", "other"))
    assert got.read_bytes() == BIG
    assert fetch.refused == {"bad_block": 1}
    assert http_reads == ["other@40"]  # blocks 0-39 verified from the channel and kept


async def test_a_read_the_channel_refuses_goes_over_http(tmp_path: Path) -> None:
    got, fetch, reads, counts, http_reads = await _fetch(tmp_path, BIG, auth="forged", holders=("durable",))
    assert got.read_bytes() == BIG
    assert counts == {"checkpoint_read_unauthorized": 1} and reads.reads == 0
    assert http_reads == ["127.0.0.1@0"]  # the same holder over HTTP (where its route checks the same signature)


def test_a_read_request_is_decoded_bounded_and_checked_like_the_http_route(tmp_path: Path) -> None:
    (tmp_path / "held.bin").write_bytes(BIG)
    seen: list[tuple[str | None, str, str]] = []

    def authenticate(header: str | None, method: str, target: str) -> str | None:
        seen.append((header, method, target))
        return None if header == "good" else "bad_sig"

    reads = CheckpointReads(authenticate=authenticate,
                            checkpoint_file=lambda d, i: (tmp_path, "held.bin", len(BIG), BS) if d == DIGEST else None,
                            count=lambda reason: None, timeout_s=5)
    ok = f"/sync/checkpoint/file?digest={DIGEST.hex()}&file=0&offset={BS}"

    def status(target: str, auth: str | None = "good") -> int:
        try:
            fd, offset, size = reads._open(msgspec.msgpack.encode(ReadRequest(target=target, auth=auth)))
        except _Refused as exc:
            return exc.status
        os.close(fd)
        assert (offset, size) == (BS, len(BIG))
        return 200

    assert status(ok) == 200 and seen[-1] == ("good", "GET", ok)
    assert status(ok, auth="forged") == 401 and status(ok, auth=None) == 401
    assert status(f"/sync/checkpoint?digest={DIGEST.hex()}") == 400  # only the file route
    assert status(ok + "&part=hashes") == 400  # hashes over HTTP only
    assert status(ok + "&offset=1") == 400  # a repeated parameter (the route's decoder)
    assert status(f"/sync/checkpoint/file?digest={'02' * 16}&file=0") == 404
    assert status(f"/sync/checkpoint/file?digest={DIGEST.hex()}&file=0&offset={len(BIG) + 1}") == 404
    with pytest.raises(_Refused):
        reads._open(b"\xc1not msgpack")
    with pytest.raises(_Refused):
        reads._open(msgspec.msgpack.encode({"target": "x" * 600}))  # beyond the field's bound
    with pytest.raises(SyncReject):
        read_request_length(READ_MAGIC + (1 << 20).to_bytes(4, "big"))
