"""FLOATER as its authors' code trains it (``--floater-update-every N --floater-cache-whole-bias``, with their Δ,
adjoint and initialisation: configs/scheme/floater_*_authors.yaml): between two re-solves every update reuses
the whole bias of the last re-solve, sg[b(0)_r + Δb_r(t_i)], so the flow θ and the initial values b(0) get no
gradient; at a re-solve both do. The cached biases are the re-solve's exact solve; a checkpoint resumes the
schedule where it was. (Two gloo ranks against one process: tests/test_distributed.py.)"""
import argparse
import copy
from pathlib import Path

import torch
from fairseq import utils

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.modules.floater import FloaterSettings, solve_on_grid  # noqa: E402
from helpers.floater_helpers import (  # noqa: E402, F401  (one_thread: autouse fixture)
    one_thread,
    batch,
    build,
    flows,
    randomize_flows,
)

N = 3  # re-solve every N updates (the protocol's 400, scaled to a test)
AUTHORS = dict(floater_update_every=N, floater_cache_whole_bias=True)


def model_with(seed=0, **kw):
    return randomize_flows(build("floater_transformer_tiny", seed=seed, **{**AUTHORS, **kw})).double().train()


def members(model):
    """(flow, its b(0) parameters) of every flow of the model."""
    return [(flow, [proj.bias for proj in projections])
            for flow, projections in model.encoder.position_scheme.positions.members]


def step(model, k, lr=0.05):
    """Update k as fairseq's trainer runs it: forward and backward at counter k, then the step (plain SGD:
    no optimizer state, so a resumed run steps exactly as the uninterrupted one). Returns (logits, grads)."""
    model.set_num_updates(k)
    model.zero_grad(set_to_none=True)
    logits = model(*batch(seed=k, src_len=9, tgt_len=8))[0]
    logits.pow(2).mean().backward()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
    return logits.detach(), grads


def test_between_refreshes_theta_and_b0_get_no_gradient_at_a_refresh_they_do():
    model = model_with()
    other = model.encoder.layers[0].self_attn.out_proj.weight  # not driven by a flow: learns every update
    for k in range(7):
        refresh = k % N == 0
        _, grads = step(model, k)
        named = {id(p): n for n, p in model.named_parameters()}
        for flow, b0 in members(model):
            for p in [*flow.dynamics.parameters(), *b0]:
                g = grads[named[id(p)]]
                assert (g is not None and bool(g.abs().sum() > 0)) == refresh, (k, named[id(p)])
        assert grads[named[id(other)]].abs().sum() > 0


def test_default_cache_keeps_b0_learning_between_refreshes():
    """Without --floater-cache-whole-bias only Δb is cached: b(0) learns every update, θ at the re-solves."""
    model = model_with(floater_cache_whole_bias=False)
    for k in range(4):
        _, grads = step(model, k)
        named = {id(p): n for n, p in model.named_parameters()}
        for flow, b0 in members(model):
            assert all(grads[named[id(p)]].abs().sum() > 0 for p in b0)
            assert all((grads[named[id(p)]] is not None) == (k % N == 0) for p in flow.dynamics.parameters())


def effective_biases(model, positions):
    """Per flow, the bias each driven projection adds at grid rows 0..positions−1 in a training forward at the
    model's counter: its b(0) parameter plus what the flow binds, (positions, k, d)."""
    group = model.encoder.position_scheme.positions
    with group.forward_pass(positions):
        bound = [group.biases(flow, positions) for flow, _ in members(model)]  # first: it pauses what sits out
    return [torch.stack(b0) + d for (_, b0), d in zip(members(model), bound)]


def exact_solves(model, positions, settings):
    """Per flow, b(t_i) solved afresh from the model's current b(0) and θ by torchdiffeq (the reference)."""
    with torch.no_grad():
        return [solve_on_grid(flow.dynamics, torch.stack(b0), positions, settings) for flow, b0 in members(model)]


