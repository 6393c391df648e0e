"""RoPE, rotary position embedding (Su et al., RoFormer, arXiv 2104.09864): no position added to the
embeddings; each pair of query/key dimensions (2i, 2i+1) of a head is rotated by the angle m·θ_i at position m::

    R_m x = (x_2i cos mθ_i − x_2i+1 sin mθ_i,  x_2i sin mθ_i + x_2i+1 cos mθ_i),   θ_i = b^(−2i/d_z), b = 10000

so that (R_m q)·(R_n k) = q^T R_(n−m) k depends on the offset n − m only. Values are not rotated.
Self-attention only (encoder and decoder): in cross-attention a target position m and a source position n lie
on different axes, so n − m means nothing.

Mapping to code: ``RoPE.rotate(x, pos)`` applies R_pos to x (B, H, T, d_z) with the angles computed in float32;
``PositionalSelfAttention`` rotates q and k before its cache and its fused ``scaled_dot_product_attention``.
"""

import torch
from torch import Tensor, nn


class RoPE(nn.Module):
    rotates = True

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE rotates pairs of dimensions: the head dimension must be even, got {head_dim}")
        self.head_dim, self.base = head_dim, base
        self._theta = {}  # (device, dtype) → θ: not a buffer, so that model.half() leaves the angles exact

    def theta(self, device, dtype) -> Tensor:
        theta = self._theta.get((device, dtype))
        if theta is None:
            exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim
            theta = self._theta[device, dtype] = (self.base ** -exponent).to(device=device, dtype=dtype)
        return theta

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        dtype = torch.float64 if x.dtype == torch.float64 else torch.float32  # angles in float32 at least
        angle = pos.to(dtype)[:, None] * self.theta(x.device, dtype)[None, :]  # (T, d/2)
        cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
        pairs = x.unflatten(-1, (-1, 2))  # (B, H, T, d/2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype):
        return None
