"""scripts/submit_paper.py on a real (one-node, localhost) Slurm cluster: the papers' job graph (training, FLOATER's
warm start after its Transformer, evaluations, the tables last) for five WMT14 cells shrunk to the toy task on CPU.

Two cells train and evaluate (a Transformer on newstest2014, Shaw's relative on newstest2013), one warm start converts
the Transformer's checkpoint and trains after it; En-Fr's Transformer fails (the toy data has no French dictionary),
so its evaluation and its warm start are cancelled, and the table names all three holes and why. A rerun while the
jobs run submits nothing; one after the end submits nothing for what finished, and only the evaluation for a cell
whose training ended.
"""
import json
import re
import subprocess
import sys
import time

import pytest

from conftest import REPO, env, run
from helpers.slurm_cluster import ended, which
from helpers.stand_ins import stand_ins
from test_slurm import cluster  # noqa: F401  (the module's cluster fixture)

DE_T, DE_R, DE_W = "wmt14_en_de_base_transformer", "wmt14_en_de_base_relative", "wmt14_en_de_base_floater_all_warm"
FR_T, FR_W = "wmt14_en_fr_base_transformer", "wmt14_en_fr_base_floater_all_warm"
CELLS = [DE_T, DE_R, DE_W, FR_T, FR_W]


def paper_numbers(path):
    table = {"source": "toy", "row_header": ["scheme"], "columns": ["En-De", "En-Fr"]}
    path.write_text(json.dumps({"metric": "bleu_tokenized", "tables": [
        {**table, "title": "Toy FLOATER table", "testset": "newstest2014", "rows": [
            {"label": ["Transformer"], "cells": [{"experiment": DE_T, "paper": 27.3}, {"experiment": FR_T, "paper": 38.1}]},
            {"label": ["FLOATER (warm)"], "cells": [{"experiment": DE_W, "paper": 28.6}, {"experiment": FR_W, "paper": 41.6}]}]},
        {**table, "title": "Toy Shaw ablation", "testset": "newstest2013", "columns": ["En-De"], "rows": [
            {"label": ["relative"], "cells": [{"experiment": DE_R, "paper": 25.8}]}]}]}))
    return path


