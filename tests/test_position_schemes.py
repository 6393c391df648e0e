"""The position schemes of the table (fairseq_plugins/modules/position_schemes.py), one contract for all:

- each attention scheme (T5 bias, ALiBi, RoPE) against a naive reference written from its paper's equation,
  loop by loop in float64 (outputs and gradients, with padding and the causal mask);
- for every scheme with architectures: incremental decoding with beam reordering == the full forward; a sentence
  alone == the same sentence left-padded in a batch; a 1,000-token source; beam search; scripting refused in one
  line; a bad flag is one line; every registered architecture is in the table;
- SHAPE's offsets: training shifts each sequence by one offset in 0..K, evaluation is the sinusoidal embedding.
"""
import argparse
import math
import subprocess

import pytest
import torch
from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.modules import SinusoidalPositionalEmbedding
from fairseq.sequence_generator import SequenceGenerator

from conftest import BIN, REPO
from tiny_models import EOS, PAD, TASK, VOCAB, one_thread  # noqa: F401  (one_thread: autouse fixture)
from fairseq_plugins.modules.alibi import ALiBi, alibi_slopes
from fairseq_plugins.modules.position_schemes import NEW_SCHEMES, SCHEMES
from fairseq_plugins.modules.positional_attention import PositionalSelfAttention
from fairseq_plugins.modules.rope import RoPE
from fairseq_plugins.modules.shape_positions import ShapePositionalEmbedding
from fairseq_plugins.modules.t5_bias import T5Bias, relative_bucket

ARCHS = [f"{s}_transformer_tiny" for s in NEW_SCHEMES]


def build(arch, **kw):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    torch.manual_seed(0)
    args = argparse.Namespace(arch=arch, dropout=0.0, **kw)
    ARCH_CONFIG_REGISTRY[arch](args)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, TASK)
    with torch.no_grad():  # T5's table starts at zero: make the bias matter
        for module in model.modules():
            if isinstance(module, T5Bias):
                module.bias.weight.normal_(std=0.5)
    return model


# -- naive references, from the papers' equations ---------------------------------------------------------------

def t5_bucket_naive(relative, bidirectional, num_buckets=32, max_distance=128):
    n, bucket = -relative, 0
    if bidirectional:
        num_buckets //= 2
        bucket += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return bucket + min(large, num_buckets - 1)


def naive_attention(attn, x, padding, causal, bias_fn=None, rotate_fn=None):
    """out_i = Σ_j softmax_j(e_ij) v_j, e_ij = (R_i q_i)·(R_j k_j)/sqrt(d) + bias_h(i, j), loop by loop."""
    T, B, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    out = torch.zeros(T, B, C, dtype=x.dtype)
    rows = []
    for b in range(B):
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            for i in range(T):
                qi = q[i, b, sl] if rotate_fn is None else rotate_fn(q[i, b, sl], i)
                logits = []
                for j in range(T):
                    if padding[b, j] or (causal and j > i):
                        logits.append(torch.tensor(float("-inf"), dtype=x.dtype))
                        continue
                    kj = k[j, b, sl] if rotate_fn is None else rotate_fn(k[j, b, sl], j)
                    e = (qi * kj).sum() / math.sqrt(d)
                    logits.append(e + (bias_fn(h, i, j) if bias_fn else 0.0))
                p = torch.softmax(torch.stack(logits), 0)
                rows.append(((b, h, i), (p[:, None] * v[:, b, sl]).sum(0)))
    for (b, h, i), value in rows:
        out[i, b, h * d:(h + 1) * d] = value
    return attn.out_proj(out)


def rope_naive(vec, m, base=10000.0):
    d = vec.numel()
    out = vec.clone()
    for i in range(d // 2):
        angle = m * base ** (-2 * i / d)
        a, b = vec[2 * i], vec[2 * i + 1]
        out[2 * i] = a * math.cos(angle) - b * math.sin(angle)
        out[2 * i + 1] = a * math.sin(angle) + b * math.cos(angle)
    return out


def test_t5_buckets_are_the_papers():
    for bidirectional in (True, False):
        relative = torch.arange(-300, 301)
        got = relative_bucket(relative, bidirectional, 32, 128).tolist()
        assert got == [t5_bucket_naive(r, bidirectional) for r in relative.tolist()]
    assert t5_bucket_naive(0, True) == 0 and t5_bucket_naive(1, False) == 0  # a future key: causal bucket 0


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(4) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
    # 6 heads: the 4-head slopes, then every other of the 8-head ones
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]


