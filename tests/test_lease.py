"""The lease on a node's exclusive work (issue 42 item 3) in virtual time: the pure core
(:class:`p2pnode.node._lease.Lease`) and its stop rule ``lease_expired`` (:class:`p2pnode.node._stoprules.StopRules`),
``now`` passed in, deadlines checked exactly."""

from __future__ import annotations

import contextlib
import math

import pytest

from p2pnode.node import StopJob
from p2pnode.node._lease import DRIFT_RATE, MARGIN_S, Lease, takeover_after_s
from p2pnode.node._stoprules import LEASE_REASON, RuleInputs, RuleJob, StopRules

V = ("a", "b", "c", "d", "e")  # five voters; "a" is this node


def _lease(**kw) -> Lease:
    kw.setdefault("lease_s", 30.0)
    kw.setdefault("stop_lead_s", 10.0)
    lease = Lease("a", **kw)
    lease.set_voters(V)
    return lease


def test_held_only_with_a_quorum_of_direct_acks_counted_from_the_send():
    lease = _lease()
    assert lease.expires_at(0.0) == -math.inf and not lease.held(0.0)  # itself alone: 1 of the 3 needed
    assert lease.acked("b", 1.0, now=1.4)
    assert not lease.held(1.4)  # 2 of 3
    assert lease.acked("c", 2.0, now=5.0)  # acked late: it counts from its send at 2.0, not from 5.0
    assert lease.renewed_at(5.0) == 1.0  # the quorum-th latest: a, c (2.0), b (1.0)
    assert lease.expires_at(5.0) == 31.0 and lease.stop_at(5.0) == 21.0
    assert lease.held(20.999) and not lease.held(21.0)


def test_a_slow_ack_never_lengthens_the_lease_and_older_sends_do_not_move_it():
    lease = _lease()
    lease.acked("b", 10.0, now=10.1)
    lease.acked("c", 10.0, now=10.2)
    assert lease.expires_at(11.0) == 40.0
    assert not lease.acked("b", 9.0, now=12.0)  # an older ping's ack arriving late
    assert lease.expires_at(12.0) == 40.0


def test_acks_of_non_voters_itself_or_from_the_future_are_ignored():
    lease = _lease()
    assert not lease.acked("x", 1.0, now=1.0)  # not a voter
    assert not lease.acked("a", 1.0, now=1.0)  # itself: counted at now already, never by a message
    assert not lease.acked("b", 5.0, now=1.0)  # sent after now: impossible
    assert lease.ignored == 3 and lease.renewals == 0
    assert not lease.held(1.0)


def test_a_voter_leaving_the_set_takes_its_renewal_with_it():
    lease = _lease()
    lease.acked("b", 1.0, now=1.0)
    lease.acked("c", 1.0, now=1.0)
    assert lease.held(2.0)
    lease.set_voters(("a", "c", "d", "e", "f"))  # b no longer votes
    assert not lease.held(2.0)


def test_a_lone_voter_holds_its_own_lease_and_a_non_voter_needs_others():
    solo = Lease("a", lease_s=30.0, stop_lead_s=10.0)
    solo.set_voters(("a",))
    assert solo.held(0.0) and solo.held(1e9)
    follower = Lease("z", lease_s=30.0, stop_lead_s=10.0)  # not a voter: a majority of 3 others
    follower.set_voters(("a", "b", "c"))
    follower.acked("a", 1.0, now=1.0)
    assert not follower.held(1.0)
    follower.acked("b", 2.0, now=2.0)
    assert follower.expires_at(2.0) == 31.0


def test_min_voters_keeps_the_quorum_from_shrinking():
    lease = Lease("a", lease_s=30.0, stop_lead_s=10.0, min_voters=3)
    lease.set_voters(("a",))  # one voter known so far, but the cluster has at least 3: a majority is 2
    assert not lease.held(0.0)


