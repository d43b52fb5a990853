"""Jobs in the agent: the leader's plans, each node's part of them, signals, offers and fake GPU load.

* **Leader** (the node the election names, for term T): every ``scheduler.interval_s`` it builds a cluster view
  from the snapshots of alive and suspect members (GPUs, tags, offer, degradation level, disk, running jobs),
  carries over the desired jobs of the newest plan it has seen (so a new leader adopts what runs and what was
  just assigned, and never starts a second training job for a config), runs :func:`p2pnode.scheduler.plan`, and
  publishes the desired state ``{term, seq, jobs, pending}`` in its signed snapshot.
* **Every node** acts only on the plan of the current leader's term (the fencing token; lower terms are
  ignored): it starts the jobs assigned to it that its guard admits (refusals and their reasons go into its
  snapshot) and stops jobs of its own that the plan no longer holds, once the leader had time to hear of them.
  Without a leader it starts only ``autonomous`` templates, chosen by the same weights on its own capacity, and
  stops nothing.
* Each node's :class:`p2pnode.scheduler.CapacityController` turns its GPU utilization into the offer carried in
  its snapshot; GPUs idle past the grace period ask for work at once (IDLE_RESOURCE_DETECTED is raised by the
  guard).
* Signals arrive by ``POST /signals`` or a watched file; a node carries those it received in its snapshot, and
  the leader uses the newest per config.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from ..errors import DATA_ERRORS
from ..gossip import MemberState
from ..guard import LEVEL_NAMES, CircuitBreaker, OperationPriority, SpawnRateLimiter, may_start
from ..resources import FakeGpus
from ..scheduler import (
    CapacityController,
    ClusterView,
    GpuView,
    NodeView,
    RunningJob,
    SchedulerState,
    SignalError,
    Signals,
    plan,
    validate_signals,
)
from ..scheduler._plan import KIND_PRIORITY
from ._history import JobHistory
from ._runner import JobRunner

if TYPE_CHECKING:
    from ..agent import Agent

__all__ = ["JobControl"]

log = logging.getLogger(__name__)
GIB = 2**30
LOAD_PER_GPU = {"selfplay": 65.0, "training": 75.0, "evaluation": 55.0}
"""Utilization (percent of a whole GPU) a job drives on fake GPUs per unit of GPU it holds."""
MAX_SIGNALS_IN_SNAPSHOT = 64


MAX_REPORTED_JOBS_PER_MEMBER = 64
"""Running jobs of one member the leader carries into its plan, at most (8 GPUs x 8 fractional jobs): a member
reporting hundreds cannot grow the leader's plan past its snapshot bound."""


