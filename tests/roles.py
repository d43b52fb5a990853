"""Operator keys for the attack tests of issue 37: each attack is replayed in open mode and with an operator key
pinned (``[agent] operator_keys``), where the real nodes carry certificates of the roles they hold and the fakes
hold the cluster token (insiders) but no certificate of that key."""

from __future__ import annotations

import time
from pathlib import Path

from p2pnode.certs import CERT_FILE, encode_cert, operator_key_text, sign_cert
from p2pnode.identity import SigningKey, load_or_create_identity

MODES = ["open", "token", "operator-key"]
"""``open``: no token, no key pinned; ``token``: the fakes hold the cluster token; ``operator-key``: token mode
with an operator key pinned on every real node, each certified for its roles (the fakes hold the token only)."""
TOKEN = "issue-37-attack-tests-token-0123456789"


class Trust:
    """The trust setting of one attack test run (``mode`` one of :data:`MODES`)."""

    def __init__(self, mode: str) -> None:
        assert mode in MODES, mode
        self.mode = mode
        self.key = SigningKey.generate() if mode == "operator-key" else None

    @property
    def token(self) -> str | None:
        """The cluster token the fakes hold (None in open mode)."""
        return None if self.mode == "open" else TOKEN

    def env(self) -> dict[str, str]:
        """The agents' environment for this mode."""
        env = {} if self.mode == "open" else {"P2PNODE_TRUST": "token", "P2PNODE_CLUSTER_TOKEN": TOKEN}
        if self.key is not None:
            env["P2PNODE_OPERATOR_KEYS"] = operator_key_text(self.key)
        return env

    def certify(self, data_dir: Path, roles: tuple[str, ...] = ("voter", "durable", "lead"),
                valid_s: int = 3600, node_class: str = "") -> str:
        """Give the node of ``data_dir`` (its key made now if new) a certificate of ``roles`` in its data dir, when
        a key is pinned and ``roles`` is not empty; returns its node id."""
        data_dir.mkdir(parents=True, exist_ok=True)
        node_id = load_or_create_identity(data_dir).node_id
        if self.key is not None and roles:
            now = int(time.time())
            cert = sign_cert(self.key, node_id, list(roles), issued_at=now, expires_at=now + valid_s,
                             node_class=node_class)
            (data_dir / CERT_FILE).write_bytes(encode_cert(cert))
        return node_id
