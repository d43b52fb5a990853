"""Goodput on the surfaces (issue 41, item 6): a training run and stopped on an in-process agent shows in ``/jobs``
``goodput`` and in the ``p2pnode_training_*`` / ``p2pnode_checkpoint_fetch_*`` series of ``/metrics``
(httpx.ASGITransport, no sockets); label values only from the node's catalog."""

import re
from pathlib import Path

import httpx
import trio

from p2pnode.agent import Agent
from p2pnode.config import load_config
from p2pnode.http import create_app
from p2pnode.snapshot import PlanJob

CATALOG = """
[[job]]
name = "play"
kind = "selfplay"
config = "c1"
argv = ["true"]
env = ["PATH"]

[[job]]
name = "train"
kind = "training"
config = "c2"
argv = ["sleep", "60"]
env = ["PATH"]

[[job]]
name = "train3"
kind = "training"
config = "c3"
argv = ["true"]
env = ["PATH"]
"""


def _samples(text: str, name: str) -> dict[str, float]:
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf'^{name}{{\w+="([^"]*)"}} (\S+)$', text, re.M)}


async def test_goodput_on_jobs_and_metrics(tmp_path: Path) -> None:
    (tmp_path / "catalog.toml").write_text(CATALOG)
    a = Agent(load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0, "catalog": str(tmp_path / "catalog.toml")},
        "discovery": {"mdns": False}}))
    a.sample()
    a.publish()
    jc = a.jobs
    async with trio.open_nursery() as n:
        await n.start(jc.runner.run)
        j = PlanJob(job_id="1-1", node=jc.ctx.node_id, template="train")
        assert jc.admit(j)
        jc.start(j, 1)
        with trio.fail_after(20):
            while jc.core.table.state("1-1") != "running":
                jc.step()
                await trio.sleep(0.05)
        assert jc.operator.stop_job("1-1")
        jc.step()  # the operator's stop is an intent the stop rules carry out at the driver's next step
        with trio.fail_after(20):
            while "1-1" in jc.runner.jobs or jc.core.table.state("1-1") != "ended":
                await trio.sleep(0.05)
                jc.step()
        n.cancel_scope.cancel()
    app = create_app(a.surfaces, a.metrics_registry)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as c:
        jobs = (await c.get("/jobs")).json()
        text = (await c.get("/metrics")).text
    g = jobs["goodput"]
    assert list(g) == ["c2"]  # selfplay is no training; c3 never ran
    c2 = g["c2"]
    # an operator's stop with no checkpoint held by a replica: all of the run is lost (not yet settled)
    assert c2["runs"] == 1 and c2["interrupted"] == {"operator": 1} and c2["run_s"] > 0
    assert c2["lost_s"] == c2["run_s"] == c2["lost_unsettled_s"] and c2["goodput"] == 0.0
    assert c2["fetch_s"] == 0.0
    run = _samples(text, "p2pnode_training_seconds_total")
    assert set(run) == {"c2", "c3"} and run["c2"] > 0 and run["c3"] == 0  # every training config from 0
    assert _samples(text, "p2pnode_training_lost_seconds_total") == {"c2": 0.0, "c3": 0.0}  # settled part only
    assert _samples(text, "p2pnode_checkpoint_fetch_seconds_total") == {"c2": 0.0, "c3": 0.0}
    assert _samples(text, "p2pnode_training_goodput_ratio") == {"c2": 0.0}


def test_jobs_screen_shows_goodput() -> None:
    import io

    from rich.console import Console

    from p2pnode.cli._jobs import _jobs_renderable

    data = {"leader": "n1", "term": 1, "offer": 0, "goodput": {
        "c2": {"run_s": 90.0, "lost_s": 30.0, "fetch_s": 10.0, "lost_unsettled_s": 30.0, "runs": 2,
               "checkpoints": 3, "interrupted": {"drain": 1}, "goodput": 0.6}}}
    out = io.StringIO()
    Console(file=out, width=200).print(_jobs_renderable(data))
    text = out.getvalue()
    assert "goodput of trainings on this node" in text
    row = next(line for line in text.splitlines() if "c2" in line)
    assert all(x in row for x in ("90.0s", "30.0s*", "10.0s", "drain 1", "60.0%")), row
