"""FLOATER with --floater-update-every N > 1: between two re-solves, training reuses the biases Δb(t_i) of the
last re-solve, detached. Those cached biases must be a function of the training state only, so that a run's
result does not depend on its history: not on a kill and resume (the cache must survive the checkpoint), not
on validation in between (evaluation must not replace the training cache), not on the lengths of the batches
that happen to come later (positions past the re-solve's batch length must come from the re-solve's θ).
Unit-level counterparts of test_resume.py's and test_distributed.py's FLOATER runs, on one FloaterFlow."""
import copy

import pytest
import torch
from torch import nn

from fairseq_plugins.modules.floater import FloaterFlow

DIM, K, N = 8, 3, 4  # state width, driven projections, --floater-update-every


def make_flow(seed=0):
    torch.manual_seed(seed)
    flow = FloaterFlow(DIM, hidden=DIM, dt=0.1, method="rk4", update_every=N)
    with torch.no_grad():  # a trained-looking flow (a new one starts with h ≡ 0)
        flow.dynamics.fc2.weight.normal_(0, 0.3)
        flow.dynamics.fc2.bias.normal_(0, 0.3)
    return flow.train()


@pytest.fixture
def biases():
    torch.manual_seed(1)
    return [nn.Parameter(torch.randn(DIM)) for _ in range(K)]  # b(0) of the driven projections


def optimizer_step(flow, biases):
    """What fairseq's Adam does between two forwards: move every parameter through .data."""
    for p in list(flow.parameters()) + biases:
        p.data.add_(0.05 * torch.randn_like(p))


def test_cached_biases_survive_a_checkpoint(biases):
    """The state at update 5 (re-solved at 4, cached until 8), saved and loaded into a new flow (a resume),
    gives the same biases as the flow that was never interrupted, and again no gradient path to θ."""
    flow = make_flow()
    flow.set_num_updates(4)
    flow(biases, 12)  # re-solve
    optimizer_step(flow, biases)
    flow.set_num_updates(5)
    state = copy.deepcopy(flow.state_dict())
    uninterrupted = flow(biases, 12)
    assert not uninterrupted.requires_grad  # cached: θ gets no gradient on update 5

    resumed = make_flow(seed=2)
    resumed.load_state_dict(state)
    resumed.set_num_updates(5)  # what fairseq's trainer does after loading
    out = resumed(biases, 12)
    assert not out.requires_grad, "the resumed run re-solved (θ gets a gradient) where the original did not"
    assert torch.equal(out, uninterrupted)


def test_validation_between_updates_leaves_training_biases_alone(biases):
    """Validation (eval mode) at update 5 must not change what training uses at update 6."""
    runs = []
    for validate in (False, True):
        flow = make_flow()
        bs = [nn.Parameter(b.detach().clone()) for b in biases]
        flow.set_num_updates(4)
        flow(bs, 12)
        torch.manual_seed(5)
        optimizer_step(flow, bs)
        flow.set_num_updates(5)
        if validate:
            flow.eval()
            with torch.no_grad():
                flow(bs, 12)
            flow.train()
        runs.append(flow(bs, 12))
    assert torch.equal(runs[0], runs[1])


def test_longer_batch_between_resolves_uses_the_resolved_flow(biases):
    """Re-solve at update 4 on a batch of 8 positions, then a batch of 20 at update 5: positions 8..19 must
    come from the θ of the re-solve, as they would had the update-4 batch been the longer one (fixed-grid RK4:
    equal up to the float rounding of the step times, 1e-5 here). Otherwise the biases depend on the order of
    batch lengths, which differs between one process and two ranks, or with another batch size."""
    flow = make_flow()
    flow.set_num_updates(4)
    flow(biases, 8)
    theta_at_resolve = copy.deepcopy(flow.dynamics.state_dict())
    b0_at_resolve = [b.detach().clone() for b in biases]
    optimizer_step(flow, biases)
    flow.set_num_updates(5)
    used = flow(biases, 20)

    reference = make_flow()
    reference.dynamics.load_state_dict(theta_at_resolve)
    reference.set_num_updates(4)
    expected = reference(b0_at_resolve, 20).detach()
    assert torch.allclose(used, expected, atol=1e-5, rtol=1e-5), (used - expected).abs().max()
