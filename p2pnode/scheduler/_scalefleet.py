"""Who counts toward a node class, and what the leader's scaling watches in its fleet (pure): a member counts toward
a class only from the provider's own answers or a certificate, never from its own claim (:func:`counted_fleet`,
issue 37; claims refused are named, :class:`RefusedClaim`); :class:`_FleetWatch` is the part of
:class:`._scaling.ScalingCore` that tracks members seen, idle and starting, nodes a scale-up started that never
joined, and drains begun, ended or cancelled. Every public name here is re-exported by :mod:`._scaling`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from ..snapshot import ScalingAction, ScalingVerdict
from ._scaleval import (
    BOOT_GRACE_S,
    MAX_REASON,
    FleetNode,
    ScalingPolicy,
    drained,
)

__all__ = ["COUNTED_STATES", "MAX_REFUSED_CLAIMS", "SCALING_CLAIM_REASONS", "RefusedClaim", "counted_fleet"]

COUNTED_STATES = ("starting", "running")
"""States of a provider's node that count toward its class (a ``stopping`` or ``stopped`` one does not)."""
SCALING_CLAIM_REASONS = ("class_unbacked", "started_by_unbacked")
"""Why a member's claim counts toward no class (:func:`counted_fleet`): ``started_by_unbacked``, it names a
request id under which no slot is left for it (no such scale-up, its nodes all named or taken, or this leader saw
the member before it issued the request); ``class_unbacked``, it claims a configured class that neither the
provider nor a certificate backs."""


def counted_fleet(fleet: Sequence[FleetNode], named: Mapping[str, tuple[str, str, str]],
                  listing: Mapping[str, Sequence[tuple[str, str, str]]] | None, actions: Sequence[ScalingAction],
                  certified_class: Mapping[str, str], *, first_seen: Mapping[str, float] | None = None,
                  issued_at: Mapping[str, float] | None = None, classes: Collection[str] | None = None,
                  refused: dict[str, tuple[str, str]] | None = None) -> list[FleetNode]:
    """The fleet with each member's class as it counts toward ``min_nodes``, ``max_nodes``, the cost and the free
    capacity (issue 37, item 5): a signed snapshot proves who speaks, not what it claims, so a member's own
    ``jobs.node_class`` and ``started_by`` count for nothing. A member counts toward class C when

    * ``certified_class`` names C for it (a role certificate of a pinned operator key, ``p2pnode node certify
      ID --class C``), or
    * the provider named its node id (``named``: node id -> ``(request id, state, class)`` from its ``scale_up``
      answers and its newest ``list()``, state starting or running): C is the provider's class for it, else the
      class of the ledger's action under that request id; its ``started_by`` becomes that request id; or
    * its ``started_by`` claims a request id of a scale-up the ledger holds (``actions``, not failed) or the
      provider's ``listing`` shows (request id -> ``[(node id, state, class)]``), and that request still has a
      node the provider did not name: at most as many members count under a request id as the provider started
      and did not name (for a provider that learns node ids late). A provider that names every node (the
      ``local`` one does) leaves no room for such a claim. Who takes such a slot (:func:`_unnamed_slots`): never
      a member this leader saw before it issued that request (``first_seen``: node id -> wall seconds this
      leader first saw it; ``issued_at``: request id -> wall seconds this leader first issued it), then the
      member seen first, then the lowest node id (ties: members first seen at once, after a failover).

    Every other member keeps its claim in ``reported_class`` (predictions, display) and gets ``node_class`` ""
    and ``started_by`` "": it counts toward no class and is never removed by a scale-down. Its refused claim goes
    into ``refused`` (node id -> ``(reason, what it claimed)``, :data:`SCALING_CLAIM_REASONS`): a ``started_by``
    that got no slot, else a claimed class among ``classes`` (None: any class). Pure; O(fleet log fleet +
    listing)."""
    ups = {a.id: a for a in actions if a.op == "up" and a.state != "failed"}
    room = _unnamed_room(named, listing, ups)
    out: dict[str, FleetNode] = {}
    rest: list[FleetNode] = []
    for n in fleet:
        cert = certified_class.get(n.node_id, "")
        p = named.get(n.node_id)
        if p is not None and p[1] in COUNTED_STATES:
            rid, _s, cls = p
            cls = cert or cls or (ups[rid].node_class if rid in ups else "")
            out[n.node_id] = msgspec.structs.replace(n, node_class=cls, started_by=rid, reported_class=n.node_class)
        elif cert:
            out[n.node_id] = msgspec.structs.replace(n, node_class=cert, started_by="", reported_class=n.node_class)
        else:
            rest.append(n)
    given = _unnamed_slots(rest, room, first_seen or {}, issued_at or {})
    for n in rest:
        cls = given.get(n.node_id, "")
        if cls:
            out[n.node_id] = msgspec.structs.replace(n, node_class=cls, reported_class=n.node_class)
            continue
        out[n.node_id] = msgspec.structs.replace(n, node_class="", started_by="", reported_class=n.node_class)
        if refused is None:
            continue
        if n.started_by:
            refused[n.node_id] = ("started_by_unbacked", n.started_by)
        elif n.node_class and (classes is None or n.node_class in classes):
            refused[n.node_id] = ("class_unbacked", n.node_class)
    return [out[n.node_id] for n in fleet]


