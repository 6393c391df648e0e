"""The fused attention backends (fairseq_plugins/modules/fused_attention.py), on CPU:

- ``--attention-backend flex`` (FlexAttention, eager on CPU: the same maths as the compiled kernel, unfused):
  outputs and every gradient (x, the projections, w^K, w^V, T5's table) against float64 references: today's
  path in float64 and each paper's equation written densely from its definition; with padding, the causal mask,
  Shaw's tails empty (T <= k) and k = 0, per-head and shared tables, float16/bfloat16 inputs;
- Shaw's value term needs both its parts: the band recomputed from the log-sum-exp and the tails' masses;
- the default path keeps a learned score bias on torch's fused CPU kernel: no (B, H, T, S) tensor waits for the
  backward (the unfused path kept one per layer);
- the flag: its default, its help, a bad value and attention dropout each refused in one line; whole models give
  the same log-probabilities on either backend, and incremental decoding (today's path) equals flex's forward.
"""
import math

import pytest
import torch
from fairseq import options

from conftest import REPO
from helpers import tiny_models
from helpers.tiny_models import fixed_batch, one_thread  # noqa: F401  (one_thread: autouse fixture)
from fairseq_plugins.modules import fused_attention
from fairseq_plugins.modules.alibi import ALiBi
from fairseq_plugins.modules.positional_attention import PositionalSelfAttention
from fairseq_plugins.modules.relative_attention import RelativeMultiheadAttention
from fairseq_plugins.modules.rope import RoPE
from fairseq_plugins.modules.t5_bias import T5Bias, relative_bucket

T, B, C, H = 7, 2, 8, 2
# output and gradient tolerances of an input dtype against the float64 reference (relative to the largest value)
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


def masks(causal, dtype=torch.float64):
    padding = torch.zeros(B, T, dtype=torch.bool)
    if causal:
        padding[1, -2:] = True  # right padding, as fairseq's targets
    else:
        padding[1, :2] = True  # left padding, as fairseq's sources
    attn_mask = torch.triu(torch.full((T, T), float("-inf"), dtype=dtype), 1) if causal else None
    return padding, attn_mask


def dense_reference(attn, x, padding, attn_mask, bias=None, relative=None):
    """The papers' equations densely in float64: e = q·(k_j + w^K_clip(j−i))/√d + bias_h(i, j) + masks,
    z_i = Σ_j softmax_j(e)_ij (v_j + w^V_clip(j−i)); bias (H, T, T); relative = (w^K, w^V, k)."""
    d = attn.head_dim
    split = lambda y: y.view(T, B, H, d).permute(1, 2, 0, 3)  # noqa: E731  (B, H, T, d)
    q, k, v = split(attn.q_proj(x)) / math.sqrt(d), split(attn.k_proj(x)), split(attn.v_proj(x))
    e = q @ k.transpose(-1, -2)
    a_v = None
    if relative is not None:
        w_k, w_v, K = relative
        rows = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).clamp(-K, K) + K  # (T, S)
        per_head = lambda w: w if w.dim() == 3 else w.expand(H, *w.shape)  # noqa: E731
        a_k = per_head(w_k)[:, rows]  # (H, T, S, d): the paper's a^K_ij
        e = e + torch.einsum("bhid,hijd->bhij", q, a_k)
        a_v = per_head(w_v)[:, rows]
    if bias is not None:
        e = e + bias
    if attn_mask is not None:
        e = e + attn_mask
    e = e.masked_fill(padding[:, None, None, :], float("-inf"))
    alpha = e.softmax(-1)
    z = alpha @ v
    if a_v is not None:
        z = z + torch.einsum("bhij,hijd->bhid", alpha, a_v)
    return attn.out_proj(z.permute(2, 0, 1, 3).reshape(T, B, C))


def compare(got, want, tol, what):
    scale = want.abs().max().clamp(min=1.0)
    err = ((got.double() - want.double()).abs().max() / scale).item()
    assert err <= tol, f"{what}: error {err:.3g} > {tol:g}"


def check(attn, reference, x, padding, attn_mask, extra_params=(), dtype=torch.float64):
    """attn (in dtype) against reference (float64 module, same parameters): output and gradients of real rows."""
    keep = ~padding.t()[:, :, None]  # padded query rows give some mixture in every implementation
    got, _ = attn(x.to(dtype), x.to(dtype), x.to(dtype), key_padding_mask=padding,
                  attn_mask=None if attn_mask is None else attn_mask.to(dtype), need_weights=False)
    want = reference(x)
    tol = TOLERANCE[dtype]
    compare(got * keep, want * keep, tol, "output")
    g = torch.randn_like(want)
    params_got = [x] + list(attn.parameters()) + list(extra_params[0])
    params_want = [x] + list(extra_params[1])
    grads_got = torch.autograd.grad(((got * keep).double() * g).sum(), params_got)
    grads_want = torch.autograd.grad(((want * keep) * g).sum(), params_want)
    for name, a, b in zip(["x"] + extra_params[2], grads_got, grads_want):
        compare(a, b, 10 * tol, name)


