"""Sealing this node's snapshot within its bounds: what the node publishes when a section outgrows them. Pure.

The heartbeat must go out whatever a section holds, or this node is taken for dead (and a leader's successor
hits the same wall). :func:`seal_within_bounds` seals the snapshot; when the body exceeds
``max_snapshot_bytes`` it drops the plan; when the body fails the typed decoder every peer runs (a bound we break
is our bug, logged loudly by the caller), it drops the informative sections (plan, refusals, events, signals)
and keeps the liveness, membership and election fields.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from ..errors import RejectedMessage
from ..identity import Identity
from ..snapshot import JobsSection, Snapshot, decode_snapshot
from ..wire import Envelope, seal_snapshot

__all__ = ["PublishStats", "Sealed", "seal_within_bounds"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sealed:
    """A sealed snapshot: the ``envelope`` to install and gossip, the ``snapshot`` it carries (possibly reduced),
    and what was left out: ``plan_omitted`` (too big), ``reduced`` (failed the decoder: the reason)."""

    envelope: Envelope
    snapshot: Snapshot
    plan_omitted: bool = False
    reduced: str = ""


def seal_within_bounds(identity: Identity, snap: Snapshot, *, token: str | None,
                       max_snapshot_bytes: int) -> Sealed | None:
    """Seal ``snap`` (see module docstring). Returns None when even the reduced snapshot breaks a bound."""
    env = seal_snapshot(identity, snap, token=token)
    omitted = False
    if len(env.body) > max_snapshot_bytes and snap.plan is not None:
        snap = msgspec.structs.replace(snap, plan=None)
        env = seal_snapshot(identity, snap, token=token)
        omitted = True
    if len(env.body) > max_snapshot_bytes:
        return None
    try:
        decode_snapshot(env.body)
    except RejectedMessage as exc:
        jobs = msgspec.structs.replace(snap.jobs, refused=[], signals={}) if snap.jobs != JobsSection() else snap.jobs
        snap = msgspec.structs.replace(snap, plan=None, events=[], jobs=jobs)
        env = seal_snapshot(identity, snap, token=token)
        try:
            decode_snapshot(env.body)
        except RejectedMessage:
            return None
        return Sealed(env, snap, omitted, str(exc))
    return Sealed(env, snap, omitted)


class PublishStats:
    """What sealing did to this node's own snapshots: counted (``/status``, ``/metrics``) and logged once per
    change. ``plans_omitted``: publications without the plan (too big); ``unpublishable``: snapshots that broke a
    bound even reduced (never published); ``max_published_bytes``: the largest body published."""

    def __init__(self) -> None:
        self.plans_omitted = 0
        self.unpublishable = 0
        self.max_published_bytes = 0
        self._plan_omitted = False

    def record(self, sealed: Sealed | None, max_snapshot_bytes: int) -> Sealed | None:
        """Count and log ``sealed`` (the result of :func:`seal_within_bounds`); returns it."""
        if sealed is None:
            log.error("own snapshot exceeds max_snapshot_bytes (%d) or fails the decoder even reduced; "
                      "not published", max_snapshot_bytes)
            self.unpublishable += 1
            return None
        self.max_published_bytes = max(self.max_published_bytes, len(sealed.envelope.body))
        if sealed.plan_omitted:
            self.plans_omitted += 1
            if not self._plan_omitted:
                log.error("own snapshot exceeds max_snapshot_bytes (%d): publishing it without the plan until "
                          "the plan fits", max_snapshot_bytes)
        elif self._plan_omitted:
            log.warning("the plan fits in the snapshot again")
        self._plan_omitted = sealed.plan_omitted
        if sealed.reduced:
            log.error("own snapshot fails the typed decoder (%s): published without plan, refusals, events and "
                      "signals", sealed.reduced)
        return sealed
