"""scripts/submit_paper.py under the faults a user meets, on the suite's one-node Slurm (real sbatch): a kill between
two accepted jobs (SIGTERM, SIGHUP, SIGKILL), a manifest that cannot be written, a mistyped override, a relative
data folder from another directory, and a dry run whose printed lines are run as a script. What must hold: no
rerun queues a job twice, nothing fails only after the queue wait, a refusal leaves nothing behind.

Jobs are queued with --hold (they never run) and a --comment of the test's own, and cancelled at the end.
"""
import json
import os
import re
import resource
import signal
import subprocess
import sys

import pytest

from conftest import REPO, env
from helpers.slurm_cluster import which
from helpers.stand_ins import stand_ins
from test_slurm import cluster  # noqa: F401  (the module's cluster fixture)
from test_submit_paper import DE_R, DE_T, DE_W, cancel, queued, some_data

pytestmark = pytest.mark.slurm
ALL_JOBS = sorted([f"train-{DE_T}", f"eval-{DE_T}-newstest2014", f"train-{DE_R}", f"eval-{DE_R}-newstest2014",
                   f"eval-{DE_R}-newstest2013", "tables"])


def submit_cmd(tmp_path, comment, *extra):
    return [sys.executable, "scripts/submit_paper.py", DE_T, DE_R, *some_data(tmp_path),
            f"--sbatch=--hold --comment={comment}", *extra]


def killing_sbatch(tmp_path, signame, after):
    """An sbatch that queues through the real one and, once the controller has accepted job number `after`, sends
    `signame` to its caller (submit_paper.py) before it prints the job id: a kill between two accepted jobs, at
    the worst moment (for SIGKILL: accepted, not yet recorded)."""
    return stand_ins(tmp_path / "bin", {"sbatch": f"""
out=$({which("sbatch")} "$@") || exit $?
n=$(( $(cat {tmp_path}/n 2>/dev/null || echo 0) + 1 )); echo $n > {tmp_path}/n
if [ "$n" = "{after}" ]; then kill -{signame} $PPID; sleep 1; fi
echo "$out"
"""})


def tracked(tmp_path):
    manifest = json.loads((tmp_path / "ckpt" / "submit_paper.json").read_text())
    jobs = {j for c in manifest["cells"].values() for j in [c["train"], *c["eval"].values()] if j}
    return jobs | ({manifest["tables"]} if manifest.get("tables") else set())


@pytest.mark.parametrize("signame", ["TERM", "HUP"])
def test_a_signal_between_two_accepted_jobs_loses_none(cluster, tmp_path, signame):  # noqa: F811
    """SIGTERM or SIGHUP (an ssh connection that drops) while sbatch queues the second job: the job is recorded, the
    submission stops in one line, and the rerun queues the rest, each job once (it left 13 jobs queued and no
    manifest; the rerun queued those 13 again)."""
    comment = f"signal-{signame}-{tmp_path.name}"
    e = {**env(), **cluster.env}
    killer = killing_sbatch(tmp_path, signame, after=2)
    try:
        stopped = subprocess.run(submit_cmd(tmp_path, comment), cwd=REPO, capture_output=True, text=True,
                                 env={**e, "PATH": f"{killer}:{e['PATH']}"}, timeout=120)
        signum = getattr(signal, f"SIG{signame}")
        assert stopped.returncode == 128 + signum, stopped.stderr + stopped.stdout
        assert stopped.stderr.strip() == (
            f"submit_paper.py: stopped by SIG{signame} after queueing what {tmp_path / 'ckpt' / 'submit_paper.json'} "
            "records; rerun the same command to queue the rest"), stopped.stderr
        first = queued(cluster, comment)
        assert len(first) == 2 and tracked(tmp_path) == set(first), (first, stopped.stdout)
        assert all(f"job {j} queued" in stopped.stdout for j in first), stopped.stdout
        rerun = subprocess.run(submit_cmd(tmp_path, comment), cwd=REPO, env=e, capture_output=True, text=True,
                               timeout=120)
        assert rerun.returncode == 0, rerun.stderr
        jobs = queued(cluster, comment)
        assert sorted(jobs.values()) == ALL_JOBS, (jobs, rerun.stdout)
        assert tracked(tmp_path) == set(jobs)
    finally:
        cancel(cluster, comment)


