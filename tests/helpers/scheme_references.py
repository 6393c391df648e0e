"""Each self-attention scheme's naive reference, by its name in the table (``fairseq_plugins/schemes.py``).

``REFERENCES[name]`` is a ``Reference``: ``build(H, d, causal)``, the scheme's module under test (its parameters
moved off their starting values where that makes each one matter), and ``equation(scheme, attn, causal, T,
padding)``, its paper's equation written loop by loop, as the hooks that tests/test_position_schemes.py's
``naive_attention`` takes: ``bias_fn(h, i, j)`` (a score bias), ``rotate_fn(vec, m)`` (a rotation of q and k;
with ``rotate_k_fn(vec, m)`` the keys', where a rotation treats them differently: xPos') or ``delta_fn(projection,
b, i)`` (a bias of the q/k/v projections). Every row of the table whose kind is in ``SELF_ATTENTION_KINDS`` needs
one: ``reference(name)`` fails by name where it is missing. (Shaw's relative vectors own the attention's product:
their reference is tests/test_relative_attention.py's; a cross-attention prior's is tests/test_cross_prior.py's.)
"""
import argparse
import math
from dataclasses import dataclass
from typing import Callable, Dict

import torch

from helpers.floater_helpers import randomize_flows
from test_fire import fire_bias_naive, randomised
from fairseq_plugins.modules.alibi import ALiBi
from fairseq_plugins.modules.fire import FIRE
from fairseq_plugins.modules.floater import Floater
from fairseq_plugins.modules.kerple import KerpleLog
from fairseq_plugins.modules.rope import RoPE
from fairseq_plugins.modules.t5_bias import T5Bias
from fairseq_plugins.modules.xpos import XPos

HOME = "tests/helpers/scheme_references.py"
SELF_ATTENTION_KINDS = ("score bias", "rotary", "projection biases")  # the table's kinds naive_attention checks


@dataclass(frozen=True)
class Reference:
    build: Callable  # (H, d, causal) -> the scheme's module
    equation: Callable  # (scheme, attn, causal, T, padding) -> dict of naive_attention's bias_fn/rotate_fn/delta_fn


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


