"""Self-attention with a position scheme's hooks (``position_scheme.py``), always in this order: a rotation of q
and k (RoPE), then a logit bias (T5, ALiBi, KERPLE, FIRE).

    e_ij = (R_i q_i)·(R_j k_j) / sqrt(d_z) + bias_h(i, j) + mask_ij,   out_i = Σ_j softmax_j(e_ij) v_j

with R = identity and bias = 0 where the scheme leaves the hook out (each scheme's module gives its maths).
Positions are token indices in the padded sequence (0..T−1; during incremental decoding the step's index,
from the cached keys' length): only differences i − j enter, so fairseq's left-padded sources give each
sentence the same logits as alone.

Mapping to code: ``PositionalSelfAttention`` is fairseq's ``MultiheadAttention`` (same parameters, names and
incremental-state layout, so fairseq's beam reordering works unchanged) whose forward projects q, k, v, calls
``scheme.rotate(q, k, positions)`` (before caching k), and calls torch's fused ``scaled_dot_product_attention`` with
the scheme's bias added to fairseq's masks as one float mask (H, T, S) (or (B, H, T, S) with padding); the
explicit softmax path runs only when the attention weights are asked for. ``attention_backend="flex"``
(``--attention-backend flex``) runs the score biases through FlexAttention instead (``fused_attention.py``),
except while decoding step by step. The scheme object is shared by all
layers of a stack and owned by the stack (a T5 table is one set of parameters per stack); parameters a scheme keeps
per layer (``layer_parameters``: Shaw's tables) are each attention's own. A scheme that owns the product
(``owns_product``: Shaw's relative keys and values) gets q, k, v after the cache, the masks and the dropout
probability from here (``attend``), and hands back z, which is projected here.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from .floater.attention import _additive_mask
from .fused_attention import bias_score_mod, biased_sdpa, check_backend, flex, flex_mask


class PositionalSelfAttention(MultiheadAttention):
    def __init__(self, embed_dim: int, num_heads: int, scheme, dropout: float = 0.0, q_noise: float = 0.0,
                 qn_block_size: int = 8, attention_backend: str = "sdpa"):
        super().__init__(embed_dim, num_heads, dropout=dropout, self_attention=True, q_noise=q_noise,
                         qn_block_size=qn_block_size)
        check_backend(attention_backend, dropout)
        object.__setattr__(self, "scheme", scheme)  # the stack's: not a submodule of every layer
        self.attention_backend = attention_backend
        for name, parameter in scheme.layer_parameters().items():  # this layer's own (Shaw's tables)
            self.register_parameter(name, parameter)

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None, incremental_state=None, need_weights: bool = True,
                static_kv: bool = False, attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        tgt_len, bsz, embed_dim = query.size()
        heads, head_dim = self.num_heads, self.head_dim

        def split(x):  # (T, B, C) → (B, H, T, d)
            return x.view(x.size(0), bsz, heads, head_dim).permute(1, 2, 0, 3)

        q, k, v = split(self.q_proj(query)), split(self.k_proj(query)), split(self.v_proj(query))
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        start = saved["prev_key"].size(2) if saved is not None and "prev_key" in saved else 0
        positions = torch.arange(start, start + tgt_len, device=query.device)
        q, k = self.scheme.rotate(q, k, positions)  # (B, H, T, d) each
        if saved is not None:
            if "prev_key" in saved:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask, saved.get("prev_key_padding_mask"), bsz, k.size(2), False)
            saved["prev_key"], saved["prev_value"] = k, v
            saved["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved)
        src_len = k.size(2)
        scheme = self.scheme
        dropout_p = self.dropout_module.p if self.training or self.dropout_module.apply_during_inference else 0.0
        flex_ok = (self.attention_backend == "flex" and saved is None and not (need_weights or need_head_weights)
                   and (attn_mask is None or attn_mask.dim() == 2))
        if before_softmax:  # fairseq's (B·H, T, S) logits after the masks, and v (B·H, S, d)
            mask = _additive_mask(attn_mask, key_padding_mask, bsz, heads, tgt_len, src_len, q.dtype)
            logits = self._scores(q, k, positions, src_len)
            logits = logits if mask is None else logits + mask
            return logits.reshape(bsz * heads, tgt_len, src_len), v.reshape(bsz * heads, src_len, head_dim)
        if scheme.owns_product:  # the scheme's own product (Shaw): masks, dropout and projections stay here
            mask = (flex_mask(attn_mask, key_padding_mask) if flex_ok
                    else _additive_mask(attn_mask, key_padding_mask, bsz, heads, tgt_len, src_len, q.dtype))
            out, weights = scheme.attend(self, q, k, v, mask, dropout_p, need_weights or need_head_weights)
            out = self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim))
            if weights is not None:
                weights = weights.transpose(0, 1)  # (H, B, T, S)
                if not need_head_weights:
                    weights = weights.mean(dim=0)
            return out, weights
        if flex_ok:
            score_mod, buffers = bias_score_mod(self.scheme, tgt_len, src_len, query.device,
                                                torch.float64 if q.dtype == torch.float64 else torch.float32)
            out, _ = flex(q, k, v, score_mod, buffers, flex_mask(attn_mask, key_padding_mask), scale=self.scaling)
            return self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)), None
        mask = _additive_mask(attn_mask, key_padding_mask, bsz, heads, tgt_len, src_len, q.dtype)
        exact = torch.float64 if q.dtype == torch.float64 else torch.float32  # a fixed bias in float32 at least
        bias = self.scheme.score_bias(positions, torch.arange(src_len, device=query.device), exact)  # (H, T, S)
        weights = None
        if need_weights or need_head_weights:
            logits = torch.matmul(q * self.scaling, k.transpose(2, 3))
            if bias is not None:
                mask = bias.to(q.dtype) if mask is None else mask + bias.to(q.dtype)
            if mask is not None:
                logits = logits + mask
            half = logits.dtype in (torch.float16, torch.bfloat16)  # softmax in float32 at least, as fairseq's
            probs = F.softmax(logits, dim=-1, dtype=torch.float32 if half else logits.dtype).to(q.dtype)
            out = torch.matmul(F.dropout(probs, dropout_p, self.training), v)
            weights = probs.transpose(0, 1)  # (H, B, T, S)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        else:
            out = biased_sdpa(q, k, v, mask, bias, dropout_p)
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        return self.out_proj(out), weights

    def _scores(self, q: Tensor, k: Tensor, positions: Tensor, src_len: int) -> Tensor:
        """e_ij before the masks, (B, H, T, S): the scheme's own where it owns the product."""
        if self.scheme.owns_product:
            return self.scheme.scores(self, q, k)
        logits = torch.matmul(q * self.scaling, k.transpose(2, 3))
        exact = torch.float64 if q.dtype == torch.float64 else torch.float32
        bias = self.scheme.score_bias(positions, torch.arange(src_len, device=q.device), exact)
        return logits if bias is None else logits + bias.to(q.dtype)
