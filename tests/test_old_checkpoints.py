"""Checkpoints trained by the code before SHAPE's --shape-eval-offset and T5's --t5-bias-init (commit c442711;
tests/data/old_checkpoints/make.sh remakes them) load with today's code, and translate exactly as the code that
trained them did: their arguments resolve, T5's table comes from the checkpoint, and SHAPE keeps the protocol it
was trained with (k ~ U{0..K} in training, k = 0 at evaluation) where a new run follows the authors' code.

And checkpoints of every position scheme and model family of 9d4ae10's table (schemes/, remade by
make_schemes.sh; schemes/manifest.json names the commit, each fixture's arch and flags) and of c6f022b's, the code
before each scheme family got a model class of its own (schemes_c6f022b/), load with today's code under their
registered architecture names, as fairseq-generate loads them, and compute and decode as that commit's code did
(tests/helpers/old_checkpoints.py: the same procedure for both)."""
import json
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils

from helpers import old_checkpoints
from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture)

HERE = Path(__file__).resolve().parent / "data" / "old_checkpoints"
REFERENCE = torch.load(HERE / "reference.pt")
SETS = sorted(p.parent.name for p in HERE.glob("schemes*/manifest.json"))  # schemes (9d4ae10), schemes_c6f022b
MANIFESTS = {s: json.loads((HERE / s / "manifest.json").read_text()) for s in SETS}


def load(scheme):
    (model,), cfg = checkpoint_utils.load_model_ensemble([str(HERE / f"{scheme}.pt")], arg_overrides={"data": str(HERE)})
    return model, cfg


@pytest.mark.parametrize("scheme", ["shape", "t5"])
def test_an_old_checkpoint_translates_as_the_code_that_trained_it(scheme):
    model, _ = load(scheme)
    model.eval()
    src, prev = REFERENCE["src"], REFERENCE["prev"]
    with torch.no_grad():
        got = model.get_normalized_probs(model(src, src.ne(1).sum(1), prev), log_probs=True)
    torch.testing.assert_close(got, REFERENCE[f"{scheme}_eval"], rtol=0, atol=1e-6)


def test_an_old_shape_checkpoint_keeps_its_training_offsets():
    """Trained on with today's code (resumed, fine-tuned), an old SHAPE model draws the offsets the old code drew,
    from the same generator state: k in 0..K, K = 100 (its recorded --shape-max-shift)."""
    model, cfg = load("shape")
    assert cfg.model.shape_max_shift == 100
    for stack in (model.encoder, model.decoder):
        assert (stack.embed_positions.num_shifts, stack.embed_positions.eval_offset) == (101, 0)
        assert stack.embed_positions.version.item() == 1  # and it stays the old protocol when saved again
    model.train()
    seen = []
    hook = model.encoder.layers[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    src, prev = REFERENCE["src"], REFERENCE["prev"]
    torch.manual_seed(0)
    with torch.no_grad():
        model(src, src.ne(1).sum(1), prev)
    hook.remove()
    torch.testing.assert_close(seen[0], REFERENCE["shape_train_first_block"], rtol=0, atol=1e-6)


def test_an_old_shape_checkpoint_saved_again_keeps_its_protocol():
    """Its state dict says version 1 from then on: a model built anew from its arguments (today's defaults: the
    authors' protocol) and given that state is the old protocol again; a new model's state says version 2."""
    (model,), cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(HERE / "shape.pt")],
                                                                         arg_overrides={"data": str(HERE)})
    state = model.state_dict()
    assert state["encoder.embed_positions.version"].item() == 1
    fresh = task.build_model(cfg.model)
    assert (fresh.encoder.embed_positions.num_shifts, fresh.encoder.embed_positions.eval_offset) == (100, 100)
    assert fresh.state_dict()["encoder.embed_positions.version"].item() == 2
    fresh.load_state_dict(state, model_cfg=cfg.model)
    assert (fresh.encoder.embed_positions.num_shifts, fresh.encoder.embed_positions.eval_offset) == (101, 0)


def test_every_scheme_of_the_fixtures_commit_has_a_checkpoint():
    """The fixtures cover each commit's whole table (make_schemes.sh checks it too; this keeps a deleted file or
    row from going unnoticed)."""
    assert SETS == ["schemes", "schemes_c6f022b"]
    for name, manifest in MANIFESTS.items():
        assert set(manifest["table"]) <= set(manifest["fixtures"]), name
        assert sorted(p.stem for p in (HERE / name).glob("*.pt") if p.stem != "reference") == sorted(
            manifest["fixtures"]), name


@pytest.mark.parametrize("fixtures,fixture", [(s, f) for s in SETS for f in MANIFESTS[s]["fixtures"]])
def test_a_checkpoint_of_every_scheme_computes_and_decodes_as_the_code_that_wrote_it(fixtures, fixture):
    """Eval-mode log-probabilities within 1e-6 + 1e-6·|recorded| of the recorded ones (float32: a restructured
    attention may add the same terms in another order, and another CPU's kernels do, a few ulps at these
    magnitudes: 1.4e-6 on a log-probability of 7.0 and 1.9e-6 on a step score of 2.5 on an Intel Xeon, fixtures
    written on an AMD EPYC; a wrong parameter, flag or default moves them by 1e-3 and more), and fairseq's
    incremental greedy and beam-3 decoding: the same tokens, the same step scores."""
    here, manifest = HERE / fixtures, MANIFESTS[fixtures]
    reference = torch.load(here / "reference.pt")
    model, task = old_checkpoints.load(here / f"{fixture}.pt", here)
    assert model.cfg.arch == manifest["fixtures"][fixture]["arch"]  # loaded under the name it was saved with
    torch.testing.assert_close(reference["src"], old_checkpoints.SRC, rtol=0, atol=0)
    torch.testing.assert_close(reference["prev"], old_checkpoints.PREV, rtol=0, atol=0)
    got, want = old_checkpoints.outputs(model, task), reference[fixture]
    torch.testing.assert_close(got["eval"], want["eval"], rtol=1e-6, atol=1e-6,
                               msg=lambda m: f"eval-mode log-probabilities: {m}")
    for beam in old_checkpoints.BEAMS:
        for sentence, ((tokens, scores), (want_tokens, want_scores)) in enumerate(zip(got[f"beam{beam}"],
                                                                                     want[f"beam{beam}"])):
            assert tokens.tolist() == want_tokens.tolist(), f"beam {beam}, sentence {sentence}"
            torch.testing.assert_close(scores, want_scores, rtol=1e-6, atol=1e-6,
                                       msg=lambda m: f"beam {beam}, sentence {sentence}, step scores: {m}")
