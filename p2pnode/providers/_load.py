"""Loading the provider ``[scaling] provider`` names: a built-in one or an entry point's plugin."""

from __future__ import annotations

import logging

from ..config import ScalingSettings
from ..errors import ConfigError
from ._base import BUILT_IN, ENTRY_POINT_GROUP, Provider, ProviderContext
from ._command import CommandProvider
from ._local import LocalProvider

log = logging.getLogger(__name__)


def load_provider(settings: ScalingSettings, ctx: ProviderContext) -> Provider | None:
    """The provider ``settings.provider`` names: ``""`` -> None (decisions are shown, nothing acts), ``command``
    and ``local`` built in, any other name the entry point of that name in group :data:`ENTRY_POINT_GROUP`
    (a factory called with ``(settings, ctx)``). Raises :class:`ConfigError` for a name no plugin has (naming
    those installed) and for a plugin that fails to load or build."""
    name = settings.provider
    if not name:
        return None
    if name == "command":
        return CommandProvider(settings, ctx)
    if name == "local":
        return LocalProvider(settings, ctx)
    import importlib.metadata  # here, not at the top: about 0.8 MiB an agent without a plugin never uses

    plugins = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    ep = plugins.get(name)
    if ep is None:
        known = ", ".join([*BUILT_IN, *sorted(n for n in plugins if n not in BUILT_IN)])
        raise ConfigError(f"scaling.provider = {name!r}: no such provider (available: {known}; a plugin is a Python "
                          f"entry point in group {ENTRY_POINT_GROUP!r})")
    try:
        factory = ep.load()
        provider = factory(settings, ctx)
    except ConfigError:
        raise
    except Exception as exc:  # a plugin's own bug or missing dependency: the operator's to fix, in one line
        raise ConfigError(f"scaling.provider = {name!r}: plugin {ep.value} failed to load: "
                          f"{type(exc).__name__}: {str(exc)[:300]}") from exc
    if not all(callable(getattr(provider, m, None)) for m in ("scale_up", "scale_down", "list")):
        raise ConfigError(f"scaling.provider = {name!r}: {ep.value} returned {type(provider).__name__}, which lacks "
                          "scale_up, scale_down or list")
    log.info("scaling provider %r loaded from %s", name, ep.value)
    return provider
