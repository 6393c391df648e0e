"""RelativeMultiheadAttention against the equations of Shaw et al. (2018), written out naively."""
import argparse
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fairseq import utils
from fairseq.modules import MultiheadAttention

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.modules.relative_attention import (  # noqa: E402
    RelativeAttention,
    RelativeMultiheadAttention,
    gather_by_offset,
    relative_index,
    sum_by_offset,
)

EMBED, HEADS, K = 8, 2, 4


def make_attention(k=K, keys=True, values=True, per_head=True, seed=0):
    torch.manual_seed(seed)
    m = RelativeMultiheadAttention(EMBED, HEADS, k, relative_keys=keys, relative_values=values, per_head=per_head)
    return m.double().eval()


def naive_relative_attention(m, x, key_padding_mask=None, attn_mask=None, dropout_keep=None, return_weights=False):
    """e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z), z_i = Σ_j α_ij (x_j W^V + a^V_ij), with explicit
    (T, T, d_z) tensors a_ij = w_clip(j−i, k); attention dropout multiplies α by dropout_keep (B, H, T, T)."""
    T, B, E = x.shape
    H, d, k = m.num_heads, m.head_dim, m.max_relative_positions

    def heads(y):  # (T, B, E) -> (B, H, T, d)
        return y.view(T, B, H, d).permute(1, 2, 0, 3)

    def pair_vectors(table):  # a_ij for every pair: (H, T, T, d)
        if table is None:
            return torch.zeros(H, T, T, d, dtype=x.dtype)
        a = torch.empty(H, T, T, d, dtype=x.dtype)
        for i in range(T):
            for j in range(T):
                row = max(-k, min(k, j - i)) + k
                a[:, i, j] = table[:, row] if table.dim() == 3 else table[row]
        return a

    xq = heads(x @ m.q_proj.weight.T + m.q_proj.bias)
    xk = heads(x @ m.k_proj.weight.T + m.k_proj.bias)
    xv = heads(x @ m.v_proj.weight.T + m.v_proj.bias)
    keys = xk[:, :, None, :, :] + pair_vectors(m.relative_keys)  # x_j W^K + a^K_ij: (B, H, T, T, d)
    values = xv[:, :, None, :, :] + pair_vectors(m.relative_values)
    e = torch.einsum("bhid,bhijd->bhij", xq, keys) / math.sqrt(d)
    if attn_mask is not None:
        e = e + attn_mask
    if key_padding_mask is not None:
        e = e.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    alpha = e.softmax(dim=-1)
    dropped = alpha if dropout_keep is None else alpha * dropout_keep
    z = torch.einsum("bhij,bhijd->bhid", dropped, values)
    out = z.permute(2, 0, 1, 3).reshape(T, B, E) @ m.out_proj.weight.T + m.out_proj.bias
    return (out, alpha) if return_weights else out


def causal_mask(T):
    return torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)


def inputs(T, B=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, B, EMBED, generator=g, dtype=torch.float64)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[-1, : T // 3] = True  # left padding, as fairseq's source side
    return x, pad


@pytest.mark.parametrize("k,tgt_len,src_len", [(2, 6, 6), (3, 1, 5), (4, 2, 9), (0, 3, 3), (5, 4, 4)])
def test_offset_maps_are_the_explicit_buckets_and_adjoint(k, tgt_len, src_len):
    index = relative_index(k, tgt_len, src_len, torch.device("cpu"))
    x = torch.randn(2, tgt_len, 2 * k + 1, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, tgt_len, src_len, dtype=torch.float64, requires_grad=True)
    buckets = torch.zeros(2, tgt_len, 2 * k + 1, dtype=torch.float64)
    gathered = torch.zeros(2, tgt_len, src_len, dtype=torch.float64)
    for i in range(tgt_len):
        a = src_len - tgt_len + i  # absolute position of query i
        for j in range(src_len):
            m = max(-k, min(k, j - a)) + k
            buckets[:, i, m] += y[:, i, j].detach()
            gathered[:, i, j] = x[:, i, m].detach()
    torch.testing.assert_close(sum_by_offset(y, index), buckets, rtol=0, atol=1e-12)
    torch.testing.assert_close(gather_by_offset(x, index), gathered, rtol=0, atol=0)
    torch.testing.assert_close((gather_by_offset(x, index) * y).sum(), (x * sum_by_offset(y, index)).sum())
    assert torch.autograd.gradcheck(lambda t: gather_by_offset(t, index), (x,))
    assert torch.autograd.gradcheck(lambda t: sum_by_offset(t, index), (y,))


@pytest.mark.parametrize("T", [3, 9])  # shorter and longer than k
@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("keys,values", [(True, True), (True, False), (False, True)])
def test_matches_equations_forward_and_gradients(T, per_head, keys, values):
    m = make_attention(keys=keys, values=values, per_head=per_head)
    x, pad = inputs(T)
    x.requires_grad_(True)
    out, _ = m(x, x, x, key_padding_mask=pad)
    ref = naive_relative_attention(m, x, key_padding_mask=pad)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)

    probe = torch.randn_like(out)
    wrt = [x] + [p for p in (m.relative_keys, m.relative_values, m.q_proj.weight, m.v_proj.weight) if p is not None]
    grads = torch.autograd.grad((out * probe).sum(), wrt)
    ref_grads = torch.autograd.grad((ref * probe).sum(), wrt)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)


