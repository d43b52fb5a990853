"""Configuration: frozen dataclasses filled from defaults < TOML file < ``P2PNODE_*`` env < command-line flags.

The TOML file has one table per section::

    [agent]
    port = 8770
    join = ["10.0.0.5:8770"]
    tags = ["durable", "voter"]
    fake_gpus = "H100,RTX 4090"

    [gossip]
    profile = "lan"          # lan | wan | local-test: failure-detection timings
    fanout = 3

    [election]
    min_voters = 3

    [discovery]
    mdns = true
    mdns_interfaces = ["192.168.1.10"]

Every field has an environment variable: ``P2PNODE_<FIELD>`` for ``[agent]`` fields, ``P2PNODE_GOSSIP_<FIELD>``
for ``[gossip]``, ``P2PNODE_ELECTION_<FIELD>`` for ``[election]``, ``P2PNODE_SCHEDULER_<FIELD>`` and
``P2PNODE_SYNC_<FIELD>`` likewise; ``[discovery]`` and ``[guard]`` fields name their variables (``P2PNODE_MDNS``,
``P2PNODE_MDNS_INTERFACES``, ``P2PNODE_MAX_DISK_PERCENT``, ``P2PNODE_TARGET_UTIL_MIN``, ...).
List values in env are comma-separated; booleans accept 1/0, true/false, yes/no, on/off.
``p2pnode config show`` prints the effective configuration. Unknown keys and bad values raise
:class:`p2pnode.errors.ConfigError` naming the file, variable or flag.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
import platformdirs

from .errors import ConfigError
from .gossip import PROFILES, MembershipConfig, ProbeConfig
from .guardcore import GuardLimits, validate_limits

__all__ = [
    "AgentConfig", "CatalogSettings", "Config", "DiscoveryConfig", "ElectionConfig", "GossipConfig",
    "ScalingClass", "ScalingSettings", "SchedulerSettings", "SyncConfig",
    "ProviderNat", "default_data_dir", "env_var", "load_config", "provider_nat",
]

DEFAULT_PORT = 8770


def default_data_dir() -> Path:
    """``$P2PNODE_DATA_DIR`` if set, else the user's data directory (``~/.local/share/p2pnode`` on Linux)."""
    env = os.environ.get("P2PNODE_DATA_DIR")
    return Path(env) if env else Path(platformdirs.user_data_dir("p2pnode", appauthor=False))


def _env(name: str) -> dict[str, str]:
    return {"env": name}


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """``[agent]``: identity, addresses and local behaviour."""

    data_dir: Path = field(default_factory=default_data_dir)
    """Key, counters, peers file and (later) data live here. Default: see :func:`default_data_dir`."""
    bind: str = "0.0.0.0"
    """Address the HTTP server listens on."""
    port: int = DEFAULT_PORT
    """TCP port of the HTTP server (gossip, status, metrics); 0 picks a free port."""
    advertise: str = ""
    """``host`` or ``host:port`` that peers should use to reach this node. Empty: the bind address, or, when
    binding all interfaces, this host's first non-loopback IPv4 address."""
    join: tuple[str, ...] = ()
    """``host:port`` addresses contacted at start (and retried with backoff) to join a cluster."""
    name: str = ""
    """The name operators know this node by, shown beside its id (``/members``, ``p2pnode status``, the dashboard;
    commands take ids). Empty: the hostname. Either is published without control, bidirectional or zero-width
    characters and cut to 63 characters (:func:`p2pnode.label.sanitize_name`)."""
    tags: tuple[str, ...] = ()
    """Free-form tags carried in the snapshot (``durable``, ``ephemeral``, ``voter``, ``provider=...``)."""
    operator_keys: tuple[str, ...] = ()
    """Operator public keys (``ed25519:<base64>``, printed by ``p2pnode catalog keygen``) that grant roles
    (:mod:`p2pnode.certs`): with at least one pinned, a member's ``voter`` and ``durable`` tags and its eligibility
    to lead count here only when a certificate signed by one of them grants them (``p2pnode node certify``; this
    node's own in ``role.cert`` in its data dir, reloaded when it changes). Empty (default): tags count as
    claimed, so any member that signs a snapshot may claim any role (trust the network, or use token mode)."""
    fake_gpus: str = ""
    """Simulated GPU profiles, e.g. ``"H100,RTX 4090"`` or ``"2xA100"``, for machines without NVML."""
    fake_gpu_load: tuple[str, ...] = ()
    """Load held on simulated GPUs whatever runs there, ``INDEX=UTIL[/MEM]`` in percent (``"0=100"``: GPU 0 at
    100 % utilization; ``"0=100/90"``: and 90 % of its memory used), added to the load of the jobs placed on it:
    a busy GPU shown end to end without a job (tests, demos)."""
    resources: tuple[str, ...] = ()
    """Resources this node declares, ``NAME=AMOUNT`` (``--resource nvlink=1``, or a ``[agent.resources]`` table:
    ``nvlink = 1``), like Ray's ``--resources``: custom resources jobs request with ``resources.custom``; ``cpus``
    and ``memory_gib`` override the CPUs and memory (GiB) the node gives to jobs (default: its CPU count, and its
    memory times ``guard.memory_max_percent``). Counted at placement and at the node's own admission."""
    trust: str = "open"
    """``open`` (any well-signed snapshot is accepted) or ``token`` (keys must be endorsed by cluster_token)."""
    cluster_token: str = field(default="", metadata=_env("P2PNODE_CLUSTER_TOKEN"))
    """Shared cluster secret for ``token`` trust mode, installed into the data dir's keyring at the first start
    (``keyring.json``; from then on the keyring is what counts: rotate with ``p2pnode keys``). Prefer the
    environment variable to the file."""
    read_token: str = field(default="", metadata=_env("P2PNODE_READ_TOKEN"))
    """Empty (default): the read-only views (``/status``, ``/metrics``, ...) are open. Set: every view but
    ``/healthz`` needs ``Authorization: Bearer <read_token>`` (e.g. Prometheus' ``authorization`` setting) or a
    request signed for this node with a cluster token (the p2pnode CLI; open mode: this node's or a voter's key; a
    member's key only for its own plan part and running lists). It grants reads only: never the cluster token."""
    accept_unbound_requests: bool = False
    """False (default): a signed request (``x-p2pnode-auth``) must name this node as its receiver (schemes ``v2``,
    ``k2``), so a request captured on its way to one node is refused by every other (``wrong_receiver``). True:
    also accept the unbound ``v1``/``k1`` that agents and CLIs before receiver binding send, each one logged and
    counted (``/status`` ``node.request_auth.unbound_accepted``), and sign this node's own peer reads unbound
    (which agents not yet upgraded accept); for a rolling upgrade only, then turn it off.
    Env ``P2PNODE_ACCEPT_UNBOUND_REQUESTS``."""
    allow_private_advertise: bool = False
    """False (default): a member's advertised address (``addr``, and the host of its data channel) is dialed only
    when it is an IP literal that is not loopback, link-local, multicast, unspecified, reserved or a cloud metadata
    address (:mod:`p2pnode.gossip._dialpolicy`); refused ones are counted (``addr_refused``) and never dialed. True:
    loopback addresses are allowed too, for a lab cluster on one host (tests, ``p2pnode demo``); names and metadata
    addresses stay refused. Private ranges (10/8, 192.168/16, fc00::/7, 100.64/10) are always allowed. Addresses
    the operator gives (``join``, a peers file the operator wrote) are never judged. Env
    ``P2PNODE_ALLOW_PRIVATE_ADVERTISE``."""
    catalog: str = ""
    """Path of the job catalog (TOML, the same file on every node). Its digest travels in the snapshot and a
    member with another digest is flagged in ``/status``. Empty: no catalog."""
    sample_interval_s: float = 1.0
    """Seconds between resource samples; each sample publishes a new snapshot version."""
    log_level: str = "info"
    """``debug``, ``info``, ``warning`` or ``error``."""
    started_by: str = field(default="", metadata=_env("P2PNODE_SCALING_STARTED_BY"))
    """The idempotency id of the scaling action that started this node (a provider sets it, env
    ``P2PNODE_SCALING_STARTED_BY``): published in the snapshot (``scaling.started_by``) so the leader counts the
    node as that action's and may remove it when idle. Empty: started by the operator, never scaled down."""
    interruption_probe: str = ""
    """A command (argv split shell-like, run without a shell) that asks the platform whether this machine is about
    to be taken back (a spot interruption, a preemption) and prints one JSON object, ``{"notice": false}`` or
    ``{"notice": true, "deadline_s": 120, "reason": "spot"}`` (:mod:`p2pnode.node._notice`). Run every
    ``interruption_probe_interval_s`` with the scaling commands' environment (no ``P2PNODE_*`` variable); a notice
    is published, stops this node's fenced jobs with a checkpoint warning up to its deadline, and the leader
    places nothing more here. Local config only: never taken from a pushed catalog. Empty (default): no probe."""
    interruption_probe_interval_s: float = 5.0
    """Seconds between the starts of two runs of ``interruption_probe`` (0.1-3600)."""
    interruption_probe_timeout_s: float = 2.0
    """Seconds one run of ``interruption_probe`` may take; then it is killed with its process group and counted
    ``timeout`` (0.1-600; runs never overlap: a long run delays the next)."""


