"""Interruption notices (issue 41, item 3): the pure core (:class:`p2pnode.node._notice.InterruptionNotice`) in
virtual time, the ``notice`` stop rule, and hostile probe outputs through the real driver
(:class:`p2pnode.jobs._noticeprobe.NoticeProbe`, real processes: local scripts, no network): each counted by
reason, none read as a notice, none crashing."""

from __future__ import annotations

import math
import os
import sys
from types import SimpleNamespace

import pytest
import trio

from p2pnode.config import AgentConfig, Config
from p2pnode.jobs._noticeprobe import NoticeProbe
from p2pnode.node import StopJob
from p2pnode.node._notice import MAX_PROBE_BYTES, InterruptionNotice, Notice
from p2pnode.node._stoprules import RuleInputs, RuleJob, StopRules


# -- the core --------------------------------------------------------------------------------------------------------
def test_a_notice_is_held_with_the_earliest_deadline_and_withdrawn_by_the_probe() -> None:
    n = InterruptionNotice(interval_s=5.0)
    assert n.next_deadline() == -math.inf and n.at == math.inf
    assert not n.probed(b'{"notice": false}\n', 0.0, 1000.0)
    assert n.next_deadline() == 5.0 and n.notice is None
    assert n.probed(b' {"notice": true, "deadline_s": 120, "reason": "spot"} ', 5.0, 1005.0)
    assert n.notice == Notice(125.0, 1125.0, "spot") and n.at == 125.0
    assert not n.probed(b'{"notice": true, "deadline_s": 120, "reason": "spot"}', 10.0, 1010.0)  # not moved back
    assert n.at == 125.0
    assert n.probed(b'{"notice": true, "deadline_s": 30}', 15.0, 1015.0)  # earlier: it stands
    assert n.notice == Notice(45.0, 1045.0, "interruption")
    assert not n.failed("timeout", 20.0) and n.at == 45.0  # a failing run changes nothing
    assert n.probed(b'{"notice": false, "extra": [1, 2]}', 25.0, 1025.0) and n.notice is None
    assert n.counts == {"ok": 2, "notice": 3, "failed": 0, "timeout": 1, "too_long": 0, "malformed": 0}


@pytest.mark.parametrize("out", [
    b"", b"   \n", b"\xff\xfe\x00binary", b'{"notice": true, "deadline_s": NaN}', b'{"notice": true}',
    b'{"notice": true, "deadline_s": -1}', b'{"notice": true, "deadline_s": 1e999}',
    b'{"notice": true, "deadline_s": 86401}', b'{"notice": true, "deadline_s": 5, "reason": "a\\u0007b"}',
    b'{"notice": true, "deadline_s": 5, "reason": "' + b"x" * 65 + b'"}', b'{"notice": true, "deadline_s": 5}{}',
    b'notice 120 spot', b'[true, 120]', b'{"notice": "yes", "deadline_s": 5}', b'{"notice": 1, "deadline_s": 5}',
])
def test_garbled_output_is_counted_malformed_never_a_notice(out: bytes) -> None:
    n = InterruptionNotice(interval_s=5.0)
    assert not n.probed(out, 0.0, 0.0)
    assert n.notice is None and n.counts["malformed"] == 1 and n.next_deadline() == 5.0


def test_output_over_4_kib_is_too_long() -> None:
    n = InterruptionNotice(5.0)
    pad = b" " * MAX_PROBE_BYTES
    assert not n.probed(b'{"notice": true, "deadline_s": 5}' + pad, 0.0, 0.0)
    assert n.notice is None and n.counts["too_long"] == 1


# -- the notice stop rule ------------------------------------------------------------------------------------------
def test_a_notice_stops_the_fenced_jobs_once_and_lets_the_rest_run() -> None:
    r = StopRules()
    jobs = (RuleJob("t1", "train", "training", fenced=True), RuleJob("s1", "sp", "selfplay", preemptible=True))
    assert r.step(RuleInputs(jobs), 0.0) == []
    got = r.step(RuleInputs(jobs, notice_at=100.0, notice_reason="spot"), 10.0)
    assert got == [StopJob("t1", "interruption notice (spot): node gone in 90 s", "notice")]
    assert r.step(RuleInputs(jobs, notice_at=100.0), 11.0) == []  # asked once
    assert r.counts["notice"] == 1


