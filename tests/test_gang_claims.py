"""Gang slots from the plan, not from a member's word (issue 37, item 4), with plain values: the leader believes a
member's gang slot only when the carried plan gave that node that slot; other claims are ignored, counted against
the member, and never end the gang. A planned node that reports its own slot inconsistently still ends it."""

from test_gangs import cat, gang_job, node

from p2pnode.node._claims import (
    MAX_CLAIM_MEMBERS,
    MAX_CLAIMS_PER_REASON,
    MAX_SUSPICIOUS_CLAIMS,
    ClaimLedger,
    claim_refusal,
    ended_refusal,
)
from p2pnode.node._plans import MemberPlanInput, Planner
from p2pnode.snapshot import GangSlot, JobReport, PlanJob


def _placed(n=3):
    """A planner that placed a gang of ``n`` on n1..nN (term 7), its plan, and each member's running report."""
    planner = Planner(cat(gang_job(members=n)))
    members = [MemberPlanInput(f"n{i}", node(f"n{i}", power=3000 - i)) for i in range(1, n + 1)]
    first = planner.lead(7, members, None, {}, 100.0, 1e9).section
    reports = {j.node: JobReport(job_id=j.job_id, template=j.template, gpus=list(j.gpus), gpu_fraction=j.gpu_fraction,
                                 vram_gib=j.vram_gib, term=j.term, gang=j.gang) for j in first.assignments}
    return planner, first, reports


def _with(reports, extra=None):
    out = [MemberPlanInput(n, node(n, power=3000 - int(n[1:])), (r,)) for n, r in sorted(reports.items())]
    if extra is not None:
        out.append(extra)
    return out


def _fake(reports, *, job_id=None, rank=0, gang_id=None, ended=frozenset()):
    """A fake member reporting a job with rank ``rank`` of the real gang (or of ``gang_id``)."""
    r0 = next(r for r in reports.values() if r.gang.rank == 0)
    slot = GangSlot(id=gang_id or r0.gang.id, rank=rank, size=r0.gang.size, master="10.0.0.9", master_port=29400,
                    port_base=29400)
    rep = JobReport(job_id=job_id or r0.job_id, template=r0.template, gpus=[0], gpu_fraction=1.0, vram_gib=16.0,
                    term=7, gang=slot)
    return MemberPlanInput("fake", node("fake9", power=1), (rep,), ended=ended, ended_ok=ended)


def test_a_fake_rank_0_of_a_real_gang_is_ignored_counted_and_ends_nothing():
    planner, prev, reports = _placed()
    gid = next(r.gang.id for r in reports.values())
    jobs = {j.job_id for j in prev.assignments}
    for k, fake in enumerate([_fake(reports), _fake(reports, job_id="7-99"), _fake(reports, rank=1, job_id="9-1")]):
        r = planner.lead(7, _with(reports, fake), prev, {}, 110.0 + k, 1e9)
        assert not r.section.stops and {j.job_id for j in r.section.assignments} == jobs, r.section.stops
        assert all(j.node != "fake" for j in r.section.assignments)
        prev = r.section
    assert planner.gangs.ends == {}
    claims = planner.claims.view()
    assert {(c["member"], c["reason"], c["gang"], c["rank"]) for c in claims} == {
        ("fake", "gang_claim_unplanned", gid, 0), ("fake", "gang_claim_unplanned", gid, 1)}
    assert planner.claims.totals == {"gang_claim_unplanned": 3}
    again = planner.lead(7, _with(reports, _fake(reports)), prev, {}, 120.0, 1e9)
    assert not again.section.stops
    assert next(c for c in planner.claims.view() if c["job_id"] == gid)["count"] == 2  # once per plan that saw it


def test_a_fake_claim_that_a_just_assigned_member_ended_is_ignored():
    planner, prev, reports = _placed()
    rank1 = next(r for r in reports.values() if r.gang.rank == 1)
    n2 = next(n for n, r in reports.items() if r is rank1)
    del reports[n2]  # not reported running yet: just assigned
    fake = MemberPlanInput("fake", node("fake9"), (), ended=frozenset({rank1.job_id}))
    members = [*_with(reports, fake), MemberPlanInput(n2, node(n2, power=3000 - int(n2[1:])))]
    r = planner.lead(7, members, prev, {}, 105.0, 1e9)
    assert not r.section.stops and rank1.job_id in {j.job_id for j in r.section.assignments}
    assert planner.claims.totals == {"ended_claimed_elsewhere": 1}


def test_another_nodes_job_id_cannot_move_a_job_in_the_plan():
    planner, prev, reports = _placed()
    r1 = next(r for r in reports.values() if r.gang.rank == 1)
    plain = JobReport(job_id=r1.job_id, template=r1.template, gpus=[0], gpu_fraction=1.0, vram_gib=16.0, term=7)
    fake = MemberPlanInput("fake", node("fake9"), (plain,))
    for members in (_with(reports, fake), [fake, *_with(reports)]):  # whichever report comes first
        r = planner.lead(7, members, prev, {}, 110.0, 1e9)
        assert not r.section.stops
        assert next(j.node for j in r.section.assignments if j.job_id == r1.job_id) != "fake"
    assert planner.claims.totals == {"job_claimed_elsewhere": 2}


