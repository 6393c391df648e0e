"""FLOATER (fairseq_plugins/modules/floater*.py, models/floater_transformer.py): the grid solve, all flows in one
solve (latent RK4 and its hand-written backward against autograd through torchdiffeq), the warm-start identity with
fairseq's Transformer, caching and its gradients, incremental decoding, any length, flags."""
import argparse
import copy
from pathlib import Path

import pytest
import torch
from fairseq import options, utils
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.sequence_generator import SequenceGenerator
from torchdiffeq import odeint

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.modules import floater, floater_rk4  # noqa: E402
from fairseq_plugins.modules.floater import (  # noqa: E402
    FloaterDynamics,
    FloaterFlow,
    FloaterSettings,
    FloaterSolverError,
    solve_flows,
    solve_on_grid,
)

VOCAB = 24


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one intra-op thread avoids spinning threads fighting over a busy machine's cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Task:
    def __init__(self):
        d = Dictionary()
        for i in range(VOCAB - len(d)):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


TASK = Task()
PAD = TASK.source_dictionary.pad()


def build(arch, seed=0, **kw):
    torch.manual_seed(seed)
    args = argparse.Namespace(arch=arch, dropout=0.0, **kw)
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, TASK)


def flows(model):
    return [m for m in model.modules() if isinstance(m, FloaterFlow)]


def randomize_flows(model, scale=0.3, seed=1):
    """A non-trivial h: W2 drawn small so the biases move but stay moderate over a few hundred positions."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for flow in flows(model):
            w = flow.dynamics.fc2.weight
            w.copy_(torch.randn(w.shape, generator=g) * scale / w.shape[1] ** 0.5)
            flow.dynamics.fc2.bias.copy_(torch.randn(w.shape[0], generator=g) * 0.1)
    return model


def floater_model(seed=0, **kw):
    return randomize_flows(build("floater_transformer_tiny", seed=seed, **kw)).double()


def batch(bsz=3, src_len=7, tgt_len=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (bsz, src_len), generator=g)
    src[0, :3] = PAD  # left padding, as fairseq batches sources
    prev = torch.randint(4, VOCAB, (bsz, tgt_len), generator=g)
    prev[:, 0] = TASK.source_dictionary.eos()
    prev[1, -2:] = PAD  # right padding, as fairseq batches targets
    return src, src.ne(PAD).sum(1), prev


def count_solves(monkeypatch):
    """Record every solver call made for a model's flows: the number of grid points it solves for."""
    calls = []
    solve = floater.solve_flows

    def counting(flows, initial, num_points, *args, **kwargs):
        calls.append(num_points)
        return solve(flows, initial, num_points, *args, **kwargs)

    monkeypatch.setattr(floater, "solve_flows", counting)
    return calls


# -- the flow ------------------------------------------------------------------------------------------

def test_flow_parameter_count_matches_paper():
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(FloaterDynamics(512)) == 526_336  # the paper's "526.3K" (Table 6)
    for d, h in ((64, 64), (512, 128), (1024, 1024)):
        assert n(FloaterDynamics(d, h)) == (d + 1) * h + h + (h + 1) * d + d


@pytest.mark.parametrize("method", ["rk4", "dopri5"])
def test_grid_solve_equals_independent_solves(method):
    torch.manual_seed(0)
    f = FloaterDynamics(6).double()
    torch.nn.init.xavier_normal_(f.fc2.weight)
    y0 = torch.randn(4, 6, dtype=torch.float64)
    dt, n = 0.1, 12
    tol = dict(rtol=1e-9, atol=1e-11)
    grid = solve_on_grid(f, y0, n, FloaterSettings(dt=dt, method=method, **tol))
    assert grid.shape == (n, 4, 6)
    torch.testing.assert_close(grid[0], y0, rtol=0, atol=0)
    for i in range(1, n):
        t = torch.tensor([0.0, i * dt], dtype=torch.float64)
        if method == "rk4":  # torchdiffeq's own step-size grid, Δ/5
            alone = odeint(f, y0, t, method="rk4", options=dict(step_size=dt / 5))[-1]
        else:
            alone = odeint(f, y0, t, method="dopri5", **tol)[-1]
        torch.testing.assert_close(grid[i], alone, rtol=0, atol=1e-5)


def test_grid_solve_continues_exactly_from_a_later_point():
    torch.manual_seed(0)
    f = FloaterDynamics(5).double()
    torch.nn.init.xavier_normal_(f.fc2.weight)
    y0 = torch.randn(3, 5, dtype=torch.float64)
    full = solve_on_grid(f, y0, 30)
    tail = solve_on_grid(f, full[11], 19, first_index=11)
    torch.testing.assert_close(tail, full[11:], rtol=0, atol=1e-12)


# -- all flows in one solve -----------------------------------------------------------------------------

