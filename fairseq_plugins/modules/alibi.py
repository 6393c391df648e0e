"""ALiBi (Press, Smith, Lewis, ICLR 2022, arXiv 2108.12409): no position embeddings; a fixed linear penalty on
the attention logits by distance, with one slope per head::

    e_ij = (x_i W_q)(x_j W_k)^T / sqrt(d_z) − m_h · |i − j|

m_h: a geometric sequence, for H heads (a power of two) m_h = 2^(−8h/H), h = 1..H (8 heads: 1/2, 1/4, …, 1/256);
for other H, the paper's recipe: the slopes of the nearest smaller power of two, then every other slope of
twice that many. The paper's causal LM uses −m_h·(i − j) for j ≤ i; the decoder here is the same (future keys are
masked); the encoder uses the symmetric |i − j|, the usual adaptation for bidirectional attention. No
parameters; nothing in cross-attention.

Mapping to code: ``alibi_slopes(H)`` is m; ``ALiBi.score_bias(q_pos, k_pos, dtype)`` returns −m_h·|i − j| as
(heads, T, S) in dtype (float32, or float64 for a float64 model: not the model's half precision) for
``PositionalSelfAttention``.
"""

import math
from typing import List

import torch
from torch import Tensor

from .position_scheme import ScoreBias


def alibi_slopes(num_heads: int) -> List[float]:
    def power_of_two(n):
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


class FixedSlopes:
    """m as a tensor per (device, dtype), made on first use; not a buffer, so that model.half() leaves it exact."""

    def __init__(self, num_heads: int):
        self.num_heads, self._made = num_heads, {}

    def __call__(self, device, dtype) -> Tensor:
        slopes = self._made.get((device, dtype))
        if slopes is None:
            slopes = self._made[device, dtype] = torch.tensor(alibi_slopes(self.num_heads), device=device, dtype=dtype)
        return slopes


class ALiBi(ScoreBias):
    title, equation = "ALiBi (Press et al.)", "−m_h·|j − i|"

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        return cls(heads)

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.slopes = FixedSlopes(num_heads)  # slopes(device, dtype): m (H,)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        distance = (q_pos[:, None] - k_pos[None, :]).abs().to(dtype)
        return -self.slopes(q_pos.device, dtype).view(-1, 1, 1) * distance  # (H, T, S)