SCHEME_CASES = {
    "t5": lambda H, d, causal: T5Bias(H, bidirectional=not causal, num_buckets=8, max_distance=6),
    "alibi": lambda H, d, causal: ALiBi(H),
    "rope": lambda H, d, causal: RoPE(d),
}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(SCHEME_CASES))
def test_attention_equals_the_papers_equation(name, causal):
    torch.manual_seed(0)
    T, B, C, H = 7, 2, 8, 2
    scheme = SCHEME_CASES[name](H, C // H, causal).double()
    if isinstance(scheme, T5Bias):
        torch.nn.init.normal_(scheme.bias.weight)
    attn = PositionalSelfAttention(C, H, scheme).double()
    x = torch.randn(T, B, C, dtype=torch.float64, requires_grad=True)
    padding = torch.zeros(B, T, dtype=torch.bool)
    if causal:
        padding[1, -2:] = True  # right padding, as fairseq's targets
    else:
        padding[1, :2] = True  # left padding, as fairseq's sources
    mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1) if causal else None
    out, _ = attn(x, x, x, key_padding_mask=padding, attn_mask=mask, need_weights=False)
    bias_fn = rotate_fn = None
    if name == "t5":
        bias_fn = lambda h, i, j: scheme.bias.weight[t5_bucket_naive(j - i, not causal, 8, 6), h]  # noqa: E731
    elif name == "alibi":
        slopes = [2.0 ** (-8 * (h + 1) / H) for h in range(H)]
        bias_fn = lambda h, i, j: -slopes[h] * abs(i - j)  # noqa: E731
    else:
        rotate_fn = rope_naive
    want = naive_attention(attn, x, padding, causal, bias_fn, rotate_fn)
    keep = ~padding.t()[:, :, None]  # padded query rows: both give some mixture; only real rows matter
    torch.testing.assert_close(out * keep, want * keep, rtol=1e-10, atol=1e-10)
    params = [x] + list(attn.parameters()) + list(scheme.parameters())
    g_out = torch.autograd.grad((out * keep).pow(2).sum(), params, allow_unused=True)
    g_want = torch.autograd.grad((want * keep).pow(2).sum(), params, allow_unused=True)
    for a, b in zip(g_out, g_want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    # the explicit path (attention weights asked for) gives the same output
    again, weights = attn(x, x, x, key_padding_mask=padding, attn_mask=mask, need_weights=True)
    torch.testing.assert_close(again * keep, out * keep, rtol=1e-10, atol=1e-12)
    assert weights.shape == (B, T, T)


def test_half_precision_keeps_the_angles_and_slopes_exact():
    """model.half() must not round RoPE's θ or ALiBi's slopes: at position 1,000, θ rounded to float16 puts the
    rotated vector 0.13 off (relative to |x| + 1), against 6e-4 for float16's own rounding of input and output."""
    torch.manual_seed(0)
    x = torch.randn(1, 1, 1, 64, dtype=torch.float64)
    want = rope_naive(x[0, 0, 0], 1000)
    got = RoPE(64).half().rotate(x.half(), torch.tensor([1000]))[0, 0, 0].double()
    assert ((got - want).abs() / (want.abs() + 1)).max() < 2e-3
    bias = ALiBi(6).half().score_bias(torch.tensor([1000]), torch.tensor([0]), torch.float32)
    assert bias.dtype == torch.float32 and bias[:, 0, 0].tolist() == [-1000 * m for m in alibi_slopes(6)]


def test_rope_logits_depend_on_the_offset_only():
    torch.manual_seed(0)
    rope = RoPE(8).double()
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
    logit = lambda m, n: (rope.rotate(q, torch.tensor([m])) * rope.rotate(k, torch.tensor([n]))).sum()  # noqa: E731
    torch.testing.assert_close(logit(3, 7), logit(103, 107))
    assert not torch.allclose(logit(3, 7), logit(3, 8))


# -- every scheme with architectures: the model contract ---------------------------------------------------

def toy_batch():
    w = list(range(4, VOCAB))
    src = torch.tensor([[w[1], w[2], w[3], w[4], w[5], EOS],
                        [PAD, PAD, w[6], w[2], w[7], EOS],
                        [PAD, w[3], w[3], w[8], w[9], EOS]])
    prev = torch.tensor([[EOS, w[5], w[4], w[3], w[2], w[1], w[0]],
                         [EOS, w[7], w[2], w[6], w[6], w[1], w[2]],
                         [EOS, w[9], w[8], w[3], w[3], w[4], w[4]]])
    return src, (src != PAD).sum(1), prev


def test_the_table_has_every_registered_architecture():
    ours = [a for a, m in ARCH_MODEL_REGISTRY.items() if m.__name__ == "PositionTransformerModel"]
    named = {f"{s}_transformer{suffix}" for s in NEW_SCHEMES
             for suffix in ("", "_wmt_en_de", "_vaswani_wmt_en_de_big", "_vaswani_wmt_en_fr_big", "_tiny")}
    assert set(ours) == named | {"position_transformer"}
    assert set(NEW_SCHEMES) <= set(SCHEMES)
    for scheme in SCHEMES.values():
        assert scheme.kind in ("embedding", "score bias", "rotary", "none") and scheme.paper


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_with_reorder_equals_full_forward(arch):
    model = build(arch).eval().double()
    src, lengths, prev = toy_batch()
    beams = torch.tensor([0, 0, 1, 1])
    src, lengths, prev = src[beams], lengths[beams], torch.cat([prev[:2], prev[1:3]])
    encoder_out = model.encoder(src, src_lengths=lengths)
    full = model.get_normalized_probs(model.decoder(prev, encoder_out=encoder_out), log_probs=True)
    new_order = torch.tensor([1, 1, 3, 2])
    state = {}
    for t in range(prev.size(1)):
        if t == 3:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            prev, full = prev[new_order], full[new_order]
        step = model.get_normalized_probs(model.decoder(prev[:, : t + 1], encoder_out=encoder_out,
                                                        incremental_state=state), log_probs=True)
        # fairseq's own attention (SHAPE's and NoPE's) takes its softmax in float32 on the incremental path
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_sentence_alone_equals_it_left_padded_in_a_batch(arch):
    model = build(arch).eval().double()
    src, lengths, prev = toy_batch()
    together = model(src, lengths, prev)[0]
    for b in range(3):
        n = int(lengths[b])
        alone = model(src[b:b + 1, -n:], lengths[b:b + 1], prev[b:b + 1])[0]
        torch.testing.assert_close(alone[0], together[b], rtol=0, atol=1e-9)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_search_and_a_long_source(arch):
    model = build(arch).eval()
    src, lengths, _ = toy_batch()
    generator = SequenceGenerator([model], TASK.target_dictionary, beam_size=3, max_len_b=8)
    hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hypos) == 3 and all(h[0]["tokens"].numel() > 0 for h in hypos)
    long = torch.randint(4, VOCAB, (1, 1000), generator=torch.Generator().manual_seed(0))
    long[0, -1] = EOS
    with torch.no_grad():
        out = model.encoder(long, src_lengths=torch.tensor([1000]))["encoder_out"][0]
    assert out.shape[0] == 1000 and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("arch", ARCHS)
