"""A cluster of real membership and election cores on a virtual clock and a seeded in-memory network.

Every simulated node runs the agent's own :class:`p2pnode.gossip._membership.Membership` and
:class:`p2pnode.election.Election`. What is modelled rather than run is the byte layer: instead of signed
envelopes, each node holds a version vector (row ``V[i]``: the newest version of every origin it holds) and
the network carries versions; the content of origin k's version v (its incarnation, suspicions, vote,
``leaving``) is looked up in a table of what k published. Every version a node accepts counts as one
signature verification, as in the agent (stale versions are dropped before verifying). Message sizes are
accounted with the real encoded sizes of a digest entry and of a sealed snapshot.

Time advances in gossip rounds. In a round every running node exchanges with ``fanout`` peers it believes
alive or suspect (and, with probability ``redial_probability``, with one member it believes dead, as the
agent keeps dialling dead members with backoff): push-pull in three messages (the third carries news only, as
the agent's: see :func:`p2pnode.gossip.carries_news`), each lost with probability
``loss``, none crossing a partition, each arriving ``latency_s`` after it is sent. Then every node applies
timeouts, recomputes its vote and publishes when its heartbeat is due or its vote, suspicions or incarnation
changed: each node is the agent's own :class:`p2pnode.node.NodeCore` (``reconcile``, ``publish_due``,
``published``), so the simulator and the agent run one policy.

With ``push_pull_s`` > 0 the byte layer models partial digests as :class:`p2pnode.gossip.Gossiper` sends them
(:mod:`p2pnode.gossip._protocol`): each node keeps a news log (the exchange at which it last took each origin's
version), and between full push-pulls (every :func:`p2pnode.gossip.push_pull_interval` of ``push_pull_s``, and
after a failed exchange with that peer) a message names only the origins changed within the retransmit window
(at most 256), the reply names the receiver's own recent origins and those it lacks among the named, and the third
message pushes what the peer lacks among them and asks (``want``) for what it holds newer.

With ``open_rolls`` the cores run open mode with their voter rolls (published in the ``roll`` section) instead
of a voter set fixed in advance, nodes may start later for the first time with operator-given peers
(:meth:`ClusterSim.start`: the roll adoption of :class:`p2pnode.node.NodeCore`), and a hostile member may
publish a vote of its choosing (:meth:`ClusterSim.forge_vote`).
"""

from __future__ import annotations

import random
from array import array
from collections import defaultdict

import msgspec
import numpy as np

from ..election import Candidate, MemberInfo, Vote, VoterRoll
from ..gossip import MemberIndex, MembershipConfig, MemberState, publish_interval_s
from ..gossip._members import CODES
from ..gossip._protocol import MAX_RECENT, push_pull_interval, retransmit_window
from ..node import CoreStore, MemoryStore, NodeCore
from ..snapshot import RollSection

__all__ = ["ClusterSim", "Published", "SimCounters"]

ALIVE = MemberState.ALIVE
LIVE_CODES = (CODES[MemberState.ALIVE], CODES[MemberState.SUSPECT])
DEAD_CODE = CODES[MemberState.DEAD]


class Published(msgspec.Struct, frozen=True):
    """What an origin's snapshot version carries that the cores read."""

    incarnation: int
    leaving: bool
    suspects: dict[str, int]
    vote: Vote | None
    roll: RollSection | None = None


class SimCounters(msgspec.Struct):
    """What a simulation run counted: messages and bytes sent, signature verifications, false suspicions and deaths (a
    running node marked by a running observer), the leaders seen per term.
    """
    messages: int = 0
    bytes: int = 0
    verifications: int = 0
    false_suspicions: int = 0  # a running node marked suspect by a running observer
    false_deaths: int = 0  # a running node marked dead by a running observer
    leaders_per_term: dict[int, set[str]] = msgspec.field(default_factory=lambda: defaultdict(set))


