"""Receiver-bound request authentication (issue 22, findings 3, 6 and 7) as pure objects: the header decoder, the
verifier's order of checks and counters, the unbound schemes behind their setting, and the trust rules for reads."""

from __future__ import annotations

import logging

import pytest

from p2pnode.drivers._trust import Trust
from p2pnode.identity import Identity
from p2pnode.keyring import key_id_of
from p2pnode.reqauth import (
    MAX_HEADER_CHARS,
    REASONS,
    RequestAuthError,
    RequestVerifier,
    decode_header,
    receiver_id,
    sign_request,
    sign_request_with_key,
)

TOKEN = "cluster-token-0123456789abcdef"
KID = key_id_of(TOKEN)
ME, OTHER = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"
NONCE = "0123456789abcdef0123456789abcdef"
MAC64, SIG128 = "ab" * 32, "cd" * 64


def verifier(node_id: str = ME, **kw) -> RequestVerifier:
    return RequestVerifier({KID: TOKEN}.get, node_id=node_id, **kw)


def refused(v: RequestVerifier, header, *, method="POST", target="/operator/cordon", body=b"{}", now=1000.0,
            **kw) -> str:
    with pytest.raises(RequestAuthError) as err:
        v.verify(header, method, target, body, now, **kw)
    return err.value.reason


def test_a_request_signed_for_one_node_is_refused_by_another_and_replayed_to_its_own():
    h = sign_request(TOKEN, KID, "POST", "/operator/drain", b'{"deadline_s": 0}', 1000.0, receiver=ME)
    assert h.startswith(f"v2 {KID} {ME} 1000 ")
    other = verifier(OTHER)
    assert refused(other, h, target="/operator/drain", body=b'{"deadline_s": 0}') == "wrong_receiver"
    assert other.refused["wrong_receiver"] == 1 and other.accepted == 0
    me = verifier(ME)
    assert me.verify(h, "POST", "/operator/drain", b'{"deadline_s": 0}', 1001.0) == KID
    assert refused(me, h, target="/operator/drain", body=b'{"deadline_s": 0}', now=1002.0) == "replayed"
    assert me.accepted == 1 and me.refused["replayed"] == 1 and me.unbound == 0


def test_the_receiver_is_signed_not_only_named():
    """Editing the receiver field of a captured header breaks the MAC (``bad_mac``, not ``wrong_receiver``:
    that counter only counts genuinely signed requests that reached the wrong node)."""
    h = sign_request(TOKEN, KID, "POST", "/signals", b"", 1000.0, receiver=OTHER)
    edited = h.replace(f" {OTHER} ", f" {ME} ")
    v = verifier(ME)
    assert refused(v, edited, target="/signals", body=b"") == "bad_mac"
    forged = f"v2 {KID} {OTHER} 1000 {NONCE} {MAC64}"  # a made-up MAC for another node
    assert refused(v, forged, target="/signals", body=b"") == "bad_mac"
    assert v.refused["wrong_receiver"] == 0


def test_node_key_scheme_is_receiver_bound_and_signers_are_checked():
    ident = Identity.generate()
    keys = {ident.node_id: ident.public_key}
    v = RequestVerifier(lambda kid: None, node_id=ME, key_of=keys.get)
    h = sign_request_with_key(ident, "POST", "/voters", b"x", 1000.0, receiver=ME)
    assert h.startswith(f"k2 {ident.node_id} {ME} 1000 ")
    assert refused(v, h, target="/voters", body=b"x", schemes=("k2",), signers=lambda n: False) == "unknown_key"
    assert v.verify(h, "POST", "/voters", b"x", 1000.0, schemes=("k2",), signers=lambda n: True) == ident.node_id
    for_other = sign_request_with_key(ident, "POST", "/voters", b"x", 1000.0, receiver=OTHER)
    assert refused(v, for_other, target="/voters", body=b"x", schemes=("k2",),
                   signers=lambda n: True) == "wrong_receiver"
    assert refused(v, h, target="/voters", body=b"y", schemes=("k2",), signers=lambda n: True) == "bad_mac"
    # the scheme must be the one the route takes
    assert refused(v, h, target="/voters", body=b"x") == "malformed"  # default schemes: v2 only