def test_sigkill_after_an_accepted_job_is_found_by_the_rerun(cluster, tmp_path):  # noqa: F811
    """SIGKILL right after the controller accepted the second job, before the script could record it: the rerun
    finds that job in the queue by its name and log folder, records it and queues only the rest."""
    comment = f"sigkill-{tmp_path.name}"
    e = {**env(), **cluster.env}
    killer = killing_sbatch(tmp_path, "KILL", after=2)
    try:
        killed = subprocess.run(submit_cmd(tmp_path, comment), cwd=REPO, capture_output=True, text=True,
                                env={**e, "PATH": f"{killer}:{e['PATH']}"}, timeout=120)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        first = queued(cluster, comment)
        assert len(first) == 2 and len(tracked(tmp_path)) == 1, first
        lost = (set(first) - tracked(tmp_path)).pop()
        rerun = subprocess.run(submit_cmd(tmp_path, comment), cwd=REPO, env=e, capture_output=True, text=True,
                               timeout=120)
        assert rerun.returncode == 0, rerun.stderr
        assert f"{first[lost]}: job {lost} is queued but was not recorded" in rerun.stdout, rerun.stdout
        jobs = queued(cluster, comment)
        assert sorted(jobs.values()) == ALL_JOBS, (jobs, rerun.stdout)
        assert tracked(tmp_path) == set(jobs)
        assert not (tmp_path / "ckpt" / "submit_paper.json.lock").exists()
    finally:
        cancel(cluster, comment)


