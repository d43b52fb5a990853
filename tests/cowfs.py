"""A receiver assembling versions of one file on a loop-mounted file system, its kernel write counter read around
each version (shared by ``tests/test_sync_reflink.py`` and ``bench/sync_reflink.py``).

:func:`loop_fs` makes and mounts a file system image (XFS with ``reflink=1``, or ext4) and removes it after;
:func:`why_no_loop_fs` says why that cannot be done here (not root, no ``mkfs.xfs``, no loop devices).

:func:`receive_versions` runs ``python tests/cowfs.py receive`` in a process of its own: a
:class:`~p2pnode.sync.ReplicaStore` under the data dir given, which receives each version of a file as a block
stream (the data channel's path: ``open_stream``, ``receive_stream``, ``finish_stream``; the blocks fed from a
thread of the same process, which only reads). Each version's bytes are a function of its :class:`Version`
(1 MiB segments of BLAKE3 output, some segments replaced), so no source file is written. Around each version the
process reads its own ``/proc/self/io`` (``write_bytes``: bytes this process caused to be written to storage,
counted as pages are dirtied). The result per version: those bytes, the seconds from opening the stream to the
commit, the store's counters, and the manifest's size and blocks.
:func:`check_replica` compares the replica with the version's bytes, byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import msgspec

SEGMENT_BYTES = 2**20
ORIGIN = "origin-node"
PATH = "models/big.bin"


class Version(msgspec.Struct, frozen=True):
    """A file's bytes: ``size`` bytes of 1 MiB segments, segment ``j`` the BLAKE3 output of ``(seed, j)``, or
    of ``(seed + 1, j)`` for the segments in ``changed``."""

    seed: int
    size: int
    changed: tuple[int, ...] = ()


class _Bytes:
    """Reads ranges of a :class:`Version` (the last segment generated is kept)."""

    def __init__(self, v: Version) -> None:
        self.v = v
        self._seg: tuple[int, bytes] | None = None

    def segment(self, j: int) -> bytes:
        if self._seg is None or self._seg[0] != j:
            seed = self.v.seed + (1 if j in self.v.changed else 0)
            h = blake3.blake3(seed.to_bytes(8, "little") + j.to_bytes(8, "little"))
            self._seg = (j, h.digest(length=SEGMENT_BYTES))
        return self._seg[1]

    def read(self, off: int, n: int) -> bytes:
        n = max(0, min(n, self.v.size - off))
        out = bytearray()
        while len(out) < n:
            pos = off + len(out)
            j, k = divmod(pos, SEGMENT_BYTES)
            out += self.segment(j)[k : k + n - len(out)]
        return bytes(out)


def manifest_of(v: Version, block_size: int):
    """The manifest of ``v``'s bytes at ``block_size``."""
    from p2pnode.synccore import Manifest, hash_block

    src = _Bytes(v)
    hashes = b"".join(hash_block(src.read(off, block_size)) for off in range(0, v.size, block_size))
    return Manifest.build(v.size, block_size, hashes)


def check_replica(replica: Path, v: Version) -> bool:
    """The file ``replica`` holds exactly ``v``'s bytes (compared byte for byte, 8 MiB at a time)."""
    if replica.stat().st_size != v.size:
        return False
    src = _Bytes(v)
    with open(replica, "rb") as fh:
        for off in range(0, v.size, 8 * SEGMENT_BYTES):
            if fh.read(8 * SEGMENT_BYTES) != src.read(off, 8 * SEGMENT_BYTES):
                return False
    return True


# -- file systems -------------------------------------------------------------------------------------------

def why_no_loop_fs(kind: str) -> str | None:
    """Why a loop-mounted ``kind`` (``xfs`` or ``ext4``) file system cannot be made here, None when it can."""
    if os.geteuid() != 0:
        return "not root: mounting a loop file system needs root"
    mkfs = f"mkfs.{kind}"
    if shutil.which(mkfs) is None:
        pkg = "xfsprogs" if kind == "xfs" else "e2fsprogs"
        return f"{mkfs} not found (package {pkg}; .ci/run installs it)"
    if shutil.which("mount") is None or shutil.which("losetup") is None:
        return "mount or losetup not found"
    if not Path("/dev/loop-control").exists():
        return "no loop devices here (/dev/loop-control missing)"
    try:
        if kind not in Path("/proc/filesystems").read_text().split():
            return f"the kernel has no {kind} file system"
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc}"
    return None


class LoopFsError(Exception):
    """The image could not be made or mounted (the reason in the message)."""