def random_flows(rows=(3, 4, 2), dim=6, hidden=7, dtype=torch.float64, seed=0, **settings):
    """Flows with a non-trivial h (random W2, c2, c1) and random initial values, one per entry of rows."""
    torch.manual_seed(seed)
    flows = [FloaterFlow(dim, hidden, FloaterSettings(**settings)).to(dtype) for _ in rows]
    for flow in flows:
        torch.nn.init.normal_(flow.dynamics.fc2.weight, std=0.5 / hidden ** 0.5)
        torch.nn.init.normal_(flow.dynamics.fc2.bias, std=0.3)
        torch.nn.init.normal_(flow.dynamics.fc1.bias, std=0.3)
    initial = [torch.randn(k, dim, dtype=dtype, requires_grad=True) for k in rows]
    return flows, initial


def values_and_gradients(outputs, flows, initial, seed=1):
    """The outputs and the gradients of a fixed random linear function of them w.r.t. θ and b(0)."""
    g = torch.Generator().manual_seed(seed)
    loss = sum((y * torch.randn(y.shape, generator=g, dtype=y.dtype).to(y.device)).sum() for y in outputs)
    inputs = [p for flow in flows for p in flow.parameters()] + list(initial)
    return [y.detach() for y in outputs], torch.autograd.grad(loss, inputs)