@dataclass(frozen=True, kw_only=True)
class GossipConfig:
    """``[gossip]``: anti-entropy push-pull. Shorter intervals and larger fanout converge faster and cost more
    requests (each round is up to ``2 × fanout`` HTTP requests from this node; ``2 × idle_fanout`` in a quiet
    round)."""

    profile: str = "lan"
    """Failure-detection profile: ``lan``, ``wan`` or ``local-test`` (see ``p2pnode.gossip.PROFILES``). The keys
    below left unset take the profile's value."""
    interval_s: float | None = None
    """Seconds between gossip rounds (profile: lan 1.0, wan 2.0, local-test 0.5)."""
    suspicion_mult: float | None = None
    """Scales suspect and dead timeouts with log10(N) (memberlist SuspicionMult; lan 4, wan 6, local-test 3)."""
    suspicion_max_timeout_mult: float | None = None
    """Unconfirmed suspicion lasts this many times the minimum (memberlist SuspicionMaxTimeoutMult; 6)."""
    expected_confirmations: int | None = None
    """Lifeguard's K: confirmations that shorten the suspicion timer to its minimum (3)."""
    min_publish_interval_s: float | None = None
    """Shortest heartbeat (snapshot republish) interval, seconds (lan 1.0)."""
    target_verifications_per_s: float | None = None
    """Heartbeats slow down as N grows so each node verifies about this many snapshots per second (100)."""
    reconnect_window_s: float | None = None
    """Dead members are kept and dialled for this long before they are reaped (86400 = 24 h)."""
    left_retention_s: float | None = None
    """Members that left cleanly stay listed this long (3600)."""
    fanout: int = 3
    """Peers contacted per round while anything moves (news, a suspect member, a member not heard lately)."""
    idle_fanout: int = 1
    """Peers contacted per round while the cluster is quiet in this node's view (``p2pnode.gossip.quiet_round``:
    no news and no failed contact for a few rounds, no member suspect, every member heard within half its silence
    timeout); at most ``fanout`` (equal: every round ``fanout`` wide, as before)."""
    request_timeout_s: float = 2.0
    """Timeout of one gossip HTTP request, seconds."""
    max_body_bytes: int = 1024 * 1024
    """Bound of one gossip message, bytes; larger inbound bodies are rejected with 413."""
    max_snapshot_bytes: int = 64 * 1024
    """Bound of one snapshot body, bytes."""
    base_backoff_s: float = 1.0
    """Retry delay after the first failed contact with an address; doubles per failure."""
    max_backoff_s: float = 30.0
    """Cap of the retry delay, seconds."""
    leave_timeout_s: float = 1.0
    """Time spent telling peers we leave on shutdown, seconds."""
    max_members: int = 1024
    """Most members (this node included) held in the cluster view; snapshots of further new origins are
    rejected (``member_cap``) before their signature is checked. Bounds memory and ``/status`` in open mode."""
    max_verifications_per_message: int = 256
    """Most Ed25519 signature checks one inbound gossip message may cost (about 50 ms of one core); the rest
    of its envelopes are rejected as ``over_budget`` and arrive again by anti-entropy."""
    max_concurrent_requests: int = 32
    """Inbound ``POST /gossip`` requests handled at once; beyond, 503 before the body is read."""
    max_inbound_bytes_per_s: int = 4 * 1024 * 1024
    """Gossip bytes one remote host may send and draw (its requests and our replies) per second (token bucket,
    burst twice ``max_body_bytes``); beyond, 429 before the body is read. Honest peers need a few KiB per second."""
    max_verifications_per_s: float = 1000.0
    """Signature checks per second for all inbound gossip together (about 20 % of one core); beyond, envelopes
    are ``over_budget`` and come again by anti-entropy. Honest load is ``target_verifications_per_s`` (100)."""
    probes: bool = False
    """SWIM probes (:mod:`p2pnode.gossip._probe`): each ``probe_interval_s`` ping one member over UDP on the
    gossip port (through ``indirect_checks`` relays and ``POST /probe`` when it does not answer), so a silent member
    is suspected after a failed probe instead of a heartbeat silence. Off by default for now."""
    probe_interval_s: float = 1.0
    """Seconds between probes (one member per interval; memberlist ProbeInterval). Shorter: faster detection,
    more packets."""
    probe_timeout_s: float = 0.5
    """Seconds to wait for a direct ack before asking relays (memberlist ProbeTimeout); above the round trip,
    below ``probe_interval_s``."""
    indirect_checks: int = 3
    """Relays asked to ping a member that did not answer (memberlist IndirectChecks); more: fewer false
    suspicions from one lossy path."""
    awareness_max_multiplier: int = 8
    """Lifeguard's local health may stretch the probe interval up to this many times (memberlist
    AwarenessMaxMultiplier)."""
    push_pull_interval_s: float = 0.0
    """Seconds between full push-pull exchanges (memberlist PushPullInterval; 30 is its default), scaled by
    ``ceil(log2 N − 5) + 1`` above 32 members; between them gossip messages carry only the digest entries that
    changed lately (partial digests: :mod:`p2pnode.gossip._protocol`), so a message does not grow with N. 0 (the
    default for now): every message carries the whole digest. Opt-in: partial rounds leave some versions to the
    full push-pull, and a member whose heartbeats miss an observer for ``suspect_after_s`` is suspected (probes
    or not; docs/benchmarks.md)."""


@dataclass(frozen=True, kw_only=True)
class ElectionConfig:
    """``[election]``: leader election by GPU power (voters are the members tagged ``voter``, or all members
    where none is tagged)."""

    min_voters: int = 1
    """Floor on the voter set's size for the quorum; set it to the planned number of voters in production so a
    node that starts alone cannot elect itself."""
    voter_bootstrap_s: float = 120.0
    """Open mode: members tagged ``voter`` seen within this many seconds of a node's first start join its voter
    roll; later ones wait for the operator (``p2pnode node admit ID``). Token mode admits every tagged member."""
    leader_settle_s: float = 120.0
    """A member that joined or came back (restart, refutation, return from dead) less than this many seconds ago
    is not voted for while the leader or a settled member is there: a flaky strong node does not take leadership
    each time it returns. When no member is settled (a cluster that just started) it delays nothing. 0: off."""


