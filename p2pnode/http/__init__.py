"""HTTP surface of the agent: ASGI app and Prometheus metrics."""

from ._app import create_app
from ._gossip_route import serve_gossip
from ._metrics import AgentCollector, make_registry

__all__ = ["AgentCollector", "create_app", "make_registry", "serve_gossip"]
