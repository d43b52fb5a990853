"""The long versions of two real-agent sync tests (the suite runs shorter ones): live SQLite appends for 60 s with
a 300 MiB checkpoint in flight from 20 s, and kill -9 at 20 seeded points of 24 MiB transfers.

    python bench/sync_long.py            # about 2 minutes
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    env = {**os.environ, "P2PNODE_TEST_SQLITE_RUN_S": "60", "P2PNODE_TEST_KILL_POINTS": "20"}
    tests = ["tests/test_sync_agents.py::test_live_sqlite_appends_reach_the_replica_within_10_s_and_it_always_passes_"
             "integrity_check", "tests/test_sync_agents.py::test_kill_9_at_seeded_points_resumes_from_verified_blocks"]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                          env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
