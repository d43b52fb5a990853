"""The checkpoint fetch's internals against hostile holders (issue 41; review M1, M2, L2): every block checked
against the signed manifest as it arrives, durable holders first, bodies read with a byte limit, a deadline, and
nothing but verified blocks left behind on failure, for a later fetch of the same checkpoint to resume from."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import trio

from p2pnode.snapshot import CheckpointRef, SyncSection
from p2pnode.sync._ckboard import CheckpointBoard
from p2pnode.sync._ckfetch import CheckpointFetch
from p2pnode.synccore import CheckpointBody, CheckpointFile, NewestCheckpoint, hash_file

BS = 1 << 16
DATA = bytes(range(256)) * 4096  # 1 MiB: 16 blocks


def _newest(tmp_path: Path, holders: tuple[str, ...]) -> tuple[NewestCheckpoint, bytes]:
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    m = hash_file(src, block_size=BS)
    body = CheckpointBody("hex8_2p", "7-1", 3, "honest", "ck", "step-3.pt",
                          (CheckpointFile("", len(DATA), BS, m.root),))
    return NewestCheckpoint(b"\x01" * 16, body, holders), m.hashes


def _member(addr: str, durable: bool) -> SimpleNamespace:
    return SimpleNamespace(addr=addr, snapshot=SimpleNamespace(tags=["durable"] if durable else ["ephemeral"]))


class _Body(httpx.AsyncByteStream):
    """A reply body as a real transport gives it: streamed, not read in advance (the fetch reads it raw)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self):
        for k in range(0, len(self.data), 1 << 16):
            yield self.data[k:k + (1 << 16)]


def _handler(hashes: bytes, reads: list[str], data: bytes = DATA):
    def handler(req: httpx.Request) -> httpx.Response:
        p = req.url.params
        if p.get("part") == "hashes":
            return httpx.Response(200, content=hashes)  # the hostile one sends the right hashes too
        off = int(p["offset"])
        reads.append(f"{req.url.host}@{off}")
        if req.url.host == "hostile":
            return httpx.Response(200, stream=_Body(b"\x00" * (len(data) - 1 - off)))  # garbage, one byte short
        return httpx.Response(200, stream=_Body(data[off:]))
    return handler


async def test_a_hostile_holder_cannot_poison_the_partial_file_the_next_holder_appends_to(tmp_path: Path) -> None:
    newest, hashes = _newest(tmp_path, ("aaaa-hostile", "honest"))
    reads: list[str] = []
    members = {"aaaa-hostile": _member("hostile:1", False), "honest": _member("honest:1", True)}
    async with httpx.AsyncClient(transport=httpx.MockTransport(_handler(hashes, reads))) as client:
        ctx = SimpleNamespace(client=client, member=members.get)
        # durable holders first: the honest one gives it all
        fetch = CheckpointFetch(ctx, newest, tmp_path / "dest", timeout_s=5)
        assert (await fetch.run()).read_bytes() == DATA and reads == ["honest@0"]
        # the hostile one the only durable one: its first block is refused, nothing of it is kept, the honest
        # one sends every byte from 0
        members["aaaa-hostile"], members["honest"] = _member("hostile:1", True), _member("honest:1", False)
        reads.clear()
        (tmp_path / "dest" / "step-3.pt").unlink()
        fetch = CheckpointFetch(ctx, newest, tmp_path / "dest", timeout_s=5)
        assert (await fetch.run()).read_bytes() == DATA
        assert reads == ["hostile@0", "honest@0"] and fetch.refused == {"bad_block": 1}
        # a partial file poisoned by an earlier run: its blocks are checked, the bad ones dropped, the good kept
        (tmp_path / "dest" / "step-3.pt").unlink()
        partial = tmp_path / "dest" / ".partial" / newest.digest.hex()
        partial.mkdir(parents=True)
        (partial / "0").write_bytes(DATA[: 3 * BS] + b"\x00" * (BS + 5))
        members["aaaa-hostile"], members["honest"] = _member("hostile:1", False), _member("honest:1", True)
        reads.clear()
        fetch = CheckpointFetch(ctx, newest, tmp_path / "dest", timeout_s=5)
        assert (await fetch.run()).read_bytes() == DATA and reads == [f"honest@{3 * BS}"]


