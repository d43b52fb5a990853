"""The disk manager never deletes what is not backed up: a property test over random file sets and receipt sets
(issue 15, item 5; seed 000: never delete without backing up first)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from p2pnode.guardcore import FileInfo, GuardLimits, plan_cleanup

NAMES = st.sampled_from(["step1.pt", "step2.pt", "step3.pt", "step4.pt", "model.ckpt", "run.log", "games.db",
                         "shard.npz", "notes.txt"])
DIRS = st.sampled_from(["data", "data/run1", "data/run2", "logs", "models", "."])


@st.composite
def file_sets(draw):
    files = {}
    for _ in range(draw(st.integers(0, 30))):
        d, n = draw(DIRS), draw(NAMES)
        path = n if d == "." else f"{d}/{n}"
        files[path] = FileInfo(path, draw(st.integers(0, 10**9)), draw(st.floats(0, 1e6)),
                               empty_db=draw(st.booleans()) if n.endswith(".db") else None)
    return list(files.values())


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(files=file_sets(), data=st.data(), used_pct=st.integers(0, 100), keep=st.integers(0, 4))
def test_no_rule_deletes_a_synced_file_without_its_receipts(files, data, used_pct, keep):
    replicated = {f.path for f in files if data.draw(st.booleans(), label=f"replicated {f.path}")}

    def protected(path):  # a node that pushes data/: a file there without R receipts
        return path.startswith("data/") and path not in replicated

    limits = GuardLimits(checkpoint_keep=keep, log_retention_days=1.0)
    total = 10**12
    plan = plan_cleanup(files, used_bytes=total * used_pct // 100, total_bytes=total, limits=limits, now=2e6,
                        replicated=lambda p: p in replicated, protected=protected)
    deleted = [d.path for d in plan.deletions]
    assert not [p for p in deleted if protected(p)]
    assert len(deleted) == len(set(deleted))
    # The stale-checkpoint rule keeps the newest `keep` of the deletable (replicated or outside the sync root)
    # checkpoints of each folder: an unreplicated newer one never makes a replicated one go.
    for d in plan.deletions:
        if d.rule == "stale-checkpoint":
            folder = d.path.rsplit("/", 1)[0] if "/" in d.path else ""
            newer = [f for f in files if f.path != d.path and not protected(f.path) and f.mtime >= d.mtime
                     and (f.path.rsplit("/", 1)[0] if "/" in f.path else "") == folder
                     and f.path.endswith((".pt", ".ckpt", ".pth", ".safetensors"))]
            assert len(newer) >= keep