@pytest.mark.slurm
@pytest.mark.slow
def test_the_paper_chain_runs_names_its_holes_and_resubmits_nothing(cluster, tmp_path):  # noqa: F811
    """Through the documented try-out (scripts/demos/slurm_tryout.sh), with two En-Fr cells added that fail."""
    ckpts = tmp_path / "tryout"  # the try-out's OUT: data/, the cells' folders, the logs, the manifest, results/
    results = ckpts / "results"
    # the En-Fr cells train on the try-out's En-De folder (its task.data override), which has no French dictionary
    common = ["--paper-numbers", str(paper_numbers(tmp_path / "paper.json"))]
    e = {**env(), **cluster.env, "OUT": str(ckpts)}

    def submit(*cells, extra=()):
        proc = subprocess.run(["bash", "scripts/demos/slurm_tryout.sh", *common, *extra],
                              cwd=REPO, env={**e, "CELLS": " ".join(cells)}, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        return proc.stdout

    started = time.time()
    first = submit(*CELLS)
    assert f"{DE_W}: training after job" in first and f"{DE_R}: evaluation on newstest2013" in first
    manifest = json.loads((ckpts / "submit_paper.json").read_text())
    jobs = manifest["cells"]
    assert re.search(rf"{DE_W}: training after job {jobs[DE_T]['train']} \({DE_T}\)", first)
    assert set(jobs[DE_R]["eval"]) == {"newstest2013"} and set(jobs[DE_T]["eval"]) == {"newstest2014"}
    # a rerun while the En-De jobs are queued or running submits none of them again
    again = submit(DE_T, DE_R, DE_W)
    assert "nothing to submit" in again and "sbatch " not in again, again
    # each is still queued or running, or (a slow rerun on a loaded machine) already done
    assert all(re.search(rf"^{c}: (queued or running .*: not submitted again|done \()", again, flags=re.M)
               for c in (DE_T, DE_R, DE_W)), again

    tables = manifest["tables"]
    info = cluster.wait(tables, ended, timeout=900, poll=2, release_after=None, output=ckpts / f"slurm-tables-{tables}.out")
    wall = time.time() - started
    assert info["JobState"] == "COMPLETED", cluster.diagnostics(ckpts / f"slurm-tables-{tables}.out")
    logs = {p.name: p.read_text(errors="replace")[-1500:] for p in ckpts.glob("slurm-*.out")}
    for cell, testset in ((DE_T, "newstest2014"), (DE_W, "newstest2014"), (DE_R, "newstest2013")):
        name = f"{cell}.json" if testset == "newstest2014" else f"{cell}.{testset}.json"
        assert (results / name).is_file(), f"{name} missing; logs: {logs}"
        assert json.loads((results / name).read_text())["testset"] == testset
    warm_log = (ckpts / DE_W / "train.log").read_text()
    assert "warm_start.pt" in warm_log and (ckpts / DE_W / "warm_start.pt").is_file()

    text = (results / "tables.md").read_text()
    assert re.search(r"\| Transformer \| \d+\.\d\d \(27\.3, [+-]\d+\.\d\d\) \| not run \(38\.1\) \|", text), text
    assert re.search(r"\| FLOATER \(warm\) \| \d+\.\d\d \(28\.6, [+-]\d+\.\d\d\) \| not run \(41\.6\) \|", text), text
    assert re.search(r"\| relative \| \d+\.\d\d \(25\.8, [+-]\d+\.\d\d\) \|", text), text
    holes = text[text.index("## Cells without a result"):]
    fr_train = jobs[FR_T]["train"]
    assert re.search(rf"- `{FR_T}`: training job {fr_train} FAILED \(exit 1:0\); log \S*slurm-train-{FR_T}-{fr_train}\.out",
                     holes), holes
    assert f"- `{FR_W}`: not started: {FR_T}, whose checkpoint it starts from, did not train (training job {fr_train} FAILED" in holes
    assert holes.count("\n- ") == 2, holes  # the two En-Fr cells, nothing else

    # after the end: nothing for what finished; the failed cells alone again (a retry); only an evaluation for a
    # cell whose training ended
    assert "nothing to submit" in submit(DE_T, DE_R, DE_W)
    (results / f"{DE_R}.newstest2013.json").unlink()
    dry = submit(*CELLS, extra=["--dry-run"])
    assert f"{DE_R}: trained; evaluating" in dry and f"{DE_T}: done" in dry and f"{DE_W}: done" in dry
    submitted = [line for line in dry.splitlines() if re.search(r"\bsbatch --job-name ", line)]
    assert [re.search(r"--job-name (\S+)", s).group(1) for s in submitted] == [
        f"train-{FR_T}", f"eval-{FR_T}-newstest2014", f"eval-{DE_R}-newstest2013", f"train-{FR_W}",
        f"eval-{FR_W}-newstest2014", "tables"], dry
    assert f"{FR_W}: training after job $dry1 ({FR_T})" in dry
    print(f"toy chain: {wall:.0f} s from submission to the table")


def test_bad_cells_get_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/submit_paper.py", "wmt14_en_de_base_nosuch", "--dry-run",
                           "--checkpoints", str(tmp_path)], cwd=REPO, env=env(), capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        "submit_paper.py: wmt14_en_de_base_nosuch: not a WMT14 cell (expected paper, newer or a name from "
        "make_tables.py --list, e.g. wmt14_en_de_base_relative)")


def some_data(tmp_path):
    """submit_paper.py's folders under tmp_path, with an (empty) data folder for the trainings and evaluations."""
    (tmp_path / "data" / "bin").mkdir(parents=True, exist_ok=True)
    return ["--checkpoints", str(tmp_path / "ckpt"), "--results", str(tmp_path / "results"),
            f"--override=task.data={tmp_path / 'data' / 'bin'}", f"--eval-args=--data-dir {tmp_path / 'data'}"]


