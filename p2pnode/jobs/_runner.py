"""The job runner (trio driver): starts and stops the subprocesses a plan assigns to this node, and supervises
them across restarts of the agent.

A job runs its template's argv (rendered from the local catalog with the plan's typed parameters: nothing from
the network is executed) with:

* a minimal environment: only the variables the template names, plus ``CUDA_VISIBLE_DEVICES`` and
  ``CUDA_DEVICE_ORDER`` (the assigned GPUs, :func:`gpu_env`), ``P2PNODE_JOB_ID``, ``P2PNODE_CONFIG``,
  ``P2PNODE_DATA_DIR`` and ``P2PNODE_NODE_ID``; for a GPU job ``P2PNODE_GPU_FRACTION`` and ``P2PNODE_VRAM_GIB``
  (its share of each assigned GPU, which the planner may grow past what it asked: issue 38); for a template with
  a ``[job.checkpoint]``, ``P2PNODE_CHECKPOINT_DIR`` (created before the start) and, when the node fetched the
  config's newest checkpoint first, ``P2PNODE_RESUME_FROM`` (issue 41);
* its own session and process group, under a tiny shell wrapper (:data:`p2pnode.jobs._ledger.WRAPPER`) that
  records the job's exit code in ``<data_dir>/jobs/<job id>.exit``, so its exit status is known even when it
  ended while the agent was down;
* a row in the durable ledger (``<data_dir>/jobs/ledger.db``: pid, process start time, template, GPUs, term,
  log, cgroup) written before the job is reported started. A restarted agent re-adopts every ledger job whose
  process still runs (pid *and* start time match), reports it again and learns its exit status from the exit
  file; a job whose process is gone gets its true end in the history (its exit status, or "lost while the
  agent was down");
* ``oom_score_adj`` 500, so that the kernel's OOM killer takes a job before the agent;
* stdout and stderr appended to ``<data_dir>/logs/<job id>.log`` (one file per job, served by ``GET /jobs/logs``),
  rotated when it passes ``log_max_bytes``;
* a stop (:meth:`JobRunner.stop`) is SIGTERM to its process group, then SIGKILL after the grace period;
* its memory limit (:func:`job_memory_limit`: the template's ``memory_gib`` when the catalog declares one, capped
  by ``guard.memory_limit_gb``, else ``guard.memory_limit_gb``) given to a memory cgroup where the agent can
  create one (:mod:`._cgroup`: v2 ``memory.max`` or v1 ``memory.limit_in_bytes``): the kernel kills the job when
  it passes the limit. Every ``memory_check_interval_s`` one pass over the process table (in a worker thread)
  sums the resident set (RSS) of the process tree of each job no cgroup holds (children of children included;
  pages shared between them count once per process, so the sum errs high) and reads the OOM kills of each
  cgroup; RSS, not ``RLIMIT_AS``: CUDA maps far more virtual memory than it touches;
* start, end, exit status and peak memory (of its process tree, or of its cgroup) recorded in the job history.

The runner is an executor (issue 39): it starts and stops what it is asked to and reports what it observes
(``on_change`` at a start or an end, ``on_exit(job, status)``, ``on_sample(job, sample)`` for each memory sample
(:class:`p2pnode.node._stoprules.MemorySample`), and at the job's exit one marked ``final`` when its cgroup
counted an OOM kill), and decides no stop of its own:
the maximum runtime, the memory limit, a re-adopted job whose template is gone are rules of
:class:`p2pnode.node._stoprules.StopRules`, whose stops reach :meth:`JobRunner.stop` through the driver's one
executor (:meth:`p2pnode.jobs._control.JobControl.apply`).

When the agent stops cleanly, ``on_agent_stop`` (``scheduler.on_agent_stop``): ``"stop"``: the driver asks every
job to stop (rule ``agent_stop``, history ``stopped: agent shutdown``) and :meth:`JobRunner.shutdown` waits for
them (one SIGTERM each, grace, SIGKILL); a job no one asked to stop by then (the runner used alone) is stopped with
that reason too. ``"leave"`` leaves them running in the ledger for the next start to re-adopt.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import trio

from ..node._jobstate import exit_outcome
from ..node._stoprules import LEASE_REASON, MemorySample, memory_stop_reason
from ..scheduler import JobTemplate
from ..scheduler._checkpointspec import CHECKPOINT_SIGNALS
from ..snapshot import GangSlot
from ._cgroup import MemoryCgroups, detect, enforcement
from ._history import JobHistory
from ._launch import (
    check_ports_free,
    child_setup,
    gpu_env,
    job_command,
    job_memory_limit,
    resolve_argv0,
)
from ._leasefile import lease_ended, v2_dir, wrapper_args
from ._ledger import (
    JobLedger,
    LedgerEntry,
    exit_status_of,
    find_wrapper,
    process_alive,
    process_start_ticks,
    safe_name,
)
from ._leftovers import reap_leftovers
from ._memory import MemorySampling, tree_rss

__all__ = ["KILL_WAIT_S", "ON_AGENT_STOP", "AdoptedProcess", "JobRunner", "RunningProcess", "check_ports_free",
           "gpu_env", "job_memory_limit", "memory_stop_reason", "tree_rss"]

log = logging.getLogger(__name__)
GIB = 2**30
ON_AGENT_STOP = ("stop", "leave")
SHUTDOWN_REASON = "stopped: agent shutdown"
KILL_WAIT_S = 5.0
"""Seconds the agent's stop waits for a job after its SIGKILL (one in D state is then recorded as it is)."""
LOST_REASON = "lost while the agent was down"
_SH = "/bin/sh"


