"""scripts/study/study_lane.sh: a study lane runs the recipe of one commit from its snapshot, with the condition's folders,
retries a failed attempt but not a refused input, and refuses a bad condition, commit or data folder in one line.
The lane runs in a small git repository whose recipe records what it was given (the real recipe trains for
hours); the last test checks the real recipe's side of the contract: a refused input exits 2."""
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, env

LANE = REPO / "scripts" / "study" / "study_lane.sh"
# Records its working folder and variables; fails its first attempt (a passing failure) or, with MODELS=refused,
# refuses its input as the real recipe does.
FAKE_RECIPE = """#!/usr/bin/env bash
set -eu
mkdir -p "$OUT_DIR"
n=$(( $(cat "$OUT_DIR/attempts" 2> /dev/null || echo 0) + 1 )); echo $n > "$OUT_DIR/attempts"
[ "${MODELS:-}" != refused ] || { echo "multi30k_study.sh: MODELS=refused: unknown model" >&2; exit 2; }
(( n > 1 )) || exit 1
{ echo "recipe=@WHICH@"; echo "pwd=$PWD"; echo "nice=$(nice)"; for v in EPOCHS MAX_TRAIN_TOKENS JOIN_TRAIN DATA_DIR CKPT_ROOT OUT_DIR \\
    CODE_VERSION JOBS MULTI30K_DIR PYTHONPATH MODELS; do echo "$v=${!v:-}"; done; } > "$OUT_DIR/ran.tmp"
mv "$OUT_DIR/ran.tmp" "$OUT_DIR/ran"  # whole when it appears: a test polls for it while the lane runs
"""


def git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    """A git repository holding the lane and a fake recipe, committed, then the recipe changed without a commit;
    Multi30k beside it where the lane looks by default."""
    repo = tmp_path / "main"
    (repo / "scripts" / "study").mkdir(parents=True)
    shutil.copy(LANE, repo / "scripts" / "study" / "study_lane.sh")
    recipe = repo / "scripts" / "study" / "multi30k_study.sh"
    recipe.write_text(FAKE_RECIPE.replace("@WHICH@", "committed"))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "lane")
    recipe.write_text(FAKE_RECIPE.replace("@WHICH@", "uncommitted"))
    (tmp_path / "shared" / "data" / "multi30k").mkdir(parents=True)
    return repo


def lane(repo, *args, **variables):
    e = {k: v for k, v in env().items() if k not in ("MODELS", "SEEDS", "EPOCHS", "JOBS", "MULTI30K_DIR")}
    e.update({"RETRY_SECONDS": "0", "FOREGROUND": "1", **variables})
    return subprocess.run(["bash", "scripts/study/study_lane.sh", *args], cwd=repo, env=e, capture_output=True, text=True,
                          timeout=120)


def recorded(path):
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def test_a_lane_runs_the_commits_recipe_from_its_snapshot_with_the_conditions_folders(checkout):
    sha = git(checkout, "rev-parse", "--short", "HEAD")
    proc = lane(checkout, "epochs20", MODELS="rope")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = checkout / "results" / "multi30k_study" / "epochs20"
    assert (out / "attempts").read_text().strip() == "2", "the failed first attempt was not retried"
    ran, snap = recorded(out / "ran"), checkout / "checkpoints" / "multi30k_study" / f"code_{sha}"
    assert ran["recipe"] == "committed" and ran["pwd"] == str(snap)
    assert ran["PYTHONPATH"].split(os.pathsep)[:2] == [str(snap), str(snap / "scripts")]
    assert (ran["EPOCHS"], ran["CODE_VERSION"], ran["JOBS"], ran["MODELS"]) == ("20", sha, "1", "rope")
    assert ran["DATA_DIR"] == str(checkout / "data" / "multi30k_study_ende")
    assert ran["CKPT_ROOT"] == str(checkout / "checkpoints" / "multi30k_study_epochs20")
    assert ran["OUT_DIR"] == str(out)
    assert Path(ran["MULTI30K_DIR"]).resolve() == (checkout.parent / "shared" / "data" / "multi30k").resolve()
    assert sorted(p.name for p in snap.parent.iterdir()) == [f"code_{sha}"], "a temporary snapshot was left"


