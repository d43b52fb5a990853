"""mDNS discovery: register ``_p2pnode._tcp.local.`` and browse for peers, bridged into trio.

python-zeroconf runs its own asyncio loop in a thread. We use the synchronous ``Zeroconf`` and
``ServiceBrowser``; the browser's listener (called on zeroconf's thread) hands service names to trio through
``TrioToken.run_sync_soon`` into a bounded memory channel (a full channel drops the event and counts it).
Blocking calls (``register_service``, ``get_service_info``, ``close``) run in ``trio.to_thread``. The consumer
starts before we register, and zeroconf is bound to explicit interfaces only.

TXT records: ``id`` (node id), ``port`` (HTTP port), ``v`` (wire schema version).
"""

from __future__ import annotations

import functools
import logging
import socket
from collections.abc import Callable

import trio
from zeroconf import IPVersion, ServiceBrowser, ServiceInfo, ServiceListener, Zeroconf

from ..wire import SCHEMA_VERSION

__all__ = ["SERVICE_TYPE", "MdnsDiscovery"]

log = logging.getLogger(__name__)

SERVICE_TYPE = "_p2pnode._tcp.local."


class _Listener(ServiceListener):
    """Runs on zeroconf's thread: forwards (kind, name) into trio without blocking."""

    def __init__(self, token: trio.lowlevel.TrioToken, deliver: Callable[[str, str], None]) -> None:
        self._token = token
        self._deliver = deliver

    def _forward(self, kind: str, name: str) -> None:
        try:
            self._token.run_sync_soon(self._deliver, kind, name)
        except trio.RunFinishedError:
            pass

    def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self._forward("add", name)

    def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self._forward("update", name)

    def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self._forward("remove", name)


class MdnsDiscovery:
    """Announce this node and report peers found on the LAN.

    ``interfaces`` are IPv4 addresses (never empty: the caller decides, see ``DiscoveryConfig``);
    ``on_found(addr, node_id)`` is called in trio for each peer resolved, with ``addr`` as ``"ip:port"``.
    """

    def __init__(
        self,
        *,
        node_id: str,
        port: int,
        interfaces: list[str],
        on_found: Callable[[str, str], None],
        resolve_timeout_ms: int = 3000,
    ) -> None:
        if not interfaces:
            raise ValueError("mDNS needs at least one explicit interface address")
        self.node_id = node_id
        self.port = port
        self.interfaces = list(interfaces)
        self.on_found = on_found
        self.resolve_timeout_ms = resolve_timeout_ms
        self.events_dropped = 0
        self.found = 0
        self._send, self._recv = trio.open_memory_channel[tuple[str, str]](256)

    def _deliver(self, kind: str, name: str) -> None:
        try:
            self._send.send_nowait((kind, name))
        except trio.WouldBlock:
            self.events_dropped += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def _service_info(self) -> ServiceInfo:
        return ServiceInfo(
            SERVICE_TYPE,
            f"{self.node_id}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(ip) for ip in self.interfaces],
            port=self.port,
            properties={"id": self.node_id, "port": str(self.port), "v": str(SCHEMA_VERSION)},
            server=f"p2pnode-{self.node_id}.local.",
        )

    async def _consume(self, zc: Zeroconf) -> None:
        async with self._recv:
            async for kind, name in self._recv:
                if kind == "remove":
                    continue
                info = await trio.to_thread.run_sync(
                    functools.partial(zc.get_service_info, SERVICE_TYPE, name, timeout=self.resolve_timeout_ms)
                )
                if info is None:
                    continue
                props = {k: v for k, v in (info.properties or {}).items()}
                raw_id = props.get(b"id")
                node_id = raw_id.decode("utf-8", "replace") if isinstance(raw_id, bytes) else None
                if not node_id or node_id == self.node_id or not info.port:
                    continue
                for ip in info.parsed_addresses(IPVersion.V4Only):
                    self.found += 1
                    self.on_found(f"{ip}:{info.port}", node_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``started()`` once the service is registered. Unregisters on the way out."""
        zc = await trio.to_thread.run_sync(
            functools.partial(Zeroconf, interfaces=self.interfaces, ip_version=IPVersion.V4Only)
        )
        info = self._service_info()
        browser: ServiceBrowser | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._consume, zc)
                listener = _Listener(trio.lowlevel.current_trio_token(), self._deliver)
                browser = ServiceBrowser(zc, SERVICE_TYPE, listener)
                await trio.to_thread.run_sync(
                    functools.partial(zc.register_service, info, cooperating_responders=True)
                )
                log.info("mDNS: registered %s on %s", info.name, ", ".join(self.interfaces))
                task_status.started()
                await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(functools.partial(_close, zc, info, browser))


def _close(zc: Zeroconf, info: ServiceInfo, browser: ServiceBrowser | None) -> None:
    """Stop browsing, send the goodbye for our service, close zeroconf (blocking; run in a thread)."""
    if browser is not None:
        browser.cancel()
    try:
        zc.unregister_service(info)
    except Exception as exc:  # pragma: no cover - best effort at shutdown
        log.debug("mDNS unregister failed: %s", exc)
    zc.close()