@dataclass(frozen=True, kw_only=True)
class SchedulerSettings:
    """``[scheduler]``: running the catalog's jobs (needs ``agent.catalog``)."""

    interval_s: float = 5.0
    """Seconds between the leader's plans (and each node's capacity-offer update)."""
    signals_file: str = ""
    """A JSON file of signals (a list of signal objects) watched for changes; empty: none."""
    stop_grace_s: float = 10.0
    """SIGTERM, then SIGKILL after this many seconds."""
    adopt_grace_s: float = 15.0
    """A job this node started is not stopped for missing from the plan until it is this old (the leader has to
    hear of it first)."""
    log_max_bytes: int = 10 * 2**20
    """Per-template job log rotation size."""
    archive_log_bytes: int = 4 * 2**20
    """Bytes of an ended job's log (its last ones) a node that pushes (``ephemeral``) keeps under its sync root
    for durable replicas, beside its history record (issue 41; :mod:`p2pnode.jobs._archive`). 0: no archive."""
    archive_max_bytes: int = 256 * 2**20
    """Bytes the archive of ended jobs (logs and records) may take on this node: past it, the oldest ended jobs'
    files go first (0: no bound). Durable replicas are kept by sync's retention rules."""
    orphan_grace_s: float = 120.0
    """Jobs of a member declared dead stay in the plan (and count: no second training job of their config) this
    long, so a false death under load stops nothing; after it their work may be placed elsewhere."""
    lease_s: float = 30.0
    """Seconds this node's lease on its fenced work (trainings, templates marked ``exclusive``) lasts past the
    quorum of voters that last acked its own probes (issue 42, :mod:`p2pnode.node._lease`; needs
    ``gossip.probes``; 0: no lease, as before). Such jobs are asked to stop ``stop_grace_s`` (+ their checkpoint
    grace) before it runs out, and the leader places them elsewhere only after it plus a drift margin, instead of
    ``orphan_grace_s``. It must exceed ``stop_grace_s`` + ``lease_s / 4 + 3`` (the renewal slack,
    :func:`p2pnode.scheduler._leaselead.renewal_slack_s`), and a catalog whose fenced template's checkpoint grace
    does not fit in what is left is refused (docs/jobs.md#leases). 30 s: above a normal agent restart (a crash
    restarted by systemd within seconds keeps its jobs) and above a few lost probe rounds, yet a cut-off node's
    training ends within 30 s."""
    on_agent_stop: str = "stop"
    """What a clean stop of the agent does to this node's running jobs: ``"stop"`` (SIGTERM, ``stop_grace_s``,
    SIGKILL; history ``stopped: agent shutdown``) or ``"leave"`` (they keep running, recorded in the job ledger,
    and the next start re-adopts them: for agent upgrades). A crash (kill -9) always leaves them."""
    max_close_hold_s: float = 60.0
    """Seconds a clean stop of the agent holds its jobs' stops at most for a durable replica of their new checkpoint
    (each job's ``[job.checkpoint] grace_s`` first; 0-3600; issue 41). The agent exits at the latest this +
    ``stop_grace_s`` + 5 s + ``gossip.leave_timeout_s`` + 0.8 s after the signal: a service manager's stop timeout
    must exceed that (``deploy/p2pnode.service``: ``TimeoutStopSec=90`` covers the defaults, 60 + 10 + 5 + 1 + 0.8
    s); raise both together."""
    gang_ports: str = "29400-30399"
    """``FIRST-LAST``: the ports gang members' blocks are cut from, on every node (a gang's rendezvous, Ray's
    ports): open them between the machines that run gangs. The plan assigns each member a block of its own."""
    gang_port_block: int = 64
    """Ports per gang member's block (a torchrun member uses 1; a Ray member about 10 plus its workers')."""

    def gang_port_range(self) -> tuple[int, int]:
        """``gang_ports`` as ``(first, last)`` (validated at load)."""
        first, _, last = self.gang_ports.partition("-")
        return int(first), int(last)  # ASCII digits, checked by _validate


@dataclass(frozen=True, kw_only=True)
class DiscoveryConfig:
    """``[discovery]``: how peers are found besides ``join``."""

    mdns: bool = field(default=True, metadata=_env("P2PNODE_MDNS"))
    """Register and browse ``_p2pnode._tcp.local.`` with zeroconf."""
    mdns_interfaces: tuple[str, ...] = field(default=(), metadata=_env("P2PNODE_MDNS_INTERFACES"))
    """IPv4 addresses of the interfaces mDNS uses. Empty: the bind address, or every non-loopback IPv4
    address of this host when binding all interfaces."""
    peers_file: bool = field(default=True, metadata=_env("P2PNODE_PEERS_FILE"))
    """Remember peers that answered in ``<data_dir>/peers.json`` and contact them after a restart."""
    peers_file_interval_s: float = field(default=30.0, metadata=_env("P2PNODE_PEERS_FILE_INTERVAL_S"))
    """Seconds between checks of the peers file, rewritten when its set of peers changed (it is also written
    within 0.5 s of a new peer answering, and at shutdown)."""


