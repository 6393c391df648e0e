"""CAPE, continuous augmented positional embeddings (Likhomanenko, Xu, Synnaeve, Collobert, Rogozhnikov,
NeurIPS 2021, arXiv 2106.03143, §3). The sinusoid of continuous positions, augmented in training only::

    x_t = E[w_t] · sqrt(d) + PE((t + Δ + ε_t) · λ),   t = 0, 1, …, T − 1 (the token's rank)
    Δ ~ U(−Δmax, Δmax) per sequence,  ε_t ~ U(−εmax/2, εmax/2) per token,  log λ ~ U(−log λmax, log λmax) per
    sequence;   at validation and test Δ = ε = 0, λ = 1 (plain positions)

so that the model cannot rely on absolute positions (global shift), on exact spacing (local shift) or on the
sequence's length (global scaling). Flags: ``--cape-max-global-shift`` Δmax (default 5), ``--cape-max-local-shift``
εmax (default 1: |ε_t| < 1/2, so tokens never swap places), ``--cape-max-global-scaling`` λmax (≥ 1, default
1.03): the values for text of the CAPE1d implementation's README (github.com/gcambara/cape, PyTorch, reviewed by
the paper's first author: ``CAPE1d(d_model=512, max_global_shift=5.0, max_local_shift=1.0,
max_global_scaling=1.03, normalize=False)``); its constructor's own defaults 0, 0, 1 are no augmentation.

As that code (``cape/cape1d.py``): Δ, ε (half-width εmax/2) and log λ as above, positions from 0,
``normalize=False`` (no mean-centering: a decoder cannot centre a prefix whose length it does not know yet),
augmentation in training only. As fairseq's sinusoid instead of theirs (frequencies 10000^(−2i/d), sin and cos
interleaved): fairseq's ``SinusoidalPositionalEmbedding`` — position t at fairseq's padding_idx + 1 + t,
frequencies 10000^(−j/(d/2 − 1)), all sines then all cosines — so that at evaluation CAPE is exactly the project's
sinusoidal Transformer (and its incremental decoding fairseq's own).

Mapping to code: ``CAPE`` is the scheme (its flags; ``embed`` gives the stack its embedding);
``CapePositionalEmbedding`` is fairseq's sinusoid (eval mode: fairseq's forward, untouched) whose training
forward evaluates sin/cos at the continuous positions. t is the rank among the sequence's real tokens: pads get
nothing, left padding shifts nothing. Δ, ε, log λ are drawn in that order from torch's generator on the input's
device (``torch.rand``), which fairseq seeds per update, so a resumed run draws the same; positions and the
sinusoid are computed in float32 (float64 for a float64 model), then cast to the model's dtype (fp16/bf16 safe).
"""

import math

import torch

from ..flags import Flag, at_least
from .position_scheme import PositionScheme
from .sinusoid_table import SinusoidTable


def continuous_sinusoid(positions, dim, padding_idx):
    """fairseq's sinusoid (``SinusoidalPositionalEmbedding.get_embedding``) at real-valued fairseq positions
    (B, T) → (B, T, dim), in positions' dtype."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=positions.dtype, device=positions.device) * -step)
    angle = positions.unsqueeze(-1) * freq
    out = torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)
    if dim % 2 == 1:
        out = torch.cat([out, torch.zeros_like(out[..., :1])], dim=-1)
    return out


class CapePositionalEmbedding(SinusoidTable):
    def __init__(self, embedding_dim, padding_idx, init_size, max_global_shift, max_local_shift,
                 max_global_scaling):
        super().__init__(embedding_dim, padding_idx, init_size)
        self.max_global_shift, self.max_local_shift = max_global_shift, max_local_shift
        self.max_global_scaling = max_global_scaling

    @property
    def augments(self):
        return self.max_global_shift > 0 or self.max_local_shift > 0 or self.max_global_scaling > 1

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        if not (self.training and self.augments) or incremental_state is not None:
            return super().forward(input, incremental_state, timestep, positions)
        bsz, seq_len = input.shape
        real = input.ne(self.padding_idx)
        dtype = torch.promote_types(torch.float32, self.model_float.dtype)  # never fp16/bf16 positions
        rank = (torch.cumsum(real, dim=1) - 1).clamp(min=0)  # t = 0, 1, ... over the real tokens
        device = input.device
        delta = (torch.rand(bsz, 1, device=device).to(dtype) * 2 - 1) * self.max_global_shift
        eps = (torch.rand(bsz, seq_len, device=device).to(dtype) - 0.5) * self.max_local_shift
        log_scale = (torch.rand(bsz, 1, device=device).to(dtype) * 2 - 1) * math.log(self.max_global_scaling)
        eps = eps.gather(1, rank)  # ε_t: the t-th draw of its row, whatever the padding on the left
        t = (rank.to(dtype) + delta + eps) * torch.exp(log_scale)
        emb = continuous_sinusoid(t + (self.padding_idx + 1), self.embedding_dim, self.padding_idx)
        emb = emb.masked_fill(~real.unsqueeze(-1), 0.0)  # pads: fairseq's zero row
        return emb.to(self.model_float.dtype).detach()


class CAPE(PositionScheme):
    embedding = "cape"
    flags = (
        Flag("--cape-max-global-shift", at_least(float, 0.0), "DELTA",
             "CAPE: each training sequence's positions shifted by one offset drawn from U(-DELTA, DELTA) "
             "(default 5, the implementation's example for text; 0: none)", 5.0),
        Flag("--cape-max-local-shift", at_least(float, 0.0), "EPS",
             "CAPE: each training position jittered by U(-EPS/2, EPS/2) (default 1, the implementation's "
             "example for text; 0: none)", 1.0),
        Flag("--cape-max-global-scaling", at_least(float, 1.0), "LAMBDA",
             "CAPE: each training sequence's positions scaled by one λ with log λ ~ U(-log LAMBDA, log LAMBDA) "
             "(default 1.03, the implementation's example for text; 1: none)", 1.03),
    )

    @classmethod
    def embed(cls, cfg, stack, embed_dim, max_positions):
        return CapePositionalEmbedding(embed_dim, stack.padding_idx, max_positions + stack.padding_idx + 1,
                                       cfg.cape_max_global_shift, cfg.cape_max_local_shift,
                                       cfg.cape_max_global_scaling)
