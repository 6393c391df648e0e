"""KERPLE, logarithmic variant (Chi, Fan, Ramadge, Rudnicky, NeurIPS 2022, arXiv 2205.09921, §4.2): no position
embeddings; a learned conditionally positive definite kernel of the distance, one pair of parameters per head,
added to the attention logits::

    e_ij = (x_i W_q)(x_j W_k)^T / sqrt(d_z) + b_h(i, j),    b_h(i, j) = −r1_h · log(1 + r2_h · |i − j|),
    r1_h, r2_h > 0

The paper's causal LM uses i − j ≥ 0 (future keys masked); the decoder here is the same, and the encoder uses the
symmetric |i − j|, as ALiBi does here (the usual adaptation for bidirectional attention: the bias cannot tell
left from right, order reaches an encoder through its decoder's cross-attention only).

Positivity: r = softplus(ρ), ρ the trained parameter. The authors' code (GPT-NeoX's ``ParallelKerpleLog``) clamps
the parameters' storage in place to ≥ 0.01 at every forward; that edit of a parameter inside the forward misses the
float32 master copy of fairseq's fp16 optimizer (its next step copies the unclamped value back), so the
projection would not hold here; a clamp inside the graph instead, r = max(ρ, 0.01), would give a clamped head no
gradient for ever. Softplus keeps r > 0 for any ρ without touching the parameters, and every head's gradient
flows. Initialisation as the authors' code: r1 ~ U(0, 2), r2 ~ U(0, 1),
each raised to their floor 0.01 (what their first forward does), stored as ρ = softplus⁻¹(r) so that the first
forward uses those values exactly. The authors' code has one (r1, r2) per head and layer; here one per head and
stack, shared by its layers (the project's score-bias contract: one scheme module per stack, as T5's table).

Mapping to code: ``KerpleLog.r1``/``r2`` are softplus of ``rho1``/``rho2`` (heads,); ``score_bias(q_pos, k_pos,
dtype)`` returns b as (heads, T, S) in dtype (float32, or float64 for a float64 model: never the model's half
precision) for ``PositionalSelfAttention``. No parameters in cross-attention.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .position_scheme import ScoreBias

FLOOR = 0.01  # the authors' code: both parameters clamped to >= 1e-2


def inverse_softplus(r: Tensor) -> Tensor:
    """ρ with softplus(ρ) = r (r > 0): log(e^r − 1), written as r + log(1 − e^−r) for large r."""
    return r + torch.log(-torch.expm1(-r))


class KerpleLog(ScoreBias):
    title, equation = "KERPLE log (Chi et al.)", "−r1_h·log(1 + r2_h·|j − i|)"

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        return cls(heads)

    def __init__(self, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        r1 = (2.0 * torch.rand(num_heads, dtype=torch.float64)).clamp(min=FLOOR)  # U(0, 2), the authors' bias_p
        r2 = torch.rand(num_heads, dtype=torch.float64).clamp(min=FLOOR)  # U(0, 1), the authors' bias_a
        self.rho1 = nn.Parameter(inverse_softplus(r1).float())
        self.rho2 = nn.Parameter(inverse_softplus(r2).float())

    def r1(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return F.softplus(self.rho1.to(dtype))

    def r2(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return F.softplus(self.rho2.to(dtype))

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        distance = (q_pos[:, None] - k_pos[None, :]).abs().to(dtype)  # (T, S)
        r1, r2 = self.r1(dtype).view(-1, 1, 1), self.r2(dtype).view(-1, 1, 1)
        return -r1 * torch.log1p(r2 * distance)  # (H, T, S)
