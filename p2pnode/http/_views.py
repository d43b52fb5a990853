"""The JSON views behind ``/status``, ``/members``, ``/events`` and ``/jobs``: read-only, built from the typed
snapshots and the node's components, encoded by msgspec (typed sections are embedded as structs, so no dict walk
of a member's resources happens per request).

``node`` is the agent (duck-typed: see :data:`p2pnode.http._app.Agent` for what is read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..gossip import MemberState
from ..guard import LEVEL_NAMES, OperationPriority, may_start
from ..snapshot import SyncSection, snapshot_dict

__all__ = ["client_gone_counter", "events_view", "jobs_view", "members_view", "status_view"]


def client_gone_counter(node: Any) -> Callable[[], None]:
    """A callback counting replies dropped because the client had hung up (``http_clients_gone``)."""

    def gone() -> None:
        node.http_clients_gone += 1

    return gone


def _sync_summary(sync: SyncSection) -> dict[str, Any]:
    """A member's sync state: files it pushes and how many are below R; replicas it confirms; its data port."""
    out: dict[str, Any] = {}
    if sync.data_port:
        out["data_port"] = sync.data_port
    if sync.files is not None:
        out.update(files=sync.files, bytes=sync.bytes or 0, under_replicated=sync.under_replicated or 0)
    if sync.receipts:
        out["receipts"] = sum(len(v) for v in sync.receipts.values())
    return out


def members_view(node: Any) -> list[dict[str, Any]]:
    """``GET /members``: every member this node holds, itself included: id, address, snapshot version, state,
    incarnation, vote, catalog digest, age of its snapshot here (seconds), tags, power score (from the GPU
    table, not the member's claim), resources (the typed section) and a sync summary."""
    now = node.now()
    core = node.core
    out = []
    for e in node.state.entries():
        s = e.snapshot
        info = core.info(e.origin) if e.origin != node.node_id else None
        out.append({
            "id": e.origin,
            "self": e.origin == node.node_id,
            "addr": s.addr,
            "version": e.version,
            "state": (core.state_of(e.origin) or MemberState.ALIVE).value,
            "incarnation": s.membership.incarnation,
            "vote": s.vote,
            "catalog_digest": s.jobs.catalog_digest,
            "age_s": round(max(0.0, now - e.received_at), 3),
            "leaving": s.leaving,
            "tags": s.tags,
            "power_score": info.candidate.power_score if info else core.candidate.power_score,
            "resources": s.resources,
            "sync": _sync_summary(s.sync),
            "jobs_running": s.jobs.running_count or len(s.jobs.running),
            "cordoned": s.operator.cordoned,
            "draining": bool(s.operator.drain_deadline),
        })
    return out


def catalog_mismatch(node: Any) -> list[str]:
    """Members (not left) whose snapshot carries another catalog digest than ours."""
    mine = node.catalog.digest if node.catalog else ""
    return [e.origin for e in node.state.entries()
            if e.origin != node.node_id and node.core.state_of(e.origin) is not MemberState.LEFT
            and e.snapshot.jobs.catalog_digest != mine]


