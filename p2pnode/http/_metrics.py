"""Prometheus exposition of a node's state, read at scrape time (no duplicate bookkeeping).

Every metric is named ``p2pnode_*``; units are in the names (``_bytes``, ``_percent``, ``_seconds``). The collector
reads the node's :class:`._surfaces.HttpSurfaces` (never the agent), one named step per subsystem, in the order the
metrics are exposed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..errors import RejectReason
from ..gossip import PROBE_REJECT_REASONS, ClusterState, Gossiper, MemberState
from ..guardcore import EVENT_NAMES
from ..node import CLAIM_REASONS, NodeCore
from ..node._gangs import GANG_CAUSES
from ..node._stoprules import RULE_NAMES
from ..resources import PSI_RESOURCES, STALL_REJECTIONS, ResourceSample
from ..scheduler import Catalog, CatalogBook, CatalogSources, JobTemplate, Signals
from ..scheduler._scaling import SCALING_CLAIM_REASONS
from ..snapshot import PlanSection
from ..sync import REJECT_REASONS
from ..synccore import FAIL_REASONS
from ._metrics_training import checkpoint_warnings, goodput
from ._surfaces import (
    GossipSurface,
    GuardSurface,
    HttpCounters,
    HttpSurfaces,
    JobsSurface,
    NodeStats,
    ProbeSurface,
    SyncSurface,
    TrustSurface,
)

__all__ = ["AgentCollector", "make_registry", "queue_by_kind"]


class AgentCollector(Collector):
    """Collects gauges and counters from one node's surfaces ``s`` (the agent's parts, never the agent)."""

    def __init__(self, s: HttpSurfaces) -> None:
        self.s = s

    def collect(self) -> Iterator[Metric]:
        """Every metric of the node, read now (Prometheus calls this at each scrape): identity, membership and
        election, gossip, refused inputs, requests, publication, sync, freshness; then, once a resource sample
        exists, jobs, the guard, resources and GPUs."""
        s = self.s
        yield from _identity(s)
        yield from _membership(s.node.node_id, s.core)
        yield from _gossip(s.gossip, s.gossiper, s.cluster)
        if s.probes is not None:
            yield from _probes(s.probes, s.core)
        yield from _inputs_refused(s.stats, s.cluster, s.core)
        yield from _views(s.counters)
        yield GaugeMetricFamily("p2pnode_voters", "Voters on this node's voter roll", value=len(s.core.roll.members))
        yield from _request_auth(s.trust)
        yield from _publication(s.stats)
        yield from _sync(s.sync)
        yield from _freshness(s.cluster, s.node.now())
        yield from _catalog_refused(s.node.catalog_push.book, s.node.catalog_push.members)
        sample = s.node.last_sample
        if sample is None:
            return
        if s.jobs is not None:
            yield from _jobs(s.jobs)
            yield from _job_table(s.jobs)
            yield from _scaling(s.jobs)
            yield from _fleet(s.jobs, s.node.catalog)
        yield from _guard(s.guard)
        yield from _resources(sample)
        yield from _gpus(sample)


def _identity(s: HttpSurfaces) -> Iterator[Metric]:
    """Build and identity; the version of this node's newest snapshot."""
    node = s.node
    info = InfoMetricFamily("p2pnode", "Agent build and identity")
    info.add_metric([], {"node_id": node.node_id, "version": node.agent_version, "trust": node.config.agent.trust})
    yield info
    yield GaugeMetricFamily("p2pnode_snapshot_version", "Version of this node's newest snapshot",
                            value=s.stats.versions.value)


