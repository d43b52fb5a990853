"""Reflinks: one file's extents shared into another (``FICLONE`` / ``FICLONERANGE``), where the file system allows.

On a copy-on-write file system (XFS made with ``reflink=1``, the default since xfsprogs 5.1; btrfs; bcachefs) a
range of one file can be made to share the other file's blocks on disk: no data is read or written, only
extent metadata, and a later write to either file copies just the block it touches. The receiver assembles a new
version of a replica this way (:func:`p2pnode.sync._partial.copy_blocks`): the unchanged blocks are cloned from
the current replica, only the changed ones are written, so a version costs writes proportional to the change.

Rules (``ioctl_ficlonerange(2)``): both files on the same mounted file system; offsets and length multiples of the
file system's block size, except that a range may end at the source's end of file when it also ends at or past
the destination's. :func:`clone_range` checks the alignment itself (an unaligned range is not tried) and returns
False when the file system cannot clone (``EOPNOTSUPP``/``ENOTTY``: ext4, tmpfs; ``EXDEV``: another file system;
``EINVAL``: a range it refuses, e.g. a file system made without reflink): the caller copies instead. Any other
error (``ENOSPC``, ``EIO``, ``EBADF``) is raised as :class:`OSError`. Blocking I/O.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import tempfile
from pathlib import Path

__all__ = ["FICLONE", "FICLONERANGE", "can_clone", "clone_block_bytes", "clone_file", "clone_range",
           "same_fs"]

FICLONE = 0x40049409
"""``_IOW(0x94, 9, int)`` (``linux/fs.h``): clone all of the source file into the destination."""
FICLONERANGE = 0x4020940D
"""``_IOW(0x94, 13, struct file_clone_range)`` (``linux/fs.h``): clone a range."""
_RANGE = struct.Struct("=qQQQ")  # struct file_clone_range {s64 src_fd; u64 src_offset, src_length, dest_offset}

CANNOT_CLONE = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS})
"""Errors meaning "this file system, or this pair of files, cannot share blocks": the caller copies instead."""


def clone_block_bytes(fd: int | Path) -> int:
    """The block size (bytes) clone offsets and lengths must be multiples of on the file system of ``fd`` (an open
    file, or a path there) (``statvfs`` ``f_frsize``; 4,096 on XFS and btrfs as usually made)."""
    st = os.statvfs(fd)
    return st.f_frsize or st.f_bsize or 4096


def clone_file(src_fd: int, dst_fd: int) -> bool:
    """Make ``dst_fd``'s file share all of ``src_fd``'s blocks (``FICLONE``; the destination's content is
    replaced and its size becomes the source's). False when the file system cannot (see module docstring; the
    destination is unchanged then). Raises ``OSError`` for other errors."""
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
    except OSError as exc:
        if exc.errno in CANNOT_CLONE:
            return False
        raise
    return True


def clone_range(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, length: int) -> bool:
    """Make ``length`` bytes of ``dst_fd`` at ``dst_offset`` share the blocks of ``src_fd`` at ``src_offset``
    (``FICLONERANGE``). The offsets must be multiples of :func:`clone_block_bytes` and so must ``length``, unless
    the range ends at the source's end of file and at or past the destination's; otherwise nothing is tried and
    the answer is False, as it is when the file system cannot clone (see module docstring). ``length`` 0 does
    nothing (True). Raises ``OSError`` for other errors (nothing is cloned then)."""
    if length <= 0:
        return True
    if src_offset < 0 or dst_offset < 0:
        raise ValueError(f"negative offset {src_offset}, {dst_offset}")
    bs = clone_block_bytes(dst_fd)
    if src_offset % bs or dst_offset % bs:
        return False
    if length % bs:
        src_size, dst_size = os.fstat(src_fd).st_size, os.fstat(dst_fd).st_size
        if src_offset + length != src_size or dst_offset + length < dst_size:
            return False
    try:
        fcntl.ioctl(dst_fd, FICLONERANGE, _RANGE.pack(src_fd, src_offset, length, dst_offset))
    except OSError as exc:
        if exc.errno in CANNOT_CLONE:
            return False
        raise
    return True


def can_clone(directory: Path) -> bool:
    """Whether files in ``directory`` can share blocks (a 4 KiB file cloned into another there, both removed).
    False when they cannot or the probe fails (``OSError``: the directory is not writable, the disk is full)."""
    a = b = -1
    names: list[str] = []
    try:
        a, name = tempfile.mkstemp(prefix=".clone-probe-", dir=directory)
        names.append(name)
        os.write(a, bytes(4096))
        b, name = tempfile.mkstemp(prefix=".clone-probe-", dir=directory)
        names.append(name)
        return clone_file(a, b)
    except OSError:
        return False
    finally:
        for fd in (a, b):
            if fd >= 0:
                os.close(fd)
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(name)


def same_fs(a: Path, b: Path) -> bool:
    """``a`` and ``b`` are on one mounted file system (same ``st_dev``; False when either cannot be stat'ed)."""
    try:
        return os.stat(a).st_dev == os.stat(b).st_dev
    except OSError:
        return False
