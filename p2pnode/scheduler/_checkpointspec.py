"""A template's ``[job.checkpoint]`` table (issue 41, item 1): where its job writes checkpoints, the signal that
asks it for one, and how long it may take. Pure: decoded from the catalog's TOML by :func:`parse_checkpoint`
(called by :func:`p2pnode.scheduler._catalog.parse_catalog`), rendered per job by :meth:`CheckpointSpec.render_dir`.

Format::

    [job.checkpoint]
    dir = "checkpoints/{config}"  # relative to the node's sync root; placeholders: {config} and declared params
    signal = "SIGUSR1"            # optional: SIGUSR1 | SIGUSR2 | SIGINT | SIGTERM (asks the job for a checkpoint)
    grace_s = 60                  # optional, 1-3600 (default 60): how long a stop that can wait waits for one

``dir`` is at most :data:`MAX_CHECKPOINT_DIR_CHARS` characters, relative, without ``.``/``..``/empty/hidden
components, and must stay so once rendered: a string parameter whose value would make it absolute or climb out
of the sync root is refused when the job is started (:meth:`CheckpointSpec.render_dir` raises ``ValueError``), not
only when the catalog is read. The built-in placeholders ``{python}`` and ``{catalog_dir}`` are absolute paths and
are refused here. The job is given the absolute path as ``P2PNODE_CHECKPOINT_DIR`` (:mod:`p2pnode.jobs._launch`),
and every file under it is synced whatever ``sync.globs`` says (:func:`checkpoint_globs`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

import msgspec

__all__ = [
    "CHECKPOINT_SIGNALS",
    "DEFAULT_CHECKPOINT_GRACE_S",
    "MAX_CHECKPOINT_DIR_CHARS",
    "MAX_CHECKPOINT_GRACE_S",
    "CheckpointSpec",
    "checkpoint_globs",
    "parse_checkpoint",
]

CHECKPOINT_SIGNALS: tuple[str, ...] = ("SIGUSR1", "SIGUSR2", "SIGINT", "SIGTERM")
"""The signals a template may name for "write a checkpoint now" (a fixed set: never SIGKILL or SIGSTOP, which a
job cannot catch, nor a number)."""
MAX_CHECKPOINT_DIR_CHARS = 256
MAX_CHECKPOINT_GRACE_S = 3600.0
DEFAULT_CHECKPOINT_GRACE_S = 60.0
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_COMPONENT = re.compile(r"^[^\x00-\x1f\x7f/\\]{1,255}\Z")
_GLOB_CHARS = re.compile(r"[*?\[\]]")


class CheckpointSpec(msgspec.Struct, frozen=True):
    """``[job.checkpoint]``: ``dir`` (a template relative to the sync root, module docstring), ``signal`` (one of
    :data:`CHECKPOINT_SIGNALS`, or None: the stop signal alone) and ``grace_s`` (seconds, 1-3600)."""

    dir: str
    signal: str | None = None
    grace_s: float = DEFAULT_CHECKPOINT_GRACE_S

    def render_dir(self, values: dict[str, Any]) -> str:
        """The directory relative to the sync root for placeholder ``values`` (``config`` and the job's checked
        parameters). Raises ``ValueError`` when a value is missing or the result is not a safe relative path
        (:func:`check_dir`)."""
        try:
            out = _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), self.dir)
        except KeyError as exc:
            raise ValueError(f"checkpoint dir: no value for placeholder {exc}") from None
        problem = check_dir(out)
        if problem:
            raise ValueError(f"checkpoint dir {out!r}: {problem}")
        return out


def check_dir(path: str) -> str:
    """What is wrong with ``path`` as a checkpoint directory relative to the sync root ("" when nothing): at most
    :data:`MAX_CHECKPOINT_DIR_CHARS` characters, relative, POSIX separators, no empty, ``.``, ``..`` or hidden
    (``.``-prefixed: sync skips them) component, no control character, backslash or glob character."""
    if not path or len(path) > MAX_CHECKPOINT_DIR_CHARS:
        return f"1-{MAX_CHECKPOINT_DIR_CHARS} characters"
    if path.startswith("/"):
        return "must be relative to the sync root"
    if _GLOB_CHARS.search(path):
        return "no glob characters (* ? [ ])"
    for part in path.split("/"):
        if not _COMPONENT.match(part):
            return "no empty component, control character or backslash"
        if part.startswith("."):
            return "no '.', '..' or hidden component"
    return ""


def parse_checkpoint(raw: Any, where: str, errors: list[str], declared: set[str] | None) -> CheckpointSpec | None:
    """A template's ``checkpoint`` table, or None with each error appended to ``errors`` as
    ``"<where>.checkpoint.<key>: what"``. ``declared``: the template's parameter names (None: the template has
    other errors; placeholders are then not checked)."""
    if not isinstance(raw, dict):
        errors.append(f"{where}.checkpoint: must be a table, e.g. [job.checkpoint] dir = \"checkpoints/{{config}}\"")
        return None
    n0 = len(errors)
    for k in raw:
        if k not in ("dir", "signal", "grace_s"):
            errors.append(f"{where}.checkpoint.{k}: unknown key (known: dir, grace_s, signal)")
    d = raw.get("dir")
    if not isinstance(d, str):
        errors.append(f"{where}.checkpoint.dir: required, a path relative to the sync root")
    else:
        names = _PLACEHOLDER.findall(d)
        allowed = (declared or set()) | {"config"}
        bad = [n for n in names if n not in allowed]
        if bad and declared is not None:
            errors.append(f"{where}.checkpoint.dir: placeholder {{{bad[0]}}} is not a declared parameter"
                          " ({config} and the template's params only)")
        problem = check_dir(_PLACEHOLDER.sub("x", d)) if len(d) <= MAX_CHECKPOINT_DIR_CHARS else \
            f"1-{MAX_CHECKPOINT_DIR_CHARS} characters"
        if problem:
            errors.append(f"{where}.checkpoint.dir: {problem}")
    sig = raw.get("signal")
    if sig is not None and sig not in CHECKPOINT_SIGNALS:
        errors.append(f"{where}.checkpoint.signal: one of {', '.join(CHECKPOINT_SIGNALS)}")
    g = raw.get("grace_s", DEFAULT_CHECKPOINT_GRACE_S)
    if isinstance(g, bool) or not isinstance(g, (int, float)) or not 1.0 <= g <= MAX_CHECKPOINT_GRACE_S:
        errors.append(f"{where}.checkpoint.grace_s: seconds, 1-{MAX_CHECKPOINT_GRACE_S:g}")
    if len(errors) > n0 or not isinstance(d, str):
        return None
    signal = CHECKPOINT_SIGNALS[CHECKPOINT_SIGNALS.index(sig)] if sig is not None else None
    return CheckpointSpec(dir=d, signal=signal, grace_s=float(g))


def _glob_of(config: str, m: re.Match[str]) -> str:
    return config if m.group(1) == "config" else "*"


def checkpoint_globs(templates: Any) -> tuple[tuple[str, str], ...]:
    """``(config, glob)`` for every template of ``templates`` (name -> :class:`~p2pnode.scheduler.JobTemplate`)
    that declares a checkpoint: its dir with ``{config}`` filled and any other placeholder as ``*``, then
    ``/**``: the files sync sends whatever ``sync.globs`` says (:class:`p2pnode.sync._source.LocalFiles`), and
    by which a synced path is known to be a checkpoint of that config. Sorted, without duplicates."""
    out = set()
    for t in templates.values():
        spec = getattr(t, "checkpoint", None)
        if spec is None:
            continue
        d = _PLACEHOLDER.sub(functools.partial(_glob_of, t.config), spec.dir)
        out.add((t.config, f"{d}/**"))
    return tuple(sorted(out))