def _membership(node_id: str, core: NodeCore) -> Iterator[Metric]:
    """Members by state, the leader this node sees, its incarnation, leader changes and refutations."""
    members = GaugeMetricFamily("p2pnode_members", "Members known to this node by state (self included)",
                                labels=["state"])
    counts = Counter(m.state.value for m in core.membership.members.values())
    counts["alive"] += 1
    for state in MemberState:
        members.add_metric([state.value], counts.get(state.value, 0))
    yield members
    view = core.view
    yield GaugeMetricFamily("p2pnode_leader_term", "Term of the leader this node sees (0: no leader)",
                            value=view.term or 0)
    yield GaugeMetricFamily("p2pnode_is_leader", "1 if this node leads the term it sees and no higher term was seen",
                            value=int(core.is_leader()))
    yield GaugeMetricFamily("p2pnode_incarnation", "This node's incarnation", value=core.membership.incarnation)
    yield CounterMetricFamily("p2pnode_leader_changes", "Changes of the leader this node sees",
                              value=core.leader_changes)
    yield CounterMetricFamily(
        "p2pnode_refutations", "Times this node refuted a suspicion of itself",
        value=core.membership.false_suspicions_refuted,
    )


def _gossip(gossip: GossipSurface, gossiper: Gossiper, state: ClusterState) -> Iterator[Metric]:
    """Rounds, bytes, exchanges, messages rejected, requests refused before their body was read, and advertised
    addresses refused by the dial policy."""
    yield CounterMetricFamily("p2pnode_gossip_rounds", "Gossip rounds this node ran", value=gossip.rounds)
    gb = CounterMetricFamily("p2pnode_gossip_bytes", "Gossip message bytes (bodies)", labels=["direction"])
    gb.add_metric(["sent"], gossip.bytes_sent)
    gb.add_metric(["received"], gossip.bytes_received)
    yield gb
    ex = CounterMetricFamily("p2pnode_gossip_exchanges", "Gossip exchanges this node initiated", labels=["outcome"])
    ex.add_metric(["ok"], gossiper.exchanges_ok)
    ex.add_metric(["failed"], gossiper.exchanges_failed)
    yield ex
    dg = CounterMetricFamily("p2pnode_gossip_digests", "Gossip exchanges this node opened, by digest (full or partial)",
                             labels=["kind"])
    dg.add_metric(["full"], gossiper.full_exchanges)
    dg.add_metric(["partial"], gossiper.partial_exchanges)
    yield dg
    rej = CounterMetricFamily("p2pnode_gossip_rejected", "Inbound gossip messages and envelopes rejected",
                              labels=["reason"])
    for reason in RejectReason:
        rej.add_metric([reason.value], state.rejected.get(reason, 0))
    yield rej
    refused = CounterMetricFamily("p2pnode_gossip_refused_requests",
                                  "Inbound gossip requests refused before their body was read", labels=["reason"])
    refused.add_metric(["rate_limited"], gossip.inbound_bytes.refused)
    refused.add_metric(["busy"], gossip.busy)
    yield refused
    dial = CounterMetricFamily("p2pnode_addr_refused", "Members' advertised addresses this node refuses to dial "
                               "(each address once), by reason (p2pnode.gossip.addr_refusal)", labels=["reason"])
    for why, n in gossip.addr_refused().items():
        dial.add_metric([why], n)
    yield dial


def _probes(probes: ProbeSurface, core: NodeCore) -> Iterator[Metric]:
    """SWIM probes (``gossip.probes`` on): what the prober did, its local health, packets refused by reason."""
    p = probes.prober
    yield CounterMetricFamily("p2pnode_probe_probes", "SWIM probes this node started (one member each)",
                              value=p.probes)
    yield CounterMetricFamily("p2pnode_probe_failed", "SWIM probes that got no ack, direct or relayed, in their "
                              "interval (the member was accused)", value=p.probes_failed)
    yield CounterMetricFamily("p2pnode_probe_indirect", "SWIM probes that asked relays (ping-req) after no direct "
                              "ack", value=p.indirect_probes)
    yield CounterMetricFamily("p2pnode_probe_acks", "SWIM probes acknowledged (directly, over HTTP or by a relay)",
                              value=p.acks)
    yield CounterMetricFamily("p2pnode_suspicions", "Members that became suspect in this node's view (a failed "
                              "probe, an accusation heard, or silence)", value=core.membership.suspicions_started)
    yield GaugeMetricFamily("p2pnode_probe_awareness", "Lifeguard local-health score (0 healthy; the probe interval "
                            "is stretched score + 1 times)", value=p.score)
    rej = CounterMetricFamily("p2pnode_probe_rejected", "Inbound probe packets refused, by reason", labels=["reason"])
    for reason in sorted(set(PROBE_REJECT_REASONS) | set(probes.codec.rejected)):
        rej.add_metric([reason], probes.codec.rejected.get(reason, 0))
    yield rej