def test_a_failed_sbatch_keeps_what_was_submitted(tmp_path):
    """sbatch refusing the third job (a QOS limit, say): one line, and the two jobs already queued are in the
    manifest, so the rerun waits for them instead of queueing them twice. Slurm's clients are stand-ins here: what
    is tested is the script's bookkeeping (the real cluster: the test above); the stand-in sbatch also checks that
    each job's log folder exists when it is queued (a job that starts before it does fails at once, no log: seen
    under load on the real cluster)."""
    fake = stand_ins(tmp_path / "bin", {"sbatch": f"""
for a in "$@"; do case "$a" in --output=*) [ -d "$(dirname "${{a#--output=}}")" ] || {{
  echo "stand-in sbatch: $a: no such folder (a real job would fail at once: slurmd cannot open its output)" >&2; exit 1; }} ;;
esac; done
n=$(( $(cat {tmp_path}/n 2>/dev/null || echo 0) + 1 )); echo $n > {tmp_path}/n
[ "$n" = "${{FAIL_AT:-0}}" ] && {{ echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2; exit 1; }}
echo "$*" >> {tmp_path}/submitted; echo $n
""", "scontrol": 'echo "JobId=$4 JobName=x JobState=PENDING Reason=Priority"\n', "squeue": "exit 0\n"})
    e = {**env(), "PATH": f"{fake}:{env()['PATH']}"}
    cmd = [sys.executable, "scripts/submit_paper.py", DE_T, DE_R, *some_data(tmp_path)]
    failed = subprocess.run(cmd, cwd=REPO, env={**e, "FAIL_AT": "3"}, capture_output=True, text=True)
    assert failed.returncode == 1 and failed.stderr.strip() == (
        f"submit_paper.py: sbatch refused train-{DE_R} (its options: --sbatch, --train): "
        "QOSMaxSubmitJobPerUserLimit"), failed.stderr
    jobs = json.loads((tmp_path / "ckpt" / "submit_paper.json").read_text())["cells"]
    assert jobs[DE_T] == {"train": "1", "eval": {"newstest2014": "2"}}
    again = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"{DE_T}: queued or running (jobs 1, 2): not submitted again" in again.stdout
    lines = (tmp_path / "submitted").read_text().splitlines()
    assert [re.search(r"--job-name (\S+)", ln).group(1) for ln in lines] == [
        f"train-{DE_T}", f"eval-{DE_T}-newstest2014", f"train-{DE_R}", f"eval-{DE_R}-newstest2014",
        f"eval-{DE_R}-newstest2013", "tables"]  # Shaw's relative: Table 1 (newstest2014) and the k ablation (2013)
    assert "--dependency=afterany:4:5:6:1:2 " in lines[-1]  # the new jobs (3 was refused), then those waited for


def test_jobs_slurm_has_forgotten_are_submitted_again(tmp_path):
    """Days later scontrol no longer lists the jobs (MinJobAge) and the cluster has no sacct: their cell, still without
    a result, is submitted again (the training resumes from its checkpoint), not refused for the missing tool."""
    fake = stand_ins(tmp_path / "bin", {
        "sbatch": f"n=$(( $(/bin/cat {tmp_path}/n 2>/dev/null || echo 0) + 1 )); echo $n > {tmp_path}/n; echo $n\n",
        "scontrol": "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1\n", "squeue": "exit 0\n"})
    cmd = [sys.executable, "scripts/submit_paper.py", DE_T, *some_data(tmp_path)]
    for n in (1, 2):  # no sacct on this PATH
        proc = subprocess.run(cmd, cwd=REPO, env={**env(), "PATH": str(fake)}, capture_output=True, text=True)
        assert proc.returncode == 0 and f"{DE_T}: training" in proc.stdout, proc.stderr
    assert json.loads((tmp_path / "ckpt" / "submit_paper.json").read_text())["cells"][DE_T]["train"] == "4"


def queued(cluster, comment):
    """{job id: job name} of the jobs queued with --comment=COMMENT (each test's own: the cluster is the module's)."""
    out = cluster.client("squeue", "-h", "-o", "%i %j %k").stdout.split("\n")
    return {i: n for i, n, k in (line.split(" ", 2) for line in out if line.strip()) if k == comment}


def cancel(cluster, comment):
    jobs = queued(cluster, comment)
    if jobs:
        cluster.client("scancel", *jobs, check=False)


