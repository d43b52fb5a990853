"""Pressure stall information (PSI): how much work waits for a resource, as Linux reports it (kernel 4.20+,
``Documentation/accounting/psi.rst``), and which files to read it from. Pure: the text is handed in; the sampler
(:class:`p2pnode.probes.ResourceSampler`) reads the files.

A PSI file (``/proc/pressure/cpu``, ``memory``, ``io``, or a cgroup v2 directory's ``cpu.pressure`` ...) holds one
or two lines::

    some avg10=1.53 avg60=0.87 avg300=0.31 total=20118745
    full avg10=0.00 avg60=0.00 avg300=0.00 total=0

``some``: the share of wall time in which at least one task waited for the resource; ``full``: in which all
non-idle tasks did at once (for CPU at the system level ``full`` is always 0, and older kernels omit it).
``avgN`` are percentages (0-100) averaged over the last N seconds; ``total`` is cumulative microseconds. This is
what systemd-oomd and kubelet's PSI node conditions read.

:func:`decode_stall` is the one typed decoder of that text: bounded (:data:`MAX_PSI_BYTES`), every value checked
(``avgN`` plain digits with an optional fraction, 0-100; ``total`` plain digits, 0..2^63-1; no sign,
exponent or underscore; a field of another name, one a later kernel may add, is ignored), and every rejection a
:class:`StallRejected` with a reason from :data:`STALL_REJECTIONS`, which the sampler counts; it never raises
anything else. :func:`pressure_dir` chooses the directory: inside a container the container's own cgroup
(its ``cpu.pressure`` counts the container's tasks only), elsewhere ``/proc/pressure`` (the host's).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Annotated

import msgspec

from ..errors import P2PNodeError

__all__ = ["MAX_PSI_BYTES", "PSI_RESOURCES", "STALL_REJECTIONS", "PressureStall", "ResourceStall",
           "StallAverages", "StallRejected", "cgroup2_mount", "decode_stall", "in_container", "pressure_dir",
           "pressure_files"]

MAX_PSI_BYTES = 1024
"""Bytes of one PSI file read at most (a real one is under 120)."""
PSI_RESOURCES = ("cpu", "memory", "io")
STALL_REJECTIONS = ("too_long", "not_text", "garbage", "truncated", "duplicate", "out_of_range", "unreadable")
"""Why a PSI file was rejected: longer than :data:`MAX_PSI_BYTES`; not ASCII text; a line that is not
``kind key=value ...``; a ``some`` line or a field missing; a kind given twice; a value that is not a finite number
in range (NaN, inf, huge, negative); the file could not be read (the sampler's)."""

_FIELDS = ("avg10", "avg60", "avg300", "total")
_KEY = re.compile(r"[a-z][a-z0-9_]{0,31}")
"""A field's name: the known ones (:data:`_FIELDS`) are read, another (one a later kernel adds) is ignored."""
_AVG = re.compile(r"[0-9]{1,3}(\.[0-9]{1,6})?")
"""An ``avgN`` value as the kernel prints it (``%lu.%02lu``): digits only, no sign, exponent or underscore
(``float()`` would take ``1_0.0``, ``1e1`` and ``nan``)."""
_TOTAL = re.compile(r"[0-9]{1,20}")
_SIGNED = re.compile(r"[+-]?[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")
"""A number that is well formed but outside what :data:`_AVG` / :data:`_TOTAL` take (a sign, an exponent, too many
digits): rejected as ``out_of_range``, not ``garbage``."""
_SIGNED_INT = re.compile(r"[+-]?[0-9]+")
Percent = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]
Micros = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class StallAverages(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One PSI line: the share of time (percent, 0-100) in which tasks waited, averaged over 10, 60 and 300 s, and
    the total wait in microseconds since boot (or since the cgroup was made)."""

    avg10: Percent
    avg60: Percent
    avg300: Percent
    total: Micros


class ResourceStall(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One resource's PSI file: ``some`` (at least one task waited) and ``full`` (all non-idle tasks waited at
    once; None where the kernel omits it, e.g. CPU before Linux 5.13)."""

    some: StallAverages
    full: StallAverages | None = None


class PressureStall(msgspec.Struct, frozen=True):
    """PSI of CPU, memory and I/O read at one sample (None: that file was absent or rejected), and ``source``: the
    directory read (``/proc/pressure`` or a cgroup's)."""

    cpu: ResourceStall | None = None
    memory: ResourceStall | None = None
    io: ResourceStall | None = None
    source: str = ""

    def of(self, resource: str) -> ResourceStall | None:
        """The stall of ``resource`` (``cpu``, ``memory`` or ``io``), or None."""
        return getattr(self, resource) if resource in PSI_RESOURCES else None

    def avg10(self, resource: str, kind: str) -> float | None:
        """``avg10`` (percent) of ``resource``'s ``kind`` line (``some`` or ``full``), or None when not read."""
        r = self.of(resource)
        line = None if r is None else r.some if kind == "some" else r.full if kind == "full" else None
        return None if line is None else line.avg10

    def to_dict(self) -> dict[str, object]:
        """JSON-ready: ``source`` and, per resource read, its ``some`` and ``full`` lines."""
        return {"source": self.source, **{r: msgspec.to_builtins(self.of(r)) for r in PSI_RESOURCES}}


class StallRejected(P2PNodeError, ValueError):
    """A PSI file this decoder refuses; ``reason`` is one of :data:`STALL_REJECTIONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}" if detail else reason)


def decode_stall(data: bytes) -> ResourceStall:
    """Decode one PSI file's bytes into a :class:`ResourceStall`. Raises :class:`StallRejected` (never anything
    else) with the reason, see :data:`STALL_REJECTIONS`."""
    if len(data) > MAX_PSI_BYTES:
        raise StallRejected("too_long", f"{len(data)} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise StallRejected("not_text", str(exc)[:80]) from None
    lines: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        kind, fields = words[0], {}
        if kind not in ("some", "full"):
            raise StallRejected("garbage", f"line kind {kind[:16]!r}")
        for w in words[1:]:
            key, eq, value = w.partition("=")
            if not eq or not _KEY.fullmatch(key) or key in fields:
                raise StallRejected("garbage", f"field {w[:24]!r}")
            fields[key] = value
        if kind in lines:
            raise StallRejected("duplicate", kind)
        lines[kind] = {k: v for k, v in fields.items() if k in _FIELDS}  # a field a later kernel adds: ignored
    if "some" not in lines:
        raise StallRejected("truncated", "no 'some' line")
    typed: dict[str, dict[str, float | int]] = {}
    for kind, fields in lines.items():
        if len(fields) < len(_FIELDS):
            raise StallRejected("truncated", f"{kind}: {sorted(fields)}")
        for k, v in fields.items():
            if not (_TOTAL if k == "total" else _AVG).fullmatch(v):
                number = _SIGNED_INT.fullmatch(v) if k == "total" else _SIGNED.fullmatch(v)
                why = "out_of_range" if number or v.lower().lstrip("+-") in ("nan", "inf", "infinity") else "garbage"
                raise StallRejected(why, f"{kind} {k}={v[:24]!r}")
        typed[kind] = {k: (int(v) if k == "total" else float(v)) for k, v in fields.items()}
    try:
        return msgspec.convert(typed, ResourceStall)
    except msgspec.ValidationError as exc:
        raise StallRejected("out_of_range", str(exc)[:120]) from None


def _own_cgroup_v2(proc_self_cgroup: str) -> str | None:
    """This process's cgroup v2 path (the ``0::/path`` line of ``/proc/self/cgroup``), or None without one."""
    for line in proc_self_cgroup.splitlines()[:64]:
        if line.startswith("0::"):
            path = line[3:].strip()
            return path if path.startswith("/") and ".." not in path.split("/") else None
    return None