@pytest.mark.parametrize("method,adjoint", [("rk4", False), ("rk4", True), ("euler", False), ("dopri5", False)])
def test_all_flows_in_one_solve_equal_separate_solves(method, adjoint):
    """solve_flows (fixed grid: stacked and padded states, one torchdiffeq call; default rk4 in latent coordinates
    with its hand-written backward; adaptive: one call per flow) == each flow's own torchdiffeq solve of h: values
    and gradients to θ and b(0)."""
    tol = dict(rtol=1e-10, atol=1e-12)
    flows, initial = random_flows(method=method, adjoint=adjoint, **tol)
    assert flows[0].latent == (method == "rk4" and not adjoint)
    n = 11
    together = values_and_gradients(solve_flows(flows, initial, n), flows, initial)
    alone = values_and_gradients([solve_on_grid(f.dynamics, y0, n, f.settings)
                                  for f, y0 in zip(flows, initial)], flows, initial)
    for a, b in zip([*together[0], *together[1]], [*alone[0], *alone[1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_latent_rk4_in_float32_matches_torchdiffeq_on_h():
    """At the tiny model's sizes and 60 positions, float32 rounding is the only difference from rk4 on p."""
    flows, initial = random_flows(rows=(6, 8, 4), dim=64, hidden=64, dtype=torch.float32)
    ys = solve_flows(flows, initial, 60)
    for flow, y0, y in zip(flows, initial, ys):
        reference = solve_on_grid(flow.dynamics, y0, 60)
        assert (y - reference).abs().max() <= 2e-6 * reference.abs().max()


def test_latent_rk4_backward_passes_gradcheck():
    """The hand-written backward of the latent rk4 steps against finite differences (every input, float64)."""
    torch.manual_seed(0)
    flows, rows, hidden = 2, 3, 4
    args = [torch.randn(flows, rows, hidden), torch.randn(flows, hidden, hidden) / 2,
            *(torch.randn(flows, 1, hidden) for _ in range(4))]
    args = [a.double().requires_grad_() for a in args]
    plan = floater_rk4.rk4_plan(4, 0.1)
    assert torch.autograd.gradcheck(lambda *a: floater_rk4._LatentRK4.apply(*a, plan), args, eps=1e-6, atol=1e-7)
    # rows never mix: flow 1's first 2 rows, and their gradient, as if solved alone
    used = lambda *a: floater_rk4._LatentRK4.apply(*a, plan)[1, :, :2]  # noqa: E731
    assert torch.autograd.gradcheck(used, args, eps=1e-6, atol=1e-7)
    alone = floater_rk4._LatentRK4.apply(args[0][1:, :2], *(a[1:] for a in args[1:]), plan)[0]
    torch.testing.assert_close(used(*args), alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("points", [2, 7, 33])
def test_latent_rk4_equals_torchdiffeq_on_h_with_padding_rows(points):
    """The default solve (own RK4 loop, padded flows of 5/2/3 rows) == torchdiffeq's rk4 on h, flow by flow:
    values and gradients to θ and b(0), float64, for several grid lengths; also continuing from a later index."""
    flows, initial = random_flows(rows=(5, 2, 3))
    assert flows[0].latent
    together = values_and_gradients(solve_flows(flows, initial, points), flows, initial)
    alone = values_and_gradients([solve_on_grid(f.dynamics, y0, points) for f, y0 in zip(flows, initial)],
                                 flows, initial)
    for a, b in zip([*together[0], *together[1]], [*alone[0], *alone[1]]):
        assert (a - b).abs().max() <= 1e-6 * b.abs().max() + 1e-14
    later = solve_flows(flows, initial, points, first_index=9)
    reference = [solve_on_grid(f.dynamics, y0, points, first_index=9) for f, y0 in zip(flows, initial)]
    for a, b in zip(later, reference):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_grid_solve_of_all_flows_continues_exactly_from_a_later_point():
    flows, initial = random_flows()
    with torch.no_grad():
        full = solve_flows(flows, initial, 30)
        tail = solve_flows(flows, [y[11] for y in full], 19, first_index=11)
    for a, b in zip(tail, full):
        torch.testing.assert_close(a, b[11:], rtol=0, atol=1e-12)


@pytest.mark.parametrize("layers", ["all", "input"])
@pytest.mark.parametrize("src_len,tgt_len", [(7, 6), (4, 9)])
def test_one_solve_per_training_forward_for_the_longest_sequence(monkeypatch, layers, src_len, tgt_len):
    model = floater_model(floater_layers=layers).train()
    calls = count_solves(monkeypatch)
    model(*batch(src_len=src_len, tgt_len=tgt_len))
    assert calls == [max(src_len, tgt_len)]


def test_every_flow_solved_together_equals_each_flow_alone():
    """The model's joint solve gives every flow exactly what solving it alone (FloaterFlow.forward) gives."""
    model = floater_model().eval()
    src, lengths, prev = batch()
    model(src, lengths, prev)
    pairs = [(model.encoder.floater_flow, model.encoder.floater_projections),
             (model.decoder.floater_flow, model.decoder.floater_projections),
             (model.decoder.floater_cross_flow, model.decoder.floater_cross_projections)]
    for (flow, projections), joint in zip(pairs, model.floater_positions._eval_cache.delta):
        with torch.no_grad():
            alone = flow([p.bias for p in projections], joint.size(0))
        torch.testing.assert_close(joint, alone, rtol=0, atol=1e-12)


def test_encoder_and_decoder_called_apart_in_training_equal_the_model_forward():
    model = floater_model().train()
    src, lengths, prev = batch()
    together = model(src, lengths, prev)[0]
    apart = model.decoder(prev, model.encoder(src, lengths))[0]
    torch.testing.assert_close(apart, together, rtol=0, atol=1e-12)
    apart.pow(2).mean().backward()
    assert model.decoder.floater_cross_flow.dynamics.fc2.weight.grad.abs().sum() > 0


def test_beam_search_solves_once(monkeypatch):
    """Generation: the encoder's request solves all flows (cache of 16 positions), every decoding step reuses it."""
    model = floater_model().eval()
    src, lengths, _ = batch(bsz=2)
    calls = count_solves(monkeypatch)
    gen = SequenceGenerator([model], TASK.target_dictionary, beam_size=4, max_len_b=12)
    gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(calls) == 1


def test_one_solve_per_forward_for_all_flows_with_every_block_in_one_state(monkeypatch):
    model = floater_model()
    calls = count_solves(monkeypatch)
    model.train()
    model(*batch())
    assert len(calls) == 1  # encoder flow, decoder flow and decoder cross flow together
    enc, dec = model.encoder, model.decoder
    assert [type(f) for f in (enc.floater_flow, dec.floater_flow, dec.floater_cross_flow)] == [FloaterFlow] * 3
    # the state stacks every block's initial values: 2 blocks × (q, k, v) | (q, k, v, cross q) | (cross k, v)
    assert len(enc.floater_projections) == 6
    assert len(dec.floater_projections) == 8 and len(dec.floater_cross_projections) == 4


def test_theta_shared_across_blocks_and_initial_values_per_block():
    model = floater_model()
    for coder in (model.encoder, model.decoder):
        # θ lives once, in the flow, never in a block
        layer_params = {id(p) for layer in coder.layers for p in layer.parameters()}
        for flow in flows(coder):
            assert not {id(p) for p in flow.parameters()} & layer_params
    enc = model.encoder
    for n, layer in enumerate(enc.layers):
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            assert enc.floater_projections[3 * n + j].bias is getattr(layer.self_attn, name).bias
    b0 = [p.bias for p in enc.floater_projections]
    assert len({id(b) for b in b0}) == len(b0) and all(isinstance(b, torch.nn.Parameter) for b in b0)
    # one backward reaches θ and every block's own b(0)
    model.train()
    out = model(*batch())[0]
    out.pow(2).mean().backward()
    assert enc.floater_flow.dynamics.fc2.weight.grad.abs().sum() > 0
    assert all(b.grad is not None and b.grad.abs().sum() > 0 for b in b0)


def test_parameters_added_per_arch():
    def added(arch):
        fl = sum(p.numel() for p in build("floater_" + arch).parameters())
        return fl - sum(p.numel() for p in build(arch).parameters())

    flow = lambda d: 2 * ((d + 1) * d + d)  # noqa: E731
    assert added("transformer_tiny") == 3 * flow(64)
    assert added("transformer_wmt_en_de") == 3 * flow(512) == 3 * 526_336  # encoder + 2 decoder flows


def test_input_variant_drives_only_the_first_block():
    model = floater_model(floater_layers="input")
    assert len(model.encoder.floater_projections) == 3
    assert len(model.decoder.floater_projections) == 4 and len(model.decoder.floater_cross_projections) == 2
    first = model.encoder.layers[0].self_attn
    assert {id(p) for p in model.encoder.floater_projections} == {id(first.q_proj), id(first.k_proj),
                                                                  id(first.v_proj)}


# -- warm start identity -------------------------------------------------------------------------------

@pytest.mark.parametrize("layers", ["all", "input"])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_zero_flow_equals_fairseq_transformer(mode, layers):
    fl = build("floater_transformer_tiny", floater_layers=layers)
    tr = build("transformer_tiny", seed=1)
    with torch.no_grad():  # non-trivial biases b(0) (and layer norms)
        for p in fl.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.2)
    randomize_flows(fl)
    for flow in flows(fl):
        flow.dynamics.zero_output_()
    missing, unexpected = tr.load_state_dict(fl.state_dict(), strict=False)
    assert not missing and all("floater" in k for k in unexpected)
    fl, tr = fl.double(), tr.double()
    getattr(fl, mode)()
    getattr(tr, mode)()
    src, lengths, prev = batch()
    torch.testing.assert_close(fl(src, lengths, prev)[0], tr(src, lengths, prev)[0], rtol=0, atol=1e-5)


# -- positions -----------------------------------------------------------------------------------------

def test_padding_does_not_move_positions():
    """A sentence's output does not depend on how much padding its batch adds (left source, right target)."""
    model = floater_model().eval()
    src, lengths, prev = batch()
    out = model(src, lengths, prev)[0]
    alone_src = src[0:1, 3:]  # sentence 0 without its left padding
    alone = model(alone_src, alone_src.ne(PAD).sum(1), prev[0:1])[0]
    torch.testing.assert_close(out[0:1], alone, rtol=0, atol=1e-6)
    alone = model(src[1:2], lengths[1:2], prev[1:2, :-2])[0]  # sentence 1 without its right padding
    torch.testing.assert_close(out[1:2, :-2], alone, rtol=0, atol=1e-6)


def test_positions_matter():
    model = floater_model().eval()
    src, lengths, prev = batch()
    enc = model.encoder(src, lengths)["encoder_out"][0]
    for flow in flows(model):
        flow.dynamics.zero_output_()
        flow.invalidate_cache()
    assert (model.encoder(src, lengths)["encoder_out"][0] - enc).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["self", "causal", "cross"])
def test_fused_attention_equals_fairseqs_own_path(kind, monkeypatch):
    """The attention FLOATER runs in training (F.scaled_dot_product_attention on the position-biased q, k, v)
    equals fairseq's MultiheadAttention path (scores, masks, softmax, values) in outputs and every gradient."""
    model = floater_model().train()
    layer = model.decoder.layers[0] if kind != "self" else model.encoder.layers[0]
    attention = layer.encoder_attn if kind == "cross" else layer.self_attn
    g = torch.Generator().manual_seed(3)
    T, S, B, C = 5, 7 if kind == "cross" else 5, 3, attention.embed_dim
    x = torch.randn(T, B, C, generator=g, dtype=torch.double, requires_grad=True)
    mem = torch.randn(S, B, C, generator=g, dtype=torch.double, requires_grad=True)
    padding = torch.zeros(B, S, dtype=torch.bool)
    if kind == "causal":
        padding[0, -2:] = True  # right padding, as fairseq batches targets
    else:
        padding[0, :2] = True  # left padding, as fairseq batches sources
    causal = torch.triu(torch.full((T, S), float("-inf"), dtype=torch.double), 1) if kind == "causal" else None
    key_rows = floater.rows_from_padding_mask(padding)  # (S, B)
    query_rows = torch.arange(T)[:, None] if kind == "cross" else key_rows  # cross: target positions
    delta = torch.randn(S, 3, C, generator=g, dtype=torch.double, requires_grad=True)
    key = mem if kind == "cross" else x
    # fairseq's softmax casts to float32; in double precision here, so that the paths must agree to 1e-10
    monkeypatch.setattr(utils, "softmax", lambda x, dim, onnx_trace=False: torch.softmax(x, dim))
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))

    def run(need_weights):
        with floater.bind_position_biases([attention.q_proj], delta[:T, :1], query_rows), \
                floater.bind_position_biases([attention.k_proj, attention.v_proj], delta[:, 1:], key_rows):
            out, _ = attention(x, key, key, key_padding_mask=padding, need_weights=need_weights,
                               static_kv=kind == "cross", attn_mask=causal)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=out.dtype)
        grads = torch.autograd.grad((out * weights).sum(), [x, mem, delta] + list(attention.parameters()),
                                    allow_unused=True)
        return out, grads

    fused, fused_grads = run(need_weights=False)
    assert calls, "the fused path was not taken"
    calls.clear()
    reference, reference_grads = run(need_weights=True)  # fairseq's own path
    assert not calls
    torch.testing.assert_close(fused, reference, rtol=0, atol=1e-10)
    for a, b in zip(fused_grads, reference_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_incremental_decoding_equals_full_forward():
    model = floater_model().eval()
    src, lengths, prev = batch()
    prev[1, -2:] = 5  # no padding inside the prefixes fed step by step
    enc = model.encoder(src, lengths)
    full = model.decoder(prev, enc)[0]
    state = {}
    steps = [model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0] for t in range(prev.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-6)


def test_long_incremental_decoding_equals_full_forward(monkeypatch):
    """40 steps: the step bias table kept in the incremental state is outgrown twice (16, 32, 64 rows); every
    step still equals the full forward, and a generation after a parameter change sees the new parameters."""
    model = floater_model().eval()
    src, lengths, _ = batch(src_len=5)
    prev = torch.randint(4, VOCAB, (src.size(0), 40), generator=torch.Generator().manual_seed(5))
    calls = count_solves(monkeypatch)

    def steps():
        enc, state = model.encoder(src, lengths), {}
        out = torch.cat([model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0]
                         for t in range(prev.size(1))], dim=1)
        return out, model.decoder(prev, enc)[0]

    incremental, full = steps()
    torch.testing.assert_close(incremental, full, rtol=0, atol=1e-6)
    assert len(calls) <= 3  # the first solve, then at most the eval cache's extensions (doublings)
    with torch.no_grad():
        model.decoder.layers[0].self_attn.q_proj.bias.add_(0.5)
    incremental_after, full_after = steps()
    torch.testing.assert_close(incremental_after, full_after, rtol=0, atol=1e-6)
    assert (full_after - full).abs().max() > 1e-3


