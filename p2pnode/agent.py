"""The agent: assembles one node (core, drivers, subsystems) and runs them in one trio nursery.

The agent decides nothing itself. Policy is in the sans-IO :class:`p2pnode.node.NodeCore` (membership,
election, publication, plan fencing) and the subsystems' cores; the drivers move bytes
(:class:`p2pnode.drivers.GossipDriver`), watch resources (:class:`p2pnode.drivers.GuardDriver`), run jobs
(:class:`p2pnode.jobs.JobControl`) and replicate data (:class:`p2pnode.sync.SyncService`). Subsystems see the
node through :class:`p2pnode.node.NodeContext`, which the agent implements; the HTTP layer sees it through
:class:`p2pnode.http.HttpSurfaces` (one typed surface per part, built by :meth:`Agent.http_surfaces`).

Tasks, all owned by :meth:`Agent.run`'s nursery: the HTTP listener (hypercorn, and the gossip fast path of
:mod:`p2pnode.drivers._listener`); the core loop (sleeps until
:meth:`NodeCore.next_deadline` or an accepted snapshot, then reconciles and publishes when due); the sampler
(every ``sample_interval_s``); the guard; gossip rounds; job control; sync; mDNS and the peers-file writer; with
``gossip.probes``, the SWIM probe driver on UDP (:mod:`p2pnode._agentprobes`).

:meth:`Agent.stop` (SIGINT/SIGTERM) stops its jobs first (a stop held for a checkpoint: publishing and syncing on, until
a durable replica holds it, the node marked gone soon), then publishes a final ``leaving`` snapshot, pushes it to peers
for at most ``gossip.leave_timeout_s`` and unregisters mDNS; it returns the deadline at which the CLI cancels what is
left (the holds' bound + the jobs' stop grace and the leave; a second signal: those from then),
:mod:`p2pnode._agentclose`.
"""

from __future__ import annotations

import functools
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from . import __version__, jobs
from ._agentcatalog import _AgentCatalog
from ._agentclose import _AgentClosing
from ._agentprobes import _AgentProbes
from ._agentpublish import _AgentPublication
from ._agentroles import _AgentRoles
from .certs import RoleGate
from .config import Config, ProviderNat
from .discovery import load_peers
from .drivers import GossipDriver, GuardDriver, Trust, hostport
from .drivers._host import (
    advertised_addr,
    http_client,
    mdns_interfaces,
    provider_ports,
    raise_open_files_limit,
    server_config,
)
from .drivers._listener import ListenerStats, serve
from .election import MemberInfo
from .errors import DATA_ERRORS
from .gossip import ClusterState, DialPolicy, Gossiper, MemberEntry, MemberState, PeerBook, addr_refusal, quiet_round
from .http import GossipEndpoint, HttpSurfaces, LazyRegistry, NodeStats, create_app, serve_gossip
from .identity import load_or_create_identity
from .inputs import warm_type_info
from .jobs import CatalogPush
from .node import Member, MemberInfoCache, NodeCore
from .node._persist import (
    VOTE_FILE,
    VOTERS_FILE,
    FileStore,
    OwnCert,
    load_role_floors,
    load_roll,
    load_vote,
)
from .node._publish import PublishStats
from .probes import ResourceSampler, open_gpu_source
from .resources import FakeGpus, NoGpus, ResourceSample, parse_fake_gpu_load, parse_resources
from .scheduler import CatalogBook, load_catalog
from .series import ClusterSeries
from .snapshot import RollSection, section_of
from .statefiles import open_report
from .sync import SyncService
from .wire import WireLimits

__all__ = ["Agent"]

log = logging.getLogger(__name__)

RECONCILE_GAP_PER_INTERVAL = 4
"""Accepted snapshots wake the core loop at most this many times per gossip interval (the cadence the agent
polled at before it slept until ``next_deadline``; an idle cluster now wakes it only when something arrives)."""