def _views(counters: HttpCounters) -> Iterator[Metric]:
    """Conditional view answers (304) and the view inputs refused or ignored (:mod:`._viewcache`)."""
    yield CounterMetricFamily("p2pnode_http_not_modified", "Views answered 304 Not Modified (If-None-Match held "
                              "the current ETag)", value=counters.not_modified)
    refused = CounterMetricFamily("p2pnode_http_view_inputs_refused", "View queries refused (400) and malformed "
                                  "If-None-Match headers ignored, by reason", labels=["reason"])
    refused.add_metric(["if_none_match"], counters.if_none_match_ignored)
    for reason, n in sorted(counters.queries_refused.items()):
        refused.add_metric([f"query_{reason}"], n)
    yield refused


def _inputs_refused(stats: NodeStats, state: ClusterState, core: NodeCore) -> Iterator[Metric]:
    """State-file entries dropped, connections the listener ended, member snapshots quarantined, implausible
    accusations and votes ignored."""
    dropped = CounterMetricFamily("p2pnode_state_file_entries_dropped", "Entries of state files read back at "
                                  "start or reload that were dropped (p2pnode.statefiles)",
                                  labels=["file", "reason"])
    for (file, reason), n in stats.state_files.items():
        dropped.add_metric([file, reason], n)
    yield dropped
    ended = CounterMetricFamily("p2pnode_http_listener_refused", "HTTP connections and requests the listener "
                                "ended itself (bad request, handler error, slow client, connection error)",
                                labels=["reason"])
    for reason, n in stats.listener.as_dict().items():
        ended.add_metric([reason], n)
    yield ended
    yield CounterMetricFamily("p2pnode_quarantines", "Member snapshots set aside because a consumer could not use "
                              "them (a decoder gap: should stay 0)", value=state.quarantines)
    implausible = CounterMetricFamily("p2pnode_implausible_claims", "Accusations and votes ignored because their "
                                      "incarnation or term jumped beyond the bounded step", labels=["kind"])
    implausible.add_metric(["suspicion"], core.membership.implausible_suspicions)
    implausible.add_metric(["vote"], core.election.implausible_votes)
    yield implausible
    if state.roles is not None:
        certs = CounterMetricFamily("p2pnode_role_certs_refused", "Members (this node included) whose claimed "
                                    "roles stopped counting, by the reason their certificate was refused "
                                    "(p2pnode.certs; counted once per change)", labels=["reason"])
        for reason, n in sorted(state.roles.refused.items()):
            certs.add_metric([reason], n)
        yield certs


def _request_auth(trust: TrustSurface) -> Iterator[Metric]:
    """Signed requests refused by reason; requests accepted with a scheme that does not name the receiver."""
    auth = CounterMetricFamily("p2pnode_request_auth_refused", "Signed requests (state-changing routes, "
                               "protected reads) refused for their authentication (x-p2pnode-auth), "
                               "wrong_receiver: signed for another node", labels=["reason"])
    for reason, n in trust.request_auth.refused.items():
        auth.add_metric([reason], n)
    yield auth
    yield CounterMetricFamily("p2pnode_request_auth_unbound", "Requests accepted with a scheme that does not "
                              "name the receiver (v1, k1; agent.accept_unbound_requests)",
                              value=trust.request_auth.unbound)


def _publication(stats: NodeStats) -> Iterator[Metric]:
    """Publications that left the plan, or a section that failed its decoder, out of this node's snapshot."""
    publication = stats.publication
    yield CounterMetricFamily("p2pnode_plans_omitted", "Publications that left the plan out of the snapshot "
                              "because it would exceed max_snapshot_bytes", value=publication.plans_omitted)
    left_out = CounterMetricFamily("p2pnode_sections_left_out", "Publications that left a section of this "
                                   "node's own snapshot out because it failed the typed decoder (a bug: 0)",
                                   labels=["section"])
    for name, n in sorted(publication.sections_left_out.items()):
        left_out.add_metric([name], n)
    yield left_out


