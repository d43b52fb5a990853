"""Valid-shaped snapshots with hostile values, for the fuzz suite (:mod:`fuzz.drive`).

One description of the shapes, two sources of choices:

* :class:`HypothesisDraw` over ``st.data()`` (the normal test run; ``derandomize=True`` makes it reproducible),
  and :func:`snapshots`, the same as a plain hypothesis strategy;
* :class:`RandomDraw`: the same generator over a ``random.Random(seed)``, about ten times faster, for the
  100,000-case run (``bench/fuzz_snapshots.py``).

Every section of the schema-2 :class:`p2pnode.snapshot.Snapshot` is produced: the header (schema, origin,
version, addr, tags, leaving, started_at, ts, agent_version, trust), ``resources`` (with gpus), ``membership``
(incarnation, suspects), ``vote``, ``jobs`` (running, refused, offer, signals stamped with a Lamport clock,
catalog_digest), ``plan`` (term, seq, digest, at, assignments, stops, pending), ``sync`` (receipts,
receipt_digests, data_port, totals), ``guard`` and ``events`` (with payloads), plus unknown fields, among them
the flat fields of schema 1 (``incarnation``, ``suspects``, ``refused``, ``offer``, ``catalog_digest`` at the top,
``at`` in a signal, ``jobs`` in a plan), which a schema-2 decoder must drop. Sometimes a whole snapshot has the
old flat shape (schema 1, or schema 2 with a list where a section belongs): ``bad_schema`` / ``bad_type``.
Each value is mostly near-valid (inside or at the edge of its bound, so most snapshots pass the decoder and reach
the consumers), sometimes hostile for its kind (2^50, 2^53, 2^63-1, -1, NaN, +-inf, over-long strings and lists,
control characters) and sometimes of the wrong type (bytes for strings, maps for lists...).
Node ids are drawn from the receiver's context (:class:`Context`): its own id, the members it holds, the
leader, the signer; plan assignments name the receiver with templates from its catalog and from outside it;
signals name the catalog's configs.

The draw interface (``Draw``): ``int(lo, hi)``, ``choice(seq)`` (the first element is the benign one: it is
what hypothesis shrinks to), ``chance(p)`` (True with probability about ``p``; shrinks to False).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hypothesis import strategies as st

__all__ = ["Context", "Draw", "HypothesisDraw", "RandomDraw", "gen_case", "gen_snapshot", "snapshots"]

GIB = 2**30
INF = math.inf
NAN = math.nan

HOSTILE_INTS = (0, 1, -1, 2, 7, 255, 1023, 1024, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**40, 2**50, 2**50 + 1,
                2**53 - 1, 2**53,
                2**53 + 1, 2**62, 2**62 + 1, 2**63 - 1, -(2**31), -(2**53), -(2**63), 2**64 - 1)
HOSTILE_FLOATS = (0.0, -0.0, 0.5, 1.0, -1.0, 5e-324, 1e-308, 64.0, 64.000001, 99.9, 100.0, 1000.0, 1000.0001,
                  1e9, 1e11, 1e11 + 1, 1e15, 1e15 + 1, 2.0**53, 2.0**63, 1e308, -1e308, NAN, INF, -INF)
HOSTILE_STRS = ("", "x", "a" * 64, "a" * 65, "b" * 128, "b" * 129, "c" * 256, "c" * 257, "d" * 512, "d" * 513,
                "e" * 1024, "e" * 1025, "f" * 5000, "\x00", "nul\x00inside", "\u00e9\u4e2d\U0001f600",
                "../../../etc/passwd", "/etc/shadow", "{python}", "{catalog_dir}", "$(reboot)", "%s%n",
                "cost_per_hour=1e308", "cost_per_hour=nan", "cost_per_hour=-inf", "cost_per_hour=x",
                "voter", "durable", "ephemeral", "NaN", "Infinity", "-1", "1e309", "true", "null",
                "\x01" * 96, "\x1b[2J\x1b[31mred", "tab\there", "line\nfeed", "cr\r", "\x7f", "\x1f" * 64,
                "\u0085nel", "\u2028sep", "\ufeffbom")
WRONG_TYPES: tuple[Any, ...] = (None, True, False, b"bytes", b"\xff\xfe", "str", 1, -1, 1.5, NAN, [], [1, "a"], {},
                                {"k": 1}, {1: 2}, [[[]]], 2**63 - 1)
GPU_NAMES = ("NVIDIA H100 80GB HBM3", "H200", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090", "RTX 3060",
             "NVIDIA GH200 480GB", "L40S", "Tesla T4", "unknown", "", "H100" * 64)
CONFIGS = ("hex8_2p", "square19_2p", "unknown_cfg", "", "x" * 64, "../cfg", "hex8_2p\x00", "hex8_2p\n")
EVENT_NAMES = ("IDLE_RESOURCE_DETECTED", "DISK_PRESSURE", "LEVEL_CHANGED", "REPLICA_LOST", "", "x" * 64)
SCALES = (0.0, 0.0, 0.0, 0.0, 0.03, 0.03, 0.1, 0.3, 1.0, 1.0)
"""Hostility per snapshot (see :func:`bad`): 40 % clean, the rest with more and more invalid values."""
SIGNAL_KEYS = ("curriculum_weight", "elo_velocity", "data_age_s", "quality", "game_count")
SIGNAL_BOUNDS = {"curriculum_weight": (0.0, 100.0), "elo_velocity": (-1e4, 1e4), "data_age_s": (0.0, 3.2e8),
                 "quality": (0.0, 1.0), "game_count": (0, 10**12)}
"""The values of a signal and their valid ranges (:func:`p2pnode.scheduler.validate_signals`)."""
CLOCKS = (1, 2, 3, 1000, 2**50 - 1, 2**50, 2**50 + 1, 2**53 - 1)
"""Lamport clocks of signals: small, at and past the clock bound (2^50), at the wire bound (2^53 - 1)."""
LEGACY_FIELDS = ("incarnation", "suspects", "refused", "offer", "signals", "catalog_digest")
"""Top-level fields of schema 1 that moved into sections: unknown at the top of a schema-2 snapshot."""


class Draw(Protocol):
    def int(self, lo: int, hi: int) -> int: ...
    def choice(self, seq: Sequence[Any]) -> Any: ...
    def chance(self, p: float) -> bool: ...


class RandomDraw:
    """Choices from a ``random.Random`` (fast; for the 100k run)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.rng.randrange(len(seq))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class HypothesisDraw:
    """Choices drawn by hypothesis (``st.data()``), so examples are reproducible (and shrink towards benign)."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def int(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def choice(self, seq: Sequence[Any]) -> Any:
        return seq[self.draw(st.integers(0, len(seq) - 1))]

    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 999)) >= 1000 - round(p * 1000)


@dataclass
class Context:
    """What the generator may name: the receiver's own id, the members it holds, the current leader (if a fuzz
    identity leads), the catalog's templates and configs, job ids running on the receiver, and its GPU count."""

    self_id: str = "self"
    member_ids: list[str] = field(default_factory=list)
    leader_id: str | None = None
    templates: list[str] = field(default_factory=lambda: ["selfplay-hex8_2p"])
    running_job_ids: list[str] = field(default_factory=list)
    gpu_count: int = 2
    catalog_digest: str = ""
    configs: list[str] = field(default_factory=lambda: ["hex8_2p", "square19_2p"])