class AdoptedProcess:
    """A job process this agent did not spawn (re-adopted from the ledger): its wrapper's ``pid`` and start time
    (ticks since boot). ``poll()`` like :class:`subprocess.Popen`'s: None while it runs, then its exit status
    from the exit file (``returncode``; None when the file is missing)."""

    def __init__(self, pid: int, start_ticks: int | None, exit_path: str) -> None:
        self.pid = pid
        self.start_ticks = start_ticks
        self.exit_path = exit_path
        self.returncode: int | None = None
        self.ended = False

    def poll(self) -> int | None:
        if not self.ended and not process_alive(self.pid, self.start_ticks):
            self.ended = True
            self.returncode = exit_status_of(self.exit_path)
        return self.returncode


class RunningProcess(msgspec.Struct):
    """A job process this runner watches: template, plan term, GPUs (indexes, fraction, VRAM GiB), start times (Unix
    and monotonic: for a re-adopted job, when it was re-adopted), the process, why it is being stopped (None: it is
    not) and by which stop rule, peak RSS in bytes, the wrapper's start time (ticks since boot), exit file, memory
    cgroup ('' none), memory limit (GiB, 0 none) and where it comes from, whether it was re-adopted, when it began
    on the monotonic clock (a re-adopted job: its wall-clock start mapped back; its maximum runtime counts from
    there)."""
    job_id: str
    template: JobTemplate
    term: int
    gpus: tuple[int, ...]
    gpu_fraction: float
    vram_gib: float
    started_at: float  # wall clock
    started_mono: float
    proc: Any = None
    stopping: str | None = None
    stop_rule: str | None = None
    peak_rss: int = 0
    peak_vram: int = 0
    done: trio.Event = msgspec.field(default_factory=trio.Event)
    start_ticks: int | None = None
    exit_path: str = ""
    cgroup: str = ""
    memory_limit_gib: float = 0.0
    limit_source: str = "guard.memory_limit_gb"
    adopted: bool = False
    began_mono: float = 0.0
    ended: bool = False
    gang: GangSlot | None = None
    termed: bool = False
    """SIGTERM sent to it (:meth:`JobRunner._term`: once)."""
    checkpoint_dir: str = ""
    """Its ``[job.checkpoint]`` dir, absolute ("": none, or re-adopted: not known)."""

    def to_wire(self) -> dict[str, Any]:
        """The job as a plain dict (JSON views)."""
        return {
            "job_id": self.job_id, "template": self.template.name, "config": self.template.config,
            "kind": self.template.kind, "gpus": list(self.gpus), "gpu_fraction": self.gpu_fraction,
            "vram_gib": self.vram_gib, "started_at": self.started_at, "term": self.term,
            "pid": self.proc.pid if self.proc is not None else None, "adopted": self.adopted,
        }



