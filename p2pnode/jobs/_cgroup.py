"""Per-job memory cgroups: the runner's one boundary to the kernel's cgroup file systems.

:func:`detect` finds the memory *controller* (not merely a cgroup mount: a host may mount an empty cgroup2 at
``/sys/fs/cgroup/unified`` and have the memory controller on v1 at ``/sys/fs/cgroup/memory``):

* **v2**: a ``cgroup2`` mount whose ``cgroup.controllers`` lists ``memory``. Jobs go under ``p2pnode-jobs`` in
  the agent's own cgroup when the memory controller can be enabled for its children there, else under the root.
  v2 forbids enabling controllers for the children of a cgroup that holds processes ("no internal processes"), and
  a systemd unit with ``Delegate=yes`` starts the agent in the unit's own cgroup: there the agent first moves
  itself into a leaf, ``p2pnode-agent``, beside ``p2pnode-jobs`` (what systemd's delegation documentation asks of
  a service that manages its own subtree), then enables the controller. Per job: ``memory.max`` = the limit,
  ``memory.swap.max`` = 0, ``memory.oom.group`` = 1 (an OOM kill takes the whole job); the kill shows as
  ``oom_kill`` in ``memory.events``.
* **v1**: a ``cgroup`` mount with the ``memory`` option. Jobs go under ``p2pnode-jobs`` in the agent's own memory
  cgroup (v1 nests freely). Per job: ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where swap
  accounting exists); the kill shows as ``oom_kill`` in ``memory.oom_control``.

The child process joins its cgroup itself between fork and exec (:meth:`MemoryCgroups.join_file`), so every
process the job starts is inside from its first instruction. Without a usable controller (or without the right
to create cgroups) :func:`detect` returns None and the runner's RSS watchdog is the only limit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ..inputs import decimal

__all__ = ["CgroupFs", "MemoryCgroups", "detect", "enforcement"]

log = logging.getLogger(__name__)
JOBS_DIR = "p2pnode-jobs"
AGENT_LEAF = "p2pnode-agent"
"""The leaf cgroup (v2) the agent moves itself into when its own cgroup must hand the memory controller to the
job cgroups beside it."""


class MemoryCgroups(Protocol):
    """What the runner needs of per-job memory cgroups (a fake in tests)."""

    version: int

    def create(self, name: str, limit_bytes: int) -> str:
        """Create cgroup ``name`` with a memory limit of ``limit_bytes``; its path. Raises ``OSError``."""
        ...

    def join_file(self, path: str) -> str:
        """The file a process writes its pid into to join cgroup ``path``."""
        ...

    def holds(self, path: str, pid: int) -> bool:
        """Whether ``pid`` is in cgroup ``path``."""
        ...

    def oom_kills(self, path: str) -> int:
        """How many processes the kernel killed in cgroup ``path`` for its memory limit."""
        ...

    def peak_bytes(self, path: str) -> int:
        """The highest memory use of cgroup ``path`` in bytes: v2 ``memory.peak`` (Linux 5.19+) or v1
        ``memory.max_usage_in_bytes``; where the kernel keeps no peak, the current use (``memory.current``), so
        sampling it now and then approximates the peak; 0 when unknown."""
        ...

    def remove(self, path: str) -> bool:
        """Remove cgroup ``path`` (once it holds no process); True when it is gone."""
        ...

    def release(self) -> None:
        """Remove the directory the job cgroups were made in, if no job cgroup is left in it (the agent stops)."""
        ...

    def sweep(self, keep: set[str]) -> int:
        """Remove the job cgroups not in ``keep`` (paths) that hold no process (left by jobs that ended while
        the agent was down); how many were removed."""
        ...


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _keyed(text: str, key: str) -> int:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return decimal(parts[1]) or 0
    return 0


class CgroupFs(msgspec.Struct):
    """Per-job memory cgroups under ``base`` (a directory of a cgroup ``version`` 1 or 2 hierarchy); ``moved_to``:
    the leaf cgroup the agent moved itself into to get there (v2 under a delegated systemd unit), else ''."""

    version: int
    base: Path
    moved_to: str = ""

    def create(self, name: str, limit_bytes: int) -> str:
        path = self.base / name
        path.mkdir(exist_ok=True)
        if self.version == 2:
            (path / "memory.max").write_text(str(limit_bytes))
            for f, v in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (path / f).exists():
                    (path / f).write_text(v)
        else:
            (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            if (path / "memory.memsw.limit_in_bytes").exists():
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        return str(path)

    def join_file(self, path: str) -> str:
        return str(Path(path) / "cgroup.procs")

    def holds(self, path: str, pid: int) -> bool:
        return str(pid) in _read(Path(path) / "cgroup.procs").split()

    def oom_kills(self, path: str) -> int:
        p = Path(path)
        if self.version == 2:
            return _keyed(_read(p / "memory.events"), "oom_kill")
        return _keyed(_read(p / "memory.oom_control"), "oom_kill")

    def peak_bytes(self, path: str) -> int:
        text = _read(Path(path) / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")).strip()
        if not text and self.version == 2:
            text = _read(Path(path) / "memory.current").strip()
        return decimal(text) or 0

    def remove(self, path: str) -> bool:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def release(self) -> None:
        if self.base.name != JOBS_DIR:
            self.remove(str(self.base))

    def sweep(self, keep: set[str]) -> int:
        try:
            dirs = [d for d in self.base.iterdir() if d.is_dir()]
        except OSError:
            return 0
        return sum(1 for d in dirs if str(d) not in keep and self.remove(str(d)))


def _mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """``(fstype, mount point, root within the hierarchy, super options)`` of each cgroup mount."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 3 or r[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((r[0], f[4].replace("\\040", " "), f[3], set(r[2].split(","))))
    return out


