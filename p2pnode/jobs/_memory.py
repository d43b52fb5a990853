"""The runner's memory sampling (:class:`p2pnode.jobs.JobRunner`'s, a mixin): every ``memory_check_interval_s``
one pass over the process table (in a worker thread) sums the resident set (RSS) of the process tree of each job no
cgroup holds (:func:`tree_rss`), reads the peak use and OOM kills of each job's cgroup and the VRAM of a job that
holds its GPUs alone; each job's peak is kept for the history and each sample reported (``on_sample``,
:class:`p2pnode.node._stoprules.MemorySample`). It stops nothing: the stop rules decide."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psutil
import trio

from ..node._stoprules import MemorySample
from ._cgroup import MemoryCgroups

__all__ = ["MemorySampling", "tree_rss"]


def tree_rss(roots: Iterable[int]) -> dict[int, int]:
    """RSS in bytes of each root pid's process tree (the root and its descendants), from one pass over the process
    table. A root that is gone counts 0. Blocking (reads /proc): call it from a worker thread."""
    rss: dict[int, int] = {}
    children: defaultdict[int, list[int]] = defaultdict(list)
    for p in psutil.process_iter(["ppid", "memory_info"]):
        mi = p.info.get("memory_info")
        rss[p.pid] = mi.rss if mi is not None else 0
        ppid = p.info.get("ppid")
        if ppid is not None:
            children[ppid].append(p.pid)
    out = {}
    for root in roots:
        total, stack, seen = 0, [root], set()
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            total += rss.get(pid, 0)
            stack.extend(children.get(pid, ()))
        out[root] = total
    return out


class MemorySampling:
    """The memory loop and samples of :class:`p2pnode.jobs.JobRunner` (which sets the attributes below; its jobs are
    :class:`p2pnode.jobs.RunningProcess`)."""

    jobs: dict[str, Any]
    cgroups: MemoryCgroups | None
    memory_check_interval_s: float
    gpu_memory_used: Callable[[], Mapping[int, int]]
    on_sample: Callable[[Any, MemorySample], None] | None
    _cgroup_trash: set[str]

    async def _memory_loop(self) -> None:
        """Every ``memory_check_interval_s``: each job's memory sample (:meth:`note_memory`: its peak goes to the
        history, the sample to ``on_sample``); cgroups the kernel still held are removed."""
        while True:
            await trio.sleep(self.memory_check_interval_s)
            if self.jobs:
                loose, contained = await trio.to_thread.run_sync(
                    self._memory_pass, [j for j in self.jobs.values() if j.proc is not None])
                self.note_memory(loose, contained, self.note_vram(self.gpu_memory_used()))
            if self._cgroup_trash and self.cgroups is not None:
                self._cgroup_trash = {c for c in self._cgroup_trash if not self.cgroups.remove(c)}

    def note_vram(self, used: Mapping[int, int]) -> dict[str, int]:
        """Record each job's VRAM in its peak from the memory ``used`` per GPU index (bytes): only a job that holds
        each of its GPUs whole and alone (the use of a shared GPU is no one job's). Returns those jobs' VRAM now,
        bytes by job id."""
        now: dict[str, int] = {}
        holders: dict[int, int] = {}
        for j in self.jobs.values():
            for g in j.gpus:
                holders[g] = holders.get(g, 0) + 1
        for j in self.jobs.values():
            if j.gpus and j.gpu_fraction >= 1.0 and all(holders[g] == 1 and g in used for g in j.gpus):
                now[j.job_id] = sum(used[g] for g in j.gpus)
                j.peak_vram = max(j.peak_vram, now[j.job_id])
        return now

    def _memory_pass(self, jobs: list[Any]) -> tuple[dict[int, int], dict[str, tuple[int, int]]]:
        """``(loose, contained)``: :func:`tree_rss` of the jobs no memory cgroup holds, by wrapper pid, and the
        cgroup's peak (or current) use and OOM kills of the others, by job id (the kernel enforces their limit).
        Blocking (reads /proc and cgroupfs): a worker thread's."""
        cg = self.cgroups
        loose: list[int] = []
        contained: dict[str, tuple[int, int]] = {}
        for j in jobs:
            if j.cgroup and cg is not None and cg.holds(j.cgroup, j.proc.pid):
                contained[j.job_id] = (cg.peak_bytes(j.cgroup), cg.oom_kills(j.cgroup))
            else:
                loose.append(j.proc.pid)
        return (tree_rss(loose) if loose else {}), contained

    def note_memory(self, rss_by_pid: Mapping[int, int], contained: Mapping[str, tuple[int, int]] | None = None,
                    vram: Mapping[str, int] | None = None) -> None:
        """Record each job's memory in its peak and report it (``on_sample``): the process-tree RSS of a job no
        cgroup holds (``rss_by_pid``: ``{root pid: bytes}``, :func:`tree_rss`), the peak use and OOM kills of a
        job a cgroup holds (``contained``: ``{job id: (bytes, kills)}``), the VRAM of one that holds its GPUs
        alone (``vram``: ``{job id: bytes}``). Stops nothing itself."""
        contained, vram = contained or {}, vram or {}
        for job in list(self.jobs.values()):
            if job.proc is None or job.ended:
                continue
            rss, kills = rss_by_pid.get(job.proc.pid), 0
            if job.job_id in contained:
                used, kills = contained[job.job_id]
                job.peak_rss = max(job.peak_rss, used)
            elif rss is None:
                continue
            else:
                job.peak_rss = max(job.peak_rss, rss)
            if self.on_sample is not None:
                self.on_sample(job, MemorySample(job.job_id, rss_bytes=None if job.job_id in contained else rss,
                                                 oom_kills=kills, vram_bytes=vram.get(job.job_id, 0)))

