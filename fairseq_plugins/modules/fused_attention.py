"""torch's fused CPU SDPA kernel with a learned float mask (``biased_sdpa``), for the score-bias schemes.

The kernel takes a 4-D mask only, and one that needs no gradient; ``BiasedFlashCPU`` runs it on the detached mask
and gives the mask its gradient in the backward, dS = α ⊙ (dz vᵀ − (dz·z)), from α recomputed from the kernel's
log-sum-exp.
"""

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


class BiasedFlashCPU(torch.autograd.Function):
    """z = softmax(q kᵀ·scale + bias + mask) v by torch's fused CPU kernel, with the bias's gradient (the kernel
    gives only dq, dk, dv). bias (1 or B, H, T, S) and mask (fairseq's masks, no gradient) are added inside, the
    sum kept for no longer than the kernel runs: only the bias and the kernel's log-sum-exp wait for the
    backward, never a (B, H, T, S) tensor."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale):
        full = bias if mask is None else bias + mask
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False,
                                                                             attn_mask=full, scale=scale)
        ctx.save_for_backward(q, k, v, bias, mask, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, mask, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        full = bias if mask is None else bias + mask
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, False, attn_mask=full, scale=ctx.scale)
        dbias = None
        if ctx.needs_input_grad[3]:  # dS = α (dz vᵀ − dz·z): one layer's (B, H, T, S) at a time, here only
            work = torch.promote_types(q.dtype, torch.float32)
            scores = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)).mul_(ctx.scale).add_(full)
            alpha = scores.sub_(lse.to(work).unsqueeze(-1)).exp_()
            row = (grad_out.to(work) * out.to(work)).sum(-1, keepdim=True)
            grad_scores = torch.matmul(grad_out.to(work), v.to(work).transpose(-1, -2)).sub_(row).mul_(alpha)
            dims = [d for d in range(4) if bias.size(d) == 1 and grad_scores.size(d) != 1]
            dbias = (grad_scores.sum(dims, keepdim=True) if dims else grad_scores).to(bias.dtype)
        return dq, dk, dv, dbias, None, None


def _four_d(x: Optional[Tensor]) -> Optional[Tensor]:
    return x if x is None or x.dim() == 4 else x.view((1,) * (4 - x.dim()) + x.shape)


def biased_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], bias: Optional[Tensor],
                dropout_p: float) -> Tensor:
    """softmax(q kᵀ/√d + bias + mask) v, q (B, H, T, d); bias and fairseq's additive mask broadcastable to
    (B, H, T, S), on torch's fused CPU kernel where it has one.

    Torch's CPU SDPA sends a 3-D mask and a mask that needs a gradient (T5's table) down its unfused math path,
    which keeps every layer's (B, H, T, S) probabilities for the backward; its fused kernel keeps the mask it was
    given (with padding, (B, H, T, S) too). So on CPU the bias goes through ``BiasedFlashCPU``, 4-D."""
    if bias is not None:
        bias = _four_d(bias.to(q.dtype))
    mask = _four_d(mask)
    if (bias is not None and q.device.type == "cpu" and dropout_p == 0 and torch.is_grad_enabled()
            and not torch.is_autocast_enabled("cpu")):
        return BiasedFlashCPU.apply(q, k, v, bias, mask, 1.0 / math.sqrt(q.size(-1)))
    full = bias if mask is None else (mask if bias is None else mask + bias)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=full, dropout_p=dropout_p)
