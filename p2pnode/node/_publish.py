"""Sealing this node's snapshot within its bounds: what the node publishes when a section outgrows them. Pure.

The heartbeat must go out whatever a section holds, or this node is taken for dead (and a leader's successor
hits the same wall). :func:`seal_within_bounds` seals the snapshot; when the body exceeds
``max_snapshot_bytes`` it drops the plan; when the body fails the typed decoder every peer runs (a bound we break
is our bug, logged loudly by the caller), it drops the informative sections (plan, refusals, events, signals)
and keeps the liveness, membership and election fields.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from ..errors import RejectedMessage
from ..identity import Identity
from ..snapshot import JobsSection, Snapshot, decode_snapshot
from ..wire import Envelope, seal_snapshot

__all__ = ["Sealed", "seal_within_bounds"]


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