@pytest.mark.slurm
def test_two_submissions_at_once_queue_each_job_once(cluster, tmp_path):  # noqa: F811
    """Two submit_paper.py runs at once (each sbatch slowed by a second, so that they overlap): the second waits for
    the first, then finds its jobs queued; every job is queued once and in the manifest (it was: 12 jobs for 6, two
    trainings per cell writing one folder, 6 of them untracked)."""
    comment = f"two-at-once-{tmp_path.name}"
    slow = stand_ins(tmp_path / "bin", {"sbatch": f'sleep 1; exec {which("sbatch")} "$@"\n'})
    e = {**env(), **cluster.env, "PATH": f"{slow}:{env()['PATH']}"}
    cmd = [sys.executable, "scripts/submit_paper.py", DE_T, DE_R, *some_data(tmp_path),
           f"--sbatch=--hold --comment={comment}"]
    try:
        procs = [subprocess.Popen(cmd, cwd=REPO, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
        outs = [p.communicate(timeout=180) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        jobs = queued(cluster, comment)
        names = sorted(jobs.values())
        assert names == sorted([f"train-{DE_T}", f"eval-{DE_T}-newstest2014", f"train-{DE_R}",
                                f"eval-{DE_R}-newstest2014", f"eval-{DE_R}-newstest2013", "tables"]), (names, outs)
        manifest = json.loads((tmp_path / "ckpt" / "submit_paper.json").read_text())
        tracked = {manifest["tables"]} | {j for c in manifest["cells"].values()
                                          for j in [c["train"], *c["eval"].values()]}
        assert tracked == set(jobs), (tracked, jobs)
        second = next(out for out, _ in outs if "nothing to submit" in out)
        assert "waiting for the submission running on" in second, outs
    finally:
        cancel(cluster, comment)


@pytest.mark.slurm
def test_a_refused_evaluation_is_submitted_by_the_rerun(cluster, tmp_path):  # noqa: F811
    """sbatch accepts a training and refuses its evaluation (GPUs asked of a node without any): the rerun with the
    evaluation's options fixed submits the evaluation after the training still queued, and the tables job (it
    said "nothing to submit")."""
    comment = f"partial-{tmp_path.name}"
    e = {**env(), **cluster.env}
    cmd = [sys.executable, "scripts/submit_paper.py", DE_T, *some_data(tmp_path), f"--sbatch=--hold --comment={comment}"]
    try:
        bad = subprocess.run([*cmd, "--eval=--gpus=1"], cwd=REPO, env=e, capture_output=True, text=True)
        assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert bad.stderr.startswith(f"submit_paper.py: sbatch refused eval-{DE_T}-newstest2014 (its options: "
                                     "--sbatch, --eval): "), bad.stderr
        train = json.loads((tmp_path / "ckpt" / "submit_paper.json").read_text())["cells"][DE_T]["train"]
        assert queued(cluster, comment) == {train: f"train-{DE_T}"}
        good = subprocess.run(cmd, cwd=REPO, env=e, capture_output=True, text=True)
        assert good.returncode == 0, good.stderr
        assert f"{DE_T}: queued or running (jobs {train}): not submitted again" in good.stdout, good.stdout
        assert f"{DE_T}: evaluation on newstest2014 after job {train}" in good.stdout, good.stdout
        manifest = json.loads((tmp_path / "ckpt" / "submit_paper.json").read_text())
        evaluation = manifest["cells"][DE_T]["eval"]["newstest2014"]
        assert manifest["cells"][DE_T]["train"] == train
        assert cluster.job(evaluation)["Dependency"].startswith(f"afterok:{train}")
        assert sorted(queued(cluster, comment).values()) == sorted(
            [f"train-{DE_T}", f"eval-{DE_T}-newstest2014", "tables"])
    finally:
        cancel(cluster, comment)


@pytest.mark.slurm
def test_a_submission_that_cannot_queue_says_so_in_one_line_and_leaves_nothing(cluster, tmp_path):  # noqa: F811
    """An invalid partition, no sbatch, a SLURM_CONF that is not there, a missing data folder: one line naming what to
    change, exit 1, nothing queued and no manifest (one with "train": null was left behind)."""
    comment = f"nothing-{tmp_path.name}"
    e = {**env(), **cluster.env}
    cmd = [sys.executable, "scripts/submit_paper.py", DE_T, *some_data(tmp_path), f"--sbatch=--comment={comment}"]
    cases = [
        ([f"--sbatch=--comment={comment} --partition=nosuch"], {},
         f"submit_paper.py: sbatch refused train-{DE_T} (its options: --sbatch, --train): invalid partition"),
        ([], {"PATH": str(tmp_path / "empty")}, "submit_paper.py: sbatch: not found (run this on a Slurm login node"),
        ([], {"SLURM_CONF": str(tmp_path / "no.conf")}, f"submit_paper.py: SLURM_CONF={tmp_path / 'no.conf'}: no "),
        (["--override=task.data=/nonexistent/bin"], {},
         f"submit_paper.py: {DE_T}: no data folder /nonexistent/bin (from --override task.data"),
        ([f"--eval-args=--data-dir {tmp_path / 'nodata'}"], {},
         f"submit_paper.py: {DE_T}: its evaluation finds no data folder {tmp_path / 'nodata'}"),
    ]
    try:
        for extra, changed, says in cases:
            proc = subprocess.run([*cmd, *extra], cwd=REPO, env={**e, **changed}, capture_output=True, text=True,
                                  timeout=50)
            assert proc.returncode == 1 and proc.stderr.startswith(says), (says, proc.stderr)
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert not (tmp_path / "ckpt" / "submit_paper.json").exists(), extra
            assert queued(cluster, comment) == {}, extra
    finally:
        cancel(cluster, comment)


def test_a_missing_data_folder_is_refused_before_any_job(tmp_path):
    """The config's own data folder (data/wmt14_en_fr/bin, which a clone lacks) names the command that makes it;
    nothing is submitted (it was: exit 0, then fairseq's traceback on the node)."""
    fake = stand_ins(tmp_path / "bin", {"sbatch": f"echo \"$*\" >> {tmp_path}/submitted; echo 1\n"})
    proc = subprocess.run([sys.executable, "scripts/submit_paper.py", FR_T, "--checkpoints", str(tmp_path / "ckpt"),
                           "--results", str(tmp_path / "results")], cwd=REPO,
                          env={**env(), "PATH": f"{fake}:{env()['PATH']}"}, capture_output=True, text=True)
    if (REPO / "data" / "wmt14_en_fr" / "bin").is_dir():
        pytest.skip("this clone has data/wmt14_en_fr/bin")
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"submit_paper.py: {FR_T}: no data folder data/wmt14_en_fr/bin (bash scripts/prepare_wmt14.sh en-fr makes "
        "it; or --override task.data=DIR)"), proc.stderr
    assert not (tmp_path / "submitted").exists() and not (tmp_path / "ckpt" / "submit_paper.json").exists()


def test_the_config_data_folder_is_the_composed_configs(tmp_path):
    """submit_paper.py reads a cell's data folder from configs/pair/*.yaml; fairseq-hydra-train's composition of
    the cell agrees (scripts/hydra_config.py, as scripts/train.sh runs it from the repository)."""
    import submit_paper

    cells = ["wmt14_en_de_base_transformer", "wmt14_en_fr_big_floater_all_warm"]
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'scripts'); import hydra_config as h; "
         f"print(*[h.select(h.compose(c), 'task.data') for c in {cells!r}], sep='\\n')"],
        cwd=REPO, env={**env(), "PWD": str(REPO)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(submit_paper.config_data(c)) for c in cells]


