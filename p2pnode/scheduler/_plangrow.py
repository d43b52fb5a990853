"""Elastic gangs get members back (issue 41, item 4; pure): a step of :func:`p2pnode.scheduler.plan` after what runs
is accounted and before new work is placed.

An elastic gang (``[job.gang] members = "MIN:MAX"``, :attr:`p2pnode.snapshot.GangSlot.min_size`) runs with MIN to
MAX members; its ranks without a running (or assigned) member are free. While its rank 0 runs (the rendezvous host,
torchrun's c10d store) and the leader's gang table has not ended it, each free rank is given to a new member on a
node that can take one now, as when the gang was placed (:mod:`._plangang`: its engine, a free port block, a host,
the ``same`` tag values of its members, the strategy: ``strict_spread`` a node without a member of it,
``strict_pack`` rank 0's node), with the gang's id and rendezvous (rank 0's host and first port): the new member's
torchrun joins the running gang, whose members restart their workers with the larger world. A gang is one instance:
a member added is not a new one. A rank whose member's node is dead stays held while that member's job is counted
(the orphan grace), so a rank is never given twice.
"""

from __future__ import annotations

from ..snapshot import GangSlot
from ._catalog import JobTemplate
from ._nodecap import NodeCap as _Node
from ._plangang import _GangPlacing
from ._planshape import _offering, _same_values, _Shape, _shape_of
from ._planview import Assignment, RunningJob


class _GangGrowing(_GangPlacing):
    """One plan's additions to running elastic gangs (see the module docstring)."""

    __slots__ = ()

    def grow_gangs(self) -> None:
        """Give each free rank of every running elastic gang a new member where a node can take one now (see the
        module docstring), until the plan's placement budget runs out."""
        stopped = {s.job_id for s in self.stops}
        broken = self._broken_gangs()
        for gid, members in sorted(self.gang_members.items()):
            slots = [r.gang for r in members if r.gang is not None]
            t = self.templates.get(members[0].template)
            if (gid in broken or t is None or t.gang is None or not t.gang.elastic or not slots
                    or any(r.job_id in stopped for r in members)):
                continue
            zero = next((s for s in slots if s.rank == 0), None)
            if zero is None or any(s.min_size == 0 or s.size != zero.size for s in slots):
                continue  # no rendezvous host (the gang ends), or not one elastic gang
            free = sorted(set(range(zero.size)) - {s.rank for s in slots})
            hosts = {r.node_id for r in members}
            sh: _Shape | None = None
            for rank in free:
                if len(self.assignments) >= self.cfg.max_assignments:
                    return
                if sh is None:
                    classes = sorted({n.view.node_class for n in self.nodes.values()}) if self.predictor else []
                    sh = _shape_of(t, self.catalog, self._has_memory_figures(t, classes))
                if not self._add_member(t, sh, members, zero, rank, hosts):
                    break  # no node takes one now: the next plan tries again

    def _add_member(self, t: JobTemplate, sh: _Shape, members: list[RunningJob], zero: GangSlot, rank: int,
                    hosts: set[str]) -> bool:
        """Give rank ``rank`` of the gang of rank-0 slot ``zero`` (its running ``members``, on ``hosts`` with those
        added in this plan, to which the node chosen is added) a new member on the best node that can take one now;
        whether one was placed. Under ``strict_spread`` a node of ``hosts`` is no candidate; under ``spread`` one
        is only when no other node takes the member."""
        assert t.gang is not None
        gpu = sh.num_gpus > 0
        tags = [self.nodes[h].view.tags for h in hosts if h in self.nodes]
        want = {_same_values(tg, t.gang.same) for tg in tags}
        best: tuple[tuple[bool, float, str], _Node, tuple, int] | None = None
        pools = self.gpu_pools if gpu else self.cpu_pools
        for tier_rank, tier in enumerate(sh.tiers):
            for n in pools.get(tier, ()):
                v = n.view
                if not _offering(n, gpu) or t.engine not in v.engines or not v.host:
                    continue
                if sh.strict_pack and v.node_id != next((r.node_id for r in members if r.gang is not None
                                                          and r.gang.rank == 0), ""):
                    continue
                if t.gang.same and len(want) == 1 and _same_values(v.tags, t.gang.same) not in want:
                    continue
                if sh.strict_spread and v.node_id in hosts:
                    continue  # one member per node (its GPUs may have room for another)
                got = self._assess(n, tier_rank, t, sh)
                block = self._free_block(n) if isinstance(got, tuple) else None
                if not isinstance(got, tuple) or block is None:
                    continue
                key = (v.node_id not in hosts if t.placement.strategy == "spread" else True, got[0], v.node_id)
                if best is None or key > best[0]:
                    best = (key, n, got[1], block)
        if best is None:
            return False
        _, n, (gpus, frac, vram), block = best
        hosts.add(n.view.node_id)
        n.take(gpus, frac, vram)
        n.use(t, 1.0, self._extra_gib(t, n) if sh.predicted else 0.0)
        if gpu:
            n.offer_left -= 1
        else:
            n.cpu_offer_left -= 1
        size = max(1, self.cfg.gang_port_block)
        self.gang_blocks[n.view.node_id].add((block, size))
        n.templates[t.name] += 1
        n.jobs += 1
        if sh.group:
            n.groups.add(sh.group)
        gpu_time = frac * len(gpus)
        self.used_total += gpu_time
        self.kind_used[t.kind] += gpu_time
        if n.tier == 1:
            self.tier1_used[t.config] += gpu_time
        self.state.job_seq += 1
        slot = GangSlot(id=zero.id, rank=rank, size=zero.size, master=zero.master, master_port=zero.master_port,
                        port_base=block, ports=size, engine=zero.engine, min_size=zero.min_size)
        figures = self._figures(t, n)
        self.assignments.append(Assignment(
            job_id=f"{self.term}-{self.state.job_seq}", template=t.name, node_id=n.view.node_id, gpus=gpus,
            gpu_fraction=frac, vram_gib=vram, params=sh.params, term=self.term, score=0.0, gang=slot,
            memory_gib=None if figures is None else figures.memory_gib,
            vram_peak_gib=0.0 if figures is None else figures.vram_peak_gib))
        return True
