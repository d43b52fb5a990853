"""Sealing this node's snapshot within its bounds: what the node publishes when a section outgrows them. Pure.

The heartbeat must go out whatever a section holds, or this node is taken for dead (and a leader's successor
hits the same wall). :func:`seal_within_bounds` seals the snapshot; when the body exceeds
``max_snapshot_bytes`` it drops the plan; when the body fails the typed decoder every peer runs (a bound we break
is our bug, or a value an operator route let through: logged loudly by the caller), each section that fails its
own decoder is left out (published at its default) and the rest goes out: the header, ``membership`` and ``vote``
always do, so the node keeps heartbeating and voting whatever one subsystem holds.
"""

from __future__ import annotations

import logging
import typing
from functools import cache
from typing import Any

import msgspec

from ..errors import RejectedMessage
from ..identity import Identity
from ..snapshot import Snapshot, decode_snapshot, with_text_rule
from ..wire import Envelope, seal_snapshot

__all__ = ["PublishStats", "Sealed", "seal_within_bounds"]

log = logging.getLogger(__name__)


class Sealed(msgspec.Struct, frozen=True):
    """A sealed snapshot: the ``envelope`` to install and gossip, the ``snapshot`` it carries (possibly reduced),
    and what was left out: ``plan_omitted`` (too big), ``reduced`` (failed the decoder: the reason)."""

    envelope: Envelope
    snapshot: Snapshot
    plan_omitted: bool = False
    reduced: str = ""
    left_out: tuple[str, ...] = ()
    """Sections published at their default because they failed their decoder (``reduced`` says why)."""


OPTIONAL_SECTIONS = ("resources", "jobs", "plan", "sync", "guard", "events", "operator", "roll", "scaling")
"""Sections a publication may leave out when they break a bound (never ``membership`` or ``vote``)."""


@cache
def _section_decoder(name: str) -> Any:
    return msgspec.msgpack.Decoder(with_text_rule(typing.get_type_hints(Snapshot, include_extras=True)[name]))


_ENCODER = msgspec.msgpack.Encoder()


def _broken_sections(snap: Snapshot) -> list[tuple[str, str]]:
    """``(section, reason)`` for each optional section of ``snap`` that fails its own decoder."""
    out = []
    for name in OPTIONAL_SECTIONS:
        if name not in Snapshot.__struct_fields__:
            continue
        try:
            _section_decoder(name).decode(_ENCODER.encode(getattr(snap, name)))
        except msgspec.ValidationError as exc:
            out.append((name, str(exc)))
    return out


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
        broken = _broken_sections(snap)
        defaults = {f: d for f, d in zip(Snapshot.__struct_fields__, _field_defaults())}
        snap = msgspec.structs.replace(snap, **{name: defaults[name] for name, _ in broken})
        env = seal_snapshot(identity, snap, token=token)
        try:
            decode_snapshot(env.body)
        except RejectedMessage:
            return None
        detail = "; ".join(f"{name}: {why}" for name, why in broken) or str(exc)
        return Sealed(env, snap, omitted, detail, tuple(name for name, _ in broken))
    return Sealed(env, snap, omitted)


@cache
def _field_defaults() -> tuple[Any, ...]:
    """The default of each field of :class:`Snapshot`, in field order (NODEFAULT for required ones)."""
    info = msgspec.inspect.type_info(Snapshot)
    assert isinstance(info, msgspec.inspect.StructType)
    return tuple(f.default if f.default is not msgspec.NODEFAULT else
                 (f.default_factory() if f.default_factory is not msgspec.NODEFAULT else msgspec.NODEFAULT)
                 for f in info.fields)


class PublishStats:
    """What sealing did to this node's own snapshots: counted (``/status``, ``/metrics``) and logged once per
    change. ``plans_omitted``: publications without the plan (too big); ``unpublishable``: snapshots that broke a
    bound even reduced (never published); ``max_published_bytes``: the largest body published."""

    def __init__(self) -> None:
        self.plans_omitted = 0
        self.unpublishable = 0
        self.max_published_bytes = 0
        self._plan_omitted = False
        self.sections_left_out: dict[str, int] = {}
        """Publications that left a section out (it failed its decoder), by section."""
        self._left_out: tuple[str, ...] = ()

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
        for name in sealed.left_out:
            self.sections_left_out[name] = self.sections_left_out.get(name, 0) + 1
        if sealed.left_out != self._left_out:
            if sealed.left_out:
                log.error("own snapshot fails the typed decoder: published without %s until it decodes (%s)",
                          ", ".join(sealed.left_out), sealed.reduced)
            else:
                log.warning("own snapshot decodes whole again")
        self._left_out = sealed.left_out
        return sealed
