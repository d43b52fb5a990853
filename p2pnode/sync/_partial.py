"""Partial files: one transfer's blocks assembled on disk, checked block by block against its manifest (blocking I/O).

A transfer of ``(origin, path)`` writes ``.sync/incoming/<origin>/<key>.part`` (sparse, the manifest's size) and
keeps ``<key>.json`` (its manifest and path: resume state). Which blocks are good is not persisted: after a
restart they are found by hashing the partial file (:func:`verify_on_disk`). A new version carries over every
block it shares, at the same index, with the old partial file or the current replica (:func:`copy_blocks`:
shared by reflink where the file system allows, :mod:`._reflink`, else ``copy_file_range``). Before the rename
into place every block is checked from the file itself (:func:`verify_assembled`), except those hashed from the
file after their last write (``read_back``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import blake3
import msgspec
from msgspec import Meta

from ..snapshot import ByteCount, Counter
from ..statefiles import decode_entry, read_json_file, report_for
from ..synccore import MAX_BLOCK_BYTES, Manifest, hash_block, hash_file
from ._reflink import clone_range
from ._refuse import SyncReject
from ._wire import PushItem

__all__ = ["NO_SPACE_ERRNOS", "Carried", "PartialState", "Transfer", "check_block", "copy_blocks", "load_state",
           "no_space_refused", "partial_key", "prehash", "read_state", "verify_assembled", "verify_on_disk",
           "write_blocks"]

log = logging.getLogger(__name__)

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Write errors that mean the disk (or the writer's quota) is full: refused as ``no_space`` (507), not raised."""
IOV_MAX = max(16, os.sysconf("SC_IOV_MAX")) if "SC_IOV_MAX" in os.sysconf_names else 1024
"""Buffers one ``pwritev`` takes at most (``sysconf(_SC_IOV_MAX)``, 1,024 on Linux; more is ``EINVAL``)."""