def _sync(sync: SyncSurface) -> Iterator[Metric]:
    """Sync bytes, refusals, resends, streams, fallbacks, replication lag and state of this node's files, bytes
    pending; replicas kept for others (durable nodes)."""
    v = sync.status_view()
    store = sync.store
    b = CounterMetricFamily("p2pnode_sync_bytes", "Sync bytes: push bodies sent, verified block bytes received",
                            labels=["direction"])
    b.add_metric(["sent"], sync.bytes_sent)
    b.add_metric(["received"], store.bytes_received if store else 0)
    yield b
    rej = CounterMetricFamily("p2pnode_sync_rejected", "Sync input this node refused (requests and blocks)",
                              labels=["reason"])
    counts = sync.rejected_total()
    for reason in REJECT_REASONS:
        rej.add_metric([reason], counts.get(reason, 0))
    yield rej
    yield CounterMetricFamily("p2pnode_sync_blocks_resent", "Blocks this node sent again after a target rejected "
                              "them", value=sync.blocks_resent)
    st = CounterMetricFamily("p2pnode_sync_streams", "Block streams over the data channel", labels=["direction"])
    st.add_metric(["sent"], sync.streams_sent)
    st.add_metric(["received"], sync.channel.streams if sync.channel else 0)
    yield st
    yield CounterMetricFamily("p2pnode_sync_channel_fallbacks", "Transfers sent over HTTP because a target's data "
                              "channel could not be reached", value=sync.channel_fallbacks)
    yield GaugeMetricFamily("p2pnode_sync_replication_lag_seconds", "Oldest unconfirmed change among this node's "
                            "synced files, seconds (0: every file has R receipts)",
                            value=max((f["lag_s"] for f in v["files"]), default=0.0))
    files = GaugeMetricFamily("p2pnode_sync_files", "Files this node pushes, by replication state",
                              labels=["state"])
    under = sum(1 for f in v["files"] if f["replicas"] < f["r"])
    files.add_metric(["replicated"], len(v["files"]) - under)
    files.add_metric(["under_replicated"], under)
    yield files
    yield GaugeMetricFamily("p2pnode_sync_bytes_pending", "Bytes still to send to reach R for every file",
                            value=sum(f["bytes_pending"] for f in v["files"]))
    ch = v.get("challenges") or {}
    chal = CounterMetricFamily("p2pnode_sync_challenges", "Proof-of-possession challenges: sent by this node, "
                               "answered to it, passed, inconclusive (overloaded among them: the holder kept "
                               "refusing 503), and served by this node to origins", labels=["result"])
    for result in ("sent", "answered", "passed", "served", "inconclusive", "overloaded"):
        chal.add_metric([result], ch.get(result, 0))
    yield chal
    failed = CounterMetricFamily("p2pnode_sync_challenges_failed", "Proof-of-possession challenges a holder failed, "
                                 "by reason (it stops counting for that file until a later one passes)",
                                 labels=["reason"])
    for reason in FAIL_REASONS:
        failed.add_metric([reason], (ch.get("failed") or {}).get(reason, 0))
    yield failed
    if store is not None:
        yield GaugeMetricFamily("p2pnode_sync_replicas", "Replicas this node keeps for others",
                                value=len(store.index))
        yield GaugeMetricFamily("p2pnode_sync_replica_bytes", "Bytes of replicas this node keeps for others",
                                value=store.held_bytes())


def _freshness(state: ClusterState, now: float) -> Iterator[Metric]:
    """Signature verifications of inbound snapshots; seconds since each member's newest snapshot arrived (``now``:
    monotonic seconds)."""
    yield CounterMetricFamily(
        "p2pnode_gossip_signature_verifications", "Ed25519 verifications of inbound snapshots",
        value=state.verifications,
    )
    age = GaugeMetricFamily("p2pnode_member_update_age_seconds", "Seconds since a member's newest snapshot arrived",
                            labels=["node_id"])
    for e in state.entries():
        age.add_metric([e.origin], max(0.0, now - e.received_at))
    yield age