def test_the_dry_run_prints_lines_a_shell_runs(tmp_path):
    """Each printed line carries the environment its job reads: run by a shell (sbatch a stand-in that records what
    it got), the warm start's line hands the job WARM_START_FROM and SAVE_DIR. --train-big serves the big cells,
    --train the base ones; the tables job takes --tables after --sbatch (the last partition wins)."""
    big = "wmt14_en_de_big_relative"
    dry = subprocess.run([sys.executable, "scripts/submit_paper.py", DE_W, big, "--dry-run", *some_data(tmp_path),
                          "--sbatch=--partition=gpu", "--train=--time=1:00:00", "--train-big=--time=3:00:00",
                          "--tables=--partition=cpu"], cwd=REPO, env=env(), capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    lines = {re.search(r"--job-name (\S+)", ln).group(1): ln.strip() for ln in dry.stdout.splitlines()
             if re.search(r"\bsbatch --job-name ", ln)}
    assert "--time=1:00:00" in lines[f"train-{DE_W}"] and "--time=3:00:00" in lines[f"train-{big}"]
    assert "--time=3:00:00" not in lines[f"train-{DE_W}"] and "--time=1:00:00" not in lines[f"train-{big}"]
    assert re.search(r"--partition=gpu .*--partition=cpu", lines["tables"])
    fake = stand_ins(tmp_path / "bin", {"sbatch": f'echo "$SAVE_DIR|${{WARM_START_FROM:-}}|$*" > {tmp_path}/got\n'})
    ran = subprocess.run(["bash", "-c", lines[f"train-{DE_W}"]], env={**env(), "PATH": f"{fake}:{env()['PATH']}"},
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    save, warm, argv = (tmp_path / "got").read_text().strip().split("|")
    assert save == str(tmp_path / "ckpt" / DE_W)
    assert warm == str(tmp_path / "ckpt" / DE_T / "checkpoint_last.pt")
    assert argv.endswith(f"scripts/train.sbatch {DE_W} task.data={tmp_path / 'data' / 'bin'}")