def rope_naive(vec, m, base=10000.0):
    d = vec.numel()
    out = vec.clone()
    for i in range(d // 2):
        angle = m * base ** (-2 * i / d)
        a, b = vec[2 * i], vec[2 * i + 1]
        out[2 * i] = a * math.cos(angle) - b * math.sin(angle)
        out[2 * i + 1] = a * math.sin(angle) + b * math.cos(angle)
    return out


def xpos_naive(vec, m, query, scale_base=512.0, base=10000.0):
    """Sun et al.'s q̃_m = R_m (q_m ⊙ ζ^(m/γ)) (query) or k̃_m = R_m (k_m ⊙ ζ^(−m/γ)) (key), pair by pair:
    ζ_i = (i/(d/2) + 0.4)/1.4 on both dimensions of pair i, R_m RoPE's rotation by m·base^(−2i/d)."""
    d = vec.numel()
    out = vec.clone()
    for i in range(d // 2):
        scale = ((i / (d / 2) + 0.4) / 1.4) ** ((m if query else -m) / scale_base)
        angle = m * base ** (-2 * i / d)
        a, b = vec[2 * i] * scale, vec[2 * i + 1] * scale
        out[2 * i] = a * math.cos(angle) - b * math.sin(angle)
        out[2 * i + 1] = a * math.sin(angle) + b * math.cos(angle)
    return out


def floater_naive(dynamics, b0, num_positions, dt):
    """b(t_i) = b(0) + ∫_0^{t_i} h(τ, b(τ)) dτ, t_i = i·Δ (FLOATER eq. 8, 12),
    h(τ, p) = W2 [relu(W1 [p; τ] + c1); τ] + c2, by RK4 at Δ/5 (the paper's solver; torchdiffeq's rk4, which the
    authors called, is Kutta's 3/8 rule), one row of b0 (k, d) at a time → (num_positions, k, d)."""
    def h(t, p):
        tau = torch.tensor([t], dtype=p.dtype)
        return dynamics.fc2(torch.cat([torch.relu(dynamics.fc1(torch.cat([p, tau]))), tau]))

    rows = []
    for y in b0:
        path, step = [y], dt / 5
        for i in range(1, num_positions):
            for n in range(5):
                t = (i - 1) * dt + n * step
                k1 = h(t, y)
                k2 = h(t + step / 3, y + step * k1 / 3)
                k3 = h(t + 2 * step / 3, y + step * (k2 - k1 / 3))
                k4 = h(t + step, y + step * (k1 - k2 + k3))
                y = y + step * (k1 + 3 * k2 + 3 * k3 + k4) / 8
            path.append(y)
        rows.append(torch.stack(path))
    return torch.stack(rows, 1)


def floater_case(H, d, causal):
    cfg = argparse.Namespace(floater_layers="all", floater_hidden=None, no_cross_attention=True)
    Floater.defaults(cfg)
    scheme = Floater(cfg, H * d, decoder=causal)
    randomize_flows(scheme)  # a non-trivial h
    return scheme


def _t5(H, d, causal):
    scheme = T5Bias(H, bidirectional=not causal, num_buckets=8, max_distance=6)
    torch.nn.init.normal_(scheme.bias.weight)  # its table starts at zero: drawn so that the bias matters
    return scheme


def _alibi(scheme, attn, causal, T, padding):
    H = attn.num_heads
    slopes = [2.0 ** (-8 * (h + 1) / H) for h in range(H)]
    return dict(bias_fn=lambda h, i, j: -slopes[h] * abs(i - j))


def _kerple(scheme, attn, causal, T, padding):  # −r1_h·log(1 + r2_h·|i − j|), r = softplus(ρ)
    r1, r2 = torch.nn.functional.softplus(scheme.rho1), torch.nn.functional.softplus(scheme.rho2)
    return dict(bias_fn=lambda h, i, j: -r1[h] * torch.log(1 + r2[h] * abs(i - j)))


def _floater(scheme, attn, causal, T, padding):  # Δb(t_i) at each token's rank among its sentence's real tokens
    b0 = torch.stack([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias])
    delta = floater_naive(scheme.flow.dynamics, b0, T, scheme.flow.settings.dt) - b0
    rank = (~padding).long().cumsum(1) - 1
    return dict(delta_fn=lambda j, b, i: delta[max(int(rank[b, i]), 0), j])


REFERENCES: Dict[str, Reference] = {
    "t5": Reference(_t5, lambda scheme, attn, causal, T, padding: dict(
        bias_fn=lambda h, i, j: scheme.bias.weight[t5_bucket_naive(j - i, not causal, 8, 6), h])),
    "alibi": Reference(lambda H, d, causal: ALiBi(H), _alibi),
    "kerple": Reference(lambda H, d, causal: KerpleLog(H), _kerple),
    # f_θ(ψ(i − j) / ψ(max(L, i))) (the encoder: |i − j|, max(L, max(i, j))); L = 3.9: i on both sides of it
    "fire": Reference(lambda H, d, causal: randomised(FIRE(H, causal, threshold=3.0)),
                      lambda scheme, attn, causal, T, padding: dict(
                          bias_fn=lambda h, i, j: fire_bias_naive(scheme, h, i, j))),
    "rope": Reference(lambda H, d, causal: RoPE(d),
                      lambda scheme, attn, causal, T, padding: dict(rotate_fn=rope_naive)),
    # γ = 4: over the test's 7 positions the scale spans ζ_0^(±6/4) ≈ 6.5×, so that a wrong sign or origin shows
    "xpos": Reference(lambda H, d, causal: XPos(d, scale_base=4.0),
                      lambda scheme, attn, causal, T, padding: dict(
                          rotate_fn=lambda vec, m: xpos_naive(vec, m, True, 4.0),
                          rotate_k_fn=lambda vec, m: xpos_naive(vec, m, False, 4.0))),
    "floater": Reference(floater_case, _floater),
}


def reference(name):
    """The scheme's Reference; a missing one fails naming the scheme and where to add it."""
    if name not in REFERENCES:
        raise LookupError(f"no reference for {name}: add one to {HOME} (REFERENCES[{name!r}]: the scheme's module "
                          "and its equation loop by loop; docs/position_schemes.md, Adding a scheme)")
    return REFERENCES[name]
