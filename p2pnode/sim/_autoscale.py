"""Scaling on a virtual clock: the leader's :class:`p2pnode.scheduler._scaling.ScalingCore` over a bursty day of
work, with a simulated provider. Pure, deterministic (same seed, same figures).

The model: a fleet of static voter nodes plus nodes the provider starts (they join after a boot delay drawn
from 60-180 s, and leave at once when removed); work arrives in bursts (a burst every ``burst_every_s`` of
Poisson size around ``burst_jobs``, with a quieter trickle between) as one-off runs of two templates: ``train``
(one GPU with 60 GiB, 15-40 min) and ``selfplay`` (one GPU of 8 GiB or more, 2-10 min). Every ``tick_s`` the queue
is placed first-in first-out on free GPUs of a class that can take it by the scaling core's own rule
(:func:`~p2pnode.scheduler._scaling.class_takes`: usable VRAM under the guard's limit, so ``train`` only on H100
nodes, whose 80 GiB leave 64 usable, never on a 4090's 19.2), the cheapest class with room first; waiting runs
become the plan's pending entries (``PlanPending`` with ``of`` set), and the scaling core steps with the fleet
view; its :class:`~p2pnode.scheduler._scaling.ProviderCall` effects are carried out by the simulated provider (a
call may fail with ``fail_rate``; the core decides again after its cooldown).

:func:`run_autoscale` reports, per policy: actions (up, down, failed), direction flips within 10 minutes (flaps),
queue waits (p50, p99, max), node-hours and cost per class, and GPU utilization; :func:`compare_autoscale` runs
the same seed under the configured policy and under one without hysteresis (no cooldown, no ``up_after_s``, no
idle timeout) side by side.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Any

import msgspec

from ..scheduler import catalog_from_text
from ..scheduler._scaling import (
    ClassPolicy,
    FleetNode,
    ProviderCall,
    ProviderList,
    ScalingCore,
    ScalingPolicy,
    class_shape,
    class_takes,
)
from ..snapshot import PlanPending

__all__ = ["compare_autoscale", "format_autoscale_report", "run_autoscale"]

CATALOG = """
[[job]]
name = "train"
kind = "training"
config = "c1"
argv = ["true"]
max_concurrency = 0
[job.resources]
num_gpus = 1
vram_gib = 60