# -- score biases ---------------------------------------------------------------------------------------------

SCORE_SCHEMES = {
    "t5": lambda causal: T5Bias(H, bidirectional=not causal, num_buckets=8, max_distance=6),
    "alibi": lambda causal: ALiBi(H),
    "rope": lambda causal: RoPE(C // H),
}


def positional_pair(name, causal, dtype):
    torch.manual_seed(0)
    scheme = SCORE_SCHEMES[name](causal).double()
    if isinstance(scheme, T5Bias):
        torch.nn.init.normal_(scheme.bias.weight)
    today = PositionalSelfAttention(C, H, scheme).double()  # the float64 reference: today's path
    flex_scheme = SCORE_SCHEMES[name](causal).to(dtype)
    flex_scheme.load_state_dict(scheme.state_dict())
    flex = PositionalSelfAttention(C, H, flex_scheme, attention_backend="flex").to(dtype)
    flex.load_state_dict(today.state_dict())
    return scheme, today, flex_scheme, flex


@pytest.mark.matrix  # the fast tier: each scheme, mask and dtype once
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", list(SCORE_SCHEMES))
def test_flex_score_bias_equals_todays_path_in_float64(name, causal, dtype):
    scheme, today, flex_scheme, flex = positional_pair(name, causal, dtype)
    padding, attn_mask = masks(causal)
    x = torch.randn(T, B, C, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in flex.named_parameters()] + [f"scheme.{n}" for n, _ in flex_scheme.named_parameters()]
    check(flex, lambda x: today(x, x, x, key_padding_mask=padding, attn_mask=attn_mask, need_weights=False)[0],
          x, padding, attn_mask, (list(flex_scheme.parameters()), list(today.parameters()) +
                                  list(scheme.parameters()), names), dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["t5", "alibi"])
def test_flex_score_bias_equals_the_papers_equation(name, causal):
    scheme, today, flex_scheme, flex = positional_pair(name, causal, torch.float64)
    padding, attn_mask = masks(causal)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    if name == "t5":
        bias = lambda: scheme.bias.weight[relative_bucket(j - i, not causal, 8, 6)].permute(2, 0, 1)  # noqa: E731
    else:
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
        bias = lambda: -slopes[:, None, None] * (i - j).abs()  # noqa: E731
    x = torch.randn(T, B, C, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in flex.named_parameters()] + [f"scheme.{n}" for n, _ in flex_scheme.named_parameters()]
    check(flex, lambda x: dense_reference(today, x, padding, attn_mask, bias=bias()), x, padding, attn_mask,
          (list(flex_scheme.parameters()), list(today.parameters()) + list(scheme.parameters()), names))


# -- Shaw's attention -----------------------------------------------------------------------------------------

def shaw_pair(k, per_head, dtype):
    torch.manual_seed(0)
    today = RelativeMultiheadAttention(C, H, k, per_head=per_head).double()
    with torch.no_grad():  # tables larger than their initialisation, so that both terms matter
        today.relative_keys.normal_()
        today.relative_values.normal_(std=2.0)
    flex = RelativeMultiheadAttention(C, H, k, per_head=per_head, attention_backend="flex").to(dtype)
    flex.load_state_dict(today.state_dict())
    return today, flex


SHAW_CASES = {  # (k, per_head): tails on both sides; the tails empty (T <= k); k = 0; one table for the heads
    "k3": (3, True), "tails-empty": (T, True), "k0": (0, True), "shared": (2, False)}


@pytest.mark.matrix  # the fast tier: each case, mask and dtype once
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", list(SHAW_CASES))
def test_flex_shaw_equals_todays_path_and_the_papers_equation(case, causal, dtype):
    k, per_head = SHAW_CASES[case]
    today, flex = shaw_pair(k, per_head, dtype)
    padding, attn_mask = masks(causal)
    x = torch.randn(T, B, C, dtype=torch.float64, requires_grad=True)
    names = [n for n, _ in flex.named_parameters()]
    reference = lambda x: today(x, x, x, key_padding_mask=padding, attn_mask=attn_mask,  # noqa: E731
                                need_weights=False)[0]
    check(flex, reference, x, padding, attn_mask, ([], list(today.parameters()), names), dtype)
    if dtype == torch.float64:
        paper = lambda x: dense_reference(today, x, padding, attn_mask,  # noqa: E731
                                          relative=(today.relative_keys, today.relative_values, k))
        check(flex, paper, x, padding, attn_mask, ([], list(today.parameters()), names))


def test_shaw_value_term_needs_the_band_and_the_tails(monkeypatch):
    """Without the tails' masses (or with the band's probabilities wrong) the value term is off: the checks above
    would fail. T = 7 > k = 2: both tails hold keys."""
    today, flex = shaw_pair(2, True, torch.float64)
    padding, attn_mask = masks(False)
    x = torch.randn(T, B, C, dtype=torch.float64, requires_grad=True)
    keep = ~padding.t()[:, :, None]
    want = today(x, x, x, key_padding_mask=padding, need_weights=False)[0] * keep

    def run():
        return flex(x, x, x, key_padding_mask=padding, need_weights=False)[0] * keep

    torch.testing.assert_close(run(), want, rtol=1e-10, atol=1e-10)
    with monkeypatch.context() as m:
        m.setattr(fused_attention, "_tail_possible", lambda *a: False)  # the tails dropped
        assert (run() - want).abs().max() > 1e-2
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "exp", lambda self: torch.zeros_like(self))  # the band and tails dropped
        assert (run() - want).abs().max() > 1e-2