def test_a_restored_lease_holds_until_its_old_expiry_then_renewals_take_over():
    lease = _lease()
    lease.restore(25.0)  # the last run's expiry, mapped onto this run's clock
    assert lease.stop_at(0.0) == 15.0 and lease.held(14.9) and not lease.held(15.0)
    lease.acked("b", 14.0, now=14.5)
    lease.acked("c", 14.0, now=14.5)
    assert lease.stop_at(14.5) == 34.0


def test_renewal_pings_go_to_each_other_voter_once_per_renew_interval():
    lease = _lease()
    assert lease.renew_interval_s == 5.0
    assert lease.due(0.0) == [("b", False), ("c", False), ("d", False), ("e", False)]
    assert lease.due(1.0) == [] and lease.next_deadline() == 5.0
    lease.acked("b", 0.0, now=0.1)
    lease.acked("c", 0.0, now=0.1)  # d and e did not answer: their next ping goes over the stream transport
    assert lease.due(5.0) == [("b", False), ("c", False), ("d", True), ("e", True)]
    lease.set_voters(("a", "b"))
    assert lease.next_deadline() == 10.0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Lease("a", lease_s=0.0, stop_lead_s=0.0)
    with pytest.raises(ValueError):
        Lease("a", lease_s=10.0, stop_lead_s=10.0)  # nothing would ever run


def test_the_leader_waits_past_the_holders_lease_and_its_drift_margin():
    assert takeover_after_s(30.0) == pytest.approx(30.0 * (1 + DRIFT_RATE) + MARGIN_S)
    assert takeover_after_s(30.0) > 30.0


# -- the stop rule --------------------------------------------------------------------------------------------
def test_the_lease_rule_stops_fenced_jobs_at_the_stop_time_and_only_those():
    rules = StopRules()
    train = RuleJob("t1", "train", "training", fenced=True, lease_lead_s=10.0, started_at=0.0)
    play = RuleJob("p1", "play", "selfplay", started_at=0.0, max_runtime_s=3600.0)
    inp = RuleInputs((train, play), frozenset({"train", "play"}), lease_expires_at=31.0)
    assert rules.step(inp, 20.0) == [] and rules.next_deadline() == 21.0
    assert rules.step(inp, 21.0) == [StopJob("t1", LEASE_REASON, "lease_expired")]
    assert rules.next_deadline() == 3600.0  # the selfplay's maximum runtime
    assert rules.step(inp, 30.0) == []  # asked once
    assert rules.counts["lease_expired"] == 1


def test_a_renewal_moves_the_rules_deadline():
    rules = StopRules()
    train = RuleJob("t1", "train", "training", fenced=True, lease_lead_s=10.0, started_at=0.0)
    assert rules.step(RuleInputs((train,), frozenset({"train"}), lease_expires_at=31.0), 10.0) == []
    assert rules.next_deadline() == 21.0
    assert rules.step(RuleInputs((train,), frozenset({"train"}), lease_expires_at=36.0), 21.0) == []
    assert rules.next_deadline() == 26.0


def test_max_runtime_names_a_stop_due_at_the_same_step_before_the_lease():
    rules = StopRules()
    train = RuleJob("t1", "train", "training", fenced=True, lease_lead_s=10.0, started_at=0.0, max_runtime_s=10.0)
    out = rules.step(RuleInputs((train,), frozenset({"train"}), lease_expires_at=15.0), 10.0)
    assert [e.rule for e in out] == ["max_runtime"]


def test_a_virtual_partition_stops_training_before_the_lease_runs_out():
    """The holder renews every interval until a partition at t=100 cuts it off from the other voters; the rule
    stops its training by expiry − stop lead, and nothing of it runs at expiry (the runner takes at most the
    stop grace, the stop lead)."""
    lease = _lease()
    rules = StopRules()
    train = RuleJob("t1", "train", "training", fenced=True, lease_lead_s=10.0, started_at=0.0)
    now, stopped_at = 0.0, None
    while now < 200.0 and stopped_at is None:
        for v, _ in lease.due(now):
            if now < 100.0:  # before the partition every voter acks within 50 ms
                lease.acked(v, now, now + 0.05)
        out = rules.step(RuleInputs((train,), frozenset({"train"}), lease_expires_at=lease.expires_at(now)), now)
        if out:
            stopped_at = now
        now = min(lease.next_deadline(), rules.next_deadline(), now + 1.0)
    assert stopped_at is not None
    last_renewal = 95.0  # the last ping round before the partition
    assert stopped_at == last_renewal + 30.0 - 10.0
    assert stopped_at + 10.0 <= last_renewal + 30.0  # the stop grace ends no later than the expiry