@dataclass(frozen=True, kw_only=True)
class SyncConfig:
    """``[sync]``: data replication from ``ephemeral`` nodes to ``durable`` ones (roles come from ``agent.tags``)."""

    enabled: bool = True
    """Run sync at all (a node still needs the ``ephemeral`` or ``durable`` tag to push or keep replicas)."""
    root: str = ""
    """Folder whose files are synced (globs are relative to it). Empty: ``<data_dir>/data`` (where jobs write)."""
    globs: tuple[str, ...] = ("**/*.db", "**/*.sqlite", "**/*.npz", "**/*.pt", "**/*.pth", "**/*.ckpt",
                              "**/*.safetensors", "**/*.jsonl")
    """Files to sync, relative to ``root`` (``**/`` spans directories; hidden files are never synced)."""
    append_globs: tuple[str, ...] = ("**/*.jsonl",)
    """Files that only grow at the end (only their tail is re-hashed). SQLite files are recognised by header."""
    interval_s: float = 5.0
    """Seconds between sync passes (seed 003: every 5 s, even for a single new game)."""
    replication_factor: int = 2
    """R: durable replicas wanted per file (capped by the number of durable members)."""
    settle_s: float = 2.0
    """A sealed file (not SQLite, not append) is synced once unchanged for this many seconds."""
    data_port: int = 8771
    """TCP port of the data channel on durable nodes: the bulk of each transfer streams there with
    ``sendfile``/``splice`` instead of HTTP (advertised in the snapshot; 0: any free port; -1: off, blocks go
    over HTTP). A sender that cannot reach it falls back to HTTP. A taken port is logged and left off."""
    advertise_data_port: int = 0
    """The data channel's port as peers must dial it, when NAT maps it to another one (a marketplace container:
    its internal 8771 published as a random public port); 0: the provider's mapping where the agent finds one
    (:func:`provider_nat`), else the bound port. Advertised in the snapshot with the host of ``agent.advertise``."""
    request_bytes: int = 8 * 2**20
    """Block bytes per push request (a block itself may be up to 16 MiB)."""
    max_request_bytes: int = 40 * 2**20
    """Largest push body this node accepts (413 beyond it)."""
    max_bytes_per_s: int = 0
    """Bandwidth cap for pushes in bytes per second (0: none), so sync never starves gossip on thin links."""
    request_timeout_s: float = 60.0
    """Timeout of one push request."""
    backpressure_backoff_s: float = 30.0
    """A target that refused with backpressure (507) is skipped this long; the next durable member takes over."""
    max_clock_skew_s: float = 300.0
    """A signed push whose time is further than this from ours is refused (``bad_signature``)."""
    max_receipts: int = 256
    """Receipts (replicas confirmed) a durable node carries in its snapshot, newest first (and at most 24 KiB)."""
    partial_ttl_s: float = 7 * 86400.0
    """A durable node drops a partial transfer untouched this long (its origin still has the data)."""
    retention_cap_bytes: int = 0
    """Bytes of replicas a durable node holds at most (0: no cap). Past it, replicas that R other durable members
    confirm go, least needed and oldest first; when only copies are left, new data is refused (507) and an alert
    raised. Trade-off: a lower cap keeps disk for other uses but holds fewer extra copies."""
    retention_keep_versions: int = 16
    """Of the replicas whose file their origin no longer lists, each origin's this many newest (by the origin's
    sequence number) are kept whatever their age (0: none by count)."""
    retention_keep_days: float = 30.0
    """A replica whose file its origin no longer lists is kept this many days after this node first saw it
    unlisted (0: not by age). Past both keeps it is retired, unless no other durable member holds it."""
    retention_interval_s: float = 600.0
    """Seconds between retention passes on a durable node (one also runs when a commit passes the cap, and on
    ``POST /sync/trigger``). Each pass may fetch the listings of origins whose files changed."""
    wal_backup_interval_s: float = 600.0
    """A live SQLite database shipped by its write-ahead log (``POST /sync/wal``) to R durable targets that all hold
    its last segment gets its online-backup copy (the backup path, whose receipts alone allow deletion) only this
    often instead of every ``interval_s``; at once again when WAL shipping falls back (not in WAL mode, an unreadable
    log, a target refusing or unreachable, fewer than R current). 0: every interval. Trade-off: longer spends fewer
    bytes, but the ephemeral side may delete a database only as of its last copy."""
    challenge_interval_s: float = 3600.0
    """Seconds between proof-of-possession challenges of a holder that passed (a new receipt is checked a couple of
    seconds after it first counts; a failed holder is asked again after this long, and its failure is kept this
    long across new versions of the file and across its receipt withdrawn and republished)."""
    challenge_window_s: float = 600.0
    """The disk manager deletes a synced file only when R holders passed a challenge within this many seconds
    (those that did not are challenged first). Shorter: more challenges; longer: a lost replica found later."""
    challenge_timeout_s: float = 10.0
    """Seconds a holder has to answer a challenge (``timeout`` beyond: it stops counting for that file until a later
    challenge passes; one that answered only 503 ``overloaded`` until then is inconclusive, never a failure)."""
    publishers: tuple[str, ...] = ()
    """Keys (``ed25519:<base64>``: an operator key from ``p2pnode catalog keygen``, or a durable node's key shown by
    ``p2pnode sync status``) whose published files this node fetches (docs/sync.md, distribution). Empty (the
    default): it fetches none; a file published by any other key is refused (``unpinned``)."""
    subscribe_dir: str = ""
    """Where published files appear, ``<subscribe_dir>/<name>`` (a link switched by rename to the newest verified
    version). Empty: ``<data_dir>/published``. Must not overlap ``agent.data_dir`` (neither inside the other)."""
    publish: str = ""
    """A folder whose files this node publishes, signed with its node key, to the nodes tagged ``publish_to`` (each
    file once unchanged for ``settle_s``; a changed file is a new version). Empty: none."""
    publish_to: str = ""
    """The tag of the nodes the ``publish`` folder's files are for (empty: every node that pins this node's key)."""
    serve_published: bool = True
    """Serve the blocks of published files this node holds to other members (off on a node that cannot accept
    connections, a marketplace worker behind NAT: it fetches and serves nothing)."""
    publish_serve_streams: int = 8
    """Block requests of published files this node serves at once (beyond: 503 ``busy``)."""
    publish_max_bytes_per_s: int = 0
    """Bandwidth cap for serving published files' blocks, bytes per second (0: none)."""
    fetch_streams_per_holder: int = 2
    """Block requests a subscriber has under way to one holder at most per publication fetched (BitTorrent's few
    streams per peer; 4 publications are fetched at once)."""
    fetch_max_streams: int = 8
    """Block requests a subscriber has under way in all per publication fetched (4 are fetched at once)."""


@dataclass(frozen=True, kw_only=True)
class CatalogSettings:
    """``[catalog]``: catalogs pushed to the fleet once (:mod:`p2pnode.scheduler._signed`). Off unless ``signers``
    pins at least one operator key: a catalog names the commands nodes run, so taking one from the network is
    remote execution, opted into per node."""

    signers: tuple[str, ...] = ()
    """Operator public keys (``ed25519:<base64>``, printed by ``p2pnode catalog keygen``) whose signed catalogs
    this node adopts, newest version first, in place of ``agent.catalog``; empty: it keeps its own file."""


@dataclass(frozen=True, kw_only=True)
class JobsSettings:
    """``[jobs]``: how this node runs jobs."""

    engines: tuple[str, ...] = ()
    """``[jobs.engines]``: the Python interpreter each engine runs with, ``torchrun = "/opt/engines/bin/python"``
    (env ``P2PNODE_JOBS_ENGINES="torchrun=/opt/engines/bin/python,ray=..."``); an engine not listed uses the
    agent's own. Users keep torch and Ray in their own environments: the node runs an engine where its
    interpreter imports it (fingerprinted at start, published in the snapshot, like Nomad's task drivers)."""

    def python_for(self, engine: str, default: str) -> str:
        """The interpreter ``engine`` runs with: the configured one, else ``default`` (the agent's)."""
        for item in self.engines:
            name, _, path = item.partition("=")
            if name.strip() == engine and path.strip():
                return path.strip()
        return default