def test_beam_search_scores_equal_teacher_forced_scores():
    """Beam 4 with left-padded sources: each hypothesis' step scores (incremental decoding, cross-attention
    keys projected once per sentence) equal a full forward over the finished hypothesis."""
    model = floater_model().eval()
    src, lengths, _ = batch(bsz=2)
    gen = SequenceGenerator([model], TASK.target_dictionary, beam_size=4, max_len_b=12, normalize_scores=False)
    hypos = gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    eos = TASK.target_dictionary.eos()
    for i, sentence in enumerate(hypos):
        for hypo in sentence:
            tokens = hypo["tokens"]
            prev = torch.cat([tokens.new_tensor([eos]), tokens[:-1]]).unsqueeze(0)
            logits = model(src[i: i + 1, src[i].ne(PAD)], lengths[i: i + 1], prev)[0]
            lprobs = model.get_normalized_probs((logits, None), log_probs=True)[0]
            expected = lprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(hypo["positional_scores"], expected, rtol=0, atol=1e-4)


def test_long_inputs_extend_the_cache_and_match_a_fresh_solve(monkeypatch):
    model = floater_model().eval()
    src, lengths, prev = batch(src_len=8)
    model(src, lengths, prev)  # cache holds 64 rows
    cached = model.floater_positions._eval_cache.delta[0].size(0)
    long_src, long_prev = torch.randint(4, VOCAB, (2, 4 * cached)), torch.randint(4, VOCAB, (2, 4 * cached))
    calls = count_solves(monkeypatch)
    out = model(long_src, long_src.ne(PAD).sum(1), long_prev)[0]
    assert len(calls) == 1  # one extension, all flows
    fresh = copy.deepcopy(model)
    for flow in flows(fresh):
        flow.invalidate_cache()
    torch.testing.assert_close(out, fresh(long_src, long_src.ne(PAD).sum(1), long_prev)[0], rtol=0, atol=1e-8)
    assert all(delta.size(0) >= 4 * cached for delta in model.floater_positions._eval_cache.delta)