def status_view(node: Any) -> dict[str, Any]:
    """``GET /status``: this node, the election, membership, catalog, our own snapshot, every member, gossip and
    discovery counters. Times in seconds."""
    core, cfg, gossip = node.core, node.config, node.gossip
    own = node.state.get(node.node_id)
    view, election, membership = core.view, core.election, core.membership
    return {
        "node": {
            "id": node.node_id,
            "addr": node.addr,
            "version": own.version if own else None,
            "agent_version": node.agent_version,
            "started_at": node.started_at,
            "uptime_s": round(time.time() - node.started_at, 3),
            "trust": cfg.agent.trust,
            "cluster_open": cfg.agent.trust == "open",
            **node.trust.view(),
            "tags": list(cfg.agent.tags),
            "data_dir": str(node.data_dir),
            "leaving": node.leaving,
            "incarnation": membership.incarnation,
            "operator": node.jobs.operator.intents.view() if node.jobs is not None else None,
        },
        "election": {
            "leader": view.leader,
            "term": view.term,
            "highest_term": view.highest_term,
            "vote": election.vote.to_wire() if election.vote else None,
            "votes_for_leader": view.votes_for_leader,
            "quorum": view.quorum,
            "voters": view.voters,
            "leader_changes": core.leader_changes,
            "implausible_votes": election.implausible_votes,
            "outside_votes": election.outside_votes,  # votes of members off the roll: ignored
            "roll": {"voters": sorted(core.roll.members)[:256], "size": len(core.roll.members),
                     "not_admitted": sorted(core.roll.refused)[:64], "removed": sorted(core.roll.removed)[:64],
                     **core.roll_view()},
        },
        "membership": {
            "profile": cfg.gossip.profile,
            "size": membership.size,
            "publish_interval_s": core.publish_interval_s(),
            "suspects": membership.suspects(),
            "refutations": membership.false_suspicions_refuted,
            "implausible_suspicions": membership.implausible_suspicions,
            "max_members": node.state.max_members,
        },
        "catalog": {
            "path": str(cfg.agent.catalog) if cfg.agent.catalog else None,
            "digest": node.catalog.digest if node.catalog else None,
            "templates": len(node.catalog.templates) if node.catalog else 0,
            "mismatch": catalog_mismatch(node),
        },
        "snapshot": snapshot_dict(own.snapshot, hex_bytes=True, defaults=True) if own else None,
        "state_files": node.state_files.view(),  # {file: {reason: entries dropped}} (p2pnode.statefiles)
        "members": members_view(node),
        "gossip": {
            "interval_s": cfg.membership().gossip_interval_s,
            "fanout": cfg.gossip.fanout,
            "exchanges_ok": node.gossiper.exchanges_ok,
            "exchanges_failed": node.gossiper.exchanges_failed,
            "signature_verifications": node.state.verifications,
            "quarantines": node.state.quarantines,
            "quarantined": dict(list(node.state.quarantined.items())[-16:]),
            "rejected": {r.value: n for r, n in sorted(node.state.rejected.items())},
            "http_clients_gone": node.http_clients_gone,
            "http_listener_refused": node.listener_stats.as_dict(),
            "own_snapshot_bytes_max": node.publication.max_published_bytes,
            "plans_omitted": node.publication.plans_omitted,
            "unpublishable": node.publication.unpublishable,
            "sections_left_out": dict(node.publication.sections_left_out),
            **gossip.view(),
        },
        "discovery": {
            "mdns": cfg.discovery.mdns,
            "mdns_interfaces": gossip.mdns.interfaces if gossip.mdns else [],
            "mdns_found": gossip.mdns.found if gossip.mdns else 0,
            "mdns_error": gossip.mdns_error,
            "join": list(cfg.agent.join),
        },
    }


def events_view(node: Any) -> dict[str, Any]:
    """``GET /events``: this node's recent events, and the recent events every member carries, newest first."""
    cluster = [{"node_id": e.origin, "seq": ev.seq, "name": ev.name, "at": ev.at, "payload": ev.payload}
               for e in node.state.entries() for ev in e.snapshot.events]
    cluster.sort(key=lambda ev: ev["at"], reverse=True)
    return {"node_id": node.node_id, "events": [e.to_wire() for e in reversed(node.guard.monitor.log.recent())],
            "cluster": cluster}


def jobs_view(node: Any, leader_plan: Any = None) -> dict[str, Any]:
    """``GET /jobs``: jobs running here and cluster-wide (members with more than ``INLINE_RUNNING`` jobs: the
    list this node fetched, else their count in ``running_counts``), pending templates with their reasons (from
    ``leader_plan``, the newest leader plan), refusals with reasons, members whose degradation level refuses work,
    recent history."""
    jobs = node.jobs
    entries = node.state.entries()
    cluster = []
    counts = {}
    for m in node.members():
        reports = jobs.fetcher.get(("running", m.origin)) if not m.snapshot.jobs.running_inline else None
        if m.origin == node.node_id:
            reports = jobs.running_reports()
        elif reports is None:
            reports = m.snapshot.jobs.running
        counts[m.origin] = m.snapshot.jobs.running_count if m.origin != node.node_id else len(reports)
        cluster += [{"node_id": m.origin, **snapshot_dict(j)} for j in reports]
    refused = [{"node_id": e.origin, **snapshot_dict(r)} for e in entries for r in e.snapshot.jobs.refused]
    refusing = []
    for e in entries:
        g = e.snapshot.guard
        if not may_start(OperationPriority.NORMAL, g.level):
            refusing.append({"node_id": e.origin, "level": g.level,
                             "reason": f"degradation level {g.level} ({LEVEL_NAMES[g.level]}) refuses NORMAL work: "
                                       f"{'; '.join(g.reasons) or 'load high'}"})
    return {
        "node_id": node.node_id,
        "refusing": refusing,
        "leader": node.core.view.leader,
        "term": node.core.view.term,
        "offer": jobs.offer,
        "running": [snapshot_dict(r) for r in jobs.running_reports()],
        "cluster_running": cluster,
        "running_counts": counts,
        "pending": leader_plan.pending if leader_plan else [],
        "refused": refused,
        "history": jobs.history.recent(20),
        "signals_rejected": jobs.signals.rejected,
        "breaker": {"state": jobs.breaker.state, "consecutive_failures": jobs.breaker.consecutive_failures,
                    "trips": jobs.breaker.trips},
        "spawns_rate_limited": jobs.spawn_limit.refused,
        "fetches": jobs.fetcher.view(),
    }
