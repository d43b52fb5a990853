"""The agent's roles and voter roll inputs (a part of :class:`p2pnode.agent.Agent`, which inherits it): this node's
tags as they count (:mod:`p2pnode.certs`), its ``role.cert`` reloaded and the members' roles rechecked by time,
``/status`` ``node.roles``, and what the core's roll adoption reads (seed peers that answered, the members' tags,
their keys). The agent's own state is declared here for the type checker only; nothing else imports this module.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .certs import RoleGate, effective_tags
from .config import Config
from .gossip import ClusterState, PeerBook
from .identity import Identity
from .node import MemberInfoCache, NodeCore
from .node._persist import (
    OwnCert,
    save_role_floors,
)

log = logging.getLogger("p2pnode.agent")


class _AgentRoles:
    """Roles by certificate, and the roll's inputs, of one agent."""

    config: Config
    node_id: str
    data_dir: Path
    identity: Identity
    core: NodeCore
    state: ClusterState
    peers: PeerBook
    roles: RoleGate
    own_cert: OwnCert
    _floors_saved: int
    _info_cache: MemberInfoCache
    _job_news: bool
    _wake: trio.Event

    if TYPE_CHECKING:  # defined by the agent
        def publish_soon(self) -> None: ...

    def _report_seed_peers(self) -> None:
        """Tell the core which members the operator-given peers (join addresses, peers file) are: the member that
        answered from each address (``PeerAddr.answered_as``: the sender of a reply we got by dialling it, whose
        signed snapshot we hold). A snapshot that merely advertises a seed's address never counts: a fake member
        claiming it would otherwise hand a new node its roll."""
        given = [p for p in self.peers.all() if p.source in ("join", "peers-file")]
        if not given:
            return  # not in the peer book yet (GossipDriver.add_seeds)
        seeds = [p for p in given if p.addr not in self.peers.self_addrs]
        answered = [p.answered_as for p in seeds if p.answered_as]
        self.core.seed_peers_answered(answered, all_answered=all(p.answered_as for p in seeds))

    def _own_tags(self) -> list[str]:
        """This node's tags as they count (:mod:`p2pnode.certs`): its effective snapshot's once it published,
        else its configured tags judged against its own certificate and pinned keys."""
        own = self.state.get(self.node_id)
        if own is not None:
            return own.snapshot.tags
        tags = list(self.config.agent.tags)
        return effective_tags(tags, self.roles.check(self.node_id, tags, self.own_cert.cert, time.time()))

    def _recheck_roles(self) -> None:
        """Reload ``role.cert`` when it changed (publish it soon) and recompute the effective roles of members
        whose certificate started or ended by now (:meth:`p2pnode.gossip.ClusterState.recheck_roles`)."""
        if self.own_cert.poll():
            self.publish_soon()
        changed = self.state.recheck_roles(time.time())
        if self.roles.floors_changed != self._floors_saved:
            self._floors_saved = self.roles.floors_changed
            try:
                save_role_floors(self.data_dir, self.roles.floors())
            except OSError as exc:
                log.warning("could not save the role certificate floors: %s", exc)
        for origin in changed:
            self._info_cache.forget(origin)
        if changed:
            log.warning("roles changed by certificate time for %s", ", ".join(changed[:8]))
            self._job_news = True
            self._wake.set()

    def role_cert_view(self) -> dict[str, Any]:
        """``/status`` ``node.roles``: whether operator keys are pinned, this node's ``role.cert`` (loaded, or why
        it was dropped), what it grants and until when, the roles that count here (``roles``), those claimed that
        do not (``refused``) and why (``reason``, :data:`p2pnode.certs.REASONS`), and the refusals of every
        member's certificate counted by reason since start."""
        c = self.own_cert.cert
        check = self.roles.check_of(self.node_id)
        return {
            "pinned": self.roles.pinned, "operator_keys": len(self.roles.keys), "file": self.own_cert.path.name,
            "file_error": self.own_cert.error, "reloads": self.own_cert.loads,
            "cert": None if c is None else {
                "roles": list(c.roles), "issued_at": c.issued_at, "expires_at": c.expires_at,
                "expires_in_s": round(c.expires_at - time.time(), 1), "issuer": c.issuer, "node_class": c.node_class,
                "provider_id": c.provider_id},
            "claimed": list(check.claimed) if check else [], "roles": list(check.roles) if check else [],
            "refused": list(check.refused) if check else [], "reason": check.reason if check else "",
            "refused_total": dict(self.roles.refused),
        }

    def _roll_candidates(self) -> list[tuple[str, list[str], bool]]:
        return [(e.origin, e.snapshot.tags, e.leaving) for e in self.state.entries()]

    def _node_key(self, node_id: str) -> bytes | None:
        """A member's public key from its signed snapshot (ours from our identity)."""
        if node_id == self.node_id:
            return self.identity.public_key
        e = self.state.get(node_id)
        return e.envelope.key if e is not None else None
