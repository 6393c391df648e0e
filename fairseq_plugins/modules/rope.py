"""RoPE, rotary position embedding (Su et al., RoFormer, arXiv 2104.09864): no position added to the
embeddings; each pair of query/key dimensions (2i, 2i+1) of a head is rotated by the angle m·θ_i at position m::

    R_m x = (x_2i cos mθ_i − x_2i+1 sin mθ_i,  x_2i sin mθ_i + x_2i+1 cos mθ_i),   θ_i = b^(−2i/d_z), b = 10000

so that (R_m q)·(R_n k) = q^T R_(n−m) k depends on the offset n − m only. Values are not rotated.
Self-attention only (encoder and decoder): in cross-attention a target position m and a source position n lie
on different axes, so n − m means nothing.

Inference-time scaling, for inputs longer than training (trained on length L, decoding up to L' = s·L; each
keeps the offset property, as the angle stays (a position) × (a θ_i of its own)):
- ``linear``, position interpolation (Chen et al. 2023, arXiv 2306.15595): m → m/s.
- ``ntk``, NTK-aware (bloc97 2023; Peng et al., YaRN §3.2): b → b·s^(d_z/(d_z−2)).
- ``yarn`` (Peng et al., ICLR 2024, arXiv 2309.00071): by the wavelength λ_i = 2π/θ_i, r_i = L/λ_i,
  γ(r) = 0 for r < α, 1 for r > β, (r − α)/(β − α) between (α = 1, β = 32), θ_i → (1 − γ(r_i))·θ_i/s + γ(r_i)·θ_i,
  and the logits divided by t with √(1/t) = 0.1·ln s + 1 (s > 1; 1 otherwise), i.e. q and k each times √(1/t).
  This is the paper's ramp, linear in r; HF transformers' and vLLM's code ramp linearly in the index i between
  the (rounded) i where r = β and r = α instead: the same θ where r ≤ α or r ≥ β, another blend between.

Mapping to code: ``RoPE.rotated(x, pos)`` applies R_pos to x (B, H, T, d_z) with the angles computed in float32
(float64 for float64 x); ``theta`` holds θ_i after ``ntk``/``yarn``, ``rotated`` divides the positions (``linear``)
and multiplies cos and sin by √(1/t) (``yarn``); ``none`` is the unscaled rotation, operation for operation.
The rotation slot's ``rotate(q, k, pos)`` rotates both (``position_scheme.Rotation``): ``PositionalSelfAttention``
calls it before its cache. The flags' values are checked once, by their parsers, and their combinations by
``validate`` (before the model is built; the constructor checks only what no flag sets: an even head size).
"""

import math

import torch
from torch import Tensor

from ..flags import Flag, FlagError, one_of, positive
from .position_scheme import Rotation, rotate_pairs

SCALINGS = ("none", "linear", "ntk", "yarn")
_LONGER = "RoPE, for decoding longer inputs than training"


class RoPE(Rotation):
    title, equation = "RoPE (Su et al.)", "q_i·R_(j−i) k_j"
    flags = (
        Flag("--rope-base", positive(float), "b", "RoPE: θ_i = b^(-2i/d) (default 10000, the paper's)", 10000.0),
        Flag("--rope-scaling", one_of(SCALINGS), "KIND",
             f"{_LONGER} (e.g. at decode time through --model-overrides): none (default), linear (position "
             "interpolation, m → m/S), ntk (NTK-aware, b → b·S^(d/(d-2))) or yarn (YaRN: θ_i ramped by "
             "wavelength, q and k times 0.1·ln S + 1)", "none"),
        Flag("--rope-scaling-factor", positive(float), "S",
             f"{_LONGER}: --rope-scaling's factor S, the longest decoded length over the training length (needed "
             "by linear, ntk and yarn)"),  # no default: None is "not given" (and checkpoints from before the flag)
        Flag("--rope-original-length", positive(float), "L",
             f"{_LONGER}: the training length L (tokens) that yarn's ramp measures wavelengths against (needed by "
             "yarn)"),
    )

    @classmethod
    def validate(cls, args):
        kind, factor, length = args.rope_scaling, args.rope_scaling_factor, args.rope_original_length
        if kind == "none" and factor is not None:
            raise FlagError("--rope-scaling-factor does nothing without --rope-scaling linear, ntk or yarn")
        if kind != "none" and factor is None:
            raise FlagError(f"--rope-scaling {kind} needs --rope-scaling-factor S (the decoded length over the "
                            "training length)")
        if kind == "yarn" and length is None:
            raise FlagError("--rope-scaling yarn needs --rope-original-length L (the training length, in tokens)")
        if kind != "yarn" and length is not None:
            raise FlagError(f"--rope-original-length does nothing with --rope-scaling {kind}: only yarn uses it")

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        return cls(head_dim, base=cfg.rope_base, scaling=cfg.rope_scaling, factor=cfg.rope_scaling_factor or 1.0,
                   original_length=cfg.rope_original_length)

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                 original_length: float = None, alpha: float = 1.0, beta: float = 32.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: the head dimension must be even, got {head_dim}")
        if scaling == "ntk" and head_dim < 4:  # s^(d/(d−2)) with d = 2 has no value
            raise ValueError(f"NTK-aware scaling needs a head dimension of 4 or more, got {head_dim}")
        self.head_dim, self.base = head_dim, base
        self.scaling, self.factor, self.original_length, self.alpha, self.beta = \
            scaling, factor, original_length, alpha, beta
        # √(1/t), multiplying q and k alike, so the logits by 1/t
        self.temperature = 0.1 * math.log(factor) + 1 if scaling == "yarn" and factor > 1 else 1.0
        self._theta = {}  # (device, dtype) → θ: not a buffer, so that model.half() leaves the angles exact

    def theta(self, device, dtype) -> Tensor:
        theta = self._theta.get((device, dtype))
        if theta is None:
            exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim
            base, d, s = self.base, self.head_dim, self.factor
            if self.scaling == "ntk":
                base = base * s ** (d / (d - 2))
            theta = base ** -exponent
            if self.scaling == "yarn":
                r = self.original_length * theta / (2 * math.pi)  # L/λ_i: turns of θ_i over the training length
                gamma = ((r - self.alpha) / (self.beta - self.alpha)).clamp(0, 1)
                theta = (1 - gamma) * theta / s + gamma * theta
            theta = self._theta[device, dtype] = theta.to(device=device, dtype=dtype)
        return theta

    def rotated(self, x: Tensor, pos: Tensor) -> Tensor:
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # angles in float32 at least
        pos = pos.to(dtype)
        if self.scaling == "linear":
            pos = pos / self.factor
        angle = pos[..., None] * self.theta(x.device, dtype)  # (T, d/2), or (B, T, d/2) per sentence
        cos, sin = angle.cos(), angle.sin()
        if self.temperature != 1.0:
            cos, sin = cos * self.temperature, sin * self.temperature
        return rotate_pairs(x, cos.to(x.dtype), sin.to(x.dtype))

    def extra_repr(self):
        scaled = f", scaling={self.scaling}, factor={self.factor:g}" if self.scaling != "none" else ""
        return f"head_dim={self.head_dim}, base={self.base:g}{scaled}"