def test_a_planned_member_reporting_its_slot_inconsistently_still_ends_the_gang():
    planner, prev, reports = _placed()
    n2, r = next((n, r) for n, r in reports.items() if r.gang.rank == 1)
    reports[n2] = JobReport(job_id=r.job_id, template=r.template, gpus=r.gpus, gpu_fraction=r.gpu_fraction,
                            vram_gib=r.vram_gib, term=7, gang=GangSlot(**{**_slot(r.gang), "size": 4}))
    out = planner.lead(7, _with(reports), prev, {}, 110.0, 1e9)
    assert len(out.section.stops) == 3 and "disagree" in out.section.stops[0].reason
    assert planner.gangs.ends == {"disagree": 1} and not planner.claims.view()


def _slot(g):
    return {f: getattr(g, f) for f in g.__struct_fields__}


def test_without_a_plan_reports_are_adopted_as_before():
    """A new leader whose predecessor died with its plan (it planned without it after the hold) cannot check:
    every report counts, as before (the failover of a running gang)."""
    planner, prev, reports = _placed()
    fresh = Planner(planner.catalog)
    r = fresh.lead(8, _with(reports), None, {}, 100.0, 1e9)
    assert not r.section.stops and len(r.section.assignments) == 3 and not fresh.claims.view()


def test_the_rules_and_the_ledger_bound():
    slot = GangSlot(id="7-1", rank=0, size=2, master="h", master_port=29400, port_base=29400)
    rep = JobReport(job_id="7-1", template="t", term=7, gang=slot)
    planned = PlanJob(job_id="7-1", node="a", template="t", term=7, gang=slot)
    assert claim_refusal(rep, "a", planned) is None
    assert claim_refusal(rep, "b", planned) == "gang_claim_unplanned"
    assert claim_refusal(rep, "a", None) == "gang_claim_unplanned"
    assert claim_refusal(rep, "a", None, has_plan=False) is None
    assert claim_refusal(rep, "a", PlanJob(job_id="7-1", node="a", template="t", term=7)) == "gang_claim_unplanned"
    other = GangSlot(id="7-5", rank=0, size=2, master="h", master_port=29400, port_base=29400)
    assert claim_refusal(rep, "a", PlanJob(job_id="7-1", node="a", template="t", gang=other)) == "gang_claim_unplanned"
    plain = JobReport(job_id="7-1", template="t", term=7)
    assert claim_refusal(plain, "a", None) is None  # a job the plan does not hold: adopted, as before
    assert claim_refusal(plain, "b", planned) == "job_claimed_elsewhere"
    assert ended_refusal("7-1", "b", planned) == "ended_claimed_elsewhere"
    assert ended_refusal("7-1", "a", planned) is None
    ledger = ClaimLedger()
    ledger.note("other", "job_claimed_elsewhere", "7-5", 0.0)
    for i in range(1000):  # one member's flood pushes out only its own older entries
        ledger.note("m", "gang_claim_unplanned", f"7-{i}", float(i + 1), gang="7-1", rank=0)
    assert len(ledger) == MAX_CLAIMS_PER_REASON + 1
    assert ledger.totals == {"gang_claim_unplanned": 1000, "job_claimed_elsewhere": 1}
    assert ledger.view()[0]["job_id"] == "7-999" and ledger.view()[-1]["member"] == "other"
    for i in range(MAX_CLAIM_MEMBERS + 5):  # many members: those seen longest ago go, within the bound
        ledger.note(f"x{i}", "job_claimed_elsewhere", "7-1", 2000.0 + i)
    assert len(ledger.members) == MAX_CLAIM_MEMBERS and "other" not in ledger.members
    assert len(ledger) <= MAX_SUSPICIOUS_CLAIMS


def test_a_job_id_of_the_leaders_term_it_never_issued_is_ignored_and_does_not_raise_its_sequence():
    """Issue 37's review: a fake reporting ``7-(2^53-1)`` while 7 leads would raise the job sequence to it; ids of
    the current term above what the leader issued are ignored and counted (``job_unissued``)."""
    planner, prev, reports = _placed()
    seq = planner.state.job_seq
    plain = JobReport(job_id=f"7-{2**53 - 1}", template="ddp", term=7)
    fake = MemberPlanInput("fake", node("fake9", power=1), (plain,))
    r = planner.lead(7, _with(reports, fake), prev, {}, 110.0, 1e9)
    assert planner.state.job_seq == seq and planner.claims.totals == {"job_unissued": 1}
    assert {c["job_id"] for c in planner.claims.view()} == {f"7-{2**53 - 1}"}
    assert f"7-{2**53 - 1}" not in {j.job_id for j in r.section.assignments}
    assert claim_refusal(plain, "a", None, True, (7, 5)) == "job_unissued"
    assert claim_refusal(plain, "a", None, True, (8, 5)) is None  # another term's id: adopted as before
    assert claim_refusal(plain, "a", None, False, (7, 5)) is None  # no plan: nothing to check
    # a leader restarted within its term (its sequence lost) takes the carried plan's ids of the term as issued
    again = Planner(planner.catalog)
    assert again._issued(7, prev) == (7, max(j.plan_id.seq for j in prev.assignments))
