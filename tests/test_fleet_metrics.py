"""Fleet metrics (issue 27, item 5): the leader's queue per kind, jobs completed and failed per kind, Elo velocity per
config, on ``/metrics`` of an in-process agent (httpx.ASGITransport, no sockets), and the fleet alert rules
against the names the agent exports."""

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import msgspec
import pytest
import trio

from p2pnode.agent import Agent
from p2pnode.config import load_config
from p2pnode.http import create_app, make_registry
from p2pnode.http._metrics import queue_by_kind
from p2pnode.jobs import JobControlSurface
from p2pnode.scheduler import load_catalog
from p2pnode.snapshot import GangSlot, PlanJob, PlanPending, PlanSection

ROOT = Path(__file__).parent.parent

CATALOG = """
[[job]]
name = "play"
kind = "selfplay"
config = "c1"
argv = ["true"]
env = ["PATH"]
max_concurrency = 4

[[job]]
name = "check"
kind = "evaluation"
config = "c1"
argv = ["false"]
env = ["PATH"]
max_concurrency = 2

[[job]]
name = "idle"
kind = "evaluation"
config = "c1"
argv = ["sleep", "60"]
env = ["PATH"]
max_concurrency = 2

[[job]]
name = "train"
kind = "training"
config = "c2"
argv = ["true"]
env = ["PATH"]

[[job]]
name = "pair"
kind = "training"
config = "c2"
argv = ["true"]
env = ["PATH"]
max_concurrency = 3

[job.gang]
members = 2
"""


def _catalog(tmp_path: Path) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG)
    return path


def _slot(gid: str, rank: int) -> GangSlot:
    return GangSlot(id=gid, rank=rank, size=2, master="n1", master_port=29400, port_base=29400, ports=64)


def _plan() -> PlanSection:
    """A leader's plan: ``play`` runs twice and waits for two more; one ``pair`` gang (2 members) runs and two more
    wait; a one-off run of ``check`` waits; ``train`` waits because its config trains elsewhere (not counted);
    a template the catalog lacks waits (no kind: not counted)."""
    gang = [PlanJob(job_id=f"1-{i}", node=f"n{i}", template="pair", gang=_slot("g1", i)) for i in range(2)]
    return PlanSection(
        term=1, seq=3,
        assignments=[PlanJob(job_id="1-5", node="n1", template="play"),
                     PlanJob(job_id="1-6", node="n2", template="play"), *gang],
        pending=[PlanPending(template="play", reason="GPU offers used", wait_s=40.0),
                 PlanPending(template="pair", reason="unsatisfiable: 2 members, 1 node", wait_s=300.5),
                 PlanPending(template="check (run r1)", reason="GPU offers used", wait_s=90.0, of="check"),
                 PlanPending(template="train", reason="a training job for c2 already runs on n3", wait_s=999.0),
                 PlanPending(template="gone", reason="unsatisfiable: not in the catalog", wait_s=5000.0)],
    )


def test_queue_by_kind_counts_jobs_still_wanted(tmp_path):
    templates = load_catalog(_catalog(tmp_path)).templates
    assert queue_by_kind(_plan(), templates) == {
        "selfplay": (2, 40.0),  # max_concurrency 4, 2 placed
        "training": (4, 300.5),  # pair: 3 gangs wanted, 1 placed, 2 members each; train left out
        "evaluation": (1, 90.0),  # the one-off run
    }
    assert queue_by_kind(PlanSection(term=1), templates) == {k: (0, 0.0) for k in ("selfplay", "training",
                                                                                     "evaluation")}


class _Leading(JobControlSurface):
    """The agent's real jobs surface, leading ``plan`` (the election is not what this test is about)."""

    def __init__(self, jobs, plan: PlanSection) -> None:
        super().__init__(jobs)
        self._plan = plan

    @property
    def led_plan(self) -> PlanSection | None:
        return self._plan