# -- values by kind -------------------------------------------------------------------------------------------
def bad(d: Draw, p: float) -> bool:
    """True with probability ``p`` times the snapshot's hostility (``d.scale``, drawn per snapshot by
    :func:`gen_snapshot`): with scale 0 every value is valid for the decoder (edges and receiver-absent ids
    included), so the consumers see many snapshots; with scale 1 most snapshots carry something invalid."""
    return d.chance(p * getattr(d, "scale", 1.0))


def pick(d: Draw, seq: Sequence[Any]) -> Any:
    """An element of ``seq``, whose length depends on the receiver's state, by one draw of a fixed range (so
    hypothesis sees the same choices whatever the state: its data generation stays consistent)."""
    return seq[d.int(0, 63) % len(seq)]


def _wrong(d: Draw) -> Any:
    return d.choice(WRONG_TYPES)


def _hostile_num(d: Draw) -> Any:
    return d.choice(HOSTILE_INTS) if d.chance(0.5) else d.choice(HOSTILE_FLOATS)


def v_int(d: Draw, lo: int, hi: int, *, hostile: float = 0.08) -> Any:
    """An int in [lo, hi] (edges likely), sometimes a hostile number or a wrong type."""
    if bad(d, hostile):
        return _wrong(d) if d.chance(0.3) else _hostile_num(d)
    r = d.int(0, 9)
    if r == 0:
        return lo
    if r == 1:
        return hi
    return d.int(lo, min(hi, lo + 1000)) if r < 7 else d.int(lo, hi)


def v_float(d: Draw, lo: float, hi: float, *, hostile: float = 0.08) -> Any:
    if bad(d, hostile):
        return _wrong(d) if d.chance(0.3) else _hostile_num(d)
    r = d.int(0, 9)
    if r == 0:
        return float(lo)
    if r == 1:
        return float(hi)
    if r == 2:
        return d.int(int(max(lo, -1e6)), int(min(hi, 1e6)))  # an int where a float is expected
    return lo + (hi - lo) * d.int(0, 1000) / 1000.0


