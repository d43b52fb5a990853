"""The no-control-character rule of a snapshot's strings, checked once per snapshot (issue 43 item 3).

:func:`p2pnode.snapshot.decode_snapshot` leaves the rule of the header's, resources', GPUs' and jobs digests'
strings out of their msgspec types and checks it over all of them in one pass (``_rules_ok``), falling back to twin
types with the rule for any body that is not exactly the encoding of what it decodes to. These tests hold it to the
decoder it replaced: **the reference** is ``p2pnode/snapshot.py`` itself loaded a second time with every such type
set back to its patterned original (the classes as they were, the rule in every type), decoded as the former
``decode_snapshot`` did. Verdict, reason and detail must be the same on every body: random hostile snapshots of the
fuzz generator, canonical ones with a control character put into each string (first and last item of every list
and map), repeated keys (one in a body exactly as long as its canonical encoding), trailing bytes. And no other
class may defer the rule (nothing would check it there).
"""

from __future__ import annotations

import importlib.util
import itertools
import random
import re
import sys
import typing
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import pytest
from fuzz.strategies import Context, RandomDraw, gen_snapshot

import p2pnode.snapshot as S
from p2pnode.errors import RejectedMessage, RejectReason
from p2pnode.node._publish import _broken_sections

CONTROLS = [chr(c) for c in range(0x20)] + ["\x7f"]
SHADOWED = ("GpuInfo", "Resources", "JobsSection", "Snapshot")


def _reference_module() -> Any:
    """``p2pnode/snapshot.py`` with each ``_XOnce`` type set back to the patterned type it stands for."""
    src = Path(S.__file__).read_text()
    names = {id(v): k for k, v in vars(S).items() if not k.startswith("__")}
    for loose, strict in S._WITH_RULE.items():
        loose_name = next(k for k, v in vars(S).items() if v is loose and k.endswith("Once"))
        strict_name = names[id(strict)]
        src, n = re.subn(rf"^{loose_name} = Annotated\[.*\]$", f"{loose_name} = {strict_name}", src, flags=re.M)
        assert n == 1, loose_name
    spec = importlib.util.spec_from_loader("p2pnode._snapshot_reference", loader=None)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "p2pnode"
    sys.modules[spec.name] = mod
    exec(compile(src, S.__file__, "exec"), mod.__dict__)
    return mod


REF = _reference_module()
REF_DECODER = msgspec.msgpack.Decoder(REF.Snapshot)


def reference_decode(body: bytes) -> Any:
    """The former ``decode_snapshot`` over the reference classes (the rule checked by msgspec in every type)."""
    try:
        snap = REF_DECODER.decode(body)
    except msgspec.ValidationError as exc:
        if "$.schema" in str(exc) or S._schema_of(body) != S.SCHEMA_VERSION:
            raise RejectedMessage(RejectReason.BAD_SCHEMA, str(exc)) from None
        raise RejectedMessage(RejectReason.BAD_TYPE, str(exc)) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RejectedMessage(RejectReason.MALFORMED, str(exc)) from None
    if snap.schema != S.SCHEMA_VERSION:
        raise RejectedMessage(RejectReason.BAD_SCHEMA, f"snapshot schema {snap.schema!r}")
    receipts = snap.sync.receipts
    if receipts and sum(len(v) for v in receipts.values()) > S.MAX_RECEIPTS:
        raise RejectedMessage(RejectReason.BAD_TYPE, f"more than {S.MAX_RECEIPTS} sync receipts")
    return snap


def outcome(decode: Any, body: bytes) -> tuple[str, Any]:
    """``("ok", the snapshot's plain view)`` or ``(reason, detail)``."""
    try:
        snap = decode(body)
    except RejectedMessage as exc:
        return exc.reason.value, exc.detail
    return "ok", msgspec.to_builtins(snap, builtin_types=(bytes,))


def same(body: bytes) -> tuple[str, Any]:
    new, ref = outcome(S.decode_snapshot, body), outcome(reference_decode, body)
    assert new == ref, (body, new, ref)
    return new


# -- the deferred fields, found by their types -------------------------------------------------------------------
def deferred_paths(cls: type, prefix: str = "") -> list[str]:
    """Every place in ``cls`` (one of SHADOWED, recursively) whose type leaves the rule to decode_snapshot: a field
    ``a.b``, a list's items ``a.b[]``, a map's keys ``a.b{}``."""
    out = []
    hints = typing.get_type_hints(cls, include_extras=True)
    for name in cls.__struct_fields__:  # type: ignore[attr-defined]
        out += _paths_in(hints[name], f"{prefix}{name}")
    return out


