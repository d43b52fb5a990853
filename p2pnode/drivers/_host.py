"""Facts of the host the agent runs on: the address it advertises, the interfaces mDNS uses, the open-files limit."""

from __future__ import annotations

import ipaddress
import logging
import ssl

import httpx
import psutil
from hypercorn.config import Config as HypercornConfig

from ..config import AgentConfig, Config, ProviderNat
from ..gossip import parse_hostport
from ._gossip import hostport

__all__ = ["KEEPALIVE_S", "advertised_addr", "http_client", "local_ipv4_addresses", "mdns_interfaces",
           "raise_open_files_limit", "server_config"]

log = logging.getLogger(__name__)
_UNSPECIFIED = ("", "0.0.0.0", "::")
KEEPALIVE_S = 30.0
"""Seconds the HTTP server keeps an idle connection; the gossip client keeps its own for less
(:class:`p2pnode.drivers.GossipDriver`), so the server never closes one the client is about to reuse."""


def server_config(bind: str, port: int) -> HypercornConfig:
    """hypercorn's configuration for the agent: bound to ``bind:port``, idle connections kept ``KEEPALIVE_S``,
    a connection with a request under way closed after 30 s without a byte, 0.5 s to finish on shutdown, no
    access log."""
    hc = HypercornConfig()
    hc.bind = [hostport(bind, port)]
    hc.graceful_timeout = 0.5
    hc.read_timeout = 30
    hc.keep_alive_timeout = KEEPALIVE_S
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    return hc


def http_client() -> httpx.AsyncClient:
    """The agent's shared HTTP client (sync transfers, plan parts, job artefacts): 64 connections, 32 kept
    alive, no proxy from the environment.

    Peers speak plain HTTP and authenticate by signature. The client's TLS context holds no trusted roots, so an
    ``https`` URL fails verification instead of loading certifi's bundle (1.3 MiB in every agent)."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
    return httpx.AsyncClient(limits=limits, trust_env=False, verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))


def local_ipv4_addresses() -> list[str]:
    """Non-loopback IPv4 addresses of this host's interfaces (psutil), in interface order."""
    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not ipaddress.ip_address(a.address).is_loopback:
                out.append(a.address)
    return out


def advertised_addr(a: AgentConfig, port: int, nat: ProviderNat | None = None) -> tuple[str, str]:
    """The ``host:port`` peers dial, and where it came from: ``agent.advertise`` (``config``: the operator's word
    first); else the marketplace provider's public IP and the public port it maps ``port`` to (``vast.ai``,
    ``runpod``: :func:`p2pnode.config.provider_nat`; its IP with ``port`` itself, and a warning, when it maps no
    port for it); else the bind address (``bind``); else the first non-loopback IPv4 address (``local
    address``; 127.0.0.1 when there is none). ``port`` is the bound port."""
    if a.advertise:
        host, p = parse_hostport(a.advertise, default_port=port)
        return hostport(host, p), "config"
    if nat is not None:
        public = nat.public(port)
        if public is None:
            log.warning("%s gives this container the public address %s but maps no public port to %d: peers "
                        "dial %s:%d (open TCP %d in the instance's template, or set agent.advertise)",
                        nat.provider, nat.public_ip, port, nat.public_ip, port, port)
        return hostport(nat.public_ip, public or port), nat.provider
    if a.bind not in _UNSPECIFIED:
        return hostport(a.bind, port), "bind"
    local = local_ipv4_addresses()
    return hostport(local[0] if local else "127.0.0.1", port), "local address"


def provider_ports(nat: ProviderNat | None, source: str) -> dict[int, int]:
    """The provider's port mapping (internal -> public) the data channel advertises through, given where the
    advertised address came from (:func:`advertised_addr`): the mapping only with the provider's own address;
    ``agent.advertise`` is the operator's word for the address and the ports alike (the data port is then
    ``sync.advertise_data_port``, else the bound one)."""
    return dict(nat.ports) if nat is not None and source == nat.provider else {}


def mdns_interfaces(config: Config) -> list[str]:
    """Addresses mDNS announces on: ``discovery.mdns_interfaces``, else the bind address, else every non-loopback
    IPv4 address."""
    d, bind = config.discovery, config.agent.bind
    if d.mdns_interfaces:
        return list(d.mdns_interfaces)
    return [bind] if bind not in _UNSPECIFIED else local_ipv4_addresses()


def raise_open_files_limit() -> None:
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
