"""Gang placement (pure): part of step 3 of :func:`p2pnode.scheduler.plan`. Every member of one instance of a gang
is placed, or none (Ray's placement groups, :meth:`_GangPlacing._place_gang`): members go on feasible nodes that run
its engine, have a free port block (``SchedulerConfig.gang_ports``, ``gang_port_block``) and a host, and share the
values of the ``same`` tag keys; they are laid out by the strategy (``strict_spread`` one per node, the default for
gangs; ``spread`` one per node first; ``pack`` fill the best nodes; ``strict_pack`` all on one); rank 0 is the
strongest member by GPU power. Gangs are not placed by preemption. A running gang's end is decided by the leader's gang
table (:mod:`p2pnode.node._gangs`); its members are stopped where what runs is accounted
(:meth:`._planstate._PlanState._broken_gangs`).
"""

from __future__ import annotations

from collections import defaultdict

from ..snapshot import GangSlot
from ._catalog import JobTemplate
from ._nodecap import NodeCap as _Node
from ._plancands import _Candidates
from ._planshape import (
    _NO_OFFER_CPU,
    _blocker,
    _offering,
    _same_values,
    _Shape,
)
from ._planview import (
    Assignment,
)


class _GangPlacing(_Candidates):
    """One plan's gang placements: members taken tentatively on candidate nodes, committed together or undone."""

    __slots__ = ()

    def _place_gang(self, t: JobTemplate, sh: _Shape, s_now: float) -> tuple[int, str]:
        """Place every member of one instance of gang ``t``, or none (Ray's placement groups): members go on
        feasible nodes that run its engine, have a free port block and a host, and share the values of the
        ``same`` tag keys; laid out by the strategy (``strict_spread`` one per node, the default for gangs;
        ``spread`` one per node first; ``pack`` fill the best nodes; ``strict_pack`` all on one). Rank 0 is the
        strongest member by GPU power; each member gets its own port block. Returns ``(members placed, "")`` or
        ``(0, why not)``. Gangs are not placed by preemption."""
        assert t.gang is not None
        m, low, gpu = t.gang.members, t.gang.minimum, sh.num_gpus > 0
        cands: list[tuple[float, _Node]] = []
        reasons: dict[str, int] = defaultdict(int)
        pools = self.gpu_pools if gpu else self.cpu_pools
        for rank, tier in enumerate(sh.tiers):
            for n in pools.get(tier, ()):  # the nodes offering work of its kind (a full one is skipped at once)
                v = n.view
                if not _offering(n, gpu) or t.engine not in v.engines or not v.host:
                    continue
                r = self._assess(n, rank, t, sh)
                if not isinstance(r, tuple):
                    if r:
                        reasons[r] += 1
                    continue
                if not self._free_block(n):
                    reasons[f"nodes that fit have no free port block in {self.cfg.gang_ports[0]}-"
                            f"{self.cfg.gang_ports[1]}"] += 1
                    continue
                cands.append((r[0], n))
        groups: dict[tuple[str, ...], list[tuple[float, _Node]]] = defaultdict(list)
        for score_, n in sorted(cands, key=lambda c: (-c[0], c[1].view.node_id)):
            key = _same_values(n.view.tags, t.gang.same)
            if key is not None:
                groups[key].append((score_, n))
        order = sorted(groups.values(), key=lambda g: (-sum(s for s, _ in g[:m]), g[0][1].view.node_id))
        for group in order:
            members = self._try_gang(t, sh, [n for _, n in group], m, low)
            if members:
                self._commit_gang(t, sh, members, s_now)
                return len(members), ""
        strategy = t.placement.strategy
        need = f"{low} nodes" if strategy == "strict_spread" else "room for " + str(low) + " members"
        why = f"gang of {m if low == m else f'{low}:{m}'} needs {need} that can take a member now"
        have = max((len(g) for g in groups.values()), default=0)
        same = f" sharing {', '.join(t.gang.same)}" if t.gang.same else ""
        why += f": {have} can{same}"
        if reasons:
            top = max(reasons.items(), key=lambda kv: kv[1])[0]
            why += f"; {top}"
        elif not gpu and not any(n.cpu_offer_left > 0 for n in self.nodes.values()):
            why += f"; {_NO_OFFER_CPU}"
        return 0, why

    def _free_block(self, n: _Node) -> int | None:
        """The lowest port block of the gang range free on ``n`` (None: all taken): one that overlaps no block in
        use there, whatever block size the leader that gave it used."""
        used = self.gang_blocks.get(n.view.node_id, ())
        size = max(1, self.cfg.gang_port_block)
        return next((b for b in self.blocks if not any(u < b + size and b < u + k for u, k in used)), None)

    def _try_gang(self, t: JobTemplate, sh: _Shape, nodes: list[_Node], m: int,
                  low: int = 0) -> list[tuple[_Node, tuple, int]]:
        """Tentatively take room for ``m`` members on ``nodes`` (best first) by the strategy, or at least ``low``
        (an elastic gang's minimum; 0: ``m``); every member's ``(node, fit, port block)``, or [] with every
        tentative take undone."""
        low = low or m
        strategy = t.placement.strategy
        taken: list[tuple[_Node, tuple, int]] = []
        gpu = sh.num_gpus > 0

        def take_one(n: _Node) -> bool:
            if (n.offer_left if gpu else n.cpu_offer_left) <= 0:
                return False
            if taken and _blocker(n, t, 0, self.catalog, self._need(t, n) if sh.predicted else sh.need) not in (
                    None, "strategy"):
                return False  # its CPUs, memory (declared or predicted) or custom resources ran out under the members
            fit = n.fit(sh.num_gpus, sh.vram)
            block = self._free_block(n)
            if fit is None or block is None:
                return False
            n.take(fit[0], fit[1], fit[2])
            n.use(t, 1.0, self._extra_gib(t, n) if sh.predicted else 0.0)
            if gpu:
                n.offer_left -= 1
            else:
                n.cpu_offer_left -= 1
            self.gang_blocks[n.view.node_id].add((block, max(1, self.cfg.gang_port_block)))
            taken.append((n, fit, block))
            return True

        if strategy == "strict_spread":
            for n in nodes:
                if len(taken) < m:
                    take_one(n)
        elif strategy == "spread":
            progress = True
            while len(taken) < m and progress:
                progress = False
                for n in nodes:
                    if len(taken) < m and take_one(n):
                        progress = True
        elif strategy == "pack":
            for n in nodes:
                while len(taken) < m and take_one(n):
                    pass
        else:  # strict_pack: every member on one node
            for n in nodes:
                while len(taken) < m and take_one(n):
                    pass
                if len(taken) >= low:
                    break
                self._untake(t, sh, taken)
                taken = []
        if len(taken) >= low:
            return taken
        self._untake(t, sh, taken)
        return []

    def _untake(self, t: JobTemplate, sh: _Shape, taken: list[tuple[_Node, tuple, int]]) -> None:
        """Undo tentative member takes (:meth:`_try_gang`)."""
        for n, fit, block in taken:
            n.take(fit[0], -fit[1], -fit[2])
            n.use(t, -1.0, self._extra_gib(t, n) if sh.predicted else 0.0)
            if sh.num_gpus > 0:
                n.offer_left += 1
            else:
                n.cpu_offer_left += 1
            self.gang_blocks[n.view.node_id].discard((block, max(1, self.cfg.gang_port_block)))

    def _commit_gang(self, t: JobTemplate, sh: _Shape, taken: list[tuple[_Node, tuple, int]], s_now: float) -> None:
        """Record a gang whose members' room is taken (:meth:`_try_gang`): ranks by GPU power (rank 0 the
        strongest: the rendezvous), job ids in rank order (the gang's id is rank 0's), the shares, one instance."""
        name, state, term = t.name, self.state, self.term
        taken = sorted(taken, key=lambda x: (-x[0].view.power, -sum(g.vram_gib for g in x[0].view.gpus),
                                             x[0].view.node_id, x[2]))
        first = state.job_seq + 1
        gid = f"{term}-{first}"
        master, master_port = taken[0][0].view.host, taken[0][2]
        size, block = len(taken), max(1, self.cfg.gang_port_block)
        assert t.gang is not None
        low = t.gang.min_members if t.gang.elastic else 0
        if low:  # an elastic gang: its most members are its ranks, those not placed now vacant (a member joins)
            size = t.gang.members
        for rank, (n, (gpus, frac, vram), port) in enumerate(taken):
            n.templates[name] += 1
            n.jobs += 1
            if sh.group:
                n.groups.add(sh.group)
            gpu_time = frac * len(gpus)
            self.used_total += gpu_time
            self.kind_used[t.kind] += gpu_time
            if n.tier == 1:
                self.tier1_used[t.config] += gpu_time
            state.job_seq += 1
            slot = GangSlot(id=gid, rank=rank, size=size, master=master, master_port=master_port, port_base=port,
                            ports=block, engine=t.engine, min_size=low)  # type: ignore[arg-type]
            figures = self._figures(t, n)
            self.assignments.append(Assignment(
                job_id=f"{term}-{state.job_seq}", template=name, node_id=n.view.node_id, gpus=gpus,
                gpu_fraction=frac, vram_gib=vram, params=sh.params, term=term, score=round(s_now, 6), gang=slot,
                memory_gib=None if figures is None else figures.memory_gib,
                vram_peak_gib=0.0 if figures is None else figures.vram_peak_gib))
        self.instances[name] += 1
        if sh.training:
            self.training_on[t.config] = taken[0][0].view.node_id
        state.pending_since.pop(name, None)