def _own(proc_cgroup: str, v1_controller: str | None) -> str:
    """This process's cgroup path in the v2 hierarchy (``v1_controller`` None) or in the v1 hierarchy of
    ``v1_controller``."""
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        if v1_controller is None and hid == "0" and ctrls == "":
            return path
        if v1_controller is not None and v1_controller in ctrls.split(","):
            return path
    return "/"


def _under(mount: str, mount_root: str, own: str) -> Path:
    rel = own
    if mount_root != "/" and (own == mount_root or own.startswith(mount_root + "/")):
        rel = own[len(mount_root):]
    return Path(mount) / rel.lstrip("/")


Write = Callable[[Path, str], None]
"""How a cgroup control file is written (the kernel's answer is an ``OSError``); tests pass a fake kernel."""


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _enable_memory(cgroup_dir: Path, write: Write) -> bool:
    ctl = cgroup_dir / "cgroup.subtree_control"
    if "memory" in _read(ctl).split():
        return True
    try:
        write(ctl, "+memory")  # the kernel refuses (EBUSY, EACCES, ...) what it will not do
    except OSError:
        return False
    return True


def _enter_leaf(own: Path, write: Write) -> Path | None:
    """Move this process from ``own`` into ``own/p2pnode-agent`` (v2), so that ``own`` holds no process and may
    enable controllers for its children; the leaf, or None when the kernel refuses (``own`` not delegated to us)."""
    leaf = own / AGENT_LEAF
    try:
        leaf.mkdir(exist_ok=True)
        write(leaf / "cgroup.procs", str(os.getpid()))
    except OSError as exc:
        log.info("cgroup v2: cannot move the agent into %s (%s): job cgroups go elsewhere or not at all", leaf, exc)
        return None
    return leaf


DELEGATED_ENV = "P2PNODE_CGROUP_DELEGATED"
"""Set to ``1`` by a unit with ``Delegate=yes`` (``deploy/p2pnode.service``): its cgroup is the agent's to manage."""


def delegated(path: Path) -> bool:
    """Whether this agent may change the cgroup ``path`` (enable controllers, create children, move itself) without
    stepping on systemd's tree: when it is not root (the kernel then allows only what was delegated to its user),
    when systemd is not the init (``/run/systemd/system`` absent: a container, another init), when systemd marked
    ``path`` delegated (xattr ``trusted.delegate`` or ``user.delegate`` = ``1``, systemd 251 and later), or when the
    unit says so (:data:`DELEGATED_ENV`). Root in a unit or session scope without ``Delegate=yes`` is refused:
    systemd owns those cgroups and would undo, or trip over, what the agent changed (systemd's "Control Group
    APIs and Delegation")."""
    if os.geteuid() != 0 or not Path("/run/systemd/system").is_dir() or os.environ.get(DELEGATED_ENV) == "1":
        return True
    for attr in ("trusted.delegate", "user.delegate"):
        try:
            if os.getxattr(path, attr).strip() == b"1":
                return True
        except OSError:
            continue
    return False


