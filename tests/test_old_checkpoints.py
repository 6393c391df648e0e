"""Checkpoints trained by the code before SHAPE's --shape-eval-offset and T5's --t5-bias-init (commit c442711;
tests/data/old_checkpoints/make.sh remakes them) load with today's code, and translate exactly as the code that
trained them did: their arguments resolve, T5's table comes from the checkpoint, and SHAPE keeps the protocol it
was trained with (k ~ U{0..K} in training, k = 0 at evaluation) where a new run follows the authors' code."""
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils

from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture)

HERE = Path(__file__).resolve().parent / "data" / "old_checkpoints"
REFERENCE = torch.load(HERE / "reference.pt")


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
