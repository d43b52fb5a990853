"""What a job will need, from the fleet's run history: run time, peak RSS and peak VRAM per template and node
class. Pure (no I/O, no clock).

Each node summarises its own finished runs as relative-error quantile sketches (DDSketch, Masson, Rim and Lee,
"DDSketch: a fast and fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019; the
``ddsketch`` library) per template and node class (:func:`summarize` -> :class:`p2pnode.snapshot.UsageDoc`); the
leader merges the members' summaries into a :class:`Predictor`. Cold start (no history for a template): the
catalog's declared values (``max_runtime_s``, ``resources.memory_gib``, ``resources.vram_gib``).

Sketches: logarithmic mapping with relative accuracy :data:`SKETCH_RELATIVE_ACCURACY` (a quantile read back is
within 1 % of a value of the sketched set at that rank), a collapsing-lowest dense store of at most
:data:`p2pnode.snapshot.SKETCH_BINS_MAX` bins (past it, the lowest bins merge: accuracy is lost on the lowest
quantiles first, never on the median or p90 that predictions use). Values are clamped into
[:data:`SKETCH_FLOOR`, :data:`SKETCH_CEILING`] so no zero or negative bin is needed.

A member's summary is untrusted (decoded and bounded by its types first). Reading one back never trusts its
``count`` or ``sum``: a sketch holds what its bins hold (``count`` is their sum), keys are clamped into the
mapping's range (no overflow however large the offset), empty bins are skipped, and the bins read from one
member's summary are capped (:data:`MAX_DOC_BINS`, most-run entries first). No crafted :class:`SketchWire` makes
a function here raise or run long.

Robust across nodes ("merge per node, robust across nodes"): for each template, scope (a node class, or ``""``
the whole fleet) and figure (run time, peak RSS, peak VRAM), each node's runs are merged first and its median
taken; the reference is the lower median of those per-node medians; a node whose median lies outside a factor
:data:`OUTLIER_FACTOR` of the reference is left out of that figure's merge and recorded in
:attr:`Predictor.outliers` with why. So one member reporting 1000x values (a broken probe, a crafted summary)
moves no prediction; the lower median favours the smaller figures, the side that never blocks a placement.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from ..errors import RejectedMessage, RejectReason
from ..resources._power import match_model, normalize_model_name
from ..snapshot import SKETCH_BINS_MAX, SketchWire, UsageDoc, UsageEntry, usage_digest
from ._catalog import Catalog

__all__ = ["MAX_DOC_BINS", "MAX_USAGE_BYTES", "OUTLIER_FACTOR", "SKETCH_CEILING", "SKETCH_FLOOR",
           "SKETCH_RELATIVE_ACCURACY", "Prediction", "Predictor", "RunRecord", "Sketch", "merge_wires",
           "node_class_of", "open_usage", "quantile", "sketch_from_wire", "sketch_of", "summarize"]

GIB = 2**30
SKETCH_RELATIVE_ACCURACY = 0.01
"""Relative accuracy of every sketch (DDSketch's alpha): a quantile is read back within 1 %."""
SKETCH_FLOOR = 1e-3
"""The least value sketched (seconds or bytes); smaller values count as this."""
SKETCH_CEILING = 1e15
"""The largest value sketched; larger values count as this."""
OUTLIER_FACTOR = 4.0
"""A node whose median lies outside this factor of the reference (the lower median of the per-node medians) is
left out of the fleet's figure."""
MAX_DOC_BINS = 65_536
"""Bins read from one member's summary at most (its most-run entries first; the rest is left out, recorded)."""
MAX_USAGE_BYTES = 8 * 2**20
"""A fetched usage summary, at most (256 entries of 3 sketches of up to 1,024 bins)."""
USAGE_ENTRIES_MAX = 256
WIRE_COUNT_MAX = 1e12
WIRE_SUM_MAX = 1e30
MAX_OUTLIER_NOTES = 4



@functools.cache
def _mapping() -> tuple[Any, int, int]:
    """The sketches' mapping and its lowest and highest key. ddsketch (with six) is imported here, at the first
    sketch: a node that never summarises its history (no catalog) does not load it (issue 43, idle RSS)."""
    from ddsketch import LogarithmicMapping

    mapping = LogarithmicMapping(SKETCH_RELATIVE_ACCURACY)
    return mapping, mapping.key(SKETCH_FLOOR), mapping.key(SKETCH_CEILING)


def _clamp_key(key: int) -> int:
    _, lo, hi = _mapping()
    return min(hi, max(lo, key))

_DOC = msgspec.msgpack.Decoder(UsageDoc)
Figure = Literal["runtime_s", "peak_rss_bytes", "peak_vram_bytes"]
_FIGURES: tuple[Figure, ...] = ("runtime_s", "peak_rss_bytes", "peak_vram_bytes")


# -- sketches -------------------------------------------------------------------------------------------------------
class Sketch:
    """A mergeable DDSketch of positive values (see the module docstring): :meth:`add`, :meth:`merge`,
    :meth:`quantile`, :meth:`wire`. ``count`` is the sum of its bins."""

    def __init__(self) -> None:
        from ddsketch import CollapsingLowestDenseStore
        from ddsketch.ddsketch import BaseDDSketch

        self.store = CollapsingLowestDenseStore(SKETCH_BINS_MAX)
        self.dd = BaseDDSketch(_mapping()[0], self.store, CollapsingLowestDenseStore(1), 0.0)

    @property
    def count(self) -> float:
        """How many values (weights) it holds."""
        return float(self.dd.count)

    def add(self, value: float, weight: float = 1.0) -> None:
        """Add ``value`` (clamped into [:data:`SKETCH_FLOOR`, :data:`SKETCH_CEILING`]; NaN counts as the floor)
        with ``weight`` (> 0 and finite; anything else is ignored)."""
        if not (weight > 0.0 and math.isfinite(weight)):
            return
        v = value if value == value else SKETCH_FLOOR
        self.dd.add(min(SKETCH_CEILING, max(SKETCH_FLOOR, v)), weight)

    def add_key(self, key: int, weight: float) -> None:
        """Add ``weight`` to the bin ``key`` (clamped into the mapping's range)."""
        self.add(_mapping()[0].value(_clamp_key(key)), weight)

    def merge(self, other: Sketch) -> None:
        """Add every value of ``other``."""
        self.dd.merge(other.dd)

    def scaled(self, factor: float) -> Sketch:
        """A copy whose every bin weighs ``factor`` times as much (0 < factor <= 1: a node's weight capped)."""
        out = Sketch()
        st = self.store
        for i, c in enumerate(st.bins):
            if c > 0:
                out.add_key(st.offset + i, c * factor)
        return out

    def quantile(self, q: float) -> float | None:
        """The value at quantile ``q`` (0..1; None when empty)."""
        # (DDSketch reads rank q * (count - 1): under one value in all, only rank 0 is one it holds)
        v = self.dd.get_quantile_value(min(1.0, max(0.0, q)) if self.count >= 1.0 else 0.0)
        return None if v is None else float(v)

    def wire(self) -> SketchWire:
        """The sketch as it travels (:class:`p2pnode.snapshot.SketchWire`): the bins from its lowest to its
        highest key, each capped at 1e12."""
        s = self.store
        if self.count <= 0 or s.min_key > s.max_key:
            return SketchWire()
        lo, hi = s.min_key - s.offset, s.max_key - s.offset
        bins = [min(WIRE_COUNT_MAX, float(b)) for b in s.bins[lo:hi + 1]][:SKETCH_BINS_MAX]
        return SketchWire(count=min(WIRE_COUNT_MAX, sum(bins)), sum=min(WIRE_SUM_MAX, max(0.0, float(self.dd.sum))),
                          offset=_clamp_key(s.min_key), bins=bins)


def sketch_of(values: Iterable[float]) -> SketchWire:
    """The sketch of ``values`` (seconds or bytes), as it travels."""
    s = Sketch()
    for v in values:
        s.add(v)
    return s.wire()


def sketch_from_wire(w: SketchWire, budget: list[int] | None = None) -> Sketch:
    """The sketch a (decoded, untrusted) wire holds: its non-empty bins, keys clamped into the mapping's range;
    ``count`` and ``sum`` are not trusted. ``budget`` (a one-item list, decremented): the bins still to be read;
    once it reaches 0 the rest is left out. Never raises."""
    s = Sketch()
    for i, c in enumerate(w.bins[:SKETCH_BINS_MAX]):
        if c > 0.0:
            if budget is not None:
                if budget[0] <= 0:
                    break
                budget[0] -= 1
            s.add_key(w.offset + i, c)
    return s


def merge_wires(wires: Iterable[SketchWire]) -> SketchWire:
    """One sketch holding every value of ``wires``."""
    s = Sketch()
    for w in wires:
        s.merge(sketch_from_wire(w))
    return s.wire()


def quantile(w: SketchWire, q: float) -> float | None:
    """The value at quantile ``q`` (0..1) of the sketch ``w`` (None when empty)."""
    return sketch_from_wire(w).quantile(q)


# -- a node's summary -------------------------------------------------------------------------------------------------
class RunRecord(msgspec.Struct, frozen=True):
    """One finished run as the summary reads it: ``template``, the ``node_class`` it ran on, its run time
    (seconds), peak RSS and peak VRAM (bytes; None or 0: not measured)."""

    template: str
    node_class: str
    runtime_s: float
    peak_rss_bytes: float | None = None
    peak_vram_bytes: float | None = None


def summarize(node_id: str, runs: Iterable[RunRecord]) -> UsageDoc:
    """``node_id``'s :class:`UsageDoc` from its finished ``runs``: one entry per template and node class, the
    most-run first (ties by name), at most 256; an entry whose names would not decode (bad template or class
    text) is left out."""
    groups: dict[tuple[str, str], tuple[list[float], Sketch, Sketch, Sketch]] = {}
    for r in runs:
        g = groups.get((r.template, r.node_class))
        if g is None:
            g = groups[(r.template, r.node_class)] = ([0.0], Sketch(), Sketch(), Sketch())
        g[0][0] += 1
        g[1].add(r.runtime_s)
        if r.peak_rss_bytes:
            g[2].add(r.peak_rss_bytes)
        if r.peak_vram_bytes:
            g[3].add(r.peak_vram_bytes)
    entries = []
    for (template, cls), (n, rt, rss, vram) in sorted(groups.items(), key=lambda kv: (-kv[1][0][0], kv[0])):
        e = UsageEntry(template=template, node_class=cls, runs=int(n[0]), runtime_s=rt.wire(),
                       peak_rss_bytes=rss.wire() if rss.count else None,
                       peak_vram_bytes=vram.wire() if vram.count else None)
        try:
            msgspec.convert(msgspec.to_builtins(e), UsageEntry)
        except msgspec.ValidationError:
            continue
        entries.append(e)
        if len(entries) >= USAGE_ENTRIES_MAX:
            break
    return UsageDoc(node=node_id, entries=entries)


def open_usage(data: bytes, digest: str) -> UsageDoc:
    """Decode a member's usage summary (``GET /jobs/usage``, msgpack) and check it against the ``usage_digest``
    of its signed snapshot. Raises :class:`RejectedMessage`: ``oversized``, ``malformed``, ``bad_type``, ``stale``
    (it hashes to another digest: the summary changed since, or is not what the member signed)."""
    if len(data) > MAX_USAGE_BYTES:
        raise RejectedMessage(RejectReason.OVERSIZED, f"usage summary: {len(data)} bytes > {MAX_USAGE_BYTES}")
    try:
        doc = _DOC.decode(data)
    except msgspec.ValidationError as exc:
        raise RejectedMessage(RejectReason.BAD_TYPE, f"usage summary: {exc}") from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RejectedMessage(RejectReason.MALFORMED, f"usage summary: {exc}") from None
    if usage_digest(doc) != digest:
        raise RejectedMessage(RejectReason.STALE, "usage summary does not match the signed digest")
    return doc


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


# -- the fleet's predictions ----------------------------------------------------------------------------------------
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


class _Merged(msgspec.Struct):
    """One scope's figures of a template: per figure the merged sketch of the nodes kept, and how many."""

    sketches: dict[str, Sketch]
    nodes: dict[str, int]


class Predictor:
    """The fleet's predictions from the members' summaries ``docs`` (node id -> :class:`UsageDoc`, each decoded
    and bounded), the catalog's declared values where history is short (fewer than ``min_runs`` runs).

    :meth:`predict` prefers the node class's own figures, then the fleet's over every class, then the declared
    values. Figures are merged per node, then across nodes with outliers left out (module docstring). Built
    lazily per template and memoized: a predictor is rebuilt only when the docs or the catalog change."""

    def __init__(self, docs: Mapping[str, UsageDoc] | None = None, catalog: Catalog | None = None, *,
                 min_runs: int = 3) -> None:
        self.docs = dict(docs or {})
        self.catalog = catalog
        self.min_runs = min_runs
        self._outliers: dict[str, list[str]] = {}
        # template -> [(node, entry)], within each doc's bin budget
        self._entries: dict[str, list[tuple[str, UsageEntry]]] = {}
        self._read: dict[int, Sketch] = {}  # id(wire) -> its sketch (read once)
        self._budget: dict[str, list[int]] = {}
        for node, doc in sorted(self.docs.items()):
            for e in doc.entries[:USAGE_ENTRIES_MAX]:
                self._entries.setdefault(e.template, []).append((node, e))
        self._scopes: dict[str, dict[str, _Merged]] = {}  # template -> scope -> figures
        self._memo: dict[tuple[str, str], Prediction | None] = {}

    @property
    def outliers(self) -> dict[str, str]:
        """Node id -> why its summary (of a template, scope and figure) was left out of the fleet's figures
        (every template looked at: builds the whole table once)."""
        self.table()
        return {node: "; ".join(notes) for node, notes in self._outliers.items()}

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
        key = (template, node_class)
        if key not in self._memo:
            self._memo[key] = self._predict(template, node_class)
        return self._memo[key]

    def _predict(self, template: str, node_class: str) -> Prediction | None:
        scopes = self._figures(template)
        for scope in ([node_class] if node_class else []) + [""]:
            p = self._prediction(template, scope, scopes.get(scope))
            if p is not None and p.runs >= self.min_runs:
                return p
        declared = self.declared(template)
        if declared is not None:
            return declared
        return self._prediction(template, "", scopes.get(""))

    def table(self, template: str | None = None) -> list[Prediction]:
        """Every prediction for display: per template (``template`` only, when given) the figures of each node
        class with history and the fleet's (``""``: history, else the declared values); sorted by template, the
        fleet's row first."""
        names = set(self._entries)
        if self.catalog is not None:
            names |= set(self.catalog.templates)
        out = []
        for name in sorted(names if template is None else names & {template}):
            scopes = self._figures(name)
            fleet = self._prediction(name, "", scopes.get(""))
            row = fleet if fleet is not None else self.declared(name)
            if row is not None:
                out.append(row)
            for scope in sorted(s for s in scopes if s):
                p = self._prediction(name, scope, scopes[scope])
                if p is not None:
                    out.append(p)
        return out

    # -- merging -----------------------------------------------------------------------------------------------
    def _sketch(self, node: str, w: SketchWire) -> Sketch:
        s = self._read.get(id(w))
        if s is None:
            s = self._read[id(w)] = sketch_from_wire(w, self._budget.setdefault(node, [MAX_DOC_BINS]))
            if self._budget[node][0] <= 0:
                self._note(node, f"summary over {MAX_DOC_BINS} bins: its least-run entries left out")
        return s

    def _figures(self, template: str) -> dict[str, _Merged]:
        """Per scope (each node class with history, and ``""``) the merged figures of ``template``."""
        hit = self._scopes.get(template)
        if hit is not None:
            return hit
        per_node: dict[str, dict[str, dict[str, Sketch]]] = {}  # scope -> node -> figure -> sketch
        for node, e in self._entries.get(template, []):
            for scope in (e.node_class, ""):
                figs = per_node.setdefault(scope, {}).setdefault(node, {})
                for f in _FIGURES:
                    w: SketchWire | None = getattr(e, f)
                    if w is None or not w.bins:
                        continue
                    s = figs.setdefault(f, Sketch())
                    s.merge(self._sketch(node, w))
        out = {scope: self._robust(template, scope, nodes) for scope, nodes in per_node.items()}
        self._scopes[template] = out
        return out

    def _robust(self, template: str, scope: str, nodes: Mapping[str, Mapping[str, Sketch]]) -> _Merged:
        """Merge each figure over ``nodes``, robust across nodes: a node whose median or p90 lies outside
        :data:`OUTLIER_FACTOR` of the lower median of the nodes' medians (p90s) is left out, and no node weighs
        more than :data:`OUTLIER_FACTOR` times the lower median of the kept nodes' run counts (its bins scaled
        down): a member claiming a billion runs moves the figures no more than one with four times the usual."""
        merged = _Merged({}, {})
        for f in _FIGURES:
            stats = []
            for node, figs in nodes.items():
                s = figs.get(f)
                m = s.quantile(0.5) if s is not None and s.count > 0 else None
                p90 = s.quantile(0.9) if s is not None and m is not None else None
                if s is not None and m is not None and p90 is not None:
                    stats.append((m, p90, s.count, node))
            if not stats:
                continue
            ref = lower_median([m for m, _p, _c, _n in stats])
            ref90 = lower_median([p for _m, p, _c, _n in stats])
            kept = []
            for m, p90, count, node in stats:
                if ref / OUTLIER_FACTOR <= m <= ref * OUTLIER_FACTOR and ref90 / OUTLIER_FACTOR <= p90 <= \
                        ref90 * OUTLIER_FACTOR:
                    kept.append((count, node))
                else:
                    where = f"{template} on {scope or 'the fleet'}"
                    self._note(node, f"{where}: {f} median {m:.4g} / p90 {p90:.4g} outside {OUTLIER_FACTOR:g}x of "
                                     f"the reference {ref:.4g} / {ref90:.4g} (lower medians of {len(stats)} nodes): "
                                     "left out")
            cap = OUTLIER_FACTOR * lower_median([c for c, _n in kept]) if kept else 0.0
            total = Sketch()
            for count, node in kept:
                sk = nodes[node][f]
                total.merge(sk if count <= cap else sk.scaled(cap / count))
            merged.sketches[f], merged.nodes[f] = total, len(kept)
        return merged

    def _note(self, node: str, why: str) -> None:
        notes = self._outliers.setdefault(node, [])
        if why not in notes and len(notes) < MAX_OUTLIER_NOTES:
            notes.append(why)

    def _prediction(self, template: str, scope: str, m: _Merged | None) -> Prediction | None:
        """The history figures of one scope (None: no run time sketched)."""
        if m is None:
            return None
        rt = m.sketches.get("runtime_s")
        p50 = rt.quantile(0.5) if rt is not None else None
        p90 = rt.quantile(0.9) if rt is not None else None
        if rt is None or p50 is None or p90 is None:
            return None
        return Prediction(template, scope, p50, p90, _q90(m.sketches.get("peak_rss_bytes")),
                          _q90(m.sketches.get("peak_vram_bytes")), runs=round(rt.count),
                          nodes=m.nodes.get("runtime_s", 0), source="history")


def _q90(s: Sketch | None) -> float | None:
    return s.quantile(0.9) if s is not None and s.count > 0 else None


def lower_median(values: Sequence[float]) -> float:
    """The lower median of ``values`` (non-empty)."""
    return sorted(values)[(len(values) - 1) // 2]
