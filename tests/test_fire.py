"""FIRE (fairseq_plugins/modules/fire.py): its bias against the paper's equation written loop by loop in float64
(the decoder's causal form, the encoder's symmetric one, below and beyond the threshold L), its initialisation as
the paper's code, gradients reaching θ, c and L in a model, and --fire-threshold: used by FIRE, refused on another
scheme, one line when bad. The attention against a naive float64 attention with this bias, incremental decoding
and the rest of the model contract: tests/test_position_schemes.py (ARCHS; the reference: REFERENCES in
tests/helpers/scheme_references.py)."""
import pytest
import torch
from fairseq import options

from conftest import REPO
from helpers import tiny_models
from helpers.tiny_models import one_thread  # noqa: F401  (an autouse fixture)
from fairseq_plugins.modules.fire import FIRE


def fire_bias_naive(scheme, h, i, j):
    """b(i, j)_h = f_θ(ψ(i − j) / ψ(max(L, i))), ψ(x) = log(c·x + 1), f_θ = W2·relu(W1·x + b1) + b2, one scalar at
    a time; the encoder: |i − j| and max(L, max(i, j)). c and L as the paper's code: |c|, L = |λ·L0|, and 1e-6
    added to the normaliser."""
    c = scheme.c.abs()
    L = (scheme.threshold_scale * scheme.initial_threshold).abs()
    far = torch.tensor(float(i if scheme.causal else max(i, j)), dtype=L.dtype)
    x = torch.log(c * abs(i - j) + 1) / (torch.log(c * torch.maximum(L, far) + 1) + 1e-6)
    w1, b1 = scheme.mlp[0].weight[:, 0], scheme.mlp[0].bias
    w2, b2 = scheme.mlp[2].weight, scheme.mlp[2].bias
    out = b2[h]
    for k in range(len(b1)):
        out = out + w2[h, k] * torch.relu(w1[k] * x + b1[k])
    return out


