"""One-off runs' outcomes (issue 39): what the node that ran a ``run-<id>`` job publishes when it ends, and the
table the node that requested it keeps, so ``p2pnode jobs run --wait`` learns how it ended. Pure: wall-clock
``now`` is passed in; no I/O (the table is persisted by :class:`p2pnode.node._operator.IntentStore`).

* The node running a one-off job reports its end in its ``jobs.ended`` list (:func:`ended_report`): the exit
  code, the signal that killed it, or the stop rule and reason.
* The requesting node keeps a :class:`RunRecord` per run it was asked for (:class:`RunTable`, the newest
  :data:`MAX_OUTCOMES`), fed from members' reports (:class:`MemberRuns`): ``waiting`` (not placed yet),
  ``running`` on a node, then one final state: ``exited`` (``exit_code``), ``killed`` (``signal``), ``stopped``
  (``rule``, ``reason``: a stop rule of the node that ran it, or the operator's cancellation of a waiting run),
  ``refused`` (a node's admission refused it; ``reason``), ``lost`` (``reason``: its node died or left while it
  ran, or it ended without a status).
* :func:`exit_status_of_record` maps a final record to ``p2pnode jobs run --wait``'s exit status: the job's own,
  ``128 + N`` for signal ``N``, :data:`NOT_RUN_STATUS` (125) for the rest.

Transitions (any other event leaves a record unchanged; a final record never changes)::

    waiting --seen in N's running list--> running(N)
    waiting|running --ended report--> exited | killed | stopped | lost
    waiting --refusal, not running anywhere--> refused
    waiting --a member's done_runs name it (the request is forgotten: started on N)--> running(N)
    waiting --operator withdraws it, then no report for UNSEEN_GRACE_S--> stopped (rule "operator")
    running(N) --N dead or left for UNSEEN_GRACE_S (a false suspicion ends before)--> lost ("node lost")
    running(N) --N known since this agent started, then forgotten by the membership--> lost ("node lost")
    running(N) --N never held since this agent started, for UNSEEN_GRACE_S from then--> lost ("node lost")
    running(N) --N's complete running list lacks it, no ended report, for UNSEEN_GRACE_S--> lost (not seen)

Whose reports are believed (issue 39 H1): while a run waits, only the node the acting plan assigns it to (the
``placed`` input, when this node knows it: it leads), else any member (the first in ``members``' order); once it
runs on N, only N's (a member that does not run it can neither end it nor take it over).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ..snapshot import EndedJob, JobId, Reason, Short, Str, WallSeconds

__all__ = ["FINAL_STATES", "MAX_OUTCOMES", "NOT_RUN_STATUS", "OPERATOR_CANCEL_REASON", "RUN_PREFIX", "UNSEEN_GRACE_S",
           "MemberRuns", "RunId", "RunRecord", "RunTable", "ended_report", "exit_status_of_record", "rule_of_reason"]

MAX_OUTCOMES = 1000
"""Run records a requesting node keeps (the newest; final ones are dropped first)."""
NOT_RUN_STATUS = 125
"""``p2pnode jobs run --wait``'s exit status when the job did not run to an exit of its own (refused, not placed,
stopped, its node lost): ``docker run``'s and ``timeout``'s convention for "the runner failed"."""
OPERATOR_CANCEL_REASON = "stopped by the operator"
NO_STATUS_REASON = "ended without an exit status"
UNSEEN_GRACE_S = 30.0
"""How long a running run may be missing from its node's complete running list, with no ended report, before it
is given up as lost (an agent restarting publishes before it re-adopts its jobs; an ended report pushed out of
the node's bounded list)."""
RUN_PREFIX = "run-"

RunState = Literal["waiting", "running", "exited", "killed", "stopped", "refused", "lost"]
FINAL_STATES: frozenset[str] = frozenset({"exited", "killed", "stopped", "refused", "lost"})
RunId = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")]
"""A one-off request's id (``<node id prefix>-<seq>``): the parameter of ``GET /jobs/runs?id=<id>``."""
Rule = Annotated[str, Meta(max_length=32, pattern=r"^[a-z_]*\Z")]

_RULES_BY_REASON: tuple[tuple[str, str], ...] = (
    ("stopped by the operator", "operator"),
    ("maximum runtime", "max_runtime"),
    ("memory limit", "memory_limit"),
    ("node drained", "drain"),
    ("stopped: agent shutdown", "agent_stop"),
    ("template removed", "template_removed"),
    ("gang", "gang_ended"),
    ("shed", "shed"),
)
_WORD = re.compile(r"[a-z]+")


class RunRecord(msgspec.Struct, frozen=True, omit_defaults=True):
    """One one-off run as its requesting node knows it (the body of ``GET /jobs/runs?id=<id>``, one row of the
    table's file): ``state`` (module docstring), the ``node`` that runs or ran it, ``exit_code`` (0..255) or
    ``signal`` (1..64), the stop ``rule`` and ``reason``; wall-clock seconds ``requested_at`` and ``ended_at``
    (0 while not final)."""

    id: RunId
    job_id: JobId
    template: Str = ""
    state: RunState = "waiting"
    node: Short = ""
    exit_code: Annotated[int, Meta(ge=0, le=255)] | None = None
    signal: Annotated[int, Meta(ge=1, le=64)] | None = None
    rule: Rule = ""
    reason: Reason = ""
    requested_at: WallSeconds = 0.0
    ended_at: WallSeconds = 0.0
    unseen_since: WallSeconds | None = None
    """Since when (wall-clock s) its node's complete running list lacks it with no ended report, or its node is
    dead or left (None: not)."""
    withdrawn_at: WallSeconds | None = None
    """When (wall-clock s) the operator withdrew it while it waited (None: not): ``stopped`` after
    :data:`UNSEEN_GRACE_S` unless a report of its node shows it had started."""

    @property
    def final(self) -> bool:
        """Whether the run is over (no event changes it any more)."""
        return self.state in FINAL_STATES


class MemberRuns(msgspec.Struct, frozen=True):
    """What one member's newest snapshot says of one-off runs: ``gone`` when it is dead or left; ``running``:
    the job ids it runs (None: its list is not known yet); ``running_complete``: that list is the one of its newest
    snapshot (inline), not an older one fetched by digest; ``ended``: its ``jobs.ended`` reports; ``refused``: job
    id to reason."""

    node_id: str
    gone: bool = False
    running: frozenset[str] | None = None
    running_complete: bool = True
    ended: tuple[EndedJob, ...] = ()
    refused: dict[str, str] = {}


def rule_of_reason(reason: str) -> str:
    """The stop rule (:data:`p2pnode.node._jobstate.StopRule`) a runner's stop reason names ("" when none): its
    words are matched from a word's start ("shed" names ``shed``, "finished" does not)."""
    words = " " + " ".join(_WORD.findall(reason.lower()))  # (whole words or word prefixes: not "shed" in "finished")
    return next((rule for text, rule in _RULES_BY_REASON if " " + " ".join(_WORD.findall(text)) in words), "")


def ended_report(job_id: str, status: int | None, stopping: str | None, at: float, *,
                 rule: str = "") -> EndedJob:
    """The ``jobs.ended`` entry of a job that ended here: ``status`` as :mod:`subprocess` reports it (the exit
    code, ``-N`` for signal ``N``, None when none was recorded), ``stopping`` the stop reason when a rule stopped
    it (its ``rule``, else :func:`rule_of_reason`), ``at`` wall-clock seconds."""
    code = status if status is not None and 0 <= status <= 255 else None
    sig = -status if status is not None and -64 <= status <= -1 else None
    reason = (stopping or ("" if status is not None else NO_STATUS_REASON))[:256]
    reason = "".join(c if c >= " " and c != "\x7f" else " " for c in reason)
    return EndedJob(job_id=job_id, ok=status == 0 and stopping is None, at=max(0.0, at), exit_code=code, signal=sig,
                    rule=(rule or rule_of_reason(stopping)) if stopping else "", reason=reason)


def exit_status_of_record(r: RunRecord) -> int | None:
    """``p2pnode jobs run --wait``'s exit status for ``r``: its exit code, ``128 + N`` when signal ``N`` killed
    it, :data:`NOT_RUN_STATUS` when it was refused, stopped or lost; None while it is not final."""
    if not r.final:
        return None
    if r.state == "exited" and r.exit_code is not None:
        return r.exit_code
    if r.state == "killed" and r.signal is not None:
        return 128 + r.signal
    return NOT_RUN_STATUS


def _from_report(r: RunRecord, e: EndedJob, node_id: str, now: float) -> RunRecord:
    """``r`` made final by member ``node_id``'s ended report ``e``."""
    base = msgspec.structs.replace(r, node=node_id[:64], ended_at=max(0.0, e.at or now), rule=e.rule,
                                   reason=e.reason, exit_code=e.exit_code, signal=e.signal)
    if e.rule or (e.reason and e.reason != NO_STATUS_REASON):
        return msgspec.structs.replace(base, state="stopped")
    if e.signal is not None:
        return msgspec.structs.replace(base, state="killed")
    if e.exit_code is not None:
        return msgspec.structs.replace(base, state="exited")
    return msgspec.structs.replace(base, state="lost", reason=NO_STATUS_REASON)


class RunTable:
    """The requesting node's one-off runs, newest last (at most :data:`MAX_OUTCOMES`): :meth:`requested` adds
    one, :meth:`observe` moves them on from members' reports, :meth:`cancel` withdraws a waiting one."""

    def __init__(self, records: Iterable[RunRecord] = ()) -> None:
        self.records: dict[str, RunRecord] = {}
        self._open: dict[str, None] = {}  # ids of the records not final (ordered, as ``records``)
        self._since: float | None = None  # ``now`` of the first :meth:`observe` (this agent's start)
        self._held: set[str] = set()  # the members among an :meth:`observe`'s input since then
        for r in records:
            self._put(r)

    def get(self, run_id: str) -> RunRecord | None:
        """The record of run ``run_id`` (None: unknown here)."""
        return self.records.get(run_id)

    def rows(self) -> list[RunRecord]:
        """Every record, oldest first (what is persisted)."""
        return list(self.records.values())

    def open(self) -> list[RunRecord]:
        """The records not final yet (oldest first)."""
        return [self.records[k] for k in self._open]

    def waiting(self) -> bool:
        """Whether a record waits to be placed (then every member's report matters, not only its node's)."""
        return any(self.records[k].state == "waiting" for k in self._open)

    def nodes(self) -> set[str]:
        """The nodes the open records run on."""
        return {self.records[k].node for k in self._open if self.records[k].node}

    def _set(self, r: RunRecord) -> None:
        self.records[r.id] = r
        if r.final:
            self._open.pop(r.id, None)
        else:
            self._open[r.id] = None

    def _put(self, r: RunRecord) -> None:
        self.records.pop(r.id, None)
        self._open.pop(r.id, None)
        self._set(r)
        while len(self.records) > MAX_OUTCOMES:
            victim = next((k for k, v in self.records.items() if v.final), next(iter(self.records)))
            del self.records[victim]
            self._open.pop(victim, None)

    def requested(self, run_id: str, template: str, now: float) -> RunRecord:
        """Note a new request ``run_id`` of ``template`` at wall-clock ``now`` (state ``waiting``)."""
        r = RunRecord(id=run_id, job_id=f"{RUN_PREFIX}{run_id}", template=template[:256], requested_at=now)
        self._put(r)
        return r

    def cancel(self, run_id: str, now: float, reason: str = OPERATOR_CANCEL_REASON) -> bool:
        """The operator withdraws waiting run ``run_id``: it stays ``waiting`` (``withdrawn_at``) for
        :data:`UNSEEN_GRACE_S`, then is final ``stopped`` (rule ``operator``, ``reason``), unless its node reports
        it running or ended first (it had been placed: that report decides). False (nothing changes) when it is
        unknown, running on a node, or final."""
        r = self.records.get(run_id)
        if r is None or r.state != "waiting":
            return False
        if r.withdrawn_at is None:
            self._set(msgspec.structs.replace(r, withdrawn_at=now, reason=reason[:512]))
        return True

    def started_on(self, run_id: str, node_id: str) -> RunRecord | None:
        """Waiting run ``run_id`` started on ``node_id`` (that node's ``done_runs`` name it; its request is
        forgotten): ``running`` there, so the lost-node and unseen rules apply (None: not waiting here)."""
        r = self.records.get(run_id)
        if r is None or r.state != "waiting" or not node_id:
            return None
        new = msgspec.structs.replace(r, state="running", node=node_id[:64], unseen_since=None, withdrawn_at=None,
                                      reason="")
        self._set(new)
        return new

    def observe(self, members: Iterable[MemberRuns], now: float,
                placed: Mapping[str, str] | None = None) -> list[RunRecord]:
        """Move the open records on from ``members``' reports (module docstring); returns those that changed.
        ``placed``: job id to the node the acting plan assigns it (the only node believed while it waits; a job
        not in it: any member). A member not among ``members`` is forgotten: a run on it is lost if that member
        was among them since this table's first call, else once :data:`UNSEEN_GRACE_S` passed since then."""
        if self._since is None:
            self._since = now
        todo = self.open()
        by_node = {m.node_id: m for m in members}
        self._held.update(by_node)
        if not todo:
            return []
        ended: dict[str, list[tuple[EndedJob, str]]] = {}
        running: dict[str, list[str]] = {}
        refused: dict[str, list[tuple[str, str]]] = {}
        for m in by_node.values():
            for e in m.ended:
                if e.job_id.startswith(RUN_PREFIX):
                    ended.setdefault(e.job_id, []).append((e, m.node_id))
            for job_id in (m.running or ()) if not m.gone else ():
                running.setdefault(job_id, []).append(m.node_id)
            for k, v in m.refused.items():
                if k.startswith(RUN_PREFIX):
                    refused.setdefault(k, []).append((m.node_id, f"{m.node_id[:12]}: {v}"))
        changed = []
        for r in todo:
            trusted = r.node if r.state == "running" else (placed or {}).get(r.job_id)
            report = next((x for x in ended.get(r.job_id, ()) if trusted in (None, x[1])), None)
            on = next((n for n in running.get(r.job_id, ()) if trusted in (None, n)), None)
            no = next((why for n, why in refused.get(r.job_id, ()) if trusted in (None, n)), None)
            new = self._step(r, by_node, report, on, no, now)
            if new != r:
                self._set(new)
                changed.append(new)
        return changed

    def _step(self, r: RunRecord, by_node: Mapping[str, MemberRuns], ended: tuple[EndedJob, str] | None,
              running_on: str | None, refused: str | None, now: float) -> RunRecord:
        """One open record's next state (module docstring), from the believed node's reports."""
        if ended is not None:
            return _from_report(msgspec.structs.replace(r, withdrawn_at=None), ended[0], ended[1], now)
        if r.state == "waiting":
            if running_on is not None:
                return msgspec.structs.replace(r, state="running", node=running_on[:64], withdrawn_at=None,
                                               reason="")
            if refused is not None:
                return msgspec.structs.replace(r, state="refused", reason=refused[:512], ended_at=now)
            if r.withdrawn_at is not None and now - r.withdrawn_at >= UNSEEN_GRACE_S:
                return msgspec.structs.replace(r, state="stopped", rule="operator",
                                               reason=r.reason or OPERATOR_CANCEL_REASON, ended_at=now)
            return r
        m = by_node.get(r.node)
        if m is None:
            if r.node in self._held or now - (self._since or now) >= UNSEEN_GRACE_S:
                return msgspec.structs.replace(r, state="lost", ended_at=now,
                                               reason=f"node lost: {r.node} is forgotten by the membership")
            return r
        if m.gone:
            since = now if r.unseen_since is None else r.unseen_since
            if now - since >= UNSEEN_GRACE_S:
                return msgspec.structs.replace(r, state="lost", reason=f"node lost: {r.node} is dead or left",
                                               ended_at=now)
            return r if since == r.unseen_since else msgspec.structs.replace(r, unseen_since=since)
        if m.running is None or (r.job_id not in m.running and not m.running_complete):
            return r  # (a list fetched at an older digest says nothing of a job that left it)
        if r.job_id in m.running:
            return r if r.unseen_since is None else msgspec.structs.replace(r, unseen_since=None)
        if r.unseen_since is None:
            return msgspec.structs.replace(r, unseen_since=now)
        if now - r.unseen_since >= UNSEEN_GRACE_S:
            return msgspec.structs.replace(r, state="lost", ended_at=now,
                                           reason=f"ended on {r.node}; its outcome was not seen")
        return r

    def next_deadline(self) -> float:
        """When (wall-clock s) an open run is next given up (lost, or stopped once withdrawn; inf: none is)."""
        open_ = [self.records[k] for k in self._open]
        since = [t for r in open_ for t in (r.unseen_since, r.withdrawn_at) if t is not None]
        if self._since is not None and any(r.state == "running" and r.node not in self._held for r in open_):
            since.append(self._since)
        return min(since, default=math.inf) + UNSEEN_GRACE_S  # (inf + grace: inf)
