"""Job control's part in scaling (:class:`p2pnode.jobs._control.JobControl`, whose mixin this is): the ledger's
spread before a provider call, the provider plugin, the ``scaling`` section, and the drain deadline on the
monotonic clock."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from ..snapshot import ScalingSection


class ControlScaling:
    """Scaling's driver side (mixin of :class:`p2pnode.jobs._control.JobControl`: it uses the driver's
    attributes, set in its ``__init__``)."""

    if TYPE_CHECKING:  # the driver's attributes this part uses (set in JobControl.__init__)
        from ..node import JobCore
        from ._operator import OperatorControl

        ctx: Any
        core: JobCore
        operator: OperatorControl
        scaling_digest: str

    def _spread_ledger(self) -> None:
        """Before a provider call: publish the ledger that records it now and gossip it at once to up to three
        live voters (then other members), so a new leader most likely holds the action even if this one dies
        during the call. A leader that dies within that exchange may still lose the record; the next one then
        finds the provider's nodes under an id no ledger names through ``list()`` and counts them as starting
        (:meth:`p2pnode.scheduler._scaling.ScalingCore.lead`)."""
        ctx = self.ctx
        peers = sorted((m for m in ctx.members(live=True) if m.origin != ctx.node_id and m.addr),
                       key=lambda m: ("voter" not in m.snapshot.tags, m.origin))
        if not peers:
            ctx.publish_soon()
        else:
            ctx.publish_to(*(m.origin for m in peers[:3]))  # one snapshot version, gossiped to each at once

    def _load_provider(self) -> Any:
        """The provider plugin of ``[scaling] provider`` (called once, in a worker thread)."""
        from ..providers import ProviderContext, load_provider  # plugins load only where scaling is on

        ctx = self.ctx
        addrs = [getattr(ctx, "addr", "") or ""] + [m.addr for m in ctx.members()
                                                   if m.origin != ctx.node_id and m.state.name == "ALIVE"]
        return load_provider(ctx.config.scaling, ProviderContext.of(ctx.config, [a for a in addrs if a][:16]))

    def scaling_section(self) -> ScalingSection:
        """This node's ``scaling`` section: its ``[scaling]`` digest, the action that started it, and while it
        leads, the ledger and verdicts."""
        started_by = self.ctx.config.agent.started_by
        if self.core.scaling is None:
            return ScalingSection(settings_digest=self.scaling_digest, started_by=started_by)
        return self.core.scaling.section(self.scaling_digest, started_by)

    def _drain_at(self) -> float:
        """This node's drain deadline (wall-clock seconds in its ``operator`` section) on the monotonic clock
        (``inf``: not draining; in the past once it passed)."""
        deadline = self.operator.section.drain_deadline
        return self.ctx.now() + (deadline - time.time()) if deadline else math.inf
