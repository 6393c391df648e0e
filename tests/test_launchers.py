"""scripts/train.sh and scripts/evaluate.sh on the toy task (CPU): one tiny training run, resumed once, then
evaluated the papers' way (checkpoint averaging, beam search, both BLEU scores, results JSON).
(scripts/train.sbatch on a real Slurm cluster: tests/test_slurm.py.)"""
import json
import sys
import re
import shutil

import pytest

from conftest import BIN, run
from helpers.stand_ins import stand_ins

TRAIN = ["bash", "scripts/train.sh", "toy_recipe", "dataset.max_tokens=1024", "dataset.max_valid_steps=1"]
# one intra-op thread: on a machine shared with other work, two threads per process run many times slower
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def toy_run(toy_data, tmp_path_factory):
    """Two updates; checkpoint_last.pt truncated as if the job had been killed while fairseq copied it; the
    same command to four updates. The toy config keeps update checkpoints every 2 updates, two of them."""
    save = tmp_path_factory.mktemp("toy_run") / "toy_recipe"
    envs = {"CPU": "1", "SAVE_DIR": str(save), **ONE_THREAD}
    args = TRAIN + [f"task.data={toy_data / 'bin'}"]
    first = run(args + ["optimization.max_update=2"], env_extra=envs).stdout
    assert (save / "checkpoint_last.pt").is_file() and (save / "checkpoint_1_2.pt").is_file()
    last = save / "checkpoint_last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    second = run(args + ["optimization.max_update=4"], env_extra=envs).stdout
    return save, first, second


def test_train_sh_trains_rescales_and_resumes(toy_run):
    save, first, second = toy_run
    # the toy config states its batch for 2 processes: one CPU process accumulates 2 batches per update
    assert "'update_freq': [2]" in first and "'distributed_world_size': 1" in first and "'fp16': False" in first
    assert list((save / "tb").rglob("events.out.tfevents.*")), "no tensorboard logs"
    assert (save / "hydra" / "rank0" / ".hydra" / "config.yaml").is_file()
    # the rerun replaced the truncated checkpoint_last.pt and resumed from it
    assert "checkpoint_last.pt was truncated" in second and "resuming from checkpoint_1_2.pt" in second
    assert re.search(r"Loaded checkpoint \S*checkpoint_last\.pt \(epoch 1 @ 2 updates\)", second)
    assert (save / "checkpoint_1_4.pt").is_file()
    log = (save / "train.log").read_text()
    assert log.count("done training") == 2 and log.count("train.sh: ") == 2


def test_train_sh_needs_a_gpu_or_cpu_flag(tmp_path):
    proc = run(["bash", "scripts/train.sh", "toy_recipe"], check=False,
               env_extra={"CUDA_VISIBLE_DEVICES": "", "SAVE_DIR": str(tmp_path / "x")})
    assert proc.returncode == 1 and "CPU=1" in proc.stdout
    # set empty hides every GPU; it was reported as "unset", which hides none
    assert "no GPU visible (CUDA_VISIBLE_DEVICES is set empty, which hides every GPU)" in proc.stdout, proc.stdout
    missing = run(["bash", "scripts/train.sh", "no_such_config"], check=False)
    assert missing.returncode == 2 and "no config" in missing.stdout


@pytest.fixture(scope="module")
def eval_data(toy_data, tmp_path_factory):
    """A prepare_wmt14.sh-shaped data directory with the toy task's model inputs but only 30 test and valid
    sentences (beam search with an untrained model is slow)."""
    out = tmp_path_factory.mktemp("eval_data")
    (out / "raw").mkdir()
    (out / "spm").mkdir()
    shutil.copy(toy_data / "spm.model", out / "spm.model")
    for split in ("test", "valid"):
        for lang in ("src", "tgt"):
            for kind in ("raw", "spm"):
                head = (toy_data / kind / f"{split}.{lang}").read_text().splitlines(keepends=True)[:30]
                (out / kind / f"{split}.{lang}").write_text("".join(head))
    run([str(BIN / "fairseq-preprocess"), "-s", "src", "-t", "tgt", "--srcdict", str(toy_data / "bin" / "dict.src.txt"),
         "--tgtdict", str(toy_data / "bin" / "dict.tgt.txt"), "--testpref", str(out / "spm" / "test"),
         "--validpref", str(out / "spm" / "valid"), "--destdir", str(out / "bin"), "--workers", "1"])
    return out


