"""Job control as the HTTP layer sees it: :class:`JobControlSurface`, a thin adapter over a :class:`JobControl` that
satisfies :class:`p2pnode.http._surfaces.JobsSurface` (structurally: this module does not import the HTTP layer).

Each member forwards one read or one call, so the routes, views and metrics never walk into job control's parts
(``leading``, ``operator.intents``, ``runner``, ``fetcher``, ...). What it relies on, by part of
:class:`JobControl`: ``leading`` (:meth:`LeaderRole.whole_plan`, ``whole_plan_bytes``, ``newest_plan``,
``plan_inputs_json``, ``signed_part``), ``running_reports()``, ``accept_signals()``, ``offer``, ``cpu_offer``,
``refused``, ``breaker``, ``spawn_limit.refused``, ``signals.rejected``, ``history.recent()``, ``fetcher.get()`` and
``fetcher.view()``, ``runner.jobs``, ``runner.finished``, ``runner.log_path()``, ``catalog.templates``,
``operator.stop_job()`` and ``operator.intents`` (``cordon``, ``drain``, ``add_run``, ``view``); for the fleet metrics
``core.my_plan``, ``ended_by_kind`` and ``newest_signals()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from ..guardcore import CircuitBreaker
from ..node._runs import RunRecord
from ..scheduler import JobTemplate, Signals
from ..snapshot import JobReport, OperatorSection, PlanRef, PlanSection, RunRequest
from ._control import JobControl

__all__ = ["JobControlSurface"]


class JobControlSurface:
    """The HTTP surface of ``jobs`` (see module docstring). Times: ``wait_s`` seconds; ``now_wall`` wall-clock
    seconds."""

    def __init__(self, jobs: JobControl) -> None:
        self._jobs = jobs

    # -- plans (the leader role) -------------------------------------------------------------------------------
    async def whole_plan(self, wait_s: float) -> PlanSection | None:
        """The newest plan of an elected leader, whole (fetched and checked on a node that does not lead)."""
        return await self._jobs.leading.whole_plan(wait_s=wait_s)

    def whole_plan_bytes(self, digest: str | None) -> bytes | None:
        """This leader's plan ``digest`` (else its newest) as msgpack; None while it leads no plan."""
        return self._jobs.leading.whole_plan_bytes(digest)

    def newest_plan(self) -> PlanRef | None:
        """The ref of the newest plan of an elected leader this node knows (ours included)."""
        return self._jobs.leading.newest_plan()

    async def plan_inputs_json(self, p: PlanSection) -> msgspec.Raw | None:
        """The facts this leader computed plan ``p`` from, as JSON (built once per plan, off the event loop); None
        when it does not serve ``p``."""
        return await self._jobs.leading.plan_inputs_json(p)

    def signed_part(self, node_id: str, digest: str | None) -> bytes | None:
        """``node_id``'s part of this leader's plan ``digest`` (else its newest), signed; None without a plan."""
        return self._jobs.leading.signed_part(node_id, digest)

    # -- scaling ------------------------------------------------------------------------------------------------
    def scaling_view(self) -> dict[str, Any]:
        """This node's scaling driver: provider loaded or why not, calls and failures by operation."""
        return self._jobs.scaler.status()

    @property
    def scaling_outcomes(self) -> dict[tuple[str, str, str], int]:
        """Scaling actions counted while this node led, ``(node_class, op, outcome)`` -> count."""
        sc = self._jobs.core.scaling
        return dict(sc.outcomes) if sc is not None else {}

    @property
    def provider_failures(self) -> dict[tuple[str, str], int]:
        """Provider calls that failed here, ``(provider, operation)`` -> count."""
        return dict(self._jobs.scaler.failures)

    @property
    def scaling_claims_refused(self) -> dict[str, int]:
        """Members' claims (a class, a ``started_by``) that counted toward no class while this node led, by reason
        (:data:`p2pnode.scheduler._scaling.SCALING_CLAIM_REASONS`), once per scaling step."""
        sc = self._jobs.core.scaling
        return dict(sc.claims_refused) if sc is not None else {}

    def scaling_refused_claims(self) -> list[dict[str, Any]]:
        """The members whose claims counted toward no class while this node led, most recently seen first (at
        most :data:`p2pnode.scheduler._scaling.MAX_REFUSED_CLAIMS`): member, reason, claimed, count, first_at,
        last_at (wall seconds)."""
        sc = self._jobs.core.scaling
        return sc.refused_view() if sc is not None else []

    @property
    def scaling_verdicts(self) -> list[tuple[str, int]]:
        """While this node leads: ``(node_class, +k up | -k down | 0 hold)`` per class; else empty."""
        sc = self._jobs.core.scaling
        if sc is None or not sc.term:
            return []
        return [(v.node_class, v.count if v.verdict == "up" else -v.count if v.verdict == "down" else 0)
                for v in sc.verdicts]

    # -- what runs, here and elsewhere ---------------------------------------------------------------------------
    def running_reports(self) -> list[JobReport]:
        """Every job running here."""
        return self._jobs.running_reports()

    def fetched_running(self, origin: str) -> list[JobReport] | None:
        """``origin``'s running list as last fetched at its signed digest (None: never fetched)."""
        held: list[JobReport] | None = self._jobs.fetcher.get(("running", origin))
        return held

    def running_msgpack(self, digest: str = "") -> bytes:
        """This node's running list, msgpack (``GET /jobs/running``): the one of ``digest`` while it is among the
        last few this node named by digest, else the current one (the reader checks it against the digest it
        asked for)."""
        return self._jobs.running_msgpack(digest)

    def usage_msgpack(self, digest: str = "") -> bytes:
        """This node's run-history summary, msgpack (``GET /jobs/usage``): the one of ``digest`` while it is among
        the last few kept, else the newest (the reader checks it against the digest it asked for)."""
        kept = self._jobs.usage_by_digest.get(digest) if digest else None
        return kept if kept is not None else msgspec.msgpack.encode(self._jobs.usage)

    def predictions(self, template: str) -> dict[str, Any]:
        """The predictor's table as this node holds it (``template`` only, unless ""): ``predictions`` (per
        template, the fleet's row then each node class's), ``outliers`` (node id -> why it was left out),
        ``min_runs`` and ``nodes`` (whose summaries it holds)."""
        p = self._jobs.core.predictor
        return {"predictions": p.table(template or None), "outliers": p.outliers, "min_runs": p.min_runs,
                "nodes": sorted(p.docs)}

    @property
    def running_count(self) -> int:
        """Jobs running here."""
        return len(self._jobs.runner.jobs)

    @property
    def finished(self) -> int:
        """Jobs that ended here since the agent started."""
        return self._jobs.runner.finished

    @property
    def offer(self) -> int:
        """GPU jobs this node asks for now (the PID offer)."""
        return self._jobs.offer

    @property
    def cpu_offer(self) -> int:
        """CPU-only jobs (``num_gpus = 0``) this node asks for now (:func:`p2pnode.scheduler.cpu_offer`)."""
        return self._jobs.cpu_offer

    @property
    def gang_ends(self) -> dict[str, int]:
        """Gangs this node ended while it led, by cause (``complete``, ``member_down``, ``member_gone``,
        ``disagree``, ``stopped``: :mod:`p2pnode.node._gangs`)."""
        return dict(self._jobs.core.planner.gangs.ends)

    @property
    def gang_table(self) -> dict[str, Any]:
        """The gang table this node keeps as the leader (:mod:`p2pnode.node._gangs`): ``live`` and ``ended``
        records held, ``seeded`` (entries taken over from a predecessor's plan), ``rejected`` (its entries ignored,
        by reason), ``forgotten`` (records a newer plan no longer held), ``refused`` (gangs not recorded, by reason)
        and ``transition_errors`` (``"state/event"`` -> count)."""
        t = self._jobs.core.planner.gangs
        return {"live": sum(1 for _ in t.live()), "ended": sum(1 for _ in t.ended()), "seeded": t.seeded,
                "forgotten": t.forgotten,
                "rejected": dict(t.rejected), "refused": dict(t.refused),
                "transition_errors": {f"{state}/{event}": n for (state, event), n in t.errors.items()}}

    @property
    def suspicious_claims(self) -> list[dict[str, Any]]:
        """Members' claims this node ignored while it led, the plan not backing them (:mod:`p2pnode.node._claims`):
        member, reason, job id, gang id and rank, count, most recently seen first."""
        return self._jobs.core.planner.claims.view()

    @property
    def claims_ignored(self) -> dict[str, int]:
        """Members' claims this node ignored while it led, by reason (``gang_claim_unplanned``,
        ``job_claimed_elsewhere``, ``ended_claimed_elsewhere``, ``job_unissued``)."""
        return dict(self._jobs.core.planner.claims.totals)

    @property
    def refused_count(self) -> int:
        """Recent assignments this node refused (at most 32 kept)."""
        return len(self._jobs.refused)

    def history(self, n: int) -> list[dict[str, Any]]:
        """The newest ``n`` runs here, newest first (the job history's rows)."""
        return self._jobs.history.recent(n)

    def archive_view(self) -> dict[str, Any] | None:
        """This node's archive of ended jobs for durable replicas (issue 41, :mod:`._archive`): runs ``written``,
        ``pruned`` for its bound, write ``errors``, and its folder; None where it keeps none (not ``ephemeral``)."""
        a = self._jobs.archive
        return None if a is None else {"written": a.written, "pruned": a.pruned, "errors": a.errors, "dir": str(a.dir)}

    def lease_view(self) -> dict[str, Any] | None:
        """This node's lease on its fenced work (issue 42; None: none kept): whether it is ``held``, seconds until
        fenced jobs are asked to stop (``stop_in_s``) and until it runs out (``expires_in_s``; None: never held),
        ``lease_s``, the ``voters`` it counts and how many renewals it took (``renewals``)."""
        keeper = self._jobs.lease
        if keeper is None:
            return None
        lease, now = keeper.lease, self._jobs.ctx.now()
        expires = keeper.expires_at()
        finite = expires != float("-inf")
        return {"held": lease.held(now), "lease_s": lease.lease_s,
                "expires_in_s": round(expires - now, 3) if finite else None,
                "stop_in_s": round(expires - lease.stop_lead_s - now, 3) if finite else None,
                "voters": sorted(lease.voters), "renewals": lease.renewals}

    # -- counters ------------------------------------------------------------------------------------------------
    @property
    def breaker(self) -> CircuitBreaker:
        """The circuit breaker (``state``, ``consecutive_failures``, ``trips``)."""
        return self._jobs.breaker

    @property
    def signals_rejected(self) -> int:
        """Signals refused since start."""
        return self._jobs.signals.rejected

    @property
    def spawns_rate_limited(self) -> int:
        """Starts deferred by the spawn-rate limit."""
        return self._jobs.spawn_limit.refused

    @property
    def fetching_checkpoints(self) -> list[dict[str, Any]]:
        """Jobs whose config's newest checkpoint is fetched here before they start (issue 41, state ``fetching``):
        ``job_id``, ``template``, ``reason`` (which checkpoint, from whom), ``done_bytes`` and ``total_bytes``."""
        return [{"job_id": r.job_id, "template": r.template, "reason": r.reason, "done_bytes": r.fetch_bytes,
                 "total_bytes": r.fetch_total_bytes} for r in self._jobs.core.table.in_state("fetching")]

    def goodput(self) -> dict[str, Any]:
        """Per config, the goodput of the trainings this node ran (issue 41: config ->
        :class:`p2pnode.node._goodput.ConfigGoodput` at now, :attr:`p2pnode.node._book.JobBook.goodput`)."""
        goodput: dict[str, Any] = self._jobs.core.book.goodput.totals(self._jobs.ctx.now())
        return goodput

    @property
    def waiting(self) -> list[dict[str, str]]:
        """Assignments accepted here and held back by the spawn-rate limit: ``job_id``, ``template`` and the
        reason, which says when the next start may come."""
        return [{"job_id": j, "template": t, "reason": r} for j, t, r in self._jobs.core.waiting]

    @property
    def pending_count(self) -> int | None:
        """GPU templates waiting for capacity in this node's newest plan while it leads (None: it does not lead).
        Not counted: CPU-only templates, unsatisfiable ones (no node could ever take them) and configs whose
        training already runs: none of them is idle-GPU work."""
        p = self._jobs.core.my_plan
        if p is None or self._jobs.node_core.view.leader != self._jobs.ctx.node_id:
            return None
        templates = self._jobs.catalog.templates
        return sum(1 for w in p.pending if w.template in templates and templates[w.template].resources.num_gpus > 0
                   and not w.reason.startswith(("unsatisfiable", "a training job")))

    @property
    def band_min_percent(self) -> float:
        """The lower edge of this node's GPU utilization band (the PID set-point), percent."""
        return float(self._jobs.core.offers.pid.band_min_percent)

    @property
    def job_stops(self) -> dict[str, int]:
        """Stops the node's own stop rules asked since start, by rule (:attr:`p2pnode.node._stoprules.StopRules.
        counts`)."""
        return dict(self._jobs.stops.rules.counts)

    @property
    def checkpoint_warnings(self) -> dict[str, int]:
        """Stops held for a checkpoint since start, by how each ended (:attr:`p2pnode.node._ckwarn.
        CheckpointWarnings.counts`: ``signalled``, ``confirmed``, ``local``, ``deadline``)."""
        return dict(self._jobs.stops.warnings.counts)

    @property
    def interruption_probes(self) -> dict[str, int]:
        """Runs of the interruption probe since start, by outcome (:data:`p2pnode.node._notice.PROBE_OUTCOMES`;
        empty without a probe)."""
        n = self._jobs.stops.notices
        return dict(n.core.counts) if n is not None and n.argv else {}

    # -- fleet metrics (queue, jobs ended, Elo velocity) -----------------------------------------------------------
    @property
    def led_plan(self) -> PlanSection | None:
        """This node's newest plan while it leads (None: it does not lead, or has not planned yet)."""
        if self._jobs.node_core.view.leader != self._jobs.ctx.node_id:
            return None
        return self._jobs.core.my_plan

    @property
    def jobs_ended_by_kind(self) -> dict[tuple[str, str], int]:
        """Jobs that ended here on their own since start, ``(kind, outcome)`` -> count (``completed``: exit
        status 0; ``failed``); stopped jobs are neither."""
        return dict(self._jobs.ended_by_kind)

    @property
    def transition_errors(self) -> dict[tuple[str, str], int]:
        """The job table's transition errors since start, ``(state, event)`` -> count (issue 39: a bug signal)."""
        return dict(self._jobs.core.table.errors)

    @property
    def recent_transition_errors(self) -> list[dict[str, Any]]:
        """The job table's newest transition errors (at most 32), oldest first: ``job_id``, ``state``, ``event``,
        ``at`` (monotonic seconds, this run's clock)."""
        return [msgspec.to_builtins(e) for e in self._jobs.core.table.recent_errors]

    def newest_signals(self) -> dict[str, Signals]:
        """The newest signal per config across every member's snapshot (Lamport order)."""
        signals: dict[str, Signals] = self._jobs.newest_signals()
        return signals

    def fetches_view(self) -> dict[str, Any]:
        """Plan and running-list fetches: documents fetched, failures by reason, bytes, held, per kind of document
        (``by_kind``); while this node leads, the members whose running list it could not fetch yet
        (``running_unknown``), how many times a plan offered such a member the room its offers prove
        (``planned_running_unknown``, one per member and plan), gave it no work because its list stayed unknown past
        the planner's grace (``withheld_running_unknown``, one per member and plan), and held a config's new
        training because some list was unknown (``training_held_running_unknown``, one per config and plan)."""
        core = self._jobs.core
        return {**self._jobs.fetcher.view(), "running_unknown": sorted(core.missing),
                "planned_running_unknown": core.unknown_offered, "withheld_running_unknown": core.unknown_withheld,
                "training_held_running_unknown": core.unknown_held_trainings}

    # -- inputs ----------------------------------------------------------------------------------------------
    def accept_signals(self, raw: list[dict[str, Any]]) -> list[Signals]:
        """``POST /signals``: see :meth:`JobControl.accept_signals` (raises :class:`p2pnode.scheduler.SignalError`)."""
        accepted: list[Signals] = self._jobs.accept_signals(raw)
        return accepted

    # -- the operator ----------------------------------------------------------------------------------------
    def operator_view(self) -> dict[str, Any]:
        """The operator's intents on this node (cordon, drain, one-off runs)."""
        view: dict[str, Any] = self._jobs.operator.intents.view()
        return view

    def cordon(self, on: bool) -> OperatorSection:
        """Cordon (``on``) or uncordon this node; uncordon also ends a drain. The new operator section."""
        section = self._jobs.operator.intents.cordon(on)
        self._jobs.news()  # the job core refuses (or admits) new work from now on
        return section

    def drain(self, deadline_s: float, now_wall: float) -> OperatorSection:
        """Cordon and stop preemptible work ``deadline_s`` seconds after ``now_wall``. The new operator section."""
        section = self._jobs.operator.intents.drain(deadline_s, now_wall)
        self._jobs.news()  # cordoned now; job control waits for the deadline
        return section

    def template(self, name: str) -> JobTemplate | None:
        """The catalog's template ``name`` (None: not in the catalog)."""
        return self._jobs.catalog.templates.get(name)

    def add_run(self, template: str, params: dict[str, Any], node: str, tag: str, requested_by: str,
                now_wall: float) -> RunRequest:
        """Keep a one-off run of ``template`` requested on node ``requested_by`` (raises
        :class:`p2pnode.node._operator.InvalidIntent`, or ``ValueError`` when too many wait)."""
        run = self._jobs.operator.intents.add_run(template, params, node, tag, requested_by, now_wall)
        self._jobs.news()
        return run

    def stop_job(self, job_id: str) -> bool:
        """Stop ``job_id`` if it runs here, or withdraw it if it is a one-off request kept here and not placed yet
        (False: neither). Raises :class:`p2pnode.node._operator.RunPlaced` for a one-off already placed on a node
        (not withdrawn: a 409)."""
        stopped = self._jobs.operator.stop_job(job_id)
        self._jobs.news()
        return stopped

    def log_path(self, job_id: str) -> Path:
        """Where ``job_id``'s log is written (it may not exist)."""
        return self._jobs.runner.log_path(job_id)

    def run_record(self, run_id: str) -> RunRecord | None:
        """The outcome record of one-off run ``run_id`` requested through this node (None: unknown here)."""
        return self._jobs.operator.intents.run_record(run_id)
