"""Small crash-safe file helpers shared by the drivers (never used by pure cores)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["atomic_write_bytes", "open_beneath"]


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    Writes a temp file beside ``path`` with permissions ``mode``, fsyncs it, renames it over ``path``
    and fsyncs the directory. Raises ``OSError`` from the file system unchanged.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def open_beneath(base: Path, rel: str, *, size: int | None = None) -> int:
    """A read-only file descriptor of ``base/rel`` opened without following a symlink on any component of ``rel``
    (each directory opened ``O_NOFOLLOW`` relative to the one before, ``dir_fd``; the last one too), and only when
    it is a regular file (of ``size`` bytes when given). ``base`` itself is the caller's (trusted) directory;
    ``rel`` is relative, "/"-separated, without empty, ``.`` or ``..`` components. Raises ``OSError`` (``ELOOP``
    for a symlink, ``ENOTDIR``, ``ENOENT``, ``EINVAL`` for a bad ``rel``, not a regular file or another size)."""
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise OSError(22, f"not a safe relative path: {rel[:80]!r}")
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for p in parts[:-1]:
            nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
        ffd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        st = os.fstat(ffd)
        if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
            raise OSError(22, f"{rel[:80]!r} is not a regular file of {size} bytes")
    except BaseException:
        os.close(ffd)
        raise
    return ffd