@contextlib.contextmanager
def loop_fs(kind: str, workdir: Path, size_bytes: int = 3 * 2**30) -> Iterator[Path]:
    """A ``kind`` file system (``xfs``: made with ``-m reflink=1``; ``ext4``) in a sparse image under ``workdir``,
    loop-mounted at ``workdir/<kind>.mnt`` for the block; unmounted, its loop device detached and the image
    removed after. Raises :class:`LoopFsError` when it cannot be made (see :func:`why_no_loop_fs`)."""
    why = why_no_loop_fs(kind)
    if why is not None:
        raise LoopFsError(why)
    img, mnt = workdir / f"{kind}.img", workdir / f"{kind}.mnt"
    with open(img, "wb") as fh:
        fh.truncate(size_bytes)
    mkfs = ["mkfs.xfs", "-q", "-f", "-m", "reflink=1"] if kind == "xfs" else ["mkfs.ext4", "-q", "-F"]
    try:
        r = subprocess.run([*mkfs, str(img)], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise LoopFsError(f"{mkfs[0]} failed: {r.stderr.strip()[:300]}")
        mnt.mkdir()
        r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise LoopFsError(f"mount -o loop failed: {r.stderr.strip()[:300]}")
        try:
            yield mnt
        finally:
            devs = subprocess.run(["losetup", "-j", str(img)], capture_output=True, text=True).stdout
            subprocess.run(["umount", str(mnt)], check=True, timeout=120)
            for line in devs.splitlines():  # `mount -o loop` sets autoclear; detach any left by name
                dev = line.split(":", 1)[0]
                if dev.startswith("/dev/loop"):
                    subprocess.run(["losetup", "-d", dev], capture_output=True)
    finally:
        if mnt.is_dir() and not os.path.ismount(mnt):
            mnt.rmdir()
        img.unlink(missing_ok=True)


# -- the receiver (in a process of its own) -------------------------------------------------------------------

def _write_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("no write_bytes in /proc/self/io")


def _receive(store, seq: int, v: Version, block_size: int) -> dict:
    from p2pnode.sync import PushItem

    m = manifest_of(v, block_size)
    item = PushItem(PATH, m, seq)
    src = _Bytes(v)
    before, t0 = _write_bytes(), time.perf_counter()
    counters = (store.bytes_received, getattr(store, "bytes_cloned", 0), getattr(store, "bytes_copied", 0))
    t = store.open_stream(ORIGIN, item)
    need = [i for i in range(m.blocks) if i not in t.verified]
    runs: list[tuple[int, int]] = []
    for i in need:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    a, b = socket.socketpair()
    a.setblocking(False)

    def feed() -> None:
        for first, count in runs:
            off = first * m.block_size
            end = min(m.size, (first + count) * m.block_size)
            while off < end:
                n = min(4 * SEGMENT_BYTES, end - off)
                b.sendall(src.read(off, n))
                off += n

    th = threading.Thread(target=feed)
    th.start()
    try:
        bad = store.receive_stream(t, runs, a.fileno(), timeout_s=60.0)
        out = store.finish_stream(t, True, bad)
    finally:
        th.join()
        a.close()
        b.close()
    written, seconds = _write_bytes() - before, time.perf_counter() - t0
    return {"status": out["status"], "size": m.size, "block_size": m.block_size, "blocks": m.blocks,
            "need_blocks": len(need), "need_bytes": sum(m.block_len(i) for i in need), "write_bytes": written,
            "seconds": round(seconds, 3),
            "received": store.bytes_received - counters[0], "cloned": getattr(store, "bytes_cloned", 0) - counters[1],
            "copied": getattr(store, "bytes_copied", 0) - counters[2]}


def receive_main(data_dir: str, versions_json: str) -> None:
    """``python tests/cowfs.py receive DATA_DIR VERSIONS``: receive each version (a JSON list of
    ``[seed, size, changed]``) in turn and print one JSON line of results per version."""
    from p2pnode.sync import ReplicaStore
    from p2pnode.synccore import block_size_for

    store = ReplicaStore(Path(data_dir), free_bytes=lambda: 2**50)
    bs = None
    for seq, (seed, size, changed) in enumerate(json.loads(versions_json), start=1):
        bs = block_size_for(size, previous=bs)
        res = _receive(store, seq, Version(seed, size, tuple(changed)), bs)
        print(json.dumps(res), flush=True)


def receive_versions(data_dir: Path, versions: list[Version], *, timeout_s: float = 600.0) -> list[dict]:
    """Run :func:`receive_main` in a new process (see module docstring); its results, one per version. Raises
    ``RuntimeError`` with its output when it fails."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    arg = json.dumps([[v.seed, v.size, list(v.changed)] for v in versions])
    r = subprocess.run([sys.executable, __file__, "receive", str(data_dir), arg], capture_output=True, text=True,
                       timeout=timeout_s, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"receiver failed ({r.returncode}): {r.stderr[-3000:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def replica_path(data_dir: Path) -> Path:
    """Where the receiver keeps the replica."""
    return data_dir / "replicas" / ORIGIN / PATH


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "receive":
        receive_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: python tests/cowfs.py receive DATA_DIR VERSIONS_JSON")
