"""Where the checkpoints a held stop waits for are replicated (issue 41, item 3; the pure rule is
:meth:`p2pnode.node._ckwarn.CheckpointWarnings.replicas`): :class:`ReplicaView` reads, from the members' signed
snapshots this node holds, how many live durable members other than this node there are and which checkpoint refs
they list (``sync.checkpoints``, :class:`p2pnode.snapshot.CheckpointRef`: a durable member lists a checkpoint once
it holds it whole and verified), and from the sync origin (:class:`p2pnode.sync._checkpoints.CheckpointOrigin`,
set by the agent's wiring, :meth:`p2pnode._agentcatalog.AgentCatalog._wire_checkpoints`) this node's own signed
checkpoints with their entry names. It reads in-memory state only: no file, no network.

"Durable" is the member's effective ``durable`` tag (certified when operator keys are pinned,
:mod:`p2pnode.certs`) of a live member (alive or suspect) that is not leaving.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..node._ckwarn import MAX_NEWS, OwnCheckpoint, Replica, ReplicaNews
from ..snapshot import SyncSection

__all__ = ["ReplicaView", "own_checkpoints"]


def own_checkpoints(origin: Any) -> list[OwnCheckpoint]:
    """This node's signed checkpoints (``origin.refs``) with the name of each one's entry (``origin.announced``:
    (config, dir) -> name -> (job id, seq)); a ref whose entry is not announced (an older state file) is left
    out. At most :data:`p2pnode.node._ckwarn.MAX_NEWS`."""
    names: dict[tuple[str, str, int], str] = {}
    for (config, _dir), entries in origin.announced.items():
        for name, (job_id, seq) in entries.items():
            names[(config, job_id, seq)] = name
    out = []
    for r in origin.refs[:MAX_NEWS]:
        name = names.get((r.config, r.job_id, r.seq))
        if name is not None:
            out.append(OwnCheckpoint(r.config, r.job_id, r.seq, r.digest, name))
    return out


class ReplicaView:
    """``ReplicaView(ctx)()``: the :class:`~p2pnode.node._ckwarn.ReplicaNews` of now (module docstring). ``own``:
    this node's signed checkpoints (the agent sets it when sync signs checkpoints; default none)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.own: Callable[[], list[OwnCheckpoint]] = list

    def __call__(self) -> ReplicaNews:
        me = self.ctx.node_id
        durable = 0
        held: list[Replica] = []
        for m in self.ctx.members(live=True):
            if m.origin == me or "durable" not in m.snapshot.tags or m.leaving:
                continue
            durable += 1
            sec = self.ctx.section(m.origin, SyncSection)
            for r in (sec.checkpoints if sec is not None else ()):
                if r.origin == me and len(held) < MAX_NEWS:
                    held.append(Replica(m.origin, r.config, r.job_id, r.seq, r.digest))
        return ReplicaNews(durable, tuple(self.own()[:MAX_NEWS]), tuple(held))