def small_files_only():
    """In the child: files may not grow past 100 bytes (a full disk for the manifest, not for the lock's line)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))


def test_a_manifest_that_cannot_be_written_stops_the_submission(cluster, tmp_path):  # noqa: F811
    """The manifest's write fails (a full disk) once sbatch accepted the first job: one line saying so, nothing
    more queued, and the rerun records that job from the queue instead of queueing it again (it was: every job
    accepted, a traceback, no manifest, and the rerun queued them all again)."""
    comment = f"full-{tmp_path.name}"
    e = {**env(), **cluster.env, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        full = subprocess.run(submit_cmd(tmp_path, comment), cwd=REPO, env=e, capture_output=True, text=True,
                              preexec_fn=small_files_only, timeout=120)
        first = queued(cluster, comment)
        assert full.returncode == 1 and len(first) == 1, (full.stderr, first)
        (job, name), = first.items()
        assert full.stderr.strip() == (
            f"submit_paper.py: --manifest {tmp_path / 'ckpt' / 'submit_paper.json'}: cannot write it (File too "
            f"large); job {job} is queued and recorded only in Slurm's queue: free the space and rerun the same "
            "command, which finds the queued jobs of this submission by their names and queues each job once"), full.stderr
        rerun = subprocess.run(submit_cmd(tmp_path, comment), cwd=REPO, env=e, capture_output=True, text=True,
                               timeout=120)
        assert rerun.returncode == 0 and f"{name}: job {job} is queued but was not recorded" in rerun.stdout, rerun
        jobs = queued(cluster, comment)
        assert sorted(jobs.values()) == ALL_JOBS and tracked(tmp_path) == set(jobs), jobs
    finally:
        cancel(cluster, comment)


def test_a_relative_data_folder_reaches_the_jobs_as_an_absolute_path(cluster, tmp_path):  # noqa: F811
    """--override task.data=DIR relative to the caller's directory (not the repository's, where the jobs run):
    the training job gets the absolute path, and so does the evaluation's --data-dir (the job failed with
    FileNotFoundError after its queue wait)."""
    comment = f"relative-{tmp_path.name}"
    (tmp_path / "data" / "bin").mkdir(parents=True)
    try:
        proc = subprocess.run(
            [sys.executable, str(REPO / "scripts" / "submit_paper.py"), DE_T, "--checkpoints", "ckpt",
             "--results", "results", "--override=task.data=data/bin", "--eval-args=--data-dir data",
             f"--sbatch=--hold --comment={comment}"], cwd=tmp_path, env={**env(), **cluster.env},
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        jobs = {name: job for job, name in queued(cluster, comment).items()}
        train = cluster.client("scontrol", "show", "job", jobs[f"train-{DE_T}"]).stdout
        assert re.search(rf"Command=\S*scripts/train\.sbatch {DE_T} task\.data={tmp_path / 'data' / 'bin'}\b", train), train
        manifest = json.loads((tmp_path / "ckpt" / "submit_paper.json").read_text())
        assert f"--data-dir {tmp_path / 'data'}'" in proc.stdout and manifest["cells"][DE_T]["train"]
    finally:
        cancel(cluster, comment)


def test_a_mistyped_override_is_refused_before_any_job_and_leaves_nothing(cluster, tmp_path):  # noqa: F811
    """optimization.max_updat=4 (a typo) and a value of the wrong type: Hydra composes every cell before the first
    sbatch, and the one line names the override and the cell (each training failed with Hydra's "Could not
    override" after its queue wait); no folder, lock or manifest is left behind."""
    comment = f"typo-{tmp_path.name}"
    cases = [("optimization.max_updat=4", "Could not override 'optimization.max_updat' (Key 'max_updat' not in "
                                          "'OptimizationConfig')"),
             ("optimization.max_update=four", "Error merging override optimization.max_update=four (Value 'four' "
                                              "of type 'str' could not be converted to Integer")]
    try:
        for override, says in cases:
            proc = subprocess.run(submit_cmd(tmp_path, comment, f"--override={override}"), cwd=REPO,
                                  env={**env(), **cluster.env}, capture_output=True, text=True, timeout=120)
            assert proc.returncode == 1 and proc.stderr.startswith(
                f"submit_paper.py: --override {override}: {DE_T}: {says}"), proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert queued(cluster, comment) == {} and not (tmp_path / "ckpt").exists()
    finally:
        cancel(cluster, comment)


def test_the_dry_run_is_a_script_that_queues_the_plan(cluster, tmp_path):  # noqa: F811
    """Without the data folders and with a --checkpoints folder that does not exist yet: a warning per missing
    folder, and the printed plan, run by bash as it is, makes the folder and queues every job with its
    dependencies (its lines failed: no such folder, and dependencies on made-up ids)."""
    comment = f"dry-{tmp_path.name}"
    ckpt = tmp_path / "new" / "ckpt"
    dry = subprocess.run([sys.executable, "scripts/submit_paper.py", DE_T, DE_W, "--dry-run", "--checkpoints",
                          str(ckpt), "--results", str(tmp_path / "results"),
                          f"--override=task.data={tmp_path / 'none'}", f"--sbatch=--hold --comment={comment}"],
                         cwd=REPO, env={**env(), **cluster.env}, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    warnings = dry.stderr.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("submit_paper.py: warning: ") for w in warnings), dry.stderr
    assert f"{DE_W}: no data folder {tmp_path / 'none'}" in warnings[1], warnings
    assert not ckpt.exists()
    try:
        ran = subprocess.run(["bash", "-euo", "pipefail"], input=dry.stdout, env={**env(), **cluster.env},
                             capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr + dry.stdout
        jobs = {name: job for job, name in queued(cluster, comment).items()}
        assert sorted(jobs) == sorted([f"train-{DE_T}", f"eval-{DE_T}-newstest2014", f"train-{DE_W}",
                                       f"eval-{DE_W}-newstest2014", "tables"]), jobs
        assert cluster.job(jobs[f"train-{DE_W}"])["Dependency"].startswith(f"afterok:{jobs[f'train-{DE_T}']}")
        assert ckpt.is_dir() and not (ckpt / "submit_paper.json").exists()
    finally:
        cancel(cluster, comment)


def test_a_refusal_before_the_first_job_leaves_no_folder_or_lock(tmp_path):
    """An invalid partition refused at the first sbatch: no checkpoints folder, lock file or manifest remains
    (they did: an empty folder with submit_paper.json.lock)."""
    fake = stand_ins(tmp_path / "bin", {"sbatch": "echo 'sbatch: error: invalid partition specified: x' >&2; exit 1\n",
                                         "squeue": "exit 0\n"})
    proc = subprocess.run([sys.executable, "scripts/submit_paper.py", DE_T, *some_data(tmp_path)], cwd=REPO,
                          env={**env(), "PATH": f"{fake}:{os.environ['PATH']}"}, capture_output=True, text=True)
    assert proc.returncode == 1 and "invalid partition" in proc.stderr, proc.stderr
    assert not (tmp_path / "ckpt").exists()