def test_evaluate_sh_averages_generates_scores(toy_run, eval_data, tmp_path):
    save = toy_run[0]
    results = tmp_path / "results"
    envs = {"SAVE_DIR": str(save), "RESULTS_DIR": str(results), **ONE_THREAD}
    run(["bash", "scripts/evaluate.sh", "toy_recipe", "--data-dir", str(eval_data), "--cpu"], env_extra=envs)
    result = json.loads((results / "toy_recipe.json").read_text())
    # the config keeps 2 update checkpoints, so they are what is averaged
    assert result["checkpoints_averaged"] == "checkpoint_1_2.pt,checkpoint_1_4.pt"
    assert result["num_checkpoints_averaged"] == "2"
    assert result["checkpoint"] == str(save / "checkpoint_avg_last2_updates.pt")
    assert result["sentences"] == 30 and result["testset"] == "newstest2014" and result["subset"] == "test"
    assert result["sacrebleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert 0 <= result["bleu"] <= 100 and 0 <= result["bleu_tokenized"] <= 100
    assert (result["beam"], result["lenpen"]) == ("4", "0.6")
    assert result["config"] == "configs/toy_recipe.yaml" and result["experiment"] == "toy_recipe"
    assert re.fullmatch(r"[0-9a-f]{40}(\+uncommitted-changes)?", result["git_commit"])
    assert len((save / "eval" / "newstest2014.hyp").read_text().splitlines()) == 30

    # the dev set, from checkpoint_last.pt alone, goes to its own file
    run(["bash", "scripts/evaluate.sh", "toy_recipe", "--data-dir", str(eval_data), "--cpu", "--subset", "valid",
         "--checkpoint-kind", "last"], env_extra=envs)
    valid = json.loads((results / "toy_recipe.newstest2013.json").read_text())
    assert valid["checkpoint"] == str(save / "checkpoint_last.pt") and valid["testset"] == "newstest2013"


def test_evaluate_sh_names_what_is_missing(tmp_path):
    proc = run(["bash", "scripts/evaluate.sh", "toy_recipe", "--data-dir", str(tmp_path)], check=False,
               env_extra={"SAVE_DIR": str(tmp_path / "none")})
    assert proc.returncode == 1
    assert f"evaluate.sh: {tmp_path}/bin/dict.src.txt not found (expected a scripts/prepare_wmt14.sh output" in proc.stdout


@pytest.mark.parametrize("slurm, tasks, world", [
    ({"SLURM_NNODES": "2"}, 2, 16),  # no task count: one task a node, which starts a process per GPU (2 x 8)
    ({"SLURM_NNODES": "2", "SLURM_NTASKS": "16"}, 16, 16),  # one task per GPU
    ({"SLURM_NNODES": "2", "SLURM_NTASKS": "2"}, 2, 16),  # --ntasks-per-node=1
])
def test_train_sh_under_srun_starts_a_task_per_slurm_task(slurm, tasks, world, tmp_path):
    """LAUNCHER=srun (scripts/train.sbatch) on 2 nodes of 8 GPUs: srun starts the allocation's tasks, and fairseq's
    world is every GPU. A stand-in srun prints what it was asked to start; a stand-in python reports 8 GPUs."""
    line = srun_line(tmp_path, slurm)
    assert f"--ntasks={tasks} fairseq-hydra-train" in line
    assert f"distributed_training.distributed_world_size={world}" in line


@pytest.mark.parametrize("tasks", [None, "1", "2"])
def test_train_sh_under_srun_on_cpu(tasks, tmp_path):
    """CPU=1: one gloo process per Slurm task; one task alone runs without fairseq's Slurm detection, which would
    give it a process per GPU (none) and end at once, untrained, with exit status 0."""
    line = srun_line(tmp_path, {"SLURM_NNODES": "1", **({"SLURM_NTASKS": tasks} if tasks else {}), "CPU": "1"})
    world = int(tasks or 1)
    assert f"--ntasks={world} fairseq-hydra-train" in line and f"distributed_world_size={world}" in line
    assert ("distributed_port=" in line) == (world > 1) and ("distributed_backend=gloo" in line) == (world > 1)


def srun_line(tmp_path, slurm):
    fake = stand_ins(tmp_path / "bin", {
        "srun": 'echo "srun $*"\n',
        "python": f'case "$*" in *device_count*) echo 8 ;; *) exec {sys.executable} "$@" ;; esac\n'})
    proc = run(["bash", "scripts/train.sh", "toy_recipe", "optimization.update_freq=[1]"], check=False, env_extra={
        **slurm, "LAUNCHER": "srun", "SLURM_JOB_ID": "7", "PY": str(fake / "python"), "SAVE_DIR": str(tmp_path / "s"),
        "PATH": f"{fake}:{BIN}:/usr/bin:/bin"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("srun ")]
    assert lines, proc.stdout
    return lines[0]