def _samples(text: str, name: str) -> dict[str, float]:
    """``{label value: value}`` of the one-label samples of ``name`` in an exposition."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf'^{name}{{\w+="([^"]*)"}} (\S+)$', text, re.M)}


async def _run_to_end(jc, job_id: str, template: str, *, stop: bool = False) -> None:
    j = PlanJob(job_id=job_id, node=jc.ctx.node_id, template=template)
    assert jc.admit(j)
    jc.start(j, 1)
    if stop:
        assert jc.operator.stop_job(job_id)
        jc.step()  # the operator's stop is an intent the stop rules carry out at the driver's next step
    with trio.fail_after(20):
        while job_id in jc.runner.jobs:
            await trio.sleep(0.05)


async def test_fleet_metrics_on_metrics(tmp_path):
    a = Agent(load_config(None, env={}, overrides={
        "agent": {"data_dir": tmp_path / "d", "port": 0, "catalog": str(_catalog(tmp_path))},
        "discovery": {"mdns": False}}))
    a.sample()
    a.publish()
    jc = a.jobs
    async with trio.open_nursery() as n:
        await n.start(jc.runner.run)
        await _run_to_end(jc, "j1", "play")  # exit 0: completed
        await _run_to_end(jc, "j2", "play")
        await _run_to_end(jc, "j3", "check")  # exit 1: failed
        await _run_to_end(jc, "j4", "idle", stop=True)  # stopped: neither
        n.cancel_scope.cancel()
    leading = msgspec.structs.replace(a.surfaces, jobs=_Leading(jc, _plan()))
    apps = {"follower": create_app(a.surfaces, a.metrics_registry),
            "leader": create_app(leading, make_registry(leading))}
    texts = {}
    for role, app in apps.items():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://node") as c:
            if role == "follower":
                r = await c.post("/signals", json=[{"config": "c1", "elo_velocity": 12.5},
                                                   {"config": "c2", "elo_velocity": -3, "quality": 0.7}])
                assert r.status_code == 200
                a.publish()
            texts[role] = (await c.get("/metrics")).text
    follower, leader = texts["follower"], texts["leader"]
    # Every node: its own jobs by kind (every kind of the catalog, from 0), Elo velocity per config.
    for text in (follower, leader):
        assert _samples(text, "p2pnode_jobs_completed_total") == {"evaluation": 0, "selfplay": 2, "training": 0}
        assert _samples(text, "p2pnode_jobs_failed_total") == {"evaluation": 1, "selfplay": 0, "training": 0}
        assert _samples(text, "p2pnode_elo_velocity") == {"c1": 12.5, "c2": -3.0}
    assert "Elo points per day" in follower and "rate(p2pnode_jobs_completed_total[1h]) * 3600" in follower
    # The leader only: the queue per kind; a follower exports no queue series at all.
    assert "p2pnode_queue_depth{" not in follower and "p2pnode_queue_longest_wait_seconds{" not in follower
    assert _samples(leader, "p2pnode_queue_depth") == {"evaluation": 1, "selfplay": 2, "training": 4}
    assert _samples(leader, "p2pnode_queue_longest_wait_seconds") == {"evaluation": 90.0, "selfplay": 40.0,
                                                                      "training": 300.5}
    # Every p2pnode_* name in the fleet alerts is exported (scaling counters: declared, samples once counted).
    rules = (ROOT / "deploy" / "prometheus" / "alerts.yml").read_text().split("- name: p2pnode-fleet", 1)[1]
    names = set(re.findall(r"\b(p2pnode_\w+)", rules))
    assert {"p2pnode_queue_depth", "p2pnode_provider_failures_total", "p2pnode_scaling_actions_total"} <= names
    assert all(re.search(rf"^# TYPE {n} ", leader, re.M) for n in names), names
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) not installed: exposition lint not run")
    for text in (follower, leader):
        r = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True)
        assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    """Each rule of ``deploy/prometheus/alerts.yml`` has, in ``alerts_test.yml`` (run by ``promtool test rules`` in
    tests/test_docs.py), an evaluation expecting it to fire and one expecting it not to."""
    prom = ROOT / "deploy" / "prometheus"
    alerts = re.findall(r"^\s*- alert: (\w+)$", (prom / "alerts.yml").read_text(), re.M)
    cases = re.findall(r"alertname: (\w+)(?:,\s*|\n\s*)exp_alerts:(\s*\[\]|\s*\n\s*- exp_labels)",
                       (prom / "alerts_test.yml").read_text())
    fires = {name for name, exp in cases if "exp_labels" in exp}
    quiet = {name for name, exp in cases if "[]" in exp}
    assert len(alerts) >= 12 and fires == quiet == set(alerts), (set(alerts) - fires, set(alerts) - quiet)
