"""What keeping the job table in the ledger costs (:mod:`p2pnode.jobs._records`): the write after a transition, and
the read-back at start of a ledger filled to the table's bounds.

    python bench/job_records.py [--jobs 80000] [--live 64]

Runs ``--jobs`` jobs through a table (start, run, end: three transitions each, one flush per transition, as the
driver flushes after each step), so the rows reach the table's bounds (4,096 finished records, 65,536 ids kept
alone), then restores a fresh table from that file. Prints the mean flush time, the file's size and the restore
time. (2026-11-29, this 2-core machine under other helpers' load: see the report of the session that added it.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from p2pnode.guardcore import CircuitBreaker  # noqa: E402
from p2pnode.jobs._ledger import JobLedger  # noqa: E402
from p2pnode.jobs._records import JobRecords  # noqa: E402
from p2pnode.node._book import JobBook  # noqa: E402
from p2pnode.node._table import Assigned, Exited, JobTable, StartAsked, Started  # noqa: E402
from p2pnode.scheduler import parse_catalog  # noqa: E402

CATALOG = parse_catalog({"job": [{"name": "sp", "kind": "selfplay", "config": "c", "argv": ["x"]}]})


def _keeper(data_dir: Path) -> tuple[JobRecords, JobLedger]:
    ledger = JobLedger(data_dir / "jobs" / "ledger.db")
    table = JobTable()
    core = SimpleNamespace(table=table, book=JobBook(table, CircuitBreaker(), CATALOG))
    runner = SimpleNamespace(ledger=ledger, jobs={}, readopt_done=True, before_readopt=None)
    op = SimpleNamespace(stop_intents=set(), carried_out=lambda j: None)
    return JobRecords(runner, core, op, time.monotonic), ledger  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=80_000)
    ap.add_argument("--live", type=int, default=64)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        keeper, ledger = _keeper(Path(d))
        keeper.restore()
        t = keeper.core.table
        flushes, spent = 0, 0.0
        for i in range(a.jobs + a.live):
            j = f"1-{i}"
            for ev in (Assigned(j, "sp", "selfplay", (0,), term=1), StartAsked(j), Started(j, 1000 + i),
                       *(() if i >= a.jobs else (Exited(j, status=0),))):
                t.apply(ev, time.monotonic())
                t0 = time.perf_counter()
                keeper.flush()
                spent += time.perf_counter() - t0
                flushes += 1
        rows = ledger.query("SELECT count(*) FROM job_records")[0][0]
        ledger.close()
        size = sum(p.stat().st_size for p in (Path(d) / "jobs").glob("ledger.db*"))
        t0 = time.perf_counter()
        keeper2, ledger2 = _keeper(Path(d))
        read = time.perf_counter() - t0
        keeper2.restore()
        total = time.perf_counter() - t0
        print(f"{flushes} flushes (one transition each): {spent / flushes * 1e6:.0f} us mean")
        print(f"{rows} rows, ledger.db + wal {size / 2**20:.1f} MiB; read back {read * 1e3:.0f} ms, "
              f"restored {keeper2.restored} records + {len(keeper2.core.table) - keeper2.restored} ids in "
              f"{total * 1e3:.0f} ms")
        ledger2.close()


if __name__ == "__main__":
    main()
