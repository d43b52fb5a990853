"""Goodput of the trainings one node ran (issue 41, item 6), per config: pure accounting, ``now`` passed in
(monotonic seconds), no clock, no I/O, no deadline of its own.

**Definition.** Google's "ML Goodput" splits the time a training holds its accelerators into productive time and
the rest (Google Cloud, "Train AI models at scale with ML Goodput", 2024: *goodput = productive training time /
total time*). Here, per config, over the runs this node observed:

* ``run_s``: the time trainings of the config ran here (from the executor's start, or from this agent run's
  adoption of a job found running, to its end; a run still under way counts up to ``now``);
* ``fetch_s``: the time jobs of the config spent ``fetching`` the config's newest checkpoint before they started
  (the job table's state, :mod:`p2pnode.node._table`; a fetch under way counts up to ``now``);
* ``lost_s``: for each run that ended **interrupted** (stopped by a rule of the core, whatever the rule:
  preemption by the plan, drain, load shedding, lease expiry, an agent stop, ...; or ``lost``: its process
  vanished without a status), the time from its **safe point** to its end. The safe point is when the newest
  checkpoint of the run that a member other than this node holds (a durable replica: it lists the checkpoint in
  its ``sync.checkpoints``) was first seen signed here, else the run's start (nothing it did survives). A run that
  completed on its own, or failed on its own, loses nothing to preemption (a failure is the job's, not the
  fleet's);
* ``goodput = (run_s - lost_s) / (run_s + fetch_s)``: the productive share of the time the config's trainings held
  this node (None when that is 0).

**A confirmation after the end.** A checkpoint written in answer to the warning before a stop (item 3) often reaches
its durable replica only after the job stopped. The newest :data:`MAX_ENDED` interrupted runs stay open for a
confirmation for :data:`LATE_CONFIRM_S` after their end: a newer checkpoint of theirs confirmed then moves their
safe point forward, and their lost time shrinks by as much. Their lost time is ``lost_unsettled_s`` until then
(part of ``lost_s``); only the settled part is exported as a Prometheus counter (a counter never goes down).

**What is not counted** (honest limits): a node that vanishes (kill -9, a spot box taken back) takes its own
figures with it, and an agent restart starts from zero (the figures live in memory only); the node that resumes the
config cannot tell when the vanished run's last checkpoint was written, so the work lost with a vanished node is
counted by nobody here. The simulator (``p2pnode simulate --lifetimes``) counts it, since it sees every node.
The checkpoint's time is when this node first saw it signed in its own published list (the sync pass signs a
complete entry once its files have manifests), a little after the job wrote it: the lost time is counted
slightly high, never low.

Bounded: configs are those the caller accepts (``accept``: the local catalog's configs, so metric labels are
bounded by it), at most :data:`MAX_CONFIGS`; runs and fetches under way are this node's live jobs; each run keeps
at most :data:`MAX_TAKEN` checkpoint times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

__all__ = ["LATE_CONFIRM_S", "MAX_CONFIGS", "MAX_ENDED", "MAX_TAKEN", "ConfigGoodput", "GoodputBook",
           "goodput_of", "own_checkpoints", "table_listener"]

MAX_CONFIGS = 256
"""Configs accounted at most (more are counted in :attr:`GoodputBook.dropped`)."""
MAX_ENDED = 64
"""Interrupted runs kept open for a late confirmation (the newest)."""
LATE_CONFIRM_S = 120.0
"""How long after its end an interrupted run's newer checkpoint may still be confirmed (seconds)."""
MAX_TAKEN = 16
"""Checkpoint times kept per run (the newest sequences)."""
INTERRUPTED = frozenset({"stopped", "lost"})
"""The end outcomes (:data:`p2pnode.node._jobstate.EndOutcome`) that count as interruptions."""


class ConfigGoodput(msgspec.Struct):
    """One config's totals (seconds), interrupted runs by cause (a stop rule, or ``lost``) and checkpoints
    confirmed during runs. ``goodput``: see the module docstring (None: no time yet)."""

    run_s: float = 0.0
    lost_s: float = 0.0
    fetch_s: float = 0.0
    lost_unsettled_s: float = 0.0
    """The part of ``lost_s`` a late confirmation may still take back (runs ended within :data:`LATE_CONFIRM_S`)."""
    runs: int = 0
    checkpoints: int = 0
    interrupted: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def goodput(self) -> float | None:
        return goodput_of(self.run_s, self.lost_s, self.fetch_s)

    def view(self) -> dict[str, Any]:
        """JSON-ready: the figures rounded to ms, ``goodput`` to 4 places (None when undefined)."""
        g = self.goodput
        return {"run_s": round(self.run_s, 3), "lost_s": round(self.lost_s, 3), "fetch_s": round(self.fetch_s, 3),
                "lost_unsettled_s": round(self.lost_unsettled_s, 3), "runs": self.runs,
                "checkpoints": self.checkpoints, "interrupted": dict(self.interrupted),
                "goodput": None if g is None else round(g, 4)}