async def test_hashes_that_do_not_bind_to_the_signed_root_are_refused_and_a_failed_fetch_leaves_nothing(
        tmp_path: Path) -> None:
    newest, hashes = _newest(tmp_path, ("aaaa-hostile",))
    members = {"aaaa-hostile": _member("hostile:1", True)}
    async with httpx.AsyncClient(transport=httpx.MockTransport(_handler(bytes(len(hashes)), []))) as client:
        fetch = CheckpointFetch(SimpleNamespace(client=client, member=members.get), newest, tmp_path / "d",
                                timeout_s=5)
        with pytest.raises(OSError):
            await fetch.run()
    assert fetch.refused == {"bad_hashes": 1}
    assert not (tmp_path / "d" / ".partial" / newest.digest.hex()).exists()


async def test_a_fetch_past_its_deadline_ends_and_leaves_no_unverified_bytes(tmp_path: Path) -> None:
    newest, hashes = _newest(tmp_path, ("slow",))

    class Slow(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield DATA[:BS]
            await trio.sleep_forever()

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.params.get("part") == "hashes":
            return httpx.Response(200, content=hashes)
        return httpx.Response(200, stream=Slow())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        fetch = CheckpointFetch(SimpleNamespace(client=client, member={"slow": _member("slow:1", True)}.get),
                                newest, tmp_path / "d", timeout_s=5, deadline_s=0.5)
        with pytest.raises(trio.TooSlowError):
            await fetch.run()
    assert not (tmp_path / "d" / ".partial" / newest.digest.hex()).exists()


async def test_a_signed_checkpoint_is_read_with_a_byte_limit() -> None:
    """Review M2: a member that lists a ref answers ``GET /sync/checkpoint`` with an endless body."""
    sent = [0]

    class Endless(httpx.AsyncByteStream):
        async def __aiter__(self):
            for _ in range(300):
                sent[0] += 1 << 20
                yield b"\0" * (1 << 20)

    ref = CheckpointRef("c", "7-1", 1, "hostile", b"\x02" * 16)
    hostile = SimpleNamespace(origin="hostile", addr="hostile:1", key=b"\0" * 32)
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200, stream=Endless()))) as c:
        ctx = SimpleNamespace(client=c, now=lambda: 0.0, members=lambda live=True: [hostile],
                              member=lambda n: hostile if n == "hostile" else None,
                              section=lambda o, cls: SyncSection(checkpoints=[ref]))
        board = CheckpointBoard(ctx, timeout_s=30, leader_of_term=lambda t: None)
        assert await board.pass_once() == 0
    assert board.fetch_failures == 1 and sent[0] <= 3 << 20


def test_one_members_refs_cannot_starve_another_members_newest() -> None:
    """Review M3: a member lists MAX_CHECKPOINT_REFS fake refs of the config with higher claimed orders; the honest
    ref another member lists is still fetched in the first pass (members take turns, one ref each a pass)."""
    from p2pnode.snapshot import MAX_CHECKPOINT_REFS
    from p2pnode.synccore._ckholding import HOLDER_BACKOFF_S

    board = CheckpointBoard(SimpleNamespace(), timeout_s=60, leader_of_term=lambda t: None)
    honest = CheckpointRef("c", "7-1", 5, "trainer", b"\x01" * 16)
    fakes = [CheckpointRef("c", f"999-{i}", 1, "hostile", bytes([2, i]) + b"\0" * 14)
             for i in range(MAX_CHECKPOINT_REFS)]
    sybils = {f"s{i}": fakes[i:i + 1] for i in range(3)}
    refs = {"trainer": [honest], "hostile": fakes}
    got = board.wanted(refs, 0.0)
    assert honest.digest in {r.digest for r, _ in got} and len(got) == 2
    # with more listing members than slots a pass, every member's turn comes within a few passes
    passes, now = 0, 0.0
    while honest.digest not in {r.digest for r, _ in board.wanted(refs | sybils, now)}:
        passes += 1
        now += 5.0
        assert passes < 5
    # a ref whose origin this node already knows was placed on that job goes before a member's claimed newer ones
    board.trust.assignments.record("c", "7-1", "trainer", "train")
    mixed = {"hostile": [*fakes[:3], CheckpointRef("c", "7-1", 6, "trainer", b"\x03" * 16)]}
    assert [r.seq for r, _ in board.wanted(mixed, 10 * HOLDER_BACKOFF_S)] == [6]



