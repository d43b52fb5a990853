"""The fuzz driver: generated snapshots, signed, through a real in-process agent and every consumer.

For each case (:func:`fuzz.strategies.gen_case` then :func:`fuzz.strategies.gen_snapshot`):

1. sign it (:class:`CaseMaker`): a throwaway identity, a member already held (next version), the fuzz leader
   (a vote and a plan of a high term), the receiver's own key, another key claiming the receiver's id, or an
   envelope whose origin/version differ from the signed body;
2. push it as a gossip message into a real :class:`p2pnode.agent.Agent` built with the demo catalog and fake
   GPUs (the gossip driver's decisions, run in-line: ``agent.gossiper.verify_request`` then ``finish_request``:
   decode into the typed :class:`p2pnode.snapshot.Snapshot`, verify, install, and the node core's membership
   through ``on_accepted``), on a ``MockClock`` that jumps between cases (members turn suspect, dead, reaped);
3. drive every consumer of every section: ``agent.reconcile`` (the node core: membership timeouts, refutation,
   voter roll, election from ``vote``, ``tags`` and ``resources.gpus``) and ``core.next_deadline``;
   ``agent.publish`` (our own snapshot must still pass the decoder); ``jobs.capacity.sample`` (the offers'
   inputs); the job core's ``plan_now(term)`` (the planner over every member's ``resources``, ``jobs`` and
   ``guard`` sections);
   ``jobs.step`` (plan adoption and fencing by ``core.acting_plan``; with the fuzz leader forced as the leader of
   its term when it signed the case, and its plan carried over by this node leading the next term; job starts
   render the argv but spawn nothing); the signals merge (``jobs.newest_signals`` over every ``jobs.signals``, and a
   signal accepted here stamped above the Lamport clocks peers claim); sync (receipt index, stale receipt lists, the
   replicated predicate, a peer's data channel, our section); and every view (``/status``, ``/members``,
   ``/events``, ``/guard``, ``/jobs``, ``/plan``, ``/sync/status``, ``/metrics``) encoded as the routes do (msgspec)
   and checked for NaN and infinities (``json.dumps(allow_nan=False)``: msgspec would write them as ``null``).

A decoder rejection is fine (counted by reason). Any exception in a consumer is a crash: a decoder gap or a
consumer bug; it is recorded with the snapshot, which :meth:`Fuzzer.minimize` shrinks on a fresh agent.
Quarantines (``agent.state.quarantines``) and ERROR log records that mean "a peer broke us" (our own snapshot
not published) are failures too.

The agent is rebuilt every ``epoch_cases`` cases (a fresh data dir, open or token mode, tags cycling among
none, voter, durable+ephemeral), so state accumulates within an epoch but stays small enough to be fast.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import shutil
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import trio
import trio.testing
from prometheus_client import generate_latest

from p2pnode.agent import Agent
from p2pnode.config import load_config
from p2pnode.election import TERM_CEILING
from p2pnode.errors import RejectedMessage
from p2pnode.http import _views as views
from p2pnode.http._app import _view
from p2pnode.identity import Identity, endorsement_for
from p2pnode.jobs._runner import RunningProcess
from p2pnode.node._engines import engine_command
from p2pnode.scheduler._signals import CLOCK_MAX
from p2pnode.snapshot import COUNTER_MAX
from p2pnode.wire import Envelope, encode_gossip

from .strategies import Context, Draw, RandomDraw, gen_case, gen_snapshot

ROOT = Path(__file__).resolve().parents[2]
DEMO_CATALOG = ROOT / "deploy" / "examples" / "demo" / "catalog.toml"
TOKEN = "fuzz-token-0123456789"
FAKE_GPUS = "H100,RTX 4090"
U64 = 2**64 - 1
I64_MIN = -(2**63)
POOL = 10
"""Fuzz identities kept per epoch (re-used as existing members: their next versions)."""
METRICS_EVERY = 8
SIGNALS_EVERY = 5
"""Every N cases this node accepts a signal (its Lamport clock is one above the highest a peer claims)."""
EXPECTED_ERRORS = ("cannot start %s: %s",)
"""ERROR log templates that are a handled refusal of a peer's bad plan, not a failure."""
FAILURE_LOG_MARKERS = ("not published", "fails the typed decoder", "quarantined", "fails its bounds")

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Crash:
    case_no: int
    consumer: str
    error: str
    stack: str
    signer: str
    snapshot: dict[str, Any]
    minimal: dict[str, Any] | None = None
    reproduces_alone: bool | None = None

    def report(self) -> str:
        snap = self.minimal if self.minimal is not None else self.snapshot
        what = {True: "minimal snapshot (reproduces alone on a fresh agent)",
                False: "snapshot (does NOT reproduce alone: depends on earlier cases)",
                None: "snapshot (not minimized)"}[self.reproduces_alone]
        return (f"CRASH case {self.case_no} in {self.consumer} (signer {self.signer}): {self.error}\n"
                f"{what}:\n  {_short(snap)}\n{self.stack}")