# -- renewals come from the prober's direct acks only ---------------------------------------------------------
def _prober(self_id, others):
    import random

    from p2pnode.gossip._membership import Membership, MembershipConfig
    from p2pnode.gossip._probe import ProbeConfig, Prober

    m = Membership(self_id, MembershipConfig(), adopt_suspicions=True)
    for o in others:
        m.observe(o, version=1, incarnation=0, leaving=False, suspects={}, now=0.0)
    p = Prober(m, ProbeConfig(), rng=random.Random(1))
    p.keep_direct_acks = True
    return p


def test_a_lease_ping_acked_by_its_target_is_a_direct_ack_timed_from_the_send():
    from p2pnode.gossip._probe import Ack, DirectAck, SendPing

    p = _prober("a", ["b", "c"])
    (ping,) = [e.msg for e in p.ping("b", 3.0) if isinstance(e, SendPing)]
    p.receive(Ack(ping.seq, "b", "a", 0), 7.5)  # answered late: still counted from 3.0
    assert p.take_direct_acks() == [DirectAck("b", 3.0)]
    p.receive(Ack(ping.seq, "b", "a", 0), 8.0)  # a replayed ack renews nothing twice
    assert p.take_direct_acks() == []


def test_a_relayed_ack_or_one_from_another_member_is_no_direct_ack():
    from p2pnode.gossip._probe import Ack, DirectAck, SendPing

    p = _prober("a", ["b", "c", "d"])
    (ping,) = [e.msg for e in p.ping("b", 1.0) if isinstance(e, SendPing)]
    p.receive(Ack(ping.seq, "c", "a", 0, "b"), 1.1)  # relayed
    p.receive(Ack(ping.seq, "c", "a", 0), 1.2)  # not from its target
    assert p.take_direct_acks() == []
    # the round-robin probe: a relayed ack is a sign of life, not a renewal; the target's own is both
    (probe,) = [e.msg for e in p.tick(2.0) if isinstance(e, SendPing)]
    p.tick(2.5)  # timed out: ping-reqs go to the relays
    relay = next(r for r in ("b", "c", "d") if r != probe.to)
    p.receive(Ack(probe.seq, relay, "a", 0, probe.to), 2.6)
    assert p.take_direct_acks() == []
    (probe2,) = [e.msg for e in p.tick(3.0) if isinstance(e, SendPing)]
    p.receive(Ack(probe2.seq, probe2.to, "a", 0), 3.2)
    assert p.take_direct_acks() == [DirectAck(probe2.to, 3.0)]


