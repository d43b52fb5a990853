"""What the HTTP layer may read and do: one narrow, typed surface per subsystem, never the agent.

In the spirit of trio's ``serve_listeners(handler, listeners)``, a route, a view or a metrics step gets exactly the
surfaces it uses. :class:`HttpSurfaces` bundles them; the agent builds it (its parts satisfy these protocols
structurally, as the agent satisfies :class:`p2pnode.node.NodeContext`) and hands it to
:func:`p2pnode.http.create_app`, :func:`p2pnode.http.make_registry` and :func:`p2pnode.http.serve_gossip`. This
package never imports the agent, the drivers, job control or the sync service (import-linter's contracts keep the
first; the others are structural protocols here).

================  ============================================================  ===============================
surface           what the HTTP layer uses it for                               implemented by
================  ============================================================  ===============================
``node``          identity, clock, members; publish, change the voter roll     the agent (:class:`NodeSurface`)
``core``          election view, voter roll, membership (read only)            :class:`p2pnode.node.NodeCore`
``cluster``       members' snapshots held, gossip rejection counters            :class:`p2pnode.gossip.ClusterState`
``gossiper``      exchanges initiated, ok and failed                            :class:`p2pnode.gossip.Gossiper`
``trust``         signed-request checks, read refusals, keyring view            ``drivers.Trust``
``guard``         ``GET /guard``, level, events                                 ``drivers.GuardDriver``
``gossip``        ``POST /gossip`` admission and handling, peers, mDNS          ``drivers.GossipDriver``
``sync``          the ``/sync/*`` routes and sync metrics                       ``sync.SyncService``
``jobs``          plans, running lists, signals, operator routes (or None)      ``jobs.JobControlSurface``
``stats``         publication, state-file, listener and snapshot counters       the agent's counters
``series``        the dashboard's time series (or None)                         :class:`p2pnode.series.ClusterSeries`
``counters``      what the HTTP layer counts itself (clients gone)              :class:`HttpCounters`
================  ============================================================  ===============================
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any, Protocol

import msgspec
import trio

from ..config import Config
from ..gossip import ClusterState, Gossiper, GossipReply, ProbeCodec, Prober
from ..guardcore import Assessment
from ..node import Member, NodeCore
from ..node._runs import RunRecord
from ..reqauth import RequestVerifier
from ..resources import ResourceSample
from ..scheduler import Catalog, JobTemplate, Signals
from ..series import ClusterSeries
from ..snapshot import JobReport, OperatorSection, PlanRef, PlanSection, RunRequest
from ..statefiles import StateFileReport
from ..sync import BlockStream

__all__ = [
    "GossipInbound",
    "GossipSurface",
    "GuardSurface",
    "HttpCounters",
    "HttpSurfaces",
    "JobsSurface",
    "NodeStats",
    "NodeSurface",
    "OperatorSurface",
    "PlanSurface",
    "ProbeSurface",
    "SyncSurface",
    "TrustSurface",
]


# -- this node -------------------------------------------------------------------------------------------------------
class NodeSurface(Protocol):
    """This node as the routes and views read it, and the two things they ask of it. Times: ``now()`` is
    monotonic seconds; ``started_at`` wall-clock seconds."""

    @property
    def node_id(self) -> str: ...

    @property
    def addr(self) -> str:
        """``host:port`` this node advertises ('' before it serves)."""
        ...

    @property
    def addr_source(self) -> str:
        """Where :attr:`addr` came from: ``config``, ``vast.ai``, ``runpod``, ``bind`` or ``local address``."""
        ...

    @property
    def agent_version(self) -> str: ...

    @property
    def started_at(self) -> float: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def leaving(self) -> bool: ...

    @property
    def config(self) -> Config: ...

    @property
    def catalog(self) -> Catalog | None:
        """The job catalog (None: started without one)."""
        ...

    @property
    def last_sample(self) -> ResourceSample | None:
        """This node's newest resource sample (None before the first)."""
        ...

    def now(self) -> float: ...

    def members(self, *, live: bool = False) -> list[Member]:
        """Every member held, this node included (see :meth:`p2pnode.node.NodeContext.members`)."""
        ...

    def publish_soon(self) -> None:
        """A section changed (an operator intent): publish a new snapshot version soon."""
        ...

    def role_cert_view(self) -> dict[str, Any]:
        """``/status`` ``node.roles``: this node's certificate and the roles that count (:mod:`p2pnode.certs`)."""
        ...

    def change_voter(self, node_id: str, *, admit: bool) -> bool:
        """``POST /voters``: admit or remove ``node_id`` on this node's voter roll; True when the roll changed."""
        ...

    def push_catalog(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /catalog``: adopt a signed catalog; the HTTP status and the answer."""
        ...

    def signed_catalog(self) -> bytes | None:
        """``GET /catalog/signed``: the signed catalog held (JSON), or None."""
        ...

    @property
    def catalog_push(self) -> Any:
        """Pushed catalogs on this node (:class:`p2pnode.jobs.CatalogPush`: ``view()`` for ``/status``)."""
        ...

    def change_eligibility(self, node_id: str, state: str) -> bool:
        """``POST /voters``: mark ``node_id`` ``eligible``, ``ineligible`` or ``cleared`` on this node's voter roll;
        True when the roll changed."""
        ...


class VersionCounter(Protocol):
    @property
    def value(self) -> int:
        """The newest snapshot version reserved."""
        ...


class PublicationCounts(Protocol):
    """What sealing did to this node's own snapshots (:class:`p2pnode.node._publish.PublishStats`)."""

    @property
    def plans_omitted(self) -> int: ...

    @property
    def unpublishable(self) -> int: ...

    @property
    def max_published_bytes(self) -> int: ...

    @property
    def sections_left_out(self) -> Mapping[str, int]: ...


class ListenerCounts(Protocol):
    """Connections and requests the HTTP listener ended itself (``drivers._listener.ListenerStats``)."""

    def as_dict(self) -> dict[str, int]:
        """``{reason: count}``."""
        ...


class NodeStats(msgspec.Struct, frozen=True, kw_only=True):
    """This node's counters that belong to no subsystem: the snapshot version, publication, state files read
    back at start (entries dropped, by file and reason) and the HTTP listener."""

    versions: VersionCounter
    publication: PublicationCounts
    state_files: StateFileReport
    listener: ListenerCounts


class HttpCounters(msgspec.Struct):
    """What the HTTP layer counts itself. ``clients_gone``: replies dropped because the client had hung up;
    ``not_modified``: 304 answers to a view's ``If-None-Match``; ``if_none_match_ignored``: malformed ones
    (answered in full); ``queries_refused``: view queries refused (400), by reason."""

    clients_gone: int = 0
    not_modified: int = 0
    if_none_match_ignored: int = 0
    queries_refused: dict[str, int] = msgspec.field(default_factory=dict)

    def client_gone(self) -> None:
        """Count one reply to a client that had hung up."""
        self.clients_gone += 1


# -- trust, guard, gossip ------------------------------------------------------------------------------------------
class TrustSurface(Protocol):
    """Request authentication (``x-p2pnode-auth``, :mod:`p2pnode.reqauth`) as the routes use it
    (``drivers.Trust``). Each check returns None when accepted, else the refusal reason (counted there)."""

    read_refusals: int
    """Reads refused where ``agent.read_token`` protects them (incremented by the read guard)."""

    @property
    def request_auth(self) -> RequestVerifier:
        """The verifier's counters: ``refused`` by reason, ``unbound`` accepted."""
        ...

    def authenticate(self, header: str | None, method: str, target: str, body: bytes, *,
                     operator: bool = False) -> str | None: ...

    def authenticate_read(self, header: str | None, method: str, target: str, *,
                          member_may: Callable[[str], bool] = ...) -> str | None: ...

    def view(self) -> dict[str, Any]:
        """The trust part of ``/status``."""
        ...


class RecentEvents(Protocol):
    def recent(self, n: int | None = None) -> Sequence[WireEvent]:
        """The newest ``n`` events (all when None), oldest first."""
        ...


class WireEvent(Protocol):
    def to_wire(self) -> dict[str, Any]: ...


class EventMonitor(Protocol):
    @property
    def log(self) -> RecentEvents: ...


class LevelTracker(Protocol):
    @property
    def changes(self) -> int:
        """Changes of the degradation level since start."""
        ...


class GuardSurface(Protocol):
    """The guard driver as ``GET /guard``, the views and the metrics read it (``drivers.GuardDriver``)."""

    @property
    def level(self) -> int:
        """Degradation level 0-4 (with hysteresis)."""
        ...

    @property
    def tracker(self) -> LevelTracker: ...

    @property
    def monitor(self) -> EventMonitor: ...

    @property
    def event_counts(self) -> Mapping[str, int]:
        """Events emitted since start, by name."""
        ...

    @property
    def assessment(self) -> Assessment | None:
        """The newest assessment (CPU and memory over their windows: its ``signals``)."""
        ...

    @property
    def sample(self) -> ResourceSample | None:
        """The newest sample assessed (raw figures, PSI)."""
        ...

    @property
    def psi_rejected(self) -> Mapping[str, int]:
        """PSI files the sampler rejected, by reason."""
        ...

    def view(self) -> dict[str, Any]:
        """``GET /guard``: level, assessment, admission per kind, last cleanup, hooks."""
        ...


class GossipInbound(Protocol):
    """The gossip driver as ``POST /gossip`` uses it (:func:`p2pnode.http.serve_gossip`)."""

    busy: int
    """Requests refused with 503 because every slot was taken (incremented by the route)."""

    @property
    def slots(self) -> trio.Semaphore:
        """One per gossip request served at once (``gossip.max_concurrent_requests``)."""
        ...

    def admit(self, host: str, declared_bytes: int | None) -> bool:
        """Whether ``host`` may send a body of ``declared_bytes`` now (False: 429 before reading it)."""
        ...

    async def handle(self, body: bytes) -> GossipReply:
        """Decode, verify and install a request body; the reply to send."""
        ...

    def charge_reply(self, host: str, nbytes: int) -> None:
        """Count a reply of ``nbytes`` against ``host``'s byte bucket."""
        ...


class RefusalCount(Protocol):
    @property
    def refused(self) -> int: ...


class MdnsView(Protocol):
    @property
    def interfaces(self) -> list[str]: ...

    @property
    def found(self) -> int: ...


class ProbeSurface(Protocol):
    """The SWIM probe driver (``drivers._gossip_probe.ProbeDriver``, with ``gossip.probes`` on): ``POST /probe``
    and what the metrics show (the prober's counters and local health, the codec's refusals by reason)."""

    @property
    def prober(self) -> Prober: ...

    @property
    def codec(self) -> ProbeCodec: ...

    def handle_stream(self, body: bytes, source_host: str) -> bytes | None: ...


class GossipSurface(GossipInbound, Protocol):
    """The gossip driver (``drivers.GossipDriver``): inbound admission, and what ``/status`` and the metrics show."""

    @property
    def rounds(self) -> int: ...

    @property
    def bytes_sent(self) -> int: ...

    @property
    def bytes_received(self) -> int: ...

    @property
    def inbound_bytes(self) -> RefusalCount:
        """The per-host byte buckets (``refused``: requests refused with 429)."""
        ...

    @property
    def mdns(self) -> MdnsView | None: ...

    @property
    def mdns_error(self) -> str | None: ...

    def view(self) -> dict[str, Any]:
        """The ``gossip`` part of ``/status`` the driver owns."""
        ...

    def addr_refusal(self, addr: str) -> str | None:
        """Why this node's dial policy refuses a member's advertised ``addr`` (:func:`p2pnode.gossip.addr_refusal`),
        or None."""
        ...

    def addr_refused(self) -> dict[str, int]:
        """Distinct advertised addresses refused so far, by reason (``p2pnode_addr_refused_total``)."""
        ...


# -- sync -------------------------------------------------------------------------------------------------------------
class ManifestView(Protocol):
    """A file's manifest: ``size`` bytes in blocks of ``block_size``; ``hashes`` 32 bytes per block, ``root`` 32."""

    @property
    def size(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def root(self) -> bytes: ...

    @property
    def hashes(self) -> bytes: ...


class SyncedFile(Protocol):
    @property
    def path(self) -> str: ...

    @property
    def cls(self) -> str: ...

    @property
    def seq(self) -> int: ...

    @property
    def manifest(self) -> ManifestView: ...


class SyncSource(Protocol):
    @property
    def files(self) -> Mapping[str, SyncedFile]:
        """This node's synced files by path."""
        ...


class ReplicaStoreView(Protocol):
    @property
    def bytes_received(self) -> int: ...

    @property
    def index(self) -> Sized:
        """The replicas held (one entry per origin and path)."""
        ...

    def receipts_for(self, origin: str) -> list[list[Any]]:
        """``[[path, size, root], ...]``: every replica held for ``origin`` (blocking: run in a thread)."""
        ...

    def held_bytes(self) -> int: ...


class StreamCount(Protocol):
    @property
    def streams(self) -> int: ...


class SyncSurface(Protocol):
    """The sync service as the ``/sync/*`` routes and the metrics use it (``sync.SyncService``)."""

    @property
    def pushes(self) -> bool:
        """This node pushes its data (tagged ephemeral)."""
        ...

    @property
    def source(self) -> SyncSource | None:
        """This node's files (None: it does not push)."""
        ...

    def checkpoint_bytes(self, digest: bytes) -> bytes | None:
        """The signed checkpoint ``digest`` this node holds (msgpack), or None (issue 41)."""
        ...

    def checkpoint_file(self, digest: bytes, index: int) -> tuple[Path, str, int, int] | None:
        """Where file ``index`` of checkpoint ``digest`` is read here: ``(base, rel, size, block_size)``, the trusted
        directory, the path beneath it (opened without following symlinks), its signed size and block size; or None
        (issue 41)."""
        ...

    def checkpoint_hashes(self, digest: bytes, index: int) -> bytes | None:
        """The block hashes of file ``index`` of checkpoint ``digest`` as this node's replica index kept them, when
        they bind to its signed root; None: hash the file (blocking; issue 41)."""
        ...

    def archived_log(self, job_id: str) -> tuple[str, Path] | None:
        """``(origin, file)`` of another node's archived log of job ``job_id`` among the replicas here, or None
        (issue 41)."""
        ...

    async def archived_runs(self, n: int) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """The ``n`` newest replicated job records here, and those left out by reason (issue 41)."""
        ...

    @property
    def store(self) -> ReplicaStoreView | None:
        """The replicas kept for others (None: not durable)."""
        ...

    @property
    def channel(self) -> StreamCount | None:
        """The data channel's server (None while it is off)."""
        ...

    @property
    def bytes_sent(self) -> int: ...

    @property
    def blocks_resent(self) -> int: ...

    @property
    def streams_sent(self) -> int: ...

    @property
    def channel_fallbacks(self) -> int: ...

    @property
    def backpressure_backoff_s(self) -> float:
        """Seconds a sender waits after a 507 (its ``retry-after``)."""
        ...

    async def serve_distribution(self, path: str, headers: Any, body: bytes) -> tuple[int, bytes | BlockStream]:
        """``POST /sync/dist/publication|blocks`` from a member: (status, body; blocks as a stream the route closes
        once the reply ended)."""
        ...

    async def publish_file(self, body: bytes) -> tuple[int, dict[str, Any]]:
        """``POST /sync/publish``: (status, JSON answer)."""
        ...

    def status_view(self) -> dict[str, Any]:
        """``GET /sync/status``."""
        ...

    def trigger(self) -> None:
        """Run a sync pass now."""
        ...

    def count_rejection(self, reason: str) -> None: ...

    def rejected_total(self) -> Mapping[str, int]: ...

    async def receive_push(self, headers: Mapping[str, str], content_length: str | None,
                           chunks: AsyncIterable[bytes]) -> tuple[int, bytes]:
        """``POST /sync/push``: (HTTP status, msgpack reply)."""
        ...

    async def receive_wal(self, headers: Mapping[str, str], content_length: str | None,
                          chunks: AsyncIterable[bytes]) -> tuple[int, bytes]:
        """``POST /sync/wal``: (HTTP status, msgpack answer)."""
        ...

    async def answer_challenge(self, headers: Mapping[str, str], body: bytes) -> tuple[int, bytes]:
        """``POST /sync/challenge``: (HTTP status, msgpack answer)."""
        ...


# -- jobs -----------------------------------------------------------------------------------------------------------
class PlanSurface(Protocol):
    """Plans as this node serves and reads them: the leader's own, and an elected leader's fetched and checked."""

    async def whole_plan(self, wait_s: float) -> PlanSection | None:
        """The newest plan of an elected leader, whole, waiting at most ``wait_s`` seconds for a fetch."""
        ...

    def whole_plan_bytes(self, digest: str | None) -> bytes | None:
        """This leader's plan ``digest`` (else its newest) as msgpack; None while it leads no plan."""
        ...

    def newest_plan(self) -> PlanRef | None:
        """The ref of the newest plan of an elected leader this node knows."""
        ...

    async def plan_inputs_json(self, p: PlanSection) -> msgspec.Raw | None:
        """The facts this leader computed plan ``p`` from (:mod:`p2pnode.node._planinputs`), as JSON, built once
        per plan off the event loop; None when it does not serve ``p``."""
        ...

    def signed_part(self, node_id: str, digest: str | None) -> bytes | None:
        """``node_id``'s part of this leader's plan, signed; None while it leads no plan."""
        ...


class OperatorSurface(Protocol):
    """The operator's intents on this node (cordon, drain, one-off runs), job stops and logs."""

    def operator_view(self) -> dict[str, Any]:
        """The intents, as ``/status`` and the operator routes show them."""
        ...

    def cordon(self, on: bool) -> OperatorSection: ...

    def drain(self, deadline_s: float, now_wall: float) -> OperatorSection: ...

    def template(self, name: str) -> JobTemplate | None:
        """The catalog's template ``name`` (None: not in the catalog)."""
        ...

    def add_run(self, template: str, params: dict[str, Any], node: str, tag: str, requested_by: str,
                now_wall: float) -> RunRequest:
        """Keep a one-off run (raises :class:`p2pnode.node._operator.InvalidIntent`, ``ValueError`` when full)."""
        ...

    def stop_job(self, job_id: str) -> bool:
        """Stop ``job_id`` if it runs here, or withdraw the one-off request ``job_id`` kept here; False when
        neither."""
        ...

    def log_path(self, job_id: str) -> Path: ...

    def history(self, n: int) -> list[dict[str, Any]]:
        """The newest ``n`` runs here."""
        ...

    def archive_view(self) -> dict[str, Any] | None:
        """This node's archive of ended jobs (issue 41; None: it keeps none)."""
        ...

    def run_record(self, run_id: str) -> RunRecord | None:
        """The outcome record of one-off run ``run_id`` requested through this node (None: unknown here)."""
        ...


class BreakerView(Protocol):
    @property
    def state(self) -> str: ...

    @property
    def consecutive_failures(self) -> int: ...

    @property
    def trips(self) -> int: ...


class JobsSurface(PlanSurface, OperatorSurface, Protocol):
    """Job control as the routes, views and metrics use it (``jobs.JobControlSurface``)."""

    @property
    def offer(self) -> int:
        """GPU jobs this node asks for now (PID offer)."""
        ...

    @property
    def cpu_offer(self) -> int:
        """CPU-only jobs this node asks for now (free CPUs and memory)."""
        ...

    @property
    def running_count(self) -> int: ...

    @property
    def finished(self) -> int:
        """Jobs that ended here since start."""
        ...

    @property
    def refused_count(self) -> int:
        """Recent assignments this node refused."""
        ...

    @property
    def gang_ends(self) -> dict[str, int]:
        """Gangs this node ended while it led, by cause."""
        ...

    @property
    def gang_table(self) -> dict[str, Any]:
        """This node's gang table as the leader keeps it (:mod:`p2pnode.node._gangs`): its sizes and counters."""
        ...

    @property
    def transition_errors(self) -> dict[tuple[str, str], int]:
        """The job table's transition errors since start, ``(state, event)`` -> count."""
        ...

    @property
    def recent_transition_errors(self) -> list[dict[str, Any]]:
        """The job table's newest transition errors: ``job_id``, ``state``, ``event``, ``at``."""
        ...

    @property
    def suspicious_claims(self) -> list[dict[str, Any]]:
        """Members' claims this node ignored while it led (the plan did not back them), with counts."""
        ...

    @property
    def claims_ignored(self) -> dict[str, int]:
        """Members' claims this node ignored while it led, by reason."""
        ...

    def scaling_view(self) -> dict[str, Any]:
        """This node's scaling driver: provider loaded or why not, calls and failures by operation."""
        ...

    @property
    def scaling_outcomes(self) -> dict[tuple[str, str, str], int]:
        """Scaling actions this node's leadership counted, ``(node_class, op, outcome)`` -> count."""
        ...

    @property
    def provider_failures(self) -> dict[tuple[str, str], int]:
        """Provider calls that failed here, ``(provider, operation)`` -> count."""
        ...

    @property
    def scaling_claims_refused(self) -> dict[str, int]:
        """Members' claims that counted toward no scaling class while this node led, by reason."""
        ...

    def scaling_refused_claims(self) -> list[dict[str, Any]]:
        """The members whose claims counted toward no scaling class while this node led (bounded)."""
        ...

    @property
    def scaling_verdicts(self) -> list[tuple[str, int]]:
        """While this node leads: ``(node_class, +k up | -k down | 0 hold)`` per class; else empty."""
        ...

    @property
    def signals_rejected(self) -> int: ...

    @property
    def spawns_rate_limited(self) -> int: ...

    @property
    def fetching_checkpoints(self) -> list[dict[str, Any]]:
        """Jobs fetching their config's newest checkpoint before they start, with the bytes done and in all."""
        ...

    def goodput(self) -> dict[str, Any]:
        """Per config, the goodput of the trainings this node ran (:class:`p2pnode.node._goodput.ConfigGoodput`,
        at now)."""
        ...

    @property
    def waiting(self) -> list[dict[str, str]]:
        """Assignments held back here by the spawn-rate limit, with the reason and when the next may start."""
        ...

    @property
    def pending_count(self) -> int | None:
        """GPU templates waiting for capacity in this node's newest plan while it leads (None: it does not)."""
        ...

    @property
    def band_min_percent(self) -> float:
        """The lower edge of this node's GPU utilization band, percent."""
        ...

    @property
    def job_stops(self) -> Mapping[str, int]:
        """Stops the node's own stop rules asked since start, by rule (``operator``, ``memory_limit``, ...)."""
        ...

    @property
    def checkpoint_warnings(self) -> Mapping[str, int]:
        """Stops held for a checkpoint since start, by how each ended (``signalled``, ``confirmed``, ``local``,
        ``deadline``)."""
        ...

    @property
    def interruption_probes(self) -> Mapping[str, int]:
        """Runs of the interruption probe since start, by outcome (``ok``, ``notice``, ``failed``, ``timeout``,
        ``too_long``, ``malformed``; empty: no probe)."""
        ...

    # -- fleet metrics (p2pnode.http._metrics: queue, jobs ended, Elo velocity) ----------------------------------------
    @property
    def led_plan(self) -> PlanSection | None:
        """This node's newest plan while it leads (None: it does not lead, or has not planned yet)."""
        ...

    @property
    def jobs_ended_by_kind(self) -> dict[tuple[str, str], int]:
        """Jobs that ended here on their own since start, ``(kind, outcome)`` -> count; outcome ``completed``
        (exit status 0) or ``failed``; stopped jobs are neither."""
        ...

    def newest_signals(self) -> Mapping[str, Signals]:
        """The newest signal per config across every member's snapshot (Lamport order)."""
        ...

    @property
    def breaker(self) -> BreakerView: ...

    def running_reports(self) -> list[JobReport]:
        """Every job running here."""
        ...

    def fetched_running(self, origin: str) -> list[JobReport] | None:
        """``origin``'s running list as last fetched (None: never fetched)."""
        ...

    def running_msgpack(self, digest: str = "") -> bytes:
        """This node's running list, msgpack (``GET /jobs/running``): the one of ``digest`` while it is kept (the
        lists of its last few snapshots), else the current one."""
        ...

    def usage_msgpack(self, digest: str = "") -> bytes:
        """This node's run-history summary, msgpack (``GET /jobs/usage``): the one of ``digest`` while it is kept,
        else the newest."""
        ...

    def predictions(self, template: str) -> dict[str, Any]:
        """The predictor's table as this node holds it (``template`` only, unless ""): ``predictions``,
        ``outliers``, ``min_runs``, ``nodes`` (whose summaries it holds)."""
        ...

    def history(self, n: int) -> list[dict[str, Any]]:
        """The newest ``n`` runs here."""
        ...

    def lease_view(self) -> dict[str, Any] | None:
        """This node's lease on its fenced work (None: none kept)."""
        ...

    def fetches_view(self) -> dict[str, Any]: ...

    def accept_signals(self, raw: list[dict[str, Any]]) -> list[Signals]:
        """``POST /signals`` (``raw``: the signals of :func:`p2pnode.scheduler.decode_signal_body`); raises
        :class:`p2pnode.scheduler.SignalError`."""
        ...


# -- the bundle ---------------------------------------------------------------------------------------------------
class HttpSurfaces(msgspec.Struct, frozen=True, kw_only=True):
    """Every surface the HTTP layer gets (see the module docstring); built once by the agent."""

    node: NodeSurface
    core: NodeCore
    cluster: ClusterState
    gossiper: Gossiper
    trust: TrustSurface
    guard: GuardSurface
    gossip: GossipSurface
    sync: SyncSurface
    jobs: JobsSurface | None
    stats: NodeStats
    series: ClusterSeries | None = None
    probes: ProbeSurface | None = None
    """SWIM probes (``gossip.probes``), or None when they are off."""
    counters: HttpCounters = msgspec.field(default_factory=HttpCounters)