def test_the_train_short_condition_caps_and_joins_and_a_commit_can_be_named(checkout):
    first = git(checkout, "rev-parse", "--short", "HEAD")
    git(checkout, "commit", "-q", "-am", "later")  # HEAD moves on; the lane is asked for the first commit
    proc = lane(checkout, "tok32_joined", first)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = recorded(checkout / "results" / "multi30k_study" / "tok32_joined" / "ran")
    assert ran["recipe"] == "committed" and ran["CODE_VERSION"] == first
    assert (ran["MAX_TRAIN_TOKENS"], ran["JOIN_TRAIN"], ran["EPOCHS"]) == ("32", "1", "")
    assert ran["DATA_DIR"] == str(checkout / "data" / "multi30k_study_ende_tok32_joined")


def test_a_refused_input_is_not_retried(checkout):
    proc = lane(checkout, "main", MODELS="refused", RETRY_SECONDS="60")
    assert proc.returncode == 2
    assert (checkout / "results" / "multi30k_study" / "attempts").read_text().strip() == "1"
    assert proc.stderr.splitlines()[-1] == "study_lane.sh: the recipe refused its input (above): not retried"


def test_a_lane_gives_up_after_its_retries_with_the_count(checkout):
    proc = lane(checkout, "main", RETRIES="0")  # the fake recipe fails its first attempt; no second one
    assert proc.returncode == 1
    assert (checkout / "results" / "multi30k_study" / "attempts").read_text().strip() == "1"
    assert proc.stderr.splitlines()[-1] == "study_lane.sh: main: 1 attempt(s), each failed: see the log above"


@pytest.mark.parametrize("args, variables, message", [
    (["epochs30"], {}, "study_lane.sh: CONDITION 'epochs30': expected main, epochs20 or tok32_joined "
                       "(scripts/study/study_lane.sh CONDITION [COMMIT])"),
    (["main", "no-such-commit"], {}, "study_lane.sh: COMMIT 'no-such-commit': not a commit of {repo}"),
    (["main"], {"MULTI30K_DIR": "/nonexistent/multi30k"}, "study_lane.sh: MULTI30K_DIR=/nonexistent/multi30k: no such "
                                                          "folder (expected Multi30k's train, val, test_2016_flickr)"),
    (["main"], {"RETRIES": "many"}, "study_lane.sh: RETRIES=many: expected a whole number"),
])
def test_bad_input_is_one_line_and_writes_nothing(checkout, args, variables, message):
    proc = lane(checkout, *args, **variables)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [message.format(repo=checkout)]
    assert not (checkout / "checkpoints").exists() and not (checkout / "results").exists()


def test_without_foreground_the_lane_returns_at_once_and_logs_to_the_conditions_folder(checkout):
    e = {k: v for k, v in env().items() if k not in ("FOREGROUND", "MULTI30K_DIR")}
    proc = subprocess.run(["bash", "scripts/study/study_lane.sh", "main"], cwd=checkout, text=True, capture_output=True,
                          env={**e, "RETRY_SECONDS": "0"}, timeout=60)
    log = checkout / "checkpoints" / "multi30k_study" / "study.log"
    assert proc.returncode == 0 and proc.stdout.startswith("study_lane.sh: main from code "), proc.stderr
    assert proc.stdout.rstrip().endswith(f": {log}")
    ran = checkout / "results" / "multi30k_study" / "ran"
    deadline = time.monotonic() + 60
    while not ran.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert recorded(ran)["recipe"] == "committed", log.read_text()
    assert recorded(ran)["nice"] == "19"  # the lowest priority (and its session's group, where the kernel has them)
    assert "== study_lane.sh: main, code " in log.read_text()


def test_the_recipe_exits_2_on_a_refused_input():
    proc = subprocess.run(["bash", "scripts/study/multi30k_study.sh"], cwd=REPO, capture_output=True, text=True,
                          env={**env(), "SEEDS": "one"}, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == ['multi30k_study.sh: SEEDS="one": expected positive integers, got \'one\'']
