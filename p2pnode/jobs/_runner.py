"""The job runner (trio driver): starts and stops the subprocesses a plan assigns to this node.

A job runs its template's argv (rendered from the local catalog with the plan's typed parameters: nothing from
the network is executed) with:

* a minimal environment: only the variables the template names, plus ``CUDA_VISIBLE_DEVICES`` (the assigned
  GPUs), ``P2PNODE_JOB_ID``, ``P2PNODE_CONFIG``, ``P2PNODE_DATA_DIR`` and ``P2PNODE_NODE_ID``;
* ``oom_score_adj`` 500, so that the kernel's OOM killer takes a job before the agent;
* stdout and stderr appended to ``<data_dir>/logs/<template>.log``, rotated when it passes ``log_max_bytes``;
* its maximum runtime enforced; a stop is SIGTERM, then SIGKILL after the grace period;
* start, end, exit status and peak RSS recorded in the job history.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import trio

from ..scheduler import JobTemplate
from ._history import JobHistory

__all__ = ["JobRunner", "RunningProcess"]

log = logging.getLogger(__name__)


def _lower_oom_priority() -> None:  # runs in the child between fork and exec
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("500")
    except OSError:
        pass


@dataclass
class RunningProcess:
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
    peak_rss: int = 0
    done: trio.Event = field(default_factory=trio.Event)

    def to_wire(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "template": self.template.name, "config": self.template.config,
            "kind": self.template.kind, "gpus": list(self.gpus), "gpu_fraction": self.gpu_fraction,
            "vram_gib": self.vram_gib, "started_at": self.started_at, "term": self.term,
            "pid": self.proc.pid if self.proc is not None else None,
        }


class JobRunner:
    """Runs jobs for one agent. ``on_change()`` is called (in trio) whenever a job starts or ends, and
    ``on_exit(job, exit_status)`` when one ends."""

    def __init__(self, *, node_id: str, data_dir: Path, history: JobHistory, grace_s: float = 10.0,
                 log_max_bytes: int = 10 * 2**20, on_change: Any = None, on_exit: Any = None) -> None:
        self.node_id = node_id
        self.data_dir = Path(data_dir)
        self.logs = self.data_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.history = history
        self.grace_s = grace_s
        self.log_max_bytes = log_max_bytes
        self.on_change = on_change
        self.on_exit = on_exit
        self.jobs: dict[str, RunningProcess] = {}
        self.finished = 0
        self.failed_starts = 0
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(self.grace_s + 1):
                        async with trio.open_nursery() as n:
                            for job in list(self.jobs.values()):
                                n.start_soon(self._stop_proc, job, "agent shutdown")

    def _log_file(self, template: str) -> Path:
        path = self.logs / f"{template}.log"
        try:
            if path.stat().st_size > self.log_max_bytes:
                os.replace(path, path.with_suffix(".log.1"))
        except FileNotFoundError:
            pass
        return path

    def start(self, *, job_id: str, template: JobTemplate, params: dict[str, Any], gpus: tuple[int, ...],
              gpu_fraction: float, vram_gib: float, term: int, catalog_dir: str = ".") -> None:
        """Start a job (returns at once; the process is watched in the runner's nursery). Raises ``ValueError``
        for parameters the template does not declare, ``OSError`` when the command cannot start."""
        assert self._nursery is not None, "JobRunner.run must be running"
        argv = template.render_argv(params, {"python": sys.executable, "catalog_dir": catalog_dir})
        env = {k: os.environ[k] for k in template.env if k in os.environ}
        env.update({
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
            "P2PNODE_JOB_ID": job_id, "P2PNODE_CONFIG": template.config, "P2PNODE_NODE_ID": self.node_id,
            "P2PNODE_DATA_DIR": str(self.data_dir),
        })
        logf = open(self._log_file(template.name), "ab")
        try:
            logf.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} start {job_id}: {argv}\n".encode())
            logf.flush()
            proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                    cwd=self.data_dir, preexec_fn=_lower_oom_priority, start_new_session=True)
        except OSError:
            self.failed_starts += 1
            logf.close()
            raise
        job = RunningProcess(job_id, template, term, gpus, gpu_fraction, vram_gib, time.time(), trio.current_time(), proc)
        self.jobs[job_id] = job
        self.history.started(job_id=job_id, template=template.name, config=template.config, kind=template.kind,
                             node_id=self.node_id, term=term, at=job.started_at)
        self._nursery.start_soon(self._watch, job, logf)
        log.info("job %s (%s) started, pid %d, GPUs %s", job_id, template.name, proc.pid, gpus or "-")
        if self.on_change:
            self.on_change()

    async def _watch(self, job: RunningProcess, logf: Any) -> None:
        deadline = job.started_mono + job.template.max_runtime_s
        try:
            while job.proc.poll() is None:
                try:
                    job.peak_rss = max(job.peak_rss, psutil.Process(job.proc.pid).memory_info().rss)
                except psutil.Error:
                    pass
                if trio.current_time() >= deadline and job.stopping is None:
                    self.stop(job.job_id, "maximum runtime reached")
                await trio.sleep(0.5)
        finally:
            logf.close()
            status = job.proc.returncode
            reason = job.stopping or ("exited" if status == 0 else f"failed with status {status}")
            self.history.ended(job.job_id, at=time.time(), exit_status=status, peak_rss_bytes=job.peak_rss,
                               reason=reason)
            self.jobs.pop(job.job_id, None)
            self.finished += 1
            job.done.set()
            log.info("job %s (%s) ended: %s", job.job_id, job.template.name, reason)
            if self.on_exit:
                self.on_exit(job, status)
            if self.on_change:
                self.on_change()

    def stop(self, job_id: str, reason: str) -> None:
        """SIGTERM now, SIGKILL after the grace period (returns at once)."""
        job = self.jobs.get(job_id)
        if job is None or job.stopping is not None or self._nursery is None:
            return
        job.stopping = reason
        self._nursery.start_soon(self._stop_proc, job, reason)

    async def _stop_proc(self, job: RunningProcess, reason: str) -> None:
        job.stopping = job.stopping or reason
        try:
            os.killpg(job.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        with trio.move_on_after(self.grace_s):
            await job.done.wait()
            return
        try:
            os.killpg(job.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
