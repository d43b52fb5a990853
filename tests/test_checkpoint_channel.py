"""A checkpoint file over a durable holder's data channel (issue 41's fetch, ``p2pnode/sync/_ckchannel.py``): real
sockets on loopback, the holder's real :class:`StreamServer`; each block checked against the signed manifest as it
lands, a bad block refused and the rest fetched from another holder, a refused read read over HTTP instead."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import httpx
import msgspec
import pytest
import trio
import trio.testing

from p2pnode.reqauth import AUTH_HEADER
from p2pnode.sync import _ckchannel
from p2pnode.sync._channel import StreamServer
from p2pnode.sync._ckboard import CheckpointBoard
from p2pnode.sync._ckchannel import (
    READ_MAGIC,
    CheckpointReads,
    ReadRequest,
    _Refused,
    pull_checkpoint_file,
    read_request_length,
)
from p2pnode.sync._ckfetch import CheckpointFetch
from p2pnode.sync._refuse import SyncReject
from p2pnode.sync._wire import encode_frame
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


async def _fetch(tmp_path: Path, holder_file: bytes, *, auth: str, holders: tuple[str, ...],
                 totals: Counter[str] | None = None):
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
                                    sign_read=lambda method, target, receiver: {AUTH_HEADER: auth}, totals=totals)
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
    board = CheckpointBoard(SimpleNamespace(), timeout_s=5, leader_of_term=lambda term: None)
    got, fetch, reads, counts, http_reads = await _fetch(tmp_path, BIG, auth="forged", holders=("durable",),
                                                         totals=board.fetches)
    assert got.read_bytes() == BIG
    assert counts == {"checkpoint_read_unauthorized": 1} and reads.reads == 0
    assert http_reads == ["127.0.0.1@0"]  # the same holder over HTTP (where its route checks the same signature)
    assert fetch.channel == {"refused_401": 1, "http_fallbacks": 1}  # review L5: counted, and in /sync/status
    assert board.view()["fetches"] == {"channel_http_fallbacks": 1, "channel_refused_401": 1}


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


def _holder_reads(tmp_path: Path, files: dict[int, tuple[str, int]], counts: Counter[str]) -> CheckpointReads:
    """An honest holder's reads: file ``i`` is ``tmp_path/name`` of ``size`` bytes."""
    return CheckpointReads(
        authenticate=lambda header, method, target: None,
        checkpoint_file=lambda d, i: (tmp_path, files[i][0], files[i][1], BS) if d == DIGEST and i in files else None,
        count=lambda reason: counts.update([reason]), timeout_s=5)


async def _fetch_files(tmp_path: Path, contents: list[tuple[str, bytes]], name: str = "step-3.pt") -> tuple[Path,
                                                                                                         CheckpointFetch,
                                                                                                         list[str]]:
    """A checkpoint of ``contents`` (``(path, bytes)`` each) fetched from one durable holder over its channel."""
    files, held, hashes = [], {}, {}
    for i, (path, data) in enumerate(contents):
        (tmp_path / f"held{i}").write_bytes(data)
        m = hash_file(tmp_path / f"held{i}", block_size=BS)
        files.append(CheckpointFile(path, len(data), BS, m.root))
        held[i], hashes[i] = (f"held{i}", len(data)), m.hashes
    newest = NewestCheckpoint(DIGEST, CheckpointBody("hex8_2p", "7-1", 3, "honest", "ck", name, tuple(files)),
                              ("durable",))
    counts: Counter[str] = Counter()
    reads = _holder_reads(tmp_path, held, counts)
    http_reads: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        i = int(req.url.params["file"])
        if req.url.params.get("part") == "hashes":
            return httpx.Response(200, content=hashes[i])
        http_reads.append(f"{i}@{req.url.params['offset']}")
        return httpx.Response(200, content=contents[i][1][int(req.url.params["offset"]):])

    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        sections = {"durable": SimpleNamespace(data_port=listeners[0].socket.getsockname()[1])}
        nursery.start_soon(trio.serve_listeners, _server(reads).handle, listeners)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            ctx = SimpleNamespace(client=client, member={"durable": _member("127.0.0.1:1", True)}.get,
                                  section=lambda node, kind: sections.get(node))
            fetch = CheckpointFetch(ctx, newest, tmp_path / "dest", timeout_s=5)
            got = await fetch.run()
        nursery.cancel_scope.cancel()
    assert not counts
    return got, fetch, http_reads


