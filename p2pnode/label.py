"""A member's label: the name an operator knows it by (``--name``, else the hostname) and, in a marketplace
container, the provider and its instance id (:data:`INSTANCE_VARS`). Shown beside the member's id in
``GET /members``, ``p2pnode status`` and the dashboard; never used to address a member (commands take ids).

The label comes from the member itself, so a reader trusts only its shape: :data:`NodeName` bounds each field
(1-63 characters, no control characters, no bidirectional or zero-width formatting characters that could make a
name read as another), checked by the snapshot's one decoder; a snapshot whose label breaks it is refused like any
malformed snapshot. The sender fits its own (:func:`sanitize_name`: ``--name`` and the hostname alike, so a name
with control characters is published without them, cut to 63 characters)."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Annotated

import msgspec
from msgspec import Meta

__all__ = ["INSTANCE_VARS", "Label", "NAME_MAX", "NodeName", "node_label", "sanitize_name"]

NAME_MAX = 63
"""Characters in a name, provider or instance id, at most (a DNS label's length)."""
_FORMAT = "\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff"  # bidi marks, overrides, isolates, zero-width
_NAME = rf"^[^\x00-\x1f\x7f-\x9f{_FORMAT}]*\Z"
NodeName = Annotated[str, Meta(max_length=NAME_MAX, pattern=_NAME)]

INSTANCE_VARS = (("vast.ai", "VAST_CONTAINERLABEL"), ("runpod", "RUNPOD_POD_ID"))
"""``(provider, variable)``: the instance id a Vast.ai (``C.<id>``) or RunPod (pod id) container finds in its
environment; the first one set names the provider."""


class Label(msgspec.Struct, frozen=True, omit_defaults=True):
    """``name`` (the operator's ``--name`` or the hostname), ``provider`` (``vast.ai``, ``runpod``) and
    ``instance`` (the provider's instance id); each empty when unknown."""

    name: NodeName = ""
    provider: NodeName = ""
    instance: NodeName = ""


def sanitize_name(text: str) -> str:
    """``text`` fitted to :data:`NodeName`: NFC-normalized, whitespace runs as one space, other control and
    formatting characters (Unicode category C) dropped, cut to :data:`NAME_MAX` characters."""
    text = unicodedata.normalize("NFC", text[:4 * NAME_MAX])
    kept = "".join(" " if ch.isspace() else ch for ch in text if ch.isspace() or unicodedata.category(ch)[0] != "C")
    return " ".join(kept.split())[:NAME_MAX].strip()


def node_label(name: str, hostname: str, env: Mapping[str, str]) -> Label:
    """This node's label: ``name`` (``--name``), else ``hostname``, each through :func:`sanitize_name`; the
    provider and instance id of the first of :data:`INSTANCE_VARS` set in ``env`` (sanitized too)."""
    provider = instance = ""
    for p, var in INSTANCE_VARS:
        value = sanitize_name(env.get(var, ""))
        if value:
            provider, instance = p, value
            break
    return Label(name=sanitize_name(name) or sanitize_name(hostname), provider=provider, instance=instance)
