"""What ``GET /plan?inputs=1`` costs the leader (issue 38 review): the bytes its kept planning rounds hold, and the time
and size of one inputs document, at N members x 8 GPUs with 8 running jobs each (a leader planning 16,000 jobs at
2,000 members), as :class:`p2pnode.node._planinputs.KeptInputs` keeps them; and how long a trio event loop stalls while
20 readers ask for the document, built on the loop each time (as first merged) or once in a worker thread (the
leader's :meth:`p2pnode.jobs._leading.LeaderRole.plan_inputs_json`).

    python bench/plan_inputs_cost.py                # 2,000 members, about 30 s
    python bench/plan_inputs_cost.py --members 1000
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import msgspec
import trio

from p2pnode.node._planinputs import KeptInputs, plan_inputs_doc, plan_inputs_json
from p2pnode.node._plans import MemberPlanInput, Planner
from p2pnode.scheduler import GpuView, NodeView, parse_catalog
from p2pnode.snapshot import JobReport

GPUS = 8
READERS = 20


def _members(n: int) -> list[MemberPlanInput]:
    return [MemberPlanInput(f"node{i:05d}", NodeView(f"node{i:05d}", tuple(GpuView(g, 80.0) for g in range(GPUS)),
                                                     tags=frozenset({"durable", "voter"}), vram_limit_ratio=0.8,
                                                     cpus=64.0, memory_gib=512.0),
                            running=tuple(JobReport(job_id=f"1-{i}-{g}", template=f"sp{g % 2}", gpus=[g],
                                                    gpu_fraction=1.0, vram_gib=8.0, term=1) for g in range(GPUS)))
            for i in range(n)]


async def _stall(build, on_loop: bool) -> tuple[float, float]:
    """(seconds the longest heartbeat of 5 ms came late, seconds for READERS reads) while READERS readers read."""
    late = 0.0
    done = trio.Event()

    async def heartbeat() -> None:
        nonlocal late
        while not done.is_set():
            t = time.perf_counter()
            await trio.sleep(0.005)
            late = max(late, time.perf_counter() - t - 0.005)

    cache: list[bytes] = []
    lock = trio.Lock()

    async def read() -> None:
        if on_loop:
            build()
            return
        async with lock:
            if not cache:
                cache.append(await trio.to_thread.run_sync(build))

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat)
        await trio.sleep(0.05)
        async with trio.open_nursery() as readers:
            for _ in range(READERS):
                readers.start_soon(read)
        took = time.perf_counter() - t0 - 0.05
        done.set()
    return late, took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=2000)
    ns = ap.parse_args()
    catalog = parse_catalog({"job": [{"name": f"sp{k}", "kind": "selfplay", "config": "c", "argv": ["x"],
                                      "max_concurrency": 10000, "resources": {"num_gpus": 1, "vram_gib": 8}}
                                     for k in range(2)]})
    planner, kept = Planner(catalog), KeptInputs()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    held = []
    r = None
    for k in range(9):  # fresh member views each round: the upper bound (the leader reuses unchanged ones)
        r = planner.lead(1, _members(ns.members), None, {}, 1.0 + k, 1.0 + k)
        kept.made(r, r.section)
        gc.collect()
        held.append(tracemalloc.get_traced_memory()[0] - base)
    tracemalloc.stop()
    assert r is not None
    print(f"{ns.members} members x {GPUS} GPUs, {len(r.view.running)} running jobs")
    print(f"kept rounds (section, view, decision) after each plan: {' '.join(f'{h / 2**20:.0f}' for h in held)} MiB"
          f" ({(held[7] - held[0]) / 7 / 2**20:.1f} MiB a plan)")
    t0 = time.perf_counter()
    data = plan_inputs_json(r)
    t1 = time.perf_counter()
    plan = msgspec.json.encode(r.section)
    t2 = time.perf_counter()
    print(f"one inputs document: built and encoded in {1000 * (t1 - t0):.0f} ms, {len(data) / 2**20:.2f} MiB "
          f"(the plan itself: {1000 * (t2 - t1):.0f} ms, {len(plan) / 2**20:.2f} MiB)")
    first = lambda: msgspec.json.encode(plan_inputs_doc(r))  # noqa: E731 (as first merged: the collector on)
    for label, on_loop, build in (("built on the loop per reader", True, first),
                                  ("built once in a thread", False, lambda: plan_inputs_json(r))):
        late, took = trio.run(_stall, build, on_loop)
        print(f"{READERS} readers, {label}: the loop stalled up to {1000 * late:.0f} ms; all read in {took:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