def test_cached_biases_are_the_refresh_solve_detached():
    positions = 40  # past the cache's first 16 rows: the extension must continue the re-solve's trajectory
    settings = FloaterSettings()
    model = model_with()
    refresh_state = copy.deepcopy(model)
    step(model, 0)  # the re-solve, then a step that moves θ and b(0)
    want = exact_solves(refresh_state, positions, settings)  # b(0) and θ as the re-solve saw them
    today = exact_solves(model, positions, settings)
    for k in (1, 2):  # the cached updates
        model.set_num_updates(k)
        for got, w, now in zip(effective_biases(model, positions), want, today):
            assert not got.requires_grad  # detached, b(0) included
            torch.testing.assert_close(got, w, rtol=0, atol=1e-9)
            assert (got - now).abs().max() > 1e-4  # ... and not today's parameters' biases
    model.set_num_updates(N)  # a re-solve: today's parameters, with gradient
    for got, now in zip(effective_biases(model, positions), today):
        assert got.requires_grad
        torch.testing.assert_close(got.detach(), now, rtol=0, atol=1e-9)


def test_a_checkpoint_resumes_the_refresh_schedule_where_it_was():
    """Updates 0..6 in one run against updates 0..3, a state_dict round trip into a model built with another
    seed, then 4..6: update 4 and 5 reuse the biases re-solved at update 3 (restored from the checkpoint: b(0)
    and θ of that re-solve, not the parameters stepped since), update 6 re-solves. Bit for bit."""
    whole = model_with()
    straight = [step(whole, k) for k in range(7)]
    first = model_with()
    for k in range(4):
        step(first, k)
    first.set_num_updates(4)  # the trainer's, after the step: the checkpoint holds the next update's counter
    state = copy.deepcopy(first.state_dict())
    resumed = model_with(seed=5)
    resumed.load_state_dict(state)
    assert all(flow._num_updates == 4 for flow, _ in members(resumed))
    for k in range(4, 7):
        logits, grads = step(resumed, k)
        want_logits, want_grads = straight[k]
        assert torch.equal(logits, want_logits), k
        assert {n for n, g in grads.items() if g is None} == {n for n, g in want_grads.items() if g is None}, k
        assert all(torch.equal(g, want_grads[n]) for n, g in grads.items() if g is not None), k
        theta_learns = grads["encoder.position_scheme.flow.dynamics.fc1.weight"] is not None
        assert theta_learns == (k % N == 0)


def test_authors_flow_init_draws_the_second_layer_xavier_normal():
    dim = 64
    zero = build("floater_transformer_tiny").encoder.position_scheme.flow.dynamics
    xavier = build("floater_transformer_tiny", floater_flow_init="xavier").encoder.position_scheme.flow.dynamics
    assert zero.fc2.weight.abs().max() == 0 and zero.fc2.bias.abs().max() == 0
    w = xavier.fc2.weight
    assert w.shape == (dim, dim + 1) and xavier.fc2.bias.abs().max() == 0
    std = (2 / (w.shape[0] + w.shape[1])) ** 0.5
    assert abs(float(w.std()) / std - 1) < 0.1


def test_authors_flags_train_with_the_adjoint_at_their_dt():
    """The whole protocol on a tiny model: Δ = 0.01, the adjoint, Xavier W2, the whole bias cached; the adjoint's
    θ gradient at a re-solve agrees with the exact one (direct backprop through the same RK4 steps)."""
    flags = dict(floater_dt=0.01, floater_flow_init="xavier")
    adjoint = build("floater_transformer_tiny", floater_adjoint=True, **AUTHORS, **flags).double().train()
    direct = build("floater_transformer_tiny", **AUTHORS, **flags).double().train()
    direct.load_state_dict(adjoint.state_dict())
    assert not adjoint.encoder.position_scheme.flow.latent  # the adjoint: torchdiffeq's solve of h
    _, g_adjoint = step(adjoint, 0)
    _, g_direct = step(direct, 0)
    for name in ("encoder.position_scheme.flow.dynamics.fc1.weight",
                 "decoder.position_scheme.flow.dynamics.fc2.weight"):
        assert g_adjoint[name].abs().sum() > 0
        torch.testing.assert_close(g_adjoint[name], g_direct[name], rtol=1e-5, atol=1e-8)
    for k in (1, 2):
        _, grads = step(adjoint, k)
        assert grads["encoder.position_scheme.flow.dynamics.fc1.weight"] is None
        assert grads["encoder.layers.0.self_attn.q_proj.bias"] is None