def test_flex_shaw_keeps_no_pairwise_tensor():
    """Shaw on flex: nothing the autograd graph keeps is (T, S)-sized per head, or in floating point, beyond
    FlexAttention's own saved inputs (on CPU the eager op builds the scores transiently; the compiled kernel never
    does). The one (T, S) tensor kept is the table of clip(j − i, k), integers shared by sentences and heads."""
    today, flex = shaw_pair(2, True, torch.float32)
    length = 32
    x = torch.randn(length, B, C)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.shape, t.dtype)) or t, lambda t: t):
        flex(x, x, x, need_weights=False)[0].sum()
    pairwise = [(s, dt) for s, dt in saved if len(s) >= 2 and tuple(s[-2:]) == (length, length)]
    assert not [(s, dt) for s, dt in pairwise if len(s) > 2 or dt.is_floating_point], saved


# -- the default path: the fused CPU kernel ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["t5", "alibi"])
def test_default_path_keeps_no_probabilities_for_the_backward(name):
    """Torch's CPU SDPA with a 3-D or learned mask kept every layer's (B, H, T, S) probabilities; the 4-D mask
    and BiasedFlashCPU keep the bias (1, H, T, S) at most."""
    torch.manual_seed(0)
    attn = PositionalSelfAttention(C, H, SCORE_SCHEMES[name](False))
    padding, _ = masks(False)
    x = torch.randn(T, B, C)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        attn(x, x, x, key_padding_mask=padding, need_weights=False)[0].sum()
    assert not [s for s in saved if len(s) == 4 and s[0] == B and s[-2:] == (T, T)], saved


# -- the flag and whole models ------------------------------------------------------------------------------------

def test_the_flag_defaults_to_todays_path_and_says_why():
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["data-bin", "--user-dir", str(REPO / "fairseq_plugins"),
                                                "--arch", "relative_transformer_tiny"])
    assert args.attention_backend == "sdpa"
    help_text = " ".join(parser.format_help().split())
    assert "sdpa (default: the path measured so far" in help_text and "flex (opt-in: on an H100" in help_text


@pytest.mark.parametrize("arch", ["relative_transformer_tiny", "t5_transformer_tiny"])
def test_a_bad_backend_is_one_line(arch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        options.parse_args_and_arch(options.get_training_parser(), [
            "data-bin", "--user-dir", str(REPO / "fairseq_plugins"), "--arch", arch, "--attention-backend", "xla"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert "argument --attention-backend: invalid choice: 'xla' (choose from sdpa, flex)" in err[0]


@pytest.mark.parametrize("arch", ["relative_transformer_tiny", "alibi_transformer_tiny"])
def test_flex_refuses_attention_dropout_in_one_line(arch):
    with pytest.raises(ValueError) as err:
        tiny_models.build(arch, attention_backend="flex", attention_dropout=0.1)
    assert str(err.value) == ("--attention-backend flex: FlexAttention has no attention dropout (got "
                              "--attention-dropout 0.1); use 0 or --attention-backend sdpa")


def test_flex_refuses_a_torch_without_its_features_in_one_line(monkeypatch):
    import torch.nn.attention.flex_attention as module
    monkeypatch.delattr(module, "AuxRequest")
    with pytest.raises(RuntimeError) as err:
        fused_attention.check_flex()
    assert str(err.value).startswith(f"--attention-backend flex needs torch >= {fused_attention.FLEX_TORCH} ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("arch", ["relative_transformer_tiny", "t5_transformer_tiny", "alibi_transformer_tiny"])
def test_models_agree_across_backends_and_decode_step_by_step(arch, monkeypatch):
    today = tiny_models.build(arch).eval().double()
    flex = tiny_models.build(arch, attention_backend="flex").eval().double()
    flex.load_state_dict(today.state_dict())
    src, lengths, prev = fixed_batch()
    calls = []
    real = fused_attention.flex
    monkeypatch.setattr(fused_attention, "flex", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr("fairseq_plugins.modules.positional_attention.flex", fused_attention.flex)  # its import
    full = flex(src, lengths, prev)[0]
    layers = len(flex.encoder.layers) + len(flex.decoder.layers)
    assert len(calls) >= layers  # every self-attention went through FlexAttention
    torch.testing.assert_close(full, today(src, lengths, prev)[0], rtol=0, atol=1e-9)
    # incremental decoding keeps today's path (one query per step) and equals the flex forward
    tiny_models.assert_incremental_with_reorder_equals_full(flex, atol=1e-9)
