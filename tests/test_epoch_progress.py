"""Long work says what it is doing: scripts/epoch_progress.py turns a fairseq-train log into one line per epoch
with its validation loss (scripts/demos/toy_demo.sh prints them per model), and prepare_bitext.sh names each
step as it starts."""
import subprocess
import sys

import pytest

from conftest import REPO, env
from helpers.small_task import VOCAB, run1, small_raw

LOG = """2026-11-26 03:35:51 | INFO | fairseq.trainer | begin training epoch 1
2026-11-26 03:35:58 | INFO | train_inner | epoch 001:     40 / 46 loss=8.1, nll_loss=7.9, ppl=238.2, num_updates=40
2026-11-26 03:36:00 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 7.532 | nll_loss 7.1 | ppl 137.2 | wps 9000 | wpb 300 | bsz 20 | num_updates 46
2026-11-26 03:36:01 | INFO | fairseq.trainer | begin training epoch 2
2026-11-26 03:36:09 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 6.001 | nll_loss 5.5 | ppl 45.2 | wps 9000 | wpb 300 | bsz 20 | num_updates 92 | best_loss 6.001
"""


def test_a_line_per_epoch_and_the_whole_log_kept(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("earlier run\n")
    proc = subprocess.run([sys.executable, "scripts/epoch_progress.py", str(log), "--prefix", "   rope "], cwd=REPO,
                          env=env(), input=LOG, text=True, capture_output=True, check=True)
    lines = proc.stdout.splitlines()
    assert [line.rsplit(",", 1)[0] for line in lines] == ["   rope epoch 1: valid loss 7.532, 46 updates",
                                                          "   rope epoch 2: valid loss 6.001, 92 updates"]
    assert all(line.endswith(" s") for line in lines)
    assert log.read_text() == "earlier run\n" + LOG  # appended, as toy_demo.sh's reruns expect


@pytest.mark.slow  # sentencepiece and fairseq-preprocess on the small corpus
def test_prepare_names_each_step(tmp_path):
    raw = small_raw(tmp_path / "raw")
    proc = run1(["bash", "scripts/prepare_bitext.sh", str(raw), str(tmp_path / "out"), "src", "tgt", VOCAB])
    steps = [line for line in proc.stdout.splitlines() if line.startswith("prepare_bitext.sh: ")]
    assert steps[0] == f"prepare_bitext.sh: {raw} checked (3 splits of src-tgt, line-aligned UTF-8)"
    assert steps[1].startswith("prepare_bitext.sh: 1/3 training the joint sentencepiece model")
    assert len([s for s in steps if s.startswith("prepare_bitext.sh: 2/3 encoding")]) == 6
    assert steps[-1].startswith("prepare_bitext.sh: 3/3 binarizing")