def _paths_in(tp: Any, path: str) -> list[str]:
    if isinstance(tp, type):
        return deferred_paths(tp, path + ".") if tp.__name__ in SHADOWED else []
    if tp in S._WITH_RULE:
        return [path]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _paths_in(args[0], path)
    if origin is list:
        return _paths_in(args[0], path + "[]")
    if origin is dict:
        assert not _paths_in(args[1], path), "map values that defer the rule are not covered below"
        return _paths_in(args[0], path + "{}")
    return [p for a in args for p in _paths_in(a, path)]  # unions (X | None)


FULL = {  # a valid snapshot with every deferred place filled
    "schema": 3, "origin": "n" * 16, "version": 7, "addr": "10.0.0.5:7946", "tags": ["voter", "zone=a"],
    "leaving": False, "agent_version": "0.2.0", "trust": "open",
    "resources": {"disk_path": "/data", "gpu_source": "nvml", "gpu_absent_reason": "none here",
                  "declared": {"widgets": 2.0, "gadgets": 1.0},
                  "gpus": [{"name": "RTX", "uuid": "GPU-1"}, {"index": 1, "name": "B", "uuid": "GPU-2"}]},
    "jobs": {"catalog_digest": "c" * 32, "running_digest": "r" * 32, "usage_digest": "u" * 32, "node_class": "1xRTX",
             "acks": {"m" * 16: 5, "k" * 16: 9}},
}
"""Every list and map there holds two items, so that a check of the first item alone is caught (``_set``'s
``last``)."""


def canonical(d: dict) -> bytes:
    """The body an agent sends for the map ``d``: its typed snapshot encoded."""
    return S.encode_snapshot(msgspec.convert(d, S.Snapshot))


def _set(d: Any, path: str, bad: str, *, last: bool = False) -> None:
    """Put ``bad`` at ``path`` of ``d`` (the first list item or map key; with ``last``, the last one)."""
    head, _, rest = path.partition(".")
    key = head.rstrip("[]{}")
    at = -1 if last else 0
    if not rest:
        if head.endswith("[]"):
            d[key][at] = bad
        elif head.endswith("{}"):
            keys = list(d[key])
            d[key] = {(bad if k == keys[at] else k): v for k, v in d[key].items()}
        else:
            d[key] = bad
        return
    _set(d[key][at] if head.endswith("[]") else d[key], rest, bad, last=last)


def test_every_deferred_place_is_filled_by_the_fixture_and_checked_by_rules_ok():
    paths = deferred_paths(S.Snapshot)
    assert len(paths) == 16, paths  # a new one must be added to FULL (and to _rules_ok, which this then checks)
    assert same(canonical(FULL))[0] == "ok"
    for path, ch, last in itertools.product(paths, ("\x00", "\n", "\x1f", "\x7f"), (False, True)):
        d = msgpack.unpackb(msgpack.packb(FULL), strict_map_key=False)
        _set(d, path, f"a{ch}b", last=last)
        loose = msgspec.msgpack.Decoder(S.Snapshot).decode(canonical(d))
        assert not S._rules_ok(loose), (path, last)
        reason, detail = same(canonical(d))
        assert reason == "bad_type" and "regex" in detail, (path, last, detail)


def test_no_other_class_leaves_the_rule_to_decode_snapshot():
    """Only the four classes with twins may hold a type whose rule decode_snapshot checks itself: one used in any
    other struct (a section's) would be checked by no decoder at all, neither the pass nor the twins."""
    def uses_deferred(tp: Any) -> bool:
        try:
            if tp in S._WITH_RULE:
                return True
        except TypeError:  # an unhashable type argument
            pass
        return any(uses_deferred(a) for a in typing.get_args(tp))
    found = set()
    stack: list[type] = [msgspec.Struct]
    while stack:
        for cls in stack.pop().__subclasses__():
            stack.append(cls)
            if not cls.__module__.startswith("p2pnode") or cls.__module__ == REF.__name__:
                continue
            try:
                hints = typing.get_type_hints(cls, include_extras=True)
            except Exception:  # noqa: BLE001 - a forward reference this module cannot resolve
                continue
            if any(uses_deferred(hints[f]) for f in cls.__struct_fields__ if f in hints):
                found.add(cls.__name__)
    assert found == set(SHADOWED), found


def test_addr_is_checked_by_its_own_pattern():
    for addr in ("", "h:1", "[::1]:80", "a.b-c.d:65535", "h", "h:0", "h:65536", "-h:1", "h:1/x", "u@h:1", "h :1",
                 "xn--\u00e9:1", "h:1\n", "1.2.3.4:5\x00"):
        d = msgpack.unpackb(msgpack.packb(FULL), strict_map_key=False)
        d["addr"] = addr
        reason, _ = same(canonical_loose(d))
        assert (reason == "ok") == (re.search(S.ADDR_PATTERN, addr) is not None), addr


