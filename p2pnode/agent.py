"""The agent: one trio nursery that wires the drivers (HTTP server, sampler, gossip, discovery) to the cores.

Tasks, all owned by :meth:`Agent.run`'s nursery:

* ``hypercorn`` serving the ASGI app (``/gossip``, ``/status``, ``/members``, ``/metrics``, ``/healthz``);
* the sampler: a resource sample every ``sample_interval_s``; a new signed snapshot version (heartbeat) every
  adaptive publish interval (:func:`p2pnode.gossip._membership.publish_interval_s`);
* the reconciler: membership timeouts (alive -> suspect -> dead), the vote and the leader view; it publishes at
  once when the vote, the suspicions or a refutation must reach the cluster;
* the gossip loop: every gossip interval a push-pull exchange with ``fanout`` random peers;
* mDNS discovery (optional) and the peers-file writer.

:meth:`Agent.stop` (SIGINT/SIGTERM in the CLI) publishes a final ``leaving`` snapshot, pushes it to peers for at
most ``gossip.leave_timeout_s``, unregisters mDNS and returns, well inside 2 s.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from . import __version__
from .config import Config
from .discovery import MdnsDiscovery, load_peers, save_peers
from ._files import atomic_write_bytes
from .election import Candidate, Election, MemberInfo, Vote, VoterRoll, election_inputs
from .errors import DATA_ERRORS, IdentityError, RejectedMessage
from .gossip import (
    ClusterState,
    Gossiper,
    MemberEntry,
    MemberState,
    Membership,
    PeerBook,
    StateChanged,
    TokenBuckets,
    parse_hostport,
    publish_interval_s,
)
from .guard import (
    Assessment,
    DegradationTracker,
    GuardMonitor,
    OperationPriority,
    admission,
    assess,
)
from .guard import run_cleanup
from .http import create_app, make_registry
from .identity import PersistentCounter, load_or_create_identity
from .keyring import KEYRING_FILE, Keyring, KeyringError
from .reqauth import RequestAuthError, RequestVerifier
from .jobs._control import JobControl
from .resources import ResourceSample, ResourceSampler, open_gpu_source, rank_of_gpus
from .snapshot import COUNTER_MAX, decode_snapshot
from .scheduler import load_catalog
from .sync import SyncService
from .wire import SCHEMA_VERSION, WireLimits, seal_snapshot

__all__ = ["Agent", "local_ipv4_addresses"]

log = logging.getLogger(__name__)

VERSION_FILE = "snapshot.version"
INCARNATION_FILE = "incarnation"
VOTE_FILE = "vote.json"
VOTERS_FILE = "voters.json"
RECENT_EVENTS_IN_SNAPSHOT = 10
MIN_PUBLISH_GAP_S = 0.1  # event-driven publications (vote, suspicion, refutation) are at most this frequent


def _load_vote(path) -> Vote | None:
    """The persisted vote, or None (missing or unreadable: a voter that lost its vote file starts over with a
    term above every term it hears, which keeps one vote per term unless the file was lost after voting)."""
    try:
        d = json.loads(path.read_text())
        return Vote(str(d["candidate"]), int(d["term"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring unreadable vote file %s: %s", path, exc)
        return None


def _load_roll(path: Path, *, trusted: bool, bootstrap_s: float) -> VoterRoll:
    """The persisted voter roll, or a new one (missing file). An unreadable file is an error the operator must
    look at (a node that forgot its voters could count a minority as a majority): ``IdentityError``."""
    try:
        return VoterRoll.from_wire(json.loads(path.read_text()), trusted=trusted, bootstrap_s=bootstrap_s)
    except FileNotFoundError:
        return VoterRoll(trusted=trusted, bootstrap_s=bootstrap_s)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IdentityError(f"{path}: unreadable voter roll ({exc}); restore it, or remove it to rebuild the "
                            "roll from the voters seen in the next minutes") from None


def _raise_open_files_limit() -> None:
    """Raise the soft limit of open files to the hard limit (often 1,024 soft of 524,288 hard): a flood of
    connections must not starve the agent's own files (``/proc`` reads, the data dir). Best effort."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError) as exc:
        log.debug("cannot raise the open-files limit: %s", exc)


def _load_keyring(path: Path, bootstrap_token: str) -> Keyring:
    """The keyring of token mode: the file in the data dir, or (first start) one holding the configured token,
    written there. Raises :class:`KeyringError` when the file is unreadable or there is no token at all."""
    ring = Keyring.load(path)
    if ring is None:
        if not bootstrap_token:
            raise KeyringError(f"token mode without a token: set P2PNODE_CLUSTER_TOKEN or `p2pnode keys install` into {path}")
        ring = Keyring.of([bootstrap_token])
        ring.save(path)
        log.info("keyring created with the configured cluster token (key id %s); rotate with `p2pnode keys`", ring.primary)
    elif not ring.tokens:
        raise KeyringError(f"{path}: the keyring holds no token (p2pnode keys install TOKEN)")
    return ring


def _jsonable(obj: Any) -> Any:
    """``obj`` with bytes (sync receipt roots) as hex, for JSON views of snapshots."""
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _sync_summary(sync: dict[str, Any]) -> dict[str, Any]:
    """A member's sync state from its snapshot: files it pushes and how many are below R; replicas it confirms."""
    out: dict[str, Any] = {}
    if "files" in sync:
        out.update(files=sync.get("files", 0), bytes=sync.get("bytes", 0),
                   under_replicated=sync.get("under_replicated", 0))
    if "receipts" in sync:
        out["receipts"] = sum(len(v) for v in sync["receipts"].values())
    return out


def local_ipv4_addresses() -> list[str]:
    """Non-loopback IPv4 addresses of this host's interfaces (psutil), in interface order."""
    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not ipaddress.ip_address(a.address).is_loopback:
                out.append(a.address)
    return out