def _jobs(jobs: JobsSurface) -> Iterator[Metric]:
    """Jobs running and finished here, the PID offer (GPU work) and the CPU offer (CPU-only work), recent
    refusals, starts the spawn-rate limit holds back, the band's lower edge, and (the leader only) the templates
    waiting in its plan."""
    yield GaugeMetricFamily("p2pnode_jobs_running", "Jobs running on this node", value=jobs.running_count)
    yield CounterMetricFamily("p2pnode_jobs_finished", "Jobs that ended on this node", value=jobs.finished)
    yield GaugeMetricFamily("p2pnode_capacity_offer", "Jobs this node accepts now (PID offer)", value=jobs.offer)
    yield GaugeMetricFamily("p2pnode_cpu_offer", "CPU-only jobs this node accepts now (free CPUs and memory)",
                            value=jobs.cpu_offer)
    yield GaugeMetricFamily("p2pnode_jobs_refused", "Recent assignments this node refused", value=jobs.refused_count)
    yield GaugeMetricFamily("p2pnode_jobs_waiting_to_start", "Assignments held back here by the spawn-rate limit",
                            value=len(jobs.waiting))
    yield CounterMetricFamily("p2pnode_spawns_rate_limited", "Starts the spawn-rate limit deferred",
                              value=jobs.spawns_rate_limited)
    ends = CounterMetricFamily("p2pnode_gangs_ended", "Gangs this node ended while it led, by cause (complete, "
                               "member_down, member_gone, disagree, stopped)", labels=["cause"])
    for cause in GANG_CAUSES:
        ends.add_metric([cause], jobs.gang_ends.get(cause, 0))
    yield ends
    claims = CounterMetricFamily("p2pnode_claims_ignored", "Members' claims this node ignored while it led, the "
                                 "plan not backing them, by reason", labels=["reason"])
    for reason in CLAIM_REASONS:
        claims.add_metric([reason], jobs.claims_ignored.get(reason, 0))
    yield claims
    yield GaugeMetricFamily("p2pnode_gpu_utilization_band_min_percent",
                            "Lower edge of this node's GPU utilization band (the PID set-point), percent",
                            value=jobs.band_min_percent)
    stops = CounterMetricFamily("p2pnode_job_stops", "Jobs the node's own stop rules asked to stop since start, by "
                                "rule", labels=["rule"])
    for rule in RULE_NAMES:
        stops.add_metric([rule], jobs.job_stops.get(rule, 0))
    yield stops
    yield from checkpoint_warnings(jobs.checkpoint_warnings, jobs.interruption_probes)
    pending = jobs.pending_count
    if pending is not None:  # the leader only: one series per fleet
        yield GaugeMetricFamily("p2pnode_jobs_pending", "GPU templates waiting for capacity in the leader's newest "
                                "plan (not unsatisfiable ones, nor configs already training)", value=pending)


def _job_table(jobs: JobsSurface) -> Iterator[Metric]:
    """The job table's transition errors by ``(state, event)`` (issue 39: events with no transition, a bug
    signal; the newest are in ``GET /jobs``)."""
    errs = CounterMetricFamily("p2pnode_job_transition_errors", "Job table events with no transition from the "
                               "job's state (ignored, a bug signal), by state and event", labels=["state", "event"])
    for (state, event), n in sorted(jobs.transition_errors.items()):
        errs.add_metric([state, event], n)
    yield errs