class ScalingClass(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One node class in ``[scaling.classes]`` (``"1xH100" = { min_nodes = 0, max_nodes = 4, price_per_hour =
    2.5 }``): how many nodes of it the fleet may have (``min_nodes``-``max_nodes``, members of the class counted
    whoever started them), what one costs an hour (``price_per_hour``, for ``max_hourly_cost``), and how a
    provider starts one: ``fake_gpus`` (the ``local`` provider's ``--fake-gpus`` for it) and ``tags`` (given to
    the nodes a provider starts; never ``voter``: scaling never changes the voter set)."""

    min_nodes: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 0
    max_nodes: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 0
    price_per_hour: Annotated[float, msgspec.Meta(ge=0.0, le=1e6)] = 0.0
    fake_gpus: Annotated[str, msgspec.Meta(max_length=256, pattern=r"^[A-Za-z0-9 ,x*._-]*\Z")] = ""
    tags: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=128,
                                                       pattern=r"^[A-Za-z0-9_.:=@/+-]+\Z")]],
                    msgspec.Meta(max_length=16)] = []


@dataclass(frozen=True, kw_only=True)
class ScalingSettings:
    """``[scaling]``: the leader's scaling decisions and the provider that carries them out (docs/capacity.md).
    Must be the same on every node that may lead: its digest is published and a mismatch reported."""

    provider: str = ""
    """The provider plugin the leader calls: ``""`` (decisions shown, no action), ``command``, ``local``, or the
    name of an entry point in group ``p2pnode.providers``."""
    classes: dict[str, ScalingClass] = field(default_factory=dict)
    """``[scaling.classes]``: node class -> :class:`ScalingClass` (env: a JSON object)."""
    cooldown_s: float = 300.0
    """At most one action (up or down, any class) per this many seconds (Nomad Autoscaler's cooldown)."""
    up_after_s: float = 60.0
    """Work must have waited for a class this long before it scales up (hysteresis: a burst that placements
    absorb at once starts no machine)."""
    idle_timeout_s: float = 300.0
    """A node a provider started, idle (no job) this long, is drained and removed (Ray's ``idle_timeout``)."""
    max_step: int = 4
    """Nodes one scale-up asks for at most."""
    max_hourly_cost: float = 0.0
    """The fleet's nodes of configured classes may cost at most this much an hour (0: no cap)."""
    command_up: str = ""
    """``command`` provider: the program run to add nodes (argv split shell-like; no shell), with
    ``P2PNODE_NODE_CLASS``, ``P2PNODE_COUNT`` and ``P2PNODE_REQUEST_ID`` in its environment (Slurm's
    ``ResumeProgram``)."""
    command_down: str = ""
    """``command`` provider: the program run to remove nodes, with ``P2PNODE_NODE_IDS`` (comma-separated) and
    ``P2PNODE_REQUEST_ID`` (Slurm's ``SuspendProgram``)."""
    command_list: str = ""
    """``command`` provider: the program that prints the provider's nodes as JSON (docs/capacity.md); empty:
    the fleet's members are the only record."""
    command_timeout_s: float = 300.0
    """A command running longer is killed and counted as a failure."""
    local_dir: str = ""
    """``local`` provider: where the agents it starts keep their data dirs and records (default:
    ``<data_dir>/scaling-local``; every node that may lead must name the same directory)."""
    local_config: str = ""
    """``local`` provider: the TOML config of the agents it starts (their port, data dir, join addresses, GPUs and
    tags are set by the provider)."""

    def digest(self) -> str:
        """Hex BLAKE3 (128 bits) of this table, canonical (sorted keys): equal tables, equal digests."""
        import blake3

        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return blake3.blake3(msgspec.json.encode(doc, order="sorted")).hexdigest(16)


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole configuration. Build it with :func:`load_config`."""

    agent: AgentConfig = field(default_factory=AgentConfig)
    gossip: GossipConfig = field(default_factory=GossipConfig)
    election: ElectionConfig = field(default_factory=ElectionConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    guard: GuardLimits = field(default_factory=GuardLimits)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    sync: SyncConfig = field(default_factory=SyncConfig)
    catalog: CatalogSettings = field(default_factory=CatalogSettings)
    jobs: JobsSettings = field(default_factory=JobsSettings)
    scaling: ScalingSettings = field(default_factory=ScalingSettings)

    def membership(self) -> MembershipConfig:
        """The failure-detection parameters: the gossip profile, with every key set in ``[gossip]`` on top."""
        base = PROFILES[self.gossip.profile]
        over = {
            f.name: getattr(self.gossip, "interval_s" if f.name == "gossip_interval_s" else f.name)
            for f in dataclasses.fields(MembershipConfig)
        }
        return dataclasses.replace(base, **{k: v for k, v in over.items() if v is not None})

    def lease_terms(self) -> tuple[float, float]:
        """``(lease_s, stop_grace_s)`` of the lease this node keeps (``lease_s`` 0: none, ``gossip.probes`` off)."""
        s = self.scheduler
        return (s.lease_s if self.gossip.probes else 0.0), s.stop_grace_s

    def probe_config(self) -> ProbeConfig | None:
        """The SWIM probe parameters from ``[gossip]``, or None when ``gossip.probes`` is off."""
        g = self.gossip
        if not g.probes:
            return None
        return ProbeConfig(probe_interval_s=g.probe_interval_s, probe_timeout_s=g.probe_timeout_s,
                           indirect_checks=g.indirect_checks, awareness_max_multiplier=g.awareness_max_multiplier)

    @property
    def gossip_interval_s(self) -> float:
        """Seconds between gossip rounds: ``[gossip] interval_s`` or the profile's value."""
        return self.membership().gossip_interval_s

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain TOML-like dict (paths as strings, tuples as lists, profile values resolved), token masked."""
        out: dict[str, dict[str, Any]] = {}
        resolved = self.membership()
        for section in _SECTIONS:
            sect = getattr(self, section)
            vals: dict[str, Any] = {}
            for f in dataclasses.fields(sect):
                v = getattr(sect, f.name)
                if f.name in ("cluster_token", "read_token") and v:
                    v = "********"
                if section == "gossip" and v is None:
                    v = getattr(resolved, "gossip_interval_s" if f.name == "interval_s" else f.name)
                vals[f.name] = (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple)
                                else msgspec.to_builtins(v) if isinstance(v, dict) else v)
            out[section] = vals
        return out


_SECTIONS: dict[str, type] = {
    "agent": AgentConfig,
    "gossip": GossipConfig,
    "election": ElectionConfig,
    "discovery": DiscoveryConfig,
    "guard": GuardLimits,
    "scheduler": SchedulerSettings,
    "sync": SyncConfig,
    "catalog": CatalogSettings,
    "jobs": JobsSettings,
    "scaling": ScalingSettings,
}


def env_var(section: str, f: dataclasses.Field[Any]) -> str:
    """Environment variable of a field (see module docstring)."""
    if "env" in f.metadata:
        return str(f.metadata["env"])
    prefix = "P2PNODE_" if section == "agent" else f"P2PNODE_{section.upper()}_"
    return prefix + f.name.upper()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Convert ``value`` (from TOML, env string or flag) to ``typ``; raise ConfigError naming ``where``."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        inner = [t for t in typing.get_args(typ) if t is not type(None)]
        return _coerce(value, inner[0], where)
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
            raise ValueError("expected a boolean")
        if typ is int or typ is float:
            kind = "an integer" if typ is int else "a number"
            if isinstance(value, bool) or (typ is int and isinstance(value, float) and not value.is_integer()):
                raise ValueError(f"expected {kind}")
            try:
                return typ(value)
            except ValueError:
                raise ValueError(f"expected {kind}") from None
        if typ is str:
            if not isinstance(value, str):
                raise ValueError("expected a string")
            return value
        if typ is Path:
            if not isinstance(value, (str, Path)):
                raise ValueError("expected a path")
            return Path(value).expanduser()
        if origin is dict:  # a TOML table of tables (e.g. [scaling.classes]); env: a JSON object
            if isinstance(value, str):
                value = msgspec.json.decode(value)
            return msgspec.convert(value, typ)
        if origin is tuple:
            if isinstance(value, dict):  # a TOML table of NAME = AMOUNT, e.g. [agent.resources]
                value = [f"{k}={v}" for k, v in value.items()]
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ValueError("expected a list of strings")
            return tuple(value)
    except (TypeError, ValueError, RecursionError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ConfigError(f"{where}: {exc} (got {str(value)[:200]!r})") from None
    raise ConfigError(f"{where}: unsupported type {typ}")  # pragma: no cover - programming error


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build the effective :class:`Config`: defaults < TOML ``path`` < ``env`` (default ``os.environ``) <
    ``overrides`` (``{section: {field: value}}``, from flags; ``None`` values are ignored).

    Raises :class:`ConfigError` for an unreadable file, invalid TOML, an unknown section or key, a value of the
    wrong type, or inconsistent settings (see :func:`_validate`).
    """
    env = os.environ if env is None else env
    layers: dict[str, dict[str, Any]] = {s: {} for s in _SECTIONS}
    if path is not None:
        try:
            doc = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        for section, table in doc.items():
            if section not in _SECTIONS or not isinstance(table, dict):
                raise ConfigError(f"{path}: unknown section [{section}] (known: {', '.join(_SECTIONS)})")
            names = {f.name for f in dataclasses.fields(_SECTIONS[section])}
            types = _field_types(_SECTIONS[section])
            for key, value in table.items():
                if key not in names:
                    raise ConfigError(f"{path}: unknown key {key!r} in [{section}] (known: {', '.join(sorted(names))})")
                layers[section][key] = _coerce(value, types[key], f"{path}: [{section}] {key}")
    for section, cls in _SECTIONS.items():
        types = _field_types(cls)
        for f in dataclasses.fields(cls):
            var = env_var(section, f)
            if var in env and env[var] != "":
                layers[section][f.name] = _coerce(env[var], types[f.name], f"environment variable {var}")
    for section, values in (overrides or {}).items():
        if section not in _SECTIONS:
            raise ConfigError(f"unknown section {section!r}")
        types = _field_types(_SECTIONS[section])
        for key, value in values.items():
            if value is None:
                continue
            if key not in types:
                raise ConfigError(f"unknown option {section}.{key}")
            layers[section][key] = _coerce(value, types[key], f"option --{key.replace('_', '-')}")
    config = Config(**{s: cls(**layers[s]) for s, cls in _SECTIONS.items()})
    _validate(config)
    _validate_windows(config)
    _validate_challenges(config.sync)
    _validate_operator_keys(config.agent.operator_keys)
    return config


def _validate_windows(c: Config) -> None:
    """The guard's windows hold every sample taken in them: ``guard.cpu_window_s`` and ``guard.memory_window_s``
    over ``agent.sample_interval_s`` at most :data:`p2pnode.guardcore.MAX_WINDOW_SAMPLES` (a longer window would
    keep only its newest samples and assess a shorter span than it says). Raises :class:`ConfigError`."""
    from .guardcore import MAX_WINDOW_SAMPLES

    g, every = c.guard, c.agent.sample_interval_s
    for name in ("cpu_window_s", "memory_window_s"):
        window = getattr(g, name)
        if every > 0 and window / every > MAX_WINDOW_SAMPLES:
            raise ConfigError(f"guard.{name} {window:g} s over agent.sample_interval_s {every:g} s is "
                              f"{window / every:.0f} samples; at most {MAX_WINDOW_SAMPLES} (a longer sample interval "
                              f"or a shorter window)")


def _validate_challenges(y: SyncConfig) -> None:
    """The proof-of-possession settings of ``[sync]``; raises :class:`ConfigError`."""
    if not (1.0 <= y.challenge_interval_s <= 7 * 86400 and 1.0 <= y.challenge_window_s <= 86400
            and 0.1 <= y.challenge_timeout_s <= 600):
        raise ConfigError("sync: challenge_interval_s in 1-604800 s, challenge_window_s in 1-86400 s and "
                          "challenge_timeout_s in 0.1-600 s")


def _validate_operator_keys(keys: tuple[str, ...]) -> None:
    """``agent.operator_keys``: at most 64, each ``ed25519:<base64 of 32 bytes>``. Raises :class:`ConfigError`."""
    from .certs import decode_operator_key

    for key in keys:
        try:
            decode_operator_key(key)
        except ValueError as exc:
            raise ConfigError(f"agent.operator_keys: {exc}") from None
    if len(keys) > 64:
        raise ConfigError("agent.operator_keys: at most 64 keys")


def _validate_probe(a: AgentConfig) -> None:
    import shlex

    try:
        shlex.split(a.interruption_probe)
    except ValueError as exc:
        raise ConfigError(f"agent.interruption_probe: {exc}") from None
    if not 0.1 <= a.interruption_probe_interval_s <= 3600:
        raise ConfigError("agent.interruption_probe_interval_s must be between 0.1 and 3600 seconds")
    if not 0.1 <= a.interruption_probe_timeout_s <= 600:
        raise ConfigError("agent.interruption_probe_timeout_s must be between 0.1 and 600 seconds")


def _validate(c: Config) -> None:
    from .gossip import parse_hostport
    from .resources import parse_fake_gpu_load, parse_fake_gpus, parse_resources

    a, g = c.agent, c.gossip
    if not 0 <= a.port < 65536:
        raise ConfigError(f"agent.port {a.port} out of range 0-65535")
    if a.trust not in ("open", "token"):
        raise ConfigError(f"agent.trust must be 'open' or 'token', not {a.trust!r}")
    if a.trust == "token" and not a.cluster_token and not (Path(a.data_dir) / "keyring.json").exists():
        raise ConfigError("agent.trust = 'token' needs a cluster token: P2PNODE_CLUSTER_TOKEN or agent.cluster_token "
                          "on the first start, or `p2pnode keys install TOKEN` into the data dir's keyring")
    if a.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"agent.log_level must be debug, info, warning or error, not {a.log_level!r}")
    if g.profile not in PROFILES:
        raise ConfigError(f"gossip.profile must be one of {', '.join(PROFILES)}, not {g.profile!r}")
    m = c.membership()
    if a.sample_interval_s <= 0 or m.gossip_interval_s <= 0 or g.request_timeout_s <= 0:
        raise ConfigError("intervals and timeouts must be positive")
    if m.suspicion_mult <= 0 or m.suspicion_max_timeout_mult < 1 or m.expected_confirmations < 1:
        raise ConfigError("gossip: suspicion_mult > 0, suspicion_max_timeout_mult >= 1, expected_confirmations >= 1")
    if m.min_publish_interval_s <= 0 or m.target_verifications_per_s <= 0:
        raise ConfigError("gossip: min_publish_interval_s and target_verifications_per_s must be positive")
    if c.election.voter_bootstrap_s < 0:
        raise ConfigError("election.voter_bootstrap_s must be >= 0")
    if not 0 <= c.election.leader_settle_s <= 86400:
        raise ConfigError("election.leader_settle_s must be between 0 and 86400 seconds")
    if c.election.min_voters < 1:
        raise ConfigError(f"election.min_voters must be at least 1, not {c.election.min_voters}")
    _validate_probe(a)
    if not 0 <= c.scheduler.max_close_hold_s <= 3600:
        raise ConfigError(f"scheduler.max_close_hold_s must be between 0 and 3600 seconds, not "
                          f"{c.scheduler.max_close_hold_s:g}")
    if c.scheduler.on_agent_stop not in ("stop", "leave"):
        raise ConfigError(f"scheduler.on_agent_stop must be 'stop' or 'leave', not {c.scheduler.on_agent_stop!r}")
    _validate_jobs(c)
    guard_errors = validate_limits(c.guard)
    if guard_errors:
        raise ConfigError("inconsistent guard limits:\n  " + "\n  ".join(guard_errors))
    if g.fanout < 1:
        raise ConfigError(f"gossip.fanout must be at least 1, not {g.fanout}")
    if not 1 <= g.idle_fanout <= g.fanout:
        raise ConfigError(f"gossip.idle_fanout must be between 1 and gossip.fanout ({g.fanout}), not {g.idle_fanout}")
    if g.max_snapshot_bytes < 1024 or g.max_body_bytes < g.max_snapshot_bytes + 4096:
        raise ConfigError("gossip.max_body_bytes must exceed gossip.max_snapshot_bytes (>= 1024) by 4096 bytes")
    if g.max_inbound_bytes_per_s < 1 or g.max_verifications_per_s <= 0:
        raise ConfigError("gossip: max_inbound_bytes_per_s and max_verifications_per_s must be positive")
    if g.max_members < 2 or g.max_verifications_per_message < 1 or g.max_concurrent_requests < 1:
        raise ConfigError("gossip: max_members must be at least 2, max_verifications_per_message and "
                          "max_concurrent_requests at least 1")
    if g.base_backoff_s <= 0 or g.max_backoff_s < g.base_backoff_s:
        raise ConfigError("gossip.max_backoff_s must be >= gossip.base_backoff_s > 0")
    if not 0.05 <= g.probe_interval_s <= 60 or not 0.01 <= g.probe_timeout_s < g.probe_interval_s:
        raise ConfigError("gossip: probe_interval_s must be between 0.05 and 60 seconds, probe_timeout_s at least "
                          "0.01 and below probe_interval_s")
    if not (g.push_pull_interval_s == 0 or 1 <= g.push_pull_interval_s <= 3600):
        raise ConfigError("gossip.push_pull_interval_s must be 0 (full digests only) or between 1 and 3600 seconds")
    if not 0 <= g.indirect_checks <= 16 or not 1 <= g.awareness_max_multiplier <= 64:
        raise ConfigError("gossip: indirect_checks must be between 0 and 16, awareness_max_multiplier between 1 "
                          "and 64")
    for addr in a.join:
        try:
            parse_hostport(addr, default_port=DEFAULT_PORT)
        except ValueError as exc:
            raise ConfigError(f"agent.join: {exc}") from None
    try:
        parse_resources(a.resources)
    except ValueError as exc:
        raise ConfigError(f"agent.resources: {exc}") from None
    simulated = len(parse_fake_gpus(a.fake_gpus)) if a.fake_gpus else 0
    for spec in a.fake_gpu_load:
        if parse_fake_gpu_load(spec)[0] >= simulated:
            raise ConfigError(f"agent.fake_gpu_load {spec!r}: there are {simulated} simulated GPUs (0-{simulated - 1})")
    if a.fake_gpu_load and not a.fake_gpus:
        raise ConfigError("agent.fake_gpu_load needs agent.fake_gpus (it drives simulated GPUs only)")
    _validate_sync(c)
    if a.catalog:
        _validate_catalog(c, Path(a.catalog))


def _validate_sync(c: Config) -> None:
    """``[sync]``: bounds and consistency (raises :class:`ConfigError` naming the setting)."""
    y = c.sync
    if y.partial_ttl_s <= 0:
        raise ConfigError("sync.partial_ttl_s must be positive")
    if y.interval_s <= 0 or y.settle_s < 0 or y.request_timeout_s <= 0 or y.backpressure_backoff_s < 0:
        raise ConfigError("sync: interval_s and request_timeout_s must be positive, settle_s and backoff >= 0")
    if y.replication_factor < 1:
        raise ConfigError(f"sync.replication_factor must be at least 1, not {y.replication_factor}")
    if not -1 <= y.data_port <= 65535:
        raise ConfigError(f"sync: data_port must be -1 (off), 0 (any free port) or a port number, not {y.data_port}")
    _validate_signers(c)
    if not 0 <= y.advertise_data_port <= 65535:
        raise ConfigError(f"sync: advertise_data_port must be 0 (the bound port or the provider's mapping) or a port "
                          f"number, not {y.advertise_data_port}")
    if y.request_bytes < 2**20 or y.max_request_bytes < y.request_bytes + 2**20 or y.max_request_bytes < 17 * 2**20:
        raise ConfigError("sync: request_bytes >= 1 MiB; max_request_bytes >= request_bytes + 1 MiB and >= 17 MiB "
                          "(one 16 MiB block must fit)")
    if y.max_bytes_per_s < 0 or y.max_receipts < 0 or y.max_receipts > 1024:
        raise ConfigError("sync: max_bytes_per_s >= 0 and max_receipts in 0-1024")
    if y.retention_cap_bytes < 0 or y.retention_keep_versions < 0 or not 0 <= y.retention_keep_days <= 36500:
        raise ConfigError("sync: retention_cap_bytes >= 0 (0: no cap), retention_keep_versions >= 0 and "
                          "retention_keep_days in 0-36500")
    if not 0.0 <= y.wal_backup_interval_s <= 7 * 86400:
        raise ConfigError(f"sync.wal_backup_interval_s must be between 0 and 604800 seconds, not "
                          f"{y.wal_backup_interval_s:g}")
    if not 1.0 <= y.retention_interval_s <= 7 * 86400:
        raise ConfigError(f"sync.retention_interval_s must be between 1 and 604800 seconds, not "
                          f"{y.retention_interval_s:g}")


def _validate_catalog(c: Config, path: Path) -> None:
    """``agent.catalog``: a catalog that loads, and whose fenced templates fit the lease the node keeps
    (:func:`p2pnode.scheduler._leaselead.catalog_lease_problems`)."""
    from .scheduler import CatalogError, load_catalog
    from .scheduler._leaselead import catalog_lease_problems

    try:
        cat = load_catalog(path)
    except CatalogError as exc:
        raise ConfigError(f"agent.catalog: {exc}") from None
    if problems := catalog_lease_problems(cat.templates.values(), *c.lease_terms()):
        raise ConfigError(f"agent.catalog: {'; '.join(problems)}")


# -- marketplace providers: the public address and port mapping a container is given --------------------------------
PROVIDERS = (("vast.ai", "PUBLIC_IPADDR", "VAST_TCP_PORT_"), ("runpod", "RUNPOD_PUBLIC_IP", "RUNPOD_TCP_PORT_"))
"""``(provider, public IP variable, port variable prefix)``: Vast.ai publishes each open internal TCP port ``P`` as
``VAST_TCP_PORT_P`` (a random public port on the machine's shared ``PUBLIC_IPADDR``), RunPod as
``RUNPOD_TCP_PORT_P`` with ``RUNPOD_PUBLIC_IP`` (their instance documentation)."""
MAX_MAPPED_PORTS = 256
"""Port variables read at most (Vast.ai allows 64 open ports per instance)."""


class ProviderNat(msgspec.Struct, frozen=True):
    """What a marketplace container learns from its environment: ``provider`` (``vast.ai``, ``runpod``), its
    ``public_ip`` and ``ports``, internal TCP port -> public port. See :func:`provider_nat`."""

    provider: str
    public_ip: str
    ports: dict[int, int]

    def public(self, port: int) -> int | None:
        """The public port peers dial for internal ``port``, or None when the provider publishes none."""
        return self.ports.get(port)


_PROVIDER = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_CLASS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")


def _validate_signers(c: Config) -> None:
    """The pinned keys: ``catalog.signers``, then the distribution keys of ``[sync]``."""
    from .scheduler import decode_signer

    for signer in c.catalog.signers:
        try:
            decode_signer(signer)
        except ValueError as exc:
            raise ConfigError(f"catalog.signers: {exc}") from None
    if len(c.catalog.signers) > 64:
        raise ConfigError("catalog.signers: at most 64 keys")
    _validate_distribution(c.sync, Path(c.agent.data_dir))


def _validate_distribution(y: SyncConfig, data_dir: Path) -> None:
    """The distribution keys of ``[sync]``: pinned publishers, the publish folder's tag, the stream caps, and a
    ``subscribe_dir`` apart from ``data_dir`` (neither inside the other: a published name must never replace one of
    the agent's own files; empty, the default ``<data_dir>/published``, is the one place inside it)."""
    from .synccore import decode_publisher

    if y.subscribe_dir:
        sub, data = (Path(os.path.normpath(p.expanduser().absolute())) for p in (Path(y.subscribe_dir), data_dir))
        if sub == data or sub.is_relative_to(data) or data.is_relative_to(sub):
            raise ConfigError(f"sync.subscribe_dir: {str(sub)[:200]} overlaps agent.data_dir {str(data)[:200]} "
                              f"(leave it empty for <data_dir>/published, or name a folder apart)")

    for publisher in y.publishers:
        try:
            decode_publisher(publisher)
        except ValueError as exc:
            raise ConfigError(f"sync.publishers: {exc}") from None
    if len(y.publishers) > 64:
        raise ConfigError("sync.publishers: at most 64 keys")
    if not re.fullmatch(r"[A-Za-z0-9_.:=@/+-]{0,128}", y.publish_to):
        raise ConfigError(f"sync.publish_to: {y.publish_to[:60]!r} is not a tag")
    if not 1 <= y.publish_serve_streams <= 256 or not 1 <= y.fetch_streams_per_holder <= 16 \
            or not 1 <= y.fetch_max_streams <= 64 or y.publish_max_bytes_per_s < 0:
        raise ConfigError("sync: publish_serve_streams 1-256, fetch_streams_per_holder 1-16, fetch_max_streams 1-64, "
                          "publish_max_bytes_per_s >= 0")


def _check_class_name(name: str) -> None:
    """A ``<count>x<GPU model>`` class must be spelled as nodes report their class
    (:func:`p2pnode.scheduler.node_class_of`): ``1x4090``, not ``1xRTX4090``; else its nodes would never count."""
    from .scheduler._predict import node_class_of

    m = re.fullmatch(r"([1-9][0-9]{0,3})x(.+)", name)
    if m is None:
        return
    spelled = node_class_of([re.sub(r"(?<=[A-Za-z])(?=[0-9])", " ", m.group(2))])  # "RTX4090" as "RTX 4090"
    if spelled.partition("x")[2] != m.group(2):
        raise ConfigError(f"scaling.classes: {name!r} is no node class: nodes with that GPU report class "
                          f"{m.group(1)}x{spelled.partition('x')[2]}")


def _validate_scaling(s: ScalingSettings, started_by: str) -> None:
    """``[scaling]``: provider name, class names, bounds, and what the chosen provider needs; ``agent.started_by``
    (``started_by``), the request id of the action that started this node."""
    import shlex

    if started_by and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}", started_by):
        raise ConfigError(f"agent.started_by must be a request id (a letter or digit, then letters, digits, _ . : -), "
                          f"not {started_by[:64]!r}")
    for key in ("command_up", "command_down", "command_list"):
        try:
            shlex.split(getattr(s, key))
        except ValueError as exc:
            raise ConfigError(f"scaling.{key}: {exc} (a command line, split like a shell's words)") from None
    if s.provider and not _PROVIDER.fullmatch(s.provider):
        raise ConfigError(f"scaling.provider must be a plugin name (a-z, 0-9, _ and -), not {s.provider[:64]!r}")
    if len(s.classes) > 64:
        raise ConfigError(f"scaling.classes: at most 64 node classes, not {len(s.classes)}")
    for name, cls in s.classes.items():
        if not _CLASS.fullmatch(name):
            raise ConfigError(f"scaling.classes: {name[:64]!r} is no node class name (letters, digits, _ . + -)")
        if cls.min_nodes > cls.max_nodes:
            raise ConfigError(f"scaling.classes.{name}: min_nodes {cls.min_nodes} > max_nodes {cls.max_nodes}")
        if "voter" in cls.tags:
            raise ConfigError(f"scaling.classes.{name}: nodes a provider starts are never voters (tag 'voter')")
        _check_class_name(name)
    for key in ("cooldown_s", "up_after_s", "idle_timeout_s"):
        v = getattr(s, key)
        if not 0 <= v <= 30 * 86400:
            raise ConfigError(f"scaling.{key} must be between 0 and 2592000 seconds (30 days), not {v}")
    if not 0 <= s.max_hourly_cost <= 1e9:
        raise ConfigError(f"scaling.max_hourly_cost must be between 0 (no cap) and 1e9, not {s.max_hourly_cost}")
    if not 0 < s.command_timeout_s <= 86400:
        raise ConfigError(f"scaling.command_timeout_s must be between 0 and 86400 seconds, not {s.command_timeout_s}")
    if not 1 <= s.max_step <= 1000:
        raise ConfigError(f"scaling.max_step must be 1-1000, not {s.max_step}")
    if s.provider == "command" and not (s.command_up and s.command_down):
        raise ConfigError("scaling.provider = 'command' needs scaling.command_up and scaling.command_down")