def goodput_of(run_s: float, lost_s: float, fetch_s: float) -> float | None:
    """``(run_s - lost_s) / (run_s + fetch_s)`` clamped to [0, 1]; None when ``run_s + fetch_s`` is 0."""
    total = run_s + fetch_s
    if total <= 0:
        return None
    return min(1.0, max(0.0, (run_s - lost_s) / total))


def own_checkpoints(me: str, refs_by_member: Mapping[str, Iterable[Any]]) -> dict[str, tuple[int, int]]:
    """From every live member's published checkpoint refs (:class:`p2pnode.snapshot.CheckpointRef`, by member id,
    this node's own included), this node's own checkpoints (origin ``me``): job id -> (the newest sequence this
    node lists, the newest sequence another member lists: a replica holds it whole; 0 none)."""
    out: dict[str, tuple[int, int]] = {}
    for member, refs in refs_by_member.items():
        for r in refs:
            if r.origin != me:
                continue
            signed, held = out.get(r.job_id, (0, 0))
            if member == me:
                signed = max(signed, r.seq)
            else:
                held = max(held, r.seq)
            out[r.job_id] = (signed, held)
    return out


class _Run(msgspec.Struct):
    config: str
    start: float
    safe_at: float
    confirmed: int = 0
    taken: dict[int, float] = msgspec.field(default_factory=dict)
    end: float | None = None
    lost: float = 0.0