def _v2_base(parent: Path, node_dir: str, write: Write) -> Path | None:
    """``parent/p2pnode-jobs[/node_dir]`` with the memory controller enabled down to it, or None."""
    base = parent / JOBS_DIR
    try:
        if not _enable_memory(parent, write):
            return None
        base.mkdir(exist_ok=True)
        if not _enable_memory(base, write):
            return None
        if node_dir:
            base = base / node_dir
            base.mkdir(exist_ok=True)
            if not _enable_memory(base, write):
                return None
    except OSError:
        return None
    return base


def detect(*, mountinfo: Path = Path("/proc/self/mountinfo"), proc_cgroup: Path = Path("/proc/self/cgroup"),
           node_dir: str = "", write: Write = _write, move: bool = True,
           may_change: Callable[[Path], bool] = delegated) -> CgroupFs | None:
    """Per-job memory cgroups this agent can create (see module docstring), under ``p2pnode-jobs/<node_dir>``
    when ``node_dir`` is given (several agents on one host keep apart); None when there are none. On v2 it may
    move this process into a leaf of its own cgroup first (``moved_to``; not with ``move`` False: jobs left running
    across an agent restart, ``scheduler.on_agent_stop = "leave"``, would keep controllers enabled in the unit's
    cgroup, and systemd cannot start the next agent there); ``write`` writes control files. On v2 nothing is
    changed in a cgroup ``may_change`` refuses (:func:`delegated`)."""
    mounts = _mounts(_read(mountinfo))
    own_text = _read(proc_cgroup)
    for fstype, point, root, _opts in mounts:
        if fstype != "cgroup2" or "memory" not in _read(Path(point) / "cgroup.controllers").split():
            continue
        top = Path(point)
        own = _under(point, root, _own(own_text, None))
        if own != top and may_change(own):
            base = _v2_base(own, node_dir, write)
            if base is not None:
                return CgroupFs(2, base)
            if move and _read(own / "cgroup.procs").split() and (leaf := _enter_leaf(own, write)) is not None:
                base = _v2_base(own, node_dir, write)
                if base is not None:
                    log.info("cgroup v2: moved the agent into %s so that job cgroups get the memory controller",
                             leaf)
                    return CgroupFs(2, base, moved_to=str(leaf))
        base = _v2_base(top, node_dir, write) if may_change(top) else None
        if base is not None:
            return CgroupFs(2, base)
    for fstype, point, root, opts in mounts:
        if fstype != "cgroup" or "memory" not in opts:
            continue
        base = _under(point, root, _own(own_text, "memory")) / JOBS_DIR
        if node_dir:
            base = base / node_dir
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(base, os.W_OK):
            return CgroupFs(1, base)
    return None


def enforcement(cg: MemoryCgroups | None) -> dict[str, Any]:
    """How per-job memory limits are enforced here, as found at start (``/guard`` ``memory_enforcement``,
    ``p2pnode guard``): ``mode`` ``cgroup v2``, ``cgroup v1`` or ``watchdog`` (the runner samples each job's RSS and
    stops it past its limit), ``base`` (where job cgroups go), ``moved_to`` (v2: the leaf the agent moved into)."""
    if cg is None:
        return {"mode": "watchdog", "base": None, "moved_to": None,
                "why": "no memory cgroup controller this agent may use (v2 memory.max in a cgroup delegated to it, "
                       "or v1 memory): each job's RSS is sampled and the job stopped past its limit"}
    base, moved = getattr(cg, "base", None), getattr(cg, "moved_to", "")
    return {"mode": f"cgroup v{cg.version}", "base": str(base) if base else None, "moved_to": moved or None,
            "why": "the kernel enforces each job's memory_gib (memory.max)" if cg.version == 2 else
                   "the kernel enforces each job's memory_gib (memory.limit_in_bytes)"}
