"""Committed results hold no absolute path of the machine that made them (scripts/result_paths.py): every writer
records paths relative to the repository (or a file name), and the rewrite of older results changes nothing else."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO, run

sys.path.insert(0, str(REPO / "scripts"))
import result_paths  # noqa: E402

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
    assert result_paths.portable(REPO / "data" / "x" / "test.de") == "data/x/test.de"
    assert result_paths.portable("data/x/test.de") == "data/x/test.de"  # relative: as given
    assert result_paths.portable("/elsewhere/checkpoints/average.pt") == "average.pt"
    assert result_paths.portable(None) is None


def test_rewrite_changes_only_paths(tmp_path):
    original = {"bleu": 37.64, "checkpoint": str(REPO / "checkpoints" / "a" / "average.pt"), "recipe": "lr=5e-4 a/b",
                "lists": [str(REPO / "data" / "test.en"), "/other/machine/hyp.txt"], "note": "/ not a path\nline 2"}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(original, indent=2, sort_keys=True) + "\n")
    assert result_paths.rewrite(path)
    again = json.loads(path.read_text())
    assert again == {**original, "checkpoint": "checkpoints/a/average.pt", "lists": ["data/test.en", "hyp.txt"]}
    assert path.read_text() == json.dumps(again, indent=2, sort_keys=True) + "\n"  # the writers' format
    assert not result_paths.rewrite(path)  # idempotent
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_writer_records_portable_paths(tmp_path):
    for split in ("src", "ref", "hyp"):
        (tmp_path / f"test.{split}").write_text("a b c\nd e f g\n")
    out = tmp_path / "scores.json"
    run([sys.executable, "scripts/length_eval.py", "score", "--name", "x", "--edges", "1,3,10",
         "--src", str(tmp_path / "test.src"), "--ref", str(tmp_path / "test.ref"), "--hyp", str(tmp_path / "test.hyp"),
         "--out", str(out)])
    result = json.loads(out.read_text())
    assert (result["src"], result["ref"], result["hyp"]) == (["test.src"], ["test.ref"], ["test.hyp"])
