import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config: object) -> None:
    """Give the suite, and every process it starts, the SIGINT a terminal gives.

    A shell starts a background job (`cmd &`) with SIGINT ignored, and an ignored signal stays ignored across exec,
    so the CLI subprocesses that tests stop with Ctrl-C (`status --watch`, `jobs logs --follow`, `jobs --watch`,
    `demo`) would never exit. A handled signal reverts to the default on exec, so installing Python's default
    handler here is enough for every child.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# The files that take longest (seconds in CI, all their tests, two workers on 2 cores; the figures of 2026-11-29,
# scaled by the cuts measured then), longest first. See pytest_collection_modifyitems.
LONGEST_FILES = (
    "test_netns_gangs.py",  # 125-210 s: a torchrun and a Ray gang on the real engines
    "test_predict_e2e.py",  # 80 s (second: beside the Ray gang's start, two agents whose jobs mostly sleep)
    "test_jobs_cluster.py",  # 100 s: four clusters of agents
    "test_netns_elastic.py",  # 80 s
    "test_fuzz_routes.py",  # 70 s: every route, two agent configurations, a restart after each route's batch
    "test_elastic_torchrun.py",  # 60 s
    "test_scaling_claims_cluster.py",  # 45 s: three trust modes
    "test_install.py",  # 45 s
    "test_jobs_run_outcome.py",  # 45 s
    # not marked slow, so they would come last; 30-50 s each in one process on a loaded machine
    "test_startup_errors.py",
    "test_state_files.py",
    "test_fuzz_snapshots.py",
    "test_lint.py",
    "test_sim.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Order the files for ``--dist loadfile`` (pyproject's addopts, with ``--no-loadscope-reorder``, so that xdist
    hands the files to its two workers in this order, each to the first worker free): :data:`LONGEST_FILES` first,
    then the other files that start agents (marked ``slow``), then the rest, which fill in at the end. Longest
    first keeps the two workers' ends close together: by default xdist orders files by their number of tests, so
    the long files of one or two tests came last and one worker ran the last of them while the other had ended.
    Each file's tests keep their order."""
    first: dict[str, int] = {}  # file -> the index of its first test
    slow: set[str] = set()
    for i, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        first.setdefault(path, i)
        if item.get_closest_marker("slow") is not None:
            slow.add(path)

    def key(path: str) -> tuple[int, int]:
        name = path.rsplit("/", 1)[-1]
        if name in LONGEST_FILES:
            return 0, LONGEST_FILES.index(name)
        return (1 if path in slow else 2), first[path]

    items.sort(key=lambda item: key(item.nodeid.split("::", 1)[0]))
