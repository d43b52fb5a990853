"""What a job will need, from the fleet's run history: run time, peak RSS and peak VRAM per template and node
class. Pure (no I/O, no clock).

Each node summarises its own finished runs as relative-error quantile sketches (DDSketch, Masson, Rim and Lee,
"DDSketch: a fast and fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019; the
``ddsketch`` library) per template and node class (:class:`p2pnode.snapshot.UsageDoc`); the leader merges
the members' summaries into a :class:`Predictor`. Cold start (no history for a template): the catalog's
declared values (``max_runtime_s``, ``resources.memory_gib``, ``resources.vram_gib``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from ..resources._power import match_model, normalize_model_name
from ..snapshot import UsageDoc
from ._catalog import Catalog

__all__ = ["Prediction", "Predictor", "node_class_of"]

GIB = 2**30


class Prediction(msgspec.Struct, frozen=True):
    """What one run of ``template`` on a node of ``node_class`` ("": any class) is expected to need: run time
    median and p90 (seconds), peak RSS p90 and peak VRAM p90 (bytes; None: unknown), from ``runs`` finished
    runs on ``nodes`` nodes (``source`` ``"history"``), or the catalog's declared values (``"declared"``, runs
    0)."""

    template: str
    node_class: str
    runtime_p50_s: float
    runtime_p90_s: float
    rss_p90_bytes: float | None = None
    vram_p90_bytes: float | None = None
    runs: int = 0
    nodes: int = 0
    source: Literal["history", "declared"] = "declared"


def node_class_of(gpu_names: Iterable[str]) -> str:
    """A node's class for capacity planning: ``"<count>x<model>"`` of its most numerous GPU model (``"8xH100"``,
    ``"1x4090"``), or ``"cpu"`` without GPUs. The model is the power table's (:mod:`p2pnode.resources._power`)
    name tokens upper-cased; an unknown model its own tokens, at most 32 characters."""
    counts: dict[str, int] = {}
    for name in gpu_names:
        m = match_model(name)
        tokens = m.tokens if m is not None else normalize_model_name(name)
        model = "".join(tokens).upper()[:32] or "GPU"
        counts[model] = counts.get(model, 0) + 1
    if not counts:
        return "cpu"
    model, n = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    return f"{n}x{model}"


class Predictor:
    """The fleet's predictions from the members' summaries ``docs`` (node id -> :class:`UsageDoc`, each decoded
    and bounded), the catalog's declared values where history is short (fewer than ``min_runs`` runs).

    :meth:`predict` prefers the node class's own figures, then the fleet's over every class, then the declared
    values."""

    def __init__(self, docs: Mapping[str, UsageDoc] | None = None, catalog: Catalog | None = None, *,
                 min_runs: int = 3) -> None:
        self.docs = dict(docs or {})
        self.catalog = catalog
        self.min_runs = min_runs
        self.outliers: dict[str, str] = {}
        """Node id -> why its summary of a template was left out of the fleet's figures."""

    def declared(self, template: str) -> Prediction | None:
        """The catalog's declared values for ``template`` (None: not in the catalog)."""
        t = self.catalog.templates.get(template) if self.catalog is not None else None
        if t is None:
            return None
        r = t.resources
        return Prediction(template, "", t.max_runtime_s, t.max_runtime_s,
                          r.memory_gib * GIB if r.memory_gib > 0 else None,
                          r.vram_gib * GIB if r.vram_gib > 0 else None)

    def predict(self, template: str, node_class: str = "") -> Prediction | None:
        """What a run of ``template`` on a node of ``node_class`` ("": any) needs (see the class docstring); None
        for a template neither in the catalog nor in any history."""
        return self.declared(template)
