"""The scaling driver: carries out the leader's scaling effects through the provider plugin. Driver-level I/O.

The decisions are the job core's (:class:`p2pnode.scheduler._scaling.ScalingCore`, driven by
:class:`p2pnode.node.JobCore`); this module only calls the provider (:mod:`p2pnode.providers`) for each
:class:`~p2pnode.scheduler._scaling.ProviderCall` and :class:`~p2pnode.scheduler._scaling.ProviderList`, one at a
time, in a worker thread under a deadline (``scaling.command_timeout_s`` plus a margin), and hands the outcome
back to the core. A provider that fails, raises or hangs is counted (``p2pnode_provider_failures_total``) and its
action recorded as failed; the leader keeps planning meanwhile (a hung call holds only this task).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from ..config import ScalingSettings
from ..errors import ConfigError
from ..providers import ENTRY_POINT_GROUP, ProviderError
from ..providers._base import BUILT_IN, ProviderNodes
from ..scheduler._scaling import (
    DEFAULT_VRAM_LIMIT_RATIO,
    ClassPolicy,
    ProviderCall,
    ProviderList,
    ScalingPolicy,
    one_line,
)

__all__ = ["ScalingDriver", "scaling_policy"]

log = logging.getLogger("p2pnode.scaling")

MARGIN_S = 30.0
"""A provider call is abandoned this long after its own timeouts passed (seconds): a scale-up or scale-down may
run two programs (the action, then ``command_list``), each within ``command_timeout_s``."""
QUEUE = 16


def scaling_policy(s: ScalingSettings, *, vram_limit_ratio: float = DEFAULT_VRAM_LIMIT_RATIO) -> ScalingPolicy:
    """The evaluation's view of the ``[scaling]`` table, with the guard's GPU memory limit the leader applies to
    members (``vram_limit_ratio``: ``[guard] gpu_max_percent / 100``): a class is judged by its usable VRAM."""
    return ScalingPolicy(
        provider=s.provider, cooldown_s=s.cooldown_s, up_after_s=s.up_after_s, idle_timeout_s=s.idle_timeout_s,
        max_step=s.max_step, max_hourly_cost=s.max_hourly_cost, vram_limit_ratio=vram_limit_ratio,
        classes={k: ClassPolicy(v.min_nodes, v.max_nodes, v.price_per_hour) for k, v in s.classes.items()})


class ScalingDriver:
    """Calls the provider for the core's scaling effects (see the module docstring). ``load``: builds the provider
    (None: no provider configured), called once in a worker thread; ``result(action_id, error, wall)`` and
    ``listed(nodes, error, wall) -> effects`` hand outcomes back to the core; ``apply(effects)`` carries out
    re-issued actions; ``news()`` wakes the job control. ``result`` also gets the provider's answer (its nodes as
    ``(request_id, node_id, state, node_class)``; None when the call failed): the nodes it names count toward
    their class."""

    def __init__(self, settings: ScalingSettings, load: Callable[[], Any], *,
                 result: Callable[[str, str, float, list[tuple[str, str, str, str]] | None], None],
                 listed: Callable[[list[tuple[str, str, str, str]] | None, str, float], list[Any]],
                 apply: Callable[[list[Any]], None], news: Callable[[], None]) -> None:
        self.settings = settings
        self._load = load
        self._result, self._listed, self._apply, self._news = result, listed, apply, news
        self.provider: Any = None
        self.load_error = ""
        self.failures: dict[tuple[str, str], int] = (
            {(settings.provider, op): 0 for op in ("scale_up", "scale_down", "list")} if settings.provider else {})
        """``(provider, operation)`` -> failed calls (operation ``scale_up``, ``scale_down``, ``list`` or ``load``;
        the first three from 0, so ``increase()`` sees the first failure)."""
        self.calls: dict[tuple[str, str], int] = {}
        self.last_error = ""
        self.busy_since: float | None = None
        self._limiter = trio.CapacityLimiter(1)
        """The provider's own worker thread: a call abandoned at its deadline keeps this slot until it really
        returns, so a plugin that hangs holds one thread, never trio's shared pool (the rest of the agent's)."""
        self._send, self._recv = trio.open_memory_channel[Any](QUEUE)

    def submit(self, effect: ProviderCall | ProviderList) -> None:
        """Queue ``effect`` (the core issues one call at a time: the queue never fills; if it did, the effect is
        dropped and counted, and the core's reconciliation issues it again)."""
        try:
            self._send.send_nowait(effect)
        except trio.WouldBlock:
            self._count("queue", "full")

    def _count(self, operation: str, error: str) -> None:
        key = (self.settings.provider or "none", operation)
        self.failures[key] = self.failures.get(key, 0) + 1
        self.last_error = one_line(f"{operation}: {error}")
        log.warning("scaling provider %s: %s failed: %s", key[0], operation, error)

    def check(self) -> None:
        """At start: the provider ``[scaling] provider`` names exists (built in, or an entry point in group
        ``p2pnode.providers``); raises :class:`p2pnode.errors.ConfigError` naming those installed. The plugin
        itself is loaded at its first call, when the node's address and members are known."""
        name = self.settings.provider
        if not name or name in BUILT_IN:
            return
        import importlib.metadata  # here: it loads zipfile, csv and email (about 0.8 MiB) into every agent otherwise

        plugins = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
        if name not in plugins:
            raise ConfigError(f"scaling.provider = {name!r}: no such provider (available: "
                              f"{', '.join([*BUILT_IN, *plugins])}; a plugin is a Python entry point in group "
                              f"{ENTRY_POINT_GROUP!r})")

    async def _ensure_loaded(self) -> None:
        if self.provider is not None or not self.settings.provider:
            return
        try:
            self.provider = await trio.to_thread.run_sync(self._load, abandon_on_cancel=True,
                                                          limiter=self._limiter)
            self.load_error = ""
        except Exception as exc:  # a plugin's import or factory failing: counted, tried again at the next call
            self.load_error = f"{exc.__class__.__name__}: {exc}"[:400]
            self._count("load", self.load_error)

    async def run(self) -> None:
        """Carry out the queued effects one at a time (the provider is loaded at the first)."""
        async for effect in self._recv:
            await self._ensure_loaded()
            await self._carry_out(effect)

    def _timeout(self) -> float:
        return 2 * self.settings.command_timeout_s + MARGIN_S

    async def _call(self, operation: str, fn: Callable[[], Any]) -> tuple[Any, str]:
        """``fn()`` in the provider's worker thread under the deadline, its answer decoded as the interface says
        (a list of :class:`p2pnode.providers.ProviderNode`, at most ``MAX_LISTED``: a plugin's other answer is
        its failure, never the driver's): ``(nodes, "")`` or ``(None, why it failed, on one line)``."""
        key = (self.settings.provider, operation)
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.provider is None:
            why = self.load_error or "no provider loaded"
            self._count(operation, why)
            return None, why
        self.busy_since = time.monotonic()
        try:
            with trio.move_on_after(self._timeout()):
                answer = await trio.to_thread.run_sync(fn, abandon_on_cancel=True, limiter=self._limiter)
                # through builtins: a plugin's own ProviderNode instances are checked too (convert passes them)
                return msgspec.convert(msgspec.to_builtins(answer if answer is not None else []), ProviderNodes), ""
            why = f"no answer within {self._timeout():.0f} s"
        except ProviderError as exc:
            why = one_line(str(exc))
        except (msgspec.ValidationError, TypeError) as exc:  # not a list of nodes: the plugin broke the interface
            why = one_line(f"its answer is not a list of ProviderNode: {exc}")
        except Exception as exc:  # a plugin's bug (named): counted, the leader goes on
            why = one_line(f"{exc.__class__.__name__}: {exc}")
        finally:
            self.busy_since = None
        self._count(operation, why)
        return None, why

    async def _carry_out(self, effect: Any) -> None:
        p = self.provider
        if isinstance(effect, ProviderCall):
            a = effect.action
            if a.op == "up":
                op, fn = "scale_up", (lambda: p.scale_up(a.node_class, a.count, a.id))
            else:
                op, fn = "scale_down", (lambda: p.scale_down(list(a.nodes), a.id))
            log.info("scaling: %s %s (%s) id %s%s: %s", op, a.count if a.op == "up" else ",".join(a.nodes),
                     a.node_class, a.id, f" for {', '.join(a.for_templates)}" if a.for_templates else "", a.reason)
            nodes, why = await self._call(op, fn)
            answer = None if why else [(n.request_id, n.node_id, n.state, n.node_class) for n in nodes]
            self._result(a.id, why, time.time(), answer)
        elif isinstance(effect, ProviderList):
            nodes, why = await self._call("list", lambda: p.list())
            listing = None if why else [(n.request_id, n.node_id, n.state, n.node_class) for n in nodes]
            self._apply(self._listed(listing, why, time.time()))
        self._news()

    def busy_for(self) -> float:
        """Seconds the call under way has taken (0: none)."""
        return 0.0 if self.busy_since is None else max(0.0, time.monotonic() - self.busy_since)

    def status(self) -> dict[str, Any]:
        """For ``/status``: provider, loaded or why not, failures and calls by operation, the last error."""
        return {"provider": self.settings.provider, "loaded": self.provider is not None,
                "load_error": self.load_error, "last_error": self.last_error,
                "calls": {op: n for (_p, op), n in self.calls.items()},
                "failures": {op: n for (_p, op), n in self.failures.items() if n},
                "busy_s": round(self.busy_for(), 1)}