async def test_a_checkpoint_with_an_empty_file_comes_over_the_channel(tmp_path: Path) -> None:
    """Review H2: an empty file made the taker's mmap raise ValueError, which escaped the fetch (the job restarted
    from nothing, every attempt)."""
    got, fetch, http_reads = await _fetch_files(tmp_path, [("model.pt", BIG), ("empty.log", b""),
                                                           ("opt.pt", BIG[:3 * BS + 5])])
    assert (got / "model.pt").read_bytes() == BIG and (got / "empty.log").read_bytes() == b""
    assert (got / "opt.pt").read_bytes() == BIG[:3 * BS + 5]
    assert fetch.refused == {} and http_reads == []


async def test_a_single_file_checkpoint_of_no_bytes_comes_over_the_channel(tmp_path: Path) -> None:
    got, fetch, http_reads = await _fetch_files(tmp_path, [("", b"")])
    assert got.read_bytes() == b"" and fetch.refused == {} and http_reads == []


class _SilentHolder:
    """A data channel that accepts one connection, reads the request and never answers (review H1), until
    :meth:`release` closes its side; :attr:`peer_closed` is set once the taker has closed its socket."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.got_request, self.released, self.peer_closed = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.sock.settimeout(30)
        conn, _ = self.sock.accept()
        with conn:
            conn.settimeout(30)
            conn.recv(MAX_READ)
            self.got_request.set()
            self.released.wait(30)
            conn.shutdown(socket.SHUT_WR)  # a stray taker's read ends now (and its cleanup runs)
            while conn.recv(65536):
                pass
            self.peer_closed.set()

    def close(self) -> None:
        self.released.set()
        self.thread.join(35)
        self.sock.close()


MAX_READ = 8192


async def test_a_cancelled_channel_fetch_leaves_no_worker_that_spoils_the_next_fetch(tmp_path: Path) -> None:
    """Review H1: fetch A waits on a holder that never answers; it is cancelled; fetch B of the same checkpoint
    completes; when A's worker ends it must not cut the placed file back to the 24 blocks A started from."""
    src = tmp_path / "src.bin"
    src.write_bytes(BIG)
    m = hash_file(src, block_size=BS)
    (tmp_path / "held.bin").write_bytes(BIG)
    body = CheckpointBody("hex8_2p", "7-1", 3, "honest", "ck", "step-3.pt", (CheckpointFile("", len(BIG), BS, m.root),))
    dest = tmp_path / "dest"
    (dest / ".partial" / DIGEST.hex()).mkdir(parents=True)
    (dest / ".partial" / DIGEST.hex() / "0").write_bytes(BIG[:24 * BS])
    silent = _SilentHolder()
    counts: Counter[str] = Counter()
    reads = _holder_reads(tmp_path, {0: ("held.bin", len(BIG))}, counts)
    http_reads: list[str] = []
    try:
        async with trio.open_nursery() as nursery:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            nursery.start_soon(trio.serve_listeners, _server(reads).handle, listeners)
            sections = {"silent": SimpleNamespace(data_port=silent.port),
                        "durable": SimpleNamespace(data_port=listeners[0].socket.getsockname()[1])}
            members = {"silent": _member("127.0.0.1:2", True), "durable": _member("127.0.0.1:1", True)}
            async with httpx.AsyncClient(transport=httpx.MockTransport(_http(m.hashes, http_reads))) as client:
                ctx = SimpleNamespace(client=client, member=members.get, section=lambda node, kind: sections.get(node))
                a = CheckpointFetch(ctx, NewestCheckpoint(DIGEST, body, ("silent",)), dest, timeout_s=30)
                with trio.CancelScope() as scope:
                    async def cancel_once_asked() -> None:
                        assert await trio.to_thread.run_sync(silent.got_request.wait, 30)
                        scope.cancel()
                    nursery.start_soon(cancel_once_asked)
                    await a.run()
                assert scope.cancelled_caught
                b = CheckpointFetch(ctx, NewestCheckpoint(DIGEST, body, ("durable",)), dest, timeout_s=5)
                placed = await b.run()
                assert placed.read_bytes() == BIG and http_reads == []
            silent.released.set()
            assert await trio.to_thread.run_sync(silent.peer_closed.wait, 30)  # A's worker has ended
            nursery.cancel_scope.cancel()
    finally:
        silent.close()
    assert placed.stat().st_size == len(BIG) and placed.read_bytes() == BIG