def _unnamed_room(named: Mapping[str, tuple[str, str, str]],
                  listing: Mapping[str, Sequence[tuple[str, str, str]]] | None,
                  ups: Mapping[str, ScalingAction]) -> dict[str, tuple[str, int]]:
    """Request id -> (class, nodes the provider started under it and did not name): from its listing's unnamed
    nodes, or the ledger's count less the nodes named under it, whichever is more."""
    named_under: dict[str, int] = {}
    for rid, state, _c in named.values():
        if state in COUNTED_STATES:
            named_under[rid] = named_under.get(rid, 0) + 1
    room: dict[str, tuple[str, int]] = {}
    for rid, listed in (listing or {}).items():
        unnamed = [c for node, state, c in listed if not node and state in COUNTED_STATES]
        if unnamed:
            room[rid] = (unnamed[0] or (ups[rid].node_class if rid in ups else ""), len(unnamed))
    for rid, a in ups.items():
        left = a.count - named_under.get(rid, 0)
        if left > room.get(rid, ("", 0))[1]:
            room[rid] = (a.node_class, left)
    return room


def _unnamed_slots(rest: Sequence[FleetNode], room: dict[str, tuple[str, int]], first_seen: Mapping[str, float],
                   issued_at: Mapping[str, float]) -> dict[str, str]:
    """Node id -> class of the members of ``rest`` that take an unnamed slot of the request their ``started_by``
    names (``room``, consumed). A node a request started cannot have been seen before the request was issued, so
    a member this leader saw before (or at the step) it issued the request gets none: a fake present all along
    cannot take the next request's slot. The others go by first sight (the real node joins within its boot time
    of the request; a fake must appear in between, one identity per request), then by node id (only members
    first seen at the same step tie: those present when this leader took over, for its predecessor's
    requests)."""
    inf = math.inf
    given: dict[str, str] = {}
    for n in sorted(rest, key=lambda x: (first_seen.get(x.node_id, -inf), x.node_id)):
        cls, left = room.get(n.started_by, ("", 0))
        if not cls or left <= 0 or first_seen.get(n.node_id, inf) <= issued_at.get(n.started_by, -inf):
            continue
        room[n.started_by] = (cls, left - 1)
        given[n.node_id] = cls
    return given


MAX_REFUSED_CLAIMS = 64
"""Members whose refused claims a leader names at most (:attr:`ScalingCore.refused_claims`; the one seen longest
ago goes first). Totals by reason are kept apart and never shrink."""


class RefusedClaim(msgspec.Struct):
    """A member's claim that counts toward no class (:func:`counted_fleet`): ``member`` (node id), ``reason`` (one
    of :data:`SCALING_CLAIM_REASONS`), what it ``claimed`` (a class or a request id), ``count``: scaling steps
    that refused it, ``first_at`` / ``last_at``: wall seconds of the first and last of them."""

    member: str
    reason: str
    claimed: str
    count: int = 0
    first_at: float = 0.0
    last_at: float = 0.0


