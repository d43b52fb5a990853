"""Scaling decisions: when the fleet should add or remove machines, per node class. Pure (no I/O, no clock).

Seed 004's ``evaluate_scaling``, held to the bar of Ray's autoscaler (node types with ``min_workers`` and
``max_workers``, pending demand scales up, nodes idle for ``idle_timeout`` scale down), Nomad Autoscaler
(policies, one cooldown) and Kubernetes' cluster autoscaler (only what can be drained goes). The leader runs
:class:`ScalingCore` from its job core (:class:`p2pnode.node.JobCore`) on every plan; the job control driver
carries out the :class:`ProviderCall` effects through the provider plugin.

**Evaluation**: :func:`evaluate_scaling` (:mod:`._scaleval`), per node class configured in ``[scaling.classes]``.

**Actions** (:class:`ScalingCore`): at most one per ``cooldown_s`` (wall-clock seconds, replicated with the
ledger: a new leader honours its predecessor's cooldown, and acts only once its view settled,
:data:`SETTLE_S`), a scale-up before a removal, each under an idempotency id ``"<term>-<n>-<ms>"``, recorded
``requested`` in the ledger and published in the leader's snapshot (:class:`p2pnode.snapshot.ScalingSection`),
with a gossip exchange to up to three voters started, before the provider is called (the exchange may still be
under way when the call begins). A scale-down first **drains**: the nodes go into ``draining`` (the
planner places nothing new there) and the provider is asked to remove them only once their jobs ended and every
file they hold reached its replication factor elsewhere (``sync.under_replicated`` 0). A new leader adopts the
newest ledger it sees during its settle and reconciles every ``requested`` action through the provider's
``list()``: an action the provider carried out is marked done, one it did not is issued again under the same id
(the provider does nothing twice for one id), and nodes listed under an id no ledger names count as starting,
so a failover neither repeats nor loses an action (:meth:`ScalingCore.lead`). Scaling holds while no member is
tagged ``voter`` (every member would vote: adding nodes would change the quorum).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Literal

import msgspec

from ..snapshot import PlanPending, ScalingAction, ScalingSection, ScalingVerdict
from ._catalog import Catalog
from ._scalefleet import COUNTED_STATES as COUNTED_STATES
from ._scalefleet import (
    MAX_REFUSED_CLAIMS,
    SCALING_CLAIM_REASONS,
    RefusedClaim,
    _FleetWatch,
    counted_fleet,
)
from ._scaleval import BAND_BOTTOM as BAND_BOTTOM
from ._scaleval import (
    BAND_TOP,
    BOOT_GRACE_S,
    DEFAULT_VRAM_LIMIT_RATIO,
    MAX_FOR_TEMPLATES,
    MAX_REASON,
    ClassPolicy,
    FleetNode,
    PredictorLike,
    ScalingPolicy,
    class_shape,
    class_takes,
    drained,
    evaluate_scaling,
)
from ._scaleval import CPU_PER_NODE as CPU_PER_NODE
from ._scaleval import MAX_CLASS_GPUS as MAX_CLASS_GPUS
from ._scaleval import MAX_INSTANCES as MAX_INSTANCES
from ._scaleval import MAX_WHY as MAX_WHY
from ._scaleval import ClassShape as ClassShape
from ._scaleval import removable as removable

__all__ = ["BAND_TOP", "BOOT_GRACE_S", "DEFAULT_VRAM_LIMIT_RATIO", "LIST_RETRY_S", "MAX_REFUSED_CLAIMS",
           "SCALING_CLAIM_REASONS", "UNVERIFIED_HOLD_S", "ClassPolicy", "FleetNode", "ProviderCall", "ProviderList",
           "RefusedClaim", "ScalingCore", "ScalingPolicy", "class_shape", "class_takes", "counted_fleet",
           "evaluate_scaling", "one_line"]

SETTLE_S = 30.0
"""A new leader takes no action for this long (or its cooldown, if shorter; seconds): members still joining its
view would count as missing (a start-up's nodes below ``min_nodes``)."""


# -- actions ----------------------------------------------------------------------------------------------------
class ProviderCall(msgspec.Struct, frozen=True):
    """Carry out ``action`` through the provider (scale_up or scale_down under ``action.id``); hand the outcome
    back with :meth:`ScalingCore.result`."""

    action: ScalingAction


class ProviderList(msgspec.Struct, frozen=True):
    """Ask the provider for its nodes (``list()``), to reconcile the ledger; hand them back with
    :meth:`ScalingCore.listed`."""


Listed = Sequence[tuple[str, str, str, str]]
"""A provider's nodes as ``(request_id, node_id, state, node_class)``; state ``starting``, ``running``,
``stopping`` or ``stopped``; node_id and node_class ``""`` where the provider does not know them."""
LIST_RETRY_S = (5.0, 300.0)
"""A failed ``list()`` is asked again after the first figure (seconds), doubling up to the second (or the
cooldown, if shorter): a provider that cannot list is not called in a loop."""
UNVERIFIED_HOLD_S = BOOT_GRACE_S
"""A new leader holds every action while a member shows a ledger under an earlier term whose leader it does not
know (it can neither adopt nor discard it: adopting would let any member plant actions, discarding could repeat
the dead leader's), for at most this long after it began to lead (seconds)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
MAX_NAMED = 4096
"""Provider-named nodes a leader keeps (a provider's listing holds at most as many)."""


def one_line(text: str, limit: int = MAX_REASON) -> str:
    """``text`` on one line (each run of control characters, newlines included, one space), at most ``limit``
    characters: what a provider says goes into the replicated ledger, whose wire type forbids control
    characters (one such error would make the leader's whole ``scaling`` section invalid)."""
    text = _CONTROL.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ScalingCore(msgspec.Struct, _FleetWatch):
    """The leader's scaling state (see the module docstring): the ``ledger`` of actions, the cooldown's start
    ``last_action_at`` (wall seconds), the nodes ``draining`` (-> wall time the drain began), the newest
    ``verdicts``, and the reconciliation in progress. ``term``: the term this node leads (0: not leading)."""

    policy: ScalingPolicy
    ledger: list[ScalingAction] = msgspec.field(default_factory=list)
    last_action_at: float = -math.inf
    draining: dict[str, float] = msgspec.field(default_factory=dict)
    verdicts: list[ScalingVerdict] = msgspec.field(default_factory=list)
    term: int = 0
    led_term: int = 0
    """The last term this node led (its ledger keeps travelling under it after it stops leading)."""
    seq: int = 0
    led_since: float = -math.inf
    reconciled: bool = True
    listing: bool = False
    in_flight: str = ""
    reissue: list[str] = msgspec.field(default_factory=list)
    """Ids of ``requested`` actions the reconciliation found not carried out: issued again, one at a time."""
    provider_nodes: dict[str, list[tuple[str, str, str]]] | None = None
    """The provider's newest ``list()``: request id -> ``[(node_id, state, node_class)]`` (None: not asked yet)."""
    named: dict[str, tuple[str, str, str]] = msgspec.field(default_factory=dict)
    """Nodes the provider named by node id, from its ``scale_up`` answers and its newest ``list()``: node id ->
    ``(request id, state, node class)`` (:func:`counted_fleet`; at most :data:`MAX_NAMED`)."""
    listed_at: float = -math.inf
    list_retry_at: float = -math.inf
    """After a failed ``list()``: not asked again before this wall time (:data:`LIST_RETRY_S`)."""
    list_backoff: float = 0.0
    relist: bool = False
    """A ledger adopted while a ``list()`` was under way changed: ask again once it answers."""
    adopted: tuple[object, ...] | None = None
    """The version of the predecessor's section merged last (each version is merged once)."""
    unverified: str = ""
    """Why every action holds (:data:`UNVERIFIED_HOLD_S`): a ledger under a term whose leader is unknown."""
    check_due: bool = False
    joined: dict[str, set[str]] = msgspec.field(default_factory=dict)
    """Scale-up id -> the nodes seen joined under it (a node removed later still joined: it is not starting)."""
    stuck: dict[str, str] = msgspec.field(default_factory=dict)
    """Class -> why it holds: nodes a scale-up started that never joined (the provider still lists them)."""
    idle_since: dict[str, float] = msgspec.field(default_factory=dict)
    failures: int = 0
    outcomes: dict[tuple[str, str, str], int] = msgspec.field(default_factory=dict)
    """``(node_class, op, outcome)`` -> actions counted (outcome ``done`` or ``failed``)."""
    first_seen: dict[str, float] = msgspec.field(default_factory=dict)
    """Member -> wall seconds this node, leading, first saw it (forgotten once it is gone from the fleet)."""
    issued_at: dict[str, float] = msgspec.field(default_factory=dict)
    """Scale-up request id -> wall seconds this node first issued it (ids in the ledger only)."""
    claims_refused: dict[str, int] = msgspec.field(default_factory=dict)
    """Reason -> members' claims refused, once per scaling step that refused them (:data:`SCALING_CLAIM_REASONS`)."""
    refused_claims: dict[str, RefusedClaim] = msgspec.field(default_factory=dict)
    """Member -> its newest refused claim (at most :data:`MAX_REFUSED_CLAIMS`, in the order of last sight)."""

    def section(self, settings_digest: str, started_by: str) -> ScalingSection:
        """This node's ``scaling`` section: once it has led, its ledger, cooldown start and drain list under the
        last term it led (they keep travelling after it stops leading, for the next leader to adopt), and while
        it leads its verdicts."""
        if not self.led_term:
            return ScalingSection(settings_digest=settings_digest, started_by=started_by)
        return ScalingSection(settings_digest=settings_digest, started_by=started_by, provider=self.policy.provider,
                              ledger=self.ledger[-16:], last_action_at=max(0.0, self.last_action_at),
                              draining=sorted(self.draining)[:64], verdicts=self.verdicts[:32] if self.term else [],
                              term=self.led_term)

    def lead(self, term: int, sections: Sequence[tuple[str, ScalingSection]], wall: float, *,
             leaders_by_term: Mapping[int, str] | None = None) -> None:
        """This node leads ``term`` since ``wall`` (seconds), called at each of its steps: adopt the newest ledger
        among ``sections`` (``(origin, section)`` of the members, this node's own included) whose origin was
        elected in the term it names (``leaders_by_term``; None: trust every section, for tests of this core
        alone): a member that never led cannot plant actions. Sections are read again at every step until the
        settle (:data:`SETTLE_S`) ends, so a predecessor's newer section that arrives late is still merged.
        Adopted actions are kept only for a configured class and within its ``max_nodes`` (:meth:`_sane`). After
        a failover (a predecessor's section was seen) the provider is listed before acting: ``requested`` actions
        are reconciled, and nodes under request ids no ledger names (a leader that died before its ledger
        spread) count as starting. While a section names an earlier term whose leader is unknown here, nothing
        is done (:data:`UNVERIFIED_HOLD_S`). No new action before the settle (or the cooldown) passed."""
        if term != self.term:
            self.term, self.led_term, self.seq, self.led_since = term, term, 0, wall
            self.in_flight, self.reissue, self.provider_nodes, self.listing = "", [], None, False
            self.list_retry_at, self.list_backoff, self.relist, self.adopted = -math.inf, 0.0, False, None
            self.reconciled = True
        elif wall - self.led_since >= max(self._settle(), UNVERIFIED_HOLD_S if self.unverified else 0.0):
            return  # (while a ledger cannot be verified, sections are read until the hold ends)
        elected = [sec for origin, sec in sections if sec.term and sec.term < term
                   and (leaders_by_term is None or leaders_by_term.get(sec.term) == origin)]
        unknown = sorted({sec.term for _o, sec in sections if sec.term and sec.term < term and sec.ledger
                          and leaders_by_term is not None and sec.term not in leaders_by_term})
        best = max(elected, key=lambda s: (s.term, s.last_action_at), default=None)
        self.unverified = ""
        if unknown and (best is None or unknown[-1] > best.term):
            self.unverified = (f"a member shows a scaling ledger of term {unknown[-1]}, whose leader this node does "
                               f"not know: holding up to {UNVERIFIED_HOLD_S:.0f} s")
        if best is not None and self._adopt(best, wall) or self.unverified and self.provider_nodes is None:
            self._relist()

    def _adopt(self, best: ScalingSection, wall: float) -> bool:
        """Merge ``best`` (a predecessor's section) into this node's ledger, cooldown and drain list, once per
        version of it; whether an action of it is now in the ledger that was not, or not in that state."""
        mark = (best.term, best.last_action_at, tuple((a.id, a.updated) for a in best.ledger), tuple(best.draining))
        if mark == self.adopted:
            return False
        self.adopted = mark
        mine = {a.id: a for a in self.ledger}
        fresh = set()
        for a in best.ledger:
            if self._sane(a) and (a.id not in mine or a.updated > mine[a.id].updated):
                mine[a.id] = a
                fresh.add(a.id)
        self.ledger = sorted(mine.values(), key=lambda a: (a.at, a.id))[-16:]
        if 0 < best.last_action_at <= wall + 600.0:  # a stamp far ahead of this clock would stop scaling
            self.last_action_at = max(self.last_action_at, best.last_action_at)
        for n in best.draining:
            self.draining.setdefault(n, wall)
        return any(a.id in fresh for a in self.ledger) or self.provider_nodes is None

    def _relist(self) -> None:
        """List the provider before acting (a failover, or a ledger merged since the last list): at once, or
        again once the list under way answers (whether it succeeds or fails)."""
        if not self.policy.provider:
            return
        self.reconciled = False
        if self.listing:
            self.relist = True

    def _sane(self, a: ScalingAction) -> bool:
        """Whether an adopted action fits this node's policy: a configured class, at most its ``max_nodes``."""
        cp = self.policy.classes.get(a.node_class)
        return cp is not None and a.count <= cp.max_nodes and len(a.nodes) <= cp.max_nodes

    def resign(self) -> None:
        """This node no longer leads: it keeps its ledger (a later term adopts the newest), acts on nothing."""
        self.term, self.in_flight, self.listing = 0, "", False

    def step(self, fleet: Sequence[FleetNode], pending: Sequence[PlanPending], catalog: Catalog,
             predictor: PredictorLike | None, wall: float, *, vram_of: Mapping[str, float] | None = None,
             certified_class: Mapping[str, str] | None = None) -> list[ProviderCall | ProviderList]:
        """Evaluate and act (leader only): the effects to carry out. ``fleet`` as the members report themselves;
        ``certified_class``: node id -> the class a certificate of a pinned operator key gives it (the agent
        passes one, empty until certificates exist): each member then counts toward the class
        :func:`counted_fleet` gives it, never the one it claims. None (tests of this core alone): the fleet's
        classes and ``started_by`` are taken as given. When counting, a leader lists the provider before its
        term's first action (its nodes, started under any term, count from that listing on)."""
        if not self.term:
            return []
        counting = certified_class is not None
        if certified_class is not None:
            self._track_seen(fleet, wall)
            refused: dict[str, tuple[str, str]] = {}
            fleet = counted_fleet(fleet, self.named, self.provider_nodes, self.ledger, certified_class,
                                  first_seen=self.first_seen, issued_at=self.issued_at,
                                  classes=self.policy.classes, refused=refused)
            self._refused(refused, wall)
        self._track_idle(fleet, wall)
        if self.listing:
            return []
        if counting and self.provider_nodes is None and self.policy.provider:
            self.reconciled = False  # what the provider started counts only once it said so: list first, each term
        if not self.reconciled and self.policy.provider:
            if wall < self.list_retry_at:
                return []
            self.listing = True
            return [ProviderList()]
        starting = self._starting(fleet, wall)
        self.verdicts = evaluate_scaling(self.policy, [self._mark(n) for n in fleet], pending, catalog, predictor,
                                         wall, starting=starting, vram_of=vram_of)
        self._hold_misjoined(fleet, wall, named_only=counting)
        out: list[ProviderCall | ProviderList] = []
        self._undrain(fleet)
        drained = self._drained(fleet)
        if not self.policy.provider or self.in_flight:
            return out
        if self.unverified and wall - self.led_since < UNVERIFIED_HOLD_S:
            self.verdicts = [msgspec.structs.replace(v, verdict="hold", count=0, nodes=[], reason=self.unverified)
                             if v.verdict != "hold" else v for v in self.verdicts]
            return out
        again = self._reissue(fleet, wall)
        if again is not None:
            return [again]
        if self.check_due and wall - self.listed_at >= BOOT_GRACE_S and wall >= self.list_retry_at:  # never joined
            self.listing, self.check_due = True, False
            return [ProviderList()]
        if wall - self.last_action_at < self.policy.cooldown_s or wall - self.led_since < self._settle():
            return out
        for v in self.verdicts:  # waiting work first: a scale-up takes the cooldown's one action before a removal
            if v.verdict == "up":
                return [self._act("up", v.node_class, v.count, [], v.reason, wall, for_templates=v.for_templates)]
        for v in self.verdicts:
            if v.verdict == "down":
                for n in v.nodes:
                    self.draining.setdefault(n, wall)
        if drained:
            return [self._act("down", drained[0][1], 0, drained[0][0], "drained: jobs ended, data at R", wall)]
        return out

    def _reissue(self, fleet: Sequence[FleetNode], wall: float) -> ProviderCall | None:
        """The next action the reconciliation found not carried out, issued again under its own id; a removal
        only for the nodes that may still go (:func:`drained`: a new leader's plan may have given one work),
        the others drained anew."""
        present = {n.node_id: n for n in fleet}
        while self.reissue:
            aid = self.reissue.pop(0)
            i = next((i for i, a in enumerate(self.ledger) if a.id == aid and a.state == "requested"), None)
            if i is None:
                continue
            a = self.ledger[i]
            if a.op == "down":
                keep = [n for n in a.nodes if n not in present or drained(present[n])]
                for n in a.nodes:
                    if n not in keep:
                        self.draining.setdefault(n, wall)
                if not keep:
                    self.ledger[i] = msgspec.structs.replace(a, state="failed", updated=wall,
                                                             error="its nodes took work again: drained anew")
                    continue
                a = self.ledger[i] = msgspec.structs.replace(a, nodes=keep, count=len(keep))
            self.in_flight = a.id
            return ProviderCall(a)
        return None

    def _settle(self) -> float:
        return min(self.policy.cooldown_s, SETTLE_S)

    def next_deadline(self, wall: float) -> float:
        """Wall-clock seconds at which :meth:`step` has news to act on without new input (``inf``: none)."""
        if not self.term or not self.policy.provider:
            return math.inf
        due = [self.last_action_at + self.policy.cooldown_s, self.led_since + self._settle(), self.list_retry_at]
        due += [s + self.policy.idle_timeout_s for s in self.idle_since.values()]
        if self.unverified:
            due.append(self.led_since + UNVERIFIED_HOLD_S)
        later = [d for d in due if d > wall]
        return min(later, default=math.inf)


    def _act(self, op: Literal["up", "down"], cls: str, count: int, nodes: list[str], reason: str,
             wall: float, *, for_templates: Sequence[str] = ()) -> ProviderCall:
        """Record and issue an action (a scale-up names the templates it is for, ``for_templates``). When the
        class's newest action of ``op`` failed, the same need is tried again under that action's id (a call that
        failed or hung may have started machines: the provider does nothing twice for one id); otherwise under a
        new id ``"<term>-<n>-<ms>"``."""
        newest = next((i for i in range(len(self.ledger) - 1, -1, -1)
                       if self.ledger[i].node_class == cls and self.ledger[i].op == op), None)
        count = count if op == "up" else len(nodes)
        if newest is not None and self.ledger[newest].state == "failed":
            old = self.ledger.pop(newest)
            a = msgspec.structs.replace(old, state="requested", count=count, nodes=nodes, at=wall, updated=wall,
                                        reason=reason[:MAX_REASON], error="", tries=old.tries + 1,
                                        for_templates=list(for_templates)[:MAX_FOR_TEMPLATES])
        else:
            self.seq += 1
            a = ScalingAction(id=f"{self.term}-{self.seq}-{int(wall * 1000) % 10**9}", op=op, node_class=cls,
                              term=self.term, at=wall, count=count, nodes=nodes, reason=reason[:MAX_REASON], tries=1,
                              updated=wall, for_templates=list(for_templates)[:MAX_FOR_TEMPLATES])
            self.issued_at[a.id] = wall  # a retry under the same id keeps its first issue (_unnamed_slots)
        self.ledger = [*self.ledger, a][-16:]
        self.last_action_at = wall
        self.in_flight = a.id
        return ProviderCall(a)

    def result(self, action_id: str, error: str, wall: float, nodes: Listed | None = None) -> None:
        """The provider answered ``action_id``: ``error`` "" (done) or why it failed (counted; if the need
        remains after the cooldown, the action is tried again under the same id: :meth:`_act`). ``nodes``: what
        the provider answered, as ``(request_id, node_id, state, node_class)``: the nodes it names by node id
        count toward their class from now on (:func:`counted_fleet`)."""
        if self.in_flight == action_id:
            self.in_flight = ""
        if not error:
            self._name(nodes or ())
        for i, a in enumerate(self.ledger):
            if a.id == action_id and a.state == "requested":
                state: Literal["done", "failed"] = "failed" if error else "done"
                self.ledger[i] = msgspec.structs.replace(a, state=state, error=one_line(error), updated=wall)
                key = (a.node_class, a.op, state)
                self.outcomes[key] = self.outcomes.get(key, 0) + 1
                if error:
                    self.failures += 1
                elif a.op == "down":
                    for n in a.nodes:
                        self.draining.pop(n, None)

    def _name(self, nodes: Listed) -> None:
        """Record the nodes a provider's answer names by node id (at most :data:`MAX_NAMED` kept)."""
        for request_id, node_id, state, node_class in nodes:
            if node_id and (node_id in self.named or len(self.named) < MAX_NAMED):
                self.named[node_id] = (request_id, state, node_class)

    def listed(self, nodes: Listed | None, error: str, wall: float) -> list[ProviderCall]:
        """The provider's ``list()`` (None with ``error`` when it failed: asked again, whatever it was for, after
        the backoff :data:`LIST_RETRY_S`): kept for the never-joined check (:meth:`_starting`); ``requested``
        actions it carried out are done; the others are queued to be issued again under their own id, one at a
        time, by :meth:`step` (which checks a removal's nodes against the fleet first). Returns no effect
        itself."""
        self.listing = False
        if nodes is None:
            self.failures += 1
            self.relist = False
            if self.reconciled:  # the never-joined check's list: due again after the backoff
                self.check_due = True
            self.list_backoff = min(max(LIST_RETRY_S[0], 2.0 * self.list_backoff), LIST_RETRY_S[1],
                                    max(LIST_RETRY_S[0], self.policy.cooldown_s))
            self.list_retry_at = wall + self.list_backoff
            return []
        self.list_backoff, self.list_retry_at = 0.0, -math.inf
        by_request: dict[str, list[tuple[str, str, str]]] = {}
        for request_id, node_id, state, node_class in nodes:
            by_request.setdefault(request_id, []).append((node_id, state, node_class))
        self.provider_nodes, self.listed_at = by_request, wall
        self.named = {}  # the listing is the provider's whole truth: what it no longer lists counts no more
        self._name(nodes)
        node_state = {node: state for node, state, _c in (x for xs in by_request.values() for x in xs) if node}
        for i, a in enumerate(self.ledger):
            if a.state != "requested":
                continue
            seen = by_request.get(a.id, [])
            # a removal is done when each of its nodes is listed stopping or stopped, whatever request it is listed
            # under (a provider lists a node under the request that started it); one not listed is issued again
            if a.op == "up" and len(seen) >= a.count or a.op == "down" and a.nodes and all(
                    node_state.get(n) in ("stopping", "stopped") for n in a.nodes):
                self.ledger[i] = msgspec.structs.replace(a, state="done", updated=wall)
            else:
                self.ledger[i] = msgspec.structs.replace(a, tries=a.tries + 1, updated=wall)
                if a.id not in self.reissue:
                    self.reissue.append(a.id)
        self.reconciled = not self.relist
        self.relist = False
        return []
