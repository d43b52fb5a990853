"""The gossip driver: push-pull exchanges over HTTP, inbound gossip admission, the leave announcement, mDNS.

Trio and h11 (:mod:`._gossip_client`: kept-alive connections, bounded replies) only move bytes here; every
decision is in :class:`p2pnode.gossip.Gossiper` and :class:`p2pnode.gossip.ClusterState` (decode, verify, merge),
run on the event loop for small messages and in a worker thread for large ones (:data:`INLINE_VERIFY_BYTES`).

* Every gossip interval (+-10 % jitter) an exchange starts with each of ``fanout`` peers the peer book
  chooses (``idle_fanout`` in a quiet round: :mod:`p2pnode.gossip._idle`); exchanges run concurrently and are
  not awaited, so one slow peer never stretches the round.
* Inbound ``POST /gossip``: :meth:`GossipDriver.admit` charges the sender host's byte bucket before the body is
  read (429 when empty), :meth:`GossipDriver.slot` bounds concurrent requests (503 beyond), and
  :meth:`GossipDriver.handle` verifies within the per-message and per-second signature budgets.
* :meth:`GossipDriver.leave` pushes the final ``leaving`` snapshot to a few peers, bounded in time.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from ..config import Config
from ..discovery import load_peer_entries, save_peers
from ..gossip import Gossiper, PeerBook, TokenBuckets, parse_hostport
from ._gossip_client import GossipClient, GossipReplyBytes

if TYPE_CHECKING:
    from ..discovery._mdns import MdnsDiscovery

__all__ = ["GossipDriver", "hostport"]

log = logging.getLogger(__name__)

PEERS_FILE_CHECK_S = 0.5
"""Seconds from a peer's first answer to the write of the peers file (answers within it are written together)."""
INLINE_VERIFY_BYTES = 16384
"""Gossip bodies up to this size (bytes) are decoded and verified on the event loop: they hold about ten
snapshots at most (1-2 KB each; stale and duplicate ones are dropped before any signature check), whose checks
(~100 us each, so at most ~1.5 ms on the loop) cost less than handing them to a worker thread and back. Larger
bodies are verified in a worker thread, so a flood of big messages never stalls the loop; the per-second
signature budget bounds both."""


