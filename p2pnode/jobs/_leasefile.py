"""The driver of the node's lease (:class:`p2pnode.node._lease.Lease`, issue 42): it keeps the lease's expiry in
``<data_dir>/jobs/lease`` for the wrappers of fenced jobs (:data:`p2pnode.jobs._ledger.LEASE_WRAPPER`, which end
them by that time when the agent is gone) and for the next start of the agent (:meth:`LeaseKeeper.__init__`
restores it: a restart within the lease re-adopts fenced jobs, a later one finds them ended by their wrappers), and
it is what the probe driver renews (:class:`p2pnode.drivers._gossip_probe.ProbeDriver`'s ``lease``). The last run's
lease is read back at the first use (:meth:`LeaseKeeper.expires_at`, :meth:`LeaseKeeper.due`).

The file holds one line: the expiry in whole seconds of the wall clock, rounded down (a shell reads it), written
to a temporary file and renamed. Read back through :func:`read_expiry`: anything else than 1-12 ASCII digits is no
lease (the fenced jobs stop), never a crash.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..inputs import decimal
from ..node._lease import Lease
from ._ledger import LEASE_WRAPPER, WRAPPER

__all__ = ["LEASE_FILE", "LeaseKeeper", "checkpoint_grace_s", "lease_ended", "read_expiry", "wrapper_args",
           "write_expiry"]

log = logging.getLogger("p2pnode.jobs")

LEASE_FILE = "lease"
"""The lease file's name in ``<data_dir>/jobs``."""
MAX_FILE_BYTES = 32


def checkpoint_grace_s(template: Any) -> float:
    """The checkpoint grace of ``template`` (``[job.checkpoint] grace_s``, issue 41), 0 where it has none: how
    long a stop waits for a checkpoint before SIGTERM's grace starts."""
    grace = getattr(getattr(template, "checkpoint", None), "grace_s", 0.0)
    return float(grace) if isinstance(grace, int | float) and math.isfinite(grace) and grace > 0 else 0.0


def wrapper_args(template: Any, exit_path: Path, lease_file: Path | None, grace_s: float) -> list[str]:
    """The job wrapper's script and its arguments before the job's argv: :data:`LEASE_WRAPPER` for a job the lease
    fences (``template.fenced``, with a ``lease_file``; its stop lead: ``grace_s`` and the checkpoint grace, whole
    seconds up), else :data:`WRAPPER`."""
    if lease_file is None or not template.fenced:
        return [WRAPPER, "p2pnode-job", str(exit_path)]
    lead = math.ceil(grace_s + checkpoint_grace_s(template))
    return [LEASE_WRAPPER, "p2pnode-job", str(exit_path), str(lease_file), str(lead), str(math.ceil(grace_s))]


def lease_ended(exit_path: str) -> bool:
    """Whether the wrapper's watchdog ended the job of ``exit_path`` (its marker ``EXIT_FILE.lease``, removed)."""
    if not exit_path:
        return False
    marker = Path(f"{exit_path}.lease")
    found = marker.exists()
    with contextlib.suppress(OSError):
        marker.unlink(missing_ok=True)
    return found


def read_expiry(path: Path) -> int | None:
    """The wall-clock expiry (whole seconds) the file at ``path`` holds, or None (none, unreadable, malformed)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_FILE_BYTES:
        return None
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return decimal(text, max_digits=12)


def write_expiry(path: Path, expires_wall_s: int) -> None:
    """Write ``expires_wall_s`` (whole seconds of the wall clock) to ``path`` atomically (temp file, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{max(0, expires_wall_s)}\n")
    os.replace(tmp, path)


class LeaseKeeper:
    """The node's lease with its file (module docstring). ``voters()``: the election's voter set now; ``now()``:
    monotonic seconds (trio's clock); ``wall()``: the wall clock in seconds. Passes for the probe driver's
    ``lease`` (``due``, ``next_deadline``, ``acked``). Counters: ``writes`` and ``write_errors`` of the file."""

    def __init__(self, *, node_id: str, path: Path, lease_s: float, stop_grace_s: float, min_voters: int,
                 voters: Callable[[], Iterable[str]], now: Callable[[], float], wall: Callable[[], float]) -> None:
        self.lease = Lease(node_id, lease_s=lease_s, stop_lead_s=stop_grace_s, min_voters=min_voters)
        self.path = path
        self.voters = voters
        self.now = now
        self.wall = wall
        self.writes = 0
        self.write_errors = 0
        self._written: int | None = None
        self._written_at = -math.inf
        self._restored = False

    def _restore(self) -> None:
        """The last run's lease, on this run's clock (at the first use: the clock runs then)."""
        self._restored = True
        self._written = read_expiry(self.path)
        if self._written is not None:
            left = self._written - self.wall()
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
        """The file brought to ``expires`` (a monotonic time), in whole wall-clock seconds rounded down; written
        only when that second changes."""
        wall_s = math.floor(self.wall() + (expires - now)) if math.isfinite(expires) else 0
        if self._written is not None and self._written <= wall_s < self._written + self.lease.renew_interval_s / 2:
            return  # (a lease held by this node alone moves on every call: written every half renew interval)
        self._written_at = now
        try:
            write_expiry(self.path, wall_s)
        except OSError as exc:  # the wrappers then stop fenced jobs at the last expiry written: safe
            self.write_errors += 1
            log.warning("lease: %s not written: %s", self.path, exc)
            return
        self._written = wall_s
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