def test_scripting_is_refused_in_one_line(arch):
    with pytest.raises(RuntimeError, match="cannot be exported with torch.jit.script"):
        torch.jit.script(build(arch))


def test_attention_schemes_are_one_module_per_stack():
    for name in ("t5", "rope", "alibi"):
        model = build(f"{name}_transformer_tiny")
        for stack in (model.encoder, model.decoder):
            assert stack.embed_positions is None
            assert all(layer.self_attn.scheme is stack.position_scheme for layer in stack.layers)
        assert all(type(layer.encoder_attn).__name__ == "MultiheadAttention" for layer in model.decoder.layers)
    t5 = build("t5_transformer_tiny")
    names = [n for n, _ in t5.named_parameters() if "position_scheme" in n]
    assert names == ["encoder.position_scheme.bias.weight", "decoder.position_scheme.bias.weight"]
    nope = build("nope_transformer_tiny")
    assert isinstance(nope.encoder.embed_positions, SinusoidalPositionalEmbedding) and nope.decoder.embed_positions is None


def test_shape_shifts_each_sequence_in_training_only():
    torch.manual_seed(0)
    emb = ShapePositionalEmbedding(8, PAD, 64, max_shift=5)
    plain = SinusoidalPositionalEmbedding(8, PAD, 64 + 5 + PAD + 1)
    tokens = torch.tensor([[PAD, PAD, 5, 6, 7], [5, 6, 7, 8, 9]])
    emb.eval()
    torch.testing.assert_close(emb(tokens), plain(tokens))
    emb.train()
    table = SinusoidalPositionalEmbedding.get_embedding(100, 8, PAD)
    offsets = set()
    for _ in range(40):
        out = emb(tokens)
        for b in range(2):
            real = tokens[b].ne(PAD)
            positions = torch.cumsum(real.long(), 0)[real] + PAD
            shift = next(k for k in range(6) if torch.allclose(out[b, real], table[positions + k]))
            offsets.add(shift)
            assert out[b, ~real].abs().sum() == 0  # pads keep the zero row
    assert offsets == set(range(6))


def _train_argv(arch, *flags):
    return ["data-bin", "--user-dir", str(REPO / "fairseq_plugins"), "--arch", arch, *flags]


@pytest.mark.parametrize("flags,message", [
    (("--encoder-position-scheme", "nope"), "argument --encoder-position-scheme: invalid choice: 'nope'"),
    (("--position-scheme", "wavy"), "argument --position-scheme: invalid choice: 'wavy'"),
    (("--t5-num-buckets", "2"), "argument --t5-num-buckets: must be >= 4, got 2"),
    (("--shape-max-shift", "-1"), "argument --shape-max-shift: must be >= 0, got -1"),
    (("--rope-base", "x"), "argument --rope-base: expected a number, got 'x'"),
])
def test_a_bad_flag_is_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        options.parse_args_and_arch(options.get_training_parser(), _train_argv("t5_transformer_tiny", *flags))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err


def test_a_bad_flag_is_one_line_from_the_command_line(tmp_path):
    proc = subprocess.run([str(BIN / "fairseq-train"), str(tmp_path / "no-data"), "--user-dir",
                           str(REPO / "fairseq_plugins"), "--arch", "nope_transformer_tiny",
                           "--encoder-position-scheme", "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "fairseq-train: error: argument --encoder-position-scheme: invalid choice: 'nope' (choose from sinusoidal, "
        "learned, shape, t5, alibi, rope) (an encoder without positions is permutation-invariant)"]
