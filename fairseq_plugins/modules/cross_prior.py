"""A position prior in cross-attention: ALiBi's linear penalty (Press et al., ICLR 2022) on the distance between a
source position and the target position's sync point on the source, as Marian's sequence-to-sequence ALiBi does
in its decoder's cross-attention (there the sync points come from the data; here from the source length)::

    e_ij = q_i·k_j / sqrt(d_z) − m_h · |j − c_i|,      c_i = min(i · S / T̂, S − 1),   T̂ = ρ · S,
         so  c_i = min(i / ρ, S − 1)

- i = 0, 1, …: the decoder position (0: fairseq's first decoder input, the EOS that predicts the first word);
- j = 0..S−1: the source position counted from the sentence's first real token (fairseq left-pads sources: a
  pad has no position and is masked), S the sentence's real source length, its EOS included;
- ρ: ``--cross-prior-ratio``, the expected target/source length ratio (default 1.0);
- m_h: ALiBi's slopes, 2^(−8h/H) for H a power of two (``alibi.alibi_slopes``), fixed by default;
  ``--cross-prior-slopes learned`` makes them one parameter per head, initialised there and left unconstrained
  (a head may flatten its prior, m_h → 0, or turn it round).

Why T̂ = ρ·S and not the target length T: the sync point i·S/T needs the whole target's length, which a
teacher-forced training step knows and a decoder writing the target step by step does not. A prior on the true
T in training and on a guess at decoding would move its diagonal between the two; T̂ = ρ·S is the same quantity
in both, known from the source alone. S then cancels from the diagonal's slope (j ≈ i/ρ) and enters only
through the clip: past the source's expected end, the target is drawn to its last token (EOS), never beyond.

The prior is the decoder's (one module shared by its layers, as the self-attention schemes' are per stack)
and composes with any self-attention scheme: it touches only the cross-attention logits.

Mapping to code: ``AlibiSync.cross_bias(q_pos, k_pos, src_lengths, dtype)`` returns −m_h·|j − c_i| as
(B, H, T, S) from q_pos (T,) = i, k_pos (B, S) = j (each key's rank among its sentence's real tokens) and
src_lengths (B,) = S, in dtype (float32, or float64 for a float64 model: never the model's half precision);
``positional_attention.PositionalCrossAttention`` adds it to fairseq's cross-attention logits.
"""


import torch
from torch import Tensor, nn

from ..flags import Flag, one_of, positive
from .alibi import FixedSlopes, alibi_slopes
from .position_scheme import CrossBias

SLOPES = ("fixed", "learned")


class AlibiSync(CrossBias):
    flags = (
        Flag("--cross-prior-ratio", positive(float), "R",
             "alibi_sync: the expected target/source length ratio ρ; decoder position i is drawn to source "
             "position min(i/ρ, S - 1) (default 1.0)", 1.0),
        Flag("--cross-prior-slopes", one_of(SLOPES), "KIND",
             "alibi_sync: the per-head slopes m_h, ALiBi's 2^(-8h/H): fixed (default) or learned from there", "fixed"),
    )

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        return cls(heads, ratio=cfg.cross_prior_ratio, learned=cfg.cross_prior_slopes == "learned")

    def __init__(self, num_heads: int, ratio: float = 1.0, learned: bool = False):
        super().__init__()
        self.num_heads, self.ratio = num_heads, float(ratio)
        initial = torch.tensor(alibi_slopes(num_heads), dtype=torch.float64)
        self.learned_slopes = nn.Parameter(initial.float()) if learned else None
        self._fixed = FixedSlopes(num_heads)

    def slopes(self, device, dtype) -> Tensor:
        """m (H,) in dtype."""
        if self.learned_slopes is not None:
            return self.learned_slopes.to(dtype)
        return self._fixed(device, dtype)

    def cross_bias(self, q_pos: Tensor, k_pos: Tensor, src_lengths: Tensor,
                   dtype: torch.dtype = torch.float32) -> Tensor:
        last = (src_lengths - 1).to(dtype)[:, None]  # (B, 1): S − 1
        sync = torch.minimum(q_pos.to(dtype)[None, :] / self.ratio, last)  # (B, T): c_i = min(i/ρ, S − 1)
        distance = (k_pos.to(dtype)[:, None, :] - sync[:, :, None]).abs()  # (B, T, S): |j − c_i|
        return -self.slopes(q_pos.device, dtype).view(1, -1, 1, 1) * distance[:, None]  # (B, H, T, S)
