"""Kill and resume: a training run SIGKILLed mid-epoch, after a mid-epoch checkpoint, and rerun with the same
command continues from checkpoint_last.pt and ends exactly where an uninterrupted run ends.

Why exactly (bit-identical parameters, identical losses), and not merely close: fairseq's checkpoint holds the
model, the optimizer state (Adam moments and step), the lr scheduler, the update count and the data iterator's
position inside the epoch (iterations_in_epoch; the epoch's batch order is a function of seed + epoch), and
the trainer reseeds torch before every update with seed + num_updates (Trainer._set_seed), so dropout masks do
not depend on what ran before in the process. With --num-workers 0 on CPU every kernel is deterministic, so the
updates after the resume repeat the uninterrupted run's operations one for one (every run uses one intra-op
thread, small_task.ONE_THREAD). Mid-epoch checkpoints come
from --save-interval-updates; fairseq validates at each of them in both runs alike (validation does not touch
the RNG that training uses, since training reseeds).
"""
import re

import pytest

from helpers.small_task import (assert_same_model, kill_group, last_valid_loss, run1, small_data, start, train_cmd,
                        wait_for)

SAVE_EVERY = 6  # the kill comes right after the checkpoint of update 6 (an epoch has ~40 updates)
MAX_UPDATE = 16


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def train_losses(log):
    """{update: training loss as logged} from --log-interval 1 train_inner lines."""
    lines = re.findall(r"train_inner \| epoch \d+:.*?loss=([0-9.]+),.*?num_updates=(\d+)", log)
    return {int(n): loss for loss, n in lines}


def kill_and_resume(data, tmp_path, arch, *extra):
    """(log of the uninterrupted run, log of the resumed run); checks the kill and the resume point."""
    args = (arch, *extra, "--save-interval-updates", str(SAVE_EVERY), "--dropout", "0.1")
    ref_dir, dir_ = tmp_path / "uninterrupted", tmp_path / "killed"
    ref_log = run1(train_cmd(data, ref_dir, *args, max_update=MAX_UPDATE)).stdout

    cmd = train_cmd(data, dir_, *args, max_update=MAX_UPDATE)
    log_path = tmp_path / "killed.log"
    proc = start(cmd, log_path)
    saved = re.compile(rf"Saved checkpoint \S*checkpoint_1_{SAVE_EVERY}\.pt")
    wait_for(lambda: saved.search(log_path.read_text()), proc, what="the first mid-epoch checkpoint")
    kill_group(proc)
    killed_log = log_path.read_text()
    assert proc.returncode == -9
    assert "done training" not in killed_log and f"num_updates={MAX_UPDATE}," not in killed_log, \
        "the run finished before the kill: no interruption was tested"

    resumed_log = run1(cmd).stdout  # the very same command
    assert re.search(rf"Loaded checkpoint \S*killed/checkpoint_last\.pt \(epoch 1 @ {SAVE_EVERY} updates\)",
                     resumed_log), resumed_log[-3000:]
    assert re.search(rf"epoch 001:\s+{SAVE_EVERY + 1} / \d+ .*num_updates={SAVE_EVERY + 1},", resumed_log), \
        "the resumed run did not continue inside epoch 1 at the next update"
    assert f"num_updates={MAX_UPDATE}," in resumed_log

    # the same per-update training losses after the resume point, the same final validation loss, and
    # bit-identical final parameters
    ref_losses, resumed_losses = train_losses(ref_log), train_losses(resumed_log)
    assert min(resumed_losses) == SAVE_EVERY + 1
    assert resumed_losses == {u: ref_losses[u] for u in range(SAVE_EVERY + 1, MAX_UPDATE + 1)}
    assert last_valid_loss(resumed_log) == last_valid_loss(ref_log)
    assert_same_model(ref_dir / "checkpoint_last.pt", dir_ / "checkpoint_last.pt")
    return ref_log, resumed_log


def test_transformer_resumes_exactly_after_sigkill(data, tmp_path):
    kill_and_resume(data, tmp_path, "transformer_tiny")


def test_floater_resumes_exactly_between_two_resolves(data, tmp_path):
    """--floater-update-every 4: the flow re-solves (with gradient for θ) on the forwards of updates whose
    counter is a multiple of 4 and reuses the cached biases, detached, in between. The kill comes after the
    checkpoint of update 6, between the re-solves of updates 4 and 8: the resumed run must reuse the same
    biases the uninterrupted run reuses (the counter and the cache must survive the checkpoint), not re-solve
    with gradient at update 7, which would move θ differently."""
    kill_and_resume(data, tmp_path, "floater_transformer_tiny", "--floater-update-every", "4")