def _short(obj: Any, limit: int = 4000) -> str:
    s = repr(obj)
    return s if len(s) <= limit else s[:limit] + f"... ({len(s)} chars)"


@dataclasses.dataclass
class Stats:
    cases: int = 0
    accepted: int = 0
    unencodable: int = 0
    rejected: Counter = dataclasses.field(default_factory=Counter)
    crashes: list[Crash] = dataclasses.field(default_factory=list)
    crash_kinds: Counter = dataclasses.field(default_factory=Counter)
    quarantines: int = 0
    log_failures: Counter = dataclasses.field(default_factory=Counter)
    log_errors: Counter = dataclasses.field(default_factory=Counter)
    plans_acted: int = 0
    plans_carried: int = 0
    parts_accepted: int = 0
    signals_accepted: int = 0
    starts: int = 0
    epochs: int = 0
    seconds: float = 0.0

    @property
    def failures(self) -> int:
        return len(self.crashes) + self.quarantines + sum(self.log_failures.values())

    def summary(self) -> str:
        rate = self.cases / self.seconds if self.seconds else 0.0
        lines = [
            f"cases {self.cases} in {self.seconds:.1f} s ({rate:.0f}/s), {self.epochs} agent epochs",
            f"accepted {self.accepted}, unencodable (never sent) {self.unencodable}",
            "rejected by reason: " + (", ".join(f"{k} {v}" for k, v in sorted(self.rejected.items())) or "none"),
            f"plans acted on (fuzz leader) {self.plans_acted} (parts accepted {self.parts_accepted}), carried over "
            f"{self.plans_carried}, "
            f"job starts (rendered, not spawned) {self.starts}, signals accepted here {self.signals_accepted}",
            f"crashes {len(self.crashes)}" + (f" ({dict(self.crash_kinds)})" if self.crash_kinds else ""),
            f"quarantines {self.quarantines}",
            "failure log records: " + (", ".join(f"{k!r} {v}" for k, v in self.log_failures.items()) or "0"),
            "other ERROR log records: " + (", ".join(f"{k!r} {v}" for k, v in self.log_errors.items()) or "0"),
        ]
        return "\n".join(lines)


