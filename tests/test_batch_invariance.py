"""A sentence's translation depends on the sentence alone, for every row of the scheme table (new rows included
without editing this file): sources of 3 and 50 tokens left-padded beside a 1,000-token batch-mate (their tokens
at padded indices up to 999, past FIRE's threshold of 512), each decoded alone and in the batch, teacher-forced
and over 301 steps of incremental decoding with a beam reorder at step 150 (scripts/tooling/invariance.py;
scripts/gpu/gpu_check.py's invariance section runs the same on a GPU).

Bounds on the largest |alone − batched| decoder logit of untrained tiny models on CPU: float32 1e-5 (measured:
at most 2.3e-6 over the rows, the rounding of different batch shapes; FIRE before its positions were counted per
sentence: 3e-4); bf16 0.0625 and fp16 0.008, measured at most 0.035 and 0.0049, fairseq's own Transformer
0.031 and 0.0040: half-precision rounding of different batch shapes, the same for every row. In half precision
the incremental check runs 20 steps (each step costs 3 to 5 ms of the CPU's half kernels; the positions past
the threshold are float32's check)."""
import pytest
import torch

from helpers.tiny_models import one_thread  # noqa: F401  (an autouse fixture)
from tooling import invariance as batch_invariance
from fairseq_plugins.modules.fire import FIRE
from fairseq_plugins.schemes import SCHEMES

ROWS = [row for row in SCHEMES.values() if row.arch_prefix or row.flags]  # every row that names a model
BOUND = {torch.float32: 1e-5, torch.bfloat16: 0.0625, torch.float16: 0.008}


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_a_sentence_alone_equals_it_beside_a_long_batch_mate(row):
    model = batch_invariance.row_model(row)
    errors = batch_invariance.errors(model)
    assert max(errors.values()) <= BOUND[torch.float32], (row.name, errors)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.name)
def test_in_half_precision_within_the_bound_of_rounding(row, dtype):
    model = batch_invariance.row_model(row, dtype=dtype)
    errors = batch_invariance.errors(model, steps=20)
    assert max(errors.values()) <= BOUND[dtype], (row.name, errors)


def test_the_check_sees_a_bias_that_reads_padded_indices(monkeypatch):
    """The check fails where a scheme's bias reads a token's index in the padded batch instead of its position in
    its sentence (FIRE before this was fixed): its normaliser then sees ~1,000 for a 3-token sentence."""
    monkeypatch.setattr(FIRE, "per_sentence", False)
    errors = batch_invariance.errors(batch_invariance.row_model(SCHEMES["fire"]))
    assert min(errors.values()) > 10 * BOUND[torch.float32], errors