# -- caching and gradients -----------------------------------------------------------------------------

def test_eval_cache_no_solve_until_parameters_change(monkeypatch):
    model = floater_model().eval()
    src, lengths, prev = batch()
    calls = count_solves(monkeypatch)
    first = model(src, lengths, prev)[0]
    assert len(calls) == 1
    torch.testing.assert_close(model(src, lengths, prev)[0], first, rtol=0, atol=0)
    assert len(calls) == 1  # second forward: no ODE work
    # a parameter update (in place, as optimizers do) invalidates the cache
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    model(src, lengths, prev)[0].pow(2).mean().backward()
    opt.step()
    model.eval()
    calls.clear()
    model(src, lengths, prev)
    assert len(calls) == 1
    # so do fairseq's set_num_updates (its Adam edits weights through .data, which keeps _version) ...
    def edit_through_data_then_set_num_updates():
        model.encoder.floater_flow.dynamics.fc2.bias.data.add_(0.01)
        model.set_num_updates(7)

    # ... and load_state_dict
    for change in (edit_through_data_then_set_num_updates, lambda: model.load_state_dict(model.state_dict())):
        calls.clear()
        model(src, lengths, prev)
        assert len(calls) == 0
        change()
        model(src, lengths, prev)
        assert len(calls) == 1


