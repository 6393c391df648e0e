"""FLOATER with --floater-update-every N > 1: between two re-solves, training reuses the biases Δb(t_i) of the
last re-solve, detached. Those cached biases must be a function of the training state only, so that what an
update computes does not depend on the run's history: not on a kill and resume (the cache must survive the
checkpoint), not on validation in between (evaluation must not replace the training cache), not on the lengths
of the batches that came before (positions past the re-solve's batch length must come from the re-solve's θ).
Model-level counterparts of test_resume.py's and test_distributed.py's FLOATER runs: the floater_transformer_tiny
model driven as fairseq's trainer drives it (set_num_updates, train/eval, state_dict/load_state_dict), with a
fixed pseudo-random parameter change standing in for the optimizer step."""
import copy

import pytest
import torch

from helpers import tiny_models
from helpers.tiny_models import TASK, VOCAB, one_thread  # noqa: F401  (one_thread: autouse fixture)

ARCH, N = "floater_transformer_tiny", 4


def build(seed=0):
    """A floater_transformer_tiny re-solving every N updates, with a non-zero flow (a new one has h ≡ 0)."""
    model = tiny_models.build(ARCH, seed, floater_update_every=N)
    optimizer_step(model, seed=100 + seed, scale=0.3)
    return model.train()


def optimizer_step(model, seed, scale=0.02):
    """What fairseq's Adam does to the parameters between two forwards (through .data), made reproducible."""
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.data.add_(scale * torch.randn(p.shape, generator=gen))


def batch(src_len, tgt_len, seed, size=3):
    gen = torch.Generator().manual_seed(seed)
    low = TASK.source_dictionary.nspecial
    return {"src_tokens": torch.randint(low, VOCAB, (size, src_len), generator=gen),
            "src_lengths": torch.full((size,), src_len),
            "prev_output_tokens": torch.randint(low, VOCAB, (size, tgt_len), generator=gen)}


SHORT, LONG = batch(5, 4, seed=1), batch(20, 18, seed=2)


def update(model, num_updates, sample):
    """One training forward and backward at update counter num_updates: (logits, {name: grad or None})."""
    model.set_num_updates(num_updates)
    model.zero_grad(set_to_none=True)
    logits = model(**sample)[0]
    logits.float().pow(2).mean().backward()
    return logits.detach(), {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}


def assert_same_update(a, b, atol=0.0):
    (logits_a, grads_a), (logits_b, grads_b) = a, b
    close = (lambda x, y: torch.equal(x, y)) if atol == 0 else (lambda x, y: torch.allclose(x, y, atol=atol, rtol=0))
    assert close(logits_a, logits_b), (logits_a - logits_b).abs().max()
    assert {n for n, g in grads_a.items() if g is None} == {n for n, g in grads_b.items() if g is None}, \
        "a different set of parameters gets a gradient (e.g. the flow re-solved in one run only)"
    differ = [n for n in grads_a if grads_a[n] is not None and not close(grads_a[n], grads_b[n])]
    assert not differ, differ[:5]


def test_cached_update_is_the_same_after_a_resume():
    """Re-solve at update 4, then the state at update 5 (cached until 8) saved and loaded into a new model
    (fairseq's resume: load_state_dict, then set_num_updates): update 5 computes exactly what the
    uninterrupted model computes, and no gradient reaches the flow in either."""
    model = build()
    update(model, 4, SHORT)
    optimizer_step(model, seed=1)
    state = copy.deepcopy(model.state_dict())
    uninterrupted = update(model, 5, SHORT)

    resumed = build(seed=7)  # other initial weights: everything must come from the checkpoint
    resumed.load_state_dict(state)
    assert_same_update(update(resumed, 5, SHORT), uninterrupted)


def test_validation_does_not_change_the_next_update():
    """A validation pass (eval mode, no gradient) between updates 4 and 5 leaves update 5 as it was."""
    results = []
    for validate in (False, True):
        model = build()
        update(model, 4, SHORT)
        optimizer_step(model, seed=1)
        if validate:
            model.set_num_updates(5)
            model.eval()
            with torch.no_grad():
                model(**LONG)
            model.train()
        results.append(update(model, 5, SHORT))
    assert_same_update(*results)


def test_cached_biases_do_not_depend_on_the_resolving_batch_length():
    """Update 5 on a long batch gives the same result whether the re-solve at update 4 saw a short batch (5
    source / 4 target positions) or the long one: positions past the short batch come from the θ of the
    re-solve, not from the θ after the optimizer step. Equal up to rounding only: extending the grid from its
    last cached point takes the same RK4 steps as one solve from 0, but the step times are rounded differently
    (about 1e-6 in the biases); 1e-4 on logits of order 1. One process with --update-freq 2 and two ranks
    see the same batches in different pairings, so without this they train differently."""
    results = []
    for resolved_on in (SHORT, LONG):
        model = build()
        update(model, 4, resolved_on)
        optimizer_step(model, seed=1)
        results.append(update(model, 5, LONG))
    assert_same_update(*results, atol=1e-4)
