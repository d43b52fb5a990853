"""Operator intents for one node (cordon, drain, one-off runs, stops), like Nomad's node drain and kubectl cordon.
Pure, apart from :class:`IntentStore` (one JSON file, written atomically).

Intents are kept in the data dir of the node they concern (``operator.json``) and published in its
:class:`~p2pnode.snapshot.OperatorSection`, so a leader failover or an agent restart loses none of them:

* **cordon**: the node takes no new work (the planner sees no offer from it; its own admission refuses starts);
  what runs goes on.
* **drain** with a deadline (wall-clock seconds of this node): cordoned, and when the deadline passes its
  preemptible jobs stop (rule ``drain`` of :class:`p2pnode.node._stoprules.StopRules`); the others are waited
  for. ``uncordon`` ends both.
* **one-off runs** (``p2pnode jobs run``): a :class:`~p2pnode.snapshot.RunRequest` kept by the node the
  operator asked until the job ``run-<id>`` is seen running or done anywhere, or refused (:func:`run_outcome`);
  the leader places it through its plan (:func:`p2pnode.node._plans.Planner.lead`, ``runs=``) under that job id,
  with the node's usual admission.
* **outcomes** of the one-off runs requested here (issue 39): a :class:`~p2pnode.node._runs.RunTable` of the
  newest :data:`~p2pnode.node._runs.MAX_OUTCOMES`, kept in the same file (``outcomes``) but not published; it
  follows the run from members' reports to its exit status, stop, refusal or lost node (``GET /jobs/runs?id=<id>``,
  ``p2pnode jobs run --wait``). Withdrawing a waiting run records it as stopped by the operator (once no node
  reported it started within :data:`~p2pnode.node._runs.UNSEEN_GRACE_S`); a run placed or started on a node is
  not withdrawn (:class:`RunPlaced`): ``p2pnode jobs stop`` on that node stops it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from .._files import atomic_write_bytes
from ..errors import PeerError
from ..snapshot import JobId, OperatorSection, RunRequest, WallSeconds
from ..statefiles import decode_entries, decode_entry, read_json_file, report_for
from ._runs import MAX_OUTCOMES, MemberRuns, RunRecord, RunTable

__all__ = ["MAX_RUNS", "IntentStore", "InvalidIntent", "RunPlaced", "run_job_id", "run_outcome"]

log = logging.getLogger(__name__)

MAX_RUNS = 16
"""One-off requests a node keeps at once (its snapshot section is bounded)."""
MAX_DONE = 64


class InvalidIntent(PeerError, ValueError):
    """An intent that would not decode as :class:`OperatorSection` (a tag with a control character, a parameter
    out of its bounds): refused before it is kept, written or published (a 422 for the route that asked)."""


class RunPlaced(PeerError, LookupError):
    """A one-off run the operator asked to withdraw is already placed or started on ``node`` (a 409): it is not
    withdrawn; ``p2pnode jobs stop run-<id>`` stops it on that node."""

    def __init__(self, run_id: str, node: str) -> None:
        super().__init__(f"run-{run_id} is already placed on node {node[:64]}: not withdrawn; "
                         f"p2pnode jobs stop run-{run_id} stops it on that node once it runs there")
        self.node = node


def run_job_id(request_id: str) -> str:
    """The job id of one-off request ``request_id``."""
    return f"run-{request_id}"


def run_outcome(request: RunRequest, running_ids: set[str], done_ids: set[str],
                refused: dict[str, str]) -> str | None:
    """Whether a one-off request is finished with: ``"started"`` (its job runs or ran somewhere),
    ``"refused: <reason>"``, or None (still waiting for a placement)."""
    job_id = run_job_id(request.id)
    if job_id in running_ids or job_id in done_ids:
        return "started"
    if job_id in refused:
        return f"refused: {refused[job_id]}"
    return None


class IntentStore:
    """``operator.json`` in the data dir: the :class:`OperatorSection` of this node, read at start and rewritten
    atomically on each change.

    Reading never stops the agent (:mod:`p2pnode.statefiles`): a missing file is no intent; one that is not JSON
    is ignored; a bad ``cordoned`` or ``drain_deadline`` is reset to its default and a bad one-off run or done run
    is dropped, each counted in the data dir's report (``operator.json``: ``malformed``, ``bad_field``,
    ``bad_entry``) and logged; the rest loads. Writing checks the section with the same decoder first, so the
    file never holds what it could not read back (:class:`InvalidIntent`)."""

    FILE = "operator.json"

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / self.FILE
        self.report = report_for(Path(data_dir))
        self.runs = RunTable()
        self.section = self._load()
        self._seq = time.time_ns() // 1_000_000 % 10**9

    def _load(self) -> OperatorSection:
        raw = read_json_file(self.path, file=self.FILE, report=self.report)
        if raw is None:
            return OperatorSection()
        if not isinstance(raw, dict):
            self.report.drop(self.FILE, "malformed", f"expected an object, found {type(raw).__name__}: ignored")
            return OperatorSection()
        fields: dict = {}
        for name, kind in (("cordoned", bool), ("drain_deadline", WallSeconds)):
            if name in raw:
                try:
                    fields[name] = decode_entry(raw[name], kind)
                except ValueError as exc:
                    self.report.drop(self.FILE, "bad_field", f"{name} = {raw[name]!r:.80}: {exc}; reset")
        runs = decode_entries(raw.get("runs", []), RunRequest, file=self.FILE, report=self.report, limit=MAX_RUNS)
        done = decode_entries(raw.get("done_runs", []), JobId, file=self.FILE, report=self.report, limit=MAX_DONE)
        self.runs = RunTable(decode_entries(raw.get("outcomes", []), RunRecord, file=self.FILE, report=self.report,
                                            limit=MAX_OUTCOMES))
        return OperatorSection(**fields, runs=runs, done_runs=done)

    def _save(self, section: OperatorSection) -> OperatorSection:
        """Write ``section``. Raises :class:`InvalidIntent` when it would not decode (never kept, never persisted,
        never published)."""
        try:
            decode_entry(msgspec.to_builtins(section), OperatorSection)
        except ValueError as exc:
            raise InvalidIntent(str(exc)) from None
        atomic_write_bytes(self.path, msgspec.json.encode({**msgspec.to_builtins(section),
                                                           "outcomes": self.runs.rows()}), mode=0o600)
        self.section = section
        return section

    def cordon(self, on: bool) -> OperatorSection:
        """Cordon (``on``) or uncordon; uncordon also ends a drain."""
        s = self.section
        return self._save(msgspec.structs.replace(s, cordoned=on, drain_deadline=s.drain_deadline if on else 0.0))

    def drain(self, deadline_s: float, now_wall: float) -> OperatorSection:
        """Cordon and drain: preemptible work stops ``deadline_s`` seconds from ``now_wall`` (0: at once)."""
        return self._save(msgspec.structs.replace(self.section, cordoned=True,
                                                  drain_deadline=max(1.0, now_wall + max(0.0, deadline_s))))

    def add_run(self, template: str, params: dict, node: str, tag: str, node_id: str, now_wall: float) -> RunRequest:
        """Keep a one-off request. Raises ``ValueError`` when :data:`MAX_RUNS` are already waiting, and
        :class:`InvalidIntent` (a ``ValueError``) when the request is not a valid :class:`RunRequest` (a tag with a
        control character, a parameter out of its bounds): then nothing is kept."""
        if len(self.section.runs) >= MAX_RUNS:
            raise ValueError(f"{MAX_RUNS} one-off runs already wait on this node")
        self._seq += 1
        req = RunRequest(id=f"{node_id[:8]}-{self._seq}", template=template, params=params, node=node, tag=tag,
                         at=now_wall)
        section = msgspec.structs.replace(self.section, runs=[*self.section.runs, req])
        try:
            decode_entry(msgspec.to_builtins(section), OperatorSection)
        except ValueError as exc:  # (checked before the table notes it: nothing is kept)
            raise InvalidIntent(str(exc)) from None
        self.runs.requested(req.id, template, now_wall)
        try:
            self._save(section)
        except OSError:  # (not written: no record of a request that is not kept)
            self.runs.records.pop(req.id, None)
            self.runs._open.pop(req.id, None)
            raise
        return req

    def cancel_run(self, run_id: str, now_wall: float, placed_on: str | None = None) -> bool:
        """The operator withdraws one-off request ``run_id`` still waiting to be placed: it is forgotten (the
        leader stops placing it) and its outcome is ``stopped`` (rule ``operator``) unless a node reports it
        started within the grace (:meth:`RunTable.cancel`). False when no such request or run is known here.
        Raises :class:`RunPlaced` (nothing changes) when it runs on a node as far as this node knows, or the
        acting plan assigns it (``placed_on``, when known)."""
        rec = self.runs.get(run_id)
        if rec is not None and rec.state == "running":
            raise RunPlaced(run_id, rec.node)
        if not any(r.id == run_id for r in self.section.runs):
            return False
        if placed_on:
            raise RunPlaced(run_id, placed_on)
        self.runs.cancel(run_id, now_wall)
        self._save(msgspec.structs.replace(self.section, runs=[r for r in self.section.runs if r.id != run_id]))
        return True

    def observe_runs(self, members: list[MemberRuns], now_wall: float,
                     placed: Mapping[str, str] | None = None) -> list[RunRecord]:
        """Follow the open run records from ``members``' reports (:meth:`RunTable.observe`, ``placed`` the acting
        plan's node per job id when known); the file is rewritten when one changed. Returns the changed records."""
        changed = self.runs.observe(members, now_wall, placed)
        if changed:
            self._save(self.section)
        return changed

    def run_record(self, run_id: str) -> RunRecord | None:
        """The outcome record of run ``run_id`` requested here (None: unknown)."""
        return self.runs.get(run_id)

    def finish_runs(self, ids: set[str], started_on: Mapping[str, str] | None = None) -> None:
        """Forget the one-off requests ``ids`` (started, or refused). A waiting record of one that
        ``started_on`` names (request id to the node whose ``done_runs`` name it) is running there from now
        (:meth:`RunTable.started_on`): its node's loss or silence ends it."""
        moved = [self.runs.started_on(k, n) for k, n in (started_on or {}).items() if k in ids]
        if ids & {r.id for r in self.section.runs} or any(moved):
            self._save(msgspec.structs.replace(self.section, runs=[r for r in self.section.runs if r.id not in ids]))

    def ran(self, job_id: str) -> None:
        """Note that one-off job ``job_id`` ran here (kept among the newest :data:`MAX_DONE`)."""
        try:
            decode_entry(job_id, JobId)
        except ValueError as exc:  # never persisted: the file must read back (module docstring)
            log.error("one-off job id %r not noted as done: %s", job_id[:80], exc)
            return
        if job_id not in self.section.done_runs:
            done = [*self.section.done_runs, job_id][-MAX_DONE:]
            self._save(msgspec.structs.replace(self.section, done_runs=done))

    def view(self) -> dict:
        """The intents for ``/status``."""
        s = self.section
        return {"cordoned": s.cordoned, "draining": bool(s.drain_deadline),
                "drain_deadline": s.drain_deadline or None,
                "runs": [json.loads(msgspec.json.encode(r)) for r in s.runs], "done_runs": list(s.done_runs)}