def train_updates(model, n_updates, seed=0):
    """fairseq's loop in miniature: forward, backward, step, set_num_updates. Yields per-update facts."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    enc_flow = model.encoder.floater_flow
    theta = list(enc_flow.dynamics.parameters())
    b0 = model.encoder.floater_projections[0].bias
    for k in range(n_updates):
        opt.zero_grad(set_to_none=True)
        solves_before = enc_flow.num_solves
        model(*batch(seed=seed + k))[0].pow(2).mean().backward()
        theta_grad = sum(float(p.grad.abs().sum()) if p.grad is not None else 0.0 for p in theta)
        yield dict(update=k, theta_grad=theta_grad, b0_grad=float(b0.grad.abs().sum()),
                   solved=enc_flow.num_solves > solves_before)
        opt.step()
        model.set_num_updates(k + 1)


def test_update_every_1_gives_theta_gradient_every_update():
    for fact in train_updates(floater_model(floater_update_every=1), 4):
        assert fact["solved"] and fact["theta_grad"] > 0 and fact["b0_grad"] > 0


def test_update_every_n_resolves_every_n_updates_and_b0_always_learns(monkeypatch):
    model = floater_model(floater_update_every=3)
    calls = count_solves(monkeypatch)
    facts = list(train_updates(model, 7))
    assert [f["solved"] for f in facts] == [k % 3 == 0 for k in range(7)]
    # updates 0, 3, 6: the solve with gradient (7 positions) and the cache's, from the same b(0) and θ without
    # gradient (16 positions, see FloaterPositions._canonical); the other updates do no solver work at all
    assert calls == [7, 16] * 3
    for f in facts:
        assert (f["theta_grad"] > 0) == (f["update"] % 3 == 0)
        assert f["b0_grad"] > 0  # b(0) + cached Δb: b(0) keeps its gradient
    # the counter and the cache are module state: they survive a state_dict round trip (checkpoint resume)
    assert int(model.encoder.floater_flow.num_updates) == 7
    state = model.state_dict()
    theta = sum(p.numel() for p in model.encoder.floater_flow.parameters())
    assert state["encoder.floater_flow._extra_state"].shape == (6 * 64 + theta,)  # b(0) and θ of update 6
    resumed = floater_model(floater_update_every=3, seed=5)
    resumed.load_state_dict(state)
    assert all(f._num_updates == 7 and int(f.num_updates) == 7 for f in flows(resumed))
    calls.clear()
    facts = list(train_updates(resumed, 1))  # update 7: the cache rebuilt from update 6's b(0) and θ, no gradient
    assert calls == [16] and facts[0]["theta_grad"] == 0
    # a checkpoint without the cache (saved before it travelled with the model) loads strictly, then re-solves
    old = floater_model(floater_update_every=3, seed=5)
    old.load_state_dict({k: v for k, v in state.items() if not k.endswith("_extra_state")})
    assert all(f.train_cache is None for f in flows(old))
    assert next(train_updates(old, 1))["theta_grad"] > 0


def test_cached_training_update_uses_cached_values():
    model = floater_model(floater_update_every=4)
    gen = train_updates(model, 2)
    next(gen)
    cached = [f.train_cache.delta.clone() for f in flows(model)]
    next(gen)  # update 1: reuse
    for now, before in zip([f.train_cache.delta for f in flows(model)], cached):
        torch.testing.assert_close(now[: before.size(0)], before, rtol=0, atol=0)


# -- errors and flags ----------------------------------------------------------------------------------

def test_non_finite_solution_raises_one_clear_error():
    model = floater_model().eval()
    with torch.no_grad():
        model.encoder.floater_flow.dynamics.fc2.bias.fill_(float("nan"))
    with pytest.raises(FloaterSolverError, match=r"non-finite.*--floater-method rk4 --floater-dt 0.1"):
        model(*batch())


def parse(argv, capsys):
    parser = options.get_training_parser()
    with pytest.raises(SystemExit) as exit_info:
        options.parse_args_and_arch(parser, input_args=["data-bin", "--user-dir", "fairseq_plugins", *argv])
    return exit_info.value.code, capsys.readouterr()


@pytest.mark.parametrize("flag,value,message", [
    ("--floater-dt", "-1", "argument --floater-dt: must be > 0, got -1"),
    ("--floater-dt", "x", "argument --floater-dt: expected a number, got 'x'"),
    ("--floater-method", "leapfrog", "argument --floater-method: invalid choice: 'leapfrog'"),
    ("--floater-update-every", "0", "argument --floater-update-every: must be > 0, got 0"),
    ("--floater-hidden", "0", "argument --floater-hidden: must be > 0, got 0"),
    ("--floater-layers", "some", "argument --floater-layers: invalid choice: 'some'"),
])
def test_bad_flags_give_one_error_line(flag, value, message, capsys):
    code, out = parse(["--arch", "floater_transformer_tiny", flag, value], capsys)
    assert code == 2
    errors = [line for line in out.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0]


def test_flags_in_help_and_defaults(capsys):
    code, out = parse(["--arch", "floater_transformer", "--help"], capsys)
    text = " ".join(out.out.split())
    assert code == 0
    for flag in ("--floater-dt D grid spacing", "--floater-method SOLVER torchdiffeq solver",
                 "--floater-rtol R relative", "--floater-atol A absolute", "--floater-adjoint back-propagate",
                 "--floater-hidden H hidden width", "--floater-update-every N re-solve",
                 "--floater-no-cuda-graph on CUDA", "--floater-layers {all,input} blocks"):
        assert flag in text
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        "data-bin", "--user-dir", "fairseq_plugins", "--arch", "floater_transformer_tiny"])
    assert (args.floater_dt, args.floater_method, args.floater_update_every, args.floater_layers,
            args.floater_adjoint, args.floater_hidden) == (0.1, "rk4", 1, "all", False, None)
    assert (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_layers,
            args.encoder_attention_heads) == (64, 64, 2, 2)  # fairseq's transformer_tiny


@pytest.mark.parametrize("setting,message", [
    (dict(floater_dt=0.0), "--floater-dt must be"),
    (dict(floater_method="leapfrog"), "--floater-method must be one of"),
    (dict(floater_update_every=0), "--floater-update-every must be"),
    (dict(floater_hidden=0), "--floater-hidden must be"),
    (dict(floater_layers="most"), "--floater-layers must be"),
    (dict(cross_self_attention=True), "does not support --cross-self-attention"),
])
def test_bad_settings_rejected_at_build(setting, message):
    with pytest.raises(ValueError, match=message):
        build("floater_transformer_tiny", **setting)


def test_adaptive_solver_and_adjoint_train():
    model = floater_model(floater_method="dopri5", floater_adjoint=True)
    fact = next(train_updates(model, 1))
    assert fact["solved"] and fact["theta_grad"] > 0


def test_archs_are_fairseqs_with_floater_defaults():
    floater_defaults = dict(floater_dt=0.1, floater_method="rk4", floater_rtol=1e-4, floater_atol=1e-6,
                            floater_adjoint=False, floater_hidden=None, floater_update_every=1, floater_layers="all",
                            floater_no_cuda_graph=False)
    for suffix in ("", "_wmt_en_de", "_vaswani_wmt_en_de_big", "_vaswani_wmt_en_fr_big", "_tiny"):
        ours, theirs = argparse.Namespace(), argparse.Namespace()
        ARCH_CONFIG_REGISTRY["floater_transformer" + suffix](ours)
        ARCH_CONFIG_REGISTRY["transformer" + suffix](theirs)
        assert vars(ours) == {**vars(theirs), **floater_defaults}


# -- precision -----------------------------------------------------------------------------------------

def rounded_copies(flows, initial, dtype):
    """The float32 flows and b(0) with their values rounded through dtype, and copies of them in dtype."""
    with torch.no_grad():
        for flow in flows:
            for p in flow.parameters():
                p.copy_(p.to(dtype).float())
    initial = [y.detach().to(dtype).float().requires_grad_() for y in initial]
    low = [copy.deepcopy(flow).to(dtype) for flow in flows]
    return initial, low, [y.detach().to(dtype).requires_grad_() for y in initial]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method,adjoint", [("rk4", False), ("rk4", True), ("euler", False), ("dopri5", False)])
def test_half_precision_model_solves_in_float32(dtype, method, adjoint):
    """A bf16/fp16 model's solve equals the float32 model's with the same weight values; θ's and b(0)'s gradients
    come back in the parameters' dtype, equal to the float32 gradients up to that dtype's rounding."""
    flows, initial = random_flows(dim=16, hidden=16, dtype=torch.float32, method=method, adjoint=adjoint,
                                  rtol=1e-6, atol=1e-8)
    initial, low_flows, low_initial = rounded_copies(flows, initial, dtype)
    reference = values_and_gradients(solve_flows(flows, initial, 20), flows, initial)
    out = solve_flows(low_flows, low_initial, 20)
    assert all(y.dtype == torch.float32 for y in out)
    values, grads = values_and_gradients(out, low_flows, low_initial)
    for y, ref in zip(values, reference[0]):
        assert (y - ref).abs().max() <= 1e-5 * ref.abs().max()
    eps = torch.finfo(dtype).eps
    for g, ref in zip(grads, reference[1]):
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), ref, rtol=eps, atol=eps * float(ref.abs().max()))


def test_solve_is_float32_under_autocast():
    flows, initial = random_flows(dim=16, hidden=16, dtype=torch.float32)
    reference = values_and_gradients(solve_flows(flows, initial, 20), flows, initial)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = solve_flows(flows, initial, 20)
    assert all(y.dtype == torch.float32 for y in out)
    for a, b in zip([*values_and_gradients(out, flows, initial)[0]], reference[0]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model_trains_and_decodes(dtype):
    """Δb is added in the projections' dtype: a bf16/fp16 model's forward stays in its dtype, θ gets gradient."""
    model = randomize_flows(build("floater_transformer_tiny")).to(dtype)
    out = model.train()(*batch())[0]
    assert out.dtype == dtype
    out.float().pow(2).mean().backward()
    theta = model.encoder.floater_flow.dynamics.fc2.weight
    assert theta.grad.dtype == dtype and theta.grad.abs().sum() > 0
    with torch.no_grad():
        assert model.eval()(*batch())[0].dtype == dtype


# -- validation and optimizers ------------------------------------------------------------------------

def test_validation_solves_once_per_parameter_version(monkeypatch):
    """fairseq's valid_step calls model.eval() before every batch: one solve for all of them; the next
    training update (in place through .data, then set_num_updates, as fairseq's trainer) invalidates it."""
    model = floater_model()
    calls = count_solves(monkeypatch)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for update in range(2):
        model.train()
        model(*batch())[0].pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.05)  # through .data: no _version bump
        opt.zero_grad()
        model.set_num_updates(update + 1)
        calls.clear()
        for k in range(4):
            model.eval()
            with torch.no_grad():
                model(*batch(seed=k))
        assert len(calls) == 1


