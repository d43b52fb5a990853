"""Manifests: a file as fixed-size blocks with BLAKE3 hashes, a size and a root hash; replica path rules.

A :class:`Manifest` is ``(size, block_size, hashes, root)``: ``hashes`` is the concatenation of one 32-byte BLAKE3
digest per block (the last block may be short), ``root`` the BLAKE3 of a domain tag, the size, the block size and
the hashes. Two files with the same root hold the same bytes. An appended file changes only its tail blocks, so
:func:`changed_blocks` of two manifests is the new data.

Block sizes follow Syncthing's rule (``lib/protocol/blocksize.go``): the smallest power of two from a floor up to
16 MiB that keeps a file at or under 2,000 blocks; a file that grows keeps its block size while the rule's choice
stays within a factor of two of it, so appends do not re-block the whole file. SQLite copies use a 16 KiB floor
(pages are 4 KiB: a commit rewrites a few scattered pages); other files 128 KiB.

:func:`hash_file` is blocking I/O (run it in a thread from trio); everything else here is pure.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import posixpath
import struct
from concurrent.futures import ThreadPoolExecutor

import blake3
import msgspec

from ..errors import PathError  # defined in the error tree, re-exported here

__all__ = [
    "BLOCK_HASH_BYTES",
    "MAX_BLOCK_BYTES",
    "MAX_PATH_BYTES",
    "MIN_BLOCK_BYTES",
    "SQLITE_MIN_BLOCK_BYTES",
    "Manifest",
    "PathError",
    "block_size_for",
    "changed_blocks",
    "check_rel_path",
    "hash_block",
    "hash_file",
    "manifest_root",
    "SQLITE_MAGIC",
]

BLOCK_HASH_BYTES = 32
MIN_BLOCK_BYTES = 128 * 1024
SQLITE_MIN_BLOCK_BYTES = 16 * 1024
MAX_BLOCK_BYTES = 16 * 2**20
DESIRED_BLOCKS_PER_FILE = 2000
MAX_PATH_BYTES = 1024
SQLITE_MAGIC = b"SQLite format 3\x00"
_ROOT_TAG = b"p2pnode-manifest-v1\x00"


def hash_block(data: bytes | memoryview) -> bytes:
    """BLAKE3-256 of one block (32 bytes)."""
    return blake3.blake3(data).digest()


def manifest_root(size: int, block_size: int, hashes: bytes) -> bytes:
    """The root hash of a manifest (32 bytes): BLAKE3 over a tag, ``size`` (u64), ``block_size`` (u32), hashes."""
    return blake3.blake3(_ROOT_TAG + struct.pack("<QI", size, block_size) + hashes).digest()


def block_size_for(size: int, *, floor: int = MIN_BLOCK_BYTES, previous: int | None = None) -> int:
    """Block size in bytes for a file of ``size`` bytes (Syncthing's rule, see module docstring). ``previous``:
    the block size the file had before it grew; kept while the new choice is within a factor of two of it."""
    bs = floor
    while bs < MAX_BLOCK_BYTES and size > DESIRED_BLOCKS_PER_FILE * bs:
        bs *= 2
    if previous is not None and floor <= previous <= MAX_BLOCK_BYTES and previous // 2 <= bs <= previous * 2:
        return previous
    return bs


class Manifest(msgspec.Struct, frozen=True):
    """``size`` bytes in blocks of ``block_size`` bytes; ``hashes`` = 32 bytes per block; ``root`` = 32 bytes."""

    size: int
    block_size: int
    hashes: bytes
    root: bytes

    @classmethod
    def build(cls, size: int, block_size: int, hashes: bytes) -> Manifest:
        """The manifest of ``size`` bytes in blocks of ``block_size`` with these block ``hashes``, its root
        computed (:func:`manifest_root`). Consistency is not checked here: see :meth:`is_consistent`."""
        return cls(size, block_size, hashes, manifest_root(size, block_size, hashes))

    @property
    def blocks(self) -> int:
        """Number of blocks (one 32-byte hash each)."""
        return len(self.hashes) // BLOCK_HASH_BYTES

    def block_hash(self, i: int) -> bytes:
        """The 32-byte BLAKE3 hash of block ``i`` (empty beyond the last block)."""
        return self.hashes[i * BLOCK_HASH_BYTES : (i + 1) * BLOCK_HASH_BYTES]

    def block_len(self, i: int) -> int:
        """Length in bytes of block ``i`` (the last one may be short)."""
        return min(self.block_size, self.size - i * self.block_size)

    def is_consistent(self) -> bool:
        """Block count matches size and block size, the block size is a power of two (every size
        :func:`block_size_for` picks is one; a receiver shares blocks by reflink only at file system block
        boundaries, which powers of two from 4 KiB meet), and the root matches the hashes."""
        want = -(-self.size // self.block_size) if self.block_size > 0 else -1
        return (
            self.size >= 0
            and 0 < self.block_size <= MAX_BLOCK_BYTES
            and self.block_size & (self.block_size - 1) == 0
            and len(self.hashes) == want * BLOCK_HASH_BYTES
            and self.root == manifest_root(self.size, self.block_size, self.hashes)
        )


def empty_manifest(block_size: int = MIN_BLOCK_BYTES) -> Manifest:
    """The manifest of an empty file (no blocks) at ``block_size`` bytes per block."""
    return Manifest.build(0, block_size, b"")


def changed_blocks(old: Manifest | None, new: Manifest) -> list[int]:
    """Indices of ``new``'s blocks whose bytes ``old`` does not hold at the same index (all of them when the block
    sizes differ or ``old`` is None)."""
    if old is None or old.block_size != new.block_size:
        return list(range(new.blocks))
    out = []
    for i in range(new.blocks):
        if i >= old.blocks or old.block_hash(i) != new.block_hash(i) or old.block_len(i) != new.block_len(i):
            out.append(i)
    return out


PARALLEL_HASH_BYTES = 64 * 2**20
"""Files at least this large are hashed by several threads (BLAKE3 and ``preadv`` release the GIL)."""
HASH_WORKERS = 2
_READ_BYTES = 8 * 2**20


def _hash_range(fd: int, path: object, block_size: int, total: int, first: int, end: int,
                view: memoryview | None) -> bytes:
    """Hashes of blocks ``first``..``end - 1``: from ``view`` (a mapping of the file) or read with ``preadv``."""
    out = bytearray()
    if view is not None:
        for i in range(first, end):
            out += hash_block(view[i * block_size : min(total, (i + 1) * block_size)])
        return bytes(out)
    per = max(1, _READ_BYTES // block_size)
    buf = memoryview(bytearray(per * block_size))
    i = first
    while i < end:
        n = min(per, end - i)
        want = min(n * block_size, total - i * block_size)
        got = os.preadv(fd, [buf[:want]], i * block_size)
        if got != want:
            raise ValueError(f"{path}: file shorter than {total} bytes (changed while hashing?)")
        for k in range(n):
            out += hash_block(buf[k * block_size : min(want, (k + 1) * block_size)])
        i += n
    return bytes(out)


def hash_file(
    path: str | os.PathLike,
    *,
    block_size: int,
    size: int | None = None,
    prefix: Manifest | None = None,
    mapped: bool = False,
) -> Manifest:
    """Hash ``path`` (blocking). ``size``: hash only the first ``size`` bytes (default: the file's size). ``prefix``:
    a manifest of an earlier, shorter state of an append-only file with the same block size; its full blocks are
    trusted and only the tail is read. Files of :data:`PARALLEL_HASH_BYTES` or more are hashed by
    :data:`HASH_WORKERS` threads over disjoint block ranges. ``mapped``: read through ``mmap`` (no copy; only for
    files nobody else can truncate meanwhile, a mapping of a shrunk file faults). Raises ``OSError``;
    ``ValueError`` when the file is shorter than ``size``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        total = os.fstat(fd).st_size if size is None else size
        if mapped and os.fstat(fd).st_size < total:
            raise ValueError(f"{path}: file shorter than {total} bytes")
        hashes = b""
        start = 0
        if prefix is not None and prefix.block_size == block_size and prefix.size <= total:
            start = prefix.size // block_size
            hashes = prefix.hashes[: start * BLOCK_HASH_BYTES]
        blocks = -(-total // block_size)
        workers = HASH_WORKERS if (blocks - start) * block_size >= PARALLEL_HASH_BYTES else 1
        bounds = [start + (blocks - start) * k // workers for k in range(workers + 1)]
        mm = mmap.mmap(fd, total, prot=mmap.PROT_READ) if mapped and total > 0 else None
        try:
            with memoryview(mm) if mm is not None else contextlib.nullcontext() as view:
                if workers == 1:
                    parts = [_hash_range(fd, path, block_size, total, start, blocks, view)]
                else:
                    with ThreadPoolExecutor(workers, thread_name_prefix="p2pnode-hash") as ex:
                        parts = list(ex.map(lambda k: _hash_range(fd, path, block_size, total, bounds[k],
                                                                  bounds[k + 1], view), range(workers)))
        finally:
            if mm is not None:
                mm.close()
        return Manifest.build(total, block_size, hashes + b"".join(parts))
    finally:
        os.close(fd)


def check_rel_path(path: str) -> str:
    """Validate a path relative to a sync root (POSIX separators) and return it normalised. Raises
    :class:`PathError` for absolute paths, ``..`` or ``.`` components, empty components, NUL or backslash,
    control characters, components over 255 bytes or paths over :data:`MAX_PATH_BYTES` bytes."""
    if not isinstance(path, str) or not path:
        raise PathError("empty path")
    raw = path.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_PATH_BYTES:
        raise PathError(f"path of {len(raw)} bytes exceeds {MAX_PATH_BYTES}")
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise PathError(f"path {path!r} is absolute or has a backslash or NUL")
    if any(ord(c) < 32 for c in path):
        raise PathError(f"path {path!r} has a control character")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise PathError(f"path {path!r} has an empty, '.' or '..' component")
        if len(part.encode("utf-8", "surrogateescape")) > 255:
            raise PathError(f"path {path!r} has a component over 255 bytes")
    norm = posixpath.normpath(path)
    if norm != path:
        raise PathError(f"path {path!r} is not normalised")
    return path
