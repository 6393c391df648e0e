"""scripts/checkpoint_guard.py resumes from the newest intact checkpoint (checkpoint_last.pt, then the epoch and
update checkpoints, newest first, then checkpoint_best.pt), says which, and never lets a run start afresh while
the directory holds checkpoints."""
import subprocess
import sys

import pytest
import torch

from conftest import REPO, env


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A torch checkpoint file (the guard reads only the zip archive, whatever the model)."""
    path = tmp_path_factory.mktemp("ckpt") / "model.pt"
    torch.save({"model": {"w": torch.arange(4096.0)}, "optimizer_history": [{"num_updates": 7}]}, path)
    return path


def guard(save):
    return subprocess.run([sys.executable, "scripts/checkpoint_guard.py", str(save)], cwd=REPO, env=env(),
                          text=True, capture_output=True)


def put(save, ckpt, **files):
    """files: name -> 'intact' (a copy of a real checkpoint) or 'truncated' (its first half)."""
    save.mkdir(exist_ok=True)
    data = ckpt.read_bytes()
    for name, how in files.items():
        (save / f"{name}.pt").write_bytes(data if how == "intact" else data[: len(data) // 2])


def test_truncated_last_resumes_from_best(ckpt, tmp_path):
    """The case that lost all progress: only checkpoint_best.pt is intact."""
    put(tmp_path, ckpt, checkpoint_last="truncated", checkpoint_best="intact")
    proc = guard(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"checkpoint_guard: {tmp_path}/checkpoint_last.pt was truncated (kept as checkpoint_last.pt.damaged); "
        "resuming from checkpoint_best.pt (copied to checkpoint_last.pt)"]
    assert (tmp_path / "checkpoint_last.pt").read_bytes() == ckpt.read_bytes()
    assert (tmp_path / "checkpoint_last.pt.damaged").exists()


def test_epoch_and_update_checkpoints_come_before_best_newest_first(ckpt, tmp_path):
    put(tmp_path, ckpt, checkpoint_last="truncated", checkpoint_best="intact", checkpoint2="intact",
        checkpoint_3_120="intact", checkpoint3="truncated")
    proc = guard(tmp_path)
    assert proc.stdout.strip().endswith("resuming from checkpoint_3_120.pt (copied to checkpoint_last.pt)"), proc.stdout


def test_missing_last_resumes_from_the_others(ckpt, tmp_path):
    """fairseq itself would start from update 0 without checkpoint_last.pt."""
    put(tmp_path, ckpt, checkpoint4="intact")
    proc = guard(tmp_path)
    assert proc.stdout.splitlines() == [f"checkpoint_guard: {tmp_path}/checkpoint_last.pt is missing; resuming from "
                                        "checkpoint4.pt (copied to checkpoint_last.pt)"]
    assert (tmp_path / "checkpoint_last.pt").exists()


def test_intact_last_is_named(ckpt, tmp_path):
    put(tmp_path, ckpt, checkpoint_last="intact", checkpoint_best="intact")
    assert guard(tmp_path).stdout.splitlines() == [f"checkpoint_guard: resuming from {tmp_path}/checkpoint_last.pt"]


def test_nothing_intact_refuses_to_start_afresh(ckpt, tmp_path):
    put(tmp_path, ckpt, checkpoint_last="truncated", checkpoint_best="truncated")
    proc = guard(tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"checkpoint_guard: {tmp_path}/checkpoint_last.pt was truncated (kept as checkpoint_last.pt.damaged) and its "
        f"other checkpoints (checkpoint_best.pt) are unreadable too: not starting afresh; to train from update 0, "
        f"move the checkpoints out of {tmp_path}"]
    assert guard(tmp_path).returncode == 1  # a rerun too: the damaged file set aside still counts


def test_an_empty_directory_is_a_first_start(tmp_path):
    proc = guard(tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == [f"checkpoint_guard: no checkpoint in {tmp_path}: training starts from update 0"]