def _guard(guard: GuardSurface) -> Iterator[Metric]:
    """The degradation level, its changes, CPU and memory as assessed (over their windows; the raw sample is
    ``p2pnode_cpu_used_percent`` and ``p2pnode_memory_used_percent``), PSI avg10 by resource and kind, PSI files
    rejected by reason, and events by name."""
    yield GaugeMetricFamily("p2pnode_degradation_level", "Guard degradation level 0-4 (with hysteresis)",
                            value=guard.level)
    yield CounterMetricFamily("p2pnode_degradation_level_changes", "Changes of the degradation level",
                              value=guard.tracker.changes)
    a, sample = guard.assessment, guard.sample
    if a is not None and a.signals:
        window = GaugeMetricFamily("p2pnode_guard_assessed_percent", "CPU and memory as the guard assesses them "
                                   "(CPU: mean over guard.cpu_window_s; memory: over guard.memory_window_s, or the "
                                   "sample at or above its limit), percent", labels=["resource"])
        for x in a.signals:
            window.add_metric([x.resource], x.assessed_percent)
        yield window
    psi = sample.psi if sample is not None else None
    if psi is not None:
        stall = GaugeMetricFamily("p2pnode_pressure_stall_ratio", "Pressure stall information avg10 (share of the "
                                  "last 10 s in which some / all tasks waited for the resource, 0-1); shown beside "
                                  "the guard's windows, never moves the level", labels=["resource", "kind"])
        for resource in PSI_RESOURCES:
            for kind in ("some", "full"):
                v = psi.avg10(resource, kind)
                if v is not None:
                    stall.add_metric([resource, kind], v / 100.0)
        yield stall
    rejected = CounterMetricFamily("p2pnode_pressure_stall_rejected", "PSI files the sampler rejected, by reason",
                                   labels=["reason"])
    for reason in STALL_REJECTIONS:
        rejected.add_metric([reason], guard.psi_rejected.get(reason, 0))
    yield rejected
    ev = CounterMetricFamily("p2pnode_events", "Events emitted by this node since it started", labels=["event"])
    for name in EVENT_NAMES:
        ev.add_metric([name], guard.event_counts.get(name, 0))
    yield ev


def _resources(s: ResourceSample) -> Iterator[Metric]:
    """This node's CPU, memory, disk and GPU use (percent), CPUs, load, memory and disk sizes, GPU power score."""
    yield GaugeMetricFamily("p2pnode_cpu_used_percent", "CPU utilization of all cores, percent",
                            value=s.cpu_percent)
    yield GaugeMetricFamily("p2pnode_memory_used_percent", "Memory in use, percent", value=s.mem_percent)
    yield GaugeMetricFamily("p2pnode_disk_used_percent", "Disk usage of the data dir's file system, percent",
                            value=s.disk_percent)
    yield GaugeMetricFamily(
        "p2pnode_gpu_used_percent", "Highest GPU utilization or GPU memory use on this node, percent",
        value=max([g.util_percent for g in s.gpus] + [100.0 * g.mem_used_bytes / g.mem_total_bytes
                                                      for g in s.gpus if g.mem_total_bytes] + [0.0]),
    )
    yield GaugeMetricFamily("p2pnode_cpus", "Logical CPUs", value=s.cpu_count)
    yield GaugeMetricFamily("p2pnode_load_average_1m", "1-minute load average", value=s.load_avg[0])
    yield GaugeMetricFamily("p2pnode_memory_total_bytes", "Physical memory", value=s.mem_total_bytes)
    yield GaugeMetricFamily("p2pnode_memory_used_bytes", "Memory in use (total - available)",
                            value=s.mem_used_bytes)
    yield GaugeMetricFamily("p2pnode_disk_total_bytes", "Size of the file system holding the data dir",
                            value=s.disk_total_bytes)
    yield GaugeMetricFamily("p2pnode_disk_used_bytes", "Used bytes of the file system holding the data dir",
                            value=s.disk_used_bytes)
    yield GaugeMetricFamily("p2pnode_power_score", "GPU power score of this node (sum over GPUs)",
                            value=s.power_score)


def _gpus(s: ResourceSample) -> Iterator[Metric]:
    """Per GPU (labels ``gpu``, ``uuid``, ``model``): utilization, memory used and total, temperature, power."""
    labels = ["gpu", "uuid", "model"]
    util = GaugeMetricFamily("p2pnode_gpu_utilization_percent", "GPU utilization, percent", labels=labels)
    used = GaugeMetricFamily("p2pnode_gpu_memory_used_bytes", "GPU memory in use by all processes", labels=labels)
    total = GaugeMetricFamily("p2pnode_gpu_memory_total_bytes", "GPU memory", labels=labels)
    temp = GaugeMetricFamily("p2pnode_gpu_temperature_celsius", "GPU temperature", labels=labels)
    power = GaugeMetricFamily("p2pnode_gpu_power_watts", "GPU power draw", labels=labels)
    for g in s.gpus:
        lv = [str(g.index), g.uuid, g.name]
        util.add_metric(lv, g.util_percent)
        used.add_metric(lv, g.mem_used_bytes)
        total.add_metric(lv, g.mem_total_bytes)
        if g.temperature_c is not None:
            temp.add_metric(lv, g.temperature_c)
        if g.power_w is not None:
            power.add_metric(lv, g.power_w)
    yield from (util, used, total, temp, power)