def test_unbound_schemes_are_refused_by_default_and_accepted_counted_and_logged_with_the_setting(caplog):
    ident = Identity.generate()
    v1 = sign_request(TOKEN, KID, "POST", "/signals", b"", 1000.0, receiver=None)
    k1 = sign_request_with_key(ident, "POST", "/voters", b"", 1000.0, receiver=None)
    assert v1.startswith(f"v1 {KID} 1000 ") and k1.startswith(f"k1 {ident.node_id} 1000 ")
    strict = RequestVerifier({KID: TOKEN}.get, node_id=ME, key_of={ident.node_id: ident.public_key}.get)
    assert refused(strict, v1, target="/signals", body=b"") == "unbound"
    assert refused(strict, k1, target="/voters", body=b"", schemes=("k2",), signers=lambda n: True) == "unbound"
    assert strict.refused["unbound"] == 2 and strict.accepted == 0
    lax = RequestVerifier({KID: TOKEN}.get, node_id=ME, key_of={ident.node_id: ident.public_key}.get,
                          accept_unbound=True)
    with caplog.at_level(logging.WARNING, logger="p2pnode.reqauth"):
        assert lax.verify(v1, "POST", "/signals", b"", 1000.0) == KID
        assert lax.verify(k1, "POST", "/voters", b"", 1000.0, schemes=("k2",), signers=lambda n: True)
    assert lax.unbound == 2 and lax.accepted == 2
    assert sum("unbound" in r.getMessage() for r in caplog.records) == 2
    # the setting does not widen the schemes a route takes, nor skip the replay check
    assert refused(lax, v1, target="/signals", body=b"", now=1001.0) == "replayed"
    assert refused(lax, k1, target="/voters", body=b"") == "malformed"


@pytest.mark.parametrize("header", [
    f"v2 {KID} {ME} \u00b2 {NONCE} {MAC64}",  # superscript two: str.isdigit() says yes, int() raises
    f"v2 {KID} {ME} \u0661\u0662\u0663 {NONCE} {MAC64}",  # Arabic-Indic digits: int() would accept them
    f"v2 {KID} {ME} \uff11\uff10\uff10\uff10 {NONCE} {MAC64}",  # fullwidth digits
    f"v2 {KID} {ME} {'9' * 13} {NONCE} {MAC64}",  # more than 12 digits
    f"v2 {KID} {ME} {'9' * 400} {NONCE} {MAC64}",  # 400 digits
    f"v2 {KID} {ME} {'9' * 4300} {NONCE} {MAC64}",  # past int()'s digit limit
    f"v2 {KID} {ME} -1000 {NONCE} {MAC64}",
    f"v2 {KID} {ME} +1000 {NONCE} {MAC64}",
    f"v2 {KID} {ME} 1_000 {NONCE} {MAC64}",
    f"v2 {KID} {ME} 1000 {NONCE.upper()} {MAC64}",
    f"v2 {KID} {ME} 1000 {NONCE[:31]} {MAC64}",
    f"v2 {KID} {ME} 1000 {NONCE} {MAC64[:63]}",
    f"v2 {KID} {ME} 1000 {NONCE} {SIG128}",  # a signature's length for an HMAC scheme
    f"k2 {KID} {ME} 1000 {NONCE} {MAC64}",  # an HMAC's length for a signature scheme
    f"v2 {KID} {ME} 1000 {NONCE} {'zz' * 32}",
    f"v2 {KID}  {ME} 1000 {NONCE} {MAC64}",
    f"v2 {KID}\t{ME} 1000 {NONCE} {MAC64}",
    f"v2 {KID} {ME} 1000 {NONCE} {MAC64}\n",
    f"v2 {KID} {ME}\x00 1000 {NONCE} {MAC64}",
    f"v2 {KID} {ME} 1000 {NONCE} {MAC64} extra",
    f"v2 {KID} 1000 {NONCE} {MAC64}",  # no receiver
    f"v1 {KID} {ME} 1000 {NONCE} {MAC64}",  # a receiver on an unbound scheme
    f"v2 {'a' * 65} {ME} 1000 {NONCE} {MAC64}",
    f"v2 {KID} {'b' * 65} 1000 {NONCE} {MAC64}",
    f"v2 {KID.upper()} {ME} 1000 {NONCE} {MAC64}",
    f"v2 {KID} n\u00e9 1000 {NONCE} {MAC64}",
    f"V2 {KID} {ME} 1000 {NONCE} {MAC64}",
    f"v3 {KID} {ME} 1000 {NONCE} {MAC64}",
    "v2 " + "a" * MAX_HEADER_CHARS,
    "Bearer " + TOKEN,
    " ",
])
def test_malformed_headers_are_refused_as_malformed_never_an_exception(header):
    v = verifier()
    with pytest.raises(RequestAuthError) as err:
        decode_header(header)
    assert err.value.reason == "malformed"
    assert refused(v, header) == "malformed"
    assert v.refused["malformed"] == 1 and sum(v.refused.values()) == 1


