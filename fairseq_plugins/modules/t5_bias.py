"""T5's relative position bias (Raffel et al., JMLR 2020, arXiv 1910.10683, §2.1).

A learned scalar per head and bucket of the relative distance is added to the attention logits::

    e_ij = (x_i W_q)(x_j W_k)^T / sqrt(d_z) + β_h[bucket(j − i)]

bucket(·): with n = i − j (how far back key j lies from query i),
- bidirectional (encoder): half of the B buckets for n > 0, the other half for n < 0 (offset B/2), on |n|;
  causal (decoder): n clamped to ≥ 0, all B buckets;
- within one direction's B' buckets: n < B'/2 is its own bucket; larger n fall into the remaining B'/2
  buckets log-spaced up to the maximum distance D, every n ≥ D in the last one.
Defaults B = 32, D = 128; one table β (B, heads) shared by all layers of a stack (the paper's).

Initialisation (``--t5-bias-init``), T5's own code by default: mesh-tensorflow creates the table
(``relative_attention_bias``, heads × buckets, ``transformer_layers.py``) with TF's default glorot-uniform
initializer, β ~ U(−a, a), a = sqrt(6 / (heads + B)) (0.41 for 4 heads, B = 32); HF transformers' port draws
N(0, 1/d_model) (``normal``); ``zeros`` is this project's earlier start. A bucket that no training pair reaches
gets no gradient, and Adam without weight decay leaves a parameter whose gradient is always zero where it is:
at test its β is its initial draw, an untrained per-head bias on the scale of the initialisation (with
``zeros``, exactly 0: no bias where the trained buckets next to it have theirs). Multi30k's longest training pair (49 source, 51 target tokens
with EOS) reaches neither the encoder's buckets for |n| ≥ 64 (14, 15, 30, 31) nor the decoder's for n ≥ 52
(25 to 31): a longer test sentence meets them.

Mapping to code: ``relative_bucket`` is bucket(·); ``T5Bias.score_bias(q_pos, k_pos)`` returns β[bucket] as
(heads, T, S), which ``PositionalSelfAttention`` adds to its logits. T5 folds 1/sqrt(d_z) into its weight
initialisation; here fairseq's scaling stays, so the bias adds to the scaled logits. No bias in the
cross-attention (T5 has none there: source and target positions are not comparable).
"""

import math

import torch
from torch import Tensor, nn

from ..flags import Flag, at_least, one_of
from .position_scheme import ScoreBias


def relative_bucket(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """bucket(j − i) for relative = j − i (integer tensor), as in the module docstring."""
    n = -relative
    bucket = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    exact = num_buckets // 2
    # log-spaced buckets for exact ≤ n < max_distance (n = 0 guarded: log of 0 is not used where n < exact)
    large = exact + (torch.log(n.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                     * (num_buckets - exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(n < exact, n, large)


T5_INITS = ("glorot", "normal", "zeros")  # --t5-bias-init: mesh-tensorflow's, HF transformers', none


class T5Bias(ScoreBias):
    """One stack's β (num_buckets, heads): ``score_bias`` gives the (heads, T, S) logit bias."""
    title, equation = "T5 relative bias (Raffel et al.)", "β_h[bucket(j − i)]"

    flags = (
        Flag("--t5-num-buckets", at_least(int, 4), "B", "T5 bias: buckets of relative distance (default 32)", 32),
        Flag("--t5-max-distance", at_least(int, 2), "D",
             "T5 bias: distances from D on share the last bucket (default 128)", 128),
        Flag("--t5-bias-init", one_of(T5_INITS), "INIT",
             "T5 bias: the table's initialisation: glorot (default; T5's own code, mesh-tensorflow: U(-a, a), "
             "a = sqrt(6 / (heads + buckets))), normal (HF transformers' port: N(0, 1/d_model)) or zeros", "glorot"),
    )

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        return cls(heads, bidirectional=not causal, num_buckets=cfg.t5_num_buckets, max_distance=cfg.t5_max_distance,
                   init=cfg.t5_bias_init, d_model=heads * head_dim)

    def __init__(self, num_heads: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128,
                 init: str = "glorot", d_model: int = None):
        super().__init__()
        exact = num_buckets // (2 if bidirectional else 1) // 2  # distances with a bucket of their own
        if exact < 1 or max_distance <= exact:  # the two flags together, and the stack's direction
            raise ValueError(f"--t5-num-buckets {num_buckets} / --t5-max-distance {max_distance}: need at least 2 "
                             f"buckets per direction and a maximum distance above the {exact} exact ones")
        self.bidirectional, self.num_buckets, self.max_distance = bidirectional, num_buckets, max_distance
        self.bias = nn.Embedding(num_buckets, num_heads)
        if init == "glorot":  # fan_in + fan_out = heads + buckets, whichever way round the table lies
            nn.init.xavier_uniform_(self.bias.weight)
        elif init == "normal":
            if d_model is None:
                raise ValueError("--t5-bias-init normal: N(0, 1/d_model) needs the model dimension")
            nn.init.normal_(self.bias.weight, std=d_model ** -0.5)
        else:  # zeros (the flag's parser admits only T5_INITS)
            nn.init.zeros_(self.bias.weight)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        buckets = relative_bucket(k_pos[None, :] - q_pos[:, None], self.bidirectional, self.num_buckets,
                                  self.max_distance)
        return self.bias(buckets).permute(2, 0, 1)  # (T, S, H) → (H, T, S), in the table's dtype
