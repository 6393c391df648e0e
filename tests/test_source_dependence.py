"""scripts/source_dependence.py: the true-source loss is fairseq's own validation NLL, and a model that learnt
the toy task pays for wrong sources."""
import json
import math
import re
import sys

import pytest

from conftest import run

from source_dependence import derangement


def test_derangement_moves_every_sentence_and_is_seeded():
    for n in (2, 3, 50):
        perm = derangement(n, seed=1)
        assert sorted(perm) == list(range(n)) and all(p != i for i, p in enumerate(perm))
    assert derangement(50, seed=1) == derangement(50, seed=1) != derangement(50, seed=2)


def test_true_loss_is_fairseqs_validation_nll_and_wrong_sources_cost(toy_data, toy_models, tmp_path):
    ckpt = toy_models.checkpoint("transformer_tiny")
    out = tmp_path / "dep.json"
    run([sys.executable, "scripts/source_dependence.py", str(toy_data / "bin"), str(ckpt), "--json", str(out)])
    dep = json.loads(out.read_text())
    assert out.stat().st_mode & 0o777 == 0o644  # a result others may read, not a private temporary file
    log = run(["fairseq-validate", str(toy_data / "bin"), "--path", str(ckpt), "--user-dir", "fairseq_plugins",
               "--task", "translation", "--valid-subset", "test", "--cpu", "--max-tokens", "4096"]).stdout
    nll_bits = float(re.search(r"valid on 'test' subset \| loss [\d.]+ \| nll_loss ([\d.]+)", log).group(1))
    assert dep["true_loss"] == pytest.approx(nll_bits * math.log(2), abs=0.001)  # fairseq logs 3 decimals
    assert dep["gap"] > 2.0, dep  # the toy target is a function of its source
    assert dep["shuffled_loss"] == pytest.approx(dep["true_loss"] + dep["gap"], abs=2e-4)


@pytest.mark.parametrize("args, message", [
    (["{data}", "missing.pt"], "checkpoint missing.pt: no such file"),
    (["{data}", "{data}/dict.src.txt", "--subset", "nosuch"], "--subset nosuch: no binarized split of that name in"),
])
def test_bad_input_is_one_line_before_the_model_is_loaded(toy_data, tmp_path, args, message):
    args = [a.format(data=toy_data / "bin") for a in args]
    proc = run([sys.executable, "scripts/source_dependence.py", *args, "--json", str(tmp_path / "x.json")],
               check=False)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"source_dependence.py: {message}")
    assert not list(tmp_path.iterdir())
