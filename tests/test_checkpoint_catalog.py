"""``[job.checkpoint]`` (issue 41, item 1): the catalog decodes it (hostile values refused, each located), a job is
given ``P2PNODE_CHECKPOINT_DIR`` (absolute, under the sync root) and ``P2PNODE_RESUME_FROM``, and sync sends the
files of checkpoint dirs whatever ``sync.globs`` says, known by their config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from p2pnode.jobs._launch import job_command
from p2pnode.scheduler import CatalogError, catalog_from_text, checkpoint_globs
from p2pnode.sync._source import LocalFiles

BASE = '''[[job]]
name = "train"
kind = "training"
config = "hex8_2p"
argv = ["x", "{config}"]
[job.params.run]
type = "str"
default = "r1"
[job.params.steps]
type = "int"
default = 10
'''


def _catalog(checkpoint: str):
    return catalog_from_text(BASE + "[job.checkpoint]\n" + checkpoint, source="c.toml", base_dir=".")


def _errors(checkpoint: str) -> list[str]:
    with pytest.raises(CatalogError) as exc:
        _catalog(checkpoint)
    return exc.value.errors


def test_checkpoint_table_decodes_with_defaults_and_renders_per_job() -> None:
    t = _catalog('dir = "ckpt/{config}/{run}"\nsignal = "SIGUSR2"\ngrace_s = 30\n').templates["train"]
    assert (t.checkpoint.dir, t.checkpoint.signal, t.checkpoint.grace_s) == ("ckpt/{config}/{run}", "SIGUSR2", 30.0)
    assert t.checkpoint.render_dir({"config": "hex8_2p", "run": "b"}) == "ckpt/hex8_2p/b"
    t = _catalog('dir = "ckpt"\n').templates["train"]
    assert (t.checkpoint.signal, t.checkpoint.grace_s) == (None, 60.0)
    plain = catalog_from_text(BASE, source="c.toml", base_dir=".").templates["train"]
    assert plain.checkpoint is None


@pytest.mark.parametrize(("body", "what"), [
    ('dir = "/etc/cron.d"', "relative to the sync root"),
    ('dir = "../up"', "'..'"),
    ('dir = "a/./b"', "'..'"),
    ('dir = "a//b"', "empty component"),
    ('dir = ".hidden"', "hidden"),
    ('dir = "a\\\\b"', "backslash"),
    ('dir = "a\\u0007b"', "control character"),
    ('dir = "ck/*"', "glob"),
    ('dir = "' + "a" * 257 + '"', "1-256 characters"),
    ('dir = ""', "1-256 characters"),
    ('dir = 3', "required"),
    ('signal = "SIGUSR1"', "dir: required"),
    ('dir = "{catalog_dir}/ck"', "placeholder {catalog_dir}"),
    ('dir = "{python}"', "placeholder {python}"),
    ('dir = "ck/{undeclared}"', "placeholder {undeclared}"),
    ('dir = "ck"\nsignal = "SIGKILL"', "signal: one of SIGUSR1"),
    ('dir = "ck"\nsignal = 10', "signal: one of"),
    ('dir = "ck"\ngrace_s = 0', "grace_s: seconds, 1-3600"),
    ('dir = "ck"\ngrace_s = 1e300', "grace_s"),
    ('dir = "ck"\ngrace_s = nan', "grace_s"),
    ('dir = "ck"\ngrace_s = true', "grace_s"),
    ('dir = "ck"\ncommand = "rm -rf /"', "checkpoint.command: unknown key"),
])
def test_hostile_checkpoint_tables_are_refused_with_their_line(body: str, what: str) -> None:
    errors = _errors(body)
    assert len(errors) == 1 and "job[0] (train).checkpoint" in errors[0] and what in errors[0], errors
    assert errors[0].split(":")[1].isdigit()  # located: a line of the file


def test_a_checkpoint_that_is_not_a_table_is_refused() -> None:
    with pytest.raises(CatalogError) as exc:
        catalog_from_text(BASE.replace("[job.params.run]", 'checkpoint = "ck"\n[job.params.run]'), source="c.toml",
                          base_dir=".")
    assert any("checkpoint: must be a table" in e for e in exc.value.errors)


def test_other_errors_of_the_template_are_listed_beside_the_checkpoints() -> None:
    errors = _errors('dir = "/abs"\n[job.resources]\nnum_gpus = -1\n')
    assert any("resources.num_gpus" in e for e in errors) and any("checkpoint.dir" in e for e in errors)


def test_a_parameter_that_would_leave_the_sync_root_is_refused_at_render() -> None:
    t = _catalog('dir = "ck/{run}"\n').templates["train"]
    for hostile in ("../../etc", "a/../../b", ".ssh", "/abs", "a*"):
        with pytest.raises(ValueError):
            t.checkpoint.render_dir({"config": t.config, "run": hostile})
    with pytest.raises(ValueError):
        job_command(t, {"run": "../../x"}, job_id="1-1", node_id="n", data_dir=Path("/d"), gpus=(),
                    gpu_fraction=0.0, vram_gib=0.0, uuids={})


def test_the_job_gets_its_absolute_checkpoint_dir_and_resume_path(tmp_path: Path) -> None:
    t = _catalog('dir = "ck/{config}/{run}"\n').templates["train"]
    _, env = job_command(t, {"run": "b"}, job_id="1-1", node_id="n", data_dir=tmp_path, gpus=(),
                         gpu_fraction=0.0, vram_gib=0.0, uuids={})
    assert env["P2PNODE_CHECKPOINT_DIR"] == str(tmp_path / "data" / "ck" / "hex8_2p" / "b")
    assert "P2PNODE_RESUME_FROM" not in env
    _, env = job_command(t, {}, job_id="1-1", node_id="n", data_dir=tmp_path, gpus=(), gpu_fraction=0.0,
                         vram_gib=0.0, uuids={}, sync_root=tmp_path / "root", resume_from="/r/step-5.pt")
    assert env["P2PNODE_CHECKPOINT_DIR"] == str(tmp_path / "root" / "ck" / "hex8_2p" / "r1")
    assert env["P2PNODE_RESUME_FROM"] == "/r/step-5.pt"
    plain = catalog_from_text(BASE, source="c.toml", base_dir=".").templates["train"]
    _, env = job_command(plain, {}, job_id="1-1", node_id="n", data_dir=tmp_path, gpus=(), gpu_fraction=0.0,
                         vram_gib=0.0, uuids={})
    assert "P2PNODE_CHECKPOINT_DIR" not in env


def test_sync_sends_checkpoint_files_whatever_the_globs_say(tmp_path: Path) -> None:
    t = _catalog('dir = "ck/{config}/{run}"\n').templates["train"]
    globs = checkpoint_globs({"train": t})
    assert globs == (("hex8_2p", "ck/hex8_2p/*/**"),)
    root = tmp_path / "root"
    (root / "ck" / "hex8_2p" / "r1" / "step-3").mkdir(parents=True)
    (root / "ck" / "hex8_2p" / "r1" / "step-2.bin").write_bytes(b"x" * 100)
    (root / "ck" / "hex8_2p" / "r1" / "step-3" / "model.safetensors.part").write_bytes(b"y" * 100)
    (root / "ck" / "hex8_2p" / "r1" / ".step-4.tmp").write_bytes(b"z")  # being written: hidden, never synced
    (root / "ck" / "other").mkdir()
    (root / "ck" / "other" / "x.bin").write_bytes(b"x")
    (root / "games.db.bin").write_bytes(b"x")
    lf = LocalFiles(root, globs=("**/*.npz",), append_globs=(), state_dir=tmp_path / ".sync", settle_s=0.0)
    mtime = os.stat(root / "games.db.bin").st_mtime
    assert lf.scan(now=mtime + 10) == {}
    lf.set_checkpoint_globs(globs)
    files = lf.scan(now=mtime + 10)
    assert sorted(files) == ["ck/hex8_2p/r1/step-2.bin", "ck/hex8_2p/r1/step-3/model.safetensors.part"]
    assert {lf.checkpoint_config(p) for p in files} == {"hex8_2p"}
    assert lf.checkpoint_config("ck/other/x.bin") is None