class Agent(_AgentRoles, _AgentCatalog, _AgentPublication, _AgentProbes, _AgentClosing):
    """One p2pnode agent. Build with a :class:`Config`; run with ``await nursery.start(agent.run)``.

    Raises :class:`p2pnode.errors.IdentityError` from the constructor when the key file is unusable (an unusable
    voter roll is reported and adopted again from the peers: :func:`p2pnode.node._persist.load_roll`),
    :class:`p2pnode.keyring.KeyringError` in token mode without a usable keyring, and ``OSError`` when
    the data dir cannot be created.
    """

    def __init__(self, config: Config, *, rng: random.Random | None = None, nat: ProviderNat | None = None) -> None:
        self.config = config
        self.nat = nat
        """The marketplace provider's public address and port mapping (:func:`p2pnode.config.provider_nat`, read by
        the CLI from its environment), or None: what the node advertises when ``agent.advertise`` and
        ``sync.advertise_data_port`` are not set."""
        self.agent_version = __version__
        a, g = config.agent, config.gossip
        self.data_dir = a.data_dir.absolute()  # jobs run with it as cwd and in their environment
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.state_files = open_report(self.data_dir)  # what the state-file decoders below drop (p2pnode.statefiles)
        self.identity = load_or_create_identity(self.data_dir)
        self.declared = parse_resources(config.agent.resources)
        self.node_id = self.identity.node_id
        self.rng = rng or random.Random()
        self.store = FileStore(self.data_dir)
        self.trust = Trust(a.trust, self.data_dir, bootstrap_token=a.cluster_token, node_id=self.node_id,
                           key_of=self._node_key, is_voter=lambda n: n in self.core.roll.members,
                           accept_unbound=a.accept_unbound_requests)
        self.roles = RoleGate(a.operator_keys, max_members=g.max_members)  # roles the operator grants (certs)
        if self.roles.pinned:  # certificates older than one seen for the same node stay superseded across restarts
            self.roles.restore_floors(load_role_floors(self.data_dir, limit=4 * g.max_members))
        self._floors_saved = self.roles.floors_changed
        self.own_cert = OwnCert(self.data_dir, self.node_id)
        self.state = ClusterState(self.node_id, token=self.trust.keyring, max_members=g.max_members,
                                  max_verifications=g.max_verifications_per_message,
                                  roles=self.roles, roles_wall=time.time(),
                                  limits=WireLimits(max_body_bytes=g.max_body_bytes,
                                                    max_snapshot_bytes=g.max_snapshot_bytes))
        self.dial_policy = DialPolicy(allow_private=a.allow_private_advertise)  # members' addresses we may dial
        self.peers = PeerBook(self.node_id, base_backoff_s=g.base_backoff_s, max_backoff_s=g.max_backoff_s,
                              policy=self.dial_policy)
        self.gossiper = Gossiper(self.state, self.peers, self_addr="", fanout=g.fanout, idle_fanout=g.idle_fanout,
                                 rng=self.rng, on_accepted=self._on_accepted,
                                 push_pull_interval_s=g.push_pull_interval_s)
        self.core = NodeCore(
            self.node_id, config=config.membership(), store=self.store, info=self._member_info,
            roll_candidates=self._roll_candidates, incarnation=self.store.next_incarnation(),
            vote=load_vote(self.data_dir / VOTE_FILE),
            roll=load_roll(self.data_dir / VOTERS_FILE, trusted=a.trust == "token",
                           bootstrap_s=config.election.voter_bootstrap_s),
            tags=self._own_tags(), trusted=a.trust == "token", min_voters=config.election.min_voters,
            voter_cap=g.max_members,
            leader_settle_s=config.election.leader_settle_s, expect_peers=bool(a.join),
            seed_peers=bool(a.join) or bool(config.discovery.peers_file and load_peers(self.data_dir)),
            roll_of=lambda n: self.section(n, RollSection), voter_bootstrap_s=config.election.voter_bootstrap_s,
            pinned=self.roles.pinned, probes=config.probe_config(), probe_rng=self.rng,
            first_probe_seq=time.time_ns() // 1000,  # a restart reuses no seq inside the peers' replay window
        )
        self.probes = self._build_probes()  # SWIM probes (gossip.probes), or None
        self.gossip = GossipDriver(config, self.gossiper, self.peers, node_id=self.node_id, now=self.now, rng=self.rng)
        self.gossip.quiet = lambda now: quiet_round(self.core.membership, self.state, now, fanout=g.fanout,
                                                    failed_at=self.gossiper.failed_at)
        book = CatalogBook(config.catalog.signers, lease=config.lease_terms(),
                           base_dir=str(Path(a.catalog).resolve().parent) if a.catalog else str(self.data_dir))
        self.catalog_push = CatalogPush(book, self.data_dir, self.set_catalog)
        self.catalog = self.catalog_push.restore() or (load_catalog(a.catalog) if a.catalog else None)
        self.guard = GuardDriver(config.guard, node_id=self.node_id, data_dir=self.data_dir, now=self.now,
                                 on_news=self.publish_soon,
                                 priority_of=self.catalog.priority_of if self.catalog else None,
                                 kinds={t.kind for t in self.catalog.templates.values()} if self.catalog else ())
        self.sampler = ResourceSampler(self.data_dir, open_gpu_source(a.fake_gpus or None, seed=self.node_id))
        self.guard.psi_rejected = self.sampler.psi_rejected  # PSI files rejected, by reason (GET /guard, metrics)
        fake = self.sampler.gpu_source if isinstance(self.sampler.gpu_source, FakeGpus) else None
        if fake is not None:
            for spec in a.fake_gpu_load:
                index, util, mem = parse_fake_gpu_load(spec)
                fake.hold(index, util_percent=util, mem_percent=mem)
        self.jobs = (jobs.JobControl(self, self.core, self.catalog, guard=self.guard, fake_gpus=fake)
                     if self.catalog else None)  # job control is loaded here, with a catalog only (p2pnode.jobs)
        if self.jobs is not None:
            self.jobs.catalogs = self.catalog_push
        self.guard.memory_enforcement = (self.jobs.runner.memory_enforcement if self.jobs is not None else
                                         {"mode": "none", "base": None, "moved_to": None,
                                          "why": "no catalog: this agent runs no jobs"})
        self.sync = SyncService(self)
        self._wire_checkpoints()
        self._last_sample: ResourceSample | None = None
        self._info_cache = MemberInfoCache()
        self.started_at = time.time()
        self.addr = ""
        self.addr_source = ""  # where self.addr came from: config, vast.ai, runpod, bind, local address
        self.port = 0
        self.publication = PublishStats()  # what sealing did to our own snapshots (plans omitted, ...)
        self.sample_failures = 0
        self.listener_stats = ListenerStats()  # connections and requests the HTTP listener ended itself
        self.series = ClusterSeries()  # the dashboard's cluster GPU and job figures, last 15 min (GET /ui/series)
        self.surfaces = self.http_surfaces()  # all the HTTP routes, views and metrics may read (p2pnode.http)
        self.metrics_registry = LazyRegistry(self.surfaces)  # made at the first GET /metrics
        self._stop = trio.Event()
        self._wake = trio.Event()
        self._job_news = False  # a member's snapshot brought news since job control last heard
        self._jobs_saw: tuple[Any, ...] = ()  # the election view job control last heard of
        self._client: httpx.AsyncClient | None = None

    # -- NodeContext -------------------------------------------------------------------------------
    @staticmethod
    def now() -> float:
        """Monotonic seconds (trio's clock, so tests may use a MockClock)."""
        return trio.current_time()

    @property
    def leaving(self) -> bool:
        """True once this node announced that it leaves (its final snapshot is published)."""
        return self.core.leaving

    @property
    def last_sample(self) -> ResourceSample | None:
        """This node's newest resource sample (None before the first)."""
        return self._last_sample

    @last_sample.setter
    def last_sample(self, sample: ResourceSample | None) -> None:  # tests inject samples
        """This node's newest resource sample (None before the first)."""
        self._last_sample = sample

    @property
    def degradation_level(self) -> int:
        """The guard's degradation level 0-4 (with hysteresis)."""
        return self.guard.level

    @property
    def client(self) -> httpx.AsyncClient | None:
        """The shared httpx client (None outside :meth:`run`)."""
        return self._client

    def _warn_refused_self_addr(self) -> None:
        """Log a warning when peers with the same settings would refuse to dial our own advertised address."""
        why = addr_refusal(self.addr, allow_private=self.config.agent.allow_private_advertise)
        if why is not None:
            log.warning("peers will not dial this node's advertised address %s (%s): set agent.advertise to an IP "
                        "address peers reach (agent.allow_private_advertise for a loopback lab cluster)",
                        self.addr, why)

    def _member(self, e: MemberEntry) -> Member:
        state = MemberState.ALIVE if e.origin == self.node_id else self.core.state_of(e.origin) or MemberState.ALIVE
        refused = None if e.origin == self.node_id or not e.snapshot.addr else self.dial_policy.refusal(e.snapshot.addr)
        return Member(e.origin, state, e.snapshot, e.envelope.key, e.received_at, self.roles.check_of(e.origin),
                      refused)

    def members(self, *, live: bool = False) -> list[Member]:
        """Every member held (this node included) as :class:`p2pnode.node.Member`; ``live``: alive and suspect only."""
        out = [self._member(e) for e in self.state.entries()]
        return [m for m in out if m.state in (MemberState.ALIVE, MemberState.SUSPECT)] if live else out

    def member(self, origin: str) -> Member | None:
        """``origin`` as a :class:`p2pnode.node.Member`, or None when no snapshot of it is held."""
        e = self.state.get(origin)
        return self._member(e) if e is not None else None

    def section(self, origin: str, kind: type[Any]) -> Any:
        """The typed section ``kind`` of ``origin``'s newest snapshot, or None."""
        e = self.state.get(origin)
        return section_of(e.snapshot, kind) if e is not None else None

    def state_of(self, origin: str) -> MemberState | None:
        """``origin``'s membership state in this node's view (None: unknown)."""
        return self.core.state_of(origin)

    def peer_read_headers(self, method: str, target: str, receiver: str) -> dict[str, str]:
        """Headers that authenticate this node's read of a peer route (``/plan/part``, ``/jobs/running``, a
        predecessor's whole plan) on the member ``receiver`` (its node id: the request is signed for it and refused
        by any other): in token mode an ``x-p2pnode-auth`` HMAC with the keyring's primary token, else a signature
        with this node's key (accepted on those routes when the peer sets a read token). No secret crosses the
        network. With ``agent.accept_unbound_requests`` (a rolling upgrade) they are signed unbound (``v1``,
        ``k1``), which agents not yet upgraded and upgraded ones with the setting both accept."""
        from .reqauth import AUTH_HEADER, sign_request, sign_request_with_key

        to = None if self.trust.request_auth.accept_unbound else receiver  # None: the peer may predate binding
        ring = self.trust.keyring
        if ring is not None and ring.primary is not None and ring.primary_token:
            return {AUTH_HEADER: sign_request(ring.primary_token, ring.primary, method, target, b"", time.time(),
                                              receiver=to)}
        return {AUTH_HEADER: sign_request_with_key(self.identity, method, target, b"", time.time(), receiver=to)}

    def publish_soon(self) -> None:
        """Ask for a new snapshot version within the minimum publish gap, and wake the core loop."""
        self.core.want_publish()
        self._wake.set()

    def publish_to(self, *node_ids: str) -> None:
        """Publish now (one snapshot version) and start a gossip exchange with each of ``node_ids`` outside the round
        (news they wait on: a sync receipt counts only from our signed snapshot). Just :meth:`publish_soon` while
        leaving or when none is known."""
        entries = [self.state.get(n) for n in node_ids]
        addrs = [a for e in entries if e is not None and (a := self.dial_policy.dialable(e.addr))]
        if self.leaving or not addrs or self.gossip.nursery is None:
            self.publish_soon()
            return
        self.publish()
        for addr in addrs:
            self.gossip.exchange_soon(addr)

    def emit_event(self, name: str, payload: dict[str, Any]) -> None:
        """Record an event (logged, carried in the snapshot, handed to the hooks)."""
        self.guard.emit_event(name, payload)

    def quarantine(self, origin: str, where: str, exc: Exception) -> None:
        """A member's snapshot broke ``where`` (a gap in the decoder's bounds, which the fuzz suite treats as a
        failure): drop that snapshot, count it, log once per origin; the agent carries on."""
        first = origin not in self.state.quarantined
        if self.state.quarantine(origin, f"{where}: {exc.__class__.__name__}: {exc}") and first:
            log.error("quarantined the snapshot of %s: it broke %s (%s: %s)", origin, where, exc.__class__.__name__,
                      exc)

    # -- the core's inputs -------------------------------------------------------------------------
    def _on_accepted(self, entry: MemberEntry, now: float) -> None:
        try:
            changes = self.core.observe(entry.origin, entry.version, entry.snapshot.membership, entry.leaving, now)
        except DATA_ERRORS as exc:
            self.quarantine(entry.origin, "membership", exc)
            return
        self._log_changes(changes)
        self.push_news(now)  # an accusation or a refutation new to us: pushed on at once (NodeCore.push_due)
        if changes or entry.news == entry.version:  # a bare heartbeat waits for the core's next deadline
            self._wake.set()
            self._job_news = True

    def _member_info(self, node_id: str) -> MemberInfo | None:
        """Rank, vote and tags from ``node_id``'s newest snapshot (:class:`p2pnode.node.MemberInfoCache`)."""
        return self._info_cache.get(self.state.get(node_id), self.quarantine)

    def http_surfaces(self) -> HttpSurfaces:
        """The narrow, typed surfaces the HTTP layer gets (:class:`p2pnode.http.HttpSurfaces`): each part as the
        routes, views and metrics use it (job control through its adapter), this agent only as their
        :class:`p2pnode.http.NodeSurface` (identity, clock, members, ``publish_soon``, ``change_voter``)."""
        job_surface = jobs.JobControlSurface(self.jobs) if self.jobs is not None else None
        return HttpSurfaces(
            node=self, core=self.core, cluster=self.state, gossiper=self.gossiper, trust=self.trust, guard=self.guard,
            gossip=self.gossip, sync=self.sync, jobs=job_surface,
            stats=NodeStats(versions=self.store.versions, publication=self.publication, state_files=self.state_files,
                            listener=self.listener_stats),
            series=self.series, probes=self.probes,
        )

    def change_voter(self, node_id: str, *, admit: bool) -> bool:
        """``p2pnode node admit|remove``: see :meth:`NodeCore.change_voter`."""
        changed = self.core.change_voter(node_id, admit=admit, wall=time.time())
        if changed:
            self._wake.set()
        return changed

    def change_eligibility(self, node_id: str, state: str) -> bool:
        """``p2pnode node eligible|ineligible|unmark``: see :meth:`NodeCore.change_eligibility`."""
        changed = self.core.change_eligibility(node_id, state, time.time())
        if changed:
            self._wake.set()
        return changed

    # -- drivers -----------------------------------------------------------------------------------
    async def _core_loop(self) -> None:
        """Reconcile when an input arrived or the core's next deadline passed, at most
        ``RECONCILE_GAP_PER_INTERVAL`` times per gossip interval."""
        gap = self.config.membership().gossip_interval_s / RECONCILE_GAP_PER_INTERVAL
        while True:
            self._wake = trio.Event()
            self.reconcile()
            last = self.now()
            with trio.move_on_at(self.core.next_deadline(self.now(), heartbeat=False)):  # heartbeats: sampler
                await self._wake.wait()
            await trio.sleep_until(last + gap)

    async def _sample_loop(self) -> None:
        interval = self.config.agent.sample_interval_s
        while True:
            await trio.sleep(interval)
            try:
                if isinstance(self.sampler.gpu_source, (FakeGpus, NoGpus)):
                    self._last_sample = self.sampler.sample()  # /proc reads only: cheaper than a thread hop
                else:
                    self._last_sample = await trio.to_thread.run_sync(self.sampler.sample)  # NVML calls may block
            except OSError as exc:  # e.g. EMFILE while a flood holds descriptors: skip this sample, keep beating
                self.sample_failures += 1
                log.warning("resource sample failed (%s); keeping the previous one", exc)
            self.guard.check(self._last_sample)  # each sample enters the guard's CPU and memory windows
            self._recheck_roles()
            self.series.record(time.time(), (m.snapshot for m in self.members(live=True)), self.core.view.leader)
            if self.jobs is not None:  # a new sample: the level, the GPUs' load and the offer may have moved
                self.jobs.news()
            if (self.trust.reload() or self.core.publish_due(self.now(), interval / 2)) and not self.leaving:
                self.publish()  # a new primary token, or the heartbeat (on this timer: one wakeup less)

    async def run(self, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until :meth:`stop`; ``started(self)`` once HTTP is bound and the first snapshot published."""
        a = self.config.agent
        # Before any worker thread: msgspec's first decode of a type is not safe against a second thread's.
        built, refused = warm_type_info()
        log.debug("msgspec type information built for %d classes (not decodable: %s)", built, refused)
        # Signature checks run in a worker thread; with CPython's default 5 ms switch interval the event loop
        # waits up to 5 ms for the GIL each time it wakes while a check runs (/status p99 ~100 ms under a flood).
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        raise_open_files_limit()
        hc = server_config(a.bind, a.port)
        shutdown, served = trio.Event(), trio.Event()
        async with http_client() as client:
            self._client = client
            async with trio.open_nursery() as nursery:
                app = create_app(self.surfaces, self.metrics_registry)
                gossip_route = functools.partial(serve_gossip, GossipEndpoint.of(self.surfaces))
                binds = await nursery.start(functools.partial(
                    serve, app, hc, gossip_route, stats=self.listener_stats,
                    shutdown_trigger=shutdown.wait, done=served))
                self.port = urlsplit(binds[0]).port  # our own listener's bind, http://host:port
                self.addr, self.addr_source = advertised_addr(a, self.port, self.nat)
                self.sync.public_ports = provider_ports(self.nat, self.addr_source)
                self.gossiper.self_addr = self.addr
                self.peers.self_addrs |= {self.addr, hostport("127.0.0.1", self.port), hostport("localhost", self.port)}
                self.gossip.add_seeds(self.data_dir)
                self.sample()
                self.guard.check(self._last_sample)
                if self.jobs is not None:  # the first snapshot lists the jobs that survived our restart
                    self.jobs.runner.readopt()
                self.publish()
                log.info("agent %s serving on %s (advertising %s)", self.node_id, ", ".join(binds), self.addr)
                self._warn_refused_self_addr()
                nursery.start_soon(self._sample_loop)
                nursery.start_soon(self._core_loop)
                nursery.start_soon(self.guard.run, lambda: self._last_sample, self.sync.replicated_predicate,
                                   self.sync.protected_predicate, self.sync.verify_before_delete)
                if self.jobs is not None:
                    await nursery.start(self.jobs.run)
                await nursery.start(self.sync.run)
                await nursery.start(self.gossip.run)
                await self._start_probes(nursery, a.bind, self.port)  # UDP on the gossip port (gossip.probes)
                if self.config.discovery.peers_file:
                    nursery.start_soon(self.gossip.peers_file_loop, self.data_dir)
                if self.config.discovery.mdns:
                    interfaces = mdns_interfaces(self.config)
                    if interfaces:
                        await nursery.start(self.gossip.run_mdns, self.port, interfaces)
                    else:
                        self.gossip.mdns_error = "no non-loopback IPv4 interface to announce on"
                        log.warning("mDNS disabled: %s", self.gossip.mdns_error)
                task_status.started(self)
                await self._stop.wait()
                await self._close()  # the jobs (held stops), then the leave (p2pnode._agentclose)
                if self.config.discovery.peers_file:
                    self.gossip.save_peers(self.data_dir)
                shutdown.set()
                with trio.move_on_after(hc.graceful_timeout + 0.1):  # requests under way get their replies
                    await served.wait()
                nursery.cancel_scope.cancel()
            self.sampler.gpu_source.close()