def hostport(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GossipDriver:
    """Moves gossip bytes for one node. ``now`` is the monotonic clock (trio's)."""

    def __init__(self, config: Config, gossiper: Gossiper, peers: PeerBook, *, node_id: str,
                 now: Callable[[], float], rng: random.Random) -> None:
        g = config.gossip
        self.config = config
        self.gossiper = gossiper
        self.peers = peers
        self.node_id = node_id
        self.now = now
        self.rng = rng
        self.verify_limiter = trio.CapacityLimiter(1)  # signature checks run in one worker thread at a time
        self.slots = trio.Semaphore(g.max_concurrent_requests)
        self.inbound_bytes = TokenBuckets(rate_per_s=g.max_inbound_bytes_per_s,
                                          burst=max(g.max_inbound_bytes_per_s, 2 * g.max_body_bytes))
        self.inbound_verifications = TokenBuckets(rate_per_s=g.max_verifications_per_s,
                                                  burst=max(g.max_verifications_per_s, g.max_verifications_per_message))
        # Kept below the server's 30 s keep-alive (agent.KEEPALIVE_S): with fanout 3 of N peers a peer is
        # contacted every N/3 s on average, so most exchanges reuse a connection instead of opening one.
        self.client = GossipClient(max_reply_bytes=g.max_body_bytes, keepalive_s=25.0)
        self.nursery: trio.Nursery | None = None
        self.mdns: MdnsDiscovery | None = None
        self.mdns_error: str | None = None
        self._inflight: set[str] = set()
        self._met = trio.Event()  # set when a peer answered for the first time since the peers file was written
        self._contacts_saved = 0
        self.rounds = 0
        self.quiet: Callable[[float], bool] | None = None
        """Whether the round at a time is quiet (``idle_fanout`` peers; the agent sets it:
        :func:`p2pnode.gossip.quiet_round`); None: every round is ``fanout`` wide."""
        self.busy = 0  # inbound gossip requests refused with 503: all slots taken
        self.bytes_sent = 0
        self.bytes_received = 0

    # -- inbound ---------------------------------------------------------------------------------
    def admit(self, host: str, declared_bytes: int | None) -> bool:
        """Whether ``host`` may send a gossip body of ``declared_bytes`` now (its byte bucket; an undeclared
        length is charged as a full ``max_body_bytes``). False: answer 429 without reading the body."""
        limit = self.config.gossip.max_body_bytes
        cost = declared_bytes if declared_bytes is not None else limit
        return self.inbound_bytes.take(host, min(cost, limit), self.now())

    def charge_reply(self, host: str, nbytes: int) -> None:
        """Count a reply of ``nbytes`` to ``host`` against its byte bucket (requests and replies share it)."""
        self.bytes_sent += nbytes
        self.inbound_bytes.charge(host, nbytes, self.now())

    async def handle(self, body: bytes) -> Any:
        """Answer an inbound ``POST /gossip`` body: decode and verify in a worker thread (within the per-message
        and the per-second signature budgets), then install here. Returns a :class:`p2pnode.gossip.GossipReply`."""
        self.bytes_received += len(body)
        g = self.config.gossip
        budget = int(min(g.max_verifications_per_message,
                         max(0.0, self.inbound_verifications.available("", self.now()))))
        if len(body) <= INLINE_VERIFY_BYTES:
            prepared = self.gossiper.verify_request(body, budget)
        else:
            prepared = await trio.to_thread.run_sync(self.gossiper.verify_request, body, budget,
                                                     limiter=self.verify_limiter)
        if prepared.verified is not None:
            self.inbound_verifications.charge("", prepared.verified.verifications, self.now())
        return self.gossiper.finish_request(prepared, self.now())

    # -- outbound --------------------------------------------------------------------------------
    async def _post(self, addr: str, body: bytes, timeout_s: float) -> GossipReplyBytes:
        self.bytes_sent += len(body)
        resp = await self.client.post(addr, body, timeout_s)
        self.bytes_received += len(resp.content)
        return resp

    async def _verified_reply(self, resp: GossipReplyBytes) -> Any:
        """Decode and verify a gossip reply: on the event loop when small (:data:`INLINE_VERIFY_BYTES`), else in
        a worker thread (signature checks never stall the event loop)."""
        ctype = resp.content_type
        if len(resp.content) <= INLINE_VERIFY_BYTES:
            return self.gossiper.verify_reply(resp.status_code, ctype, resp.content)
        return await trio.to_thread.run_sync(self.gossiper.verify_reply, resp.status_code, ctype, resp.content,
                                             limiter=self.verify_limiter)

    async def exchange(self, addr: str) -> None:
        """One push-pull exchange with ``addr`` (request, reply, and the push the reply asks for)."""
        timeout = self.config.gossip.request_timeout_s
        try:
            resp = await self._post(addr, self.gossiper.open_request(addr, self.now()), timeout)
            push = self.gossiper.finish_reply(addr, await self._verified_reply(resp), self.now())
            if push is not None:
                resp = await self._post(addr, push, timeout)
                self.gossiper.finish_reply(addr, await self._verified_reply(resp), self.now(), push=False)
        except (OSError, ValueError) as exc:
            # GossipTransportError is an OSError; ValueError: an address that cannot be dialled. The peer book
            # only holds validated addresses, this is the driver's own line of defence.
            log.debug("gossip with %s failed: %s", addr, exc)
            self.gossiper.on_failure(addr, self.now())

    def exchange_soon(self, addr: str) -> bool:
        """Start an exchange with ``addr`` outside the round (False before the loop runs or while one is under
        way with that address)."""
        if self.nursery is None or addr in self._inflight:
            return False
        self._inflight.add(addr)
        self.nursery.start_soon(self._exchange_tracked, addr)
        return True

    async def _exchange_tracked(self, addr: str) -> None:
        try:
            await self.exchange(addr)
        finally:
            self._inflight.discard(addr)
            if self.peers.first_contacts != self._contacts_saved:
                self._met.set()  # a peer answered for the first time: the peers file is written soon

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The gossip rounds, until cancelled (kept connections are closed then)."""
        interval = self.config.membership().gossip_interval_s
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                task_status.started()
                while True:
                    self.rounds += 1
                    now = self.now()
                    for addr in self.gossiper.choose_targets(now, quiet=self.quiet is not None and self.quiet(now)):
                        self.exchange_soon(addr)
                    await trio.sleep(interval * self.rng.uniform(0.9, 1.1))
        finally:
            self.nursery = None
            await self.client.aclose()

    async def leave(self) -> None:
        """Push our final (``leaving``) snapshot to up to ``max(fanout, 3)`` peers within ``leave_timeout_s``."""
        g = self.config.gossip
        body = self.gossiper.leave_request()
        with trio.move_on_after(g.leave_timeout_s):
            async with trio.open_nursery() as n:
                for addr in self.peers.choose(max(g.fanout, 3), self.now(), self.rng):
                    n.start_soon(self._leave_one, addr, body)

    async def _leave_one(self, addr: str, body: bytes) -> None:
        try:
            await self._post(addr, body, self.config.gossip.leave_timeout_s)
        except (OSError, ValueError):
            pass

    # -- discovery -------------------------------------------------------------------------------
    def add_seeds(self, data_dir: Any) -> None:
        """Join addresses from the config and (when enabled) the remembered peers file (an entry the agent learned
        from a member is judged by the dial policy again: :meth:`p2pnode.gossip.PeerBook.add`)."""
        for addr in self.config.agent.join:
            host, port = parse_hostport(addr, default_port=8770)
            self.peers.add(hostport(host, port), "join")
        if self.config.discovery.peers_file:
            for addr, nid, learned in load_peer_entries(data_dir):
                self.peers.add(addr, "peers-file", node_id=nid, learned=learned)

    def _good_peers(self) -> list[tuple[str, str | None]]:
        return [(p.addr, p.node_id) for p in self.peers.known_good() if not p.left]

    def _learned(self) -> frozenset[str]:
        return frozenset(p.addr for p in self.peers.all() if p.learned)

    def save_peers(self, data_dir: Any, peers: list[tuple[str, str | None]] | None = None,
                   learned: frozenset[str] | None = None) -> bool:
        """Write ``peers`` (default: the peers that answered lately) to the peers file, ``learned`` (default: the
        book's) marked as learned from members. False when it could not be written (logged)."""
        try:
            save_peers(data_dir, self._good_peers() if peers is None else peers,
                       self._learned() if learned is None else learned)
        except OSError as exc:
            log.warning("cannot write peers file: %s", exc)
            return False
        return True

    async def peers_file_loop(self, data_dir: Any) -> None:
        """Write the peers file every ``discovery.peers_file_interval_s``, and :data:`PEERS_FILE_CHECK_S` after a
        peer first answers (a node killed soon after it met the cluster still finds it after a restart, even
        without join addresses; first answers that come together are written once), until cancelled."""
        every = self.config.discovery.peers_file_interval_s
        written: frozenset[tuple[str, str | None]] | None = None
        while True:
            with trio.move_on_after(every):
                await self._met.wait()
                await trio.sleep(PEERS_FILE_CHECK_S)
            self._met = trio.Event()
            self._contacts_saved = self.peers.first_contacts
            peers = self._good_peers()
            if frozenset(peers) == written:  # the same peers (in another order of recency): nothing to write
                continue
            learned = self._learned()  # read here: the book changes on the event loop
            if await trio.to_thread.run_sync(self.save_peers, data_dir, peers, learned):  # two fsyncs: off the loop
                written = frozenset(peers)

    def _on_mdns_found(self, addr: str, node_id: str) -> None:
        if self.peers.get(addr) is None and addr not in {c.addr for c in self.peers.candidates()}:
            log.info("mDNS: found %s at %s (a candidate until its signed snapshot arrives)", node_id, addr)
        self.peers.add_candidate(addr, "mdns", self.now(), node_id=node_id)

    async def run_mdns(self, port: int, interfaces: list[str], *,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Announce and browse on ``interfaces`` until cancelled; an OSError stops discovery, not the agent."""
        from ..discovery._mdns import MdnsDiscovery  # zeroconf loads only when mDNS is on

        self.mdns = MdnsDiscovery(node_id=self.node_id, port=port, interfaces=interfaces, on_found=self._on_mdns_found)
        try:
            await self.mdns.run(task_status=task_status)
        except OSError as exc:
            self.mdns_error = f"{exc.__class__.__name__}: {exc}"
            log.warning("mDNS discovery stopped: %s", self.mdns_error)
            task_status.started()

    def addr_refusal(self, addr: str) -> str | None:
        """Why the dial policy refuses a member's advertised ``addr``, or None (also None without a policy)."""
        policy = self.peers.policy
        return policy.refusal(addr) if policy is not None and addr else None

    def addr_refused(self) -> dict[str, int]:
        """Distinct advertised addresses refused so far, by reason."""
        return dict(self.peers.policy.refused) if self.peers.policy is not None else {}

    def view(self) -> dict[str, Any]:
        """The ``gossip`` part of ``/status`` that the driver owns (counters, peers, candidates)."""
        now = self.now()
        return {
            "busy": self.busy,
            "bytes_sent": self.bytes_sent,
            "quiet_rounds": self.gossiper.quiet_rounds,
            "rate_limited": self.inbound_bytes.refused,
            "candidates": [{"addr": c.addr, "source": c.source, "failures": c.failures}
                           for c in self.peers.candidates()],
            "candidates_dropped": self.peers.candidates_dropped,
            "addr_refused": self.addr_refused(),
            "peers": [{"addr": p.addr, "source": p.source, "node_id": p.node_id, "failures": p.failures,
                       "last_ok_age_s": round(now - p.last_ok_at, 3) if p.last_ok_at is not None else None,
                       "left": p.left}
                      for p in self.peers.all()],
        }