BIG = DATA * 4  # 4 MiB, 64 blocks


def _cutting_handler(hashes: bytes, reads: list[str], blocks_per_reply: int):
    """A holder whose every reply of ``BIG`` ends, mid-body, after ``blocks_per_reply`` blocks and a half (the
    agents' HTTP server closes a connection after 30 s without a byte from the client, even mid-reply:
    bench/checkpoint_fetch.py found a 1 GiB fetch cut after 32 s); 0: it ends before the first byte."""

    class Cut(httpx.AsyncByteStream):
        def __init__(self, off: int) -> None:
            self.off = off

        async def __aiter__(self):
            n = blocks_per_reply * BS + BS // 2
            for k in range(self.off, min(self.off + n, len(BIG)), BS // 2):
                yield BIG[k:min(k + BS // 2, self.off + n)]
            if self.off + n < len(BIG):
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.params.get("part") == "hashes":
            return httpx.Response(200, content=hashes)
        off = int(req.url.params["offset"])
        reads.append(f"{req.url.host}@{off // BS}")
        return httpx.Response(200, stream=Cut(off))
    return handler


async def test_a_reply_cut_off_midway_is_asked_again_from_the_same_holder_while_it_gives_more(tmp_path: Path) -> None:
    """The only holder (the durable node, the training's node gone) cuts every reply after 24.5 blocks: the fetch
    asks it again from the verified end (every whole block that arrived: 24) each time and completes; a holder
    that gives nothing more is not asked again."""
    src = tmp_path / "big.bin"
    src.write_bytes(BIG)
    m = hash_file(src, block_size=BS)
    body = CheckpointBody("hex8_2p", "7-1", 3, "honest", "ck", "step-3.pt", (CheckpointFile("", len(BIG), BS, m.root),))
    newest = NewestCheckpoint(b"\x01" * 16, body, ("durable",))
    reads: list[str] = []
    members = {"durable": _member("durable:1", True)}
    async with httpx.AsyncClient(transport=httpx.MockTransport(_cutting_handler(m.hashes, reads, 24))) as client:
        fetch = CheckpointFetch(SimpleNamespace(client=client, member=members.get), newest, tmp_path / "d",
                                timeout_s=5)
        assert (await fetch.run()).read_bytes() == BIG
    assert reads == [f"durable@{k}" for k in (0, 24, 48)], reads
    assert fetch.refused == {"cut_off": 2}
    reads.clear()
    async with httpx.AsyncClient(transport=httpx.MockTransport(_cutting_handler(m.hashes, reads, 0))) as client:
        fetch = CheckpointFetch(SimpleNamespace(client=client, member=members.get), newest, tmp_path / "e",
                                timeout_s=5)
        with pytest.raises(OSError, match="no holder"):
            await fetch.run()
    assert reads == ["durable@0"] and fetch.refused == {"cut_off": 1}


async def test_a_failed_fetch_keeps_its_verified_blocks_for_the_next_fetch_and_a_newer_checkpoint_drops_them(
        tmp_path: Path) -> None:
    """docs/jobs.md: a cancelled or failed fetch leaves its verified bytes, and a later fetch of the same checkpoint
    resumes from them (each block checked again first: a block spoiled on disk meanwhile is fetched again); a
    fetch of another checkpoint into the same folder removes them."""
    src = tmp_path / "big.bin"
    src.write_bytes(BIG)
    m = hash_file(src, block_size=BS)
    body = CheckpointBody("hex8_2p", "7-1", 3, "honest", "ck", "step-3.pt", (CheckpointFile("", len(BIG), BS, m.root),))
    newest = NewestCheckpoint(b"\x01" * 16, body, ("durable",))
    members = {"durable": _member("durable:1", True)}
    reads: list[str] = []
    cutting = _cutting_handler(m.hashes, reads, 24)

    def once(req: httpx.Request) -> httpx.Response:  # 24.5 blocks, then the holder answers no more
        if req.url.params.get("part") != "hashes" and reads:
            return httpx.Response(503)
        return cutting(req)

    dest = tmp_path / "d"
    part = dest / ".partial" / newest.digest.hex() / "0"
    async with httpx.AsyncClient(transport=httpx.MockTransport(once)) as client:
        with pytest.raises(OSError, match="no holder"):
            await CheckpointFetch(SimpleNamespace(client=client, member=members.get), newest, dest, timeout_s=5).run()
    assert reads == ["durable@0"] and part.read_bytes() == BIG[:24 * BS]  # whole verified blocks only
    with part.open("r+b") as fh:  # a block spoiled on disk meanwhile
        fh.seek(20 * BS + 7)
        fh.write(b"\xff")
    reads.clear()
    async with httpx.AsyncClient(transport=httpx.MockTransport(_handler(m.hashes, reads, BIG))) as client:
        got = await CheckpointFetch(SimpleNamespace(client=client, member=members.get), newest, dest,
                                    timeout_s=5).run()
    assert got.read_bytes() == BIG and reads == [f"durable@{20 * BS}"]  # resumed at the first block that failed
    assert not part.parent.exists()
    # a partial of this checkpoint, then a fetch of a newer one into the same folder: the old partial goes
    part.parent.mkdir(parents=True)
    part.write_bytes(BIG[:BS])
    newer = NewestCheckpoint(b"\x02" * 16, body, ("durable",))
    reads.clear()
    async with httpx.AsyncClient(transport=httpx.MockTransport(_cutting_handler(m.hashes, reads, 0))) as client:
        with pytest.raises(OSError):
            await CheckpointFetch(SimpleNamespace(client=client, member=members.get), newer, dest, timeout_s=5).run()
    assert not (dest / ".partial").exists() or list((dest / ".partial").iterdir()) == []


async def test_a_holder_that_gives_one_block_per_connection_is_left_after_a_few_tries_and_nothing_is_rechecked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review M1: each retry re-hashed the whole verified prefix from disk (a holder sending one block per
    connection: 127 prefix checks for 64 blocks). The verified end is now kept in memory (the partial file is
    checked from disk once, at the start), and a holder whose tries verify less than 1 MiB is asked at most 3
    times before the next holder resumes."""
    src = tmp_path / "big.bin"
    src.write_bytes(BIG)
    m = hash_file(src, block_size=BS)
    body = CheckpointBody("hex8_2p", "7-1", 3, "honest", "ck", "step-3.pt", (CheckpointFile("", len(BIG), BS, m.root),))
    newest = NewestCheckpoint(b"\x01" * 16, body, ("slow", "honest"))
    reads: list[str] = []
    cutting = _cutting_handler(m.hashes, reads, 1)
    honest = _handler(m.hashes, reads, BIG)

    def handler(req: httpx.Request) -> httpx.Response:
        return cutting(req) if req.url.host == "slow" else honest(req)

    checks: list[int] = []
    real = CheckpointFetch._verified_prefix

    def counted(part: Path, f: CheckpointFile, hashes: bytes) -> int:
        checks.append(1)
        return real(part, f, hashes)

    monkeypatch.setattr(CheckpointFetch, "_verified_prefix", staticmethod(counted))
    members = {"slow": _member("slow:1", True), "honest": _member("honest:1", False)}
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        fetch = CheckpointFetch(SimpleNamespace(client=client, member=members.get), newest, tmp_path / "d",
                                timeout_s=5)
        assert (await fetch.run()).read_bytes() == BIG
    assert reads == ["slow@0", "slow@1", "slow@2", f"honest@{3 * BS}"], reads
    assert fetch.refused == {"cut_off": 3} and len(checks) == 1