def test_the_decoder_reads_the_exact_shape():
    h = decode_header(f"v2 {KID} {ME} 000000001000 {NONCE} {MAC64}")
    assert (h.scheme, h.key_id, h.receiver, h.ts, h.nonce, h.mac, h.bound) == (
        "v2", KID, ME, 1000, NONCE, bytes.fromhex(MAC64), True)
    h = decode_header(f"k1 {ME} 999999999999 {NONCE} {SIG128}")
    assert (h.scheme, h.receiver, h.ts, len(h.mac), h.bound) == ("k1", None, 10**12 - 1, 64, False)
    assert refused(verifier(), None) == "missing" and refused(verifier(), "") == "missing"
    assert set(REASONS) >= {"wrong_receiver", "unbound", "malformed", "replayed"}


@pytest.mark.parametrize("value, expected", [
    (ME, ME), ("a", "a"), ("x" * 64, "x" * 64), ("x" * 65, None), ("", None), ("Node", None), ("a b", None),
    ("a\n", None), ("\u00b2", None), (None, None), (123, None), (["a"], None),
])
def test_receiver_id_only_takes_a_node_id(value, expected):
    assert receiver_id(value) == expected


def test_open_mode_reads_take_this_node_a_voter_or_the_member_the_route_allows(tmp_path):
    """Finding 7: a member's key (a stranger's, after one self-signed snapshot) no longer reads operator views;
    only this node's key or a voter's does, and a member's own key only where the caller allows that member."""
    me, voter, member = Identity.generate(), Identity.generate(), Identity.generate()
    keys = {i.node_id: i.public_key for i in (me, voter, member)}
    trust = Trust("open", tmp_path, bootstrap_token="", node_id=me.node_id, key_of=keys.get,
                  is_voter=lambda n: n == voter.node_id)

    def read(ident, path, **kw):
        return trust.authenticate_read(sign_request_with_key(ident, "GET", path, b"", __import__("time").time(),
                                                             receiver=me.node_id), "GET", path, **kw)

    assert read(me, "/status") is None and read(voter, "/status") is None
    assert read(member, "/status") == "unknown_key"
    assert read(member, "/status", member_may=lambda n: n == voter.node_id) == "unknown_key"
    assert read(member, f"/plan/part?node={member.node_id}", member_may=lambda n: n == member.node_id) is None
    # finding 6 on a read: never an exception
    assert trust.authenticate_read(f"k2 {member.node_id} {me.node_id} \u00b2 {NONCE} {SIG128}", "GET",
                                   "/status") == "malformed"
    view = trust.view()["request_auth"]
    assert view["refused"]["unknown_key"] == 2 and view["refused"]["malformed"] == 1 and view["accepted"] == 3
    assert view["unbound_accepted"] == 0 and view["accept_unbound"] is False


def test_a_request_signed_before_the_agent_started_is_refused_as_replayed():
    """Found in review of issue 22: the nonce cache lives in memory, so a request captured before a restart could be
    replayed once to the restarted node within the window. A request signed before this run started is refused."""
    token = "x" * 40
    kid = key_id_of(token)
    start = 1_700_000_100.4
    v = RequestVerifier(lambda k: token if k == kid else None, node_id="me", not_before=start)
    old = sign_request(token, kid, "POST", "/operator/drain", b"{}", start - 5, receiver="me")
    with pytest.raises(RequestAuthError) as e:
        v.verify(old, "POST", "/operator/drain", b"{}", start + 1)
    assert e.value.reason == "replayed" and v.refused["replayed"] == 1
    new = sign_request(token, kid, "POST", "/operator/drain", b"{}", start + 0.5, receiver="me")  # same second: ok
    assert v.verify(new, "POST", "/operator/drain", b"{}", start + 1) == kid
