"""The driver of the node's lease (:class:`p2pnode.node._lease.Lease`, issue 42): it keeps the lease's expiry in
``<data_dir>/jobs/lease`` for the wrappers of fenced jobs (:data:`p2pnode.jobs._ledger.LEASE_WRAPPER`, which end
them by that time when the agent is gone) and for the next start of the agent (:meth:`LeaseKeeper.__init__`
restores it: a restart within the lease re-adopts fenced jobs, a later one finds them ended by their wrappers), and
it is what the probe driver renews (:class:`p2pnode.drivers._gossip_probe.ProbeDriver`'s ``lease``). The last run's
lease is read back at the first use (:meth:`LeaseKeeper.expires_at`, :meth:`LeaseKeeper.due`).

The file holds one line, ``BOOT_ID EXPIRY``: the kernel's boot id (``/proc/sys/kernel/random/boot_id``) and the
expiry in whole seconds of ``CLOCK_BOOTTIME`` (the clock of ``/proc/uptime``, which a shell reads; it counts
suspend and no step of the wall clock moves it), rounded down, written to a temporary file and renamed. Read back
through :func:`read_expiry`: anything else than the current boot id and 1-12 ASCII digits without a leading zero is
no lease (the fenced jobs stop), never a crash; a restored lease never lasts past ``lease_s`` from the restart.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..inputs import decimal
from ..node._lease import Lease, catalog_lease_problems, checkpoint_grace_s, stop_lead_s  # noqa: F401 (re-exported)
from ._ledger import LEASE_WRAPPER, WRAPPER

__all__ = ["LEASE_FILE", "LeaseKeeper", "boot_id", "boottime", "catalog_lease_problems", "checkpoint_grace_s",
           "lease_ended", "read_expiry", "template_lead_s", "v2_dir", "wrapper_args", "write_expiry"]

log = logging.getLogger("p2pnode.jobs")

LEASE_FILE = "lease"
"""The lease file's name in ``<data_dir>/jobs``."""
MAX_FILE_BYTES = 64
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def boot_id(path: Path = BOOT_ID_FILE) -> str:
    """This boot's id (the kernel's random UUID, lower-case hex), or "" when unreadable (no lease then)."""
    try:
        text = path.read_text(encoding="ascii")[:64].strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if _BOOT_ID.fullmatch(text) else ""


def boottime() -> float:
    """Seconds on ``CLOCK_BOOTTIME`` (the clock of ``/proc/uptime``: since boot, suspend included)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def template_lead_s(template: Any, stop_grace_s: float) -> float:
    """The stop lead of fenced ``template`` (:func:`p2pnode.node._lease.stop_lead_s`: ``stop_grace_s`` and its
    checkpoint grace): what the stop rule, admission and the job's wrapper use."""
    return stop_lead_s(stop_grace_s, checkpoint_grace_s(template))


def v2_dir(cgroups: Any, cgroup: str) -> str:
    """``cgroup`` when it is a cgroup v2 directory (``cgroups.version`` 2: it has ``cgroup.kill``), else ""."""
    return cgroup if cgroup and getattr(cgroups, "version", 0) == 2 else ""


def wrapper_args(template: Any, exit_path: Path, lease_file: Path | None, grace_s: float,
                 cgroup: str = "") -> list[str]:
    """The job wrapper's script and its arguments before the job's argv: :data:`LEASE_WRAPPER` for a job the lease
    fences (``template.fenced``, with a ``lease_file``; its stop lead :func:`template_lead_s` and ``grace_s``,
    whole seconds up; ``cgroup``: the job's cgroup v2 directory, whose ``cgroup.kill`` ends what is left of the
    job when the watchdog ended it, "" none), else :data:`WRAPPER`."""
    if lease_file is None or not template.fenced:
        return [WRAPPER, "p2pnode-job", str(exit_path)]
    lead = math.ceil(template_lead_s(template, grace_s))
    return [LEASE_WRAPPER, "p2pnode-job", str(exit_path), str(lease_file), str(lead), str(math.ceil(grace_s)),
            cgroup]


def lease_ended(exit_path: str) -> bool:
    """Whether the wrapper's watchdog ended the job of ``exit_path`` (its marker ``EXIT_FILE.lease``, removed)."""
    if not exit_path:
        return False
    marker = Path(f"{exit_path}.lease")
    found = marker.exists()
    with contextlib.suppress(OSError):
        marker.unlink(missing_ok=True)
    return found