def test_theta_may_skip_update_only_with_cached_updates():
    """--floater-update-every N > 1: θ sits out the cached updates; its parameters say so to optimizers."""
    for every in (1, 3):
        model = build("floater_transformer_tiny", floater_update_every=every).half()
        theta = {id(p) for flow in flows(model) for p in flow.dynamics.parameters()}
        for p in model.parameters():
            assert getattr(p, "may_skip_update", False) == (every > 1 and id(p) in theta)


# -- the solve's operators and host synchronisations ------------------------------------------------------

SYNCING = {"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "item"}  # aten ops that wait for the device


class CountOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Every non-view aten operator (one kernel launch on a GPU) and those that synchronise with the host."""

    def __init__(self):
        super().__init__()
        self.ops, self.syncs = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not func.is_view
        if func.overloadpacket.__name__ in SYNCING:
            self.syncs.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("points", [9, 40])
def test_default_solve_has_no_host_sync_and_few_operators(points):
    """The default solve (forward and backward) waits on no device value (.item(), tolist, equal, bool(tensor)):
    counted on CPU through the dispatcher, and under CUDA's sync debug mode when a GPU is present; its
    operators per RK4 step stay under a bound (≤ 16 forward, ≤ 24 backward; measured 12 and about 15)."""
    flows, initial = random_flows(rows=(5, 2, 3), dtype=torch.float32)
    steps = 5 * (points - 1)
    with CountOps() as forward:
        ys = solve_flows(flows, initial, points)
    loss = sum(y.sum() for y in ys)
    with CountOps() as backward:
        loss.backward()
    assert forward.syncs == [] and backward.syncs == []
    assert forward.ops <= 16 * steps + 60 and backward.ops <= 24 * steps + 60, (forward.ops, backward.ops)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_default_solve_on_cuda_has_no_host_sync(cuda_graph):
    flows, initial = random_flows(rows=(5, 2, 3), dtype=torch.float32, cuda_graph=cuda_graph)
    flows = [f.cuda() for f in flows]
    initial = [y.detach().cuda().requires_grad_() for y in initial]
    reference = values_and_gradients(solve_flows(flows, initial, 21), flows, initial)  # captures, if graphed
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ys = solve_flows(flows, initial, 21)
        grads = torch.autograd.grad(sum(y.sum() for y in ys), [p for f in flows for p in f.parameters()])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(grads) == 12
    again = values_and_gradients(solve_flows(flows, initial, 21), flows, initial)
    for a, b in zip([*again[0], *again[1]], [*reference[0], *reference[1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_captured_solve_path_buckets_lengths_and_keeps_values(monkeypatch):
    """The CUDA-graph path's logic on CPU (capture replaced by the plain kernel): a length solves its bucket's
    grid and keeps its first rows, values and gradients as the plain loop; one capture per bucket and shapes."""
    assert [floater_rk4.graph_bucket(n) for n in (1, 16, 17, 24, 25, 33, 49, 65, 97, 129, 200)] == \
        [16, 16, 24, 24, 32, 48, 64, 96, 128, 192, 256]
    captures = []

    def fake_capture(fn, samples, allow_unused_input=False):
        captures.append([tuple(a.shape) for a in samples])
        return fn

    monkeypatch.setattr(floater_rk4, "_GRAPHS", {})
    monkeypatch.setattr(floater_rk4, "_capturable", lambda y0, args, first_index: first_index == 0)
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake_capture)
    flows, initial = random_flows(rows=(5, 2, 3))
    plain = [FloaterFlow(6, 7, FloaterSettings(cuda_graph=False)).double() for _ in flows]
    for a, b in zip(plain, flows):
        a.load_state_dict(b.state_dict())
    for points in (21, 19, 30):
        graphed = values_and_gradients(solve_flows(flows, initial, points), flows, initial)
        reference = values_and_gradients(solve_flows(plain, initial, points), plain, initial)
        for a, b in zip([*graphed[0], *graphed[1]], [*reference[0], *reference[1]]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert len(captures) == 2  # buckets 24 (21 and 19 positions) and 32
