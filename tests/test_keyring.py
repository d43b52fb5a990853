"""The keyring and request authentication (issue 13) as pure objects."""

import functools

import pytest

from p2pnode.keyring import Keyring, KeyringError, key_id_of
from p2pnode.reqauth import RequestAuthError, RequestVerifier, sign_request

OLD, NEW = "old-token-0123456789abcdef", "new-token-fedcba9876543210"


def test_keyring_rotation_steps_and_persistence(tmp_path):
    ring = Keyring()
    old_id = ring.install(OLD)
    assert ring.primary == old_id and ring.accepted() == [OLD]
    new_id = ring.install(NEW)
    assert ring.primary == old_id and set(ring.accepted()) == {OLD, NEW}  # installed: accepted, not used
    with pytest.raises(KeyringError):
        ring.remove(old_id)  # the primary cannot go
    assert ring.use(new_id[:6]) and ring.primary_token == NEW  # a unique prefix is enough
    assert ring.remove(old_id) == old_id and ring.accepted() == [NEW]
    ring.save(tmp_path / "k.json")
    assert (tmp_path / "k.json").stat().st_mode & 0o777 == 0o600
    back = Keyring.load(tmp_path / "k.json")
    assert back.primary == new_id and back.accepted() == [NEW]
    assert Keyring.load(tmp_path / "none.json") is None
    (tmp_path / "bad.json").write_text('{"primary": "x", "tokens": ["' + OLD + '"]}')
    assert Keyring.load(tmp_path / "bad.json").primary == old_id  # a primary naming no token: the first token
    (tmp_path / "bad.json").write_text('{"primary": "x", "tokens": [')
    with pytest.raises(KeyringError):
        Keyring.load(tmp_path / "bad.json")  # not a keyring at all: the operator must fix it
    with pytest.raises(KeyringError):
        ring.install("short")
    assert key_id_of(OLD) == old_id and OLD not in old_id


def test_request_auth_accepts_once_and_refuses_replays_old_times_and_changed_bodies():
    ring = Keyring.of([OLD, NEW])
    v = RequestVerifier(ring.token_of, node_id="me", window_s=60)
    kid = key_id_of(NEW)
    sign = functools.partial(sign_request, receiver="me")
    h = sign(NEW, kid, "POST", "/signals", b'{"config": "x"}', now=1000.0)
    assert v.verify(h, "POST", "/signals", b'{"config": "x"}', now=1010.0) == kid
    cases = [
        (h, "POST", "/signals", b'{"config": "x"}', 1011.0, "replayed"),
        (sign(NEW, kid, "POST", "/signals", b"a", now=1000.0), "POST", "/signals", b"b", 1000.0, "bad_mac"),
        (sign(NEW, kid, "POST", "/signals", b"a", now=1000.0), "POST", "/voters", b"a", 1000.0, "bad_mac"),
        (sign(NEW, kid, "POST", "/signals", b"a", now=1000.0), "POST", "/signals", b"a", 1061.0, "expired"),
        (sign(NEW, kid, "POST", "/signals", b"a", now=1100.0), "POST", "/signals", b"a", 1000.0, "expired"),
        (sign("some-other-token-xyz", key_id_of("some-other-token-xyz"), "POST", "/s", b"", now=1000.0),
         "POST", "/s", b"", 1000.0, "unknown_key"),
        (sign(OLD, kid, "POST", "/s", b"", now=1000.0), "POST", "/s", b"", 1000.0, "bad_mac"),
        (None, "POST", "/s", b"", 1000.0, "missing"),
        ("v1 x 1 2 3", "POST", "/s", b"", 1000.0, "malformed"),
        ("Bearer " + NEW, "POST", "/s", b"", 1000.0, "malformed"),
    ]
    for header, method, target, body, now, reason in cases:
        with pytest.raises(RequestAuthError) as err:
            v.verify(header, method, target, body, now)
        assert err.value.reason == reason, (header, reason)
    assert v.refused["replayed"] == 1 and v.refused["bad_mac"] == 3 and v.refused["expired"] == 2
    assert NEW not in h and OLD not in h
