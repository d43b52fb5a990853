"""A noticed node in the leader's plan (issue 41, item 3): a member whose snapshot carries an interruption notice
(``jobs.notice_deadline_ms``, :attr:`p2pnode.node.MemberJobs.noticed`) is treated like a cordoned one: no new work
goes there, its running training is not placed a second time while it runs (one training per config), and once
it stopped there the training is placed on another node. The pure :class:`p2pnode.node.JobCore` in virtual time."""

from __future__ import annotations

import msgspec
from test_job_core import core, drive, inputs, lead, member, of, report

from p2pnode.node import PublishPlan


def _noticed(m):
    return msgspec.structs.replace(m, noticed=True)


def test_a_noticed_node_gets_no_new_work_and_its_training_moves_once_it_stopped():
    c = core("a", settle_s=0.0)
    b_running = _noticed(member("b", running=[report("1-1", "train"), report("1-2", "sp", gpus=(1,))]))
    ms = [member("a"), b_running]
    (pub,) = of(drive(c, inputs(lead("a"), ms), 0.0), PublishPlan)
    by_node: dict[str, list] = {}
    for j in pub.section.assignments:
        by_node.setdefault(j.node, []).append(j)
    trains = [j for j in pub.section.assignments if j.template == "train"]
    assert [(j.job_id, j.node) for j in trains] == [("1-1", "b")]  # kept where it runs: never two at once
    assert {j.job_id for j in by_node.get("b", [])} <= {"1-1", "1-2"}  # nothing new on the noticed node
    # the node stopped its training (the notice rule): it reports it no longer; the training goes to "a"
    # (a's GPUs hold the selfplay just assigned there until they start or their grace passes)
    b_stopped = _noticed(member("b", running=[report("1-2", "sp", gpus=(1,))]))
    placed = []
    for t in range(10, 120, 5):
        for pub in of(drive(c, inputs(lead("a"), [member("a"), b_stopped]), float(t)), PublishPlan):
            trains = [j for j in pub.section.assignments if j.template == "train"]
            assert len(trains) <= 1 and all(j.node != "b" or j.job_id == "1-2" for j in pub.section.assignments)
            placed += [(j.job_id, j.node) for j in trains]
    assert placed and placed[0][0] != "1-1" and {n for _, n in placed} == {"a"}


def test_without_the_notice_the_same_node_takes_new_work():
    c = core("a", settle_s=0.0)
    (pub,) = of(drive(c, inputs(lead("a"), [member("a", offer=0), member("b")]), 0.0), PublishPlan)
    assert any(j.node == "b" for j in pub.section.assignments)