def v_str(d: Draw, max_len: int = 64, pool: Sequence[str] = (), *, hostile: float = 0.08) -> Any:
    if bad(d, hostile):
        if d.chance(0.3):
            return _wrong(d)
        return d.choice(HOSTILE_STRS)
    if pool and d.chance(0.6):
        return d.choice(pool)
    n = d.choice((0, 1, 8, max_len // 2, max_len))
    return d.choice("abcxyz0_-.") * n


def v_id(d: Draw, ctx: Context, *, hostile: float = 0.05) -> Any:
    """A node id: the receiver's own, a member's, the leader's, a stranger's, or hostile."""
    if bad(d, hostile):
        return v_str(d, 64, hostile=1.0)
    opts = [ctx.self_id, *(ctx.member_ids[:8] or [ctx.self_id])]
    if ctx.leader_id:
        opts.append(ctx.leader_id)
    r = d.int(0, 9)
    if r < 7:
        return pick(d, opts)
    return pick(d, ("stranger", "0" * 64, "n" * 64, "-"))


def v_list(d: Draw, item: Any, *, cap: int, typical: int = 4, hostile: float = 0.04) -> Any:
    """A list of ``item(d)``: mostly 0..typical long, sometimes exactly ``cap`` or ``cap + 1`` (only for short
    items), sometimes a wrong type."""
    if bad(d, hostile):
        if d.chance(0.4):
            return d.choice((None, "list", {}, b"\x00", 3))
        n = d.choice((cap, cap + 1)) if cap <= 80 else d.choice((typical * 4, typical * 8))
    else:
        n = d.int(0, typical)
    return [item(d) for _ in range(n)]


def v_map(d: Draw, key: Any, val: Any, *, typical: int = 3, hostile: float = 0.04) -> Any:
    if bad(d, hostile):
        return d.choice((None, [], "map", b"\x01", 7))
    out: dict[Any, Any] = {}
    for _ in range(d.int(0, typical)):
        k = key(d)
        out[k if isinstance(k, (str, int, float, bytes, bool, type(None))) else 1] = val(d)  # keys stay hashable
    return out


def with_unknown(d: Draw, obj: dict[str, Any], p: float = 0.05) -> dict[str, Any]:
    """Maybe add unknown fields (a newer agent may send some; they must be dropped)."""
    if d.chance(p):
        for _ in range(d.int(1, 3)):
            obj[d.choice(("x_future", "node_id", "__class__", "extra" * 20, ""))] = \
                d.choice(WRONG_TYPES + ("v",))
    return obj


def maybe_drop(d: Draw, obj: dict[str, Any], p: float = 0.03) -> dict[str, Any]:
    """Sometimes drop one field (required or not)."""
    if obj and bad(d, p):
        obj.pop(d.choice(list(obj)))
    return obj


# -- sections -------------------------------------------------------------------------------------------------
def gen_gpu(d: Draw, ctx: Context) -> Any:
    if bad(d, 0.01):
        return _wrong(d)
    g = {
        "index": v_int(d, 0, max(0, ctx.gpu_count + 1), hostile=0.1) if not d.chance(0.1) else d.choice((1023, 63, 7)),
        "name": v_str(d, 96, GPU_NAMES),
        "uuid": v_str(d, 96),
        "util_percent": v_float(d, 0.0, 100.0),
        "mem_used_bytes": v_int(d, 0, 80 * GIB),
        "mem_total_bytes": d.choice((80 * GIB, 24 * GIB, 141 * GIB)) if d.chance(0.7) else v_int(d, 0, 2**62),
    }
    if d.chance(0.5):
        g["temperature_c"] = v_float(d, -300.0, 1000.0) if d.chance(0.9) else None
    if d.chance(0.5):
        g["power_w"] = v_float(d, 0.0, 1e6) if d.chance(0.9) else None
    return with_unknown(d, maybe_drop(d, g, 0.02))


def gen_resources(d: Draw, ctx: Context) -> Any:
    if bad(d, 0.005):
        return _wrong(d)
    r = {
        "cpu_percent": v_float(d, 0.0, 100.0),
        "cpu_count": v_int(d, 0, 1_000_000),
        "load_avg": v_list(d, lambda d: v_float(d, 0.0, 1e3), cap=3, typical=3),
        "mem_total_bytes": v_int(d, 0, 2**62),
        "mem_available_bytes": v_int(d, 0, 2**62),
        "mem_used_bytes": v_int(d, 0, 2**62),
        "mem_percent": v_float(d, 0.0, 100.0),
        "disk_path": v_str(d, 1024, ("/", "/data")),
        "disk_total_bytes": v_int(d, 0, 2**62),
        "disk_used_bytes": v_int(d, 0, 2**62),
        "disk_free_bytes": v_int(d, 0, 2**62),
        "disk_percent": v_float(d, 0.0, 100.0),
        "gpus": v_list(d, lambda d: gen_gpu(d, ctx), cap=32, typical=3),
        "gpu_source": v_str(d, 64, ("fake", "nvml", "none")),
        "power_score": v_float(d, 0.0, 1e9) if not bad(d, 0.2) else d.choice((1e308, INF, NAN, -1.0)),
        "vram_total_bytes": v_int(d, 0, 2**62),
    }
    if d.chance(0.2):
        r["gpu_absent_reason"] = v_str(d, 512) if d.chance(0.8) else None
    return with_unknown(d, maybe_drop(d, r, 0.05))


def gen_template(d: Draw, ctx: Context) -> Any:
    if d.chance(0.7):
        return d.choice(ctx.templates)
    return v_str(d, 256, ("train-other", "rm -rf", ""), hostile=0.2)


def gen_job_id(d: Draw, ctx: Context) -> Any:
    if d.chance(0.2):  # a job running on the receiver; the draws are the same whether one runs or not
        return pick(d, ctx.running_job_ids or ["j-none"])
    return v_str(d, 256, ("j-1", "j-2", "j-3", "train-1", "a" * 256), hostile=0.05)


def gen_gpus_list(d: Draw, ctx: Context) -> Any:
    def idx(d: Draw) -> Any:
        if bad(d, 0.05):
            return d.choice((1024, -1, 2**63 - 1, 1.5, "0", None))
        if d.chance(0.85):
            return d.int(0, max(0, ctx.gpu_count - 1))
        return d.choice((ctx.gpu_count, 7, 63, 1023))  # valid for the decoder, absent on the receiver
    return v_list(d, idx, cap=64, typical=2)


def gen_gang_slot(d: Draw, ctx: Context) -> Any:
    """A :class:`p2pnode.snapshot.GangSlot`: ranks, sizes, a host and ports that reach a command line."""
    if bad(d, 0.02):
        return _wrong(d)
    size = v_int(d, 1, 64)
    return with_unknown(d, maybe_drop(d, {
        "id": gen_job_id(d, ctx), "rank": v_int(d, 0, 63), "size": size,
        "master": v_str(d, 253, ("127.0.0.1", "10.0.0.1", "node-1.lan", "::1", "-x", "a b", "$(id)", "h;ls")),
        "master_port": v_int(d, 1, 65535), "port_base": v_int(d, 1, 65535), "ports": v_int(d, 1, 1024),
        "engine": v_str(d, 16, ("process", "torchrun", "ray", "mpi"))}, 0.05))


def gen_job_report(d: Draw, ctx: Context) -> Any:
    if bad(d, 0.01):
        return _wrong(d)
    j = {
        "job_id": gen_job_id(d, ctx),
        "template": gen_template(d, ctx),
        "config": v_str(d, 256, CONFIGS),
        "kind": v_str(d, 64, ("selfplay", "training", "evaluation")),
        "gpus": gen_gpus_list(d, ctx),
        "gpu_fraction": v_float(d, 0.0, 64.0),
        "vram_gib": v_float(d, 0.0, 1e6),
        "started_at": v_float(d, 0.0, 1e11),
        "term": v_int(d, 0, 2**53 - 1),
    }
    if d.chance(0.5):
        j["pid"] = v_int(d, 0, 2**31) if d.chance(0.9) else None
    if d.chance(0.2):
        j["gang"] = gen_gang_slot(d, ctx)
    return with_unknown(d, maybe_drop(d, j, 0.03))


def gen_refusal(d: Draw, ctx: Context) -> Any:
    if bad(d, 0.01):
        return _wrong(d)
    r = {"job_id": gen_job_id(d, ctx), "template": gen_template(d, ctx), "reason": v_str(d, 512),
         "at": v_float(d, 0.0, 1e11)}
    return with_unknown(d, maybe_drop(d, r, 0.03))


def gen_signal_values(d: Draw) -> Any:
    """The values of one signal: mostly within their bounds, sometimes out of them, of the wrong type, or with an
    unknown key (a newer agent's field: accepted by the decoder, skipped by the merge)."""
    if bad(d, 0.02):
        return _wrong(d)
    out: dict[Any, Any] = {}
    for k in SIGNAL_KEYS:
        if d.chance(0.7):
            lo, hi = SIGNAL_BOUNDS[k]
            out[k] = v_float(d, -1e15, 1e15) if bad(d, 0.3) else v_float(d, lo, hi)
    if bad(d, 0.1):
        out[d.choice(("x_future", "at", "extra" * 20, "\x01", 1))] = d.choice(WRONG_TYPES + (1.0, 1e15))
    if bad(d, 0.02):
        out = {f"k{i}": float(i) for i in range(16 if d.chance(0.5) else 17)}
    return out


def gen_signal(d: Draw) -> Any:
    """One :class:`p2pnode.snapshot.SignalEntry`: a Lamport ``clock`` and the ``values`` (schema 1's wall-clock
    ``at`` sometimes rides along: an unknown field, dropped)."""
    if bad(d, 0.02):
        return _wrong(d)
    e: dict[str, Any] = {"clock": d.choice(CLOCKS) if d.chance(0.3) else v_int(d, 0, 2**53 - 1),
                         "values": gen_signal_values(d)}
    if d.chance(0.05):
        e["at"] = v_float(d, 0.0, 1e11)
    return with_unknown(d, maybe_drop(d, e, 0.03))


def gen_config(d: Draw, ctx: Context) -> Any:
    if d.chance(0.6):
        return pick(d, ctx.configs)
    return v_str(d, 64, CONFIGS)


def gen_params(d: Draw) -> Any:
    if bad(d, 0.05):
        return _wrong(d)
    out: dict[Any, Any] = {}
    for _ in range(d.int(0, 2)):
        k = d.choice(("seconds", "seconds", "games", "", "{python}", "x" * 64))
        if bad(d, 0.1):
            k = d.choice(("x" * 65, 1, b"seconds"))
        out[k] = d.choice((20.0, 1.0, 3600.0, 0.5, 3601.0, 60, True, "20", 2**63 - 1, 2**64 - 1, -(2**63), 1e15,
                           -1e15, "a" * 256, "", "{python}", "\x00"))
        if bad(d, 0.1):
            out[k] = d.choice((None, NAN, INF, 1e308, "a" * 300, [1.0], b"20"))
    if d.chance(0.02):
        out = {f"p{i}": i for i in range(64 if not bad(d, 0.5) else 65)}
    return out


def gen_plan_job(d: Draw, ctx: Context, term: Any) -> Any:
    if bad(d, 0.01):
        return _wrong(d)
    node = ctx.self_id if d.chance(0.6) else v_id(d, ctx)
    j = {
        "job_id": v_str(d, 256, (f"p-{d.int(0, 50)}", "train-1", "j-1"), hostile=0.05),
        "node": node,
        "template": gen_template(d, ctx),
        "gpus": gen_gpus_list(d, ctx),
        "gpu_fraction": d.choice((0.5, 1.0, 0.0)) if d.chance(0.6) else v_float(d, 0.0, 64.0),
        "vram_gib": d.choice((4.0, 8.0, 0.0)) if d.chance(0.6) else v_float(d, 0.0, 1e6),
        "params": gen_params(d),
        "term": term if d.chance(0.7) else v_int(d, 0, 2**53 - 1),
        "assigned_at": d.choice((1e9, 0.0)) if d.chance(0.3) else v_float(d, 0.0, 1e11),
    }
    if d.chance(0.2):
        j["gang"] = gen_gang_slot(d, ctx)
    return with_unknown(d, maybe_drop(d, j, 0.03))


def gen_plan_ref(d: Draw, term: Any) -> Any:
    """A :class:`p2pnode.snapshot.PlanRef` of ``term`` (the snapshot's ``plan`` section)."""
    if bad(d, 0.01):
        return _wrong(d)
    p = {"term": term, "seq": v_int(d, 0, 2**53 - 1), "digest": v_str(d, 64, ("", "0" * 32)),
         "at": v_float(d, 0.0, 1e11), "jobs": v_int(d, 0, 65536), "stops": v_int(d, 0, 65536),
         "pending": v_int(d, 0, 256)}
    return with_unknown(d, maybe_drop(d, p, 0.02))


def gen_plan(d: Draw, ctx: Context, term: Any) -> Any:
    """A :class:`p2pnode.snapshot.PlanSection` (a plan document, fetched beside the snapshot) of ``term``
    (sometimes with schema 1's ``jobs`` beside or instead of ``assignments``)."""
    if bad(d, 0.01):
        return _wrong(d)
    p = {
        "term": term,
        "seq": v_int(d, 0, 2**53 - 1),
        "digest": v_str(d, 64, ("", "0" * 32)),
        "at": v_float(d, 0.0, 1e11),
        "assignments": v_list(d, lambda d: gen_plan_job(d, ctx, term), cap=4096, typical=5),
        "stops": v_list(d, lambda d: with_unknown(d, maybe_drop(d, {
            "job_id": gen_job_id(d, ctx), "node": v_id(d, ctx), "reason": v_str(d, 512)})), cap=4096, typical=2),
        "pending": v_list(d, lambda d: with_unknown(d, maybe_drop(d, {
            "template": gen_template(d, ctx), "reason": v_str(d, 512), "wait_s": v_float(d, 0.0, 1e11)})),
            cap=256, typical=2),
    }
    if d.chance(0.03):
        p["jobs"] = p["assignments"] if d.chance(0.5) else p.pop("assignments")
    return with_unknown(d, maybe_drop(d, p, 0.02))


def gen_event(d: Draw) -> Any:
    if bad(d, 0.01):
        return _wrong(d)

    def pval(d: Draw) -> Any:
        r = d.int(0, 9)
        if r < 3:
            return v_str(d, 512)
        if r < 5:
            return v_int(d, -(2**31), 2**31)
        if r < 7:
            return v_float(d, -1e15, 1e15)
        if r == 7:
            return d.choice((True, None))
        if r == 8:
            return v_list(d, lambda d: v_str(d, 512), cap=16, typical=3)
        if bad(d, 1.0):
            return _hostile_num(d) if d.chance(0.5) else _wrong(d)
        return d.choice((-(2**63), 2**64 - 1, 0.0, -0.0, ""))

    e = {
        "name": v_str(d, 64, EVENT_NAMES),
        "seq": v_int(d, 0, 2**53 - 1),
        "at": v_float(d, 0.0, 1e11),
        "payload": v_map(d, lambda d: v_str(d, 64, ("gpu", "node_id", "at", "name", "path", "level"), hostile=0.05),
                         pval, typical=4),
    }
    return with_unknown(d, maybe_drop(d, e, 0.02))


def gen_receipt(d: Draw) -> Any:
    if bad(d, 0.03):
        return _wrong(d)
    root = bytes([d.int(0, 255)]) * 32 if not bad(d, 0.1) else d.choice((b"", b"x" * 31, b"y" * 33, "0" * 64, None))
    r = [v_str(d, 1024, ("a.bin", "dir/b.db", "../../x", "/abs")), v_int(d, 0, 2**62), root]
    if bad(d, 0.03):
        r = r[: d.int(0, 2)] if d.chance(0.5) else r + [1]
    return r


def gen_sync(d: Draw, ctx: Context) -> Any:
    if bad(d, 0.01):
        return _wrong(d)
    s: dict[str, Any] = {}
    if d.chance(0.6):
        s["receipts"] = v_map(d, lambda d: v_id(d, ctx), lambda d: v_list(d, gen_receipt, cap=1024, typical=4),
                              typical=2)
    if d.chance(0.5):
        s["receipt_digests"] = v_map(d, lambda d: v_id(d, ctx),
                                     lambda d: v_str(d, 32, ("0" * 32, "abc"), hostile=0.1), typical=2)
    if d.chance(0.6):
        s["data_port"] = v_int(d, 1, 65535) if not bad(d, 0.1) else d.choice((0, 65536, -1))
    if d.chance(0.4):
        s.update(digest=v_str(d, 64), files=v_int(d, 0, 2**40), bytes=v_int(d, 0, 2**62),
                 under_replicated=v_int(d, 0, 2**40))
    return with_unknown(d, s)


def gen_addr(d: Draw) -> Any:
    """A dialable ``host:port`` (or empty), sometimes one that must never reach a URL (issue 12's fuzz run found
    that a host label the IDNA codec refuses killed the agent's gossip loop)."""
    if bad(d, 0.1):
        return d.choice(("host:99999", "host:0", "nohost", "a" * 64 + ":1", "a..b:1", "h:80/x", "u@h:1", "h:1 ",
                         "\u00e9.com:1", "c" * 256, "[::1%eth0]:1", "h:1?q", "h#f:1", _wrong(d)))
    return d.choice(("127.0.0.1:1", "10.0.0.1:8770", "[::1]:80", "[fe80::1]:65535", "node-1.lan:8770",
                     "a" * 63 + ".b:1", "x_y:1", ""))


def gen_membership(d: Draw, ctx: Context) -> Any:
    if bad(d, 0.01):
        return _wrong(d)
    counter = lambda d: v_int(d, 0, 2**53 - 1)  # noqa: E731
    m: dict[str, Any] = {}
    if d.chance(0.8):
        m["incarnation"] = counter(d)
    if d.chance(0.6):
        m["suspects"] = v_map(d, lambda d: v_id(d, ctx), counter, typical=3)
    return with_unknown(d, m)


def gen_vote(d: Draw, ctx: Context) -> Any:
    if d.chance(0.1):
        return None
    return with_unknown(d, maybe_drop(d, {"candidate": v_id(d, ctx), "term": v_int(d, 0, 2**53 - 1)}))


def gen_jobs(d: Draw, ctx: Context) -> Any:
    """A :class:`p2pnode.snapshot.JobsSection` (sometimes schema 1's list of jobs in its place: ``bad_type``)."""
    if bad(d, 0.01):
        return _wrong(d) if d.chance(0.5) else [gen_job_report(d, ctx)]
    j: dict[str, Any] = {}
    opt = {
        "running": lambda: v_list(d, lambda d: gen_job_report(d, ctx), cap=32, typical=4),
        "running_count": lambda: v_int(d, 0, 65536),
        "running_digest": lambda: v_str(d, 64, ("", "0" * 32)),
        "refused": lambda: v_list(d, lambda d: gen_refusal(d, ctx), cap=64, typical=3),
        "offer": lambda: v_int(d, 0, 1_000_000),
        "signals": lambda: v_map(d, lambda d: gen_config(d, ctx), gen_signal, typical=3),
        "catalog_digest": lambda: ctx.catalog_digest if d.chance(0.5) else v_str(d, 64),
        "engines": lambda: v_list(d, lambda d: v_str(d, 16, ("process", "torchrun", "ray")), cap=8, typical=2),
        "ended": lambda: v_list(d, lambda d: with_unknown(d, {"job_id": gen_job_id(d, ctx), "ok": d.chance(0.5),
                                                              "at": v_float(d, 0.0, 1e11)}), cap=16, typical=2),
        # issue 42: the term its job control acted with (a leader's "behind" rule), the acks it gave (the lease's
        # last sign of life); issue 41: an interruption notice
        "term_seen": lambda: v_int(d, 0, 2**53 - 1),
        "acks": lambda: v_map(d, lambda d: v_id(d, ctx), lambda d: v_int(d, 0, 2**53), typical=3),
        "acks_horizon_ms": lambda: v_int(d, 0, 2**53),
        "notice_deadline_ms": lambda: v_int(d, 0, 2**53),
        "notice_reason": lambda: v_str(d, 64, ("", "spot", "preempted")),
    }
    for k, make in opt.items():
        if d.chance(0.6):
            j[k] = make()
    return with_unknown(d, j)


def gen_guard(d: Draw) -> Any:
    if bad(d, 0.01):
        return _wrong(d)
    return with_unknown(d, maybe_drop(d, {
        "level": v_int(d, 0, 4), "raw_level": v_int(d, 0, 4), "ratio": v_float(d, 0.0, 1e6),
        "reasons": v_list(d, lambda d: v_str(d, 512), cap=16, typical=2)}))


def gen_legacy(d: Draw, ctx: Context, snap: dict[str, Any]) -> None:
    """Add schema 1's flat fields at the top of ``snap`` (unknown in schema 2: dropped by the decoder)."""
    counter = lambda d: v_int(d, 0, 2**53 - 1)  # noqa: E731
    make = {
        "incarnation": lambda: counter(d),
        "suspects": lambda: v_map(d, lambda d: v_id(d, ctx), counter, typical=3),
        "refused": lambda: v_list(d, lambda d: gen_refusal(d, ctx), cap=64, typical=3),
        "offer": lambda: v_int(d, 0, 1_000_000),
        "signals": lambda: v_map(d, lambda d: gen_config(d, ctx),
                                 lambda d: {"at": v_float(d, 0.0, 1e11), "quality": v_float(d, 0.0, 1.0)}),
        "catalog_digest": lambda: v_str(d, 64),
    }
    for k in LEGACY_FIELDS:
        if d.chance(0.5):
            snap[k] = make[k]()


def gen_flat_snapshot(d: Draw, ctx: Context, *, origin: str, version: int) -> dict[str, Any]:
    """A snapshot of the old flat shape (schema 1 of 0.1): refused as ``bad_schema`` (or as ``bad_type`` when it
    claims schema 2 and carries its jobs as a list)."""
    snap: dict[str, Any] = {"schema": 1 if d.chance(0.7) else 2, "origin": origin, "version": version,
                            "addr": gen_addr(d), "tags": [], "leaving": False, "resources": gen_resources(d, ctx),
                            "vote": gen_vote(d, ctx)}
    if d.chance(0.5):  # every 0.1 agent sent its jobs as a list
        snap["jobs"] = v_list(d, lambda d: gen_job_report(d, ctx), cap=512, typical=2)
    gen_legacy(d, ctx, snap)
    if d.chance(0.5):
        snap["plan"] = {"term": v_int(d, 0, 2**53 - 1), "seq": 1, "at": 1e9,
                        "jobs": v_list(d, lambda d: gen_plan_job(d, ctx, 1), cap=4096, typical=3)}
    return snap


def gen_snapshot(d: Draw, ctx: Context, *, origin: str, version: int, term: Any | None = None,
                 vote_for: str | None = None) -> dict[str, Any]:
    """One schema-2 snapshot of ``origin`` at ``version``. ``term``/``vote_for`` make it a leader's (a vote for
    ``vote_for`` and a plan of ``term``)."""
    d.scale = d.choice(SCALES)
    if bad(d, 0.02):
        return gen_flat_snapshot(d, ctx, origin=origin, version=version)
    snap: dict[str, Any] = {
        "schema": 3 if not bad(d, 0.02) else d.choice((1, 0, 2, "3", 3.0, None, -1, 2**64 - 1)),
        "origin": origin,
        "version": version,
        "addr": gen_addr(d),
        "tags": v_list(d, lambda d: v_str(d, 128, ("voter", "durable", "ephemeral", "cost_per_hour=2.5",
                                                   "cost_per_hour=1e308", "cost_per_hour=nan", "provider=x")),
                       cap=64, typical=3),
        "leaving": d.chance(0.05) if not bad(d, 0.05) else d.choice((1, "no", None)),
    }
    opt = {
        "started_at": lambda: v_float(d, 0.0, 1e11),
        "ts": lambda: v_float(d, 0.0, 1e11),
        "agent_version": lambda: v_str(d, 64),
        "trust": lambda: v_str(d, 64, ("open", "token")),
        "resources": lambda: gen_resources(d, ctx),
        "membership": lambda: gen_membership(d, ctx),
        "vote": lambda: gen_vote(d, ctx),
        "jobs": lambda: gen_jobs(d, ctx),
        "plan": lambda: None if d.chance(0.1) else gen_plan_ref(d, v_int(d, 0, 2**53 - 1)),
        "sync": lambda: gen_sync(d, ctx),
        "guard": lambda: gen_guard(d),
        "events": lambda: v_list(d, gen_event, cap=64, typical=4),
        "label": lambda: {"name": v_str(d, 63, ("<script>alert(1)</script>", "gpu-07", "\u6771\u4eac", "a\u202eb")),
                          "provider": v_str(d, 63, ("vast.ai", "runpod")), "instance": v_str(d, 63, ("C.123",))},
    }
    for k, make in opt.items():
        if d.chance(0.6 if k != "resources" else 0.9):
            snap[k] = make()
    if bad(d, 0.02):
        gen_legacy(d, ctx, snap)
    if vote_for is not None:
        snap["vote"] = {"candidate": vote_for, "term": term}
        snap["plan"] = gen_plan_ref(d, term)
        doc = gen_plan(d, ctx, term)  # the document it names: served beside the snapshot
        if isinstance(doc, dict) and isinstance(snap["plan"], dict) and d.chance(0.8):
            doc.update({k: snap["plan"][k] for k in ("term", "seq", "digest") if k in snap["plan"]})
        snap["_plan_doc"] = doc
    return with_unknown(d, maybe_drop(d, snap, 0.02), 0.05)


# -- cases ----------------------------------------------------------------------------------------------------
SIGNERS = ("new", "member", "leader", "self", "forged_self", "mismatch")
"""Who signs a case: a throwaway identity (a new member), a member already held (next version), the fuzz
leader (a vote and a plan of a high term), the receiver's own key (an envelope of a former run), another key
claiming the receiver's id (impersonation), or a snapshot whose origin/version differ from the envelope's."""


def gen_case(d: Draw) -> dict[str, Any]:
    """The choices of one case that the driver resolves against the live agent: signer, version step, term."""
    signer = d.choice(("new", "new", "member", "member", "member", "leader", "leader", "self", "forged_self",
                       "mismatch"))
    version_step = d.choice((1, 1, 1, 2, 1000)) if d.chance(0.95) else d.choice(HOSTILE_INTS)
    term = d.choice((1, 2, 3, 10, 1000, 2**52, 2**53 - 1)) if d.chance(0.9) else d.choice(HOSTILE_INTS)
    return {"signer": signer, "version_step": version_step, "term": term,
            "jump_s": d.choice((0.0, 0.1, 0.5, 2.0, 10.0)),
            "seed": d.int(0, 2**32 - 1)}


@st.composite
def snapshots(draw: Any, ctx: Context, origin: str = "n" * 64, version: int = 1) -> dict[str, Any]:
    """Hypothesis strategy: one snapshot of ``origin`` (see :func:`gen_snapshot`)."""
    return gen_snapshot(HypothesisDraw(draw), ctx, origin=origin, version=version)
