"""Roles the operator grants (issue 37, item 1): certificates, the reasons a role is refused, and the effective view
every consumer of ClusterState reads, including its change at expiry without a new snapshot version."""

from __future__ import annotations

import msgspec
import pytest
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
from p2pnode.identity import Identity, SigningKey

KEY = SigningKey.generate()
OTHER = SigningKey.generate()
PINNED = {operator_key_text(KEY): KEY.public_key}
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
    from p2pnode._ed25519 import pkcs8_pem
    from p2pnode.cli import main
    from p2pnode.node._persist import OwnCert

    keyfile = tmp_path / "op.key"
    keyfile.write_bytes(pkcs8_pem(KEY))
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


def test_a_class_counts_from_any_valid_certificate_even_one_granting_no_role():
    """Review of issue 37: a worker certified ``--class 1xH100`` with no --role used to count toward no class."""
    worker = cert(roles=(), node_class="1xH100", provider_id="vast-7")
    r = check_cert("n1", ["gpu"], worker, PINNED, T0 + 1)
    assert r.roles == () and r.reason == "" and certified_class(r) == ("1xH100", "vast-7")
    assert certified_class(check_cert("n1", ["gpu"], worker, PINNED, T0 + 3600)) is None  # expired: none


def test_lead_is_refused_and_counted_only_for_a_member_that_claims_a_role():
    """Review of issue 37: every member not certified to lead was counted ``not_granted`` and showed
    ``refused: ["lead"]``, which made p2pnode_role_certs_refused_total noise. A plain worker is refused nothing
    (it is still not eligible to lead); a member tagged voter without a certificate is refused voter and lead."""
    gate = RoleGate((operator_key_text(KEY),))
    plain = gate.check("w1", ["gpu"], None, T0)
    assert plain.refused == () and plain.roles == () and UNCERTIFIED_LEAD_TAG in effective_tags(["gpu"], plain)
    worker = gate.check("w2", ["gpu"], cert("w2", roles=("durable",)), T0)
    assert worker.refused == () and worker.reason == ""
    assert sum(gate.refused.values()) == 0
    voter = gate.check("v1", ["voter"], cert("v1", roles=("voter",)), T0)
    assert voter.refused == ("lead",) and voter.reason == "not_granted" and gate.refused["not_granted"] == 1


def test_a_clock_step_forward_is_undone_when_the_clock_is_set_right():
    """Review of issue 37: roles_wall only moved forward, so one step of the clock made every certificate look
    expired until real time caught up. The wall given each time is the one judged."""
    me, member = Identity.generate(), Identity.generate()
    gate = RoleGate((operator_key_text(KEY),))
    state = ClusterState(me.node_id, roles=gate, roles_wall=T0)
    state.merge([envelope(member, 1, tags=["voter"], cert=wire(cert(member.node_id, life=600)))], 0.0)
    assert state.get(member.node_id).snapshot.tags == ["voter"]
    assert state.recheck_roles(T0 + 86400) == [member.node_id]  # the clock jumped a day ahead
    assert state.get(member.node_id).snapshot.tags == [UNCERTIFIED_LEAD_TAG]
    assert state.recheck_roles(T0 + 5) == [member.node_id]  # set right: the role is back at once
    assert state.get(member.node_id).snapshot.tags == ["voter"]
    state.merge([envelope(member, 2, tags=["voter"], cert=wire(cert(member.node_id, life=600)))], 1.0)
    assert state.get(member.node_id).snapshot.tags == ["voter"]


def test_a_renewed_certificate_with_fewer_roles_supersedes_the_older_one():
    """Review of issue 37: a node could go on publishing an older, unexpired certificate after the operator issued
    a renewed one with fewer roles. The newest verified certificate seen for a node sets a floor on issued_at; an
    older one is refused ``superseded`` (counted), even after the member was forgotten."""
    me, member = Identity.generate(), Identity.generate()
    gate = RoleGate((operator_key_text(KEY),))
    state = ClusterState(me.node_id, roles=gate, roles_wall=T0 + 20)
    old = cert(member.node_id, roles=("voter", "durable"), life=86400)
    new = cert(member.node_id, roles=("voter",), start=T0 + 10, life=86400)
    tags = ["voter", "durable"]
    state.merge([envelope(member, 1, tags=tags, cert=wire(old))], 0.0)
    assert state.get(member.node_id).snapshot.tags == [*tags, UNCERTIFIED_LEAD_TAG]
    state.merge([envelope(member, 2, tags=tags, cert=wire(new))], 1.0)
    assert state.get(member.node_id).snapshot.tags == ["voter", UNCERTIFIED_LEAD_TAG]
    state.merge([envelope(member, 3, tags=tags, cert=wire(old))], 2.0)  # shows the older one again
    check = gate.check_of(member.node_id)
    assert check.reason == "superseded" and check.roles == () and gate.refused["superseded"] == 1
    assert state.get(member.node_id).snapshot.tags == [UNCERTIFIED_LEAD_TAG]
    state.forget(member.node_id)  # reaped and back: the floor holds
    state.merge([envelope(member, 9, tags=tags, cert=wire(old))], 3.0)
    assert gate.check_of(member.node_id).reason == "superseded"
    assert gate.floors() == {member.node_id: T0 + 10}
    other = RoleGate((operator_key_text(KEY),))
    other.restore_floors(gate.floors())
    assert other.check(member.node_id, tags, old, T0 + 20).reason == "superseded"
    assert other.check(member.node_id, tags, new, T0 + 20).roles == ("voter",)
    forged = msgspec.structs.replace(new, issued_at=T0 + 99)  # a bad signature never raises the floor
    other.check(member.node_id, tags, forged, T0 + 20)
    assert other.floors()[member.node_id] == T0 + 10


