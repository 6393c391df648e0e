"""scripts/train.sbatch on a real (one-node, localhost) Slurm cluster: two CPU tasks training over gloo, a
preemption signal that makes the job requeue itself, `scontrol requeue`, and every restart resuming from
checkpoint_last.pt, exactly: a run preempted (or requeued by scontrol mid-epoch) ends with the parameters, bit for
bit, of the same job run uninterrupted (why exactly: tests/test_resume.py; gloo's all-reduce of the two ranks'
gradients adds them in the same order in every run).

One job, three runs:
1. submitted with --ntasks=2 (max_update 12, a checkpoint every 2 updates); once checkpoint_1_2.pt exists,
   `scancel --signal=USR1 --batch` does what Slurm does before a time limit or a preemption: the script's trap
   stops training and requeues the job (scontrol requeue from inside);
2. the requeued run resumes from checkpoint_last.pt (between 2 and 12 updates) and finishes at 12 updates;
3. `scontrol requeue` of the completed job (once its credential has expired, as any later requeue on a real
   cluster) runs it again, and it resumes from the 12-update checkpoint.
"""
import re

import pytest
import torch

from conftest import REPO, env
from helpers.slurm_cluster import SlurmCluster, SlurmUnavailable, ended, ensure_installed, free_port
from helpers.small_task import assert_same_model

pytestmark = pytest.mark.slurm
MAX_UPDATE = 12  # enough updates after the first checkpoint for the signal to arrive mid-training


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    try:
        ensure_installed()
    except SlurmUnavailable as err:
        pytest.skip(f"no Slurm: {err}")
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


def updates_in(checkpoint):
    from fairseq.checkpoint_utils import torch_load_checkpoint

    with open(checkpoint, "rb") as f:
        return torch_load_checkpoint(f, map_location=torch.device("cpu"))["optimizer_history"][-1]["num_updates"]


def submit(cluster, toy_data, save, out):
    """Two gloo tasks train the toy recipe to MAX_UPDATE updates, a checkpoint every 2."""
    return cluster.submit(
        "--ntasks=2", f"--output={out}", f"--chdir={REPO}", "scripts/train.sbatch", "toy_recipe",
        f"task.data={toy_data / 'bin'}", f"optimization.max_update={MAX_UPDATE}", "dataset.max_tokens=1024",
        "dataset.max_valid_steps=1",
        env={**env(), "CPU": "1", "PORT": str(free_port()), "SAVE_DIR": str(save), "OMP_NUM_THREADS": "1"},
        cwd=REPO)