def test_the_ok_reply_is_read_whatever_segments_it_comes_in(tmp_path: Path) -> None:
    """Review L1: ``recv(MSG_WAITALL)`` on a socket with a timeout may return short; the taker reads on."""
    data = BIG[:3 * BS + 5]
    (tmp_path / "src").write_bytes(data)
    m = hash_file(tmp_path / "src", block_size=BS)
    (tmp_path / "part").write_bytes(b"")
    frame = encode_frame({"ok": True})
    server = socket.create_server(("127.0.0.1", 0))
    sent = threading.Event()

    def holder() -> None:
        conn, _ = server.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.recv(MAX_READ)
            for piece in (frame[:2], frame[2:5]):
                conn.sendall(piece)
                time.sleep(0.05)  # not synchronisation: separate segments (the taker must take any split)
            conn.sendall(frame[5:] + data)
            sent.set()

    t = threading.Thread(target=holder, daemon=True)
    t.start()
    try:
        got = pull_checkpoint_file("127.0.0.1", server.getsockname()[1], "/t", None, tmp_path / "part", have=0,
                                   size=len(data), block_size=BS, hashes=m.hashes, connect_timeout_s=5, timeout_s=10,
                                   stop=threading.Event(), progress=lambda verified: None)
    finally:
        t.join(10)
        server.close()
    assert sent.is_set() and got == len(data) and (tmp_path / "part").read_bytes() == data


def _fd_target(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@pytest.mark.parametrize("fault", ["dup_fails", "cancelled_waiting_for_a_thread"])
async def test_a_read_that_fails_before_its_worker_runs_closes_the_file(tmp_path: Path, fault: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review L2: the holder's file (and its socket's dup) are closed when ``os.dup`` fails or the read is
    cancelled while it waits for a thread slot (its worker, which would close them, never runs)."""
    (tmp_path / "held.bin").write_bytes(BIG)
    opened: list[int] = []
    real_open = _ckchannel.open_beneath
    proceed, in_open = threading.Event(), threading.Event()

    def spy(base: Path, rel: str, *, size: int) -> int:
        fd = real_open(base, rel, size=size)
        opened.append(fd)
        in_open.set()
        proceed.wait(10)
        return fd

    monkeypatch.setattr(_ckchannel, "open_beneath", spy)
    reads = _holder_reads(tmp_path, {0: ("held.bin", len(BIG))}, Counter())
    body = msgspec.msgpack.encode(ReadRequest(target=f"/sync/checkpoint/file?digest={DIGEST.hex()}&file=0&offset=0"))
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    client = await trio.open_tcp_stream("127.0.0.1", listeners[0].socket.getsockname()[1])
    server = await listeners[0].accept()
    limiter = trio.to_thread.current_default_thread_limiter()
    async with client, server, trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def serve() -> None:
            with scope:
                await reads.serve(server, body)

        if fault == "dup_fails":
            def no_dup(fd: int) -> int:
                raise OSError(24, "Too many open files")
            monkeypatch.setattr(_ckchannel.os, "dup", no_dup)
            proceed.set()
            with pytest.raises(OSError):
                await reads.serve(server, body)
        else:
            monkeypatch.setattr(limiter, "total_tokens", 1)  # restored after the test
            nursery.start_soon(serve)
            assert await trio.to_thread.run_sync(in_open.wait, 10, limiter=trio.CapacityLimiter(1))
            hog_holds = trio.Event()

            async def hog() -> None:  # queued for the one slot before the open's thread gives it back
                async with limiter:
                    hog_holds.set()
                    await trio.sleep_forever()

            nursery.start_soon(hog)
            await trio.testing.wait_all_tasks_blocked()
            proceed.set()
            await hog_holds.wait()
            await trio.testing.wait_all_tasks_blocked()  # serve now waits for a thread slot
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert len(opened) == 1 and not _fd_target(opened[0]).endswith("held.bin")
