"""A warning before the stop (issue 41, item 3), sans-IO: no clock, no file, ``now`` passed in (monotonic seconds),
typed effects out, :meth:`CheckpointWarnings.next_deadline`.

A stop that can wait (its rule is in :data:`WAITABLE_RULES`: a drain, a preemption or other stop of the plan, load
shedding, a clean agent stop with ``on_agent_stop = "stop"``) of a job whose template declares ``[job.checkpoint]``
with a ``signal`` is held: the job is first sent that signal (:class:`SignalJob`, once), and the stop
(:class:`~p2pnode.node.StopJob`, unchanged: SIGTERM, the stop grace, SIGKILL) is released

* as soon as a NEW complete entry appears in the job's checkpoint dir (:meth:`CheckpointWarnings.listed`: an entry
  whose name was not among the complete ones when the signal was sent) AND a durable replica confirmed holding it
  (:meth:`CheckpointWarnings.replicas`: a durable member other than this node lists, in its signed snapshot, the
  checkpoint ref ``(config, job id, seq, digest)`` this node signed for that entry: the member holds it whole and
  verified, :class:`p2pnode.synccore.CheckpointHolding`), counted ``confirmed``;
* as soon as the new complete entry appears when no durable member but this node is known (none in the cluster,
  none alive, this node durable itself, or no news of the members given yet): nothing else could confirm it,
  counted ``local``; a durable member appearing later does not hold a stop released; or
* at the deadline: ``min(now + grace_s, notice_at - stop_grace_s)`` (``notice_at``: when the node must be rid of
  the job, if anyone said, e.g. a spot notice, :mod:`p2pnode.node._notice`; ``inf`` none), whatever the job wrote
  and whoever holds it, counted ``deadline``.

A stop whose deadline is already past (no time to wait), a job with no checkpoint signal, or a rule that cannot
wait (``memory_limit``, ``lease_expired``, ``operator``, ``max_runtime``, ...) goes through at once; such a stop
of a job already held releases it now (the stronger stop wins, its own rule recorded). A job held is held once: a
second waitable stop of it adds nothing, and a job whose stop was released is never held again (its released stop,
passed back through :meth:`CheckpointWarnings.stop` by the executor, goes through).

**Complete** (:func:`complete_names`): the rule of :class:`p2pnode.synccore.CheckpointDetector` without its settle
time: a non-hidden file not ending in ``.tmp``/``.partial`` (written elsewhere and renamed in: complete when it
appears), or a directory holding a ``.complete`` marker.

**Which entry a replica holds.** A replica's ref names ``(config, job id, seq, digest)``, not the entry: the driver
hands in this node's own signed checkpoints (:class:`OwnCheckpoint`: the same four and the entry's ``name``, from
the sync origin's announcements) with the members' holdings (:class:`Replica`) in one :class:`ReplicaNews`, and a
replica confirms a new entry when its four fields equal those of this node's own checkpoint of that name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import msgspec

from ._jobio import StopJob

__all__ = ["MAX_NEWS", "WAITABLE_RULES", "CheckpointWarnings", "Listed", "OwnCheckpoint", "Replica", "ReplicaNews",
           "SignalJob", "WarnSpec", "complete_names"]

WAITABLE_RULES: frozenset[str] = frozenset({"drain", "plan", "shed", "agent_stop", "notice"})
"""The stop rules (:data:`p2pnode.node._jobstate.StopRule`) whose stop waits for a checkpoint first."""
_TEMP_SUFFIXES = (".tmp", ".partial")
MAX_NEWS = 4096
"""Own checkpoints and replicas one :class:`ReplicaNews` carries at most each (the rest are not seen)."""


class SignalJob(msgspec.Struct, frozen=True):
    """Send ``signal`` (a name of :data:`p2pnode.scheduler._checkpointspec.CHECKPOINT_SIGNALS`) to the process
    group of the job ``job_id``: "write a checkpoint now", its stop (``rule``) held until one appears."""

    job_id: str
    signal: str
    rule: str


class WarnSpec(msgspec.Struct, frozen=True):
    """What a held stop needs of its job: the template's checkpoint ``signal`` (None: none, no warning),
    ``grace_s`` (seconds it may take), the runner's ``stop_grace_s``, and the names of its dir's complete entries
    when the stop was asked (``before``)."""

    signal: str | None
    grace_s: float
    stop_grace_s: float = 0.0
    before: frozenset[str] = frozenset()


class Listed(msgspec.Struct, frozen=True):
    """One entry of a checkpoint dir as the driver listed it: ``name``, whether it ``is_dir``, and whether a
    directory holds the ``.complete`` marker."""

    name: str
    is_dir: bool = False
    marker: bool = False


class OwnCheckpoint(msgspec.Struct, frozen=True):
    """A checkpoint this node signed (:class:`p2pnode.synccore.CheckpointBody`): its ``config``, ``job_id``,
    ``seq``, the ``digest`` of its signed body (16 bytes) and the ``name`` of its entry in the job's dir."""

    config: str
    job_id: str
    seq: int
    digest: bytes
    name: str