@pytest.fixture(scope="module")
def uninterrupted(cluster, toy_data, tmp_path_factory):
    """checkpoint_last.pt of the same job run without interruption."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    job = submit(cluster, toy_data, tmp / "ckpt", tmp / "job.out")
    info = cluster.wait(job, ended, timeout=150, output=tmp / "job.out")
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", cluster.diagnostics(tmp / "job.out")
    return tmp / "ckpt" / "checkpoint_last.pt"


def test_sbatch_preempt_requeue_resume(cluster, toy_data, uninterrupted, tmp_path):
    save, out = tmp_path / "ckpt", tmp_path / "job.out"
    job = submit(cluster, toy_data, save, out)

    def log():
        return out.read_text(errors="replace") if out.exists() else ""

    # run 1: two ranks train; the preemption signal makes the job stop and requeue itself
    cluster.wait(job, lambda i: (save / "checkpoint_1_2.pt").exists() or i.get("JobState") not in ("PENDING", "RUNNING"),
                 timeout=120, poll=0.2, release_after=None, output=out)
    assert (save / "checkpoint_1_2.pt").exists(), f"no checkpoint after 2 updates:\n{cluster.diagnostics(out)}"
    assert "initialized host" in log() and "as rank 1" in log(), "the second task did not join"
    cluster.client("scancel", "--signal=USR1", "--batch", job)

    # run 2: requeued by the job itself, resumes and finishes
    info = cluster.wait(job, lambda i: i.get("Restarts") == "1" and i.get("JobState") == "COMPLETED", timeout=150,
                        output=out)
    text = log()
    assert "USR1 at" in text and "then requeueing job" in text
    assert "restart 1:" in text, text[-2000:]
    train_log = (save / "train.log").read_text()
    resumed = re.findall(r"Loaded checkpoint \S*checkpoint_last\.pt \(epoch \d+ @ (\d+) updates\)", train_log)
    assert resumed and 2 <= int(resumed[0]) < MAX_UPDATE, train_log[-2000:]
    assert f"Stopping training due to num_updates: {MAX_UPDATE} >= max_update: {MAX_UPDATE}" in train_log
    assert updates_in(save / "checkpoint_last.pt") == MAX_UPDATE
    assert info["ExitCode"].startswith("0:")
    assert_same_model(save / "checkpoint_last.pt", uninterrupted)

    # run 3: scontrol requeue of the finished job; it resumes from the final checkpoint
    cluster.let_credential_expire(job)
    cluster.client("scontrol", "requeue", job)
    cluster.wait(job, lambda i: i.get("Restarts") == "2" and i.get("JobState") == "COMPLETED", timeout=120, output=out)
    assert "restart 2:" in log()
    train_log = (save / "train.log").read_text()
    assert re.search(rf"Loaded checkpoint \S*checkpoint_last\.pt \(epoch \d+ @ {MAX_UPDATE} updates\)", train_log)


def test_scontrol_requeue_mid_epoch_resumes_exactly(cluster, toy_data, uninterrupted, tmp_path):
    """`scontrol requeue` of a running job (an administrator's or a preemption without grace time): Slurm ends the
    running script (SIGTERM), the job runs again and resumes from checkpoint_last.pt within the epoch."""
    save, out = tmp_path / "ckpt", tmp_path / "job.out"
    job = submit(cluster, toy_data, save, out)
    cluster.wait(job, lambda i: (save / "checkpoint_1_2.pt").exists() or i.get("JobState") not in ("PENDING", "RUNNING"),
                 timeout=120, poll=0.2, release_after=None, output=out)
    cluster.client("scontrol", "requeue", job)
    info = cluster.wait(job, lambda i: i.get("Restarts") == "1" and i.get("JobState") == "COMPLETED", timeout=150,
                        output=out)
    assert info["ExitCode"].startswith("0:")
    train_log = (save / "train.log").read_text()
    resumed = re.findall(r"Loaded checkpoint \S*checkpoint_last\.pt \(epoch (\d+) @ (\d+) updates\)", train_log)
    assert resumed and 2 <= int(resumed[0][1]) < MAX_UPDATE, train_log[-2000:]
    assert resumed[0][0] == "1" and "end of epoch 1 " in train_log.split("Loaded checkpoint")[-1]  # mid-epoch
    assert_same_model(save / "checkpoint_last.pt", uninterrupted)


def test_a_job_without_gpus_fails_and_says_so(cluster, tmp_path):
    """A training asked of Slurm without GPUs (no --gpus, CPU unset): train.sh stops with one line naming what to
    ask for, and the job ends FAILED (it computed a world of 0 GPUs, "division by 0", and ended COMPLETED untrained)."""
    out = tmp_path / "job.out"
    job = cluster.submit(f"--output={out}", f"--chdir={REPO}", "scripts/train.sbatch", "toy_recipe",
                         env={**{k: v for k, v in env().items() if k != "CPU"}, "SAVE_DIR": str(tmp_path / "ckpt")},
                         cwd=REPO)
    info = cluster.wait(job, ended, timeout=120, release_after=None, output=out)
    log = out.read_text(errors="replace")
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", cluster.diagnostics(out)
    assert (f"train.sh: job {job} has no GPU (CUDA_VISIBLE_DEVICES=unset); ask sbatch for GPUs (e.g. "
            "--gpus-per-node=8) or set CPU=1 to train on CPU") in log, log
    assert "division by 0" not in log and not (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def test_a_completing_job_has_not_ended():
    """COMPLETING (processes exited, the node not yet released) comes before COMPLETED or FAILED: a wait that took
    it for an end read the job's state too early and failed a job that then completed."""
    assert not ended({"JobState": "COMPLETING"}) and not ended({}) and not ended({"JobState": "REQUEUED"})
    assert ended({"JobState": "COMPLETED"}) and ended({"JobState": "FAILED"}) and ended({"JobState": "CANCELLED"})
