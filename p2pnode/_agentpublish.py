"""The agent's publication (a part of :class:`p2pnode.agent.Agent`, which inherits it): one pass of the core
(:meth:`_AgentPublication.reconcile`), this node's snapshot built from every subsystem's section and sealed within
its bounds (:meth:`_AgentPublication.publish`), membership changes logged, and the resource sample. The agent's own
state is declared here for the type checker only; nothing else imports this module.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from typing import TYPE_CHECKING, Any

import msgspec

from .config import Config
from .drivers import GossipDriver, GuardDriver, Trust
from .gossip import ClusterState, Gossiper, MemberState, StateChanged
from .identity import Identity
from .label import Label, node_label
from .node import MemberInfoCache, NodeCore, RollAdoption
from .node._persist import (
    FileStore,
    OwnCert,
)
from .node._publish import PublishStats, seal_within_bounds
from .probes import ResourceSampler
from .resources import ResourceSample, rank_of_gpus
from .snapshot import SCHEMA_VERSION, JobsSection, Resources, ScalingSection, Snapshot, convert_resources
from .sync import SyncService

if TYPE_CHECKING:
    from .jobs import JobControl

log = logging.getLogger("p2pnode.agent")


class _AgentPublication:
    """Reconcile, build and publish this node's snapshot, for one agent."""

    config: Config
    node_id: str
    identity: Identity
    agent_version: str
    started_at: float
    addr: str
    declared: dict[str, float]
    core: NodeCore
    state: ClusterState
    gossiper: Gossiper
    gossip: GossipDriver
    store: FileStore
    trust: Trust
    guard: GuardDriver
    sync: SyncService
    jobs: JobControl | None
    own_cert: OwnCert
    sampler: ResourceSampler
    publication: PublishStats
    _info_cache: MemberInfoCache
    _last_sample: ResourceSample | None
    _job_news: bool
    _jobs_saw: tuple[Any, ...]

    if TYPE_CHECKING:  # defined by the agent
        @staticmethod
        def now() -> float: ...

        @property
        def leaving(self) -> bool: ...

        def _own_tags(self) -> list[str]: ...
        def _report_seed_peers(self) -> None: ...

    def _log_changes(self, changes: list[StateChanged]) -> None:
        for ch in changes:
            level = logging.INFO if ch.new in (MemberState.DEAD, MemberState.LEFT, None) or ch.old else logging.DEBUG
            log.log(level, "member %s: %s -> %s", ch.node_id, ch.old.value if ch.old else "new",
                    ch.new.value if ch.new else "reaped")
            if ch.new is None:
                self.state.forget(ch.node_id)
                self._info_cache.forget(ch.node_id)
                if self.jobs is not None:
                    self.jobs.forget(ch.node_id)

    # -- publication -------------------------------------------------------------------------------
    def build_snapshot(self, version: int) -> Snapshot:
        """This node's snapshot at ``version``: the header and every subsystem's section."""
        sample = self._last_sample
        try:
            resources = convert_resources(sample.to_wire()) if sample else Resources()
        except msgspec.ValidationError as exc:
            log.error("own resource sample fails its bounds (%s): published without it", exc)
            resources = Resources()
        a = self.config.agent
        if self.declared:
            resources = msgspec.structs.replace(resources, declared=self.declared)
        jobs = self.jobs.section() if self.jobs else JobsSection()
        notice = self.jobs.stops.notice_fields() if self.jobs else {}
        if notice:  # an interruption notice or a clean stop (issue 41): the leader places nothing more here
            jobs = msgspec.structs.replace(jobs, **notice)
        return Snapshot(
            schema=SCHEMA_VERSION, origin=self.node_id, version=version, addr=self.addr, tags=list(a.tags),
            leaving=self.leaving, started_at=self.started_at, ts=time.time(), agent_version=self.agent_version,
            trust=a.trust, label=self._label, resources=resources, membership=self.core.membership_section(),
            vote=self.core.vote_section(), jobs=jobs, plan=self.jobs.leading.plan_section() if self.jobs else None,
            sync=self.sync.section(), guard=self.guard.section(), events=self.guard.events_section(),
            **({"operator": self.jobs.operator.section} if self.jobs else {}), roll=self.core.roll_section(time.time()),
            scaling=self.jobs.scaling_section() if self.jobs else self._scaling_section,
            cert=self.own_cert.cert,
        )

    @functools.cached_property
    def _label(self) -> Label:
        """This node's label (:func:`p2pnode.label.node_label`): ``agent.name`` or the hostname, and the provider's
        instance id from the environment; read once."""
        return node_label(self.config.agent.name, socket.gethostname(), os.environ)

    @functools.cached_property
    def _scaling_section(self) -> ScalingSection:
        """The scaling section of a node without job control: built once (the config does not change; it was
        re-hashed on every heartbeat)."""
        return ScalingSection(settings_digest=self.config.scaling.digest(), started_by=self.config.agent.started_by)

    def publish(self) -> None:
        """Sign a new snapshot version and install it as our local state (the bounds: see
        :func:`p2pnode.node._publish.seal_within_bounds`)."""
        seen = self.gossiper.last_self_version_seen
        self.gossiper.last_self_version_seen = None
        if seen is not None and seen < self.store.versions.value:
            seen = None
        snap = self.build_snapshot(self.core.next_version(seen))
        limit = self.config.gossip.max_snapshot_bytes
        sealed = self.publication.record(
            seal_within_bounds(self.identity, snap, token=self.trust.primary_token, max_snapshot_bytes=limit), limit)
        if sealed is None:
            return
        now = self.now()
        self.state.set_local(sealed.envelope, sealed.snapshot, now)
        self.core.published(now, sealed.snapshot.membership.suspects)

    def reconcile(self) -> None:
        """One pass of the core: timeouts, refutation, vote and leader view; publish when due."""
        now = self.now()
        s = self._last_sample
        self.core.set_rank(*(rank_of_gpus((g.name, g.mem_total_bytes) for g in s.gpus) if s else (0.0, 0)))
        if self.core.adoption in (RollAdoption.WAITING, RollAdoption.CONFLICT):
            self._report_seed_peers()
        self.core.tags = tuple(self._own_tags())
        # Gone soon by the predicate the peers read from this node's snapshot (a notice: the probe's or a clean
        # stop's; p2pnode.node._info.member_info), so this node votes as its peers count it (review H1).
        self.core.leaving_soon = bool(self.jobs is not None and self.jobs.stops.notice_fields())
        changes = self.core.reconcile(now, time.time())
        self._log_changes(changes)
        if self.core.publish_due(now):
            self.publish()
        self.push_news(now)
        v = self.core.view
        seen = (v.leader, v.term, self.core.election.highest_term, self.core.holding)
        if changes or self._job_news:
            self.sync.checkpoint_news()  # issue 41: the checkpoint pass runs when the members' listings changed
        if self.jobs is not None and (changes or self._job_news or seen != self._jobs_saw):
            self.jobs.news()  # a member's snapshot brought news, a state or the election view changed
        self._job_news, self._jobs_saw = False, seen

    def push_news(self, now: float) -> None:
        """Push membership news at once when the core says so (:meth:`NodeCore.push_due`): one push-pull exchange
        with each of ``fanout`` random peers, outside the rounds (memberlist broadcasts suspect, alive and dead
        messages to ``GossipNodes`` members every ``GossipInterval``)."""
        if not self.core.push_due(now):
            return
        if not self.leaving and self.gossip.nursery is not None:  # (else the push is dropped: no wake-up loop)
            for addr in self.gossiper.choose_targets(now):
                self.gossip.exchange_soon(addr)
        self.core.pushed(now)

    def sample(self) -> None:
        """Take a resource sample now (blocking: NVML and /proc reads)."""
        self._last_sample = self.sampler.sample()