def cgroup2_mount(proc_self_mounts: str) -> str | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on a hybrid
    host), from ``/proc/self/mounts``; None without one."""
    for line in proc_self_mounts.splitlines()[:4096]:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "cgroup2":
            return parts[1]
    return None


def pressure_dir(*, in_container: bool, proc_self_cgroup: str, cgroup2_mount: str | None,
                 exists: Callable[[str], bool]) -> str:
    """The directory whose PSI files describe this machine as its work sees it.

    Outside a container: ``/proc/pressure`` (the host's). Inside one: the container's own cgroup v2 directory,
    ``<cgroup2 mount>/<own cgroup from /proc/self/cgroup>``, when its ``cpu.pressure`` exists; else the mount's
    root (with a cgroup namespace, or a container that sees only its own cgroup mounted there, that root is the
    container's cgroup); else ``/proc/pressure`` (a container without cgroup v2 PSI reports the host's, which
    :class:`PressureStall.source` then names). ``exists(path)`` says whether a file exists (the caller's I/O)."""
    if in_container and cgroup2_mount:
        mount = cgroup2_mount.rstrip("/")
        own = _own_cgroup_v2(proc_self_cgroup)
        for d in ([mount + own.rstrip("/")] if own else []) + [mount]:
            if exists(f"{d}/cpu.pressure"):
                return d or "/"
    return "/proc/pressure"


def pressure_files(directory: str) -> dict[str, str]:
    """The PSI file of each resource in ``directory`` (:func:`pressure_dir`): ``/proc/pressure/cpu`` there, else
    the cgroup's ``cpu.pressure``, ``memory.pressure``, ``io.pressure``."""
    d = directory.rstrip("/")
    if d == "/proc/pressure":
        return {r: f"{d}/{r}" for r in PSI_RESOURCES}
    return {r: f"{d}/{r}.pressure" for r in PSI_RESOURCES}



def in_container(*, env: Mapping[str, str], exists: Callable[[str], bool]) -> bool:
    """Whether this process runs in a container: Docker's ``/.dockerenv``, Podman's ``/run/.containerenv``, the
    ``container`` variable systemd-nspawn, Podman and LXC set, or Kubernetes' ``KUBERNETES_SERVICE_HOST``."""
    return bool(env.get("container") or env.get("KUBERNETES_SERVICE_HOST")
                or exists("/.dockerenv") or exists("/run/.containerenv"))
