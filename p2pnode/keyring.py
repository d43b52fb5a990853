"""The cluster keyring (token trust mode): several cluster tokens accepted at once, one primary. Like Serf's keyring.

Every token in the keyring is **accepted**: an envelope endorsed under any of them is a member's, a request
authenticated with any of them is the operator's. The **primary** token endorses this node's own key in its
snapshots. A rotation without downtime is three steps, each applied to every node before the next:

1. ``p2pnode keys install NEW`` (every node accepts old and new; all still endorse with old);
2. ``p2pnode keys use KEY_ID`` (nodes endorse with new; the others already accept it);
3. ``p2pnode keys remove OLD_ID`` (old is no longer accepted: a node holding only old is refused, ``unendorsed``).

Tokens never cross the network: the operator installs them on each node through their own channel (config
management, ``p2pnode keys install`` over ssh), into ``keyring.json`` in the data dir (mode 0600). A running
agent reloads the file when it changes. Tokens are named by a **key id**, ``HMAC-SHA256(token,
"p2pnode-key-id-v1")`` truncated to 8 bytes (16 hex chars): it tells keys apart without revealing them (a guess can
be checked against it, as against any endorsement on the wire: brute force only).

Pure apart from :meth:`Keyring.load` and :meth:`Keyring.save`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import msgspec
from msgspec import Meta

from ._files import atomic_write_bytes
from .errors import ConfigError
from .statefiles import decode_entry, file_name, load_json, report_for

__all__ = ["KEYRING_FILE", "Keyring", "KeyringError", "key_id_of", "MIN_TOKEN_CHARS"]

KEYRING_FILE = "keyring.json"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 256
MAX_KEYS = 16
_KEY_ID_CONTEXT = b"p2pnode-key-id-v1"
_TOKEN_PATTERN = r"^[^\x00-\x20\x7f](?:[^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?\Z"
_Token = Annotated[str, Meta(min_length=MIN_TOKEN_CHARS, max_length=MAX_TOKEN_CHARS, pattern=_TOKEN_PATTERN)]
"""A token as the keyring file holds it: 16-256 characters, no control character, no surrounding space."""


class KeyringError(ConfigError):
    """A keyring operation the operator asked for cannot be done (unknown key id, removing the primary, a token
    too short, an unreadable keyring file). The message says why and what to do."""


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeError:  # a lone surrogate (from JSON, or an environment variable that was not UTF-8)
        return False
    return True


def key_id_of(token: str) -> str:
    """The public name of ``token``: 16 hex chars of ``HMAC-SHA256(token, "p2pnode-key-id-v1")``."""
    return hmac.new(token.encode("utf-8"), _KEY_ID_CONTEXT, hashlib.sha256).hexdigest()[:16]


class Keyring(msgspec.Struct):
    """Tokens by key id, and the primary key id (see module docstring)."""

    tokens: dict[str, str] = msgspec.field(default_factory=dict)
    primary: str | None = None

    @classmethod
    def of(cls, tokens: Iterable[str], primary: str | None = None) -> Keyring:
        """A keyring holding ``tokens``; the primary is ``primary`` (a token) or the first one."""
        ring = cls()
        for t in tokens:
            ring.install(t)
        if ring.tokens:
            ring.primary = key_id_of(primary) if primary else next(iter(ring.tokens))
        return ring

    # -- reading -------------------------------------------------------------------------------------
    def accepted(self) -> list[str]:
        """Every accepted token, the primary first."""
        out = [self.tokens[self.primary]] if self.primary in self.tokens else []
        return out + [t for k, t in self.tokens.items() if k != self.primary]

    @property
    def primary_token(self) -> str | None:
        """The token new endorsements and signed requests use, or ``None`` for an empty keyring."""
        return self.tokens.get(self.primary) if self.primary else None

    def token_of(self, key_id: str) -> str | None:
        """The token with key id ``key_id``, or ``None`` when this keyring does not hold it."""
        return self.tokens.get(key_id)

    def __len__(self) -> int:
        return len(self.tokens)

    # -- operator actions ----------------------------------------------------------------------------
    def install(self, token: str) -> str:
        """Accept ``token`` (idempotent); the first token installed becomes the primary. Returns its key id.
        Raises :class:`KeyringError` for a token shorter than 16 or longer than 256 characters, or a full ring."""
        if not isinstance(token, str) or not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS \
                or token != token.strip() or not re.match(_TOKEN_PATTERN, token) or not _utf8(token):
            raise KeyringError(f"a cluster token must be {MIN_TOKEN_CHARS}-{MAX_TOKEN_CHARS} characters without "
                               "control characters or surrounding spaces (generate one: "
                               "python -c 'import secrets; print(secrets.token_urlsafe(32))')")
        kid = key_id_of(token)
        if kid not in self.tokens and len(self.tokens) >= MAX_KEYS:
            raise KeyringError(f"the keyring holds {MAX_KEYS} tokens already: remove an old one first")
        self.tokens[kid] = token
        if self.primary is None:
            self.primary = kid
        return kid

    def resolve(self, key_id: str) -> str:
        """The full key id for ``key_id`` or a unique prefix of it (at least 4 chars). Raises :class:`KeyringError`."""
        matches = [k for k in self.tokens if k.startswith(key_id)] if len(key_id) >= 4 else []
        if len(matches) != 1:
            raise KeyringError(f"no single key id starts with {key_id!r} (p2pnode keys list shows them)")
        return matches[0]

    def use(self, key_id: str) -> bool:
        """Make ``key_id`` (or a unique prefix) the primary. Returns True when it changed."""
        kid = self.resolve(key_id)
        changed = kid != self.primary
        self.primary = kid
        return changed

    def remove(self, key_id: str) -> str:
        """Stop accepting ``key_id`` (or a unique prefix). Raises :class:`KeyringError` for the primary (make
        another key primary first). Returns the full key id removed."""
        kid = self.resolve(key_id)
        if kid == self.primary:
            raise KeyringError(f"{kid} is the primary key: `p2pnode keys use` another key first")
        del self.tokens[kid]
        return kid

    # -- persistence ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: Path) -> Keyring | None:
        """The keyring in ``path``, or ``None`` when there is no file.

        Decoded by the state-file rule (:mod:`p2pnode.statefiles`): a token entry that is not a valid token (not a
        string of 16-256 characters, a control character, surrounding spaces, a lone surrogate, beyond
        :data:`MAX_KEYS`) is dropped, logged and counted (``keyring.json``: ``bad_entry``); a primary key id that
        names no remaining token is replaced by the first remaining token (``bad_primary``: both are accepted
        tokens of the cluster). Raises :class:`KeyringError` when the file cannot be read or is not a keyring at
        all (the agent does not guess which tokens to accept); a keyring left with no token is returned empty
        (:func:`p2pnode.node._persist.load_keyring` refuses to start with it, and never falls back to the
        configured bootstrap token, which the operator may have rotated away)."""
        path = Path(path)
        try:
            raw = load_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise KeyringError(f"{path}: unreadable keyring ({exc}); restore it, or `p2pnode keys install` a "
                               "token after moving it away") from None
        if not (isinstance(raw, dict) and isinstance(raw.get("tokens"), list)):
            raise KeyringError(f"{path}: not a keyring (expected {{\"primary\": key id, \"tokens\": [...]}})")
        report, name = report_for(path.parent), file_name(path.parent, path)
        ring = cls()
        for i, t in enumerate(raw["tokens"]):
            try:
                ring.install(decode_entry(t, _Token))
            except (ValueError, KeyringError) as exc:
                report.drop(name, "bad_entry", f"token [{i}]: {exc}")  # never the token itself
        primary = raw.get("primary")
        if ring.tokens:
            if isinstance(primary, str) and primary in ring.tokens:
                ring.primary = primary
            else:
                ring.primary = next(iter(ring.tokens))
                report.drop(name, "bad_primary", f"primary {str(primary)[:20]!r} names no usable token: "
                                                 f"{ring.primary} is the primary now")
        return ring

    def save(self, path: Path) -> None:
        """Write the keyring to ``path`` atomically, mode 0600 (the file permission is the access rule)."""
        body = json.dumps({"primary": self.primary, "tokens": self.accepted()}, indent=1).encode()
        atomic_write_bytes(Path(path), body, mode=0o600)

    @staticmethod
    def mtime_ns(path: Path) -> int | None:
        """Modification time of the keyring file (the agent reloads it when this changes), or ``None``."""
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return None