class Replica(msgspec.Struct, frozen=True):
    """Member ``member`` (durable) lists the checkpoint ref ``(config, job_id, seq, digest)`` in its signed
    snapshot (:class:`p2pnode.snapshot.CheckpointRef`): it holds that checkpoint whole and verified."""

    member: str
    config: str
    job_id: str
    seq: int
    digest: bytes


class ReplicaNews(msgspec.Struct, frozen=True):
    """What the driver knows now: ``durable``: how many live durable members other than this node there are (0:
    nothing can confirm; a durable node's own checkpoint counts as local); ``own``: this node's signed checkpoints;
    ``held``: the durable members' holdings. Each at most :data:`MAX_NEWS` (the rest ignored)."""

    durable: int = 0
    own: tuple[OwnCheckpoint, ...] = ()
    held: tuple[Replica, ...] = ()


def complete_names(entries: Iterable[Listed]) -> frozenset[str]:
    """The names of the complete entries among ``entries`` (module docstring)."""
    return frozenset(e.name for e in entries
                     if not e.name.startswith(".") and not e.name.endswith(_TEMP_SUFFIXES)
                     and (e.marker if e.is_dir else True))


class _Held(msgspec.Struct):
    stop: StopJob
    deadline: float
    before: frozenset[str]
    fresh: frozenset[str] = frozenset()
    """Complete entries listed since the signal that were not complete before it."""