# -- the leader: a dead holder's fenced work waits for its lease, not for orphan_grace_s ------------------------
def test_the_leader_places_a_dead_holders_training_after_its_lease_and_margin_and_keeps_its_other_jobs():
    from p2pnode.gossip import MemberState
    from p2pnode.node import PublishPlan
    from tests.test_job_core import core, drive, inputs, lead, member, of, report

    def run(lease_s):
        c = core("a", settle_s=0.0, orphan_grace_s=120.0, lease_s=lease_s)
        dead = member("b", state=MemberState.DEAD, since=0.0,
                      running=[report("1-1", "train"), report("1-2", "sp", (1,))])
        ms = [member("a"), dead]

        last: list = []

        def planned(now):
            """The newest plan at ``now``, the core stepped at each of its deadlines before."""
            t = c.next_deadline() if last else now
            while t < now:
                last.extend(of(drive(c, inputs(lead("a"), ms), t), PublishPlan))
                assert c.next_deadline() > t
                t = c.next_deadline()
            last.extend(of(drive(c, inputs(lead("a"), ms), now), PublishPlan))
            return {j.job_id: (j.template, j.node) for j in last[-1].section.assignments}
        return planned

    bound = takeover_after_s(30.0)
    planned = run(30.0)
    assert planned(1.0)["1-1"] == ("train", "b")
    assert planned(bound - 0.01)["1-1"] == ("train", "b")  # b may still hold its lease: its training counts
    assert "1-1" not in planned(bound + 5.0)  # b stopped it by then, on its own clock: the next plan frees it
    later = planned(61.0)  # (a's own unreported selfplay assignments have lapsed: room on a)
    assert [n for t, n in later.values() if t == "train"] == ["a"]
    assert later["1-2"] == ("sp", "b")  # b's selfplay still counts, for orphan_grace_s
    planned = run(0.0)  # no lease: orphan_grace_s for everything, as before
    assert planned(1.0)["1-1"] == ("train", "b") and planned(61.0)["1-1"] == ("train", "b")


# -- the lease file (p2pnode.jobs._leasefile) ------------------------------------------------------------------
BOOT = "0123abcd-0000-4000-8000-00000000beef"


class _Clock:
    def __init__(self, mono=100.0, wall=1_800_000_000.0):
        self.mono, self.wall = mono, wall

    def advance(self, s):
        self.mono += s
        self.wall += s


def _keeper(tmp_path, clock, voters=V):
    from p2pnode.jobs._leasefile import LeaseKeeper

    return LeaseKeeper(node_id="a", path=tmp_path / "lease", lease_s=30.0, stop_grace_s=10.0, min_voters=1,
                       voters=lambda: voters, now=lambda: clock.mono, clock=lambda: clock.wall, boot=BOOT)


def test_the_keeper_writes_the_expiry_on_the_wall_clock_and_a_restart_carries_it_on(tmp_path):
    from p2pnode.jobs._leasefile import read_expiry

    clock = _Clock()
    k = _keeper(tmp_path, clock)
    assert k.expires_at() == -math.inf and read_expiry(tmp_path / "lease", BOOT) == 0  # never held: expired
    assert k.due(clock.mono) == [("b", False), ("c", False), ("d", False), ("e", False)]
    clock.advance(0.1)
    k.acked("b", clock.mono - 0.1, clock.mono)
    k.acked("c", clock.mono - 0.1, clock.mono)  # a quorum: the file follows at once, from the send
    assert read_expiry(tmp_path / "lease", BOOT) == int(1_800_000_000.0 + 30.0)
    clock.advance(12.0)  # the agent is killed and started again on another monotonic clock
    again = _keeper(tmp_path, _Clock(mono=5.0, wall=clock.wall))
    assert again.expires_at() == pytest.approx(5.0 + 30.0 - 12.1, abs=1.0)  # what was left, whole seconds down
    assert again.lease.stop_at(5.0) <= 5.0 + 30.0 - 12.1 - 10.0 + 1e-6  # never later than the first run's


def test_a_lone_voter_refreshes_its_file_each_renew_interval(tmp_path):
    from p2pnode.jobs._leasefile import read_expiry

    clock = _Clock()
    k = _keeper(tmp_path, clock, voters=("a",))
    assert k.due(clock.mono) == [] and read_expiry(tmp_path / "lease", BOOT) == int(clock.wall + 30.0)
    assert k.next_deadline() == clock.mono + 5.0
    clock.advance(5.0)
    k.due(clock.mono)
    assert read_expiry(tmp_path / "lease", BOOT) == int(clock.wall + 30.0) and k.writes == 2


@pytest.mark.parametrize("text", [b"", b"-5\n", b"12x\n", b"9" * 13, b"\xff\xfe", b"1e9\n", b" " * 40 + b"1",
                                  f"{BOOT} 09\n".encode(), f"{BOOT} 0123\n".encode(), b"1800000030\n",
                                  f"{BOOT[:-1]}0 1800000030\n".encode(), f"{BOOT} 1800000030 1\n".encode()])
