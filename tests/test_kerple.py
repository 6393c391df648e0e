"""KERPLE, log variant (fairseq_plugins/modules/kerple.py): its bias against the paper's equation written loop by
loop in float64, its initialisation as the authors' code, positivity under training, gradients reaching r1 and r2
in a model, and flags of other schemes refused. The attention against a naive float64 attention with this bias,
incremental decoding and the rest of the model contract: tests/test_position_schemes.py (ARCHS; the reference:
REFERENCES in tests/helpers/scheme_references.py)."""
import math

import pytest
import torch

from helpers import tiny_models
from helpers.tiny_models import one_thread  # noqa: F401  (an autouse fixture)
from fairseq_plugins.modules.kerple import FLOOR, KerpleLog


def kerple_naive(r1, r2, q_pos, k_pos):
    """b_h(i, j) = −r1_h · log(1 + r2_h · |i − j|), one entry at a time, in float64."""
    H = len(r1)
    out = torch.zeros(H, len(q_pos), len(k_pos), dtype=torch.float64)
    for h in range(H):
        for a, i in enumerate(q_pos):
            for b, j in enumerate(k_pos):
                out[h, a, b] = -r1[h] * math.log(1 + r2[h] * abs(i - j))
    return out


@pytest.mark.parametrize("q_pos", [list(range(9)), [13]])  # a full forward; one step of incremental decoding
def test_bias_is_the_papers_equation(q_pos):
    torch.manual_seed(0)
    scheme = KerpleLog(4).double()
    with torch.no_grad():
        scheme.rho1.normal_(std=2.0)
        scheme.rho2.normal_(std=2.0)
    r1 = [math.log1p(math.exp(p)) for p in scheme.rho1.tolist()]  # softplus, the positive parameterisation
    r2 = [math.log1p(math.exp(p)) for p in scheme.rho2.tolist()]
    k_pos = list(range(q_pos[-1] + 1))
    got = scheme.score_bias(torch.tensor(q_pos), torch.tensor(k_pos), torch.float64)
    assert got.dtype == torch.float64 and got.shape == (4, len(q_pos), len(k_pos))
    torch.testing.assert_close(got, kerple_naive(r1, r2, q_pos, k_pos), rtol=1e-12, atol=1e-12)
    # float32 bias from a half-precision module: computed in the dtype asked for
    half = scheme.half().score_bias(torch.tensor(q_pos), torch.tensor(k_pos), torch.float32)
    assert half.dtype == torch.float32


def test_initialisation_is_the_authors():
    """r1 ~ U(0, 2), r2 ~ U(0, 1) (GPT-NeoX's ParallelKerpleLog: bias_p, bias_a), floored at 0.01 as their first
    forward clamps them; the module's first bias uses exactly those values."""
    torch.manual_seed(0)
    heads = 4096  # enough draws that their moments are close to the distributions'
    scheme = KerpleLog(heads)
    r1, r2 = scheme.r1(torch.float64).detach(), scheme.r2(torch.float64).detach()
    assert r1.min() >= FLOOR - 1e-6 and r1.max() <= 2 and r2.min() >= FLOOR - 1e-6 and r2.max() <= 1
    assert abs(r1.mean().item() - 1.0) < 0.05 and abs(r2.mean().item() - 0.5) < 0.03
    assert abs(r1.var().item() / (4 / 12) - 1) < 0.1 and abs(r2.var().item() / (1 / 12) - 1) < 0.1
    torch.manual_seed(0)
    drawn_r1 = (2.0 * torch.rand(heads, dtype=torch.float64)).clamp(min=FLOOR)
    drawn_r2 = torch.rand(heads, dtype=torch.float64).clamp(min=FLOOR)
    torch.testing.assert_close(r1, drawn_r1, rtol=1e-6, atol=1e-7)  # float32 storage of ρ
    torch.testing.assert_close(r2, drawn_r2, rtol=1e-6, atol=1e-7)


def test_r1_and_r2_stay_positive_under_any_update():
    """A step that drives ρ far negative leaves r > 0: the bias still decreases with distance, never flips sign."""
    scheme = KerpleLog(2)
    with torch.no_grad():
        scheme.rho1.fill_(-30.0)
        scheme.rho2.fill_(-30.0)
    assert bool((scheme.r1() > 0).all()) and bool((scheme.r2() > 0).all())
    bias = scheme.score_bias(torch.arange(5), torch.arange(5), torch.float64)
    assert bool((bias <= 0).all()) and bool((bias[:, 0, 1:] < bias[:, 0, :-1]).all())


def test_gradients_reach_r1_and_r2_of_both_stacks():
    model, stacks = tiny_models.stack_schemes_after_backward("kerple_transformer_tiny", KerpleLog)
    for _, scheme in stacks:
        for rho in (scheme.rho1, scheme.rho2):
            assert rho.grad is not None and bool((rho.grad != 0).all()), rho.grad
    names = [n for n, _ in model.named_parameters() if "position_scheme" in n]
    assert names == ["encoder.position_scheme.rho1", "encoder.position_scheme.rho2",
                     "decoder.position_scheme.rho1", "decoder.position_scheme.rho2"]


@pytest.mark.parametrize("flag,setting,owner", [("--t5-num-buckets", {"t5_num_buckets": 16}, "t5"),
                                                 ("--rope-base", {"rope_base": 500.0}, "rope")])
def test_other_schemes_flags_are_refused(flag, setting, owner):
    """KERPLE's log variant has no hyper-parameter of its own; another scheme's flag would do nothing."""
    from fairseq_plugins.models.position_transformer import FlagError

    with pytest.raises(FlagError, match=f"^{flag} is a {owner} flag, and this model's position schemes are kerple "
                                        r"\(encoder\) and kerple \(decoder\): it would do nothing$"):
        tiny_models.build("kerple_transformer_tiny", **setting)