def _scaling(jobs: JobsSurface) -> Iterator[Metric]:
    """Scaling (docs/capacity.md): actions counted while this node led, by class, op and outcome; provider calls
    that failed here; and, while this node leads, its newest verdict per class as a signed node count."""
    actions = CounterMetricFamily("p2pnode_scaling_actions",
                                  "Scaling actions carried out while this node led, by node class, op (up, down) "
                                  "and outcome (done, failed)", labels=["node_class", "op", "outcome"])
    for (cls, op, outcome), n in sorted(jobs.scaling_outcomes.items()):
        actions.add_metric([cls, op, outcome], n)
    yield actions
    failures = CounterMetricFamily("p2pnode_provider_failures",
                                   "Provider calls that failed or timed out on this node, by provider and operation "
                                   "(scale_up, scale_down, list, load)", labels=["provider", "operation"])
    for (provider, op), n in sorted(jobs.provider_failures.items()):
        failures.add_metric([provider, op], n)
    yield failures
    refused = CounterMetricFamily("p2pnode_scaling_claims_refused",
                                  "Members' claims (a node class, a started_by request id) that counted toward no "
                                  "scaling class while this node led, the provider and certificates not backing "
                                  "them, by reason, once per scaling step", labels=["reason"])
    for reason in SCALING_CLAIM_REASONS:
        refused.add_metric([reason], jobs.scaling_claims_refused.get(reason, 0))
    yield refused
    change = GaugeMetricFamily("p2pnode_scaling_desired_change",
                               "The leader's newest scaling verdict per node class: +k scale up by k, -k scale down "
                               "k nodes, 0 hold (exported by the leader only)", labels=["node_class"])
    for cls, delta in jobs.scaling_verdicts:
        change.add_metric([cls], delta)
    yield change


# -- fleet metrics (issue 27; docs/operations.md "Fleet metrics") ------------------------------------------------------
def _fleet(jobs: JobsSurface, catalog: Catalog | None) -> Iterator[Metric]:
    """Fleet figures (seed 003's monitoring): the leader's queue per kind, jobs that ended here per kind, Elo
    velocity per config. Label values come from this node's catalog (kinds, configs): bounded whatever peers send."""
    templates = catalog.templates if catalog is not None else {}
    yield from _fleet_queue(jobs.led_plan, templates)
    yield from _jobs_ended(jobs.jobs_ended_by_kind, templates)
    yield from _elo_velocity(jobs.newest_signals(), {t.config for t in templates.values()})
    yield from goodput(jobs.goodput(), {t.config for t in templates.values() if t.fenced and t.config})


def queue_by_kind(plan: PlanSection, templates: Mapping[str, JobTemplate]) -> dict[str, tuple[int, float]]:
    """``{kind: (jobs waiting, longest wait s)}`` from a leader's ``plan``, one entry per kind of ``templates``
    ((0, 0.0) when nothing of that kind waits).

    Jobs waiting: each pending catalog template still wants ``max_concurrency`` less the instances the plan holds
    (a gang counted once), at least one; a waiting one-off run (``PlanPending.of``) one instance; an instance is
    ``members`` jobs (a gang's members, else 1). The longest wait is the largest ``wait_s`` among them, as of
    the plan. Left out: a template whose config already trains elsewhere (reason ``"a training job ..."``:
    nothing waits for capacity) and templates not in ``templates`` (no kind). Unsatisfiable templates count:
    they wait for a node that can take them."""
    placed: Counter[str] = Counter()
    gangs: set[tuple[str, str]] = set()
    for a in plan.assignments:
        if a.gang is None:
            placed[a.template] += 1
        elif (a.template, a.gang.id) not in gangs:
            gangs.add((a.template, a.gang.id))
            placed[a.template] += 1
    out = {t.kind: (0, 0.0) for t in templates.values()}
    for p in plan.pending:
        t = templates.get(p.of or p.template)
        if t is None or p.reason.startswith("a training job"):
            continue
        instances = 1 if p.of else max(1, t.max_concurrency - placed[t.name])
        depth, longest = out[t.kind]
        out[t.kind] = (depth + instances * t.members, max(longest, p.wait_s))
    return out