class _ErrorLog(logging.Handler):
    """Collects ERROR records of the agent (and every record carrying a traceback)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# -- signing ----------------------------------------------------------------------------------------------------
class CaseMaker:
    """Resolves a case's signer against the receiver and signs the generated snapshot.

    ``self_identity`` is the receiver's own key (known in-process, and over HTTP when we created its data dir);
    ``held(origin)`` the version the receiver holds (or None); ``token`` endorses keys in token mode.
    """

    def __init__(self, self_identity: Identity, held: Callable[[str], int | None], *, token: str | None,
                 templates: list[str], catalog_digest: str, gpu_count: int,
                 running: Callable[[], list[str]] = lambda: [], configs: list[str] | None = None) -> None:
        self.me = self_identity
        self.held = held
        self.token = token
        self.templates = templates
        self.catalog_digest = catalog_digest
        self.gpu_count = gpu_count
        self.running = running
        self.configs = configs or ["hex8_2p", "square19_2p"]
        self.pool: list[Identity] = []
        self.sent: dict[str, int] = {}
        self.leader = Identity.generate()

    def context(self) -> Context:
        return Context(self_id=self.me.node_id, member_ids=[i.node_id for i in self.pool],
                       leader_id=self.leader.node_id,
                       templates=self.templates, running_job_ids=self.running(), gpu_count=self.gpu_count,
                       catalog_digest=self.catalog_digest, configs=self.configs)

    def _identity(self, signer: str) -> Identity:
        if signer == "self":
            return self.me
        if signer == "leader":
            return self.leader
        if signer == "member" and self.pool:
            return self.pool[len(self.sent) % len(self.pool)]
        ident = Identity.generate()
        self.pool.append(ident)
        if len(self.pool) > POOL:
            self.pool.pop(0)
        return ident

    def make(self, d: Draw) -> tuple[dict[str, Any], dict[str, Any], Envelope | None, Identity]:
        """``(case, snapshot, envelope, signer identity)``; envelope None when the snapshot does not encode."""
        case = gen_case(d)
        signer = case["signer"]
        ident = self._identity(signer)
        origin = self.me.node_id if signer == "forged_self" else ident.node_id
        base = max(self.held(origin) or 0, self.sent.get(origin, 0))
        version = min(U64, max(I64_MIN, base + case["version_step"]))
        leader = signer == "leader"
        snap = gen_snapshot(d, self.context(), origin=origin, version=version,
                            term=case["term"] if leader else None, vote_for=ident.node_id if leader else None)
        case["plan_doc"] = snap.pop("_plan_doc", None)
        env = self.seal(snap, ident, origin, version, mismatch=signer == "mismatch", d=d)
        if env is not None and isinstance(version, int) and 0 <= version:
            self.sent[origin] = max(self.sent.get(origin, 0), version)
        return case, snap, env, ident

    def seal(self, snap: dict[str, Any], ident: Identity, origin: str, version: int, *, mismatch: bool = False,
             d: Draw | None = None) -> Envelope | None:
        try:
            body = msgpack.packb(snap, use_bin_type=True)
        except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
            return None
        if mismatch and d is not None:
            if d.chance(0.5):
                origin = self.me.node_id if d.chance(0.5) else self.leader.node_id
            else:
                version = min(U64, version + 1)
        endorsement = endorsement_for(self.token, ident.public_key) if self.token else None
        return Envelope(origin, version, ident.public_key, body, ident.sign(body), endorsement)


# -- the in-process fuzzer ----------------------------------------------------------------------------------------
class Fuzzer:
    """A real agent (rebuilt every ``epoch_cases``) and the case loop. Call its methods inside ``trio.run``
    with :attr:`clock` as the clock (:func:`run_fuzz` does)."""

    def __init__(self, root: Path, *, epoch_cases: int = 400, clock: trio.testing.MockClock,
                 minimize_crashes: bool = True, max_crashes: int = 20) -> None:
        self.root = Path(root)
        self.epoch_cases = epoch_cases
        self.clock = clock
        self.minimize_crashes = minimize_crashes
        self.max_crashes = max_crashes
        self.stats = Stats()
        self.errlog = _ErrorLog()
        logging.getLogger("p2pnode").addHandler(self.errlog)
        self.agent: Agent | None = None
        self.maker: CaseMaker | None = None
        self._epoch_dir: Path | None = None
        self._since_epoch = 0
        self._sample = None
        self._minimized: set[str] = set()

    # -- agents ----------------------------------------------------------------------------------------------
    def build_agent(self, data_dir: Path, epoch: int) -> Agent:
        trust = "token" if epoch % 4 == 3 else "open"
        tags = [(), ("voter",), ("durable", "ephemeral"), ("voter", "durable")][epoch % 4]
        agent_cfg: dict[str, Any] = {"data_dir": data_dir, "port": 0, "catalog": str(DEMO_CATALOG),
                                     "fake_gpus": FAKE_GPUS, "tags": tags, "trust": trust}
        if trust == "token":
            agent_cfg["cluster_token"] = TOKEN
        cfg = load_config(None, env={}, overrides={
            "agent": agent_cfg,
            "discovery": {"mdns": False, "peers_file": False},
            "gossip": {"profile": "local-test", "reconnect_window_s": 30.0},
            "guard": {"max_spawns_per_minute": 600.0},
        })
        a = Agent(cfg)
        a.addr = "127.0.0.1:1"
        if self._sample is None:  # a sample takes 0.2 s (CPU percent); every agent here has the same fake GPUs
            a.sample()
            # A calm host whatever the machine does meanwhile (other test runs at 100 % CPU would put every epoch's
            # guard at level 4, and no job of a plan would start).
            self._sample = msgspec.structs.replace(a.last_sample, cpu_percent=min(a.last_sample.cpu_percent, 20.0),
                                               load_avg=(0.5, 0.5, 0.5))
        a.last_sample = self._sample
        a.guard.check(a.last_sample)
        a.publish()
        self._harmless_starts(a)
        return a

    def _harmless_starts(self, a: Agent) -> None:
        """Job starts render the argv (the real parameter checks: ``ValueError`` is the runner's refusal) and
        record a fake running job; no process is spawned, stops are no-ops (the runner has no nursery)."""
        runner = a.jobs.runner
        stats = self.stats

        def start(*, job_id, template, params, gpus, gpu_fraction, vram_gib, term, catalog_dir=".", gang=None,
                  python="", own_host="", resume_from=None):
            argv = template.render_argv(params, {"python": sys.executable, "catalog_dir": catalog_dir})
            r = template.resources  # the engine's command from the plan's gang slot: bounded, never a crash
            engine_command(template.engine, argv, python=python or sys.executable, slot=gang, num_gpus=r.num_gpus,
                           num_cpus=r.num_cpus, memory_gib=r.memory_gib, own_host=own_host, ray_member="rm.py")
            runner.jobs[job_id] = RunningProcess(job_id, template, term, gpus, gpu_fraction, vram_gib, time.time(),
                                                 trio.current_time(), None, gang=gang)
            while len(runner.jobs) > 6:
                runner.jobs.pop(next(iter(runner.jobs)))
            stats.starts += 1
            if runner.on_change:
                runner.on_change()

        runner.start = start

    def new_epoch(self) -> None:
        self.close()
        epoch = self.stats.epochs
        self.stats.epochs += 1
        self._epoch_dir = self.root / f"epoch{epoch}"
        self.agent = a = self.build_agent(self._epoch_dir, epoch)
        self.maker = CaseMaker(a.identity, lambda o: (e.version if (e := a.state.get(o)) else None),
                               token=a.trust.primary_token, templates=sorted(a.catalog.templates),
                               catalog_digest=a.catalog.digest, gpu_count=len(a.last_sample.gpus),
                               running=lambda: list(a.jobs.runner.jobs)[:4], configs=sorted(a.catalog.configs))
        self._since_epoch = 0

    def close(self) -> None:
        if self.agent is not None:
            self.stats.quarantines += self.agent.state.quarantines
            self.agent.sampler.gpu_source.close()
            self.agent = None
        if self._epoch_dir is not None:
            shutil.rmtree(self._epoch_dir, ignore_errors=True)
            self._epoch_dir = None

    # -- one case ----------------------------------------------------------------------------------------------
    def run_case(self, d: Draw) -> None:
        if self.agent is None or self._since_epoch >= self.epoch_cases:
            self.new_epoch()
        assert self.agent is not None and self.maker is not None
        self._since_epoch += 1
        self.stats.cases += 1
        case, snap, env, ident = self.maker.make(d)
        if env is None:
            self.stats.unencodable += 1
            return
        self.clock.jump(case["jump_s"])
        snap_copy = copy.deepcopy(snap) if len(self.stats.crashes) < self.max_crashes else {}
        crashes = drive(self.agent, env, case["signer"], self.stats, self.errlog, plan_doc=case.get("plan_doc"),
                        signer_identity=ident)
        for consumer, exc, stack in crashes:
            self.stats.crash_kinds[f"{consumer}: {exc.__class__.__name__}"] += 1
            if len(self.stats.crashes) < self.max_crashes:
                c = Crash(self.stats.cases, consumer, f"{exc.__class__.__name__}: {exc}", stack, case["signer"],
                          snap_copy)
                kind = f"{consumer}: {exc.__class__.__name__}"
                if self.minimize_crashes and kind not in self._minimized:  # the first of each kind only
                    self._minimized.add(kind)
                    self.minimize(c, ident)
                self.stats.crashes.append(c)
            else:
                self.stats.crashes.append(Crash(self.stats.cases, consumer, repr(exc), "", case["signer"], {}))
        if crashes:
            self.new_epoch()  # a crashed consumer may have left the agent half-updated

    # -- minimizing ----------------------------------------------------------------------------------------------
    def _replay(self, snap: dict[str, Any], ident: Identity, signer: str, key_src: Path) -> tuple[str, str] | None:
        """Run ``snap`` alone on a fresh agent with the same node key; the (consumer, exception type) it breaks."""
        d = self.root / "replay"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        shutil.copy(key_src / "node.key", d / "node.key")
        agent = self.build_agent(d, 0 if self.agent is None or self.agent.trust.keyring is None else 3)
        try:
            maker = CaseMaker(agent.identity, lambda o: None, token=agent.trust.primary_token, templates=[],
                              catalog_digest="", gpu_count=2)
            origin = snap.get("origin") if isinstance(snap.get("origin"), str) else ident.node_id
            version = snap.get("version") if isinstance(snap.get("version"), int) else 1
            env = maker.seal(snap, ident, origin, min(U64, max(I64_MIN, version)))
            if env is None:
                return None
            crashes = drive(agent, env, signer, Stats(), _ErrorLog())
            return (crashes[0][0], crashes[0][1].__class__.__name__) if crashes else None
        finally:
            agent.sampler.gpu_source.close()
            shutil.rmtree(d, ignore_errors=True)

    def minimize(self, crash: Crash, ident: Identity, budget: int = 200) -> None:
        """Greedy delta debugging: drop map keys and list items while the same consumer still fails the same way
        on a fresh agent."""
        assert self.agent is not None
        key_src = self.agent.data_dir
        target = (crash.consumer, crash.error.split(":", 1)[0])
        calls = [0]

        def fails(s: dict[str, Any]) -> bool:
            calls[0] += 1
            return self._replay(s, ident, crash.signer, key_src) == target

        snap = copy.deepcopy(crash.snapshot)
        if not fails(snap):
            crash.reproduces_alone = False
            return
        crash.reproduces_alone = True
        needed: set[tuple] = set()  # positions whose removal lost the failure (not tried again)
        changed = True
        while changed and calls[0] < budget:
            changed = False
            for path in sorted(_paths(snap), key=len):  # whole sections first: few replays
                if calls[0] >= budget:
                    break
                if path in needed:
                    continue
                trial = _without(snap, path)
                if trial is not None and fails(trial):
                    snap, changed = trial, True
                    break
                needed.add(path)
        crash.minimal = snap


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every removable position (map key or list index)."""
    out: list[tuple] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
            out.append(prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
            out.append(prefix + (i,))
    return out


def _without(obj: Any, path: tuple) -> Any:
    out = copy.deepcopy(obj)
    cur = out
    try:
        for p in path[:-1]:
            cur = cur[p]
        if isinstance(cur, dict):
            del cur[path[-1]]
        else:
            cur.pop(path[-1])
    except (KeyError, IndexError, TypeError):
        return None
    return out


# -- the consumers ------------------------------------------------------------------------------------------------
def render(obj: Any) -> bytes:
    """What a route answers (``http._app._view``: msgspec's JSON of the view, typed sections included), after
    checking that the view holds no NaN or infinity (``allow_nan=False``; msgspec would write ``null``)."""
    json.dumps(msgspec.to_builtins(obj), allow_nan=False)
    return _view(obj).body


def _finite(x: float) -> float:
    assert isinstance(x, float) and math.isfinite(x), f"not a finite deadline: {x!r}"
    return x


def _fenced(core: Any, jobs: Any, plan: Any) -> None:
    """``jobs.step`` under a leader whose current term is above ``plan``'s: nothing starts, nothing stops."""
    before = set(jobs.runner.jobs)
    jobs.step()
    assert core.acting_plan(plan) is None, f"a plan of term {plan.term} acts under term {core.view.term}"
    assert set(jobs.runner.jobs) == before, "a fenced plan started or stopped jobs"


def _serve_part(agent: Agent, leader: str, ident: Identity, ref: Any, doc: Any, stats: Stats) -> None:
    """The fuzz leader's plan document as this node's signed part, through the checks a fetched part meets
    (:func:`p2pnode.node._plandist.open_part`); an accepted part is installed as the fetcher would."""
    from p2pnode.node._plandist import _PART_CONTEXT, open_part, open_whole

    if isinstance(doc, dict):
        doc = {**doc, "node": agent.node_id}
    try:
        body = msgpack.packb(doc, use_bin_type=True)
    except (TypeError, ValueError, OverflowError, UnicodeEncodeError):
        return
    data = msgpack.packb([body, ident.sign(_PART_CONTEXT + body)], use_bin_type=True)
    m = agent.member(leader)
    if m is None:
        return
    try:
        part = open_part(data, leader_key=m.key, ref=ref, node_id=agent.node_id)
    except RejectedMessage as exc:
        stats.rejected[f"part:{exc.reason.value}"] += 1
        return
    stats.parts_accepted += 1
    from p2pnode.node._plandist import part_version

    jobs = agent.jobs
    jobs.core.fetched(("part", leader), part_version(ref), part)
    version = f"{ref.term}/{ref.seq}/{ref.digest}"
    try:  # the same document as the whole plan a successor carries over (its digest must match the ref)
        whole = open_whole(msgpack.packb({**doc, "node": ""}, use_bin_type=True), ref)
    except RejectedMessage as exc:
        stats.rejected[f"whole:{exc.reason.value}"] += 1
        return
    jobs.core.fetched(("whole", leader), version, whole)


def _clocks_bounded(jobs: Any) -> None:
    bad = {cfg: e.clock for cfg, e in jobs.signals.entries.items() if not 1 <= e.clock <= CLOCK_MAX}
    assert not bad, f"signals stamped outside 1..2^50: {bad}"


def drive(agent: Agent, env: Envelope, signer: str, stats: Stats, errlog: _ErrorLog, *, plan_doc: Any = None,
          signer_identity: Identity | None = None) -> list[tuple[str, Exception, str]]:
    """Push ``env`` into ``agent`` and run every consumer; returns the crashes ``(consumer, exception, stack)``.
    ``plan_doc``: the fuzz leader's plan document (a raw map), served as this node's signed part."""
    crashes: list[tuple[str, Exception, str]] = []
    errlog.records.clear()

    def call(name: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # the point of the fuzzer: every exception in a consumer is a finding
            crashes.append((name, exc, traceback.format_exc()))
            return None

    st = agent.state
    before = Counter(st.rejected)
    body = encode_gossip(env.origin if signer != "forged_self" else "fuzz", "", {}, [env])
    # What GossipDriver.handle runs (in a worker thread, then in trio), in-line: the MockClock stays in charge.
    reply = call("gossip.handle", lambda: agent.gossiper.finish_request(agent.gossiper.verify_request(body),
                                                                         agent.now()))
    if reply is not None and reply.status >= 500:
        crashes.append(("gossip.handle", RuntimeError(f"status {reply.status}"), reply.body.decode(errors="replace")))
    held = st.get(env.origin)
    accepted = held is not None and held.envelope.sig == env.sig
    if accepted:
        stats.accepted += 1
    else:
        diff = st.rejected - before
        if diff:
            stats.rejected[max(diff, key=diff.get).value] += 1
        elif env.origin == agent.node_id:
            stats.rejected["own_origin_seen"] += 1
        else:
            stats.rejected["not_installed"] += 1

    core = agent.core
    call("reconcile", agent.reconcile)
    call("core.next_deadline", lambda: _finite(core.next_deadline(agent.now())))
    call("publish", agent.publish)
    jobs = agent.jobs
    assert jobs is not None
    call("jobs.capacity.sample", jobs.capacity.sample)
    view = core.view
    term = view.term if view.leader == agent.node_id and view.term else max(1, view.highest_term)
    call("jobs.lead", lambda: jobs.apply(jobs.core.plan_now(jobs.inputs(), term, agent.now())))
    call("publish(after lead)", agent.publish)
    call("jobs.step", jobs.step)
    if signer == "leader" and accepted and held.snapshot.plan is not None:
        # The fuzz leader was elected in its plan's term: once re-elected in a later term its plan is fenced off;
        # in the plan's term a follower acts on it (adoption); then this node leads the next term as its
        # successor (its assignments carried over), and shows it.
        plan = held.snapshot.plan
        stats.plans_acted += 1
        el = core.election
        saved = el.view, el.highest_term, dict(core.leaders_by_term), jobs.core.my_plan
        core.leaders_by_term[plan.term] = env.origin
        try:
            if plan.term < COUNTER_MAX:  # the fuzz leader re-elected in a later term: its plan is fenced off
                el.view = msgspec.structs.replace(el.view, leader=env.origin, term=plan.term + 1)
                call("jobs.act(stale plan)", lambda: _fenced(core, jobs, plan))
            el.view = msgspec.structs.replace(el.view, leader=env.origin, term=plan.term)
            el.highest_term = min(el.highest_term, plan.term)
            if plan_doc is not None and signer_identity is not None:
                call("plan part", lambda: _serve_part(agent, env.origin, signer_identity, plan, plan_doc, stats))
            call("jobs.step(fuzz leader)", jobs.step)
            call("GET /plan(fuzz leader)", lambda: render({"leader": core.view.leader, "term": core.view.term,
                                                           "plan": jobs.leading.newest_plan()}))
            if jobs.leading.newest_plan() is plan:
                stats.plans_carried += 1
            succ = max(1, min(plan.term + 1, TERM_CEILING))
            el.view = msgspec.structs.replace(el.view, leader=agent.node_id, term=succ)
            call("jobs.lead(after the fuzz leader)",
                 lambda: jobs.apply(jobs.core.plan_now(jobs.inputs(), succ, agent.now())))
            call("publish(after the fuzz leader)", agent.publish)
            call("jobs.step(successor)", jobs.step)
        finally:
            el.view, el.highest_term = saved[0], saved[1]
            core.leaders_by_term.clear()
            core.leaders_by_term.update(saved[2])
            jobs.core.my_plan = saved[3]
    call("jobs.newest_signals", jobs.newest_signals)
    if stats.cases % SIGNALS_EVERY == 0:
        configs = sorted(jobs.catalog.configs)
        cfg = configs[stats.cases // SIGNALS_EVERY % len(configs)]
        if call("jobs.accept_signals", lambda: jobs.accept_signals({"config": cfg, "quality": 0.5})) is not None:
            stats.signals_accepted += 1
        call("signals stamped", lambda: _clocks_bounded(jobs))
        call("publish(after signals)", agent.publish)
    sync = agent.sync
    index = call("sync.receipt_index", sync.receipt_index)
    if index is not None:
        call("sync.stale_receipt_lists", lambda: sync.replication.stale_receipt_lists(index[2]))
    call("sync.replicated_predicate", lambda: sync.replicated_predicate()("data/x"))
    call("sync.section", sync.section)
    if sync.pusher is not None and held is not None:
        call("sync.channel_of", lambda: sync.pusher.blocks.channel_of(env.origin, "127.0.0.1:1"))
    surfaces = agent.surfaces
    call("GET /status", lambda: render(views.status_view(surfaces)))
    call("GET /members", lambda: render({"members": views.members_view(surfaces)}))
    call("GET /events", lambda: render(views.events_view(surfaces)))
    call("GET /guard", lambda: render(agent.guard.view()))
    call("GET /jobs", lambda: render(views.jobs_view(surfaces, surfaces.jobs,
                                                     jobs.leading.plan_doc(jobs.leading.newest_plan()))))
    call("GET /plan", lambda: render({"leader": core.view.leader, "term": core.view.term,
                                      "plan": jobs.leading.newest_plan()}))
    call("GET /sync/status", lambda: render(sync.status_view()))
    if stats.cases % METRICS_EVERY == 0:  # Prometheus text is slow to build; the HTTP phase reads it every batch
        call("GET /metrics", lambda: generate_latest(agent.metrics_registry))
    for r in errlog.records:
        msg = r.getMessage()
        if any(m in msg for m in FAILURE_LOG_MARKERS) or r.exc_info:
            stats.log_failures[str(r.msg)[:80]] += 1
        elif str(r.msg) not in EXPECTED_ERRORS:
            stats.log_errors[str(r.msg)[:80]] += 1
    errlog.records.clear()
    return crashes


def run_fuzz(root: Path, *, cases: int, seed: int = 0, epoch_cases: int = 400, progress_s: float = 0.0,
             minimize_crashes: bool = True) -> Stats:
    """``cases`` cases from ``random.Random(seed)`` (the fast generator) through a :class:`Fuzzer`."""
    import random

    clock = trio.testing.MockClock()
    rng = random.Random(seed)
    d = RandomDraw(rng)
    fz_box: list[Fuzzer] = []

    async def main() -> None:
        fz = Fuzzer(root, epoch_cases=epoch_cases, clock=clock, minimize_crashes=minimize_crashes)
        fz_box.append(fz)
        t0 = time.monotonic()
        last = t0
        try:
            for _ in range(cases):
                fz.run_case(d)
                if progress_s and time.monotonic() - last >= progress_s:
                    last = time.monotonic()
                    print(f"  ... {fz.stats.cases} cases, {fz.stats.accepted} accepted, "
                          f"{len(fz.stats.crashes)} crashes, {fz.stats.cases / (last - t0):.0f}/s", flush=True)
        finally:
            fz.stats.seconds = time.monotonic() - t0
            fz.close()
            logging.getLogger("p2pnode").removeHandler(fz.errlog)

    trio.run(main, clock=clock)
    return fz_box[0].stats