def test_rules_ok_is_the_pattern_for_every_character_class():
    for ch in CONTROLS + [" ", "~", "\x80", "\x85", "\u00a0", "\u2028", "\ufeff", "\ud800", "\U0001f600", "é"]:
        d = msgpack.unpackb(msgpack.packb(FULL), strict_map_key=False)
        d["resources"]["gpus"][1]["uuid"] = f"GPU{ch}x"
        if ch == "\ud800":  # a lone surrogate never decodes from UTF-8; check the function alone
            snap = msgspec.structs.replace(msgspec.convert(FULL, S.Snapshot), trust=f"a{ch}")
            assert S._rules_ok(snap)
            continue
        reason, _ = same(canonical(d))
        assert (reason == "bad_type") == (ch in CONTROLS), repr(ch)


def _map(items: list[tuple[str, bytes]]) -> bytes:
    """A msgpack map of ``items`` (each value already packed), repeated keys kept."""
    n = len(items)
    return (bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")) + b"".join(
        msgpack.packb(k) + v for k, v in items)


def test_repeated_key_with_a_control_character_first_is_refused_as_before():
    """msgspec keeps the last of a repeated key; the reference checked every one."""
    top = msgpack.unpackb(canonical(FULL), strict_map_key=False)
    items = [(k, msgpack.packb(v)) for k, v in top.items()]
    assert same(_map(items))[0] == "ok"
    assert same(_map([("trust", msgpack.packb("x\ny")), *items]))[0] == "bad_type"
    res = [(k, msgpack.packb(v)) for k, v in top["resources"].items()]
    res_twice = _map([("disk_path", msgpack.packb("\x00")), *res])
    assert same(_map([(k, res_twice if k == "resources" else v) for k, v in items]))[0] == "bad_type"
    gpu = [(k, msgpack.packb(v)) for k, v in top["resources"]["gpus"][0].items()]
    gpu_twice = _map([("uuid", msgpack.packb("\x7f")), *gpu])
    gpus = b"\x91" + gpu_twice
    res_gpu = _map([(k, gpus if k == "gpus" else v) for k, v in res])
    assert same(_map([(k, res_gpu if k == "resources" else v) for k, v in items]))[0] == "bad_type"
    acks = _map([("a\x01", msgpack.packb(1)), ("m" * 16, msgpack.packb(5))])
    jobs = _map([(k, acks if k == "acks" else msgpack.packb(v)) for k, v in top["jobs"].items()])
    assert same(_map([(k, jobs if k == "jobs" else v) for k, v in items]))[0] == "bad_type"


def test_a_body_as_long_as_its_encoding_is_compared_byte_for_byte():
    """A repeated key whose first value holds a control character (msgspec keeps the last, unchecked by the pass),
    its bytes paid for by floats sent as float32 and a fixmap header: the body is exactly as long as the encoding of
    what it decodes to, and passes the one-pass check; only the byte comparison sends it to the twin types."""
    d = msgpack.unpackb(msgpack.packb(FULL), strict_map_key=False)
    d.update(started_at=1.5, ts=2.5)  # exact in float32: 4 bytes each shorter than msgspec's float64
    canon = canonical(d)
    items = [(k, msgpack.packb(v, use_single_float=True)) for k, v in
             msgpack.unpackb(canon, strict_map_key=False).items()]
    short = _map([("trust", msgpack.packb("\n")), *items])
    pad = len(canon) - len(short)
    assert 0 <= pad < 30, pad
    body = _map([("trust", msgpack.packb("\n" + "x" * pad)), *items])
    assert len(body) == len(canon) and body != canon
    loose = msgspec.msgpack.Decoder(S.Snapshot).decode(body)
    assert S._rules_ok(loose) and S.encode_snapshot(loose) == canon
    reason, detail = same(body)
    assert reason == "bad_type" and "$.trust" in detail, detail


def test_a_fault_after_a_control_character_is_named_as_before():
    d = msgpack.unpackb(msgpack.packb(FULL), strict_map_key=False)
    d["origin"] = "o\x01"
    body = canonical(d)
    assert same(body)[0] == "bad_type"
    # trailing bytes, or the body cut short, after it: the control character is met first (a validation error,
    # not malformed), and the schema probe that then fails too names it bad_schema, as the reference did
    assert same(body + b"\x00")[0] == "bad_schema"
    assert same(body[:-3])[0] == "bad_schema"
    assert same(canonical(FULL) + b"\x00")[0] == "malformed"
    d["jobs"]["acks"] = {"m" * 16: -5}  # a bound broken after it
    assert same(canonical_loose(d))[0] == "bad_type"
    d = msgpack.unpackb(msgpack.packb(FULL), strict_map_key=False)
    d["schema"] = 2
    d["trust"] = "\n"
    assert same(msgpack.packb(d))[0] == "bad_schema"
    d["schema"] = 3
    d["sync"] = {"receipts": {"n" * 16: [["p", 1, b"r" * 32]] * 1024, "o" * 16: [["p", 1, b"r" * 32]]}}
    assert same(msgpack.packb(d))[0] == "bad_type"
    d["trust"] = "t"
    assert same(msgpack.packb(d))[1] == "more than 1024 sync receipts"