class RunnerSignals:
    """The runner's checkpoint signal (issue 41, item 3), apart from :class:`JobRunner` (one concern): ``jobs`` and
    ``_signal`` are the runner's."""

    jobs: dict[str, RunningProcess]
    _signal: Callable[[RunningProcess, int], bool]  # (JobRunner's)

    def signal_job(self, job_id: str, name: str) -> bool:
        """Send the checkpoint signal ``name`` (one of :data:`p2pnode.scheduler._checkpointspec.CHECKPOINT_SIGNALS`)
        to ``job_id``'s process group (a :class:`p2pnode.node._ckwarn.SignalJob` the executor carries out): whether
        it was sent (not to a job unknown, stopping, or gone)."""
        job = self.jobs.get(job_id)
        if job is None or job.ended or job.termed or name not in CHECKPOINT_SIGNALS:
            return False
        return self._signal(job, getattr(signal, name))


class JobRunner(MemorySampling, RunnerSignals):
    """Runs jobs for one agent. ``on_change()`` is called (in trio) whenever a job starts or ends, and
    ``on_exit(job, exit_status)`` when one ends, ``on_sample(job, sample)`` with each memory sample of a job
    (:class:`p2pnode.node._stoprules.MemorySample`: every ``memory_check_interval_s``, and at its exit; the driver
    feeds it to its stop rules, which may stop the job through :meth:`stop`). ``memory_limit_gib`` (0: none) is the
    node's cap on each job's memory, given to a cgroup where ``cgroups`` gives one (by default the host's,
    :func:`p2pnode.jobs._cgroup.detect`; None: none, the samples' RSS only). ``templates`` (the catalog's) are
    what re-adopted jobs run; ``on_agent_stop`` (:data:`ON_AGENT_STOP`) what a clean stop does to running jobs;
    ``gpu_uuids()`` the NVML UUID of each GPU index now (the node's newest resource sample; default none known),
    by which a job is given its GPUs (:func:`gpu_env`); ``node_class()`` the node's class now (recorded with each
    run, :func:`p2pnode.scheduler.node_class_of`); ``gpu_memory_used()`` the memory used on each GPU index now,
    bytes (the newest sample): a job that holds its GPUs alone gets their use as its peak VRAM in the history
    (NVML gives no per-job figure for shared GPUs: those runs record none)."""

    def __init__(self, *, node_id: str, data_dir: Path, history: JobHistory, grace_s: float = 10.0,
                 log_max_bytes: int = 10 * 2**20, on_change: Any = None, on_exit: Any = None,
                 memory_limit_gib: float = 0.0, memory_check_interval_s: float = 5.0,
                 templates: Mapping[str, JobTemplate] | None = None, on_agent_stop: str = "stop",
                 cgroups: MemoryCgroups | None | str = "detect",
                 gpu_uuids: Callable[[], Mapping[int, str]] = dict, node_class: Callable[[], str] = str,
                 gpu_memory_used: Callable[[], Mapping[int, int]] = dict,
                 on_sample: Callable[[RunningProcess, MemorySample], None] | None = None,
                 sync_root: Path | None = None) -> None:
        if on_agent_stop not in ON_AGENT_STOP:
            raise ValueError(f"on_agent_stop must be one of {', '.join(ON_AGENT_STOP)}, not {on_agent_stop!r}")
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self.sync_root = Path(sync_root) if sync_root is not None else self.data_dir / "data"  # [job.checkpoint] dir's
        self.logs = self.data_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.jobs_dir = self.data_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = JobLedger(self.jobs_dir / "ledger.db")
        self.history = history
        self.grace_s = grace_s
        self.log_max_bytes = log_max_bytes
        self.on_change = on_change
        self.on_exit = on_exit
        self.on_sample = on_sample
        self.memory_limit_gib = memory_limit_gib
        self.memory_check_interval_s = memory_check_interval_s
        self.templates = templates or {}
        self.on_agent_stop = on_agent_stop
        self.gpu_uuids = gpu_uuids
        self.node_class = node_class
        self.gpu_memory_used = gpu_memory_used
        self.cgroups: MemoryCgroups | None = (detect(node_dir=safe_name(node_id[:16]), move=on_agent_stop != "leave")
                                              if cgroups == "detect"
                                              else cgroups)  # type: ignore[assignment]
        self.memory_enforcement = enforcement(self.cgroups)
        """How per-job memory limits are enforced, found here at start (:func:`p2pnode.jobs._cgroup.enforcement`)."""
        self.jobs: dict[str, RunningProcess] = {}
        self.finished = 0
        self.failed_starts = 0
        self.leftovers_killed = 0
        """Processes jobs left in their session after they ended, killed (:func:`._leftovers.reap_leftovers`)."""
        self.readopted = 0
        self.before_readopt: Callable[[], None] | None = None
        """Called at the start of each :meth:`readopt` (the driver restores its job table from the ledger first)."""
        self.readopt_done = False
        """Whether :meth:`readopt` ran (every ledger job this runner will re-adopt is in :attr:`jobs`)."""
        self.closing = False
        self.lease_file: Path | None = None  # the node's lease file (._leasefile; None: no lease): fenced jobs' wrapper
        self._cgroup_trash: set[str] = set()
        self._nursery: trio.Nursery | None = None
        self._unwatched: list[RunningProcess] = []  # re-adopted before run(): watched from run()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Re-adopt the ledger's live jobs, then hold the runner's nursery until cancelled; a cancellation without
        :meth:`shutdown` first does what it would do (``on_agent_stop``)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.readopt()
            for job in self._unwatched:  # re-adopted before the nursery existed (the agent's first snapshot)
                nursery.start_soon(self._watch, job, None)
                if job.stopping is not None:  # asked to stop before the nursery existed
                    nursery.start_soon(self._stop_proc, job, job.stopping)
            self._unwatched.clear()
            nursery.start_soon(self._memory_loop)
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await self.shutdown()

    # -- start -----------------------------------------------------------------------------------
    def log_path(self, job_id: str) -> Path:
        """The log file of job ``job_id`` (it may not exist)."""
        return self.logs / f"{job_id}.log"

    def _log_file(self, job_id: str) -> Path:
        path = self.log_path(job_id)
        try:
            if path.stat().st_size > self.log_max_bytes:
                os.replace(path, path.with_suffix(".log.1"))
        except FileNotFoundError:
            pass
        return path

    def start(self, *, job_id: str, template: JobTemplate, params: dict[str, Any], gpus: tuple[int, ...],
              gpu_fraction: float, vram_gib: float, term: int, catalog_dir: str = ".", gang: GangSlot | None = None,
              python: str = "", own_host: str = "", resume_from: str = "") -> None:
        """Start a job (returns at once; the process is watched in the runner's nursery), recorded in the ledger
        before it counts as started. ``gang``: the member's place in its gang; ``python``: the interpreter of the
        template's engine (default the agent's); ``own_host``: this node's advertised host (a Ray member's
        address). The command is the engine's (:func:`p2pnode.node._engines.engine_command`). Raises
        ``ValueError`` for parameters the template does not declare, ``OSError`` when the command cannot start, a
        port of the member's block is taken (the gang is placed again), or the agent is shutting down."""
        assert self._nursery is not None, "JobRunner.run must be running"
        if self.closing:
            raise OSError(errno.ESHUTDOWN, "the agent is shutting down")
        argv, env = job_command(template, params, job_id=job_id, node_id=self.node_id, data_dir=self.data_dir,
                                gpus=gpus, gpu_fraction=gpu_fraction, vram_gib=vram_gib, uuids=self.gpu_uuids(),
                                catalog_dir=catalog_dir, gang=gang, python=python, own_host=own_host,
                                sync_root=self.sync_root, resume_from=resume_from)
        try:
            argv[0] = resolve_argv0(argv[0], env, self.data_dir)
            if "P2PNODE_CHECKPOINT_DIR" in env:
                os.makedirs(env["P2PNODE_CHECKPOINT_DIR"], exist_ok=True)
        except OSError:
            self.failed_starts += 1
            raise
        exit_path = self.jobs_dir / f"{safe_name(job_id)}.exit"
        exit_path.unlink(missing_ok=True)
        limit, source = job_memory_limit(template, self.memory_limit_gib)
        cgroup = self._make_cgroup(job_id, limit)
        log_path = self._log_file(job_id)
        entry = LedgerEntry(job_id=job_id, pid=None, start_ticks=None, template=template.name,
                            config=template.config, kind=template.kind, gpus=tuple(gpus), gpu_fraction=gpu_fraction,
                            vram_gib=vram_gib, term=term, started_at=time.time(), log_path=str(log_path),
                            exit_path=str(exit_path), cgroup=cgroup, memory_limit_gib=limit, gang=gang)
        self.ledger.put(entry)  # the intent: a crash before the pid is recorded still finds the wrapper
        logf = open(log_path, "ab")
        try:
            logf.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} start {job_id}: {argv}\n".encode())
            logf.flush()
            join = self.cgroups.join_file(cgroup) if cgroup and self.cgroups is not None else None
            wrapper = wrapper_args(template, exit_path, self.lease_file, self.grace_s, v2_dir(self.cgroups, cgroup))
            proc = subprocess.Popen([_SH, "-c", *wrapper, *argv], stdout=logf,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=self.data_dir,
                                    preexec_fn=functools.partial(child_setup, join), start_new_session=True)
        except OSError:
            self.failed_starts += 1
            logf.close()
            self.ledger.remove(job_id)
            self._drop_cgroup(cgroup)
            raise
        ticks = process_start_ticks(proc.pid)
        self.ledger.put(msgspec.structs.replace(entry, pid=proc.pid, start_ticks=ticks))
        if cgroup and self.cgroups is not None and not self.cgroups.holds(cgroup, proc.pid):
            log.warning("job %s is not in its memory cgroup %s: the RSS watchdog enforces its limit", job_id, cgroup)
        job = RunningProcess(job_id, template, term, gpus, gpu_fraction, vram_gib, entry.started_at,
                             trio.current_time(), proc, start_ticks=ticks, exit_path=str(exit_path), cgroup=cgroup,
                             memory_limit_gib=limit, limit_source=source, began_mono=trio.current_time(), gang=gang,
                             checkpoint_dir=env.get("P2PNODE_CHECKPOINT_DIR", ""))
        self.jobs[job_id] = job
        self.history.started(job_id=job_id, template=template.name, config=template.config, kind=template.kind,
                             node_id=self.node_id, term=term, at=job.started_at, node_class=self.node_class() or None)
        self._nursery.start_soon(self._watch, job, logf)
        log.info("job %s (%s) started, pid %d, GPUs %s%s", job_id, template.name, proc.pid, gpus or "-",
                 f", memory cgroup {limit:g} GiB" if cgroup else "")
        if self.on_change:
            self.on_change()

    def _make_cgroup(self, job_id: str, limit_gib: float) -> str:
        if self.cgroups is None or limit_gib <= 0:
            return ""
        try:
            return self.cgroups.create(safe_name(job_id), int(limit_gib * GIB))
        except OSError as exc:
            log.warning("no memory cgroup for job %s (%s): the RSS watchdog enforces its limit", job_id, exc)
            return ""

    def _drop_cgroup(self, cgroup: str) -> None:
        if cgroup and self.cgroups is not None and not self.cgroups.remove(cgroup):
            self._cgroup_trash.add(cgroup)  # the kernel may still hold it a moment: retried by the memory loop

    # -- re-adoption -----------------------------------------------------------------------------
    def readopt(self) -> None:
        """Every job of the ledger: re-adopted when its process still runs (pid and start time match), else its
        end recorded in the history (the exit file's status, or lost). Called by :meth:`run`, and may be called
        before it (the agent does, so that its first snapshot already lists the jobs that run: a leader that saw
        it without them would place a second training of their config); watching then starts with :meth:`run`.
        Jobs already held are skipped."""
        if self.before_readopt is not None:
            self.before_readopt()
        now_mono, now = trio.current_time(), time.time()
        changed = False
        for e in self.ledger.entries():
            if e.job_id in self.jobs:
                continue
            pid, ticks = e.pid, e.start_ticks
            if pid is None:
                found = find_wrapper(e.exit_path)
                if found is not None:
                    pid, ticks = found
                    self.ledger.put(msgspec.structs.replace(e, pid=pid, start_ticks=ticks))
            template = self.templates.get(e.template) or JobTemplate(name=e.template, kind=e.kind,
                                                                      config=e.config, argv=())
            limit, source = job_memory_limit(template, self.memory_limit_gib)
            if e.memory_limit_gib != limit:
                limit, source = e.memory_limit_gib, "the limit it started with"
            job = RunningProcess(e.job_id, template, e.term, e.gpus, e.gpu_fraction, e.vram_gib, e.started_at,
                                 now_mono, AdoptedProcess(pid or 0, ticks, e.exit_path), start_ticks=ticks,
                                 exit_path=e.exit_path, cgroup=e.cgroup, memory_limit_gib=limit, limit_source=source,
                                 adopted=True, gang=e.gang,
                                 began_mono=now_mono - (now - e.started_at))
            self.history.started(job_id=e.job_id, template=e.template, config=e.config, kind=e.kind,
                                 node_id=self.node_id, term=e.term, at=e.started_at, keep=True)
            changed = True
            self.jobs[e.job_id] = job  # held while its end is recorded too (a stop may name that end)
            if pid is None or not process_alive(pid, ticks):
                job.proc.ended = True
                job.proc.returncode = exit_status_of(e.exit_path)
                self._finish(job, down=True)
                continue
            self.readopted += 1
            log.info("job %s (%s) re-adopted, pid %d, running for %.0f s", e.job_id, e.template, pid,
                     now - e.started_at)
            if self._nursery is None:
                self._unwatched.append(job)
                continue
            self._nursery.start_soon(self._watch, job, None)
        self.readopt_done = True
        if self.cgroups is not None and self.cgroups.sweep({j.cgroup for j in self.jobs.values() if j.cgroup}):
            log.info("removed memory cgroups of jobs that ended while the agent was down")
        if changed and self.on_change:
            self.on_change()

    # -- watching --------------------------------------------------------------------------------
    async def _watch(self, job: RunningProcess, logf: Any) -> None:
        """Until the job's wrapper exits, then its end recorded. Event-driven: the wrapper's pidfd becomes
        readable when it exits (``pidfd_open``, Linux 5.3+; trio's own ``Process.wait`` waits the same way; it
        works for re-adopted processes that are not our children too), so a thousand watched jobs cost nothing
        between their start and end. Where there is no pidfd, a poll every 0.5 s. Memory samples are the memory
        loop's: one pass over the process table in a worker thread for all jobs, never per job on the event loop."""
        fd: int | None = None
        try:
            with contextlib.suppress(OSError, AttributeError):
                fd = os.pidfd_open(job.proc.pid)  # before the liveness check: the fd then names that process
            while not self._gone(job):
                if fd is None:
                    await trio.sleep(0.5)
                else:
                    await trio.lowlevel.wait_readable(fd)
                    if not self._gone(job):  # readable but not yet reaped: never spin on it
                        await trio.sleep(0.05)
        finally:
            if fd is not None:
                trio.lowlevel.notify_closing(fd)
                os.close(fd)
            if logf is not None:
                logf.close()
            if self._gone(job):
                self._finish(job)
            # else: cancelled while the job runs (the agent stops): :meth:`shutdown` owns it

    @staticmethod
    def _gone(job: RunningProcess) -> bool:
        return job.proc.poll() is not None or getattr(job.proc, "ended", False)

    def _finish(self, job: RunningProcess, *, down: bool = False) -> None:
        """Record how ``job`` ended (``down``: while the agent was down), forget it, clean up after it."""
        if job.ended:
            return
        job.ended = True
        status = exit_status_of(job.exit_path) if job.exit_path else None
        if status is None:
            status = job.proc.returncode
        ooms = self.cgroups.oom_kills(job.cgroup) if job.cgroup and self.cgroups is not None else 0
        if job.cgroup and self.cgroups is not None:
            job.peak_rss = max(job.peak_rss, self.cgroups.peak_bytes(job.cgroup))
        if ooms and self.on_sample is not None:  # its exit's sample: the stop rules may name its end (memory limit)
            self.on_sample(job, MemorySample(job.job_id, oom_kills=ooms, final=True))
        if lease_ended(job.exit_path) and job.stopping is None:  # its wrapper's watchdog ended it
            job.stopping, job.stop_rule = LEASE_REASON, "lease_expired"
        if job.stopping is not None:
            reason = job.stopping
        elif down and status is None:
            reason = LOST_REASON
        else:
            reason = "exited" if status == 0 else f"failed with status {status}"
            if down:
                reason += " while the agent was down"
        ended_at = time.time()
        if down:
            with contextlib.suppress(OSError):
                ended_at = os.stat(job.exit_path).st_mtime
        if not down:  # (after a downtime, a reboot even, the session's number may name another session now)
            self.leftovers_killed += reap_leftovers(job)
        stopped = job.stopping is not None
        self.history.ended(job.job_id, at=ended_at, exit_status=status, peak_rss_bytes=job.peak_rss, reason=reason,
                           peak_vram_bytes=job.peak_vram or None, rule=job.stop_rule if stopped else None,
                           outcome=exit_outcome(status, stopped=stopped))
        self.ledger.remove(job.job_id)
        if job.exit_path:
            Path(job.exit_path).unlink(missing_ok=True)
        self._drop_cgroup(job.cgroup)
        self.jobs.pop(job.job_id, None)
        self.finished += 1
        job.done.set()
        log.info("job %s (%s) ended: %s", job.job_id, job.template.name, reason)
        if self.on_exit:
            self.on_exit(job, status)
        if self.on_change:
            self.on_change()

    # -- stopping --------------------------------------------------------------------------------
    def stop(self, job_id: str, reason: str, rule: str = "plan") -> None:
        """Carry out a stop the driver's executor was asked for (a :class:`p2pnode.node.StopJob`): ``reason`` and
        ``rule`` kept for the history, SIGTERM now, SIGKILL after the grace period (returns at once). A job
        stopping already keeps its first reason, but for a clean agent stop's (rule ``agent_stop``) at its exit,
        which the kernel's OOM kill (rule ``memory_limit``) replaces; one that is gone (its end being recorded) only
        takes the reason; before :meth:`run` the signals wait for it."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        if job.stopping is not None:
            if job.ended and job.stop_rule == "agent_stop" and rule == "memory_limit":
                job.stopping, job.stop_rule = reason, rule
            return
        job.stopping, job.stop_rule = reason, rule
        if rule == "memory_limit":
            log.warning("job %s (%s): %s", job.job_id, job.template.name, reason)
        if self._nursery is not None and not job.ended:
            self._nursery.start_soon(self._stop_proc, job, reason)

    def _signal(self, job: RunningProcess, sig: int) -> bool:
        """``sig`` to the job's process group, only while its wrapper is the process the ledger names."""
        if self._gone(job):
            return False
        try:
            os.killpg(job.proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def _term(self, job: RunningProcess) -> bool:
        """SIGTERM to the job's process group, once: whether it was sent now (a job may take a second SIGTERM as
        "abort now", and lose its graceful stop)."""
        if job.termed:
            return False
        job.termed = self._signal(job, signal.SIGTERM)
        return job.termed

    async def _stop_proc(self, job: RunningProcess, reason: str) -> None:
        job.stopping = job.stopping or reason
        if not self._term(job):  # gone, or signalled already (by :meth:`_stop_all`, whose deadline then holds)
            return
        with trio.move_on_after(self.grace_s):
            await job.done.wait()
            return
        self._signal(job, signal.SIGKILL)

    async def shutdown(self) -> None:
        """The agent stops (idempotent; no new job starts after it). ``on_agent_stop = "stop"``: every job gets
        SIGTERM (once: one a stop signalled already is not signalled again), SIGKILL after the grace period, and
        its end in the history (``stopped: agent shutdown``, or the stop already under way); returns once all are
        recorded. ``"leave"``: jobs keep running, recorded in the ledger for the next start to re-adopt."""
        first = not self.closing
        self.closing = True
        if self.on_agent_stop == "leave":
            if first and self.jobs:
                log.info("agent stopping: leaving %d jobs running for re-adoption (%s)", len(self.jobs),
                         ", ".join(f"{j.job_id} pid {j.proc.pid}" for j in self.jobs.values()))
            return
        jobs = [j for j in self.jobs.values() if not j.ended]
        if jobs:
            await self._stop_all(jobs)
        if self.cgroups is not None and not self.jobs:
            for c in list(self._cgroup_trash):
                self._drop_cgroup(c)
            self.cgroups.release()

    async def _stop_all(self, jobs: list[RunningProcess]) -> None:
        t0 = time.monotonic()
        for job in jobs:  # those no one asked to stop yet (the runner used alone): stopped as the driver would
            if job.stopping is None:
                job.stopping, job.stop_rule = SHUTDOWN_REASON, "agent_stop"
            self._term(job)  # once: a job a stop signalled already keeps that path, and this SIGKILL deadline
        deadline = trio.current_time() + self.grace_s
        killed_at: float | None = None
        while True:
            for job in jobs:
                if not job.ended and self._gone(job):
                    self._finish(job)
            left = [j for j in jobs if not j.ended]
            if not left:
                break
            if killed_at is None and trio.current_time() >= deadline:
                killed_at = trio.current_time()
                for job in left:
                    self._signal(job, signal.SIGKILL)
            if killed_at is not None and trio.current_time() - killed_at > KILL_WAIT_S:
                for job in left:  # unkillable (D state): recorded as what it is, its ledger row kept
                    log.error("job %s (pid %d) did not die after SIGKILL", job.job_id, job.proc.pid)
                break
            await trio.sleep(0.05)
        log.info("agent stopping: %d jobs stopped in %.2f s", len(jobs), time.monotonic() - t0)
