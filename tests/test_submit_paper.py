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
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO, env, run
from helpers.stand_ins import stand_ins
from test_slurm import cluster  # noqa: F401  (the module's cluster fixture)

DE_T, DE_R, DE_W = "wmt14_en_de_base_transformer", "wmt14_en_de_base_relative", "wmt14_en_de_base_floater_all_warm"
FR_T, FR_W = "wmt14_en_fr_base_transformer", "wmt14_en_fr_base_floater_all_warm"
CELLS = [DE_T, DE_R, DE_W, FR_T, FR_W]
TINY = [f"++model.{k}" for k in ("encoder_embed_dim=16", "decoder_embed_dim=16", "encoder_ffn_embed_dim=32",
        "decoder_ffn_embed_dim=32", "encoder_layers=1", "decoder_layers=1", "encoder_attention_heads=2",
        "decoder_attention_heads=2")] + ["optimization.max_update=4",
        "optimization.update_freq=[1]", "dataset.max_tokens=1024", "dataset.max_valid_steps=1",
        "dataset.num_workers=0"]


@pytest.fixture(scope="module")
def en_de(tmp_path_factory):
    """A prepare_wmt14.sh-shaped en-de folder (raw/, spm.model, bin/ with a joined dictionary): the toy task with
    30 test and valid sentences."""
    out = tmp_path_factory.mktemp("toy_en_de")
    raw = out / "raw"
    run([sys.executable, "scripts/make_toy_data.py", "--out", str(out / "toy"), "--train", "600", "--valid", "30",
         "--test", "30", "--test-long", "2"])
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for ours, theirs in (("en", "src"), ("de", "tgt")):
            shutil.copy(out / "toy" / f"{split}.{theirs}", raw / f"{split}.{ours}")
    run(["bash", "scripts/prepare_bitext.sh", str(raw), str(out), "en", "de", "200"])
    return out


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
def test_the_paper_chain_runs_names_its_holes_and_resubmits_nothing(cluster, en_de, tmp_path):  # noqa: F811
    ckpts, results = tmp_path / "ckpt", tmp_path / "results"
    common = ["--checkpoints", str(ckpts), "--results", str(results),
              "--paper-numbers", str(paper_numbers(tmp_path / "paper.json"))]
    e = {**env(), **cluster.env, "CPU": "1", "OMP_NUM_THREADS": "1"}

    def submit(*cells, extra=()):
        proc = subprocess.run([sys.executable, "scripts/submit_paper.py", *cells, *common, *extra,
                               "--eval-args", f"--cpu --data-dir {en_de} --checkpoint-kind last",
                               # the tiny dims are the training's overrides, not the arch's: its base arch takes IN's
                               "--warm-args=--arch floater_transformer",
                               *[f"--override={o}" for o in [f"task.data={en_de / 'bin'}", *TINY]]],
                              cwd=REPO, env=e, capture_output=True, text=True)
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
    info = cluster.wait(tables, lambda i: i.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", None),
                        timeout=900, poll=2, release_after=None, output=ckpts / f"slurm-tables-{tables}.out")
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
    submitted = [line for line in dry.splitlines() if line.startswith("  sbatch ")]
    assert [re.search(r"--job-name (\S+)", s).group(1) for s in submitted] == [
        f"train-{FR_T}", f"eval-{FR_T}-newstest2014", f"eval-{DE_R}-newstest2013", f"train-{FR_W}",
        f"eval-{FR_W}-newstest2014", "tables"], dry
    assert f"{FR_W}: training after job dry1 ({FR_T})" in dry
    print(f"toy chain: {wall:.0f} s from submission to the table")


def test_bad_cells_get_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/submit_paper.py", "wmt14_en_de_base_nosuch", "--dry-run",
                           "--checkpoints", str(tmp_path)], cwd=REPO, env=env(), capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        "submit_paper.py: wmt14_en_de_base_nosuch: not a WMT14 cell (expected paper, newer or a name from "
        "make_tables.py --list, e.g. wmt14_en_de_base_relative)")


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
""", "scontrol": 'echo "JobId=$4 JobName=x JobState=PENDING Reason=Priority"\n'})
    e = {**env(), "PATH": f"{fake}:{env()['PATH']}"}
    cmd = [sys.executable, "scripts/submit_paper.py", DE_T, DE_R, "--checkpoints", str(tmp_path / "ckpt"),
           "--results", str(tmp_path / "results")]
    failed = subprocess.run(cmd, cwd=REPO, env={**e, "FAIL_AT": "3"}, capture_output=True, text=True)
    assert failed.returncode == 1 and failed.stderr.strip() == (
        "submit_paper.py: sbatch failed: sbatch: error: QOSMaxSubmitJobPerUserLimit"), failed.stderr
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
        "scontrol": "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1\n"})
    cmd = [sys.executable, "scripts/submit_paper.py", DE_T, "--checkpoints", str(tmp_path / "ckpt"),
           "--results", str(tmp_path / "results")]
    for n in (1, 2):  # no sacct on this PATH
        proc = subprocess.run(cmd, cwd=REPO, env={**env(), "PATH": str(fake)}, capture_output=True, text=True)
        assert proc.returncode == 0 and f"{DE_T}: training" in proc.stdout, proc.stderr
    assert json.loads((tmp_path / "ckpt" / "submit_paper.json").read_text())["cells"][DE_T]["train"] == "4"
