"""Roles the operator grants (issue 37, item 1): certificates, the reasons a role is refused, and the effective view
every consumer of ClusterState reads, including its change at expiry without a new snapshot version."""

from __future__ import annotations

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers import envelope

from p2pnode.certs import (
    CERT_SKEW_S,
    UNCERTIFIED_LEAD_TAG,
    RoleGate,
    certified_class,
    check_cert,
    decode_cert,
    effective_tags,
    encode_cert,
    operator_key_text,
    sign_cert,
)
from p2pnode.election import is_eligible
from p2pnode.gossip import ClusterState
from p2pnode.identity import Identity

KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()
PINNED = {operator_key_text(KEY): KEY.public_key()}
T0 = 1_800_000_000


def cert(node="n1", roles=("voter", "durable", "lead"), *, key=KEY, start=T0, life=3600, **kw):
    return sign_cert(key, node, list(roles), issued_at=start, expires_at=start + life, **kw)


def wire(c):
    """A certificate as a snapshot carries it (msgpack: the signature as bytes)."""
    return msgspec.to_builtins(c, builtin_types=(bytes,))


def test_a_certificate_round_trips_and_each_refusal_has_its_reason():
    c = cert(node_class="1xH100", provider_id="vast-42")
    assert decode_cert(encode_cert(c)) == c
    tags = ["voter", "durable", "gpu"]
    ok = check_cert("n1", tags, c, PINNED, T0 + 10)
    assert ok.roles == ("voter", "durable", "lead") and not ok.refused and ok.reason == ""
    assert ok.recheck_at == T0 + 3600 and certified_class(ok) == ("1xH100", "vast-42")
    assert effective_tags(tags, ok) == tags
    forged = msgspec.structs.replace(c, roles=["voter", "durable", "lead"], expires_at=T0 + 7200)
    cases = {
        "no_cert": ("n1", None, T0),
        "unknown_issuer": ("n1", cert(key=OTHER), T0),
        "bad_signature": ("n1", forged, T0),
        "wrong_node": ("n2", c, T0),
        "expired": ("n1", c, T0 + 3600),
        "not_yet_valid": ("n1", c, T0 - CERT_SKEW_S - 1),
    }
    for reason, (node, cc, wall) in cases.items():
        r = check_cert(node, tags, cc, PINNED, wall)
        assert r.reason == reason and r.roles == () and set(r.refused) == {"voter", "durable", "lead"}, reason
        assert effective_tags(tags, r) == ["gpu", UNCERTIFIED_LEAD_TAG], reason
        assert certified_class(r) is None
    assert check_cert("n1", tags, c, PINNED, T0 - CERT_SKEW_S + 1).reason == ""  # clocks differ a little
    only_voter = check_cert("n1", tags, cert(roles=("voter",)), PINNED, T0)
    assert only_voter.roles == ("voter",) and only_voter.reason == "not_granted"
    assert effective_tags(tags, only_voter) == ["voter", "gpu", UNCERTIFIED_LEAD_TAG]
    assert not is_eligible("n1", effective_tags(tags, only_voter))
    assert is_eligible("n1", effective_tags(tags, ok))
    open_mode = check_cert("n1", tags, None, {}, T0)  # no key pinned: every claim counts, as before
    assert open_mode.roles == ("voter", "durable", "lead") and effective_tags(tags, open_mode) == tags
    with pytest.raises(ValueError):
        cert(roles=("admin",))
    with pytest.raises(ValueError):
        cert(life=401 * 86400)
    with pytest.raises(ValueError):
        decode_cert(b'{"node": "n1"}')
    with pytest.raises(ValueError):
        decode_cert(b"x" * 5000)


def test_the_gate_counts_a_refusal_once_per_change_and_checks_a_signature_once():
    gate = RoleGate((operator_key_text(KEY),))
    c = cert(life=100)
    for i in range(5):  # heartbeats with the same certificate
        assert gate.check("n1", ["voter"], c, T0 + i).roles == ("voter", "lead")
    assert sum(gate.refused.values()) == 0
    for i in range(5):
        gate.check("n1", ["voter"], c, T0 + 100 + i)
    assert gate.refused["expired"] == 1
    for i in range(3):
        gate.check("fake", ["voter"], None, T0 + i)
    assert gate.refused["no_cert"] == 1 and gate.check_of("fake").refused == ("voter", "lead")


def test_cluster_state_holds_effective_views_and_drops_an_expired_role_without_a_new_version():
    me, member, fake = Identity.generate(), Identity.generate(), Identity.generate()
    gate = RoleGate((operator_key_text(KEY),))
    state = ClusterState(me.node_id, roles=gate, roles_wall=T0)
    c = cert(member.node_id, life=60)
    state.merge([envelope(member, 1, tags=["voter", "durable"], cert=wire(c)),
                 envelope(fake, 1, tags=["voter", "durable"])], 0.0)
    held = state.get(member.node_id)
    assert held.snapshot.tags == ["voter", "durable"] and held.roles_until == T0 + 60
    assert state.get(fake.node_id).snapshot.tags == [UNCERTIFIED_LEAD_TAG]
    assert state.get(fake.node_id).signed.tags == ["voter", "durable"]  # what it signed stays as signed
    assert state.recheck_roles(T0 + 59) == []
    assert state.recheck_roles(T0 + 60) == [member.node_id]
    assert state.get(member.node_id).snapshot.tags == [UNCERTIFIED_LEAD_TAG]
    assert gate.check_of(member.node_id).reason == "expired" and gate.refused["expired"] == 1
    renewed = cert(member.node_id, start=T0 + 30, life=600)
    state.merge([envelope(member, 2, tags=["voter", "durable"], cert=wire(renewed))], 1.0)
    assert state.get(member.node_id).snapshot.tags == ["voter", "durable"]
    unpinned = ClusterState(me.node_id, roles=RoleGate(()), roles_wall=T0)
    unpinned.merge([envelope(fake, 1, tags=["voter", "durable"])], 0.0)
    assert unpinned.get(fake.node_id).snapshot.tags == ["voter", "durable"]  # open mode's default: as claimed


def test_the_certify_command_writes_a_certificate_the_agent_file_reader_takes(tmp_path, capsys):
    from cryptography.hazmat.primitives import serialization

    from p2pnode.cli import main
    from p2pnode.node._persist import OwnCert

    keyfile = tmp_path / "op.key"
    keyfile.write_bytes(KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    node = Identity.generate().node_id
    data = tmp_path / "data"
    data.mkdir()
    own = OwnCert(data, node)
    assert own.cert is None and not own.poll()
    rc = main(["node", "certify", node, "--role", "durable", "--role", "voter", "--class", "1xH100", "--key",
               str(keyfile), "--valid-for", "2h", "--install", "--data-dir", str(data)])
    assert rc == 0 and own.poll()
    assert own.cert.roles == ["voter", "durable"] and own.cert.node_class == "1xH100"
    assert own.cert.expires_at - own.cert.issued_at == 7200
    assert check_cert(node, ["voter"], own.cert, PINNED, own.cert.issued_at).roles == ("voter",)  # no lead granted
    (data / "role.cert").write_text("garbage")
    assert own.poll() and own.cert is None and own.error  # dropped and counted, never fatal
    rc = main(["node", "certify", "other-node", "--role", "voter", "--key", str(keyfile), "--out",
               str(data / "role.cert")])
    assert rc == 0 and not own.poll() and "not of this node" in own.error
    assert main(["node", "certify", node, "--role", "voter", "--key", str(keyfile), "--valid-for", "999d"]) == 2
