"""The JSON views behind ``/status``, ``/members``, ``/events`` and ``/jobs``: read-only, built from the typed
snapshots and the node's surfaces (:mod:`._surfaces`), encoded by msgspec (typed sections are embedded as structs,
so no dict walk of a member's resources happens per request).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ..election import is_eligible
from ..gossip import MemberEntry, MemberState
from ..guardcore import LEVEL_NAMES, OperationPriority, may_start
from ..snapshot import GuardSummary, PlanSection, SyncSection, snapshot_dict
from ._surfaces import HttpSurfaces, JobsSurface, ProbeSurface
from ._viewcache import MemberRows

__all__ = ["catalog_mismatch", "events_view", "jobs_view", "member_row", "members_view", "scaling_status",
           "status_sections", "status_view"]


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


def _member_roles(s: HttpSurfaces, origin: str) -> dict[str, Any]:
    """A member's roles that count here (:mod:`p2pnode.certs`): ``roles`` and, where a claimed one does not,
    ``roles_refused`` with ``roles_reason``."""
    gate = s.cluster.roles
    check = gate.check_of(origin) if gate is not None else None
    if check is None:
        return {}
    out: dict[str, Any] = {"roles": list(check.roles)}
    if check.refused:
        out.update(roles_refused=list(check.refused), roles_reason=check.reason)
    if check.expires_at:
        out["cert_expires_at"] = check.expires_at
    return out


def member_row(s: HttpSurfaces, e: MemberEntry, state: MemberState, power_score: float, *, leader: bool,
               voter: bool, received_at: float) -> dict[str, Any]:
    """One member's row of ``GET /members``, ``/status`` ``members`` and the dashboard (encoded once per change by
    :class:`._viewcache.MemberRows`, which passes what this node decides about it): id, address, snapshot version,
    ``state``, its ``name``, ``provider`` and ``instance`` (:class:`p2pnode.label.Label`, the member's own claim),
    incarnation, vote, catalog digest, why this node never dials its address (``addr_refused``: a
    reason of :func:`p2pnode.gossip.addr_refusal`, or null), ``received_at`` (wall-clock seconds when its newest
    snapshot arrived here: its age is the reader's now minus this), tags, ``power_score`` (from the GPU table, not
    the member's claim), whether it may lead (:func:`p2pnode.election.is_eligible`), whether it ``leader`` leads
    and is a ``voter``, resources (the typed section), a sync summary, its degradation ``level`` (with
    ``level_name``, ``reasons``, ``gpus_full``) and jobs running."""
    node, core = s.node, s.core
    snap = e.snapshot
    me = e.origin == node.node_id
    g = snap.guard
    return {
        "id": e.origin,
        "name": snap.label.name,  # the member's own claim: shown only, never used to address it
        "provider": snap.label.provider,
        "instance": snap.label.instance,
        "self": me,
        "addr": snap.addr,
        "addr_refused": None if me else s.gossip.addr_refusal(snap.addr),
        "version": e.version,
        "state": state.value,
        "incarnation": snap.membership.incarnation,
        "vote": snap.vote,
        "catalog_digest": snap.jobs.catalog_digest,
        "catalog_version": snap.jobs.catalog_version,
        "received_at": received_at,
        "leaving": snap.leaving,
        "tags": snap.tags,  # effective: role tags only as certified where operator keys are pinned
        **_member_roles(s, e.origin),
        "power_score": power_score,
        "eligible": is_eligible(e.origin, snap.tags, eligible=core.roll.eligible, ineligible=core.roll.ineligible),
        "leader": leader,
        "voter": voter,
        "resources": snap.resources,
        "sync": _sync_summary(snap.sync),
        "jobs_running": snap.jobs.running_count or len(snap.jobs.running),
        "running_count": snap.jobs.running_count,
        "level": g.level,
        "level_name": LEVEL_NAMES[g.level],
        "reasons": g.reasons,
        "gpus_full": g.gpus_full,
        "cordoned": snap.operator.cordoned,
        "draining": bool(snap.operator.drain_deadline),
    }


def _held(s: HttpSurfaces) -> list[tuple[MemberEntry, MemberState]]:
    """Every member's entry and state."""
    return [(e, s.core.state_of(e.origin) or MemberState.ALIVE) for e in s.cluster.unordered()]


def catalog_mismatch(s: HttpSurfaces, rows: MemberRows | None = None) -> list[str]:
    """Members (not left) whose snapshot carries another catalog digest than ours (``rows``: the cached member rows
    just refreshed, when the caller has them: computed once per change of theirs)."""
    catalog, node_id = s.node.catalog, s.node.node_id
    mine = catalog.digest if catalog else ""

    def mismatch(held: list[tuple[MemberEntry, MemberState]]) -> list[str]:
        return sorted(e.origin for e, state in held
                      if e.origin != node_id and state is not MemberState.LEFT
                      and e.snapshot.jobs.catalog_digest != mine)

    return rows.memo("catalog_mismatch", mine, mismatch) if rows is not None else mismatch(_held(s))


def status_sections(s: HttpSurfaces, rows: MemberRows | None = None) -> dict[str, Any]:
    """``GET /status`` but its ``members`` (the route adds their cached ``rows``, :class:`._viewcache.MemberRows`,
    just refreshed): this node, the election, membership, catalog, our own snapshot, gossip and discovery
    counters. Times in seconds."""
    own = s.cluster.get(s.node.node_id)
    return {
        "node": _node_status(s, own.version if own else None),
        "election": _election_status(s),
        "membership": _membership_status(s),
        "catalog": _catalog_status(s, rows),
        "scaling": scaling_status(s, rows),
        "snapshot": snapshot_dict(own.snapshot, hex_bytes=True, defaults=True) if own else None,
        "state_files": s.stats.state_files.view(),  # {file: {reason: entries dropped}} (p2pnode.statefiles)
        "gossip": _gossip_status(s),
        "discovery": _discovery_status(s),
    }


def members_view(s: HttpSurfaces) -> list[dict[str, Any]]:
    """Every member's row (:func:`member_row`), in id order, built afresh: what ``GET /members`` serves from its
    cache (:class:`._viewcache.MemberRows`), for callers without one (the consumer fuzzer, tests)."""
    rows = MemberRows(member_row)
    rows.refresh(s)
    return msgspec.json.decode(rows.joined())


def status_view(s: HttpSurfaces) -> dict[str, Any]:
    """``GET /status`` built afresh (:func:`status_sections` and :func:`members_view`), for callers without the
    route's cache."""
    rows = MemberRows(member_row)
    rows.refresh(s)
    return {**status_sections(s, rows), "members": msgspec.json.decode(rows.joined())}


def _node_status(s: HttpSurfaces, version: int | None) -> dict[str, Any]:
    """``/status`` ``node``: identity, version of our newest snapshot, uptime, trust, tags, operator intents."""
    node = s.node
    cfg = node.config
    return {
        "id": node.node_id,
        "addr": node.addr,
        "addr_source": node.addr_source,  # config, vast.ai, runpod, bind or local address
        "version": version,
        "agent_version": node.agent_version,
        "started_at": node.started_at,
        "trust": cfg.agent.trust,
        "cluster_open": cfg.agent.trust == "open",
        **s.trust.view(),
        "tags": list(cfg.agent.tags),
        "data_dir": str(node.data_dir),
        "leaving": node.leaving,
        "incarnation": s.core.membership.incarnation,
        "operator": s.jobs.operator_view() if s.jobs is not None else None,
        "roles": node.role_cert_view(),
    }


def _election_status(s: HttpSurfaces) -> dict[str, Any]:
    """``/status`` ``election``: the leader view, our vote, counters, and the voter roll (capped lists)."""
    core = s.core
    view, election = core.view, core.election
    return {
        "leader": view.leader,
        "term": view.term,
        "highest_term": election.highest_term,
        "vote": election.vote.to_wire() if election.vote else None,
        "votes_for_leader": view.votes_for_leader,
        "quorum": view.quorum,
        "voters": view.voters,
        "leader_changes": core.leader_changes,
        "fenced": election.superseded(),  # the leader's term is below a term seen here: nothing of it is acted on
        "implausible_votes": election.implausible_votes,
        "outside_votes": election.outside_votes,  # votes of members off the roll: ignored
        "vote_timeouts": core.vote_timeout.moves,  # candidates given up unheard (p2pnode/node/_votetimeout.py)
        "terms_heard": {"implausible": election.implausible_terms, "outside": election.outside_terms,
                        "reaffirmed": election.reaffirmed},  # terms in probes (docs/jobs.md)
        "roll": {"voters": sorted(core.roll.members)[:256], "size": len(core.roll.members),
                 "not_admitted": sorted(core.roll.refused)[:64], "removed": sorted(core.roll.removed)[:64],
                 "eligible": sorted(core.roll.eligible)[:64], "ineligible": sorted(core.roll.ineligible)[:64],
                 **core.roll_view()},
    }


def _membership_status(s: HttpSurfaces) -> dict[str, Any]:
    """``/status`` ``membership``: profile, size, publish interval, suspects, the suspicion counters, the news pushes
    made (:class:`p2pnode.gossip.NewsPush`: each one exchange with each of ``fanout`` peers), and ``probes`` with
    ``gossip.probes`` on."""
    core = s.core
    membership = core.membership
    return {
        "profile": s.node.config.gossip.profile,
        "size": membership.size,
        "publish_interval_s": core.publish_interval_s(),
        "suspects": membership.suspects(),
        "refutations": membership.false_suspicions_refuted,
        "implausible_suspicions": membership.implausible_suspicions,
        "news_pushes": core.news_push.pushes,
        "max_members": s.cluster.max_members,
        **({"probes": _probe_status(s.probes)} if s.probes is not None else {}),
    }


def _probe_status(probes: ProbeSurface) -> dict[str, Any]:
    """``/status`` ``membership.probes`` (``gossip.probes`` on): the prober's counters, its local-health score and
    the probe packets refused by reason."""
    p = probes.prober
    return {"probes": p.probes, "acks": p.acks, "failed": p.probes_failed, "indirect": p.indirect_probes,
            "awareness": p.score, "interval_s": p.interval_s(), "rejected": dict(probes.codec.rejected)}


def _catalog_status(s: HttpSurfaces, rows: MemberRows | None = None) -> dict[str, Any]:
    """``/status`` ``catalog``: path, digest, template count, members whose catalog differs, and pushed catalogs
    (accepted here or not, the version held and its signer, adoptions and refusals)."""
    catalog, cfg = s.node.catalog, s.node.config
    return {
        "path": str(cfg.agent.catalog) if cfg.agent.catalog else None,
        "digest": catalog.digest if catalog else None,
        "templates": len(catalog.templates) if catalog else 0,
        "mismatch": catalog_mismatch(s, rows),
        "pushed": s.node.catalog_push.view(),
    }


def scaling_status(s: HttpSurfaces, rows: MemberRows | None = None) -> dict[str, Any]:
    """``/status`` ``scaling``: this node's ``[scaling]`` digest and provider, the members that may lead with
    another table (``mismatch``: not left, not tagged ``ephemeral``), and the current leader's published
    decisions (``verdicts`` per node class, the action ``ledger``, nodes ``draining``, the cooldown left, in
    seconds) with this node's own provider calls and failures (``driver``: the leader's are the ones that act),
    and the members' claims that counted toward no class while this node led (``claims_refused`` by reason,
    ``refused_claims`` naming the members, at most 64; issue 37). ``rows``: as :func:`catalog_mismatch`'s."""
    cfg, node_id = s.node.config, s.node.node_id
    mine = cfg.scaling.digest()

    def differ(held: list[tuple[MemberEntry, MemberState]]) -> list[str]:
        return sorted(e.origin for e, state in held
                      if e.origin != node_id and state is not MemberState.LEFT
                      and "ephemeral" not in e.snapshot.tags and e.snapshot.scaling.settings_digest != mine)

    mismatch = rows.memo("scaling_mismatch", mine, differ) if rows is not None else differ(_held(s))
    leader = s.core.view.leader
    entry = s.cluster.get(leader) if leader else None
    sec = entry.snapshot.scaling if entry is not None else None
    cooldown_left = (max(0.0, sec.last_action_at + cfg.scaling.cooldown_s - time.time())
                     if sec is not None and sec.last_action_at else 0.0)
    return {
        "provider": cfg.scaling.provider, "settings_digest": mine, "mismatch": mismatch, "leader": leader,
        "classes": sorted(cfg.scaling.classes),
        "verdicts": [snapshot_dict(v, defaults=True) for v in sec.verdicts] if sec is not None else [],
        "ledger": [snapshot_dict(a, defaults=True) for a in sec.ledger] if sec is not None else [],
        "draining": list(sec.draining) if sec is not None else [],
        "last_action_at": sec.last_action_at if sec is not None else 0.0,
        "cooldown_left_s": round(cooldown_left, 1),
        "driver": s.jobs.scaling_view() if s.jobs is not None else None,
        "claims_refused": s.jobs.scaling_claims_refused if s.jobs is not None else {},
        "refused_claims": s.jobs.scaling_refused_claims() if s.jobs is not None else [],
    }


def _gossip_status(s: HttpSurfaces) -> dict[str, Any]:
    """``/status`` ``gossip``: cadence, exchanges, verifications, quarantines, rejections, HTTP and publication
    counters, and the driver's own part (peers, candidates)."""
    cfg, state, publication = s.node.config, s.cluster, s.stats.publication
    return {
        "interval_s": cfg.membership().gossip_interval_s,
        "fanout": cfg.gossip.fanout,
        "exchanges_ok": s.gossiper.exchanges_ok,
        "exchanges_failed": s.gossiper.exchanges_failed,
        "digests": {"full": s.gossiper.full_exchanges, "partial": s.gossiper.partial_exchanges},
        "signature_verifications": state.verifications,
        "quarantines": state.quarantines,
        "quarantined": dict(list(state.quarantined.items())[-16:]),
        "rejected": {r.value: n for r, n in sorted(state.rejected.items())},
        "http_clients_gone": s.counters.clients_gone,
        # not the 304s: a view that counted its own 304s would change with each (p2pnode_http_not_modified_total)
        "http_views": {"if_none_match_ignored": s.counters.if_none_match_ignored,
                       "queries_refused": dict(s.counters.queries_refused)},
        "http_listener_refused": s.stats.listener.as_dict(),
        "own_snapshot_bytes_max": publication.max_published_bytes,
        "plans_omitted": publication.plans_omitted,
        "unpublishable": publication.unpublishable,
        "sections_left_out": dict(publication.sections_left_out),
        **s.gossip.view(),
    }


def _discovery_status(s: HttpSurfaces) -> dict[str, Any]:
    """``/status`` ``discovery``: mDNS (interfaces, members found, error) and the join list."""
    cfg, gossip = s.node.config, s.gossip
    mdns = gossip.mdns
    return {
        "mdns": cfg.discovery.mdns,
        "mdns_interfaces": mdns.interfaces if mdns else [],
        "mdns_found": mdns.found if mdns else 0,
        "mdns_error": gossip.mdns_error,
        "join": list(cfg.agent.join),
    }


def events_view(s: HttpSurfaces) -> dict[str, Any]:
    """``GET /events``: this node's recent events, and the recent events every member carries, newest first."""
    cluster: list[dict[str, Any]] = [
        {"node_id": e.origin, "seq": ev.seq, "name": ev.name, "at": ev.at, "payload": ev.payload}
        for e in s.cluster.entries() for ev in e.snapshot.events]
    cluster.sort(key=lambda ev: ev["at"], reverse=True)
    return {"node_id": s.node.node_id,
            "events": [e.to_wire() for e in reversed(s.guard.monitor.log.recent())],
            "cluster": cluster}


def _no_reason(g: GuardSummary) -> str:
    """What a member's guard section says when it carries no reason for its level (an agent from before reasons
    were always published): its newest assessment's own level and load ratio, nothing made up."""
    return (f"the node published no reason; its newest assessment is level {g.raw_level} "
            f"({LEVEL_NAMES[g.raw_level]}), load ratio {g.ratio:.2f}")


def jobs_view(s: HttpSurfaces, jobs: JobsSurface, leader_plan: PlanSection | None = None) -> dict[str, Any]:
    """``GET /jobs``: jobs running here and cluster-wide (members with more than ``INLINE_RUNNING`` jobs: the
    list this node fetched, else their count in ``running_counts``), pending templates with their reasons (from
    ``leader_plan``, the newest leader plan), refusals with reasons, members whose degradation level refuses work,
    recent history, the job table's newest transition errors (``transition_errors``: a bug signal). ``jobs``:
    this node's job control (``s.jobs``, present: the caller answers 404 without)."""
    entries = s.cluster.entries()
    cluster, counts = _cluster_running(s, jobs)
    refused = [{"node_id": e.origin, **snapshot_dict(r)} for e in entries for r in e.snapshot.jobs.refused]
    refusing = []
    for e in entries:
        g = e.snapshot.guard
        if not may_start(OperationPriority.NORMAL, g.level):
            refusing.append({"node_id": e.origin, "level": g.level,
                             "reason": f"degradation level {g.level} ({LEVEL_NAMES[g.level]}) refuses NORMAL work: "
                                       f"{'; '.join(g.reasons) or _no_reason(g)}"})
    breaker = jobs.breaker
    return {
        "node_id": s.node.node_id,
        "refusing": refusing,
        "leader": s.core.view.leader,
        "term": s.core.view.term,
        "offer": jobs.offer,
        "cpu_offer": jobs.cpu_offer,
        "running": [snapshot_dict(r) for r in jobs.running_reports()],
        "cluster_running": cluster,
        "gangs": _gangs(cluster, leader_plan),
        "gang_ends": jobs.gang_ends,
        "gang_table": jobs.gang_table,
        "suspicious_claims": jobs.suspicious_claims,
        "claims_ignored": jobs.claims_ignored,
        "running_counts": counts,
        "pending": leader_plan.pending if leader_plan else [],
        "refused": refused,
        "history": jobs.history(20),
        "lease": jobs.lease_view(),
        "signals_rejected": jobs.signals_rejected,
        "breaker": {"state": breaker.state, "consecutive_failures": breaker.consecutive_failures,
                    "trips": breaker.trips},
        "spawns_rate_limited": jobs.spawns_rate_limited,
        "waiting": jobs.waiting,
        "fetching_checkpoints": jobs.fetching_checkpoints,
        "goodput": {k: c.view() for k, c in sorted(jobs.goodput().items())},
        "fetches": jobs.fetches_view(),
        "transition_errors": jobs.recent_transition_errors,
    }


def _gangs(cluster: list[dict[str, Any]], plan: PlanSection | None = None) -> list[dict[str, Any]]:
    """The running gangs (docs/gangs.md), from the cluster's running jobs: id, template, engine, size, the
    rendezvous and each member's rank, node and job id (a missing rank is a member gone: the leader ends the
    gang). With the leader's ``plan``, only the slots it gave (job id on that node, in that gang) are shown: a
    member's other claims are ignored, as the leader ignores them (``suspicious_claims``); and each gang of the
    leader's gang table (:class:`p2pnode.snapshot.PlanGang`, ended ones too) has its ``state``, ``cause``,
    ``reason``, ``grace_left_s`` and every rank's state (``ranks``)."""
    planned = ({a.job_id: (a.node, a.gang.id) for a in plan.assignments if a.gang is not None}
               if plan is not None else None)
    out: dict[str, dict[str, Any]] = {}
    for j in cluster:
        g = j.get("gang")
        if not g or planned is not None and planned.get(j["job_id"]) != (j["node_id"], g["id"]):
            continue
        gang = out.setdefault(g["id"], {"id": g["id"], "template": j["template"], "engine": g.get("engine", "process"),
                                        "size": g["size"], "rendezvous": f"{g['master']}:{g['master_port']}",
                                        "members": []})
        gang["members"].append({"rank": g["rank"], "node_id": j["node_id"], "job_id": j["job_id"],
                                "ports": [g["port_base"], g["port_base"] + g.get("ports", 1) - 1]})
    for gang in out.values():
        gang["members"].sort(key=lambda m: m["rank"])
        gang["whole"] = [m["rank"] for m in gang["members"]] == list(range(gang["size"]))
    for e in plan.gangs if plan is not None else ():  # the leader's gang table (docs/gangs.md, "Lifecycle")
        gang = out.setdefault(e.id, {"id": e.id, "template": e.template, "size": e.size, "members": [], "whole": False})
        gang.update(state=e.state, cause=e.cause, reason=e.reason, grace_left_s=e.grace_left_s,
                    ranks=[{"rank": m.rank, "job_id": m.job_id, "node_id": m.node, "state": m.state}
                           for m in e.members])
    return sorted(out.values(), key=lambda g: g["id"])[:256]


def _cluster_running(s: HttpSurfaces, jobs: JobsSurface) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every member's running jobs (ours from job control, others' inline or as last fetched, else their
    snapshot's list) as rows, and each member's count."""
    node_id = s.node.node_id
    cluster: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for m in s.node.members():
        reports = jobs.fetched_running(m.origin) if not m.snapshot.jobs.running_inline else None
        if m.origin == node_id:
            reports = jobs.running_reports()
        elif reports is None:
            reports = list(m.snapshot.jobs.running)
        counts[m.origin] = m.snapshot.jobs.running_count if m.origin != node_id else len(reports)
        cluster += [{"node_id": m.origin, **snapshot_dict(j)} for j in reports]
    return cluster, counts