def canonical_loose(d: dict) -> bytes:
    """``d`` packed in the typed snapshot's field order without checking its values."""
    order = list(S.Snapshot.__struct_fields__)
    return msgpack.packb({k: d[k] for k in sorted(d, key=lambda k: order.index(k) if k in order else 99)})


@pytest.mark.parametrize("seed", range(4))
def test_random_hostile_snapshots_decode_as_before(seed):
    """The fuzz generator's snapshots (every section, hostile values, unknown fields), packed as maps (another key
    order: the twin types decide) and, where they decode, canonical (the one-pass check decides) with a control
    character put into one of their strings."""
    rng = random.Random(seed)
    d = RandomDraw(rng)
    ctx = Context(self_id="s" * 16, member_ids=["m" * 16, "k" * 16])
    verdicts: dict[str, int] = {}
    for i in range(400):
        snap = gen_snapshot(d, ctx, origin="o" * 16, version=i + 1)
        try:
            body = msgpack.packb(snap, use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            continue
        reason = same(body)[0]
        verdicts[reason] = verdicts.get(reason, 0) + 1
        if reason != "ok":
            continue
        body = S.encode_snapshot(S.decode_snapshot(body))
        assert same(body)[0] == "ok"
        plain = msgspec.to_builtins(S.decode_snapshot(body), builtin_types=(bytes,))
        spots = list(_strings(plain, ()))
        if spots:
            path = spots[rng.randrange(len(spots))]
            _put(plain, path, rng.choice(CONTROLS))
            same(msgpack.packb(plain, use_bin_type=True))
    assert verdicts.get("ok", 0) > 40 and verdicts.get("bad_type", 0) > 40, verdicts


def _strings(obj: Any, path: tuple) -> Any:
    """Paths of every string in ``obj`` (map keys marked ``("key", k)``)."""
    if isinstance(obj, str):
        yield path
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(k, str):
                yield (*path, ("key", k))
            yield from _strings(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _strings(v, (*path, i))


def _put(obj: Any, path: tuple, ch: str) -> None:
    *inner, last = path
    for p in inner:
        obj = obj[p]
    if isinstance(last, tuple):
        key = last[1]
        obj[key[:1] + ch + key[1:]] = obj.pop(key)
    else:
        obj[last] = obj[last][:1] + ch + obj[last][1:]


def test_twin_types_are_the_reference_types():
    """Each twin's fields have the reference class's types (the rule in every type), class for class."""
    def norm(tp: Any) -> Any:
        if isinstance(tp, type):
            return tp.__name__.removesuffix("WithTextRule")
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            return ("Annotated", norm(args[0]), tp.__metadata__)
        if args:
            return (str(origin), tuple(norm(a) for a in args))
        return tp
    for name in SHADOWED:
        cls, ref = getattr(S, name), getattr(REF, name)
        twin = S.with_text_rule(cls)
        assert twin is not cls and twin.__struct_fields__ == ref.__struct_fields__ == cls.__struct_fields__
        th = typing.get_type_hints(twin, include_extras=True)
        rh = typing.get_type_hints(ref, include_extras=True)
        for f in ref.__struct_fields__:
            assert norm(th[f]) == norm(rh[f]), (name, f)
        def defaults(c: Any) -> list:
            return [(f.name, f.default, f.default_factory) for f in msgspec.structs.fields(c)]
        assert defaults(twin) == defaults(cls)
        assert twin.__struct_config__.omit_defaults and not twin.__struct_config__.forbid_unknown_fields


def test_other_decoders_of_these_classes_keep_the_rule():
    """A resource sample with a control character in a GPU name is refused when the node builds its own snapshot,
    and its section is the one left out when sealing, as before."""
    sample = {"gpu_source": "nvml", "gpus": [{"name": "bad\x1bname"}]}
    with pytest.raises(msgspec.ValidationError, match=r"gpus\[0\]\.name"):
        S.convert_resources(sample)
    assert S.convert_resources({"gpus": [{"name": "ok"}]}).gpus[0].name == "ok"
    snap = msgspec.structs.replace(msgspec.convert(FULL, S.Snapshot), resources=msgspec.convert(sample, S.Resources))
    assert [name for name, _ in _broken_sections(snap)] == ["resources"]
    snap = msgspec.structs.replace(snap, resources=S.Resources(),
                                   jobs=S.JobsSection(running_digest="a\tb"))
    assert [name for name, _ in _broken_sections(snap)] == ["jobs"]