def _fleet_queue(plan: PlanSection | None, templates: Mapping[str, JobTemplate]) -> Iterator[Metric]:
    """The leader only (``plan`` None elsewhere: no series, so ``max by (kind)`` across agents is the leader's):
    jobs waiting and the longest wait per kind (:func:`queue_by_kind`)."""
    if plan is None:
        return
    depth = GaugeMetricFamily("p2pnode_queue_depth", "Jobs waiting to be placed in the leader's newest plan, by "
                              "kind (exported by the leader only; a gang counts its members)", labels=["kind"])
    wait = GaugeMetricFamily("p2pnode_queue_longest_wait_seconds", "Longest a pending template of the kind has "
                             "waited, seconds, as of the leader's newest plan (exported by the leader only)",
                             labels=["kind"])
    for kind, (n, longest) in sorted(queue_by_kind(plan, templates).items()):
        depth.add_metric([kind], n)
        wait.add_metric([kind], longest)
    yield depth
    yield wait


def _jobs_ended(ended: Mapping[tuple[str, str], int], templates: Mapping[str, JobTemplate]) -> Iterator[Metric]:
    """Jobs that ended here on their own, per kind: completed (exit status 0) and failed. Every kind of the
    catalog is exported from 0, so ``rate()`` sees the first one."""
    kinds = sorted({t.kind for t in templates.values()} | {k for k, _ in ended})
    completed = CounterMetricFamily("p2pnode_jobs_completed", "Jobs that ended on this node with exit status 0, by "
                                    "kind (per hour: rate(p2pnode_jobs_completed_total[1h]) * 3600)",
                                    labels=["kind"])
    failed = CounterMetricFamily("p2pnode_jobs_failed", "Jobs that failed on this node on their own (non-zero exit "
                                 "status, or lost while the agent was down), by kind; stopped jobs are not counted",
                                 labels=["kind"])
    for kind in kinds:
        completed.add_metric([kind], ended.get((kind, "completed"), 0))
        failed.add_metric([kind], ended.get((kind, "failed"), 0))
    yield completed
    yield failed


def _elo_velocity(signals: Mapping[str, Signals], configs: set[str]) -> Iterator[Metric]:
    """The Elo velocity of each config of the catalog that has a signal (the cluster-wide newest one: the same on
    every node once gossip converged)."""
    elo = GaugeMetricFamily("p2pnode_elo_velocity", "Elo velocity per config from the newest training signal "
                            "cluster-wide, Elo points per day (0 when the signal left it out)", labels=["config"])
    for config in sorted(configs & set(signals)):
        elo.add_metric([config], signals[config].elo_velocity)
    yield elo


def _catalog_refused(book: CatalogBook, sources: CatalogSources) -> Iterator[Metric]:
    """Pushed catalogs refused by reason (pushed or fetched: :data:`p2pnode.scheduler.REFUSALS`), and catalog
    fetches from members that failed by reason (:class:`p2pnode.scheduler.CatalogSources`: a served version other
    than the advertised one, unreachable, too slow...)."""
    refused = CounterMetricFamily("p2pnode_catalog_refused", "Pushed catalogs refused by this node (posted or "
                                  "fetched), by reason", labels=["reason"])
    for reason, n in book.refused.items():
        refused.add_metric([reason], n)
    yield refused
    failed = CounterMetricFamily("p2pnode_catalog_fetch_failed", "Catalog fetches from members that failed or "
                                 "were refused (the member then skipped for a while), by reason", labels=["reason"])
    for reason, n in sorted(sources.refused.items()):
        failed.add_metric([reason], n)
    yield failed


def make_registry(s: HttpSurfaces) -> CollectorRegistry:
    """A registry of its own per node (several agents may live in one test process), collecting from ``s``."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(s))
    return reg