class _FleetWatch:
    """What :class:`._scaling.ScalingCore` keeps track of in its fleet at each step (a mixin of its methods; the
    state is the core's own fields, declared here for the type checker only)."""

    if not TYPE_CHECKING:  # no instance dict on the Struct; the type checker would read the fields as not slotted
        __slots__ = ()

    policy: ScalingPolicy
    ledger: list[ScalingAction]
    draining: dict[str, float]
    verdicts: list[ScalingVerdict]
    provider_nodes: dict[str, list[tuple[str, str, str]]] | None
    named: dict[str, tuple[str, str, str]]
    listed_at: float
    check_due: bool
    joined: dict[str, set[str]]
    stuck: dict[str, str]
    idle_since: dict[str, float]
    first_seen: dict[str, float]
    issued_at: dict[str, float]
    claims_refused: dict[str, int]
    refused_claims: dict[str, RefusedClaim]

    def _mark(self, n: FleetNode) -> FleetNode:
        idle = self.idle_since.get(n.node_id)
        if idle == n.idle_since and (n.node_id in self.draining) == n.draining:
            return n
        return msgspec.structs.replace(n, idle_since=idle, draining=n.node_id in self.draining)

    def _track_seen(self, fleet: Sequence[FleetNode], wall: float) -> None:
        """When this node first saw each member (:func:`_unnamed_slots`); a member gone from the fleet is
        forgotten (back later, it is seen anew: only later than a request it might claim)."""
        present = {n.node_id for n in fleet}
        for n in fleet:
            self.first_seen.setdefault(n.node_id, wall)
        for k in [k for k in self.first_seen if k not in present]:
            del self.first_seen[k]
        ids = {a.id for a in self.ledger}
        for k in [k for k in self.issued_at if k not in ids]:
            del self.issued_at[k]

    def _track_idle(self, fleet: Sequence[FleetNode], wall: float) -> None:
        """Since when each member runs no job (on this leader's clock: a new leader starts the timers anew)."""
        seen = set()
        for n in fleet:
            seen.add(n.node_id)
            if n.running:
                self.idle_since.pop(n.node_id, None)
            else:
                self.idle_since.setdefault(n.node_id, wall)
        for k in [k for k in self.idle_since if k not in seen]:
            del self.idle_since[k]

    def _starting(self, fleet: Sequence[FleetNode], wall: float) -> dict[str, int]:
        """Nodes per class that scale-ups asked for and that have not joined. Past :data:`BOOT_GRACE_S` after the
        provider answered, they are checked through ``list()`` (again every :data:`BOOT_GRACE_S` while any stay):
        those it still lists (starting or running) keep counting against ``max_nodes`` and the cost, and hold
        their class (:attr:`stuck`); those it does not list (or a provider without a listing) no longer count."""
        ups = {a.id for a in self.ledger if a.op == "up"}
        for n in fleet:
            if n.started_by in ups:
                self.joined.setdefault(n.started_by, set()).add(n.node_id)
        self.joined = {k: v for k, v in self.joined.items() if k in ups}
        members = {n.node_id for n in fleet}
        out: dict[str, int] = {}
        self.stuck = {}
        for a in self.ledger:
            left = a.count - len(self.joined.get(a.id, ()))
            if a.op != "up" or a.state == "failed" or left <= 0:
                continue
            if a.state == "done" and wall - a.updated > BOOT_GRACE_S:
                listed = (self.provider_nodes.get(a.id, []) if self.provider_nodes is not None
                          and self.listed_at >= a.updated + BOOT_GRACE_S else None)  # [] : no longer listed
                if listed is None:
                    self.check_due = True  # counted until the provider says
                else:
                    left = min(left, sum(1 for node, state, _c in listed if state in ("starting", "running")
                                         and node not in members))
                    if left > 0:
                        self.check_due = True  # asked again every BOOT_GRACE_S while they stay
                        self.stuck[a.node_class] = (f"{left} node{'s' if left != 1 else ''} of action {a.id} never "
                                                    f"joined within {BOOT_GRACE_S:.0f} s though the provider lists "
                                                    "them: they count against max_nodes; check the provider")
            if left > 0:
                out[a.node_class] = out.get(a.node_class, 0) + left
        if self.provider_nodes:
            self._unknown_starting(fleet, out)
        return out

    def _unknown_starting(self, fleet: Sequence[FleetNode], out: dict[str, int]) -> None:
        """Add to ``out`` the nodes the provider's newest listing shows (starting or running) under request ids no
        ledger entry names, less those that joined (members by node id, or by ``started_by`` that id): a leader
        that died between its provider call and its ledger spreading started them, or their entry aged out of
        the ledger. They count as starting for their class until they join, or a later listing (asked every
        :data:`BOOT_GRACE_S` while they count) no longer shows them."""
        known = {a.id for a in self.ledger}
        members = {n.node_id for n in fleet}
        for rid, listed in (self.provider_nodes or {}).items():
            if rid in known:
                continue
            ids = {node for node, _s, _c in listed if node}
            alive = [cls for node, state, cls in listed if state in ("starting", "running") and node not in members]
            cls = next((c for c in alive if c in self.policy.classes), "")
            # members that joined under the id but are listed without their node id (the provider never learnt it)
            left = len(alive) - sum(1 for n in fleet if n.started_by == rid and n.node_id not in ids)
            if cls and left > 0:
                out[cls] = out.get(cls, 0) + left
                self.check_due = True

    def _hold_misjoined(self, fleet: Sequence[FleetNode], wall: float, *, named_only: bool = False) -> None:
        """A class holds while a scale-up of it started nodes that joined as another class (a provider configured
        wrong: nodes that cannot run the class's work would be started without end), for the boot grace after
        that action (a member claiming a ``started_by`` later holds nothing), and while nodes it started never
        joined (:attr:`stuck`). ``named_only``: only members whose node id the provider named are looked at (a
        member's own claims hold nothing)."""
        recent = {a.id: a.node_class for a in self.ledger if a.op == "up" and wall - a.updated <= BOOT_GRACE_S}
        why = dict(self.stuck)
        wrong: dict[str, list[str]] = {}
        for n in fleet:
            cls = recent.get(n.started_by)
            joined_as = n.reported_class or n.node_class
            if cls is not None and joined_as != cls and (not named_only or n.node_id in self.named):
                wrong.setdefault(cls, []).append(f"{n.node_id} as {joined_as}")
        for cls, nodes in wrong.items():
            why[cls] = (f"nodes started for {cls} joined as another class ({', '.join(nodes[:3])}): check the "
                        "provider's node settings")
        if why:
            self.verdicts = [v if v.node_class not in why else msgspec.structs.replace(
                v, verdict="hold", count=0, nodes=[], reason=why[v.node_class][:MAX_REASON]) for v in self.verdicts]

    def _undrain(self, fleet: Sequence[FleetNode]) -> None:
        """A draining node whose class has waiting work again is kept (its drain is cancelled); one that left is
        forgotten."""
        present = {n.node_id: n for n in fleet}
        wanted = {v.node_class for v in self.verdicts if v.queued}
        for node in list(self.draining):
            n = present.get(node)
            if n is None and not any(node in a.nodes and a.state == "requested" for a in self.ledger):
                del self.draining[node]
            elif n is not None and n.node_class in wanted:
                del self.draining[node]

    def _drained(self, fleet: Sequence[FleetNode]) -> list[tuple[list[str], str]]:
        """Draining nodes ready to go (no job, nothing below R), grouped per class: ``[(nodes, class)]``."""
        ready: dict[str, list[str]] = {}
        removing = {n for a in self.ledger if a.op == "down" and a.state == "requested" for n in a.nodes}
        for n in fleet:  # (an adopted drain list is checked again: only what may go, goes)
            if n.node_id in self.draining and drained(n) and n.node_id not in removing:
                ready.setdefault(n.node_class, []).append(n.node_id)
        return [(sorted(v)[:64], c) for c, v in sorted(ready.items())]

    def _refused(self, refused: Mapping[str, tuple[str, str]], wall: float) -> None:
        """Count the claims :func:`counted_fleet` refused this step, by reason and by member (bounded)."""
        for member, (reason, claimed) in refused.items():
            self.claims_refused[reason] = self.claims_refused.get(reason, 0) + 1
            e = self.refused_claims.pop(member, None)  # re-inserted: the dict's order is the order of last sight
            if e is None or e.reason != reason or e.claimed != claimed:
                e = RefusedClaim(member, reason, claimed[:MAX_REASON], first_at=wall)
            e.count += 1
            e.last_at = wall
            self.refused_claims[member] = e
            while len(self.refused_claims) > MAX_REFUSED_CLAIMS:
                del self.refused_claims[next(iter(self.refused_claims))]

    def refused_view(self) -> list[dict[str, object]]:
        """The members' refused claims, most recently seen first, as plain maps (``/status`` ``scaling``)."""
        return [msgspec.structs.asdict(e) for e in reversed(self.refused_claims.values())]