def _validate_jobs(c: Config) -> None:
    """``scheduler.gang_ports``, ``scheduler.gang_port_block``, ``scheduler.lease_s``, ``[jobs.engines]`` and
    ``[scaling]``."""
    _validate_scaling(c.scaling, c.agent.started_by)
    lease_s, grace = c.scheduler.lease_s, c.scheduler.stop_grace_s
    if lease_s != 0 and not (grace < lease_s * 0.75 - 3 and lease_s <= 86400):  # node._lease.renewal_slack_s
        raise ConfigError(f"scheduler.lease_s must be 0 (off) or above stop_grace_s ({grace:g} s) plus the renewal "
                          f"slack lease_s / 4 + 3 (above {(grace + 3) / 0.75:g} s) and at most 86400, not {lease_s:g}")
    ports = re.fullmatch(r"([0-9]{1,5})-([0-9]{1,5})", c.scheduler.gang_ports.strip())
    if ports is None or not 1024 <= int(ports.group(1)) <= int(ports.group(2)) <= 65535:
        raise ConfigError(f"scheduler.gang_ports must be FIRST-LAST, ports 1024-65535 in ASCII digits, not "
                          f"{c.scheduler.gang_ports[:32]!r}")
    if not 16 <= c.scheduler.gang_port_block <= 1024:
        raise ConfigError(f"scheduler.gang_port_block must be 16-1024 (a Ray member's services take ten), not "
                          f"{c.scheduler.gang_port_block}")
    from .snapshot import ENGINE_NAMES

    for item in c.jobs.engines:
        name, sep, path = item.partition("=")
        if not sep or name.strip() not in ENGINE_NAMES or not path.strip() or "\x00" in path:
            raise ConfigError(f"jobs.engines: {item[:80]!r} is not ENGINE=PYTHON with an engine of "
                              f"{', '.join(ENGINE_NAMES)}")


