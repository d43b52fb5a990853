"""The checkpoint routes refuse unsigned readers and never follow a symlink (issue 41, review H3)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from starlette.applications import Starlette

from p2pnode._files import open_beneath
from p2pnode.drivers._trust import Trust
from p2pnode.http._checkpoint_route import checkpoint_routes
from p2pnode.identity import Identity
from p2pnode.reqauth import AUTH_HEADER, sign_request_with_key
from p2pnode.sync._checkpoints import CheckpointOrigin, checkpoint_file_of, checkpoint_hashes_of
from p2pnode.synccore import CheckpointBody, CheckpointFile, hash_file, sign_checkpoint


def _served(tmp_path: Path):
    root, state = tmp_path / "root", tmp_path / "state"
    (root / "ck/c").mkdir(parents=True)
    (tmp_path / "node.key").write_bytes(b"-----PRIVATE KEY----- s3cr3t " * 4)
    (root / "ck/c/step-1.pt").write_bytes(b"x" * 100)
    me, member, stranger = Identity.generate(), Identity.generate(), Identity.generate()
    origin = CheckpointOrigin(root=root, state_dir=state, node_id=me.node_id, sign=me.sign, settle_s=0)
    body = CheckpointBody("c", "3-1", 1, me.node_id, "ck/c", "step-1.pt",
                          (CheckpointFile("", 100, 1 << 16, bytes(32)),))
    sc = sign_checkpoint(me.sign, body)
    origin._hold(sc, body)
    sync = SimpleNamespace(checkpoint_bytes=origin.signed_bytes,
                           checkpoint_file=lambda d, i: checkpoint_file_of(None, origin, root, d, i),
                           checkpoint_hashes=lambda d, i: checkpoint_hashes_of(None, d, i))
    keys = {me.node_id: me.public_key, member.node_id: member.public_key}
    trust = Trust("open", state, bootstrap_token="", node_id=me.node_id, key_of=keys.get, is_voter=lambda n: False)
    app = Starlette(routes=checkpoint_routes(sync, trust))
    return SimpleNamespace(root=root, me=me, member=member, stranger=stranger, digest=sc.digest, app=app,
                           trust=trust, secret=tmp_path / "node.key")


async def _get(client: httpx.AsyncClient, target: str, signer: Identity | None, receiver: str) -> httpx.Response:
    headers = {}
    if signer is not None:
        headers[AUTH_HEADER] = sign_request_with_key(signer, "GET", target, b"", time.time(), receiver=receiver)
    return await client.get(target, headers=headers)


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node")


async def test_checkpoint_reads_need_a_member_signature_even_without_a_read_token(tmp_path: Path) -> None:
    s = _served(tmp_path)
    file_target = f"/sync/checkpoint/file?digest={s.digest.hex()}&file=0&offset=0"
    async with _client(s.app) as client:
        for target in (f"/sync/checkpoint?digest={s.digest.hex()}", file_target):
            assert (await _get(client, target, None, s.me.node_id)).status_code == 401
            assert (await _get(client, target, s.stranger, s.me.node_id)).status_code == 401  # not a member
            assert (await _get(client, target, s.member, "someone-else")).status_code == 401  # signed for another node
            assert (await _get(client, target, s.member, s.me.node_id)).status_code == 200
        assert (await _get(client, file_target, s.member, s.me.node_id)).content == b"x" * 100
        hashes = await _get(client, file_target + "&part=hashes", s.member, s.me.node_id)
        assert hashes.content == hash_file(s.root / "ck/c/step-1.pt", block_size=1 << 16).hashes
    assert s.trust.read_refusals == 6


@pytest.mark.parametrize("swap", ["entry", "dir"])
async def test_a_checkpoint_file_swapped_for_a_symlink_is_never_served(tmp_path: Path, swap: str) -> None:
    s = _served(tmp_path)
    ck = s.root / "ck/c/step-1.pt"
    if swap == "entry":
        ck.unlink()
        os.symlink(s.secret, ck)
    else:  # a directory component on the way: ck/c -> a directory holding a step-1.pt of another's
        other = tmp_path / "other"
        other.mkdir()
        os.symlink(s.secret, other / "step-1.pt")
        (other / "real").write_bytes(b"y" * 100)
        ck.unlink()
        os.rmdir(s.root / "ck/c")
        os.symlink(other, s.root / "ck/c")
    target = f"/sync/checkpoint/file?digest={s.digest.hex()}&file=0&offset=0"
    async with _client(s.app) as client:
        r = await _get(client, target, s.member, s.me.node_id)
    assert r.status_code == 404 and b"PRIVATE KEY" not in r.content


def test_open_beneath_refuses_symlinks_other_sizes_and_unsafe_paths(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a/f").write_bytes(b"12345")
    fd = open_beneath(tmp_path, "a/f", size=5)
    assert os.read(fd, 10) == b"12345"
    os.close(fd)
    os.symlink(tmp_path / "a/f", tmp_path / "a/l")
    os.symlink(tmp_path / "a", tmp_path / "b")
    for rel, size in (("a/l", None), ("b/f", None), ("a/f", 4), ("a", None), ("../x", None), ("a//f", None),
                      ("", None)):
        with pytest.raises(OSError):
            open_beneath(tmp_path, rel, size=size)
