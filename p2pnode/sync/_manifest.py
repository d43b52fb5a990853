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

import os
import posixpath
import struct
from dataclasses import dataclass

import blake3

__all__ = [
    "BLOCK_HASH_BYTES",
    "MAX_BLOCK_BYTES",
    "MAX_PATH_BYTES",
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


@dataclass(frozen=True, slots=True)
class Manifest:
    """``size`` bytes in blocks of ``block_size`` bytes; ``hashes`` = 32 bytes per block; ``root`` = 32 bytes."""

    size: int
    block_size: int
    hashes: bytes
    root: bytes

    @classmethod
    def build(cls, size: int, block_size: int, hashes: bytes) -> Manifest:
        return cls(size, block_size, hashes, manifest_root(size, block_size, hashes))

    @property
    def blocks(self) -> int:
        return len(self.hashes) // BLOCK_HASH_BYTES

    def block_hash(self, i: int) -> bytes:
        return self.hashes[i * BLOCK_HASH_BYTES : (i + 1) * BLOCK_HASH_BYTES]

    def block_len(self, i: int) -> int:
        """Length in bytes of block ``i`` (the last one may be short)."""
        return min(self.block_size, self.size - i * self.block_size)

    def is_consistent(self) -> bool:
        """Block count matches size and block size, and the root matches the hashes."""
        want = -(-self.size // self.block_size) if self.block_size > 0 else -1
        return (
            self.size >= 0
            and 0 < self.block_size <= MAX_BLOCK_BYTES
            and len(self.hashes) == want * BLOCK_HASH_BYTES
            and self.root == manifest_root(self.size, self.block_size, self.hashes)
        )


def empty_manifest(block_size: int = MIN_BLOCK_BYTES) -> Manifest:
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


def hash_file(
    path: str | os.PathLike,
    *,
    block_size: int,
    size: int | None = None,
    prefix: Manifest | None = None,
) -> Manifest:
    """Hash ``path`` (blocking). ``size``: hash only the first ``size`` bytes (default: the file's size). ``prefix``:
    a manifest of an earlier, shorter state of an append-only file with the same block size; its full blocks are
    trusted and only the tail is read. Raises ``OSError``; ``ValueError`` when the file is shorter than ``size``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        total = os.fstat(fd).st_size if size is None else size
        hashes = bytearray()
        start = 0
        if prefix is not None and prefix.block_size == block_size and prefix.size <= total:
            full = prefix.size // block_size
            hashes += prefix.hashes[: full * BLOCK_HASH_BYTES]
            start = full
        buf = bytearray(block_size)
        view = memoryview(buf)
        i = start
        while i * block_size < total:
            want = min(block_size, total - i * block_size)
            got = os.preadv(fd, [view[:want]], i * block_size)
            if got != want:
                raise ValueError(f"{path}: file shorter than {total} bytes (changed while hashing?)")
            hashes += hash_block(view[:want])
            i += 1
        return Manifest.build(total, block_size, bytes(hashes))
    finally:
        os.close(fd)


class PathError(ValueError):
    """A replica path that is not a plain relative path (absolute, ``..``, empty or odd components, too long)."""


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