@pytest.mark.parametrize("per_head", [True, False])
def test_matches_equations_with_causal_mask(per_head):
    m = make_attention(per_head=per_head)
    x, pad = inputs(7)
    x.requires_grad_(True)
    out, _ = m(x, x, x, attn_mask=causal_mask(7))
    ref = naive_relative_attention(m, x, attn_mask=causal_mask(7))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    gx, = torch.autograd.grad(out.sum(), x)
    rx, = torch.autograd.grad(ref.sum(), x)
    torch.testing.assert_close(gx, rx, rtol=0, atol=1e-12)


def test_attention_weights_and_their_gradients_match_the_equations():
    """need_head_weights returns α (B, H, T, S) with gradient, as fairseq's MultiheadAttention does."""
    m = make_attention()
    x, pad = inputs(6)
    x.requires_grad_(True)
    out, weights = m(x, x, x, key_padding_mask=pad, need_head_weights=True)
    ref, ref_weights = naive_relative_attention(m, x, key_padding_mask=pad, return_weights=True)
    torch.testing.assert_close(weights.transpose(0, 1), ref_weights, rtol=0, atol=1e-12)
    probe_out, probe_w = torch.randn_like(out), torch.randn_like(weights)
    wrt = [x, m.relative_keys, m.relative_values, m.k_proj.weight]
    grads = torch.autograd.grad((out * probe_out).sum() + (weights * probe_w).sum(), wrt)
    ref_grads = torch.autograd.grad((ref * probe_out).sum() + (ref_weights.transpose(0, 1) * probe_w).sum(), wrt)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)


def test_attention_dropout_matches_the_equations():
    """Training with attention dropout: z uses α·keep/(1 − p), the weights returned are α before dropout."""
    torch.manual_seed(0)
    m = RelativeMultiheadAttention(EMBED, HEADS, K, dropout=0.3).double().train()
    x, pad = inputs(6)
    x.requires_grad_(True)
    torch.manual_seed(5)
    out, weights = m(x, x, x, key_padding_mask=pad, need_head_weights=True)
    torch.manual_seed(5)  # the same draws: the module's mask, (B·H, T, S)
    keep = torch.empty(2 * HEADS, 6, 6, dtype=torch.bool).bernoulli_(0.7).view(2, HEADS, 6, 6).double() / 0.7
    ref, ref_weights = naive_relative_attention(m, x, key_padding_mask=pad, dropout_keep=keep, return_weights=True)
    assert not torch.equal(keep, torch.ones_like(keep) / 0.7)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights.transpose(0, 1), ref_weights, rtol=0, atol=1e-12)
    wrt = [x, m.relative_keys, m.relative_values, m.q_proj.weight]
    probe = torch.randn_like(out)
    for g, r in zip(torch.autograd.grad((out * probe).sum(), wrt), torch.autograd.grad((ref * probe).sum(), wrt)):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)


@pytest.mark.parametrize("per_head", [True, False])
@pytest.mark.parametrize("dropout_p", [0.0, 0.25])
def test_attention_function_gradcheck(per_head, dropout_p):
    """RelativeAttention's written-out backward against finite differences: scores, masks, tables, the weights'
    own gradient, and dropout (the same mask on every call)."""
    B, T, d, k = 2, 5, 3, 2
    N = B * HEADS
    g = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    table = (HEADS, 2 * k + 1, d) if per_head else (2 * k + 1, d)
    q, key, v, wk, wv = rand(N, T, d), rand(N, T, d), rand(N, T, d), rand(*table), rand(*table)
    index = relative_index(k, T, T, torch.device("cpu"))
    pad = torch.zeros(B, 1, 1, T, dtype=torch.bool)
    pad[1, ..., -1] = True  # with the causal mask, every query keeps a key

    def mask(scores):  # in place, returning the scores
        scores += causal_mask(T)
        scores.view(B, HEADS, T, T).masked_fill_(pad, float("-inf"))
        return scores

    def attention(*tensors):
        torch.manual_seed(3)
        return RelativeAttention.apply(*tensors, index, HEADS, mask, dropout_p)

    assert torch.autograd.gradcheck(attention, (q, key, v, wk, wv), fast_mode=True)


def test_autocast_runs_the_products_in_the_autocast_dtype():
    m = make_attention().float().train()
    x, pad = (t.float() if t.is_floating_point() else t for t in inputs(9))
    x.requires_grad_(True)
    ref = m(x, x, x, key_padding_mask=pad)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x, x, x, key_padding_mask=pad)[0]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=5e-2)
    out.float().sum().backward()
    assert m.relative_keys.grad.dtype == torch.float32 and torch.isfinite(m.relative_keys.grad).all()


