"""Goodput under preemption, simulated (issue 41, item 6): ``p2pnode simulate --scenario goodput``.

A fleet of GPU nodes by class (``ephemeral``: spot boxes and marketplace hosts the provider takes back; ``durable``)
runs one training per config. Each node lives an exponential lifetime whose mean is its class's (``lifetimes``,
seconds; ``inf``: it never dies), drawn from an rng seeded by ``(seed, node, life)``, so both runs below see the very
same deaths. A node that dies comes back (a fresh box of the same class) ``replace_s`` later, with a new lifetime.
A training whose node died is placed again ``detect_s`` later (failure detection + ``orphan_grace_s`` + one plan),
on a free live node drawn at random (the planner's spread of trainings over a fleet that is mostly ephemeral; no
free node: it waits for one), and

* **with resume**: it first fetches its config's newest checkpoint a replica confirmed (``fetch_s``; none yet: it
  starts at once), then runs; it writes a checkpoint every ``checkpoint_interval_s`` of its run, which a durable
  replica confirms ``sync_lag_s`` later (unless the node died first);
* **without resume**: it starts from nothing (no fetch; every death loses the whole run).

Both runs are accounted by the agent's own core, :class:`p2pnode.node._goodput.GoodputBook` (a death is a run that
ended ``lost``; a run under way at the end has lost nothing yet), so the figures mean what ``/jobs`` ``goodput``
means: ``goodput = (run - lost) / (run + fetch)``. The time a config had no node (detection, waiting) is reported
apart (``down_s``): it is no node's time.

Pure and deterministic: a heap of events on a virtual clock; the same arguments give the same figures.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from ..node._goodput import GoodputBook, goodput_of
from ._inventory import SEED003

__all__ = ["DEFAULT_LIFETIMES", "format_goodput_report", "goodput_fleet", "parse_lifetimes", "run_goodput",
           "simulate_goodput"]

DEFAULT_LIFETIMES: dict[str, float] = {"ephemeral": 3600.0, "durable": math.inf}
"""Mean node lifetime per class (seconds): a spot box lives an hour on average; a durable node is never lost."""
CLASSES = ("ephemeral", "durable")
_LIFETIME = msgspec.json.Decoder(Annotated[float, msgspec.Meta(gt=0)])


def parse_lifetimes(text: str) -> dict[str, float]:
    """``"ephemeral=600,durable=inf"`` -> ``{class: mean lifetime s}``, over :data:`DEFAULT_LIFETIMES`. Raises
    ``ValueError`` for an unknown class or a lifetime that is not a positive number (or ``inf``)."""
    out = dict(DEFAULT_LIFETIMES)
    for part in filter(None, (p.strip() for p in text.split(","))):
        cls, sep, value = part.partition("=")
        if not sep or cls.strip() not in CLASSES:
            raise ValueError(f"{part!r}: expected CLASS=SECONDS, CLASS one of {', '.join(CLASSES)}")
        try:
            v = math.inf if value.strip() == "inf" else _LIFETIME.decode(value.strip().encode())
        except msgspec.DecodeError:  # a ValidationError too
            raise ValueError(f"{part!r}: a lifetime is a positive number of seconds (inf: never)") from None
        out[cls.strip()] = v
    return out


def goodput_fleet(inventory: str, nodes: int) -> dict[str, str]:
    """Node name -> class: seed 003's GPU machines (Vast.ai ephemeral, the rest durable), or ``nodes`` nodes, three
    in four ephemeral (``random``)."""
    if inventory == "seed003":
        return {name: "ephemeral" if provider == "vast" else "durable"
                for name, vram, provider, _ in SEED003 if vram}
    return {f"n{i}": "durable" if i % 4 == 3 else "ephemeral" for i in range(max(1, nodes))}


class _Sim:
    def __init__(self, fleet: Mapping[str, str], configs: int, *, resume: bool, seed: int,
                 lifetimes: Mapping[str, float], duration_s: float, checkpoint_interval_s: float, sync_lag_s: float,
                 fetch_s: float, detect_s: float, replace_s: float) -> None:
        self.fleet, self.resume, self.seed, self.lifetimes = fleet, resume, seed, lifetimes
        self.duration_s, self.interval_s, self.lag_s = duration_s, checkpoint_interval_s, sync_lag_s
        self.fetch_s, self.detect_s, self.replace_s = fetch_s, detect_s, replace_s
        self.rng = random.Random(f"goodput-place-{seed}")
        self.book = GoodputBook()
        self.heap: list[tuple[float, int, tuple[Any, ...]]] = []
        self.n = 0
        self.alive: dict[str, bool] = {}
        self.lives: dict[str, int] = {}
        self.holder: dict[str, str] = {}  # node -> config it trains
        self.where: dict[str, str] = {}  # config -> node
        self.gen: dict[str, int] = {}
        self.has_checkpoint: dict[str, bool] = {}
        self.waiting: list[str] = []
        self.down_since: dict[str, float] = {}
        self.down_s = 0.0
        self.deaths = 0
        self.configs = [f"c{i}" for i in range(configs)]

    def push(self, t: float, ev: tuple[Any, ...]) -> None:
        if t <= self.duration_s:
            self.n += 1
            heapq.heappush(self.heap, (t, self.n, ev))

    def _live(self, node: str, t: float) -> None:
        self.alive[node] = True
        life = self.lives.get(node, 0) + 1
        self.lives[node] = life
        mean = self.lifetimes.get(self.fleet[node], math.inf)
        if math.isfinite(mean):
            self.push(t + random.Random(f"goodput-life-{self.seed}-{node}-{life}").expovariate(1.0 / mean),
                      ("die", node))

    def run(self) -> dict[str, Any]:
        for node in self.fleet:
            self._live(node, 0.0)
        for c in self.configs:
            self.gen[c] = 0
            self._place(c, 0.0)
        while self.heap:
            t, _, ev = heapq.heappop(self.heap)
            getattr(self, "_on_" + ev[0])(t, *ev[1:])
        end = self.duration_s
        for since in self.down_since.values():
            self.down_s += end - since
        totals = self.book.totals(end)
        run_s = sum(c.run_s for c in totals.values())
        lost_s = sum(c.lost_s for c in totals.values())
        fetch_s = sum(c.fetch_s for c in totals.values())
        return {"resume": self.resume, "run_s": round(run_s, 1), "lost_s": round(lost_s, 1),
                "fetch_s": round(fetch_s, 1), "down_s": round(self.down_s, 1), "deaths": self.deaths,
                "interrupted": sum(sum(c.interrupted.values()) for c in totals.values()),
                "goodput": goodput_of(run_s, lost_s, fetch_s),
                "by_config": {k: c.view() for k, c in sorted(totals.items())}}

    def _job(self, config: str) -> str:
        return f"{config}-{self.gen[config]}"

    def _place(self, config: str, t: float) -> None:
        free = [n for n in self.fleet if self.alive.get(n) and n not in self.holder]
        if not free:
            self.waiting.append(config)
            self.down_since.setdefault(config, t)
            return
        since = self.down_since.pop(config, None)
        if since is not None:
            self.down_s += t - since
        node = self.rng.choice(free)
        self.gen[config] += 1
        self.holder[node], self.where[config] = config, node
        job = self._job(config)
        if self.resume and self.has_checkpoint.get(config):
            self.book.fetch_started(job, config, t)
            self.push(t + self.fetch_s, ("run", config, self.gen[config]))
        else:
            self._on_run(t, config, self.gen[config])

    def _on_run(self, t: float, config: str, gen: int) -> None:
        if gen != self.gen[config] or config not in self.where:
            return
        self.book.run_started(self._job(config), config, t)
        if self.resume:
            self.push(t + self.interval_s, ("checkpoint", config, gen, 1))

    def _on_checkpoint(self, t: float, config: str, gen: int, seq: int) -> None:
        if gen != self.gen[config] or config not in self.where:
            return
        self.book.checkpoint_taken(self._job(config), seq, t)
        self.push(t + self.lag_s, ("confirm", config, gen, seq))
        self.push(t + self.interval_s, ("checkpoint", config, gen, seq + 1))

    def _on_confirm(self, t: float, config: str, gen: int, seq: int) -> None:
        if gen != self.gen[config] or config not in self.where:
            return  # its node died first: the replica never got it
        self.book.checkpoint_confirmed(self._job(config), seq, t)
        self.has_checkpoint[config] = True

    def _on_die(self, t: float, node: str) -> None:
        self.alive[node] = False
        self.deaths += 1
        self.push(t + self.replace_s, ("back", node))
        config = self.holder.pop(node, None)
        if config is None:
            return
        del self.where[config]
        self.book.run_ended(self._job(config), "lost", t)  # a fetch under way ends with it (nothing ran)
        self.down_since[config] = t
        self.push(t + self.detect_s, ("replace", config))

    def _on_replace(self, t: float, config: str) -> None:
        if config not in self.where:
            self._place(config, t)

    def _on_back(self, t: float, node: str) -> None:
        self._live(node, t)
        waiting, self.waiting = self.waiting, []
        for c in waiting:
            self._place(c, t)


def run_goodput(*, resume: bool, seed: int = 0, inventory: str = "seed003", nodes: int = 16,
                configs: int | None = None, lifetimes: Mapping[str, float] | None = None,
                duration_s: float = 24 * 3600.0, checkpoint_interval_s: float = 60.0, sync_lag_s: float = 5.0,
                fetch_s: float = 30.0, detect_s: float = 45.0, replace_s: float = 300.0) -> dict[str, Any]:
    """One simulated run (module docstring): totals (seconds), deaths, interruptions, ``goodput`` and the figures
    per config. ``configs``: trainings (default: half the fleet, at least 1; at most the fleet's size)."""
    fleet = goodput_fleet(inventory, nodes)
    n = min(len(fleet), configs if configs is not None else max(1, len(fleet) // 2))
    sim = _Sim(fleet, n, resume=resume, seed=seed, lifetimes=lifetimes or DEFAULT_LIFETIMES,
               duration_s=duration_s, checkpoint_interval_s=checkpoint_interval_s, sync_lag_s=sync_lag_s,
               fetch_s=fetch_s, detect_s=detect_s, replace_s=replace_s)
    out = sim.run()
    out.update(nodes=len(fleet), configs=n)
    return out


def simulate_goodput(**kw: Any) -> dict[str, Any]:
    """:func:`run_goodput` with and without resume, same arguments and seed: ``{"with_resume", "without_resume",
    "params"}``."""
    params = {k: (v if not isinstance(v, Mapping) else dict(v)) for k, v in kw.items()}
    return {"with_resume": run_goodput(resume=True, **kw), "without_resume": run_goodput(resume=False, **kw),
            "params": params}


def format_goodput_report(r: Mapping[str, Any]) -> str:
    """The two runs of :func:`simulate_goodput`, one line each, in words."""
    w = r["with_resume"]
    lines = [f"goodput: {w['configs']} trainings on {w['nodes']} nodes, {w['deaths']} node deaths (seeded lifetimes "
             f"by class)"]
    for name, x in (("with resume", w), ("without resume", r["without_resume"])):
        g = x["goodput"]
        lines.append(f"  {name:<15} goodput {'-' if g is None else f'{100 * g:.1f}%'}: ran {x['run_s'] / 3600:.1f} h, "
                     f"lost {x['lost_s'] / 3600:.1f} h in {x['interrupted']} interruptions, fetching "
                     f"{x['fetch_s'] / 3600:.2f} h; no node for {x['down_s'] / 3600:.1f} h")
    return "\n".join(lines)