class ClusterSim:
    """``n`` nodes; node ``i`` has id ``n%05d``, power score ``powers[i]`` and VRAM ``vram[i]`` bytes.

    ``voters``: indexes of nodes tagged ``voter`` (``None``: no tags, every member votes). Everyone starts
    knowing everyone (a converged cluster, version 1 of each) and with no vote. ``digest_entry_bytes`` and
    ``snapshot_bytes`` size the messages. ``leader_settle_s`` is the node core's (the agent's default is 120 s;
    0 here keeps the published figures comparable).

    ``open_rolls``: open mode with voter rolls (see the module docstring): the nodes of ``voters`` start with a
    closed roll naming them (an established cluster), the others are members the rolls refused; ``tags`` adds
    tags per node index (a member that claims ``voter``); nodes of ``absent`` are not started and unknown to
    every node until :meth:`start`.
    """

    def __init__(
        self,
        n: int,
        *,
        seed: int = 0,
        fanout: int = 3,
        loss: float = 0.0,
        latency_s: float = 0.001,
        cfg: MembershipConfig | None = None,
        powers: list[float] | None = None,
        vram: list[int] | None = None,
        voters: list[int] | None = None,
        redial_probability: float = 0.25,
        digest_entry_bytes: int = 22,
        snapshot_bytes: int = 1200,
        leader_settle_s: float = 0.0,
        open_rolls: bool = False,
        tags: dict[int, tuple[str, ...]] | None = None,
        absent: tuple[int, ...] = (),
        push_pull_s: float = 0.0,
    ) -> None:
        self.n = n
        self.push_pull_s = push_pull_s
        self.open_rolls = open_rolls
        self.extra_tags = dict(tags or {})
        self._tag_of: dict[int, tuple[str, ...]] = {}  # _tags, per node (the voters and the tags are fixed)
        self.seeds: dict[int, list[int]] = {}  # node -> the peers its operator gave it (join addresses)
        self.forged: dict[int, Vote] = {}  # node -> the vote it publishes instead of its own
        self.rng = random.Random(seed)
        self.fanout = fanout
        self.loss = loss
        self.latency_s = latency_s
        self.cfg = cfg or MembershipConfig()
        self.interval = self.cfg.gossip_interval_s
        self.ids = [f"n{i:05d}" for i in range(n)]
        self.index = {nid: i for i, nid in enumerate(self.ids)}
        self.member_index = MemberIndex(self.ids)  # every node's member table is keyed by this one (slot = index)
        self.powers = powers or [float(self.rng.choice((2500, 2000, 624, 419, 330, 51, 0))) for _ in range(n)]
        self.vram = vram or [int(p * 1e8) for p in self.powers]
        self.voter_ids = {self.ids[i] for i in voters} if voters is not None else None
        self.redial_probability = redial_probability
        self.digest_entry_bytes = digest_entry_bytes
        self.snapshot_bytes = snapshot_bytes
        self.leader_settle_s = leader_settle_s
        self.now = 0.0
        self.running = [True] * n
        self.group = [0] * n  # partition group; messages cross groups never
        self.counters = SimCounters()
        self.V = np.zeros((n, n), dtype=np.int32)  # versions here stay far below 2^31 (numpy refuses one above)
        self.published: list[dict[int, Published]] = [{} for _ in range(n)]
        self.incarnation = [1] * n
        self.candidates = [Candidate(self.ids[i], self.powers[i], self.vram[i]) for i in range(n)]
        self.cores = [self._core(i, 1, None, MemoryStore(version=1), roll=self._initial_roll()) for i in range(n)]
        pub_every = publish_interval_s(n, self.cfg)
        for k in range(n):
            self.published[k][1] = Published(1, False, {}, None, self._roll_of_core(k))
            self.cores[k].last_publish_at = -self.rng.uniform(0, pub_every)  # heartbeats spread over the interval
        self.V[:, :] = 1
        self.news = np.ones(n, dtype=np.int32)  # per origin: the newest version that carried news (pushed at once)
        # The origins whose news some node may lack (a superset of those k with V[x, k] < news[k] for some x, sorted;
        # None: to be computed), and the origins whose news rose since it was: see _news_lacking.
        self._lacking: np.ndarray | None = None
        self._news_rose: set[int] = set()
        # Partial digests (push_pull_s > 0): exchanges per node, the exchange at which node i last took origin k's
        # version (the news log), when each node's next full exchange is due, the (i, j) whose last exchange failed.
        self.ticks = np.zeros(n, dtype=np.int64)
        # (read only by partial digests: without them no n x n table is kept)
        self.changed = np.full((n, n) if push_pull_s > 0 else (0, 0), -(1 << 40), dtype=np.int64)
        every = push_pull_interval(n, push_pull_s) if push_pull_s > 0 else 0.0
        self.next_full = [self.rng.uniform(0, every) for _ in range(n)] if every else [0.0] * n
        self.failed: set[tuple[int, int]] = set()
        self._views: dict[int, tuple] = {}  # node -> (its membership, its change count, live, dead): _live_dead
        for a in absent:
            self.running[a] = False
            self.V[a, :] = 0
            self.V[:, a] = 0
            self.published[a] = {}
        for i in range(n):
            if i in absent:
                continue
            self.cores[i].membership.met([self.ids[k] for k in range(n) if k != i and k not in absent], 1, 1, 0.0)

    def _core(self, i: int, incarnation: int, vote: Vote | None, store: CoreStore, *,
              roll: VoterRoll | None = None, seeds: list[int] | None = None) -> NodeCore:
        nid = self.ids[i]
        if self.open_rolls:
            core = NodeCore(nid, config=self.cfg, store=store, info=lambda k: self._info(i, self.index[k]),
                            roll_candidates=lambda: self._roll_candidates(i), incarnation=incarnation, vote=vote,
                            roll=roll, tags=self._tags(i), trusted=False, leader_settle_s=self.leader_settle_s,
                            expect_peers=bool(seeds), seed_peers=bool(seeds),
                            roll_of=lambda k: self._roll_seen(i, self.index[k]), member_index=self.member_index)
        else:
            voter = self.voter_ids is None or nid in self.voter_ids
            core = NodeCore(nid, config=self.cfg, store=store, info=lambda k: self._info(i, self.index[k]),
                            roll_candidates=lambda: (), incarnation=incarnation, vote=vote,
                            tags=self._tags(i), trusted=True,
                            is_voter=voter, known_voters=self.voter_ids, leader_settle_s=self.leader_settle_s,
                            member_index=self.member_index)
        core.set_rank(self.powers[i], self.vram[i])
        return core

    def _initial_roll(self) -> VoterRoll | None:
        """The roll every node of an established open-mode cluster holds: the voters, closed."""
        if not self.open_rolls:
            return None
        return VoterRoll(trusted=False, created_at=0.0, voters=set(self.voter_ids or ()), closed=True)

    def _roll_of_core(self, k: int) -> RollSection | None:
        return self.cores[k].roll_section(self.now) if self.open_rolls else None

    def _tags(self, k: int) -> tuple[str, ...]:
        """``k``'s tags: ``voter`` for the voters, then the extra ones (a claimed ``voter`` only with open rolls,
        where the roll decides; else the voter set is fixed)."""
        out = self._tag_of.get(k)
        if out is None:
            base = ("voter",) if self.voter_ids is not None and self.ids[k] in self.voter_ids else ()
            out = self._tag_of[k] = base + tuple(t for t in self.extra_tags.get(k, ())
                                                 if t not in base and (self.open_rolls or t != "voter"))
        return out

    def _roll_candidates(self, observer: int) -> list[tuple[str, tuple[str, ...], bool]]:
        """``(node id, tags, leaving)`` of every member ``observer`` holds a snapshot of."""
        return [(self.ids[k], self._tags(k), False) for k in np.nonzero(self.V[observer] > 0)[0].tolist()
                if k != observer]

    def _roll_seen(self, observer: int, k: int) -> RollSection | None:
        p = self.published[k].get(int(self.V[observer, k]))
        return p.roll if p is not None else None

    @property
    def memberships(self) -> list:
        """Each node's :class:`p2pnode.gossip.Membership` (its core's)."""
        return [c.membership for c in self.cores]

    @property
    def elections(self) -> list:
        """Each node's :class:`p2pnode.election.Election` (its core's)."""
        return [c.election for c in self.cores]

    # -- network ---------------------------------------------------------------------------------
    def _send(self, src: int, dst: int, entries: int, digest_entries: int | None = None) -> bool:
        """Account one message from ``src`` to ``dst`` carrying a digest of ``digest_entries`` (default: all
        ``n``) and ``entries`` snapshots; True if it arrives."""
        c = self.counters
        c.messages += 1
        d = self.n if digest_entries is None else digest_entries
        c.bytes += 48 + d * self.digest_entry_bytes + entries * self.snapshot_bytes
        return self.running[dst] and self.group[src] == self.group[dst] and self.rng.random() >= self.loss

    def _deliver(self, dst: int, origins: np.ndarray, src_row: np.ndarray, at: float) -> None:
        """``dst`` takes the versions of ``origins`` in ``src_row`` (the sender's own row, read before ``dst``'s
        row is written: no copy) that are newer than its own, one :meth:`Membership.heard_many` at ``at``."""
        m = self.cores[dst].membership
        row = self.V[dst]
        versions = src_row[origins]
        newer = versions > row[origins]  # (origins are distinct: one pass decides them all)
        origins, versions = origins[newer], versions[newer]
        row[origins] = versions
        if self.push_pull_s > 0:
            self.changed[dst, origins] = self.ticks[dst]
        self.counters.verifications += len(origins)
        published, ids = self.published, self.ids
        ks, vs = origins.tolist(), versions.tolist()
        ps = [published[k][v] for k, v in zip(ks, vs)]
        m.heard_many([ids[k] for k in ks], vs, [p.incarnation for p in ps], [p.leaving for p in ps],
                     [p.suspects for p in ps], at)  # (its own origin, k == dst, is ignored as observe ignores it)

    def _recent(self, i: int) -> np.ndarray:
        """Origins node ``i``'s recent digest names (as :meth:`p2pnode.gossip.Gossiper.recent_digest`), itself
        included; sorted."""
        c = self.changed[i]
        idx = np.nonzero(c >= self.ticks[i] - retransmit_window(self.n))[0]
        if len(idx) > MAX_RECENT:
            idx = idx[np.argsort(-c[idx], kind="stable")[:MAX_RECENT]]
        return np.union1d(idx, [i])

    def _exchange(self, i: int, j: int, at: float) -> None:
        if self.push_pull_s > 0 and at < self.next_full[i] and (i, j) not in self.failed:
            self._partial_exchange(i, j, at)
            return
        periodic = self.push_pull_s > 0 and at >= self.next_full[i]
        if periodic:  # (a full exchange after a failure is not the periodic one; a failed periodic one is due again)
            self.next_full[i] = at + push_pull_interval(self.n, self.push_pull_s)
        self.ticks[i] += 1
        self.ticks[j] += 1
        self.failed.add((i, j))  # until the reply arrives
        Vi, Vj = self.V[i], self.V[j]
        if not self._send(i, j, 1):
            if periodic:
                self.next_full[i] = at
            return
        self._deliver(j, np.array([i]), Vi, at + self.latency_s)
        lacking_i = np.nonzero(Vj > Vi)[0]
        if not self._send(j, i, len(lacking_i)):
            if periodic:
                self.next_full[i] = at
            return
        self.failed.discard((i, j))
        self._deliver(i, lacking_i, Vj, at + 2 * self.latency_s)
        # The third message carries news only (what i holds of it and j lacks); heartbeats spread by pull.
        act = self._news_lacking()
        lacking_j = act[(Vj[act] < self.news[act]) & (Vi[act] >= self.news[act])] if len(act) else act
        if len(lacking_j) and self._send(i, j, len(lacking_j)):
            self._deliver(j, lacking_j, Vi, at + 3 * self.latency_s)

    def _news_lacking(self) -> np.ndarray:
        """The origins (sorted, int64) some node's row holds below their news version: every ``k`` with
        ``V[x, k] < news[k]`` for some ``x`` is in it (what the third message of :meth:`_exchange` reads, instead
        of three passes over two N-long rows). Versions only rise and ``news`` only in :meth:`publish`, so an origin
        not in it stays out until its news rises: recomputed over the last set and the origins whose news rose
        since, by row blocks of the version table."""
        if self._lacking is not None and not self._news_rose:
            return self._lacking
        cand = np.union1d(self._lacking if self._lacking is not None else np.arange(self.n),
                          np.fromiter(self._news_rose, dtype=np.int64, count=len(self._news_rose)))
        self._news_rose.clear()
        wide = 4 * len(cand) > self.n  # (then whole rows: a contiguous pass beats the gather)
        cols, want = (slice(None), self.news) if wide else (cand, self.news[cand])
        lack = np.zeros(self.n if wide else len(cand), dtype=bool)
        if len(cand):
            for r in range(0, self.n, 256):
                lack |= (self.V[r:r + 256][:, cols] < want).any(axis=0)
        self._lacking = cand[lack[cand]] if wide else cand[lack]
        return self._lacking

    def _partial_exchange(self, i: int, j: int, at: float) -> None:
        """One exchange by partial digests (see the module docstring), accounted and delivered as the full one."""
        Vi, Vj = self.V[i], self.V[j]
        self.ticks[i] += 1
        named = self._recent(i)
        own = bool(self.changed[i, i] >= self.ticks[i] - retransmit_window(self.n))
        self.failed.add((i, j))
        if not self._send(i, j, int(own), len(named)):
            return
        if own:
            self._deliver(j, np.array([i]), Vi, at + self.latency_s)
        self.ticks[j] += 1
        lacking_i = named[Vj[named] > Vi[named]]
        # j's digest: its recent entries i did not name, and those i named at a version j lacks
        reply_named = np.union1d(np.setdiff1d(self._recent(j), named), named[Vj[named] < Vi[named]])
        if not self._send(j, i, len(lacking_i), len(reply_named)):
            return
        self.failed.discard((i, j))
        self._deliver(i, lacking_i, Vj, at + 2 * self.latency_s)
        push = reply_named[Vi[reply_named] > Vj[reply_named]]
        want = reply_named[Vj[reply_named] > Vi[reply_named]]
        if not (len(push) or len(want)) or not self._send(i, j, len(push), len(want)):
            return
        self._deliver(j, push, Vi, at + 3 * self.latency_s)
        self.ticks[j] += 1
        if self._send(j, i, len(want), 0):
            self._deliver(i, want, Vj, at + 4 * self.latency_s)

    def _live_dead(self, i: int) -> tuple[array[int], array[int]]:
        """The members node ``i`` believes alive or suspect, and those dead (indexes, in its members' order); kept
        per node until its membership changes (:attr:`p2pnode.gossip.Membership.changes`; int32 arrays, 4 bytes a
        member: N² in all). Not to be mutated."""
        m = self.cores[i].membership
        cached = self._views.get(i)
        if cached is not None and cached[0] is m and cached[1] == m.changes:
            return cached[2], cached[3]
        t = m.members.table  # (slot k is node k: every table is keyed by self.member_index)
        st = np.frombuffer(t.state, dtype=np.int8)
        live_at, dead_at = np.nonzero((st == LIVE_CODES[0]) | (st == LIVE_CODES[1]))[0], np.nonzero(st == DEAD_CODE)[0]
        if not t.ordered:  # in the members' order, as the membership lists them
            seq = np.frombuffer(t.seq, dtype=np.int64)
            live_at, dead_at = live_at[np.argsort(seq[live_at])], dead_at[np.argsort(seq[dead_at])]
        live, dead = array("i", live_at.astype(np.int32).tobytes()), array("i", dead_at.astype(np.int32).tobytes())
        self._views[i] = (m, m.changes, live, dead)
        return live, dead

    def _targets(self, i: int) -> list[int]:
        live, dead = self._live_dead(i)
        pool: list[int] | array[int] = live
        seeds = self.seeds.get(i, ())
        if seeds:
            pool = list(live)
            for s in seeds:  # the operator-given peers are dialled like any known address
                if s not in pool:
                    pool.append(s)
        out = self.rng.sample(pool, min(self.fanout, len(pool)))
        if dead and self.rng.random() < self.redial_probability:
            out.append(self.rng.choice(dead))
        return out

    # -- node behaviour: the node core ---------------------------------------------------------------
    def publish(self, i: int) -> None:
        """Node ``i`` publishes a new snapshot version (what its core's sections hold now)."""
        core = self.cores[i]
        v = core.store.next_version()
        suspects = core.membership.suspects()
        p = Published(core.membership.incarnation, False, suspects, self.forged.get(i, core.election.vote),
                      self._roll_of_core(i))
        prev = self.published[i].get(int(self.V[i, i]))
        if prev is None or prev != p:  # as ClusterState.carries_news: more than a heartbeat
            self.news[i] = v
            self._news_rose.add(i)
        self.published[i][v] = p
        self.published[i].pop(v - 64, None)  # older versions can no longer be in flight
        self.V[i, i] = v
        if self.push_pull_s > 0:
            self.changed[i, i] = self.ticks[i]
        core.published(self.now, suspects)

    def _info(self, observer: int, k: int) -> MemberInfo | None:
        """What ``observer`` reads in its copy of ``k``'s snapshot."""
        p = self.published[k].get(int(self.V[observer, k]))
        if p is None:
            return None
        return MemberInfo(self.candidates[k], p.vote, self._tags(k))

    def _reconcile(self, i: int) -> None:
        core = self.cores[i]
        seeds = self.seeds.get(i)
        if seeds:
            answered = [self.ids[s] for s in seeds if self.V[i, s] > 0]
            core.seed_peers_answered(answered, all_answered=len(answered) == len(seeds))
        for ch in core.reconcile(self.now, self.now):
            j = self.index[ch.node_id]
            if self.running[j] and self.running[i]:
                if ch.new is MemberState.SUSPECT:
                    self.counters.false_suspicions += 1
                elif ch.new is MemberState.DEAD:
                    self.counters.false_deaths += 1
        view = core.view
        if view.leader is not None and view.term is not None:
            self.counters.leaders_per_term[view.term].add(view.leader)
        if core.publish_due(self.now):
            self.publish(i)

    # -- driving ---------------------------------------------------------------------------------
    def round(self) -> None:
        """One gossip interval: exchanges at random times within it, then every node reconciles."""
        t0 = self.now
        starts = []
        for i in range(self.n):
            if self.running[i]:
                for j in self._targets(i):
                    starts.append((t0 + self.rng.uniform(0, self.interval), i, j))
        starts.sort()
        for at, i, j in starts:
            self._exchange(i, j, at)
        self.now = t0 + self.interval
        for i in range(self.n):
            if self.running[i]:
                self._reconcile(i)

    def run_until(self, t: float) -> None:
        """Run gossip rounds until the virtual clock reaches ``t`` seconds."""
        while self.now < t - 1e-9:
            self.round()

    def kill(self, i: int) -> None:
        """Stop node ``i`` without a word (kill -9)."""
        self.running[i] = False

    def restart(self, i: int) -> None:
        """Start node ``i`` again with a new incarnation; it keeps its vote (persisted) and its version floor."""
        self.running[i] = True
        self.incarnation[i] += 1
        old = self.cores[i]
        core = self._core(i, self.incarnation[i], old.election.vote, old.store,
                          roll=old.roll if self.open_rolls else None)
        for k in range(self.n):
            if k != i:
                p = self.published[k].get(int(self.V[i, k]))
                if p is not None:
                    core.membership.observe(self.ids[k], version=int(self.V[i, k]), incarnation=p.incarnation,
                                            leaving=p.leaving, suspects=p.suspects, now=self.now)
        self.cores[i] = core
        self.publish(i)

    def start(self, i: int, seeds: list[int]) -> None:
        """Start node ``i`` (of ``absent``) for the first time: no persisted vote or roll, ``seeds`` the peers its
        operator gave it (join addresses)."""
        self.running[i] = True
        self.seeds[i] = list(seeds)
        self.cores[i] = self._core(i, 1, None, MemoryStore(), seeds=seeds)
        self.cores[i].last_publish_at = -1e9
        self.publish(i)

    def forge_vote(self, i: int, vote: Vote) -> None:
        """Node ``i`` (a hostile member) publishes ``vote`` from now on, whatever its core decides."""
        self.forged[i] = vote
        self.publish(i)

    def partition(self, groups: list[set[int]]) -> None:
        """Split the network: nodes in different ``groups`` cannot exchange. Unlisted nodes form group 0."""
        self.group = [0] * self.n
        for g, members in enumerate(groups, start=1):
            for i in members:
                self.group[i] = g

    def heal(self) -> None:
        """End every partition."""
        self.group = [0] * self.n

    # -- observations ----------------------------------------------------------------------------
    def leader_views(self, nodes: list[int] | None = None) -> dict[int, tuple[str | None, int | None]]:
        """``{node index: (leader, term)}`` of the running nodes (all, or ``nodes``)."""
        idx = range(self.n) if nodes is None else nodes
        views = ((i, self.cores[i].election.view) for i in idx if self.running[i])
        return {i: (v.leader, v.term) for i, v in views}

    def agreed_leader(self, nodes: list[int] | None = None) -> str | None:
        """The leader every running node (of ``nodes``) sees in one term, or None."""
        views = set(self.leader_views(nodes).values())
        if len(views) == 1:
            leader, _ = next(iter(views))
            return leader
        return None

    def all_see(self, target: int, state: MemberState) -> bool:
        """Whether every running node but ``target`` sees ``target`` in ``state``."""
        return all(
            self.cores[i].membership.state_of(self.ids[target]) is state
            for i in range(self.n)
            if self.running[i] and i != target
        )

    def strongest(self, nodes: list[int]) -> str:
        """The node id that ranks first among ``nodes`` (power score, VRAM, id)."""
        return max((self.candidates[i] for i in nodes), key=lambda c: (c.power_score, c.vram_bytes, c.node_id)).node_id