# -- hostile probes through the real driver ------------------------------------------------------------------------
def _probe(tmp_path, body: str, *, timeout_s: float = 20.0) -> NoticeProbe:
    script = tmp_path / "probe.py"
    script.write_text(body)
    cfg = Config(agent=AgentConfig(interruption_probe=f"{sys.executable} {script}", interruption_probe_interval_s=30,
                                   interruption_probe_timeout_s=timeout_s))
    return NoticeProbe(SimpleNamespace(config=cfg, now=trio.current_time, publish_soon=lambda: None))


HOSTILE = {
    "huge": ("import sys\nsys.stdout.write('{' * 10_000_000)\n", "too_long"),
    "binary": ("import sys\nsys.stdout.buffer.write(bytes(range(256)))\n", "malformed"),
    "nan": ("print('{\"notice\": true, \"deadline_s\": NaN}')\n", "malformed"),
    "negative": ("print('{\"notice\": true, \"deadline_s\": -5}')\n", "malformed"),
    "control": ("print('{\"notice\": true, \"deadline_s\": 5, \"reason\": \"a\\\\u001b[2Jb\"}')\n", "malformed"),
    "exit": ("import sys\nprint('{\"notice\": true, \"deadline_s\": 5}')\nsys.exit(3)\n", "failed"),
    "hang": ("import time\nprint('{\"notice\": true, \"deadline_s\": 5}', flush=True)\ntime.sleep(60)\n", "timeout"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_probe_outputs_are_counted_not_read(tmp_path, name: str) -> None:
    body, reason = HOSTILE[name]
    p = _probe(tmp_path, body, timeout_s=0.5 if name == "hang" else 20.0)
    assert not await p.probe_once()
    assert p.core.notice is None and p.section_fields() == {}
    assert p.core.counts[reason] == 1 and sum(p.core.counts.values()) == 1


async def test_the_probe_gets_no_p2pnode_variable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("P2PNODE_CLUSTER_TOKEN", "secret")
    monkeypatch.setenv("PROBE_OK", "1")
    p = _probe(tmp_path, "import json, os\nleak = [k for k in os.environ if k.startswith('P2PNODE_')]\n"
                         "print(json.dumps({'notice': bool(leak) or os.environ.get('PROBE_OK') != '1', "
                         "'deadline_s': 1}))\n")
    assert not await p.probe_once()
    assert p.core.counts["ok"] == 1 and os.environ["P2PNODE_CLUSTER_TOKEN"] == "secret"


async def test_a_notice_is_published_in_the_jobs_section_fields(tmp_path) -> None:
    p = _probe(tmp_path, "print('{\"notice\": true, \"deadline_s\": 120, \"reason\": \"aws spot\"}')\n")
    assert await p.probe_once()
    f = p.section_fields()
    assert f["notice_reason"] == "aws spot" and f["notice_deadline_ms"] > 0


def test_the_notice_fields_are_bounded_and_older_agents_decode_around_them() -> None:
    import msgspec

    from p2pnode.snapshot import JobsSection

    class OldJobs(msgspec.Struct):  # a jobs section as an agent before the notice decodes it
        offer: int = 0

    sec = JobsSection(offer=2, notice_deadline_ms=1_800_000_000_000, notice_reason="aws spot")
    wire = msgspec.msgpack.encode(sec)
    assert msgspec.msgpack.decode(wire, type=OldJobs).offer == 2
    assert msgspec.msgpack.decode(wire, type=JobsSection) == sec
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(JobsSection()), type=JobsSection).notice_deadline_ms is None
    for bad in ({"notice_reason": "x" * 65}, {"notice_reason": "a\nb"}, {"notice_deadline_ms": -1}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, JobsSection)