def test_a_hostile_or_broken_lease_file_is_no_lease(tmp_path, text):
    from p2pnode.jobs._leasefile import read_expiry

    (tmp_path / "lease").write_bytes(text)
    assert read_expiry(tmp_path / "lease", BOOT) is None
    k = _keeper(tmp_path, _Clock())
    assert k.expires_at() == -math.inf  # nothing restored: fenced jobs stop, never a crash


def test_the_wrapper_is_the_lease_wrappers_for_fenced_templates_only(tmp_path):
    from p2pnode.jobs._leasefile import wrapper_args
    from p2pnode.jobs._ledger import LEASE_WRAPPER, WRAPPER
    from p2pnode.scheduler import parse_catalog

    cat = parse_catalog({"job": [
        {"name": "t", "kind": "training", "config": "c", "argv": ["x"]},
        {"name": "x", "kind": "eval", "config": "c", "argv": ["x"], "exclusive": True},
        {"name": "s", "kind": "selfplay", "config": "c", "argv": ["x"]},
    ]})
    lf = tmp_path / "lease"
    t, x, s = (cat.templates[n] for n in ("t", "x", "s"))
    assert t.fenced and x.fenced and not s.fenced
    assert wrapper_args(t, tmp_path / "e", lf, 2.5) == [LEASE_WRAPPER, "p2pnode-job", str(tmp_path / "e"), str(lf),
                                                         "3", "3", ""]
    assert wrapper_args(x, tmp_path / "e", lf, 2.0)[0] == LEASE_WRAPPER
    assert wrapper_args(s, tmp_path / "e", lf, 2.0)[0] == WRAPPER
    assert wrapper_args(t, tmp_path / "e", None, 2.0)[0] == WRAPPER  # no lease kept


def test_the_catalog_types_exclusive():
    from p2pnode.scheduler import CatalogError, parse_catalog

    with pytest.raises(CatalogError, match="exclusive: must be true or false"):
        parse_catalog({"job": [{"name": "x", "kind": "eval", "config": "c", "argv": ["x"], "exclusive": "yes"}]})


def test_fenced_work_is_refused_while_the_lease_is_not_held_and_other_work_is_not():
    from p2pnode.node import Refuse
    from tests.test_job_core import core, inputs, lead, member, pjob

    c = core("a", settle_s=0.0)
    inp = inputs(lead("b"), [member("a"), member("b")], fenced_refused="lease not held")
    out: list = []
    assert not c.admit(inp, pjob("1-1", "a", "train"), 1.0, out)
    assert [(e.job_id, e.reason) for e in out if isinstance(e, Refuse)] == [("1-1", "lease not held")]
    assert c.admit(inp, pjob("1-2", "a", "sp", gpu=1), 1.0, out)


# -- review 22: the stop lead against the lease, the file's clock, the wrapper's guard and cgroup ------------------
CK_CATALOG = """
[[job]]
name = "train"
kind = "training"
config = "c"
argv = ["python", "t.py"]
[job.checkpoint]
dir = "ck/{config}"
%s
"""


