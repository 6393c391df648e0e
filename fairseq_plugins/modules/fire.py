"""FIRE (Li et al., "Functional Interpolation for Relative Positions Improves Long Context Transformers", ICLR 2024,
arXiv 2310.04418, §3): a learned function of the relative distance, normalised by the query's position, added
to the attention logits::

    e_ij = (x_i W_q)(x_j W_k)^T / sqrt(d_z) + b(i, j)_h,    b(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) ),
    ψ(x) = log(c·x + 1)

f_θ: R → R^H, a two-layer MLP (1 → 32 → heads, ReLU between), one output per head; c > 0 amplifies the
differences between near positions (log transform); the threshold L > 0 keeps short contexts from being
stretched to the whole range ("progressive interpolation": ψ(i − j)/ψ(i) ∈ [0, 1] for any length, once i > L).
Learned: θ, c and L. Initialisation and positivity as the paper's reference code (its appendix): c starts at
0.1, L = |λ·L₀| with λ learned from 1 and L₀ = 512 (``--fire-threshold``: 512 suits its language models' 512-token
windows; a WMT sentence is shorter, so every query then normalises by ψ(L₀)), c enters as |c|, and ε = 1e-6 is
added to the normaliser ψ(max(L, i)); θ: torch's default Linear initialisation.

The paper's model is causal (j ≤ i): the decoder here is the same (future keys masked). The encoder uses the
symmetric adaptation ψ(|i − j|) / ψ(max(L, max(i, j))): the distance either way, normalised by the farther of the
two positions. The normaliser reads a position itself, not only i − j, so positions are each sentence's own,
counted from its first real token (``per_sentence``): a left-padded source gets the bias it gets alone,
whatever its batch-mates' lengths.

Mapping to code: ``FIRE.mlp`` is f_θ, ``FIRE.c`` is c, ``FIRE.threshold()`` is L; ``score_bias(q_pos, k_pos,
dtype)`` returns b as (heads, T, S) for positions (T,), (S,), or (B, heads, T, S) for a padded batch's (B, T),
(B, S) (f_θ once per value pair of (|i − j|, far), gathered per sentence: ``bias_at``), in dtype (float32, or
float64 for a float64 model: never the model's half precision) for ``PositionalSelfAttention``. One FIRE per
stack, shared by its layers (the paper shares one across layers too). No bias in cross-attention.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..flags import Flag, positive
from .position_scheme import ScoreBias

EPS = 1e-6  # the reference code's, added to the normaliser


class FIRE(ScoreBias):
    title, equation = "FIRE (Li et al.)", "f_θ(ψ(|j − i|) / ψ(max(L, i)))"
    flags = (Flag("--fire-threshold", positive(float), "L0", "FIRE: the threshold L's starting value, L = |λ·L0| with "
                  "λ learned from 1 (default 512, the paper's)", 512.0),)

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        return cls(heads, causal, threshold=cfg.fire_threshold)

    def __init__(self, num_heads: int, causal: bool, threshold: float = 512.0, mlp_width: int = 32,
                 init_c: float = 0.1):
        super().__init__()
        self.causal, self.initial_threshold = causal, float(threshold)
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, num_heads))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))  # λ: L = |λ·L₀|

    def threshold(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return (self.threshold_scale.to(dtype) * self.initial_threshold).abs()

    per_sentence = True  # ψ(max(L, i)): the normaliser reads the query's (the farther key's) position

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        if q_pos.dim() == 1:  # one set of positions for the batch: f_θ at every (i, j)
            i, j = q_pos[:, None], k_pos[None, :]
            return self.bias_at((i - j).abs().to(dtype), self._far(i, j).to(dtype), dtype).permute(2, 0, 1)
        # each sentence's positions (B, T), (B, S), all below S (in self-attention every query is a key): the bias
        # depends on (|i − j|, far) alone, so f_θ runs once per value pair (S², as for one set of positions) and
        # each sentence gathers its own, never a (B, T, S, width) hidden layer
        n = k_pos.size(-1)
        grid = torch.arange(n, device=k_pos.device)
        table = self.bias_at(grid[:, None].to(dtype), grid[None, :].to(dtype), dtype).flatten(0, 1)  # (n², H)
        i, j = q_pos[:, :, None], k_pos[:, None, :]
        index = (i - j).abs() * n + self._far(i, j)  # (B, T, S)
        return F.embedding(index, table).permute(0, 3, 1, 2)  # (B, H, T, S)

    def _far(self, i: Tensor, j: Tensor) -> Tensor:  # the decoder's i; the encoder's max(i, j) (broadcast later)
        return i if self.causal else torch.maximum(i, j)

    def bias_at(self, distance: Tensor, far: Tensor, dtype: torch.dtype) -> Tensor:
        """f_θ(ψ(distance) / ψ(max(L, far))), (..., H), for distance and far of one shape."""
        c = self.c.to(dtype).abs()
        x = torch.log(c * distance + 1) / (torch.log(c * torch.maximum(far, self.threshold(dtype)) + 1) + EPS)
        first, second = self.mlp[0], self.mlp[2]
        hidden = F.relu(F.linear(x.unsqueeze(-1), first.weight.to(dtype), first.bias.to(dtype)))  # (..., width)
        return F.linear(hidden, second.weight.to(dtype), second.bias.to(dtype))