class GoodputBook:
    """Per-config goodput of this node's trainings (module docstring). ``accept(config)``: whether a config is
    accounted (the local catalog's; None: any)."""

    def __init__(self, *, accept: Callable[[str], bool] | None = None, max_configs: int = MAX_CONFIGS) -> None:
        self.accept = accept
        self.max_configs = max(1, max_configs)
        self.configs: dict[str, ConfigGoodput] = {}
        self.dropped = 0
        """Events of configs not accounted (not accepted, or past :data:`MAX_CONFIGS`)."""
        self._runs: dict[str, _Run] = {}
        self._fetches: dict[str, tuple[str, float]] = {}  # job id -> (config, since)
        self._ended: dict[str, _Run] = {}  # interrupted runs open for a late confirmation, oldest first

    def _config(self, config: str) -> ConfigGoodput | None:
        c = self.configs.get(config)
        if c is not None:
            return c
        if not config or (self.accept is not None and not self.accept(config)) \
                or len(self.configs) >= self.max_configs:
            self.dropped += 1
            return None
        c = self.configs[config] = ConfigGoodput()
        return c

    # -- events ---------------------------------------------------------------------------------------------
    def fetch_started(self, job_id: str, config: str, now: float) -> None:
        """``job_id`` (a training of ``config``) began fetching its checkpoint at ``now``."""
        if job_id not in self._fetches and self._config(config) is not None:
            self._fetches[job_id] = (config, now)

    def fetch_ended(self, job_id: str, now: float) -> None:
        """``job_id`` left ``fetching`` at ``now`` (started, refused or withdrawn): its fetch time is counted."""
        f = self._fetches.pop(job_id, None)
        if f is not None:
            self.configs[f[0]].fetch_s += max(0.0, now - f[1])

    def run_started(self, job_id: str, config: str, now: float) -> None:
        """``job_id`` (a training of ``config``) runs from ``now`` (its safe point: its start)."""
        self.fetch_ended(job_id, now)
        if job_id not in self._runs and self._config(config) is not None:
            self._runs[job_id] = _Run(config, now, now)

    def checkpoints_seen(self, own: Mapping[str, tuple[int, int]], now: float) -> None:
        """This node's own checkpoints as members list them (:func:`own_checkpoints`): a newer sequence signed is
        taken at ``now``; a newer one held by another member moves its run's safe point to when it was taken
        (also for an interrupted run within :data:`LATE_CONFIRM_S` of its end)."""
        for job_id, (signed, held) in own.items():
            run = self._runs.get(job_id) or self._ended.get(job_id)
            if run is None:
                continue
            if run.end is None and signed > max(run.taken, default=0):
                self.checkpoint_taken(job_id, signed, now)
            if held > run.confirmed:
                self.checkpoint_confirmed(job_id, held, now)

    def checkpoint_taken(self, job_id: str, seq: int, now: float) -> None:
        """Checkpoint ``seq`` of the running ``job_id`` was written (signed) at ``now``."""
        run = self._runs.get(job_id)
        if run is None or seq in run.taken:
            return
        run.taken[seq] = now
        if len(run.taken) > MAX_TAKEN:
            del run.taken[min(run.taken)]

    def checkpoint_confirmed(self, job_id: str, seq: int, now: float) -> None:
        """Checkpoint ``seq`` of ``job_id`` is held by a replica (seen at ``now``): the run's safe point moves to
        when it was taken (``now`` if that was not seen; never past the run's end). An interrupted run's lost time
        shrinks by as much."""
        self._settle(now)
        live = self._runs.get(job_id)
        late = live is None
        run = self._ended.get(job_id) if live is None else live
        if run is None or late and run.end is None:
            return
        if seq <= run.confirmed:
            return
        run.confirmed = seq
        at = run.taken.get(seq, None if late else now)  # late and never seen signed: when it was written is unknown
        if at is not None and run.end is not None:
            at = min(at, run.end)
        if at is None or at <= run.safe_at:
            return
        self.configs[run.config].checkpoints += 1
        if late:
            run.lost = max(0.0, run.lost - (at - run.safe_at))
        run.safe_at = at

    def run_ended(self, job_id: str, outcome: str, now: float, *, cause: str = "") -> None:
        """``job_id`` ended at ``now`` with ``outcome`` (:data:`p2pnode.node._jobstate.EndOutcome`); ``cause``: its
        stop rule when stopped. Interrupted (:data:`INTERRUPTED`): the time from its safe point is lost."""
        self.fetch_ended(job_id, now)
        self._settle(now)
        run = self._runs.pop(job_id, None)
        if run is None:
            return
        c = self.configs[run.config]
        c.run_s += max(0.0, now - run.start)
        c.runs += 1
        if outcome in INTERRUPTED:
            run.end = now
            run.lost = max(0.0, now - run.safe_at)
            key = (cause or outcome)[:32]
            c.interrupted[key] = c.interrupted.get(key, 0) + 1
            self._ended[job_id] = run
            while len(self._ended) > MAX_ENDED:
                self._close(next(iter(self._ended)))

    def _settle(self, now: float) -> None:
        """Close the interrupted runs whose window for a late confirmation ended by ``now`` (oldest end first)."""
        while self._ended:
            job_id, run = next(iter(self._ended.items()))
            if run.end is not None and now - run.end <= LATE_CONFIRM_S:
                return
            self._close(job_id)

    def _close(self, job_id: str) -> None:
        run = self._ended.pop(job_id)
        self.configs[run.config].lost_s += run.lost

    # -- reading --------------------------------------------------------------------------------------------
    def totals(self, now: float) -> dict[str, ConfigGoodput]:
        """Each config's totals at ``now``: those of runs and fetches under way counted up to ``now`` (a run under
        way has lost nothing yet)."""
        self._settle(now)
        out = {k: ConfigGoodput(c.run_s, c.lost_s, c.fetch_s, 0.0, c.runs, c.checkpoints, dict(c.interrupted))
               for k, c in self.configs.items()}
        for run in self._ended.values():
            out[run.config].lost_s += run.lost
            out[run.config].lost_unsettled_s += run.lost
        for run in self._runs.values():
            out[run.config].run_s += max(0.0, now - run.start)
        for config, since in self._fetches.values():
            out[config].fetch_s += max(0.0, now - since)
        return out

    def view(self, now: float) -> dict[str, dict[str, Any]]:
        """``/jobs`` ``goodput``: config -> :meth:`ConfigGoodput.view` at ``now``."""
        return {k: c.view() for k, c in sorted(self.totals(now).items())}

    def live_runs(self) -> Sequence[str]:
        """Job ids of the runs under way."""
        return list(self._runs)


def table_listener(book: GoodputBook, config_of: Callable[[str], str | None]) -> Callable[..., None]:
    """The job table's :attr:`~p2pnode.node._table.JobTable.listener` that feeds ``book``: ``config_of(template)``
    is the config of a training template (None: not a training, not accounted). A job entering ``fetching``
    starts a fetch, leaving it ends one; entering ``running`` or ``stopping`` from another state (a start, an
    adoption, a record restored after a restart) starts a run; ``ended`` ends it with its outcome and stop rule."""

    def listen(before: str, rec: Any, ev: Any, now: float) -> None:
        state = rec.state if type(ev).__name__ != "Withdrawn" else "unknown"
        if before == "fetching" and state != "fetching":
            book.fetch_ended(rec.job_id, now)
        live = ("running", "stopping")
        if state == "fetching" and before != "fetching" or state in live and before not in live:
            config = config_of(rec.template)
            if config is None:
                return
            if state == "fetching":
                book.fetch_started(rec.job_id, config, now)
            else:
                book.run_started(rec.job_id, config, now)
        elif state == "ended":
            book.run_ended(rec.job_id, rec.outcome or "lost", now, cause=rec.rule or "")

    return listen