def test_a_fenced_template_whose_checkpoint_grace_does_not_fit_the_lease_is_refused_at_load_and_push(tmp_path):
    from p2pnode.config import ConfigError, load_config
    from p2pnode.identity import SigningKey
    from p2pnode.node._lease import catalog_lease_problems, max_checkpoint_grace_s
    from p2pnode.scheduler import CatalogBook, CatalogRefused, catalog_from_text, sign_catalog
    from p2pnode.scheduler._signed import public_key_text

    long = catalog_from_text(CK_CATALOG % "", source="t", base_dir=str(tmp_path))  # grace_s 60 by default
    problems = catalog_lease_problems(long.templates.values(), 30.0, 10.0)
    assert len(problems) == 1 and "'train'" in problems[0] and "lease_s 30 s" in problems[0]
    assert "stop_grace_s 10 s" in problems[0] and "grace_s 60 s" in problems[0]
    fits = max_checkpoint_grace_s(30.0, 10.0)
    assert fits == pytest.approx(30.0 - 7.5 - 3.0 - 10.0)
    short = catalog_from_text(CK_CATALOG % f"grace_s = {math.floor(fits)}", source="t", base_dir=str(tmp_path))
    assert catalog_lease_problems(short.templates.values(), 30.0, 10.0) == []
    assert catalog_lease_problems(long.templates.values(), 0.0, 10.0) == []  # no lease kept
    # a catalog file at start: refused with the reason
    (tmp_path / "cat.toml").write_text(CK_CATALOG % "")
    (tmp_path / "p.toml").write_text(f'[agent]\ncatalog = "{tmp_path / "cat.toml"}"\n[gossip]\nprobes = true\n')
    with pytest.raises(ConfigError, match="template 'train' is fenced by the lease"):
        load_config(tmp_path / "p.toml")
    # pushed: refused as invalid_catalog and counted, the node carries on
    key = SigningKey.generate()
    book = CatalogBook((public_key_text(key),), base_dir=str(tmp_path), lease=(30.0, 10.0))
    with pytest.raises(CatalogRefused, match="fenced by the lease"):
        book.check(sign_catalog(key, 1, CK_CATALOG % ""))
    assert book.refused["invalid_catalog"] == 1
    assert book.check(sign_catalog(key, 2, CK_CATALOG % "grace_s = 5")).templates["train"].fenced


def test_a_lease_every_voter_renews_never_stops_a_checkpointing_training_at_the_longest_lead_allowed():
    from p2pnode.jobs._leasefile import template_lead_s
    from p2pnode.node._lease import max_checkpoint_grace_s
    from p2pnode.scheduler import parse_catalog

    lease_s, grace = 30.0, 10.0
    ck = math.floor(max_checkpoint_grace_s(lease_s, grace) * 10) / 10  # the longest grace that is accepted
    t = parse_catalog({"job": [{"name": "train", "kind": "training", "config": "c", "argv": ["x"],
                                "checkpoint": {"dir": "ck/{config}", "grace_s": ck}}]}).templates["train"]
    lead = template_lead_s(t, grace)
    assert lead == pytest.approx(grace + ck)
    lease = Lease("a", lease_s=lease_s, stop_lead_s=grace, min_voters=3)
    lease.set_voters({"a", "b", "c"})
    rules = StopRules()
    now = 100.0
    for v, sent in (("b", now), ("c", now)):
        lease.acked(v, sent, now + 1.0)
    job = RuleJob("1-1", "train", "training", started_at=now, fenced=True, lease_lead_s=lead)
    # ten leases long, each voter pinged every renew interval and acking a second later
    while now < 100.0 + 10 * lease_s:
        now += 0.5
        for v, _ in lease.due(now - 1.0):
            lease.acked(v, now - 1.0, now)
        out = rules.step(RuleInputs((job,), frozenset({"train"}), lease_expires_at=lease.expires_at(now)), now)
        assert out == [], now
        # the wrapper's watchdog: the file up to half a renew interval and a second behind, the lead rounded up
        file_expiry = math.floor(lease.expires_at(now) - lease.renew_interval_s / 2)
        assert file_expiry - math.ceil(lead) > math.floor(now), now


def _run_wrapper(tmp_path, lease_text: str, argv, *, cgroup: str = "", env=None, lead="0"):
    import subprocess

    from p2pnode.jobs._ledger import LEASE_WRAPPER

    (tmp_path / "lease").write_text(lease_text)
    return subprocess.Popen(["sh", "-c", LEASE_WRAPPER, "p2pnode-job", str(tmp_path / "exit"), str(tmp_path / "lease"),
                             lead, "1", cgroup, *argv], start_new_session=True, env=env)


