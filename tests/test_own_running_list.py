"""Issue 39 item 1: this node's running list is built once (:meth:`p2pnode.node.LocalJob.report`). The list its
snapshot publishes and the leader's view of its own node (:meth:`p2pnode.node._lead.Leading.running_of`) are the
same entries, with one ``started_at``: the runner's wall-clock start (for a re-adopted job, its ledger's, not when
this run found it); the job table's record keeps that same start (``started_wall``)."""

from __future__ import annotations

import time

from test_http import demo_agent

from p2pnode.jobs._runner import RunningProcess


async def test_the_snapshots_running_list_and_the_leaders_own_view_agree_on_started_at(tmp_path):
    a = demo_agent(tmp_path)
    jc = a.jobs
    t = next(iter(jc.catalog.templates.values()))
    wall_start = time.time() - 3600.0  # started an hour ago (the ledger's start) ...
    now = jc.ctx.now()
    # ... and re-adopted by this run just now: its monotonic start is the re-adoption, not the start
    jc.runner.jobs["1-7"] = RunningProcess("1-7", t, 1, (0,), 0.5, 8.0, wall_start, now, adopted=True)
    jc.runner.jobs["1-8"] = RunningProcess("1-8", t, 1, (), 1.0, 0.0, wall_start + 60.0, now - 5.0)

    published = {r.job_id: r for r in jc.section().running}
    assert {k: r.started_at for k, r in published.items()} == {"1-7": wall_start, "1-8": wall_start + 60.0}

    inp = jc.inputs()
    me = next(m for m in inp.members if m.origin == jc.ctx.node_id)
    out: list = []
    own = {r.job_id: r for r in jc.core.running_of(inp, me, out)}
    assert own == published and not out  # the same entries, field by field (config, pid, gang included)

    jc.core.step(inp, now)  # the table learns of both (found running: adopted)
    assert {k: jc.core.table.get(k).started_wall for k in published} == {k: r.started_at for k, r in
                                                                          published.items()}