@contextlib.contextmanager
def no_space_refused(what: str) -> Iterator[None]:
    """Raise ``SyncReject("no_space")`` (507) for an ``OSError`` of :data:`NO_SPACE_ERRNOS` in the block (a write
    that found the disk full: the sender backs off and offers again); other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:
            raise SyncReject("no_space", f"{what}: {exc.strerror}") from None
        raise


class Transfer(msgspec.Struct):
    """One file being assembled: ``origin``'s ``path`` at ``manifest`` (sequence ``seq``), written to ``part``
    with its resume state in ``state``. ``verified``: blocks known good in ``part``."""

    origin: str
    path: str
    manifest: Manifest
    seq: int
    part: Path
    state: Path
    verified: set[int]
    read_back: set[int] = msgspec.field(default_factory=set)
    """Verified blocks whose bytes were hashed from the partial file itself after their last write (streamed
    blocks as they land, blocks found on disk after a restart): the commit need not read them again."""
    streaming: bool = False
    """A block stream is writing this partial file (outside the origin's lock): other writers are refused."""

    def remaining_bytes(self) -> int:
        """Bytes of the manifest not verified yet (what this transfer will still take on disk)."""
        m = self.manifest
        return max(0, m.size - sum(m.block_len(i) for i in list(self.verified)))


def partial_key(path: str) -> str:
    """The file name stem of ``path``'s partial and state files (32 hex characters)."""
    return blake3.blake3(path.encode("utf-8", "surrogateescape")).hexdigest(length=16)


PARTIAL_STATE_FILES = ".sync/incoming/*.json"
"""How the state files of partial transfers are named in the state-file report (one label for all of them)."""


class PartialState(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """A partial transfer's state file (``.sync/incoming/<origin>/<key>.json``) as read back: the file's
    ``path``, the origin's ``seq``, and the manifest it was started for (``size`` bytes in blocks of
    ``block_size``, ``hashes`` hex)."""

    size: ByteCount
    block_size: Annotated[int, Meta(ge=1, le=MAX_BLOCK_BYTES)]
    hashes: Annotated[str, Meta(pattern=r"^(?:[0-9a-f]{64})*\Z")]
    path: Annotated[str, Meta(max_length=4096)] = ""
    seq: Counter = 0


def read_state(state: Path) -> PartialState | None:
    """The state file ``state`` decoded (:mod:`p2pnode.statefiles`); None when missing, or bad (counted in the
    data dir's report as ``.sync/incoming/*.json``: the transfer starts over)."""
    report = report_for(state.parent.parent.parent.parent)  # <data_dir>/.sync/incoming/<origin>/<key>.json
    raw = read_json_file(state, file=PARTIAL_STATE_FILES, report=report)
    if raw is None:
        return None
    try:
        return decode_entry(raw, PartialState)
    except ValueError as exc:
        report.drop(PARTIAL_STATE_FILES, "bad_entry", f"{state.name}: {exc}; the transfer starts over")
        return None


def load_state(state: Path) -> Manifest | None:
    """The manifest a partial file was started for, from its state file (None when missing or bad)."""
    d = read_state(state)
    return None if d is None else Manifest.build(d.size, d.block_size, bytes.fromhex(d.hashes))


def verify_on_disk(fd: int, m: Manifest, indices: list[int]) -> set[int]:
    """The blocks of ``indices`` whose bytes in ``fd`` match the manifest (a partial file after a restart)."""
    size = os.fstat(fd).st_size
    ok = set()
    for i in indices:
        n = m.block_len(i)
        if i * m.block_size + n > size:
            continue
        if hash_block(os.pread(fd, n, i * m.block_size)) == m.block_hash(i):
            ok.add(i)
    return ok


class Carried(msgspec.Struct):
    """What :func:`copy_blocks` carried into a partial file: ``blocks`` (indices), and of their bytes how many were
    ``cloned_bytes`` (shared by reflink: no data written) and ``copied_bytes`` (copied by the kernel)."""

    blocks: set[int] = msgspec.field(default_factory=set)
    cloned_bytes: int = 0
    copied_bytes: int = 0


def _runs(indices: list[int]) -> list[list[int]]:
    """``indices`` (ascending) as runs of consecutive blocks."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def copy_blocks(src: Path, fd: int, m: Manifest, indices: list[int], *, clone: bool = True) -> Carried:
    """Carry runs of blocks from the replica ``src`` into the partial file ``fd`` (same offsets): each run shared by
    reflink where the file system allows (:func:`~._reflink.clone_range`: no data written; ``clone`` False: never
    tried), else copied by the kernel (``copy_file_range``). The partial file must already have the manifest's
    size. Returns what was carried (an error is logged and ends the carrying: the blocks left are needed)."""
    out = Carried()
    try:
        sfd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return out
    try:
        for run in _runs(indices):
            off = run[0] * m.block_size
            length = sum(m.block_len(i) for i in run)
            if clone and clone_range(sfd, off, fd, off, length):
                out.cloned_bytes += length
                out.blocks.update(run)
                continue
            clone = False  # refused once: this pair of files copies (one refusal, not one per run)
            copied = 0
            while copied < length:
                n = os.copy_file_range(sfd, fd, length - copied, off + copied, off + copied)
                if n <= 0:
                    break
                copied += n
            out.copied_bytes += copied
            if copied == length:
                out.blocks.update(run)
    except OSError as exc:
        log.warning("sync: copying blocks from %s failed: %s", src, exc)
    finally:
        os.close(sfd)
    return out


def prehash(items: list[PushItem]) -> None:
    """Check every block against its item's manifest and note the good ones in ``prehashed`` (blocking,
    thread-safe: touches only the items)."""
    for it in items:
        m = it.manifest
        for index, data in it.blocks:
            if 0 <= index < m.blocks and len(data) == m.block_len(index) and hash_block(data) == m.block_hash(index):
                it.prehashed.add(index)


def check_block(t: Transfer, index: int, data: bytes | memoryview, prehashed: bool = False) -> None:
    """Raise :class:`SyncReject` (``block_out_of_range``, ``bad_block_length``, ``bad_block_hash``) unless
    ``data`` is block ``index`` of the transfer's manifest (``prehashed``: its hash was checked already)."""
    m = t.manifest
    if not (isinstance(index, int) and 0 <= index < m.blocks):
        raise SyncReject("block_out_of_range", f"block {index!r} of {m.blocks}")
    if len(data) != m.block_len(index) or len(data) > MAX_BLOCK_BYTES:
        raise SyncReject("bad_block_length", f"block {index}: {len(data)} bytes, expected {m.block_len(index)}")
    if not prehashed and hash_block(data) != m.block_hash(index):
        raise SyncReject("bad_block_hash", f"block {index} of {t.path!r} does not match its hash")


def _pwrite_all(fd: int, bufs: list[memoryview], off: int) -> None:
    """Write ``bufs`` back to back at ``off``: ``pwritev`` of at most :data:`IOV_MAX` buffers at a time, a short
    write finished with ``pwrite``."""
    for k in range(0, len(bufs), IOV_MAX):
        chunk = bufs[k:k + IOV_MAX]
        total = sum(len(v) for v in chunk)
        done = os.pwritev(fd, chunk, off)
        if done < total:  # short write: finish the rest
            flat = memoryview(b"".join(chunk))
            while done < total:
                done += os.pwrite(fd, flat[done:], off + done)
        off += total


def write_blocks(t: Transfer, blocks: list[tuple[int, bytes | memoryview]],
                 received: Callable[[int], None] | None = None) -> int:
    """Write verified blocks into the partial file: one ``pwritev`` per run of consecutive blocks (one system
    call, so one GIL hand-off, per request rather than per block; a run of more than :data:`IOV_MAX` blocks in
    several). Returns the bytes written; ``received(n)`` is told of each run as it is written. A full disk
    (:data:`NO_SPACE_ERRNOS`) raises ``SyncReject("no_space")``: the runs written before it stay verified, the
    rest are needed again."""
    bs = t.manifest.block_size
    blocks = sorted(blocks, key=lambda b: b[0])
    written = 0
    fd = os.open(t.part, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        run: list[tuple[int, bytes | memoryview]] = []
        for b in blocks + [(-2, b"")]:
            if run and b[0] != run[-1][0] + 1:
                with no_space_refused(f"writing {t.path!r}"):
                    _pwrite_all(fd, [memoryview(d) for _, d in run], run[0][0] * bs)
                n = 0
                for index, data in run:
                    t.verified.add(index)
                    t.read_back.discard(index)  # checked in memory before the write: the commit re-reads it
                    n += len(data)
                written += n
                if received is not None:
                    received(n)
                run = []
            run.append(b)
    finally:
        os.close(fd)
    return written


def verify_assembled(t: Transfer) -> tuple[set[int] | None, int]:
    """The blocks of the partial file that match the manifest, read from the file itself except those in
    ``read_back`` (None when the file has the wrong size or a block was never verified), and how many blocks
    were re-hashed. An ``OSError``/``ValueError`` is logged and gives None."""
    m = t.manifest
    todo = [i for i in range(m.blocks) if i not in t.read_back]
    try:
        if os.path.getsize(t.part) != m.size or not t.verified.issuperset(range(m.blocks)):
            return None, len(todo)
        if len(todo) > m.blocks // 2:  # most blocks: the whole file, hashed by several threads
            got = hash_file(t.part, block_size=m.block_size, size=m.size, mapped=True)  # ours: nobody truncates it
            return {i for i in range(m.blocks) if got.block_hash(i) == m.block_hash(i)}, len(todo)
        fd = os.open(t.part, os.O_RDONLY)
        try:
            return (set(range(m.blocks)) - set(todo)) | verify_on_disk(fd, m, todo), len(todo)
        finally:
            os.close(fd)
    except (OSError, ValueError) as exc:
        log.warning("sync: re-hashing %s failed: %s", t.part, exc)
        return None, len(todo)
