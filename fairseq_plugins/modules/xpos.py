"""xPos, the extrapolatable position embedding (Sun et al., "A Length-Extrapolatable Transformer", ACL 2023, arXiv
2212.10554; torchscale's ``XPOS`` is the authors' code): RoPE's rotation with a per-pair exponential scale that
grows on the query and shrinks on the key, so that their product decays with distance::

    q̃_n = R_n (q_n ⊙ ζ^(n/γ)),   k̃_m = R_m (k_m ⊙ ζ^(−m/γ))
    q̃_n·k̃_m = Σ_i [(q_2i k_2i + q_2i+1 k_2i+1) cos((m−n)θ_i)
                    + (q_2i+1 k_2i − q_2i k_2i+1) sin((m−n)θ_i)] · ζ_i^((n−m)/γ)
    ζ_i = (i/(d_z/2) + 0.4)/1.4 ∈ [0.29, 1),  γ = 512 (the scale base),  θ_i = 10000^(−2i/d_z)  (RoPE's)

R_n is RoPE's rotation of each pair (2i, 2i+1) by nθ_i, and ζ_i scales both dimensions of pair i: the logit depends
on n − m only, and for a key before its query (m < n) the high-frequency pairs (small i: θ_0 = 1, ζ_0 = 0.29),
whose rotation turns fastest, fade with the distance, while the low-frequency ones (ζ_i → 1) keep RoPE's. Values
are not rotated; self-attention only.

Positions: n and m are counted from each sentence's first real token (``per_sentence``: left padding changes
nothing). Only n − m matters to the logit; torchscale centres the positions to keep ζ^(±n/γ) small, but its centre
moves as a decoder steps on while this attention caches keys already scaled. The cost is range: the factors,
computed in float32 (float64 for a float64 model), stay normal float16 numbers up to n ≈ 7.7·γ (3,900 tokens at
γ = 512), bfloat16 and float32 ones up to n ≈ 70·γ; a longer input is refused in one line (``check_length``).

The encoder gets the same two factors, as torchscale's self-attention applies them in any stack (xPos was made
for causal models): for a key after its query the factor exceeds 1 and grows with the distance (pair 0's: 1.08 at
32 tokens, 1.41 at 140); a decay in |n − m| on both sides is not a product of one factor per position.

Mapping to code: ``XPos.rotate(q, k, pos)`` applies the query's and the key's transforms (``scaled(x, pos,
query)``: the rotation's cos and sin times ζ^(±pos/γ), then ``rotate_pairs``); ``rotated(x, pos)`` is the key's,
R_m (x ⊙ ζ^(−m/γ)), the transform of a single vector that figures use: a query at position 0 is unchanged
(R_0 = I, ζ^0 = 1), so q·rotated(k, j − i) is the logit between query i and key j; ``theta`` holds RoPE's θ_i and
``zeta`` the ζ_i. ``PositionalSelfAttention`` calls ``rotate`` before its cache, with each sentence's positions
(B, T) where the batch is padded.
"""

import math

import torch
from torch import Tensor

from ..flags import Flag, positive
from .position_scheme import RangeError, Rotation, rotate_pairs

ZETA_0 = 0.4 / 1.4  # ζ_0, the smallest scale (pair 0): its powers leave a dtype's range first


class XPos(Rotation):
    title, equation = "xPos (Sun et al.)", "q_i·R_(j−i) k_j·ζ^((i−j)/γ)"
    per_sentence = True  # the scale reads positions themselves: each sentence's, from its first real token
    flags = (
        Flag("--xpos-scale-base", positive(float), "γ",
             "xPos: the scale base γ, q times ζ^(n/γ) and k times ζ^(−m/γ) (default 512, the paper's)", 512.0),
    )

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        return cls(head_dim, scale_base=cfg.xpos_scale_base)

    def __init__(self, head_dim: int, scale_base: float = 512.0, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"xPos rotates pairs of dimensions: the head dimension must be even, got {head_dim}")
        self.head_dim, self.scale_base, self.base = head_dim, scale_base, base
        self._tables = {}  # (device, dtype) → (θ, log ζ): not buffers, so that model.half() leaves them exact

    def _table(self, device, dtype):
        table = self._tables.get((device, dtype))
        if table is None:
            pair = torch.arange(0, self.head_dim, 2, dtype=torch.float64)  # 2i
            theta = self.base ** -(pair / self.head_dim)
            log_zeta = torch.log((pair / self.head_dim + 0.4) / 1.4)  # 2i/d = i/(d/2)
            table = self._tables[device, dtype] = (theta.to(device=device, dtype=dtype),
                                                   log_zeta.to(device=device, dtype=dtype))
        return table

    def theta(self, device, dtype) -> Tensor:
        return self._table(device, dtype)[0]

    def zeta(self, device, dtype) -> Tensor:
        """(d_z/2,) ζ_i, the scale of pair i."""
        return self._table(device, dtype)[1].exp()

    def scaled(self, x: Tensor, pos: Tensor, query: bool) -> Tensor:
        """R_pos (x ⊙ ζ^(±pos/γ)), + for a query, − for a key: x (B, H, T, d_z), positions (T,) or (B, T)."""
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # the factors in float32 at least
        theta, log_zeta = self._table(x.device, dtype)
        pos = pos.to(dtype)[..., None]  # (T, 1) or (B, T, 1)
        scale = torch.exp(pos * log_zeta * ((1 if query else -1) / self.scale_base))  # ζ^(±pos/γ), (…, T, d/2)
        angle = pos * theta
        return rotate_pairs(x, (angle.cos() * scale).to(x.dtype), (angle.sin() * scale).to(x.dtype))

    def rotated(self, x: Tensor, pos: Tensor) -> Tensor:
        """A key's transform, R_m (x ⊙ ζ^(−m/γ)): against a query at position 0, which xPos leaves unchanged,
        q·rotated(k, j − i) is the logit of query i and key j (what figures draw)."""
        return self.scaled(x, pos, query=False)

    def rotate(self, q: Tensor, k: Tensor, pos: Tensor):
        return self.scaled(q, pos, query=True), self.scaled(k, pos, query=False)

    @property
    def alone(self) -> str:
        """What figures draw as the rotation alone (``Rotation.alone``), ``rotated``'s trace."""
        return f"mean_p ζ_p^(−(j − i)/γ)·cos((j − i)·θ_p), base {self.base:g}, γ = {self.scale_base:g}"

    def check_length(self, length: int, dtype: torch.dtype) -> None:
        """The scale of pair 0, ζ_0^(±n/γ) = 3.5^(±n/γ), leaves dtype's normal numbers past n = γ·ln(1/tiny)/ln 3.5
        (float16: 7.7·γ; past 8.9·γ a key's factor is inf and the attention NaN): refused in one line before."""
        if dtype == torch.float64:
            return
        longest = int(self.scale_base * math.log(1 / torch.finfo(dtype).tiny) / -math.log(ZETA_0)) + 1
        if length > longest:
            wider = "decode in bf16 or float32, " if dtype == torch.float16 else ""
            raise RangeError(f"xPos: position {length - 1} is beyond what its scale ζ^(±n/γ) can hold in {dtype} "
                             f"(positions below {longest} at --xpos-scale-base {self.scale_base:g}): {wider}shorten "
                             "the input, or train with a larger --xpos-scale-base")

    def extra_repr(self):
        return f"head_dim={self.head_dim}, scale_base={self.scale_base:g}"
