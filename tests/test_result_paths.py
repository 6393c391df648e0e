"""Committed results hold no absolute path of the machine that made them (scripts/tooling/paths.py): every writer
records paths relative to the repository (or a file name), and the rewrite of older results changes nothing else."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from conftest import REPO, run

from tooling import paths

# an absolute path of some machine: a filesystem root the results have no business naming
ABSOLUTE = re.compile(r"(?<![\w.~-])/(?:work|tmp|home|root|Users|scratch|private|mnt|data\d*|gpfs|lustre)/")


def test_committed_results_name_no_absolute_path():
    files = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    assert files, "no committed results?"
    offending = []
    for name in files:
        path = REPO / name
        if path.suffix in (".png", ".pt") or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if ABSOLUTE.search(line) or str(REPO) in line or os.path.expanduser("~") + "/" in line:
                offending.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not offending, "absolute paths in results:\n" + "\n".join(offending[:20])


def test_portable_paths():
    assert paths.portable(REPO / "data" / "x" / "test.de") == "data/x/test.de"
    assert paths.portable("data/x/test.de") == "data/x/test.de"  # relative: as given
    assert paths.portable("/elsewhere/checkpoints/average.pt") == "/elsewhere/checkpoints/average.pt"
    assert paths.portable(None) is None


def test_rewrite_changes_only_paths(tmp_path):
    original = {"bleu": 37.64, "checkpoint": str(REPO / "checkpoints" / "a" / "average.pt"), "recipe": "lr=5e-4 a/b",
                "lists": [str(REPO / "data" / "test.en"), "/other/machine/hyp.txt"], "note": "/ not a path\nline 2"}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(original, indent=2, sort_keys=True) + "\n")
    assert paths.rewrite(path)
    again = json.loads(path.read_text())
    assert again == {**original, "checkpoint": "checkpoints/a/average.pt",
                     "lists": ["data/test.en", "/other/machine/hyp.txt"]}  # outside the repository: as given
    assert path.read_text() == json.dumps(again, indent=2, sort_keys=True) + "\n"  # the writers' format
    assert not paths.rewrite(path)  # idempotent
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_command_rewrites_every_json_below(tmp_path):
    """scripts/result_paths.py DIR, as the README calls it (the study recipe rewrites in-process: study.py tabulate)."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_text(json.dumps({"ref": str(REPO / "data" / "a.de")}, indent=2) + "\n")
    (tmp_path / "b.json").write_text(json.dumps({"bleu": 1.0}, indent=2) + "\n")
    out = run([sys.executable, "scripts/result_paths.py", str(tmp_path)]).stdout
    assert out.strip().splitlines()[-1] == "1 of 2 files rewritten"
    assert json.loads((tmp_path / "sub" / "a.json").read_text()) == {"ref": "data/a.de"}


def test_a_writer_records_portable_paths():
    """Inside the repository a writer records paths relative to its root, and readers find them from there."""
    (REPO / "checkpoints").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=REPO / "checkpoints") as work:
        work = Path(work)
        for split in ("src", "ref", "hyp"):
            (work / f"test.{split}").write_text("a b c\nd e f g\n")
        out = work / "scores.json"
        run([sys.executable, "scripts/length_eval.py", "score", "--name", "x", "--edges", "1,3,10",
             "--src", str(work / "test.src"), "--ref", str(work / "test.ref"), "--hyp", str(work / "test.hyp"),
             "--out", str(out)])
        result = json.loads(out.read_text())
        rel = work.relative_to(REPO)
        assert (result["src"], result["ref"], result["hyp"]) == \
            ([f"{rel}/test.src"], [f"{rel}/test.ref"], [f"{rel}/test.hyp"])
        assert paths.locate(result["ref"][0]) in (f"{rel}/test.ref", str(work / "test.ref"))


def test_a_snapshot_inside_the_checkout_records_paths_from_the_checkout(tmp_path):
    """The study runs from a snapshot of the code under checkpoints/: its results name the checkout's data
    relative to the checkout (not a bare file name), and the snapshot's readers find them."""
    checkout = tmp_path / "repo"
    snap = checkout / "checkpoints" / "code_abc"
    (snap / "scripts").mkdir(parents=True)
    (checkout / ".git").mkdir()
    (checkout / "data").mkdir()
    (checkout / "data" / "test.de").write_text("x\n")
    shutil.copytree(REPO / "scripts" / "tooling", snap / "scripts" / "tooling",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import tooling.paths as r; p = r.portable(%r); print(p); print(r.locate(p))"
            % str(checkout / "data" / "test.de"))
    out = subprocess.run([sys.executable, "-c", code], cwd=snap, env={**os.environ, "PYTHONPATH": str(snap / "scripts")},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["data/test.de", str(checkout / "data" / "test.de")]
