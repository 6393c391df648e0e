"""FLOATER's position-biased projections (fairseq_plugins/modules/floater/attention.py, scheme.py): positions
follow fairseq's numbering, and the fused attention on them equals the explicit path."""
import argparse
from pathlib import Path

import pytest
import torch
from fairseq import utils

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.modules import floater  # noqa: E402
from helpers.floater_helpers import (  # noqa: E402, F401  (one_thread: autouse fixture)
    one_thread,
    PAD,
    flows,
    floater_model,
    batch,
)


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
def test_fused_attention_equals_the_explicit_path(kind, monkeypatch):
    """The attention FLOATER runs in training (F.scaled_dot_product_attention on the position-biased q, k, v)
    equals the explicit path (scores, masks, softmax, values: what runs when the weights are asked for) in
    outputs and every gradient, Δb's included."""
    model = floater_model().train()
    stack = model.decoder if kind != "self" else model.encoder
    layer, scheme = stack.layers[0], stack.position_scheme
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
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(1) or sdpa(*a, **kw))

    def run(need_weights):
        bindings = {**floater.position_bindings([attention.q_proj], delta[:T, :1], query_rows),
                    **floater.position_bindings([attention.k_proj, attention.v_proj], delta[:, 1:], key_rows)}
        with scheme.bound(bindings):
            out, _ = attention(x, key, key, key_padding_mask=padding, need_weights=need_weights,
                               static_kv=kind == "cross", attn_mask=causal)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=out.dtype)
        grads = torch.autograd.grad((out * weights).sum(), [x, mem, delta] + list(attention.parameters()),
                                    allow_unused=True)
        return out, grads

    fused, fused_grads = run(need_weights=False)
    assert calls, "the fused path was not taken"
    calls.clear()
    reference, reference_grads = run(need_weights=True)  # the explicit path
    assert not calls
    assert fused_grads[2].abs().sum() > 0  # Δb reached the projections
    torch.testing.assert_close(fused, reference, rtol=0, atol=1e-10)
    for a, b in zip(fused_grads, reference_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_position_bias_gradient_does_not_depend_on_threads():
    """Δb's gradient sums the tokens of each position in one order whatever the intra-op threads: with
    delta[rows] the backward (index_put, accumulate) added them in a thread-scheduled order, so two runs of the
    same training on a 2-thread CPU drifted apart (1e-4 in the weights after 3 toy epochs)."""
    gen = torch.Generator().manual_seed(0)
    proj = torch.nn.Linear(64, 64)
    x = torch.randn(40, 48, 64, generator=gen)  # (T, B, in): 40 * 48 * 64 elements, past torch's parallel grain
    delta0 = torch.randn(40, 64, generator=gen)
    rows = torch.randint(0, 40, (40, 48), generator=gen)  # every position shared by many tokens
    grad_out = torch.randn(40, 48, 64, generator=gen)

    def delta_grad(threads):
        torch.set_num_threads(threads)
        delta = delta0.clone().requires_grad_()
        try:
            floater.biased_projection(proj, x, (delta, rows)).backward(grad_out)
        finally:
            torch.set_num_threads(1)
        return delta.grad

    serial = delta_grad(1)
    torch.testing.assert_close(serial, torch.zeros_like(serial).index_put_((rows,), grad_out, accumulate=True))
    for _ in range(3):
        assert torch.equal(delta_grad(2), serial)