def read_expiry(path: Path, boot: str) -> int | None:
    """The expiry (whole seconds of ``CLOCK_BOOTTIME``) the file at ``path`` holds for boot ``boot``, or None
    (none, unreadable, malformed, a leading zero, another boot's)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_FILE_BYTES:
        return None
    try:
        fields = raw.decode("ascii").split()
    except UnicodeDecodeError:
        return None
    if len(fields) != 2 or not boot or fields[0] != boot:
        return None
    text = fields[1]
    if len(text) > 1 and text.startswith("0"):
        return None  # the wrapper's shell reads it as octal: refused on both sides
    return decimal(text, max_digits=12)


def write_expiry(path: Path, boot: str, expires_s: int) -> None:
    """Write ``expires_s`` (whole seconds of ``CLOCK_BOOTTIME``) for boot ``boot`` to ``path`` atomically (temp
    file, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{boot or '-'} {max(0, expires_s)}\n")
    os.replace(tmp, path)


class LeaseKeeper:
    """The node's lease with its file (module docstring). ``voters()``: the election's voter set now; ``now()``:
    monotonic seconds (trio's clock); ``clock()``: seconds on ``CLOCK_BOOTTIME`` (the file's clock, :func:`boottime`);
    ``boot``: this boot's id (:func:`boot_id`). Passes for the probe driver's
    ``lease`` (``due``, ``next_deadline``, ``acked``). Counters: ``writes`` and ``write_errors`` of the file."""

    def __init__(self, *, node_id: str, path: Path, lease_s: float, stop_grace_s: float, min_voters: int,
                 voters: Callable[[], Iterable[str]], now: Callable[[], float],
                 clock: Callable[[], float] = boottime, boot: str | None = None) -> None:
        self.lease = Lease(node_id, lease_s=lease_s, stop_lead_s=stop_grace_s, min_voters=min_voters)
        if min_voters < 2:  # docs/jobs.md#leases: a node that sees only itself is a quorum of one
            log.warning("lease: election.min_voters is %d: a node cut off with no other voter in its view holds its "
                        "lease alone; set election.min_voters to the cluster's voter count for a fence", min_voters)
        self.path = path
        self.voters = voters
        self.now = now
        self.clock = clock
        self.boot = boot_id() if boot is None else boot
        self.writes = 0
        self.write_errors = 0
        self._written: int | None = None
        self._written_at = -math.inf
        self._restored = False

    def _restore(self) -> None:
        """The last run's lease, on this run's clock (at the first use: the clock runs then), never more than
        ``lease_s`` from now (a tampered or stale file lends nothing longer)."""
        self._restored = True
        self._written = read_expiry(self.path, self.boot)
        if self._written is not None:
            left = min(self._written - self.clock(), self.lease.lease_s)
            self.lease.restore(self.now() + left)
            log.info("lease: the last run's lease %s", f"runs {left:.0f} s more" if left > 0 else "ran out")

    def _refresh(self) -> None:
        if not self._restored:
            self._restore()
        voters = frozenset(self.voters())
        if voters != self.lease.voters:
            self.lease.set_voters(voters)

    def expires_at(self) -> float:
        """The lease's expiry now (monotonic seconds; ``-inf``: none), with the file brought up to date."""
        self._refresh()
        now = self.now()
        expires = self.lease.expires_at(now)
        self._write(expires, now)
        return expires

    def _write(self, expires: float, now: float) -> None:
        """The file brought to ``expires`` (a monotonic time), in whole seconds of ``CLOCK_BOOTTIME`` rounded down;
        written only when it moved half a renew interval."""
        file_s = math.floor(self.clock() + (expires - now)) if math.isfinite(expires) else 0
        if self._written is not None and self._written <= file_s < self._written + self.lease.renew_interval_s / 2:
            return  # (a lease held by this node alone moves on every call: written every half renew interval)
        self._written_at = now
        try:
            write_expiry(self.path, self.boot, file_s)
        except OSError as exc:  # the wrappers then stop fenced jobs at the last expiry written: safe
            self.write_errors += 1
            log.warning("lease: %s not written: %s", self.path, exc)
            return
        self._written = file_s
        self.writes += 1

    # -- the probe driver's lease ------------------------------------------------------------------------------
    def due(self, now: float) -> list[tuple[str, bool]]:
        self._refresh()
        self._write(self.lease.expires_at(now), now)
        return self.lease.due(now)

    def next_deadline(self) -> float:
        """The lease's next renewal pings; for a lease this node holds alone (it is the only voter), the next
        refresh of the file, one renew interval after the last write."""
        alone = self.lease.voters == {self.lease.self_id}
        return self._written_at + self.lease.renew_interval_s if alone else self.lease.next_deadline()

    def acked(self, voter: str, sent_at: float, now: float) -> bool:
        self._refresh()
        if not self.lease.acked(voter, sent_at, now):
            return False
        with contextlib.suppress(OSError):
            self._write(self.lease.expires_at(now), now)
        return True