[[job]]
name = "selfplay"
kind = "selfplay"
config = "c1"
argv = ["true"]
max_concurrency = 0
[job.resources]
num_gpus = 1
vram_gib = 8
"""
DURATION_S = {"train": (900.0, 2400.0), "selfplay": (120.0, 600.0)}
CLASSES = {"1xH100": ClassPolicy(min_nodes=2, max_nodes=16, price_per_hour=2.5),
           "1x4090": ClassPolicy(min_nodes=0, max_nodes=24, price_per_hour=0.4)}
MAX_PENDING = 256
FLAP_WINDOW_S = 600.0


class _Node(msgspec.Struct):
    node_id: str
    node_class: str
    started_by: str = ""
    voter: bool = False
    jobs: list[tuple[str, float, float]] = msgspec.field(default_factory=list)  # (template, start, end)
    joined_at: float = 0.0


class _Sim:
    def __init__(self, policy: ScalingPolicy, seed: int, duration_s: float, tick_s: float, fail_rate: float,
                 burst_every_s: float, burst_jobs: int) -> None:
        self.rng = random.Random(seed)
        self.policy, self.duration_s, self.tick_s, self.fail_rate = policy, duration_s, tick_s, fail_rate
        self.catalog = catalog_from_text(CATALOG, source="autoscale", base_dir=".")
        self.takes = {(name, cls): class_takes(t, shape, self.catalog, policy.vram_limit_ratio)[0] > 0
                      for name, t in self.catalog.templates.items() for cls in CLASSES
                      if (shape := class_shape(cls)) is not None}
        """``(template, class)`` -> whether a node of the class can run it: the scaling core's own rule (usable
        VRAM under the guard's limit), so the simulation places only where the core would buy."""
        self.core = ScalingCore(policy)
        self.core.lead(1, [], -1e9)
        self.nodes: dict[str, _Node] = {f"static-{i}": _Node(f"static-{i}", "1xH100", voter=True)
                                        for i in range(CLASSES["1xH100"].min_nodes)}
        self.booting: list[tuple[float, str, str, str]] = []  # (ready at, node id, class, request id)
        self.queue: list[tuple[float, int, str]] = []  # (arrived, seq, template)
        self.arrivals = self._arrivals(burst_every_s, burst_jobs)
        self.waits: list[float] = []
        self.actions: list[tuple[float, str, str, int, str]] = []  # (at, class, op, count, outcome)
        self.node_seconds: dict[str, float] = dict.fromkeys(CLASSES, 0.0)
        self.busy_gpu_s = 0.0
        self.seq = 0
        self.removed: dict[str, str] = {}  # node id -> the request that started it

    def _arrivals(self, every_s: float, size: int) -> list[tuple[float, str]]:
        out = []
        t = 0.0
        while t < self.duration_s:
            burst = self.rng.uniform(0.5, 1.5) * size
            for _ in range(int(burst)):
                out.append((t + self.rng.uniform(0, 120.0), "train" if self.rng.random() < 0.25 else "selfplay"))
            for _ in range(int(size / 10)):
                out.append((t + self.rng.uniform(0, every_s), "selfplay"))
            t += every_s
        return sorted(out)

    def run(self) -> dict[str, Any]:
        t = 0.0
        arrivals = list(reversed(self.arrivals))
        while t < self.duration_s:
            while arrivals and arrivals[-1][0] <= t:
                at, template = arrivals.pop()
                self.seq += 1
                heapq.heappush(self.queue, (at, self.seq, template))
            self._boot(t)
            self._finish(t)
            self._place(t)
            self._scale(t)
            self._account(t)
            t += self.tick_s
        return self._report()

    def _boot(self, t: float) -> None:
        while self.booting and self.booting[0][0] <= t:
            _at, nid, cls, req = heapq.heappop(self.booting)
            self.nodes[nid] = _Node(nid, cls, started_by=req, joined_at=t)

    def _finish(self, t: float) -> None:
        for n in self.nodes.values():
            n.jobs = [j for j in n.jobs if j[2] > t]

    def _place(self, t: float) -> None:
        order = sorted(self.nodes.values(), key=lambda n: (CLASSES[n.node_class].price_per_hour, n.node_id))
        left = []
        draining = set(self.core.draining)
        while self.queue:
            at, seq, template = heapq.heappop(self.queue)
            fits = [n for n in order if not n.jobs and n.node_id not in draining
                    and self.takes.get((template, n.node_class), False)]
            if not fits:
                left.append((at, seq, template))
                continue
            lo, hi = DURATION_S[template]
            fits[0].jobs.append((template, t, t + self.rng.uniform(lo, hi)))
            self.waits.append(t - at)
        for item in left:
            heapq.heappush(self.queue, item)

    def _scale(self, t: float) -> None:
        fleet = [FleetNode(node_id=n.node_id, node_class=n.node_class, gpus=1, gpu_used=float(len(n.jobs)),
                           running=tuple((tm, t - s) for tm, s, _e in n.jobs), started_by=n.started_by,
                           voter=n.voter) for n in self.nodes.values()]
        pending = [PlanPending(template=f"{tm} (run {seq})", of=tm, wait_s=t - at)
                   for at, seq, tm in sorted(self.queue)[:MAX_PENDING]]
        for e in self.core.step(fleet, pending, self.catalog, None, t):
            self._provider(e, t)

    def _provider(self, e: ProviderCall | ProviderList, t: float) -> None:
        if isinstance(e, ProviderList):  # what the simulated provider started: booting, joined or removed
            listing = [(req, nid, "starting", cls) for _at, nid, cls, req in self.booting]
            listing += [(n.started_by, n.node_id, "running", n.node_class) for n in self.nodes.values()
                        if n.started_by]
            listing += [(req, nid, "stopped", "") for nid, req in self.removed.items()]
            self.core.listed(listing, "", t)
            return
        a = e.action
        if self.rng.random() < self.fail_rate:
            self.core.result(a.id, "simulated provider failure", t)
            self.actions.append((t, a.node_class, a.op, a.count, "failed"))
            return
        if a.op == "up":
            for i in range(a.count):
                heapq.heappush(self.booting, (t + self.rng.uniform(60.0, 180.0), f"{a.id}.{i}", a.node_class, a.id))
        else:
            for nid in a.nodes:
                gone = self.nodes.pop(nid, None)
                if gone is not None:
                    self.removed[nid] = gone.started_by
        self.core.result(a.id, "", t)
        self.actions.append((t, a.node_class, a.op, a.count, "done"))

    def _account(self, t: float) -> None:
        for n in self.nodes.values():
            self.node_seconds[n.node_class] += self.tick_s
            self.busy_gpu_s += self.tick_s * len(n.jobs)
        for _at, _nid, cls, _req in self.booting:  # a booting machine is paid for
            self.node_seconds[cls] += self.tick_s

    def _report(self) -> dict[str, Any]:
        waits = sorted(self.waits) or [0.0]
        done = [a for a in self.actions if a[4] == "done"]
        flaps = 0
        for cls in CLASSES:
            ops = [(at, op) for at, c, op, _n, outcome in done if c == cls]
            flaps += sum(1 for (t1, o1), (t2, o2) in zip(ops, ops[1:]) if o1 != o2 and t2 - t1 < FLAP_WINDOW_S)
        total_s = sum(self.node_seconds.values())
        return {
            "actions_up": sum(1 for a in done if a[2] == "up"),
            "actions_down": sum(1 for a in done if a[2] == "down"),
            "actions_failed": sum(1 for a in self.actions if a[4] == "failed"),
            "nodes_started": sum(a[3] for a in done if a[2] == "up"),
            "flaps": flaps,
            "jobs": len(self.waits),
            "queued_at_end": len(self.queue),
            "wait_p50_s": round(waits[len(waits) // 2], 1),
            "wait_p99_s": round(waits[min(len(waits) - 1, math.ceil(0.99 * len(waits)) - 1)], 1),
            "wait_max_s": round(waits[-1], 1),
            "node_hours": {c: round(s / 3600, 1) for c, s in self.node_seconds.items()},
            "cost": round(sum(CLASSES[c].price_per_hour * s / 3600 for c, s in self.node_seconds.items()), 1),
            "gpu_utilization": round(self.busy_gpu_s / total_s, 3) if total_s else None,
            "min_action_gap_s": round(min((b[0] - a[0] for a, b in zip(self.actions, self.actions[1:])),
                                          default=math.inf), 1),
        }


def run_autoscale(policy: ScalingPolicy | None = None, *, seed: int = 0, duration_s: float = 6 * 3600.0,
                  tick_s: float = 10.0, fail_rate: float = 0.05, burst_every_s: float = 3600.0,
                  burst_jobs: int = 30) -> dict[str, Any]:
    """One simulated run (see the module docstring); ``policy`` defaults to the ``[scaling]`` defaults with the
    two classes of :data:`CLASSES` and a provider. Times in seconds, cost in the classes' price units."""
    policy = policy or ScalingPolicy(provider="sim", classes=CLASSES)
    return _Sim(policy, seed, duration_s, tick_s, fail_rate, burst_every_s, burst_jobs).run()


def compare_autoscale(*, seed: int = 0, duration_s: float = 6 * 3600.0) -> dict[str, Any]:
    """The same seed under the default policy (cooldown 300 s, ``up_after_s`` 60 s, idle timeout 300 s) and
    under one without hysteresis (all three 0): side by side."""
    hysteresis = ScalingPolicy(provider="sim", classes=CLASSES)
    none = ScalingPolicy(provider="sim", classes=CLASSES, cooldown_s=0.0, up_after_s=0.0, idle_timeout_s=0.0)
    return {"hysteresis": run_autoscale(hysteresis, seed=seed, duration_s=duration_s),
            "no_hysteresis": run_autoscale(none, seed=seed, duration_s=duration_s)}


def format_autoscale_report(r: dict[str, Any]) -> str:
    """A table of :func:`compare_autoscale`'s figures, one column per policy."""
    keys = ["jobs", "queued_at_end", "actions_up", "actions_down", "actions_failed", "nodes_started", "flaps",
            "min_action_gap_s", "wait_p50_s", "wait_p99_s", "wait_max_s", "gpu_utilization", "cost"]
    cols = list(r)
    lines = [f"{'':22}" + "".join(f"{c:>16}" for c in cols)]
    for k in keys:
        lines.append(f"{k:22}" + "".join(f"{str(r[c][k]):>16}" for c in cols))
    for cls in CLASSES:
        lines.append(f"{'node_hours ' + cls:22}" + "".join(f"{str(r[c]['node_hours'][cls]):>16}" for c in cols))
    return "\n".join(lines)
