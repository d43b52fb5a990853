"""HTTP surface of the agent: ASGI app and Prometheus metrics, built from the node's typed surfaces
(:class:`HttpSurfaces`), never from the agent."""

from typing import TYPE_CHECKING, Any

from ._app import create_app
from ._gossip_route import GossipEndpoint, serve_gossip
from ._registry import LazyRegistry
from ._surfaces import (
    GossipSurface,
    GuardSurface,
    HttpCounters,
    HttpSurfaces,
    JobsSurface,
    NodeStats,
    NodeSurface,
    OperatorSurface,
    PlanSurface,
    SyncSurface,
    TrustSurface,
)

__all__ = [
    "AgentCollector",
    "GossipEndpoint",
    "GossipSurface",
    "GuardSurface",
    "HttpCounters",
    "HttpSurfaces",
    "JobsSurface",
    "LazyRegistry",
    "NodeStats",
    "NodeSurface",
    "OperatorSurface",
    "PlanSurface",
    "SyncSurface",
    "TrustSurface",
    "create_app",
    "make_registry",
    "serve_gossip",
]

if TYPE_CHECKING:
    from ._metrics import AgentCollector, make_registry


def __getattr__(name: str) -> Any:
    """``AgentCollector`` and ``make_registry`` from :mod:`._metrics`, imported at the first read (with
    ``prometheus_client``: :mod:`._registry` says why)."""
    if name in ("AgentCollector", "make_registry"):
        from . import _metrics

        return getattr(_metrics, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