class JobControl:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.catalog = agent.catalog
        self.settings = agent.config.scheduler
        self.history = JobHistory(agent.data_dir / "jobs.db")
        self.runner = JobRunner(node_id=agent.node_id, data_dir=agent.data_dir, history=self.history,
                                grace_s=self.settings.stop_grace_s, log_max_bytes=self.settings.log_max_bytes,
                                on_change=self._changed, on_exit=self._exited)
        g = agent.config.guard
        self.breaker = CircuitBreaker(failures=g.breaker_failures, cooldown_s=g.breaker_cooldown_s)
        self.spawn_limit = SpawnRateLimiter(per_minute=g.max_spawns_per_minute)
        self.pid = CapacityController(band_min_percent=g.target_util_min_percent,
                                      band_max_percent=g.target_util_max_percent)
        self.offer = 0
        self.refused: deque[dict[str, Any]] = deque(maxlen=32)
        self.signals: dict[str, dict[str, Any]] = {}
        self.signals_rejected = 0
        self.sched_state = SchedulerState()
        self.plan_seq = 0
        self.my_plan: dict[str, Any] | None = None
        self.local_seq = 0
        self._signals_mtime = 0.0
        self.ran: set[str] = {r["job_id"] for r in self.history.recent(1000)}

    # -- snapshot ----------------------------------------------------------------------------------
    def snapshot_fields(self) -> dict[str, Any]:
        return {
            "jobs": [j.to_wire() for j in self.runner.jobs.values()],
            "refused": list(self.refused)[-8:],
            "offer": self.offer,
            "signals": dict(list(self.signals.items())[-MAX_SIGNALS_IN_SNAPSHOT:]),
            "plan": self.my_plan,
        }

    def _changed(self) -> None:
        self._drive_fake_gpus()
        self.agent.request_publish()

    def _drive_fake_gpus(self) -> None:
        gpus = self.agent.sampler.gpu_source
        if not isinstance(gpus, FakeGpus):
            return
        util: dict[int, float] = {}
        mem: dict[int, float] = {}
        for j in self.runner.jobs.values():
            for g in j.gpus:
                util[g] = util.get(g, 0.0) + j.gpu_fraction * LOAD_PER_GPU.get(j.template.kind, 70.0)
                mem[g] = mem.get(g, 0.0) + j.vram_gib * GIB
        for g in range(len(gpus.read())):
            gpus.set_load(g, util_percent=util.get(g, 0.0), mem_used_bytes=int(mem.get(g, 0.0)))

    # -- signals -----------------------------------------------------------------------------------
    def accept_signals(self, raw: Any) -> list[Signals]:
        """Validate one signal or a list of them; unknown configs (not in the catalog) are rejected.
        Raises :class:`SignalError` with every reason; nothing is kept unless all are valid."""
        items = raw if isinstance(raw, list) else [raw]
        if len(items) > 256:
            raise SignalError(["at most 256 signals at once"])
        out, reasons = [], []
        known = set(self.catalog.configs) if self.catalog else set()
        for i, item in enumerate(items):
            try:
                s = validate_signals(item)
            except SignalError as exc:
                reasons += [f"[{i}] {r}" for r in exc.reasons]
                continue
            if s.config not in known:
                reasons.append(f"[{i}] config {s.config!r} is not in the catalog")
                continue
            out.append(s)
        if reasons:
            self.signals_rejected += 1
            raise SignalError(reasons)
        now = time.time()
        for s in out:
            d = {k: getattr(s, k) for k in ("curriculum_weight", "elo_velocity", "data_age_s", "quality", "game_count")}
            self.signals.pop(s.config, None)
            self.signals[s.config] = {**d, "at": now}
        self.agent.request_publish()
        return out

    def _watch_signals_file(self) -> None:
        path = self.settings.signals_file
        if not path:
            return
        try:
            mtime = os.stat(path).st_mtime
            if mtime == self._signals_mtime:
                return
            self._signals_mtime = mtime
            self.accept_signals(json.loads(Path(path).read_text()))
            log.info("signals file %s loaded", path)
        except FileNotFoundError:
            return
        except (OSError, ValueError, SignalError) as exc:
            log.warning("signals file %s rejected: %s", path, exc)

    def newest_signals(self) -> dict[str, Signals]:
        """Newest signal per config across every member's snapshot."""
        best: dict[str, tuple[float, dict[str, Any]]] = {}
        for e in self.agent.state.entries():
            sig = e.snapshot.get("signals") or {}
            if not isinstance(sig, dict):
                continue
            for cfg, d in sig.items():
                if isinstance(d, dict) and isinstance(d.get("at"), (int, float)):
                    if cfg not in best or d["at"] > best[cfg][0]:
                        best[cfg] = (d["at"], d)
        out = {}
        for cfg, (_, d) in best.items():
            try:
                out[cfg] = validate_signals({"config": cfg, **{k: v for k, v in d.items() if k != "at"}})
            except SignalError:
                continue
        return out

    # -- leader ------------------------------------------------------------------------------------
    def _live_entries(self) -> list:
        a = self.agent
        return [e for e in a.state.entries()
                if e.origin == a.node_id or a.membership.state_of(e.origin) in (MemberState.ALIVE, MemberState.SUSPECT)]

    def _recently_dead(self) -> list:
        """Members dead for less than ``orphan_grace_s``: their jobs stay in the plan (and count), so a false
        death under load never stops work nor lets a second training job of the same config start."""
        a = self.agent
        out = []
        for e in a.state.entries():
            m = a.membership.members.get(e.origin)
            if m is not None and m.state is MemberState.DEAD and a.now() - m.state_since < self.settings.orphan_grace_s:
                out.append(e)
        return out

    def newest_plan(self) -> dict[str, Any] | None:
        """The plan of the highest term (then highest seq) among plans published by the member this node saw
        lead that term (``Agent.leaders_by_term``), ours included. A plan from any other member, whatever term it
        claims, is ignored: only an elected leader's plan is carried over or shown."""
        best = None
        leaders = self.agent.leaders_by_term
        for e in self.agent.state.entries():
            p = e.snapshot.get("plan")
            if isinstance(p, dict) and isinstance(p.get("term"), int) and isinstance(p.get("jobs"), list):
                if leaders.get(p["term"]) != e.origin:
                    continue
                key = (p["term"], p.get("seq", 0))
                if best is None or key > best[0]:
                    best = (key, p)
        return best[1] if best else None

    def _node_view(self, e: Any) -> NodeView:
        """The planner's view of a member from its snapshot (VRAM committed only up to the guard's GPU limit)."""
        a = self.agent
        s = e.snapshot
        res = s.get("resources") or {}
        tags = frozenset(s.get("tags") or [])
        cost = 0.0
        for t in tags:
            if t.startswith("cost_per_hour="):
                try:
                    cost = float(t.split("=", 1)[1])
                except ValueError:
                    pass
        return NodeView(
            e.origin,
            tuple(GpuView(int(g.get("index", i)), (g.get("mem_total_bytes") or 0) / GIB)
                  for i, g in enumerate(res.get("gpus") or [])),
            tags, cost, "ephemeral" in tags, int(s.get("offer", 0) or 0),
            int((s.get("guard") or {}).get("level", 0)), float(res.get("disk_percent", 0.0)),
            a.limits.disk_max_percent, vram_limit_ratio=a.limits.gpu_max_percent / 100.0,
        )

    def lead(self, term: int) -> None:
        """Compute and publish a plan for ``term`` (this node is the leader)."""
        a = self.agent
        assert self.catalog is not None
        nodes: dict[str, NodeView] = {}
        running: dict[str, RunningJob] = {}
        refused: set[str] = set()
        orphans = self._recently_dead()
        for e in self._live_entries() + orphans:
            try:
                s = e.snapshot
                m_refused = {r.get("job_id") for r in s.get("refused") or [] if isinstance(r, dict)}
                view = self._node_view(e) if e not in orphans else None
                reported = [j.to_wire() for j in self.runner.jobs.values()] if e.origin == a.node_id else s.get("jobs") or []
                m_running = {
                    j["job_id"]: RunningJob(j["job_id"], j["template"], e.origin, tuple(j.get("gpus") or ()),
                                            float(j.get("gpu_fraction", 0)), float(j.get("vram_gib", 0)),
                                            0.0, int(j.get("term", 0)))
                    for j in reported[:MAX_REPORTED_JOBS_PER_MEMBER]
                    if isinstance(j, dict) and j.get("template") in self.catalog.templates
                }
            except DATA_ERRORS as exc:  # a decoder gap: this member is set aside, never the leader's loop
                a.quarantine(e.origin, "planning", exc)
                continue
            refused |= m_refused
            if view is not None:
                nodes[e.origin] = view
            running.update(m_running)
        known_nodes = set(nodes) | {e.origin for e in orphans}
        previous = self.newest_plan()
        now_wall = time.time()
        for j in (previous or {}).get("jobs", []):
            # Assigned but not reported yet: still counts, so nothing is placed twice (training above all),
            # unless its node refused it or never started it within the adoption grace.
            if not isinstance(j, dict) or j.get("job_id") in running or j.get("job_id") in refused:
                continue
            age = now_wall - min(float(j.get("assigned_at", now_wall)), now_wall)  # a future time is not "fresh forever"
            fresh = age < self.settings.adopt_grace_s + 2 * self.settings.interval_s
            if fresh and j.get("node") in known_nodes and j.get("template") in self.catalog.templates:
                running[j["job_id"]] = RunningJob(j["job_id"], j["template"], j["node"], tuple(j.get("gpus") or ()),
                                                  float(j.get("gpu_fraction", 0)), float(j.get("vram_gib", 0)),
                                                  0.0, int(j.get("term", term)))
        view = ClusterView(nodes, tuple(running.values()))
        p = plan(view, self.catalog, self.newest_signals(), a.now(), term=term, state=self.sched_state,
                 seed=term * 1_000_003 + self.plan_seq)
        stopped = {s.job_id for s in p.stops}
        carried = {j["job_id"]: j for j in (previous or {}).get("jobs", []) if isinstance(j, dict) and "job_id" in j}
        desired = [{"job_id": r.job_id, "template": r.template, "node": r.node_id, "gpus": list(r.gpus),
                    "gpu_fraction": r.gpu_fraction, "vram_gib": r.vram_gib,
                    "params": carried.get(r.job_id, {}).get("params", {}), "term": r.term,
                    "assigned_at": carried.get(r.job_id, {}).get("assigned_at", now_wall)}
                   for r in view.running if r.job_id not in stopped]
        desired += [{"job_id": x.job_id, "template": x.template, "node": x.node_id, "gpus": list(x.gpus),
                     "gpu_fraction": x.gpu_fraction, "vram_gib": x.vram_gib, "params": dict(x.params), "term": term,
                     "assigned_at": now_wall}
                    for x in p.assignments]
        self.plan_seq += 1
        self.my_plan = {
            "term": term, "seq": self.plan_seq, "at": time.time(), "jobs": desired,
            "stops": [{"job_id": s.job_id, "node": s.node_id, "reason": s.reason[:500]} for s in p.stops],
            "pending": [{"template": x.template, "reason": x.reason[:500], "wait_s": round(x.wait_s, 1)}
                        for x in p.pending][:64],
        }
        if p.assignments or p.stops:
            log.info("plan term %d seq %d: %d new, %d stops, %d pending", term, self.plan_seq, len(p.assignments),
                     len(p.stops), len(p.pending))
        a.request_publish()

    # -- this node's part --------------------------------------------------------------------------
    def _gpu_conflict(self, gpus: list[int], fraction: float, vram_gib: float) -> str:
        """Why the assigned GPUs cannot take the job here (what runs already holds them, jobs being stopped
        excepted: their grace period overlaps the job that replaces them), or ''."""
        s = self.agent.last_sample
        totals = {g.index: g.mem_total_bytes / GIB for g in s.gpus} if s else {}
        limit = self.agent.limits.gpu_max_percent / 100.0
        for g in gpus:
            if g not in totals:
                return f"no GPU {g} on this node"
            holding = [j for j in self.runner.jobs.values() if g in j.gpus and j.stopping is None]
            used_f = sum(j.gpu_fraction for j in holding)
            used_v = sum(j.vram_gib for j in holding)
            if used_f + fraction > 1.0 + 1e-9 or used_v + vram_gib > totals[g] * limit + 1e-9:
                return f"GPU {g} already committed ({used_f:g} of it, {used_v:g} GiB)"
        return ""

    def _exited(self, job: Any, status: int | None) -> None:
        """Feed the circuit breaker: a job that failed on its own is a failure; a stopped one is neither."""
        if job.stopping is None:
            self.breaker.record(status == 0, self.agent.now())

    def _admit(self, job_id: str, template: str, j: dict[str, Any] | None = None) -> bool:
        t = self.catalog.templates[template]
        ok, reason = self.agent.admits(t.kind, KIND_PRIORITY.get(t.kind, OperationPriority.NORMAL))
        if ok and not self.breaker.allow(self.agent.now()):
            ok, reason = False, (f"circuit breaker open after {self.breaker.consecutive_failures} failed jobs; "
                                 f"next try in {max(0.0, (self.breaker.reopens_at() or 0) - self.agent.now()):.0f} s")
        if ok and j is not None:
            conflict = self._gpu_conflict(list(j.get("gpus") or []), float(j.get("gpu_fraction", 0)),
                                          float(j.get("vram_gib", 0)))
            ok, reason = (False, conflict) if conflict else (True, "")
        if not ok:
            # A refusal is final: the leader re-places the work under a new id, so this id must never start
            # here later (it could otherwise run twice, e.g. a second training job of its config).
            self.ran.add(job_id)
            entry = {"job_id": job_id, "template": template, "reason": reason[:500], "at": time.time()}
            if not any(r["job_id"] == job_id for r in self.refused):
                self.refused.append(entry)
                log.warning("refusing job %s (%s): %s", job_id, template, reason)
                self.agent.request_publish()
        return ok

    def _start(self, j: dict[str, Any], term: int) -> None:
        t = self.catalog.templates[j["template"]]
        self.ran.add(j["job_id"])
        try:
            self.runner.start(job_id=j["job_id"], template=t, params=j.get("params") or {},
                              gpus=tuple(j.get("gpus") or ()), gpu_fraction=float(j.get("gpu_fraction", 0)),
                              vram_gib=float(j.get("vram_gib", 0)), term=term, catalog_dir=self.catalog.base_dir)
        except (OSError, ValueError) as exc:
            self.breaker.record(False, self.agent.now())
            self.refused.append({"job_id": j["job_id"], "template": t.name, "reason": f"cannot start: {exc}"[:500],
                                 "at": time.time()})
            log.error("cannot start %s: %s", j["job_id"], exc)

    def act(self) -> None:
        """Start and stop this node's jobs after the current leader's plan, or autonomous work without one."""
        a = self.agent
        if self.catalog is None or a.leaving:
            return
        view = a.election.view
        if view.leader is None:
            self._autonomous()
            return
        plan_ = None
        if view.leader == a.node_id:
            plan_ = self.my_plan
        else:
            e = a.state.get(view.leader)
            plan_ = e.snapshot.get("plan") if e else None
        if not isinstance(plan_, dict) or plan_.get("term") != view.term or not a.election.accepts(view.term or 0):
            return  # no plan of the current term yet: keep what runs
        try:
            mine = {j["job_id"]: j for j in plan_.get("jobs", []) if isinstance(j, dict) and j.get("node") == a.node_id
                    and j.get("template") in self.catalog.templates}
            stops = {x.get("job_id"): x.get("reason", "") for x in plan_.get("stops", []) if isinstance(x, dict)}
        except DATA_ERRORS as exc:  # a decoder gap: the leader's snapshot is set aside, this loop carries on
            if view.leader != a.node_id:
                a.quarantine(view.leader, "plan adoption", exc)
            return
        # Stops first (a preemption frees its GPU for the job that replaces it), then starts.
        now_mono = trio.current_time()
        for job_id, job in list(self.runner.jobs.items()):
            if job_id in stops:
                self.runner.stop(job_id, f"{stops[job_id]} (term {view.term})")
            elif job_id not in mine and now_mono - job.started_mono >= self.settings.adopt_grace_s:
                self.runner.stop(job_id, f"no longer in the plan of term {view.term}")
        for job_id, j in mine.items():
            if job_id in self.runner.jobs or self.history_has(job_id):
                continue
            if not self.spawn_limit.try_acquire(self.agent.now()):
                break  # spawn-rate limit: the rest waits for the next pass (not a refusal)
            if self._admit(job_id, j["template"], j):
                self._start(j, int(j.get("term", view.term)))

    def history_has(self, job_id: str) -> bool:
        """A job id this node already ran (a finished job is not started again by a stale plan)."""
        return job_id in self.ran

    def _autonomous(self) -> None:
        a = self.agent
        me = a.state.get(a.node_id)
        if me is None or self.offer <= 0:
            return
        res = me.snapshot.get("resources") or {}
        node = NodeView(a.node_id, tuple(GpuView(int(g.get("index", i)), (g.get("mem_total_bytes") or 0) / GIB)
                                         for i, g in enumerate(res.get("gpus") or [])),
                        frozenset(a.config.agent.tags), 0.0, "ephemeral" in a.config.agent.tags, self.offer,
                        a.tracker.level, float(res.get("disk_percent", 0.0)), a.limits.disk_max_percent,
                        vram_limit_ratio=a.limits.gpu_max_percent / 100.0)
        running = tuple(RunningJob(j.job_id, j.template.name, a.node_id, j.gpus, j.gpu_fraction, j.vram_gib)
                        for j in self.runner.jobs.values())
        p = plan(ClusterView({a.node_id: node}, running), self.catalog, self.newest_signals(), a.now(), term=0,
                 autonomous_only=True, seed=self.local_seq)
        for x in p.assignments:
            if not self.spawn_limit.try_acquire(a.now()):
                break
            self.local_seq += 1
            j = {"job_id": f"{a.node_id[:8]}-a{int(time.time())}-{self.local_seq}", "template": x.template,
                 "gpus": list(x.gpus), "gpu_fraction": x.gpu_fraction, "vram_gib": x.vram_gib,
                 "params": dict(x.params)}
            if self._admit(j["job_id"], x.template, j):
                self._start(j, 0)
        self.offer = max(0, self.offer - len(p.assignments))

    def update_offer(self) -> None:
        a = self.agent
        s = a.last_sample
        if s is None:
            return
        util = sum(g.util_percent for g in s.gpus) / len(s.gpus) if s.gpus else 0.0
        idle = a.monitor.idle_gpus(a.now())
        self.offer = self.pid.update(util, gpus=len(s.gpus), idle_gpus=idle, level=a.tracker.level, now=a.now())

    # -- driver ------------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as n:
            await n.start(self.runner.run)
            n.start_soon(self._schedule_loop)
            task_status.started()
            while True:
                self._watch_signals_file()
                self.act()
                await trio.sleep(1.0)

    async def _schedule_loop(self) -> None:
        while True:
            self.update_offer()
            view = self.agent.election.view
            if view.leader == self.agent.node_id and view.term is not None:
                self.lead(view.term)
            else:
                self.my_plan = None if view.leader is not None else self.my_plan
            self.agent.request_publish()
            await trio.sleep(self.settings.interval_s)

    # -- views -------------------------------------------------------------------------------------
    def jobs_view(self) -> dict[str, Any]:
        a = self.agent
        leader_plan = self.newest_plan()
        cluster = []
        for e in a.state.entries():
            for j in e.snapshot.get("jobs") or []:
                if isinstance(j, dict):
                    cluster.append({"node_id": e.origin, **j})
        refused = []
        for e in a.state.entries():
            for r in e.snapshot.get("refused") or []:
                if isinstance(r, dict):
                    refused.append({"node_id": e.origin, **r})
        refusing = []
        for e in a.state.entries():
            g = e.snapshot.get("guard") or {}
            level = int(g.get("level", 0)) if isinstance(g.get("level", 0), int) else 0
            if not may_start(OperationPriority.NORMAL, level):
                refusing.append({"node_id": e.origin, "level": level,
                                 "reason": f"degradation level {level} ({LEVEL_NAMES[min(4, level)]}) refuses NORMAL "
                                           f"work: {'; '.join(g.get('reasons') or []) or 'load high'}"})
        return {
            "node_id": a.node_id,
            "refusing": refusing,
            "leader": a.election.view.leader,
            "term": a.election.view.term,
            "offer": self.offer,
            "running": [j.to_wire() for j in self.runner.jobs.values()],
            "cluster_running": cluster,
            "pending": (leader_plan or {}).get("pending", []),
            "refused": refused,
            "history": self.history.recent(20),
            "signals_rejected": self.signals_rejected,
            "breaker": {"state": self.breaker.state, "consecutive_failures": self.breaker.consecutive_failures,
                        "trips": self.breaker.trips},
            "spawns_rate_limited": self.spawn_limit.refused,
        }