def test_a_worker_certified_with_a_class_and_no_role_counts_toward_it_through_the_job_control_hook(tmp_path):
    """Review of issue 37, end to end through the hook: JobControl.inputs fills JobCore.certified_class from each
    member's RoleCheck (certs.certified_class), ScalingCore.step(certified_class=...) hands it to counted_fleet, and
    the worker certified ``--class 1xH100`` with no --role counts toward the class (min_nodes 1: no scale-up),
    while a fake claiming the class with no certificate does not."""
    from helpers import FakeContext, typed
    from test_scaling import CATALOG, H100, policy, verdict
    from test_scaling_counts import member, voters

    from p2pnode.config import Config
    from p2pnode.gossip import MembershipConfig
    from p2pnode.jobs._control import JobControl
    from p2pnode.node import MemoryStore, NodeCore
    from p2pnode.scheduler._scaling import ClassPolicy, ProviderCall, ProviderList, ScalingCore

    gate = RoleGate((operator_key_text(KEY),))

    class Ctx(FakeContext):
        def member(self, origin):
            m = super().member(origin)
            s = m.snapshot if m is not None else None
            return None if m is None else msgspec.structs.replace(m, roles=gate.check(origin, s.tags, s.cert, T0 + 5))

    ctx = Ctx(Config(), data_dir=tmp_path)
    worker, fake = Identity.generate(), Identity.generate()
    for ident, extra in ((ctx.identity, {}), (worker, {"cert": wire(cert(worker.node_id, roles=(), node_class=H100))}),
                         (fake, {})):
        ctx.put(typed(envelope(ident, 1, **extra)), b"")
    core = NodeCore(ctx.node_id, config=MembershipConfig(), store=MemoryStore(), info=lambda n: None,
                    roll_candidates=list)
    jc = JobControl(ctx, core, CATALOG)
    jc.inputs()
    assert jc.core.certified_class == {worker.node_id: H100}
    scaling = ScalingCore(policy(cooldown_s=0.0, classes={H100: ClassPolicy(1, 4)}))
    scaling.lead(1, [], -1000.0)
    fleet = [*voters(), member(worker.node_id, cls="cpu"), member(fake.node_id)]  # the fake claims the class
    assert scaling.step(fleet, [], CATALOG, None, 1.0, certified_class=jc.core.certified_class) == [ProviderList()]
    scaling.listed([], "", 1.0)
    assert scaling.step(fleet, [], CATALOG, None, 1.0, certified_class=jc.core.certified_class) == []
    v = verdict(scaling.verdicts)
    assert v.verdict == "hold" and v.nodes_now == 1, v
    [call] = scaling.step(fleet, [], CATALOG, None, 2.0, certified_class={})  # without the certificate: short
    assert isinstance(call, ProviderCall) and call.action.op == "up"


def test_certificate_floors_persist_through_their_typed_decoder(tmp_path):
    from p2pnode.node._persist import ROLE_FLOORS_FILE, load_role_floors, save_role_floors
    from p2pnode.statefiles import open_report

    report = open_report(tmp_path)
    save_role_floors(tmp_path, {"n1": T0, "n2": T0 + 5})
    assert load_role_floors(tmp_path, limit=10) == {"n1": T0, "n2": T0 + 5}
    (tmp_path / ROLE_FLOORS_FILE).write_text('[{"node": "n1", "issued_at": 7}, {"node": "n\\u0000", "issued_at": 1},'
                                             ' {"node": "n3", "issued_at": 1e400}, {"node": "n4", "issued_at": -1}]')
    assert load_role_floors(tmp_path, limit=10) == {"n1": 7}
    assert report.count(ROLE_FLOORS_FILE, "bad_entry") == 3
    (tmp_path / ROLE_FLOORS_FILE).write_text("not json")
    assert load_role_floors(tmp_path, limit=10) == {} and report.count(ROLE_FLOORS_FILE, "malformed") == 1