class CheckpointWarnings:
    """Held stops (module docstring). :meth:`stop` for each stop effect before the executor carries it out;
    :meth:`listed` with each listing of a held job's dir; :meth:`step` when :meth:`next_deadline` passes;
    :meth:`replicas` with each news of the members' holdings; :meth:`forget` for jobs that ended. ``counts``:
    ``signalled``, ``confirmed`` (released on a new checkpoint a durable replica holds), ``local`` (released on a
    new local checkpoint: no durable member to confirm it), ``deadline`` (released at the deadline)."""

    def __init__(self) -> None:
        self.held: dict[str, _Held] = {}
        self.released: set[str] = set()
        """Jobs whose stop was held and released (until :meth:`forget`): never held again."""
        self.counts: dict[str, int] = {"signalled": 0, "confirmed": 0, "local": 0, "deadline": 0}
        self.news = ReplicaNews()
        """The newest :meth:`replicas` news (none yet: no durable member known)."""

    def stop(self, e: StopJob, spec: WarnSpec | None, now: float, notice_at: float = math.inf,
             until: float = math.inf) -> list[object]:
        """What to carry out for the stop ``e`` of a job whose checkpoint is ``spec`` (None: no ``[job.checkpoint]``
        or no dir known) at ``now`` (``notice_at``: when the node must be rid of the job, monotonic seconds;
        ``until``: no hold past it, the agent's own stop bound, :meth:`hold_bound`): ``[e]`` (stop now),
        ``[SignalJob]`` (held), or ``[]`` (held already; an earlier ``notice_at`` moves its deadline forward)."""
        held = self.held.get(e.job_id)
        if e.rule not in WAITABLE_RULES or spec is None or spec.signal is None or e.job_id in self.released:
            if held is not None:
                del self.held[e.job_id]
                self.released.add(e.job_id)
            return [e]
        if held is not None:  # a notice may bring the deadline forward (step releases it then)
            held.deadline = min(held.deadline, notice_at - spec.stop_grace_s, until)
            return []
        deadline = min(now + spec.grace_s, notice_at - spec.stop_grace_s, until)
        if deadline <= now:
            return [e]
        self.held[e.job_id] = _Held(e, deadline, spec.before)
        self.counts["signalled"] += 1
        return [SignalJob(e.job_id, spec.signal, e.rule)]

    def listed(self, job_id: str, entries: Iterable[Listed]) -> list[StopJob]:
        """A listing of ``job_id``'s checkpoint dir: its held stop, released when a new complete entry is in it
        and a durable replica holds it (or no durable member is known)."""
        held = self.held.get(job_id)
        if held is None:
            return []
        held.fresh = held.fresh | (complete_names(entries) - held.before)
        return self._check(job_id, held)

    def replicas(self, news: ReplicaNews) -> list[StopJob]:
        """The members' holdings now (replacing the last news): the held stops they release."""
        self.news = ReplicaNews(news.durable, news.own[:MAX_NEWS], news.held[:MAX_NEWS])
        return [s for job_id, held in list(self.held.items()) for s in self._check(job_id, held)]

    def _check(self, job_id: str, held: _Held) -> list[StopJob]:
        if not held.fresh:
            return []
        if self.news.durable > 0:
            mine = {(o.config, o.job_id, o.seq, o.digest) for o in self.news.own
                    if o.job_id == job_id and o.name in held.fresh}
            if not any((r.config, r.job_id, r.seq, r.digest) in mine for r in self.news.held):
                return []
            self.counts["confirmed"] += 1
        else:
            self.counts["local"] += 1
        del self.held[job_id]
        self.released.add(job_id)
        return [held.stop]

    def step(self, now: float) -> list[StopJob]:
        """The held stops whose deadline passed at ``now``, released."""
        due = [k for k, h in self.held.items() if now >= h.deadline]
        self.counts["deadline"] += len(due)
        self.released.update(due)
        return [self.held.pop(k).stop for k in due]

    def hold_bound(self, specs: Iterable[tuple[str, WarnSpec | None]], now: float, notice_at: float = math.inf,
                   cap_s: float = math.inf) -> float:
        """When the holds of a clean agent stop end at the latest (monotonic seconds; ``now``: nothing would be
        held), asked before its stops are: ``specs`` are the jobs to stop, ``(job id, spec)`` as :meth:`stop` takes
        them; a job held already counts with its deadline, one whose stop was released or that has no checkpoint
        signal with ``now``, any other with the deadline :meth:`stop` would give it at ``now``, each at most
        ``now + cap_s`` (the agent's bound on a stop's hold). Pass the result to :meth:`stop` as ``until`` and no
        hold outlasts it."""
        out = now
        for job_id, spec in specs:
            held = self.held.get(job_id)
            if held is not None:
                out = max(out, held.deadline)
            elif spec is not None and spec.signal is not None and job_id not in self.released:
                out = max(out, min(now + spec.grace_s, notice_at - spec.stop_grace_s))
        return min(out, now + cap_s)

    def cut(self, now: float) -> list[StopJob]:
        """Every held stop released at ``now`` (a second signal to the agent: it stops at once), counted
        ``deadline``."""
        for held in self.held.values():
            held.deadline = min(held.deadline, now)
        return self.step(now)

    def next_deadline(self) -> float:
        """The earliest deadline of a held stop (monotonic seconds; ``inf``: none held)."""
        return min((h.deadline for h in self.held.values()), default=math.inf)

    def forget(self, job_ids: Iterable[str]) -> None:
        """Jobs that ended (held or not): nothing left to stop."""
        for k in job_ids:
            self.held.pop(k, None)
            self.released.discard(k)
