"""What ``GET /metrics`` exposes, built at the first scrape (:class:`LazyRegistry`, :func:`exposition`).

The agent's metrics are collected when scraped (:class:`p2pnode.http.AgentCollector` reads the surfaces then), so
nothing needs ``prometheus_client`` or :mod:`._metrics` before the first ``GET /metrics``: an agent nobody scrapes
never imports them (issue 43: about 1 MiB of an idle agent's RSS with the standard-library modules they pull in:
``http.server``, ``wsgiref``, ``gzip``). A scraped agent loads them once, at its first scrape.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from ._surfaces import HttpSurfaces

__all__ = ["LazyRegistry", "exposition"]


class LazyRegistry:
    """The node's registry (:func:`p2pnode.http.make_registry` over the surfaces ``s``), made at the first
    :meth:`registry` or :meth:`collect` (from the trio thread that serves ``/metrics``, or a test)."""

    def __init__(self, s: HttpSurfaces) -> None:
        self._surfaces = s
        self._registry: CollectorRegistry | None = None

    def registry(self) -> CollectorRegistry:
        """The registry, made now if it was not."""
        if self._registry is None:
            from ._metrics import make_registry

            self._registry = make_registry(self._surfaces)
        return self._registry

    def collect(self) -> Iterable[Metric]:
        """The metrics of every collector, as ``CollectorRegistry.collect`` (so ``generate_latest`` takes this)."""
        return self.registry().collect()


def exposition(registry: CollectorRegistry | LazyRegistry) -> tuple[bytes, str]:
    """The Prometheus text exposition of ``registry`` and its media type (``prometheus_client`` imported here)."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    reg = registry.registry() if isinstance(registry, LazyRegistry) else registry
    return generate_latest(reg), CONTENT_TYPE_LATEST
