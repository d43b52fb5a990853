"""The agent's SWIM probes (a part of :class:`p2pnode.agent.Agent`, which inherits it): with ``gossip.probes`` on,
the probe wire (:class:`p2pnode.gossip.ProbeKeys`, :class:`p2pnode.gossip.ProbeCodec`) over the core's
:class:`p2pnode.gossip.Prober`, and the UDP driver (:class:`p2pnode.drivers._gossip_probe.ProbeDriver`) bound on the
gossip port of the listen host, with ``POST /probe`` on the agent's HTTP client as its stream fallback.

Pair keys come from the members' Ed25519 keys in their held, verified snapshots and, in token mode, the keyring
(open mode: no token, the key binds the two identities only). A probe goes to the address of the member's signed
snapshot, and only where this node may dial it (:class:`p2pnode.gossip.DialPolicy`). The prober's state changes
(suspect, alive) are logged as the core's are, and wake the core loop, which publishes the new accusations.
With a lease kept (``scheduler.lease_s``, :class:`p2pnode.jobs._leasefile.LeaseKeeper`) the probe driver
renews it from the voters' direct acks. Off (the default), nothing here runs and nothing is bound. The agent's own
state is declared here for the type checker only; nothing else imports this module.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import httpx
import trio

from .config import Config
from .drivers import Trust
from .gossip import MAX_PROBE_PACKET_BYTES, ClusterState, DialPolicy, ProbeCodec, ProbeKeys, StateChanged
from .identity import Identity
from .node import NodeCore

if TYPE_CHECKING:
    from .drivers._gossip_probe import ProbeDriver
    from .jobs import JobControl

log = logging.getLogger("p2pnode.agent")


def wall_ms() -> int:
    """The wall clock in milliseconds (probe freshness)."""
    return time.time_ns() // 1_000_000


class _AgentProbes:
    """SWIM probes of one agent (see module docstring)."""

    config: Config
    node_id: str
    identity: Identity
    core: NodeCore
    state: ClusterState
    trust: Trust
    dial_policy: DialPolicy
    probes: ProbeDriver | None
    jobs: JobControl | None
    _job_news: bool

    if TYPE_CHECKING:  # defined by the agent
        @staticmethod
        def now() -> float: ...

        @property
        def client(self) -> httpx.AsyncClient | None: ...

        def publish_soon(self) -> None: ...
        def _log_changes(self, changes: list[StateChanged]) -> None: ...

    def _build_probes(self) -> ProbeDriver | None:
        """The probe driver over the core's prober, or None when ``gossip.probes`` is off."""
        prober = self.core.prober
        if prober is None:
            return None
        from .drivers._gossip_probe import ProbeDriver  # here: an agent with probes off never loads the driver

        keys = ProbeKeys(self.node_id, self.identity.private_key, public_key_of=self._probe_key,
                         keyring=lambda: self.trust.keyring)
        prober.reachable = lambda node_id: self._probe_addr(node_id) is not None  # (review: no flapping)
        return ProbeDriver(prober, ProbeCodec(keys), addr_of=self._probe_addr, now=self.now, wall_ms=wall_ms,
                           stream_post=self._probe_post, on_changes=self._probe_changes)

    def _probe_key(self, node_id: str) -> bytes | None:
        e = self.state.get(node_id)
        return e.envelope.key if e is not None and node_id != self.node_id else None

    def _probe_addr(self, node_id: str) -> str | None:
        e = self.state.get(node_id)
        return (self.dial_policy.dialable(e.addr) or None) if e is not None else None

    def _probe_changes(self, changes: list[StateChanged]) -> None:
        self._log_changes(changes)
        self._job_news = True  # as for a snapshot that changed a member's state (Agent._on_accepted)
        self.publish_soon()  # the core loop reconciles (votes) and publishes our accusations

    async def _probe_post(self, addr: str, packet: bytes) -> bytes | None:
        """``POST /probe`` with ``packet`` to ``addr``: the reply packet, or None (no answer to give, or refused).
        Raises ``OSError`` (transport) or ``trio.TooSlowError`` past the probe interval."""
        client = self.client
        if client is None:
            return None
        with trio.fail_after(self.config.gossip.probe_interval_s):
            try:
                r = await client.post(f"http://{addr}/probe", content=packet,
                                      headers={"content-type": "application/octet-stream"})
            except (httpx.HTTPError, httpx.InvalidURL) as exc:  # InvalidURL is no HTTPError
                raise OSError(str(exc)) from None
        if r.status_code != 200 or len(r.content) > MAX_PROBE_PACKET_BYTES:
            return None
        return r.content

    async def _start_probes(self, nursery: trio.Nursery, host: str, port: int) -> None:
        """Bind the probe socket on ``host:port`` (UDP, the gossip port) and start probing. A port that cannot be
        bound is logged and probes stay off for this run (peers then reach us over ``POST /probe``)."""
        driver = self.probes
        if driver is None:
            return
        try:
            await driver.bind(host, port)
        except OSError as exc:
            log.error("SWIM probes: UDP %s:%d not bound (%s); answering probes over HTTP only%s", host, port, exc,
                      "; the lease is not renewed: fenced jobs stop" if self.jobs is not None and self.jobs.lease
                      else "")
            return
        if self.jobs is not None:
            self.jobs.ack_log = driver.acks_given  # published in jobs.acks: the leader's last sign (issue 42)
        if self.jobs is not None and self.jobs.lease is not None:
            driver.lease = self.jobs.lease  # renewed by the voters' direct acks (issue 42)
        await nursery.start(driver.run)
