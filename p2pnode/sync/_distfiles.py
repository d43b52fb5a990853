"""Published files on disk: the publisher's copies, subscribers' partial files and versions, the link switched by
rename, and the persisted floors. Blocking I/O (run in threads from trio).

Layout (``<data_dir>/.sync/dist/`` is ``state_dir``):

- ``state_dir/state.msgpack``: the version floor per name (the highest ever accepted) and the publications held,
  read back through their typed decoders (a bad entry is dropped and logged; a bad file, ignored: the agent starts);
- ``state_dir/files/<name>@<version>``: what this node published (a copy, so the source may change meanwhile);
- ``state_dir/partial/<name>@<version>.part``: a version being fetched (sparse until its blocks arrive);
- ``<subscribe_dir>/.versions/<name>@<version>``: verified versions (read-only, 0444); ``<subscribe_dir>/<name>``: a
  symbolic link to the current one, replaced by ``rename(2)``, so a reader sees the old version or the new one, never
  a mix.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from .._files import atomic_write_bytes
from ..statefiles import decimal
from ..synccore import (
    BLOCK_HASH_BYTES,
    Publication,
    PublicationRefused,
    check_publication_name,
    decode_publication,
    encode_publication,
    hash_block,
    hash_file,
)

__all__ = ["DistFiles", "Holding"]

log = logging.getLogger(__name__)

MAX_STATE_BYTES = 64 * 2**20


class _State(msgspec.Struct, frozen=True):
    floors: Annotated[dict[Annotated[str, Meta(max_length=255)], Annotated[int, Meta(ge=1, le=2**53)]],
                      Meta(max_length=4096)] = {}
    pubs: Annotated[list[bytes], Meta(max_length=4096)] = []


_STATE = msgspec.msgpack.Decoder(_State)


class Holding(msgspec.Struct):
    """A publication this node holds or fetches: its ``path`` on disk, the blocks it has (``have``; None: all),
    ``origin`` (this node published it)."""

    pub: Publication
    path: Path
    have: set[int] | None = None
    origin: bool = False

    def has(self, index: int) -> bool:
        """Block ``index`` is on disk here and verified."""
        return self.have is None or index in self.have


class DistFiles:
    """The files of distribution (module docstring). ``state_dir``: ``<data_dir>/.sync/dist``; ``subscribe_dir``:
    where versions appear."""

    def __init__(self, state_dir: Path, subscribe_dir: Path) -> None:
        self.state_dir = state_dir
        self.subscribe_dir = subscribe_dir
        self.dropped = 0

    def prepare(self) -> None:
        """Make the folders (at start, before anything is read or written)."""
        for d in (self.state_dir / "files", self.state_dir / "partial", self.subscribe_dir / ".versions"):
            d.mkdir(parents=True, exist_ok=True)

    # -- state -------------------------------------------------------------------------------------------------
    def load_state(self) -> tuple[dict[str, int], list[Publication]]:
        """The floors and the publications held, as persisted (empty when absent or unreadable)."""
        path = self.state_dir / "state.msgpack"
        try:
            raw = path.read_bytes()
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"{len(raw)} bytes")
            state = _STATE.decode(raw)
        except FileNotFoundError:
            return {}, []
        except (OSError, ValueError, msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            log.warning("sync: %s ignored (%s); distribution starts without its floors", path, exc)
            self.dropped += 1
            return {}, []
        pubs = []
        for blob in state.pubs:
            try:
                pubs.append(check_name(decode_publication(blob)))
            except PublicationRefused as exc:
                log.warning("sync: a held publication in %s dropped: %s", path, exc)
                self.dropped += 1
        floors = {}
        for name, v in state.floors.items():
            try:
                floors[check_publication_name(name)] = v
            except PublicationRefused:
                self.dropped += 1
        return floors, pubs

    def floors_on_disk(self) -> dict[str, int]:
        """The highest version per name that files on disk show: verified versions (``.versions/``), the current
        link's target and what this node published (``files/``). The floors are raised to these at
        load, so an unreadable ``state.msgpack`` never lets an older signed publication roll this node back."""
        out: dict[str, int] = {}

        def note(text: str) -> None:
            name, sep, num = text.rpartition("@")
            version = decimal(num, max_value=2**53) if sep else None
            try:
                if version is not None and version >= 1 and check_publication_name(name):
                    out[name] = max(out.get(name, 0), version)
            except PublicationRefused:
                pass

        for folder in (self.subscribe_dir / ".versions", self.state_dir / "files"):
            with contextlib.suppress(OSError):
                for f in folder.iterdir():
                    note(f.name)
        with contextlib.suppress(OSError):
            for f in self.subscribe_dir.iterdir():
                if f.is_symlink():
                    target = os.readlink(f)
                    if target.startswith(".versions/"):
                        note(target[len(".versions/"):])
        return out

    def save_state(self, floors: dict[str, int], pubs: list[Publication]) -> None:
        """Persist the floors and the publications held (atomically: write aside, fsync, rename)."""
        body = msgspec.msgpack.encode(_State(dict(floors), [encode_publication(p) for p in pubs]))
        atomic_write_bytes(self.state_dir / "state.msgpack", body)

    # -- paths -------------------------------------------------------------------------------------------------
    def published_path(self, pub: Publication) -> Path:
        return self.state_dir / "files" / f"{pub.name}@{pub.version}"

    def version_path(self, pub: Publication) -> Path:
        return self.subscribe_dir / ".versions" / f"{pub.name}@{pub.version}"

    def partial_path(self, pub: Publication) -> Path:
        return self.state_dir / "partial" / f"{pub.name}@{pub.version}.part"

    def link_path(self, name: str) -> Path:
        return self.subscribe_dir / check_publication_name(name)

    # -- the publisher -----------------------------------------------------------------------------------------
    def store_published(self, src: Path, pub: Publication) -> Path:
        """Copy ``src`` into this node's published files and check the copy against ``pub``'s manifest. Raises
        ``OSError``, ``ValueError`` (the copy does not hash to the publication's root: the file changed)."""
        dst = self.published_path(pub)
        tmp = dst.with_name(dst.name + ".tmp")
        with open(src, "rb") as fi, open(tmp, "wb") as fo:
            left = os.fstat(fi.fileno()).st_size
            while left > 0:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), min(left, 1 << 30))
                if n == 0:
                    break
                left -= n
            fo.flush()
            os.fchmod(fo.fileno(), 0o444)  # read-only: what is served is never changed in place
            os.fsync(fo.fileno())
        m = hash_file(tmp, block_size=pub.block_size)
        if m.root != pub.root:
            tmp.unlink(missing_ok=True)
            raise ValueError(f"{src} does not match the publication (changed since it was hashed?)")
        os.replace(tmp, dst)
        _fsync_dir(dst.parent)
        return dst

    # -- the subscriber ----------------------------------------------------------------------------------------
    def open_partial(self, pub: Publication) -> tuple[int, set[int]]:
        """The partial file of ``pub`` opened for writing (its fd) and the blocks already verified in it (a resume:
        each block of an existing partial file is hashed; a sparse hole hashes as zeros and is fetched again)."""
        path = self.partial_path(pub)
        existed = path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            have: set[int] = set()
            if existed and os.fstat(fd).st_size == pub.size:
                m = pub.manifest
                for i in range(m.blocks):
                    if hash_block(os.pread(fd, m.block_len(i), i * pub.block_size)) == m.block_hash(i):
                        have.add(i)
            else:
                os.ftruncate(fd, pub.size)
            return fd, have
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def write_block(fd: int, pub: Publication, index: int, data: bytes | memoryview) -> bool:
        """Write block ``index`` when ``data`` is its bytes (length and hash as the manifest says); False, writing
        nothing, when it is not."""
        m = pub.manifest
        if not 0 <= index < m.blocks or len(data) != m.block_len(index) or hash_block(data) != m.block_hash(index):
            return False
        os.pwrite(fd, data, index * pub.block_size)
        return True

    def commit(self, fd: int, pub: Publication) -> Path:
        """Every block is written and verified: fsync the partial file (``fd``, which the caller closes), rename it
        to its version, fsync the folder, and switch ``<subscribe_dir>/<name>`` to it (a new link renamed over the
        old one). The version is read-only (0444): a job reading it cannot change it for the others. Returns the
        version's path."""
        os.fchmod(fd, 0o444)
        os.fsync(fd)
        dst = self.version_path(pub)
        os.replace(self.partial_path(pub), dst)
        _fsync_dir(dst.parent)
        self.switch(pub)
        return dst

    def switch(self, pub: Publication) -> None:
        """Point ``<subscribe_dir>/<name>`` at ``pub``'s version (relative link, replaced by rename)."""
        link = self.link_path(pub.name)
        tmp = link.with_name(f".{pub.name}.link")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(f".versions/{pub.name}@{pub.version}", tmp)
        os.replace(tmp, link)
        _fsync_dir(link.parent)

    def relink(self, pub: Publication) -> bool:
        """Switch ``<subscribe_dir>/<name>`` to ``pub``'s verified version when it names another (or nothing): a
        node killed after a version's rename and before its switch comes back with the version held and the link
        old. True when it switched."""
        with contextlib.suppress(OSError):
            if os.readlink(self.link_path(pub.name)) == f".versions/{pub.name}@{pub.version}":
                return False
        self.switch(pub)
        return True

    def remove_version(self, name: str, version: int) -> None:
        """Remove a previous version (never the one the link points at)."""
        path = self.subscribe_dir / ".versions" / f"{check_publication_name(name)}@{version}"
        with contextlib.suppress(OSError):
            if os.readlink(self.link_path(name)) == f".versions/{name}@{version}":
                return
        path.unlink(missing_ok=True)

    def leftovers(self, held: list[Publication]) -> list[tuple[str, int]]:
        """The versions in ``.versions/`` that are not one of ``held`` (``(name, version)``), after removing the
        partial files of publications not held (superseded before a restart)."""
        keep = {f"{p.name}@{p.version}.part" for p in held}
        for f in (self.state_dir / "partial").iterdir():
            if f.name not in keep:
                f.unlink(missing_ok=True)
        current = {(p.name, p.version) for p in held}
        out = []
        for f in (self.subscribe_dir / ".versions").iterdir():
            name, sep, text = f.name.rpartition("@")
            version = decimal(text, max_value=2**53) if sep else None
            if version is not None and (name, version) not in current:
                out.append((name, version))
        return out

    def drop_partial(self, pub: Publication) -> None:
        self.partial_path(pub).unlink(missing_ok=True)


def check_name(pub: Publication) -> Publication:
    """``pub`` when its name is one path component (else :class:`PublicationRefused`) and its hashes whole."""
    check_publication_name(pub.name)
    if len(pub.hashes) % BLOCK_HASH_BYTES:
        raise PublicationRefused("bad_manifest", "hashes not a whole number of blocks")
    return pub


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