def _is_unspecified(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Agent:
    """One p2pnode agent. Build with a :class:`Config`; run with ``await nursery.start(agent.run)``.

    Raises :class:`p2pnode.errors.IdentityError` from the constructor when the key file is unusable and
    ``OSError`` when the data dir cannot be created.
    """

    def __init__(self, config: Config, *, rng: random.Random | None = None) -> None:
        self.config = config
        self.agent_version = __version__
        a = config.agent
        self.data_dir = a.data_dir.absolute()  # jobs run with it as cwd and in their environment
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.identity = load_or_create_identity(self.data_dir)
        self.node_id = self.identity.node_id
        self.versions = PersistentCounter(self.data_dir / VERSION_FILE)
        self.keyring_path = self.data_dir / KEYRING_FILE
        self.keyring: Keyring | None = _load_keyring(self.keyring_path, a.cluster_token) if a.trust == "token" else None
        self._keyring_mtime = Keyring.mtime_ns(self.keyring_path)
        self.token = self.keyring  # token trust mode: every accepted token of the keyring, read at each check
        self.request_auth = RequestVerifier(self._request_token, key_of=self._node_key)
        self.read_refusals = 0
        self.sample_failures = 0
        limits = WireLimits(max_body_bytes=config.gossip.max_body_bytes, max_snapshot_bytes=config.gossip.max_snapshot_bytes)
        g = config.gossip
        self.state = ClusterState(self.node_id, limits=limits, token=self.token, max_members=g.max_members,
                                  max_verifications=g.max_verifications_per_message)
        self.verify_limiter = trio.CapacityLimiter(1)  # signature checks run in one worker thread at a time
        self.gossip_slots = trio.Semaphore(g.max_concurrent_requests)
        self.gossip_busy = 0  # inbound gossip requests refused with 503: all slots taken
        self.http_clients_gone = 0  # replies dropped: the client had hung up (see http._app._ClientGoneGuard)
        self.inbound_bytes = TokenBuckets(rate_per_s=g.max_inbound_bytes_per_s,
                                          burst=max(g.max_inbound_bytes_per_s, 2 * g.max_body_bytes))
        self.inbound_verifications = TokenBuckets(rate_per_s=g.max_verifications_per_s,
                                                  burst=max(g.max_verifications_per_s, g.max_verifications_per_message))
        self.peers = PeerBook(self.node_id, base_backoff_s=config.gossip.base_backoff_s, max_backoff_s=config.gossip.max_backoff_s)
        self.rng = rng or random.Random()
        self.gossiper = Gossiper(
            self.state, self.peers, self_addr="", fanout=config.gossip.fanout, rng=self.rng, on_accepted=self._on_accepted
        )
        self.membership_config = config.membership()
        self._incarnations = PersistentCounter(self.data_dir / INCARNATION_FILE, block=1)
        self.membership = Membership(self.node_id, self.membership_config, incarnation=self._incarnations.next())
        self.election = Election(
            self.node_id, is_voter=True, vote=_load_vote(self.data_dir / VOTE_FILE), min_voters=config.election.min_voters
        )
        self.roll = _load_roll(self.data_dir / VOTERS_FILE, trusted=self.token is not None,
                               bootstrap_s=config.election.voter_bootstrap_s)
        self.leader_changes = 0
        self._plan_omitted = False
        self.plans_omitted = 0  # publications that left the plan out because the snapshot would exceed its bound
        self.leaders_by_term: dict[int, str] = {}  # term -> the leader this node saw hold a quorum in it
        self._roll_refusals_logged: set[str] = set()
        self._last_publish_at = -1e9
        self._publish_wanted = False
        self._published_suspects: dict[str, int] = {}
        self.catalog = load_catalog(Path(a.catalog)) if a.catalog else None
        self.jobs: JobControl | None = None
        self.limits = config.guard
        self.tracker = DegradationTracker(self.limits)
        self.monitor = GuardMonitor(self.limits)
        self.assessment: Assessment | None = None
        self.last_cleanup: dict[str, Any] | None = None
        self.hook_runs = 0
        self.hook_failures = 0
        self._hooks: list[tuple[str, str]] = [tuple(h.split("=", 1)) for h in self.limits.hooks]  # type: ignore[misc]
        self._event_send, self._event_recv = trio.open_memory_channel[Any](256)
        self.events_dropped = 0
        self.sampler = ResourceSampler(self.data_dir, open_gpu_source(a.fake_gpus or None, seed=self.node_id))
        if self.catalog is not None:
            self.jobs = JobControl(self)
        self.sync = SyncService(self)
        self.last_sample: ResourceSample | None = None
        self.metrics_registry = make_registry(self)
        self.started_at = time.time()
        self.addr = ""
        self.port = 0
        self.leaving = False
        self.mdns: MdnsDiscovery | None = None
        self.mdns_error: str | None = None
        self._stop = trio.Event()
        self._client: httpx.AsyncClient | None = None
        self._inflight: set[str] = set()
        self._gossip_nursery: trio.Nursery | None = None
        self.gossip_rounds = 0
        self.gossip_bytes_sent = 0
        self.gossip_bytes_received = 0

    # -- time --------------------------------------------------------------------------------------
    @staticmethod
    def now() -> float:
        """Monotonic seconds (trio's clock, so tests may use a MockClock)."""
        return trio.current_time()

    # -- snapshot ----------------------------------------------------------------------------------
    def build_snapshot(self, version: int) -> dict[str, Any]:
        """This node's snapshot at ``version`` from the newest sample."""
        sample = self.last_sample
        return {
            "schema": SCHEMA_VERSION,
            "origin": self.node_id,
            "version": version,
            "addr": self.addr,
            "tags": list(self.config.agent.tags),
            "started_at": self.started_at,
            "ts": time.time(),
            "leaving": self.leaving,
            "agent_version": self.agent_version,
            "trust": self.config.agent.trust,
            "resources": sample.to_wire() if sample else {},
            **(self.jobs.snapshot_fields() if self.jobs else {"jobs": []}),
            "incarnation": self.membership.incarnation,
            "suspects": self.membership.suspects(),
            "guard": self._guard_summary(),
            "catalog_digest": self.catalog.digest if self.catalog else "",
            "events": [e.to_wire() for e in self.monitor.log.recent(RECENT_EVENTS_IN_SNAPSHOT)],
            "vote": self.election.vote.to_wire() if self.election.vote else None,
            **self.sync.snapshot_fields(),
        }

    def publish(self) -> None:
        """Sign a new snapshot version and install it as our local state."""
        seen = self.gossiper.last_self_version_seen
        if seen is not None and seen >= self.versions.value:
            # Only from an envelope signed with our own key (a former run of this node): see ClusterState.verify.
            if seen < COUNTER_MAX // 2:
                log.warning("peers hold our version %d, above our counter %d: jumping past it", seen, self.versions.value)
                self.versions.advance_past(seen)
            else:
                log.error("peers hold our version %d, too close to the wire bound to jump past; ignored", seen)
            self.gossiper.last_self_version_seen = None
        snap = self.build_snapshot(self.versions.next())
        token = self.keyring.primary_token if self.keyring else None
        env = seal_snapshot(self.identity, snap, token=token)
        limit = self.config.gossip.max_snapshot_bytes
        if len(env.body) > limit and snap.get("plan") is not None:
            # The heartbeat must go out, or this leader is taken for dead and the next one hits the same wall:
            # publish without the plan (nodes keep what runs and start nothing new until it fits again).
            if not self._plan_omitted:
                log.error("own snapshot of %d bytes exceeds max_snapshot_bytes (%d): publishing it without the "
                          "plan (%d jobs) until the plan fits", len(env.body), limit, len(snap["plan"].get("jobs", [])))
            self._plan_omitted = True
            self.plans_omitted += 1
            snap = {**snap, "plan": None}
            env = seal_snapshot(self.identity, snap, token=token)
        elif self._plan_omitted and len(env.body) <= limit:
            self._plan_omitted = False
            log.warning("the plan fits in the snapshot again")
        if len(env.body) > limit:
            log.error("own snapshot of %d bytes exceeds max_snapshot_bytes; not published", len(env.body))
            return
        try:
            decode_snapshot(env.body)  # what every peer will check: a bound we break is our bug, say so loudly
        except RejectedMessage as exc:
            # Keep beating: the liveness, membership and election fields first, the informative sections dropped.
            log.error("own snapshot fails the typed decoder (%s): publishing it without plan, refusals, events "
                      "and signals", exc)
            snap = {**snap, "plan": None, "refused": [], "events": [], "signals": {}}
            env = seal_snapshot(self.identity, snap, token=token)
            try:
                decode_snapshot(env.body)
            except RejectedMessage as exc2:
                log.error("own snapshot still fails the typed decoder (%s); not published", exc2)
                return
        now = self.now()
        self.state.set_local(env, snap, now)
        self._last_publish_at = now
        self._publish_wanted = False
        self._published_suspects = snap["suspects"]

    def sample(self) -> None:
        self.last_sample = self.sampler.sample()

    # -- membership and election ---------------------------------------------------------------------
    def quarantine(self, origin: str, where: str, exc: Exception) -> None:
        """A member's snapshot broke ``where`` (a bug of the decoder's bounds, which the fuzz suite treats as a
        failure): drop that snapshot, count it, log once per origin; the agent carries on."""
        first = origin not in self.state.quarantined
        if self.state.quarantine(origin, f"{where}: {exc.__class__.__name__}: {exc}") and first:
            log.error("quarantined the snapshot of %s: it broke %s (%s: %s)", origin, where, exc.__class__.__name__, exc)

    def _on_accepted(self, entry: MemberEntry, now: float) -> None:
        snap = entry.snapshot
        try:
            changes = self.membership.observe(
                entry.origin,
                version=entry.version,
                incarnation=snap.get("incarnation", 0),
                leaving=entry.leaving,
                suspects=snap.get("suspects", {}),
                now=now,
            )
        except DATA_ERRORS as exc:
            self.quarantine(entry.origin, "membership", exc)
            return
        self._log_changes(changes)

    def _log_changes(self, changes: list[StateChanged]) -> None:
        for ch in changes:
            level = logging.INFO if ch.new in (MemberState.DEAD, MemberState.LEFT, None) or ch.old else logging.DEBUG
            log.log(level, "member %s: %s -> %s", ch.node_id, ch.old.value if ch.old else "new", ch.new.value if ch.new else "reaped")
            if ch.new is None:
                self.state.forget(ch.node_id)

    def _member_info(self, node_id: str) -> MemberInfo | None:
        """Rank, vote and tags from ``node_id``'s newest snapshot (validated by :mod:`p2pnode.wire`)."""
        entry = self.state.get(node_id)
        if entry is None:
            return None
        snap = entry.snapshot
        try:
            res = snap.get("resources", {})
            v = snap.get("vote")
            # Rank from the reported GPU models and memory with the known table, never the member's own score.
            score, vram = rank_of_gpus((g.get("name", ""), g.get("mem_total_bytes", 0)) for g in res.get("gpus", []))
            return MemberInfo(
                Candidate(node_id, score, vram),
                Vote(v["candidate"], v["term"]) if v else None,
                tuple(snap.get("tags", ())),
            )
        except DATA_ERRORS as exc:
            self.quarantine(node_id, "election", exc)
            return None

    def reconcile(self) -> None:
        """Apply membership timeouts and recompute the vote and leader view; publish at once when our vote,
        our suspicions or a refutation must reach the cluster (rate-limited to one per ``MIN_PUBLISH_GAP_S``)."""
        now = self.now()
        self._log_changes(self.membership.tick(now))
        if self.membership.take_refute():
            log.warning("refuting suspicion: incarnation now %d", self.membership.incarnation)
            self._incarnations.advance_past(self.membership.incarnation - 1)
            self._incarnations.next()
            self._publish_wanted = True
        sample = self.last_sample
        score, vram = rank_of_gpus((g.name, g.mem_total_bytes) for g in sample.gpus) if sample else (0.0, 0)
        me = MemberInfo(Candidate(self.node_id, score, vram), self.election.vote, tuple(self.config.agent.tags))
        roll = self._update_roll()
        inputs = election_inputs(self.membership, self_info=me, self_left=self.leaving, info=self._member_info,
                                 roll=roll)
        before = self.election.view.leader, self.election.view.term
        if self.election.update(**inputs):
            self._save_vote()
            self._publish_wanted = True
        view = self.election.view
        if view.leader is not None and view.term is not None and self.leaders_by_term.get(view.term) != view.leader:
            self.leaders_by_term[view.term] = view.leader
            while len(self.leaders_by_term) > 64:  # the newest terms are what plan carry-over needs
                del self.leaders_by_term[min(self.leaders_by_term)]
        if (view.leader, view.term) != before:
            self.leader_changes += 1
            log.info("leader: %s (term %s, %d/%d votes)", view.leader, view.term, view.votes_for_leader, view.voters)
        if self.membership.suspects() != self._published_suspects:
            self._publish_wanted = True
        if self._publish_wanted and now - self._last_publish_at >= MIN_PUBLISH_GAP_S and not self.leaving:
            self.publish()

    def _update_roll(self) -> set[str] | None:
        """Admit members into the sticky voter roll (rules: :class:`VoterRoll`), persist it, and return the voter
        set to count (``None``: the classic rule of :meth:`Election.voter_set`).

        Candidates are the members tagged ``voter``. Where no member is tagged: in open mode every member (not
        leaving) is a candidate, so that members that appear after the roll closed, fake ones included, never
        vote; in token mode (members are endorsed) the classic rule applies: every member not left votes until
        it is reaped."""
        tagged = {self.node_id} if "voter" in self.config.agent.tags else set()
        untagged: set[str] = set() if tagged else {self.node_id}
        for e in self.state.entries():
            if e.origin == self.node_id:
                continue
            if "voter" in e.snapshot.get("tags", ()):
                tagged.add(e.origin)
            elif not e.leaving:
                untagged.add(e.origin)
        if tagged:
            candidates, kind = tagged, "claims the voter tag"
        elif self.token is None:
            candidates, kind = untagged, "joined (no member is tagged voter)"
        else:
            candidates, kind = set(), ""
        if candidates - self.roll.members - self.roll.removed - self.roll.refused:
            if self.roll.observe(candidates, time.time()):
                self._save_roll()
            for n in sorted(self.roll.refused & candidates):
                if n not in self._roll_refusals_logged and len(self._roll_refusals_logged) < 1024:
                    self._roll_refusals_logged.add(n)
                    log.warning("member %s %s after the voter roll closed (open mode): it does not vote; admit it "
                                "with `p2pnode node admit %s`", n, kind, n)
        if not candidates or not self.roll.members:
            return None
        if tagged:
            return self.roll.members - (untagged - tagged)  # known untagged members never count once tags exist
        return set(self.roll.members)

    def _save_roll(self) -> None:
        try:
            atomic_write_bytes(self.data_dir / VOTERS_FILE, json.dumps(self.roll.to_wire()).encode(), mode=0o600)
        except OSError as exc:
            log.error("cannot persist the voter roll: %s", exc)

    def change_voter(self, node_id: str, *, admit: bool) -> bool:
        """The operator admits ``node_id`` to the voter roll or removes it (``p2pnode node admit|remove``).
        Returns True when the roll changed (then persisted at once, effective at the next reconcile). The roll
        holds at most ``gossip.max_members`` voters and remembers as many removals."""
        cap = self.config.gossip.max_members
        if admit and node_id not in self.roll.members and len(self.roll.members) >= cap:
            return False
        changed = self.roll.admit(node_id) if admit else self.roll.remove(node_id)
        while len(self.roll.removed) > cap:
            self.roll.removed.pop()
        if changed or not admit:
            self._save_roll()
        if changed:
            log.warning("operator %s voter %s", "admitted" if admit else "removed", node_id)
            self._publish_wanted = True
        return changed

    def catalog_mismatch(self) -> list[str]:
        """Members (not left) whose snapshot carries another catalog digest than ours."""
        mine = self.catalog.digest if self.catalog else ""
        out = []
        for e in self.state.entries():
            if e.origin == self.node_id or self.membership.state_of(e.origin) is MemberState.LEFT:
                continue
            if e.snapshot.get("catalog_digest", "") != mine:
                out.append(e.origin)
        return out

    def _save_vote(self) -> None:
        v = self.election.vote
        if v is None:
            return
        try:
            atomic_write_bytes(self.data_dir / VOTE_FILE, json.dumps(v.to_wire()).encode(), mode=0o600)
        except OSError as exc:
            log.error("cannot persist vote: %s", exc)

    def heartbeat_due(self, now: float) -> bool:
        """A heartbeat publication is due: the adaptive publish interval for this cluster size has passed."""
        return now - self._last_publish_at >= publish_interval_s(self.membership.size, self.membership_config)

    # -- guard -------------------------------------------------------------------------------------
    def _guard_summary(self) -> dict[str, Any]:
        a = self.assessment
        return {
            "level": self.tracker.level,
            "raw_level": a.level if a else 0,
            "ratio": round(a.ratio, 4) if a else 0.0,
            "reasons": list(a.reasons) if a else [],
        }

    def guard_check(self) -> list:
        """Assess the newest sample, update the degradation level (hysteresis, dwell) and raise events.
        Returns the new events; publishes at once when there are any (so peers see them)."""
        if self.last_sample is None:
            return []
        wire = self.last_sample.to_wire()
        self.assessment = assess(wire, self.limits)
        before = self.tracker.level
        level = self.tracker.update(self.assessment, self.now())
        if level != before:
            log.log(logging.WARNING if level > before else logging.INFO, "degradation level %d -> %d: %s",
                    before, level, "; ".join(self.assessment.reasons) or "load back to normal")
        events = self.monitor.observe(wire, self.assessment, level, now=self.now(), at=time.time())
        for ev in events:
            self._dispatch_event(ev)
        return events

    def emit_event(self, name: str, payload: dict[str, Any]) -> None:
        """Record an event raised outside the guard (sync), hand it to the hooks and publish it soon."""
        self._dispatch_event(self.monitor.log.emit(name, payload, at=time.time()))

    def _dispatch_event(self, ev: Any) -> None:
        """Log a recorded event, hand it to the hook runner (dropped and counted when its queue is full) and
        ask for a snapshot that carries it."""
        log.info("event %s %s", ev.name, json.dumps(ev.payload))
        if self._hooks:
            try:
                self._event_send.send_nowait(ev)
            except trio.WouldBlock:
                self.events_dropped += 1
        self._publish_wanted = True

    def publish_to(self, node_id: str) -> None:
        """Publish a new snapshot now and start a gossip exchange with ``node_id`` outside the round, for news a
        peer is waiting on (a sync receipt: the sender counts it only from our signed snapshot). A no-op for
        an unknown member, while leaving, or before the gossip loop runs."""
        e = self.state.get(node_id)
        if self.leaving or e is None or not e.addr or self._gossip_nursery is None:
            self.request_publish()
            return
        self.publish()
        self._gossip_nursery.start_soon(self._exchange, e.addr)  # one per commit: bounded by the commit rate

    def request_publish(self) -> None:
        """Ask for a new snapshot soon (within ``MIN_PUBLISH_GAP_S``): something peers should see changed."""
        self._publish_wanted = True

    def admits(self, kind: str, priority: OperationPriority | int = OperationPriority.NORMAL) -> tuple[bool, str]:
        """May work of ``kind`` and ``priority`` start here now (see :func:`p2pnode.guard.admission`)?"""
        if self.assessment is None:
            return True, ""
        return admission(self.assessment, self.tracker.level, self.limits, kind=kind, priority=priority)

    def cleanup_pass(self, *, dry_run: bool | None = None, replicated=None) -> dict[str, Any]:
        """One disk-manager pass over the data dir (blocking I/O: run it in a thread from trio code, with
        ``replicated`` from :meth:`p2pnode.sync.SyncService.replicated_predicate` taken in the trio thread)."""
        dry = self.limits.cleanup == "dry-run" if dry_run is None else dry_run
        pred = replicated if replicated is not None else (lambda path: False)
        self.last_cleanup = run_cleanup(self.data_dir, self.limits, dry_run=dry, replicated=pred)
        return self.last_cleanup

    async def _guard_loop(self) -> None:
        while True:
            await trio.sleep(self.limits.check_interval_s)
            self.guard_check()
            if (
                self.limits.cleanup != "off"
                and self.last_sample is not None
                and self.last_sample.disk_percent >= self.limits.disk_warn_percent
            ):
                pred = self.sync.replicated_predicate()
                await trio.to_thread.run_sync(functools.partial(self.cleanup_pass, replicated=pred))

    async def _hook_loop(self) -> None:
        """Run event hooks one at a time: ``script EVENT`` with the event's JSON on stdin, killed after
        ``hook_timeout_s`` (Serf's event-handler contract)."""
        async for ev in self._event_recv:
            for pattern, script in self._hooks:
                if pattern not in ("*", ev.name):
                    continue
                self.hook_runs += 1
                payload = json.dumps({"node_id": self.node_id, **ev.to_wire()}).encode()
                try:
                    with trio.fail_after(self.limits.hook_timeout_s):
                        r = await trio.run_process([script, ev.name], stdin=payload, capture_stdout=True,
                                                   capture_stderr=True, check=False)
                    if r.returncode != 0:
                        self.hook_failures += 1
                        log.warning("hook %s for %s exited %d: %s", script, ev.name, r.returncode,
                                    r.stderr.decode(errors="replace")[-500:])
                except (trio.TooSlowError, OSError) as exc:
                    self.hook_failures += 1
                    log.warning("hook %s for %s failed: %s", script, ev.name, exc or "timed out")

    def events_view(self) -> dict[str, Any]:
        """This node's recent events, and the recent events every member carries in its snapshot."""
        cluster = []
        for e in self.state.entries():
            for ev in e.snapshot.get("events", []) or []:
                if isinstance(ev, dict):
                    cluster.append({"node_id": e.origin, **ev})
        cluster.sort(key=lambda ev: ev.get("at", 0), reverse=True)
        return {"node_id": self.node_id, "events": [e.to_wire() for e in reversed(self.monitor.log.recent())],
                "cluster": cluster}

    def guard_view(self) -> dict[str, Any]:
        a = self.assessment
        kinds = ("training", "selfplay", "evaluation")
        return {
            "level": self.tracker.level,
            "level_changes": self.tracker.changes,
            "assessment": a.to_dict() if a else None,
            "admits": {k: dict(zip(("ok", "reason"), self.admits(k, OperationPriority.NORMAL))) for k in kinds},
            "last_cleanup": self.last_cleanup,
            "hooks": {"configured": len(self._hooks), "runs": self.hook_runs, "failures": self.hook_failures},
        }

    # -- views -------------------------------------------------------------------------------------
    def members_view(self) -> list[dict[str, Any]]:
        now = self.now()
        out = []
        for e in self.state.entries():
            s = e.snapshot
            out.append(
                {
                    "id": e.origin,
                    "self": e.origin == self.node_id,
                    "addr": e.addr,
                    "version": e.version,
                    "state": (self.membership.state_of(e.origin) or MemberState.ALIVE).value,
                    "incarnation": s.get("incarnation", 0),
                    "vote": s.get("vote"),
                    "catalog_digest": s.get("catalog_digest", ""),
                    "age_s": round(max(0.0, now - e.received_at), 3),
                    "leaving": e.leaving,
                    "tags": s.get("tags", []),
                    "power_score": rank_of_gpus((g.get("name", ""), g.get("mem_total_bytes", 0))
                                                for g in s.get("resources", {}).get("gpus", []))[0],
                    "resources": s.get("resources", {}),
                    "sync": _sync_summary(s.get("sync") or {}),
                }
            )
        return out

    def status_view(self) -> dict[str, Any]:
        now = self.now()
        own = self.state.get(self.node_id)
        return {
            "node": {
                "id": self.node_id,
                "addr": self.addr,
                "version": own.version if own else None,
                "agent_version": self.agent_version,
                "started_at": self.started_at,
                "uptime_s": round(time.time() - self.started_at, 3),
                "trust": self.config.agent.trust,
                "cluster_open": self.config.agent.trust == "open",
                "keyring": {"primary": self.keyring.primary, "key_ids": sorted(self.keyring.tokens)}
                if self.keyring else None,
                "request_auth": {"accepted": self.request_auth.accepted, "refused": dict(self.request_auth.refused),
                                 "reads_refused": self.read_refusals},
                "tags": list(self.config.agent.tags),
                "data_dir": str(self.data_dir),
                "leaving": self.leaving,
                "incarnation": self.membership.incarnation,
            },
            "election": {
                "leader": self.election.view.leader,
                "term": self.election.view.term,
                "highest_term": self.election.view.highest_term,
                "vote": self.election.vote.to_wire() if self.election.vote else None,
                "votes_for_leader": self.election.view.votes_for_leader,
                "quorum": self.election.view.quorum,
                "voters": self.election.view.voters,
                "leader_changes": self.leader_changes,
                "implausible_votes": self.election.implausible_votes,
                "roll": {"voters": sorted(self.roll.members)[:256], "size": len(self.roll.members),
                         "not_admitted": sorted(self.roll.refused)[:64],
                         "removed": sorted(self.roll.removed)[:64]},
            },
            "membership": {
                "profile": self.config.gossip.profile,
                "size": self.membership.size,
                "publish_interval_s": publish_interval_s(self.membership.size, self.membership_config),
                "suspects": self.membership.suspects(),
                "refutations": self.membership.false_suspicions_refuted,
                "implausible_suspicions": self.membership.implausible_suspicions,
                "max_members": self.state.max_members,
            },
            "catalog": {
                "path": self.config.agent.catalog or None,
                "digest": self.catalog.digest if self.catalog else None,
                "templates": len(self.catalog.templates) if self.catalog else 0,
                "mismatch": self.catalog_mismatch(),
            },
            "snapshot": _jsonable(own.snapshot) if own else None,
            "members": self.members_view(),
            "gossip": {
                "interval_s": self.membership_config.gossip_interval_s,
                "fanout": self.config.gossip.fanout,
                "exchanges_ok": self.gossiper.exchanges_ok,
                "exchanges_failed": self.gossiper.exchanges_failed,
                "signature_verifications": self.state.verifications,
                "quarantines": self.state.quarantines,
                "quarantined": dict(list(self.state.quarantined.items())[-16:]),
                "rejected": {r.value: n for r, n in sorted(self.state.rejected.items())},
                "busy": self.gossip_busy,
                "rate_limited": self.inbound_bytes.refused,
                "http_clients_gone": self.http_clients_gone,
                "candidates": [{"addr": c.addr, "source": c.source, "failures": c.failures}
                               for c in self.peers.candidates()],
                "candidates_dropped": self.peers.candidates_dropped,
                "peers": [
                    {
                        "addr": p.addr,
                        "source": p.source,
                        "node_id": p.node_id,
                        "failures": p.failures,
                        "last_ok_age_s": round(now - p.last_ok_at, 3) if p.last_ok_at is not None else None,
                        "left": p.left,
                    }
                    for p in self.peers.all()
                ],
            },
            "discovery": {
                "mdns": self.config.discovery.mdns,
                "mdns_interfaces": self.mdns.interfaces if self.mdns else [],
                "mdns_found": self.mdns.found if self.mdns else 0,
                "mdns_error": self.mdns_error,
                "join": list(self.config.agent.join),
            },
        }

    # -- addresses ---------------------------------------------------------------------------------
    def _advertise(self, port: int) -> str:
        adv = self.config.agent.advertise
        if adv:
            host, p = parse_hostport(adv, default_port=port)
            return _hostport(host, p)
        bind = self.config.agent.bind
        if not _is_unspecified(bind):
            return _hostport(bind, port)
        local = local_ipv4_addresses()
        return _hostport(local[0] if local else "127.0.0.1", port)

    def _mdns_interfaces(self) -> list[str]:
        d = self.config.discovery
        if d.mdns_interfaces:
            return list(d.mdns_interfaces)
        bind = self.config.agent.bind
        if not _is_unspecified(bind):
            return [bind]
        return local_ipv4_addresses()

    # -- drivers -----------------------------------------------------------------------------------
    async def _sample_loop(self) -> None:
        """Sample every ``sample_interval_s``; publish a heartbeat when :meth:`heartbeat_due`."""
        interval = self.config.agent.sample_interval_s
        while True:
            await trio.sleep(interval)
            try:
                self.last_sample = await trio.to_thread.run_sync(self.sampler.sample)  # NVML calls may block
            except OSError as exc:  # e.g. EMFILE while a flood holds descriptors: skip this sample, keep beating
                self.sample_failures += 1
                log.warning("resource sample failed (%s); keeping the previous one", exc)
            self.reload_keyring()
            if self.heartbeat_due(self.now()) and not self.leaving:
                self.publish()

    async def _reconcile_loop(self) -> None:
        """Membership timeouts and election, four times per gossip interval."""
        step = self.membership_config.gossip_interval_s / 4
        while True:
            self.reconcile()
            await trio.sleep(step)

    async def _post(self, addr: str, body: bytes, timeout_s: float) -> httpx.Response:
        assert self._client is not None
        self.gossip_bytes_sent += len(body)
        resp = await self._client.post(
            f"http://{addr}/gossip", content=body, headers={"content-type": "application/msgpack"}, timeout=timeout_s
        )
        self.gossip_bytes_received += len(resp.content)
        return resp

    async def _verified_reply(self, resp: httpx.Response) -> Any:
        """Decode and verify a gossip reply in a worker thread (signature checks never stall the event loop)."""
        return await trio.to_thread.run_sync(
            self.gossiper.verify_reply, resp.status_code, resp.headers.get("content-type", ""), resp.content,
            limiter=self.verify_limiter,
        )

    def _request_token(self, key_id: str) -> str | None:
        return self.keyring.token_of(key_id) if self.keyring is not None else None

    def _node_key(self, node_id: str) -> bytes | None:
        """A member's public key from its signed snapshot (ours from our identity)."""
        if node_id == self.node_id:
            return self.identity.public_key
        e = self.state.get(node_id)
        return e.envelope.key if e is not None else None

    def reload_keyring(self) -> bool:
        """Reload ``keyring.json`` when it changed (``p2pnode keys`` on this node). Returns True when the accepted
        tokens or the primary changed; a new primary is published at once (re-endorsement without restart).
        A malformed file is logged and the keyring in memory kept."""
        if self.keyring is None:
            return False
        mtime = Keyring.mtime_ns(self.keyring_path)
        if mtime == self._keyring_mtime:
            return False
        self._keyring_mtime = mtime
        try:
            ring = Keyring.load(self.keyring_path)
        except KeyringError as exc:
            log.error("keeping the keyring in memory: %s", exc)
            return False
        if ring is None or not ring.tokens:
            log.error("keyring file %s is gone or empty: keeping the keyring in memory", self.keyring_path)
            return False
        old = (self.keyring.primary, set(self.keyring.tokens))
        if (ring.primary, set(ring.tokens)) == old:
            return False
        self.keyring.tokens, self.keyring.primary = ring.tokens, ring.primary
        log.warning("keyring reloaded: %d accepted token(s) %s, primary %s", len(ring.tokens), sorted(ring.tokens),
                    ring.primary)
        if ring.primary != old[0]:
            self._publish_wanted = True
            if not self.leaving:
                self.publish()
        return True

    def authenticate(self, header: str | None, method: str, target: str, body: bytes, *,
                     operator: bool = False) -> str | None:
        """Check a state-changing request's ``x-p2pnode-auth`` header (:mod:`p2pnode.reqauth`). Token mode: an
        HMAC with a keyring token. Open mode: nothing for ordinary routes (a trusted LAN), but an ``operator``
        route (the voter roll) needs a signature by the key of this node or of a voter on the roll. Returns
        ``None`` when accepted, else the refusal reason (counted)."""
        if self.keyring is None and not operator:
            return None
        if self.keyring is not None:
            schemes, signers = ("v1",), None
        else:
            schemes, signers = ("k1",), (lambda n: n == self.node_id or n in self.roll.members)
        try:
            self.request_auth.verify(header, method, target, body, time.time(), schemes=schemes, signers=signers)
        except RequestAuthError as exc:
            log.info("refused a %s %s: %s", method, target, exc)
            return exc.reason
        return None

    def count_client_gone(self) -> None:
        self.http_clients_gone += 1

    def admit_gossip(self, host: str, declared_bytes: int | None) -> bool:
        """Whether ``host`` may send a gossip body of ``declared_bytes`` now (its byte bucket; an undeclared
        length is charged as a full ``max_body_bytes``). False: answer 429 without reading the body."""
        cost = declared_bytes if declared_bytes is not None else self.config.gossip.max_body_bytes
        return self.inbound_bytes.take(host, min(cost, self.config.gossip.max_body_bytes), self.now())

    async def handle_gossip(self, body: bytes) -> Any:
        """Answer an inbound ``POST /gossip`` body: decode and verify in a worker thread (within the per-message
        and the per-second signature budgets), then install here."""
        budget = int(min(self.config.gossip.max_verifications_per_message,
                         max(0.0, self.inbound_verifications.available("", self.now()))))
        prepared = await trio.to_thread.run_sync(self.gossiper.verify_request, body, budget,
                                                 limiter=self.verify_limiter)
        if prepared.verified is not None:
            self.inbound_verifications.charge("", prepared.verified.verifications, self.now())
        return self.gossiper.finish_request(prepared, self.now())

    async def _exchange(self, addr: str) -> None:
        timeout = self.config.gossip.request_timeout_s
        try:
            resp = await self._post(addr, self.gossiper.open_request(), timeout)
            push = self.gossiper.finish_reply(addr, await self._verified_reply(resp), self.now())
            if push is not None:
                resp = await self._post(addr, push, timeout)
                self.gossiper.finish_reply(addr, await self._verified_reply(resp), self.now(), push=False)
        except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
            # ValueError: an address that cannot be dialled (e.g. UnicodeError from IDNA on a bad host name);
            # the peer book only holds validated addresses, this is the driver's own line of defence.
            log.debug("gossip with %s failed: %s", addr, exc)
            self.gossiper.on_failure(addr, self.now())

    async def _exchange_tracked(self, addr: str) -> None:
        try:
            await self._exchange(addr)
        finally:
            self._inflight.discard(addr)

    async def _gossip_loop(self, nursery: trio.Nursery) -> None:
        """Every interval (±10 % jitter) start an exchange with each chosen peer. Exchanges run concurrently and
        are not awaited, so one slow peer never stretches the round; a peer still busy is skipped."""
        interval = self.membership_config.gossip_interval_s
        self._gossip_nursery = nursery
        while True:
            self.gossip_rounds += 1
            for addr in self.gossiper.choose_targets(self.now()):
                if addr not in self._inflight:
                    self._inflight.add(addr)
                    nursery.start_soon(self._exchange_tracked, addr)
            await trio.sleep(interval * self.rng.uniform(0.9, 1.1))

    def _save_peers(self) -> None:
        good = [(p.addr, p.node_id) for p in self.peers.known_good() if not p.left]
        try:
            save_peers(self.data_dir, good)
        except OSError as exc:
            log.warning("cannot write peers file: %s", exc)

    async def _peers_file_loop(self) -> None:
        while True:
            await trio.sleep(self.config.discovery.peers_file_interval_s)
            self._save_peers()

    def _on_mdns_found(self, addr: str, node_id: str) -> None:
        if self.peers.get(addr) is None and addr not in {c.addr for c in self.peers.candidates()}:
            log.info("mDNS: found %s at %s (a candidate until its signed snapshot arrives)", node_id, addr)
        self.peers.add_candidate(addr, "mdns", self.now(), node_id=node_id)

    async def _run_mdns(self, interfaces: list[str], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.mdns = MdnsDiscovery(node_id=self.node_id, port=self.port, interfaces=interfaces, on_found=self._on_mdns_found)
        try:
            await self.mdns.run(task_status=task_status)
        except OSError as exc:
            self.mdns_error = f"{exc.__class__.__name__}: {exc}"
            log.warning("mDNS discovery stopped: %s", self.mdns_error)
            task_status.started()

    async def _leave(self) -> None:
        """Publish a final ``leaving`` snapshot and push it to up to ``fanout`` peers, bounded in time."""
        self.leaving = True
        self.publish()
        body = self.gossiper.leave_request()
        with trio.move_on_after(self.config.gossip.leave_timeout_s):
            async with trio.open_nursery() as n:
                for addr in self.peers.choose(max(self.config.gossip.fanout, 3), self.now(), self.rng):
                    n.start_soon(self._leave_one, addr, body)

    async def _leave_one(self, addr: str, body: bytes) -> None:
        try:
            await self._post(addr, body, self.config.gossip.leave_timeout_s)
        except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError):
            pass

    def stop(self) -> None:
        """Ask :meth:`run` to leave the cluster and return (within about ``leave_timeout_s`` + 0.5 s)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(self, *, task_status: trio.TaskStatus[Agent] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until :meth:`stop`; ``started(self)`` once HTTP is bound and the first snapshot published."""
        a = self.config.agent
        # Signature checks run in a worker thread; with CPython's default 5 ms switch interval the event loop
        # waits up to 5 ms for the GIL each time it wakes while a check runs, which made /status p99 climb to
        # ~100 ms under a gossip flood. 1 ms hands the loop the GIL sooner at a small cost in switches.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        _raise_open_files_limit()
        hc = HypercornConfig()
        hc.bind = [_hostport(a.bind, a.port)]
        hc.graceful_timeout = 0.5
        hc.read_timeout = 30  # seconds without a byte from a connection with a request under way: closed
        hc.accesslog = None
        hc.errorlog = logging.getLogger("hypercorn.error")
        shutdown = trio.Event()
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
        async with httpx.AsyncClient(limits=limits, trust_env=False) as client:
            self._client = client
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(functools.partial(serve, create_app(self), hc, shutdown_trigger=shutdown.wait))
                self.port = int(binds[0].rsplit(":", 1)[1])
                self.addr = self._advertise(self.port)
                self.gossiper.self_addr = self.addr
                self.peers.self_addrs |= {self.addr, _hostport("127.0.0.1", self.port), _hostport("localhost", self.port)}
                for addr in a.join:
                    host, port = parse_hostport(addr, default_port=8770)
                    self.peers.add(_hostport(host, port), "join")
                if self.config.discovery.peers_file:
                    for addr, nid in load_peers(self.data_dir):
                        self.peers.add(addr, "peers-file", node_id=nid)
                self.sample()
                self.guard_check()
                self.publish()
                log.info("agent %s serving on %s (advertising %s)", self.node_id, ", ".join(binds), self.addr)
                nursery.start_soon(self._sample_loop)
                nursery.start_soon(self._reconcile_loop)
                nursery.start_soon(self._guard_loop)
                if self._hooks:
                    nursery.start_soon(self._hook_loop)
                if self.jobs is not None:
                    await nursery.start(self.jobs.run)
                await nursery.start(self.sync.run)
                nursery.start_soon(self._gossip_loop, nursery)
                if self.config.discovery.peers_file:
                    nursery.start_soon(self._peers_file_loop)
                if self.config.discovery.mdns:
                    interfaces = self._mdns_interfaces()
                    if interfaces:
                        await nursery.start(self._run_mdns, interfaces)
                    else:
                        self.mdns_error = "no non-loopback IPv4 interface to announce on"
                        log.warning("mDNS disabled: %s", self.mdns_error)
                task_status.started(self)
                await self._stop.wait()
                log.info("agent %s leaving", self.node_id)
                await self._leave()
                log.debug("leave announced")
                if self.config.discovery.peers_file:
                    self._save_peers()
                shutdown.set()
                nursery.cancel_scope.cancel()
            log.debug("tasks stopped")
            self.sampler.gpu_source.close()