def randomised(scheme):
    """The scheme with c, λ and θ moved off their starting values (so that each one matters)."""
    with torch.no_grad():
        scheme.c.fill_(0.7)
        scheme.threshold_scale.fill_(-1.3)  # L = |λ·L0|: a negative λ gives the same L
        for p in scheme.mlp.parameters():
            p.normal_()
    return scheme


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_pos", [list(range(9)), [11]])  # a full forward; one step of incremental decoding
def test_bias_is_the_papers_equation(causal, q_pos):
    torch.manual_seed(0)
    scheme = randomised(FIRE(3, causal, threshold=4.0)).double()  # L = 5.2: positions on both sides of it
    k_pos = list(range(q_pos[-1] + 1))
    got = scheme.score_bias(torch.tensor(q_pos), torch.tensor(k_pos), torch.float64)
    assert got.dtype == torch.float64 and got.shape == (3, len(q_pos), len(k_pos))
    want = torch.stack([torch.stack([torch.stack([fire_bias_naive(scheme, h, i, j) for j in k_pos])
                                     for i in q_pos]) for h in range(3)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    if not causal:  # symmetric: b(i, j) = b(j, i)
        full = scheme.score_bias(torch.arange(12), torch.arange(12), torch.float64)
        torch.testing.assert_close(full, full.transpose(1, 2), rtol=0, atol=0)
    half = scheme.half().score_bias(torch.tensor(q_pos), torch.tensor(k_pos), torch.float32)
    assert half.dtype == torch.float32  # computed in the dtype asked for, not the module's


@pytest.mark.parametrize("causal", [True, False])
def test_each_sentences_positions_give_its_own_bias(causal):
    """A padded batch's positions, each sentence's from its first real token ((B, T), (B, S); pads at 0), give
    each sentence the bias of its positions alone, values and gradients: the normaliser never sees a padded
    index. L = 5.2 with 3 to 9 real tokens: positions on both sides of it."""
    torch.manual_seed(0)
    scheme = randomised(FIRE(3, causal, threshold=4.0)).double()
    S, pads = 9, [0, 6, 2]
    k_pos = torch.stack([(torch.arange(S) - p).clamp_min(0) for p in pads])  # (3, S)
    for q_pos in (k_pos, k_pos[:, -1:]):  # a full forward; the last step of incremental decoding
        got = scheme.score_bias(q_pos, k_pos, torch.float64)
        assert got.shape == (3, 3, q_pos.size(1), S)
        weights = torch.randn(got.shape, dtype=torch.float64)
        grads = torch.autograd.grad((got * weights).sum(), list(scheme.parameters()), retain_graph=True)
        for b, p in enumerate(pads):
            alone = scheme.score_bias(q_pos[b], k_pos[b, p:], torch.float64)  # its real keys only
            torch.testing.assert_close(got[b, :, :, p:], alone, rtol=1e-12, atol=1e-12)
        real = torch.tensor([[j >= p for j in range(S)] for p in pads])[:, None, None, :]  # bool
        alone_sum = sum((scheme.score_bias(q_pos[b], k_pos[b, p:], torch.float64) * weights[b, :, :, p:]).sum()
                        for b, p in enumerate(pads))
        padded_part = (got * weights * ~real).sum()  # the pad keys' bias is masked in attention
        want = torch.autograd.grad(alone_sum + padded_part, list(scheme.parameters()))
        for g, w in zip(grads, want):
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_initialisation_is_the_papers_code():
    """The paper's reference code: an MLP 1 → 32 → heads with ReLU, c = 0.1, L = |λ·L0| with λ = 1, L0 = 512."""
    scheme = FIRE(8, causal=True)
    assert [type(m).__name__ for m in scheme.mlp] == ["Linear", "ReLU", "Linear"]
    assert (scheme.mlp[0].in_features, scheme.mlp[0].out_features, scheme.mlp[2].out_features) == (1, 32, 8)
    assert scheme.c.item() == pytest.approx(0.1) and scheme.threshold().item() == 512.0
    assert sum(p.numel() for p in scheme.parameters()) == 64 + 32 * 8 + 8 + 2


def test_gradients_reach_theta_c_and_the_threshold_in_both_stacks():
    model, stacks = tiny_models.stack_schemes_after_backward("fire_transformer_tiny", FIRE)
    for stack, scheme in stacks:
        assert scheme.causal == (stack is model.decoder)
        for name, p in scheme.named_parameters():
            assert p.grad is not None and bool((p.grad != 0).any()), name
        assert float(scheme.c.grad) != 0 and float(scheme.threshold_scale.grad) != 0


def test_the_threshold_flag_reaches_fire_and_is_refused_elsewhere():
    from fairseq_plugins.models.position_transformer import FlagError

    model, args = tiny_models.build_with_args("fire_transformer_tiny")
    assert args.fire_threshold == 512.0 and model.encoder.position_scheme.initial_threshold == 512.0
    model = tiny_models.build("fire_transformer_tiny", fire_threshold=64.0)
    assert model.encoder.position_scheme.threshold().item() == model.decoder.position_scheme.threshold().item() == 64
    with pytest.raises(FlagError, match=r"^--fire-threshold is a fire flag, and this model's position schemes are "
                                        r"alibi \(encoder\) and alibi \(decoder\): it would do nothing$"):
        tiny_models.build("alibi_transformer_tiny", fire_threshold=64.0)
    with pytest.raises(FlagError, match=r"^--rope-base is a rope flag, and this model's position schemes are fire"):
        tiny_models.build("fire_transformer_tiny", rope_base=500.0)


@pytest.mark.parametrize("value,message", [("x", "expected a number, got 'x'"), ("0", "must be > 0, got 0")])
def test_a_bad_threshold_is_one_line(value, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        options.parse_args_and_arch(options.get_training_parser(),
                                    ["data-bin", "--user-dir", str(REPO / "fairseq_plugins"),
                                     "--arch", "fire_transformer_tiny", "--fire-threshold", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and f"argument --fire-threshold: {message}" in err[0], err