def test_long_sequence_matches_the_equations():
    m = make_attention(k=2)
    x, pad = inputs(70, B=1)
    torch.testing.assert_close(m(x, x, x)[0], naive_relative_attention(m, x), rtol=0, atol=1e-12)


def test_k_zero_is_the_no_position_ablation():
    """k = 0: one vector for every pair, computed as the equations say; permuting the input permutes the output."""
    m = make_attention(k=0)
    assert m.relative_keys.shape == (HEADS, 1, EMBED // HEADS)
    x, _ = inputs(5)
    out, _ = m(x, x, x)
    torch.testing.assert_close(out, naive_relative_attention(m, x), rtol=0, atol=1e-12)
    perm = torch.tensor([3, 0, 4, 1, 2])
    torch.testing.assert_close(m(x[perm], x[perm], x[perm])[0], out[perm], rtol=0, atol=1e-12)


def test_left_padding_does_not_move_relative_positions():
    m = make_attention()
    x, _ = inputs(6, B=1)
    padded = torch.cat([torch.randn(3, 1, EMBED, dtype=torch.float64), x])
    pad = torch.tensor([[True] * 3 + [False] * 6])
    torch.testing.assert_close(m(padded, padded, padded, key_padding_mask=pad)[0][3:], m(x, x, x)[0])


@pytest.mark.parametrize("zeroed", ["tables", "absent"])
def test_without_relative_terms_equals_fairseq_attention(zeroed):
    torch.manual_seed(0)
    if zeroed == "tables":
        rel = RelativeMultiheadAttention(EMBED, HEADS, K)
        with torch.no_grad():
            rel.relative_keys.zero_()
            rel.relative_values.zero_()
    else:
        rel = RelativeMultiheadAttention(EMBED, HEADS, K, relative_keys=False, relative_values=False)
    mha = MultiheadAttention(EMBED, HEADS, self_attention=True)
    missing, unexpected = mha.load_state_dict(rel.state_dict(), strict=False)
    assert not missing and set(unexpected) <= {"relative_keys", "relative_values"}
    x, pad = (t.float() if t.is_floating_point() else t for t in inputs(6))
    for kwargs in ({"key_padding_mask": pad}, {"attn_mask": causal_mask(6).float()}):
        out, w = rel(x, x, x, need_weights=True, **kwargs)
        ref, ref_w = mha(x, x, x, need_weights=True, **kwargs)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
        torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-6)


def test_never_takes_fairseqs_fused_paths(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("fused attention path taken")

    monkeypatch.setattr(F, "multi_head_attention_forward", refuse)
    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    m = make_attention()
    x, pad = inputs(5)
    for training in (True, False):
        m.train(training)
        m(x, x, x, key_padding_mask=pad, need_weights=False)


@pytest.mark.parametrize("per_head", [True, False])
def test_incremental_decoding_with_beam_reorder_equals_causal_forward(per_head):
    m = make_attention(per_head=per_head)
    T, B = 7, 3
    x, _ = inputs(T, B=B)
    new_order = torch.tensor([2, 0, 0])  # beams dropped and duplicated, as in beam search
    full = m(x, x, x, attn_mask=causal_mask(T))[0]
    full_reordered = m(x[:, new_order], x[:, new_order], x[:, new_order], attn_mask=causal_mask(T))[0]

    state, steps = {}, []
    for t in range(T):
        if t == 4:
            m.reorder_incremental_state(state, new_order)
        xt = x[t : t + 1, new_order] if t >= 4 else x[t : t + 1]
        steps.append(m(xt, xt, xt, incremental_state=state)[0])
        expected = full_reordered[t : t + 1] if t >= 4 else full[t : t + 1]
        torch.testing.assert_close(steps[-1], expected, rtol=0, atol=1e-5)
    assert m._get_input_buffer(state)["prev_key"].shape == (B, HEADS, T, EMBED // HEADS)


def test_need_head_weights_and_before_softmax_keep_fairseqs_shapes():
    m = make_attention()
    x, pad = inputs(5)
    out, w = m(x, x, x, key_padding_mask=pad, need_head_weights=True)
    assert out.shape == x.shape and w.shape == (HEADS, 2, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(HEADS, 2, 5, dtype=torch.float64))
    scores, v = m(x, x, x, before_softmax=True)
    assert scores.shape == (2 * HEADS, 5, 5) and v.shape == (2 * HEADS, 5, EMBED // HEADS)
    # the logits are the ones the weights come from (e_ij of eq. 4, scale included): softmax gives the weights
    w_all = m(x, x, x, need_head_weights=True)[1]
    torch.testing.assert_close(scores.softmax(-1).view(2, HEADS, 5, 5).transpose(0, 1), w_all, rtol=0, atol=1e-12)


def test_bfloat16_stays_close_to_float32():
    m = make_attention().float()
    x, pad = (t.float() if t.is_floating_point() else t for t in inputs(9))
    out = m(x, x, x, key_padding_mask=pad)[0]
    out_bf16 = m.bfloat16()(x.bfloat16(), x.bfloat16(), x.bfloat16(), key_padding_mask=pad)[0]
    assert out_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(out_bf16.float(), out, rtol=0, atol=5e-2)