def provider_nat(env: Mapping[str, str]) -> ProviderNat | None:
    """The public address and port mapping a Vast.ai or RunPod container publishes in its environment
    (:data:`PROVIDERS`; the first provider whose public IP variable is set), else None. The one decoder of those
    variables: the IP must be an IPv4 or IPv6 address peers can dial (not unspecified, loopback, multicast or
    link-local), each port 1-5 ASCII digits in 1-65535 for an internal port named in 1-65535 without a leading
    zero. Raises :class:`p2pnode.errors.ConfigError` naming the variable that is not (the agent exits 2 with
    that line: advertising a wrong address would leave the node unreachable without a word)."""
    import ipaddress

    from .inputs import decimal

    for provider, ip_var, prefix in PROVIDERS:
        ip = env.get(ip_var, "").strip()
        if not ip:
            continue
        try:
            if "%" in ip:  # an IPv6 scope id is local to this host: no peer can dial it
                raise ValueError(ip)
            addr = ipaddress.ip_address(ip)
        except ValueError:
            raise ConfigError(f"{ip_var}={ip[:64]!r} ({provider}) is not an IP address") from None
        inner = getattr(addr, "ipv4_mapped", None) or addr  # ::ffff:127.0.0.1 is 127.0.0.1
        if inner.is_unspecified or inner.is_loopback or inner.is_multicast or inner.is_link_local \
                or inner.is_reserved or (inner.version == 4 and inner in ipaddress.ip_network("0.0.0.0/8")):
            raise ConfigError(f"{ip_var}={ip[:64]!r} ({provider}) is not an address peers can dial (unspecified, "
                              "loopback, multicast, link-local or reserved)")
        public_ip = str(addr)
        ports: dict[int, int] = {}
        for name in sorted(k for k in env if k.startswith(prefix)):
            if len(ports) >= MAX_MAPPED_PORTS:
                break
            suffix = name[len(prefix):]
            internal, public = decimal(suffix, max_digits=5), decimal(env[name].strip(), max_digits=5)
            if internal is None or not 0 < internal < 65536 or suffix != str(internal):
                continue  # another variable of the same prefix (VAST_TCP_PORT_70000, or _08770: not a port's name)
            if public is None or not 0 < public < 65536:
                raise ConfigError(f"{name}={env[name][:16]!r} ({provider}) is not a port number")
            ports[internal] = public
        return ProviderNat(provider, public_ip, ports)
    return None