def _boot_now() -> tuple[str, int]:
    from p2pnode.jobs._leasefile import boot_id

    with open("/proc/uptime") as fh:
        return boot_id(), math.floor(float(fh.read().split()[0]))


@pytest.mark.parametrize("how", ["octal", "other boot", "wall clock step"])
def test_the_watchdog_ends_a_job_at_once_on_a_leading_zero_another_boots_file_or_a_wall_clock_step(tmp_path, how):
    import os

    boot, up = _boot_now()
    env = None
    if how == "octal":
        text = f"{boot} 09\n"  # dash reads it as octal: an arithmetic error killed the watchdog before
    elif how == "other boot":
        text = f"00000000-0000-4000-8000-000000000000 {up + 3600}\n"
    else:  # the lease ran out 5 s ago on the boot clock; a `date` one hour behind changes nothing
        text = f"{boot} {up - 5}\n"
        shim = tmp_path / "bin"
        shim.mkdir()
        (shim / "date").write_text("#!/bin/sh\necho $(( $(/bin/date +%s) - 3600 ))\n")
        (shim / "date").chmod(0o755)
        env = dict(os.environ, PATH=f"{shim}:{os.environ['PATH']}")
    p = _run_wrapper(tmp_path, text, ["sleep", "60"], env=env)
    try:
        assert p.wait(timeout=30) == 143  # SIGTERM, long before the job's own end
        assert (tmp_path / "exit.lease").exists()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)


def test_a_restored_lease_is_capped_at_lease_s_and_another_boots_is_none(tmp_path):
    from p2pnode.jobs._leasefile import write_expiry

    clock = _Clock()
    write_expiry(tmp_path / "lease", BOOT, int(clock.wall) + 3600)  # a file an hour ahead (a step, or tampered)
    assert _keeper(tmp_path, clock).expires_at() == pytest.approx(clock.mono + 30.0)
    write_expiry(tmp_path / "lease", BOOT.replace("beef", "feed"), int(clock.wall) + 20)
    assert _keeper(tmp_path, clock).expires_at() == -math.inf


def test_the_watchdog_kills_the_jobs_cgroup_when_it_ended_the_job_and_only_then(tmp_path):
    import os

    boot, up = _boot_now()
    cg = tmp_path / "cg"
    cg.mkdir()
    (cg / "cgroup.kill").write_text("")  # the wrapper writes 1 there (a regular file here: no cgroup v2 to spare)
    p = _run_wrapper(tmp_path, f"{boot} {up + 3600}\n", ["true"], cgroup=str(cg))
    assert p.wait(timeout=30) == 0 and (cg / "cgroup.kill").read_text() == ""  # ended by itself: nothing killed
    (tmp_path / "exit").unlink()
    pid_file = tmp_path / "stray"
    stray = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 60' & exec sleep 60"
    p = _run_wrapper(tmp_path, f"{boot} {up - 5}\n", ["sh", "-c", stray], cgroup=str(cg))
    try:
        p.wait(timeout=30)
        assert (tmp_path / "exit.lease").exists() and (tmp_path / "exit").read_text().strip() == "143"
        assert (cg / "cgroup.kill").read_text().strip() == "1"  # the setsid'd sleep ends with the cgroup
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        with contextlib.suppress(OSError, ValueError):  # no real cgroup here: the stray is this test's to end
            os.kill(int(pid_file.read_text()), 9)


def test_the_keeper_warns_when_the_lease_rests_on_a_quorum_of_one(tmp_path, caplog):
    from p2pnode.jobs._leasefile import LeaseKeeper

    def keeper(min_voters):
        return LeaseKeeper(node_id="a", path=tmp_path / "lease", lease_s=30.0, stop_grace_s=10.0,
                           min_voters=min_voters, voters=lambda: {"a"}, now=lambda: 0.0, boot=BOOT)

    with caplog.at_level("WARNING", logger="p2pnode.jobs"):
        keeper(1)
    assert "election.min_voters is 1" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="p2pnode.jobs"):
        keeper(3)
    assert "min_voters" not in caplog.text
