"""HTTP surface of the agent: ASGI app and Prometheus metrics, built from the node's typed surfaces
(:class:`HttpSurfaces`), never from the agent."""

from ._app import create_app
from ._gossip_route import GossipEndpoint, serve_gossip
from ._metrics import AgentCollector, make_registry
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
