"""Self-attention with relative position representations (Shaw, Uszkoreit & Vaswani, NAACL 2018).

For one head of size d_z, a query at position i, a key at position j and a clipping distance k (eqs. 2-4):

    e_ij   = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z)
    α_ij   = softmax_j(e_ij)
    z_i    = Σ_j α_ij (x_j W^V + a^V_ij)
    a^K_ij = w^K_clip(j−i, k),   a^V_ij = w^V_clip(j−i, k),   clip(x, k) = max(−k, min(k, x))

w^K and w^V are tables of 2k+1 learned vectors of size d_z, either one table per head or one shared by all heads.
k = 0 is the paper's "no position" ablation (Table 2, 12.5 BLEU): every pair uses the same vector w_0, so the key
term q_i·w^K_0 is constant along j (softmax ignores it) and the value term is the constant w^V_0; it is computed
exactly as the equations say and carries no position information.

How the code computes it without ever building a (T, S, d_z) tensor (the paper's §3.3 split). Write
b(i, j) = clip(j − i, k) + k ∈ {0, …, 2k} for the table row of pair (i, j), and q_i = x_i W^Q / sqrt(d_z):

    e_ij = q_i·(x_j W^K) + P[i, b(i, j)],     P = q (w^K)^T               (T, 2k+1)   gather_by_offset(P)
    z_i  = Σ_j α_ij (x_j W^V) + Σ_m A_im w^V_m,  A_im = Σ_{j: b(i,j)=m} α_ij   (T, 2k+1)   sum_by_offset(α)

gather_by_offset and sum_by_offset are adjoint linear maps, so each one's backward is the other. sum_by_offset needs
no scatter: bucket 0 holds every j ≤ i−k, bucket 2k every j ≥ i+k, and each bucket in between is the single key
j = i−k+m, so A is 2k−1 gathered diagonals of α and two row sums over the tails (one small matrix product).
Query i of a call sits at absolute position i + (S − T): S − T is the number of steps already cached during
incremental decoding, and 0 otherwise, so step-by-step decoding scores exactly what a full causal forward scores.

The attention itself (`RelativeAttention`) is one autograd function whose backward is written out (d· is the gradient
of the loss, out_i = z_i):

    dA = dz (w^V)^T,  dw^V = A^T dz,  dv = α^T dz,  dα = dz v^T + gather_by_offset(dA)
    de_ij = α_ij (dα_ij − Σ_j' α_ij' dα_ij') = α_ij (dα_ij − dz_i·z_i)            (softmax; the sum is dz_i·z_i)
    dP = sum_by_offset(de),  dq = de k + dP w^K,  dk = de^T q,  dw^K = dP^T q

The scores are one buffer per call: gathered P, the product q k^T accumulated into it, masked and turned into α in
place; so is dα (gathered dA, dz v^T accumulated, turned into de in place). As FlashAttention does, the backward
recomputes α from q and k instead of keeping it from the forward: no (T, S) tensor per layer waits for the backward
(at T = 256 the saved α would add about 6% to a base model's training memory; recomputing costs about 2% of an
update, see results/bench.md). Memory stays O(B·H·T·S + B·H·T·(2k+1)) per layer at a time.
``attention_backend="flex"`` computes the same z without any (T, S) tensor (``fused_attention.shaw_flex``,
derivation in docs/fused_attention.md).
"""

import contextlib
import math
from collections import OrderedDict
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .fused_attention import check_backend, flex_mask, shaw_flex


class RelativeIndex(NamedTuple):
    """Where `tgt_len` queries at positions a_i = src_len − tgt_len + i meet `src_len` keys, as flat indices into
    rows of (T·(2k+1)) or (T·S) values (index_select is several times faster than gather with a broadcast index)."""

    bucket: Tensor  # (T·S,) long: i·(2k+1) + b(i, j), b(i, j) = clip(j − a_i, k) + k the table row of pair (i, j)
    diagonal: Tensor  # (T·(2k−1),) long: i·S + j for the key j = a_i − k + m of bucket m, 0 < m < 2k (clamped)
    outside: Tensor  # (T, 2k−1) bool: that key is not in [0, S−1] (the bucket is empty)
    tails: Tensor  # (T, 2, S) float: j is in bucket 0 (j ≤ a_i − k), j is in bucket 2k (j ≥ a_i + k)


# Index tensors shared by every layer, for the most recent shapes: (k, T, S, device) -> RelativeIndex.
_INDEX_CACHE: "OrderedDict[Tuple[int, int, int, torch.device], RelativeIndex]" = OrderedDict()
_INDEX_CACHE_SIZE = 16


def relative_index(k: int, tgt_len: int, src_len: int, device: torch.device) -> RelativeIndex:
    key = (k, tgt_len, src_len, device)
    index = _INDEX_CACHE.get(key)
    if index is None:
        with torch.inference_mode(False):  # usable under autograd even if first built during inference
            T, S = tgt_len, src_len
            query = torch.arange(S - T, S, device=device)[:, None]  # a_i
            offset = torch.arange(S, device=device) - query  # j − a_i: (T, S)
            row = torch.arange(T, device=device)[:, None]
            diagonal = query - k + torch.arange(1, max(2 * k, 1), device=device)  # (T, 2k−1)
            tails = (torch.stack([offset <= -k, offset >= k], dim=1) if k > 0
                     else torch.ones(T, 1, S, dtype=torch.bool, device=device))  # k = 0: one bucket, every key
            index = RelativeIndex(
                (offset.clamp(-k, k) + k + row * (2 * k + 1)).view(-1),
                (diagonal.clamp(0, S - 1) + row * S).view(-1),
                (diagonal < 0) | (diagonal >= S),
                tails.float(),
            )
        _INDEX_CACHE[key] = index
        if len(_INDEX_CACHE) > _INDEX_CACHE_SIZE:
            _INDEX_CACHE.popitem(last=False)
    else:
        _INDEX_CACHE.move_to_end(key)
    return index


def _gather_by_offset(x: Tensor, index: RelativeIndex) -> Tensor:
    """y_ij = x_i,b(i,j): (…, T, 2k+1) -> (…, T, S)."""
    S = index.tails.size(-1)
    return x.reshape(-1, x.size(-2) * x.size(-1)).index_select(1, index.bucket).view(x.shape[:-1] + (S,))


def _sum_by_offset(y: Tensor, index: RelativeIndex) -> Tensor:
    """x_im = Σ_{j: b(i,j)=m} y_ij: (…, T, S) -> (…, T, 2k+1): the two tails' sums and the diagonals between."""
    T, S = y.shape[-2:]
    rows = y.reshape(-1, T, S)
    accumulate = torch.promote_types(y.dtype, torch.float32)  # half-precision sums would lose the buckets
    # tails: for each query i, masks (2, S) @ keys (S, N): a (T, 2, S) @ (T, S, N) product on a view of the rows
    tails = torch.bmm(index.tails.to(accumulate), rows.permute(1, 2, 0).to(accumulate)).permute(2, 0, 1)
    if tails.size(-1) == 1:  # k = 0: one bucket, the whole row
        return tails.to(y.dtype).reshape(y.shape[:-1] + (1,))
    diagonals = rows.reshape(rows.size(0), T * S).index_select(1, index.diagonal).view(rows.size(0), T, -1)
    diagonals = diagonals.masked_fill_(index.outside, 0.0)
    return torch.cat([tails[..., :1].to(y.dtype), diagonals, tails[..., 1:].to(y.dtype)], -1).view(
        y.shape[:-1] + (index.outside.size(-1) + 2,))


class GatherByOffset(torch.autograd.Function):
    """x (…, T, 2k+1) -> y (…, T, S) with y_ij = x_i,b(i,j); backward: sum_by_offset."""

    @staticmethod
    def forward(ctx, x: Tensor, index: RelativeIndex) -> Tensor:
        ctx.index = index
        return _gather_by_offset(x, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return SumByOffset.apply(grad, ctx.index), None


class SumByOffset(torch.autograd.Function):
    """y (…, T, S) -> x (…, T, 2k+1) with x_im = Σ_{j: b(i,j)=m} y_ij; backward: gather_by_offset."""

    @staticmethod
    def forward(ctx, y: Tensor, index: RelativeIndex) -> Tensor:
        ctx.index = index
        return _sum_by_offset(y, index)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return GatherByOffset.apply(grad, ctx.index), None


gather_by_offset = GatherByOffset.apply
sum_by_offset = SumByOffset.apply


def _per_head_product(x: Tensor, table: Tensor, num_heads: int) -> Tensor:
    """x @ table for every head: x (B·H, T, a), table (H, a, c), or (a, c) shared by the heads -> (B·H, T, c).

    A per-head table is either broadcast over the B sentences (a copy of B·H·a·c values) or multiplied with the
    queries grouped by head (copies of x and of the result, B·H·T·(a + c) values): whichever copies less, i.e. the
    broadcast in training and the grouping when decoding one step at a time."""
    N, T, a = x.shape
    if table.dim() == 2:
        return torch.matmul(x, table)
    c = table.size(-1)
    if T * (a + c) >= a * c:
        return torch.matmul(x.view(-1, num_heads, T, a), table).view(N, T, c)
    grouped = x.view(-1, num_heads, T, a).transpose(0, 1).reshape(num_heads, -1, a)  # (H, B·T, a)
    return torch.bmm(grouped, table).view(num_heads, -1, T, c).transpose(0, 1).reshape(N, T, c)


def _table_gradient(x: Tensor, y: Tensor, table: Tensor, num_heads: int) -> Tensor:
    """Σ over sentences and queries of x_im y_i: x (B·H, T, 2k+1), y (B·H, T, d_z) -> the table's shape."""
    N, T, R = x.shape
    grad = torch.bmm(x.transpose(1, 2), y).view(-1, num_heads, R, y.size(-1)).sum(0)
    return grad if table.dim() == 3 else grad.sum(0)


def _scores(q: Tensor, k: Tensor, relative_keys: Optional[Tensor], index: RelativeIndex, num_heads: int) -> Tensor:
    """e = q k^T + gather_by_offset(q (w^K)^T): q (B·H, T, d_z), k (B·H, S, d_z) -> (B·H, T, S), in one buffer."""
    if relative_keys is None:
        return torch.bmm(q, k.transpose(1, 2))
    p = _per_head_product(q, relative_keys.transpose(-1, -2), num_heads)  # P: (B·H, T, 2k+1)
    return _gather_by_offset(p, index).baddbmm_(q, k.transpose(1, 2))


def _attention_weights(q: Tensor, k: Tensor, relative_keys: Optional[Tensor], index: RelativeIndex, num_heads: int,
                       mask) -> Tensor:
    """α = softmax_j(e_ij) after the masks, float32 at least (as fairseq's softmax): (B·H, T, S), in the scores' buffer
    when they are float32 already."""
    scores = mask(_scores(q, k, relative_keys, index, num_heads))
    float_type = torch.promote_types(scores.dtype, torch.float32)
    if scores.dtype == float_type:
        return torch.softmax(scores, -1, out=scores)
    return scores.softmax(-1, dtype=float_type)


class RelativeAttention(torch.autograd.Function):
    """(q, k, v, w^K, w^V) -> (z, α) with the relative key and value terms, masks and attention dropout; the
    backward is the one in the module docstring. q: (B·H, T, d_z) already scaled, k and v: (B·H, S, d_z), tables
    (H, 2k+1, d_z) or (2k+1, d_z) or None; `mask(scores)` applies the attention masks in place; α is float32 at
    least (as fairseq's softmax), the attention weights; the values are weighted by α in q's dtype, after dropout."""

    @staticmethod
    def forward(ctx, q, k, v, relative_keys, relative_values, index, num_heads, mask, dropout_p):
        alpha = _attention_weights(q, k, relative_keys, index, num_heads, mask)
        probs = alpha.to(q.dtype)
        keep = None  # the dropout mask (bool)
        if dropout_p > 0:
            keep = torch.empty_like(probs, dtype=torch.bool).bernoulli_(1 - dropout_p)
            probs = probs * keep * (1 / (1 - dropout_p))
        out = torch.bmm(probs, v)
        buckets = None
        if relative_values is not None:
            buckets = _sum_by_offset(probs, index)  # A
            out += _per_head_product(buckets, relative_values, num_heads)
        ctx.index, ctx.num_heads, ctx.mask = index, num_heads, mask
        ctx.save_for_backward(q, k, v, relative_keys, relative_values, keep, buckets, out)  # α is recomputed
        ctx.dropout_scale = 1 / (1 - dropout_p)
        ctx.set_materialize_grads(False)  # no gradient for α unless the weights are used
        return out, alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_alpha):
        q, k, v, relative_keys, relative_values, keep, buckets, out = ctx.saved_tensors
        index, H = ctx.index, ctx.num_heads
        alpha = _attention_weights(q, k, relative_keys, index, H, ctx.mask)
        grad_out = torch.zeros_like(out) if grad_out is None else grad_out.contiguous()
        grad_keys = grad_values = None
        # dα = dz v^T + gather_by_offset(dz (w^V)^T), in one buffer
        if relative_values is not None:
            grad_buckets = _per_head_product(grad_out, relative_values.transpose(-1, -2), H)  # dA
            grad_values = _table_gradient(buckets, grad_out, relative_values, H)
            grad_probs = _gather_by_offset(grad_buckets, index).baddbmm_(grad_out, v.transpose(1, 2))
        else:
            grad_probs = torch.bmm(grad_out, v.transpose(1, 2))
        probs = alpha.to(q.dtype) if keep is None else alpha.to(q.dtype) * keep * ctx.dropout_scale
        grad_v = torch.bmm(probs.transpose(1, 2), grad_out)
        if keep is not None:
            grad_probs *= keep
            grad_probs *= ctx.dropout_scale
        # softmax: de = α (dα − Σ_j α dα), with Σ_j α_ij dα_ij = dz_i·z_i (+ the weights' own gradient)
        row = (grad_out.to(alpha.dtype) * out.to(alpha.dtype)).sum(-1, keepdim=True)
        grad_scores = grad_probs.to(alpha.dtype)
        if grad_alpha is not None:
            grad_scores = grad_scores + grad_alpha
            row += (grad_alpha * alpha).sum(-1, keepdim=True)
        grad_scores = grad_scores.sub_(row).mul_(alpha).to(q.dtype)
        grad_q = torch.bmm(grad_scores, k)
        grad_k = torch.bmm(grad_scores.transpose(1, 2), q)
        if relative_keys is not None:
            grad_p = _sum_by_offset(grad_scores, index)  # dP
            grad_q += _per_head_product(grad_p, relative_keys, H)
            grad_keys = _table_gradient(grad_p, q, relative_keys, H)
        return grad_q, grad_k, grad_v, grad_keys, grad_values, None, None, None, None


class RelativeMultiheadAttention(MultiheadAttention):
    """fairseq's MultiheadAttention (same interface and q_proj/k_proj/v_proj/out_proj parameters) for
    self-attention with Shaw et al. relative position representations.

    Args:
        max_relative_positions: the clipping distance k (>= 0).
        relative_keys: learn w^K (a^K in the scores).
        relative_values: learn w^V (a^V in the outputs).
        per_head: one (2k+1, d_z) table per head, shape (H, 2k+1, d_z); otherwise one table shared by all heads.
        attention_backend: "sdpa" (``RelativeAttention``, the default) or "flex" (``fused_attention.shaw_flex``:
            FlexAttention, no (T, S) tensor; incremental decoding keeps ``RelativeAttention``).

    The forward never takes fairseq's fused paths (F.multi_head_attention_forward, SDPA, xFormers): they would
    drop the relative terms.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        max_relative_positions: int,
        relative_keys: bool = True,
        relative_values: bool = True,
        per_head: bool = True,
        dropout: float = 0.0,
        bias: bool = True,
        q_noise: float = 0.0,
        qn_block_size: int = 8,
        attention_backend: str = "sdpa",
    ):
        if max_relative_positions < 0:
            raise ValueError(f"max_relative_positions must be >= 0 (got {max_relative_positions})")
        check_backend(attention_backend, dropout)
        super().__init__(
            embed_dim, num_heads, dropout=dropout, bias=bias, self_attention=True,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.max_relative_positions = max_relative_positions
        self.per_head = per_head
        self.attention_backend = attention_backend  # flex: fused_attention.shaw_flex, except step by step
        table_shape = ((num_heads,) if per_head else ()) + (2 * max_relative_positions + 1, self.head_dim)
        self.relative_keys = nn.Parameter(torch.empty(table_shape)) if relative_keys else None
        self.relative_values = nn.Parameter(torch.empty(table_shape)) if relative_values else None
        self.reset_relative_tables()

    def reset_relative_tables(self):
        """Glorot-uniform over each (2k+1, d_z) table, tensor2tensor's default initialiser."""
        bound = math.sqrt(6.0 / (2 * self.max_relative_positions + 1 + self.head_dim))
        for table in (self.relative_keys, self.relative_values):
            if table is not None:
                nn.init.uniform_(table, -bound, bound)

    def extra_repr(self):
        return (
            f"max_relative_positions={self.max_relative_positions}, per_head={self.per_head}, "
            f"relative_keys={self.relative_keys is not None}, relative_values={self.relative_values is not None}"
        )

    def _split_heads(self, x: Tensor) -> Tensor:
        """(T, B, H·d_z) -> (B·H, T, d_z), fairseq's head layout."""
        return x.contiguous().view(x.size(0), -1, self.head_dim).transpose(0, 1)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Input (T, B, C) -> output (T, B, C) and attention weights, as MultiheadAttention. Self-attention only:
        keys and values are projections of `query` (`key`/`value` are accepted for the interface and unused)."""
        if static_kv:
            raise ValueError("relative self-attention has no static keys/values (static_kv=True)")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()

        q = self._split_heads(self.q_proj(query) * self.scaling)  # x W^Q / sqrt(d_z): (B·H, T, d_z)
        k = self._split_heads(self.k_proj(query))  # x W^K
        v = self._split_heads(self.v_proj(query))  # x W^V
        if incremental_state is not None:
            k, v, key_padding_mask = self._extend_cache(incremental_state, k, v, key_padding_mask, bsz)
        src_len = k.size(1)
        index = relative_index(self.max_relative_positions, tgt_len, src_len, query.device)

        def mask(scores: Tensor) -> Tensor:  # in place, keeping the scores' dtype (as fairseq)
            if attn_mask is not None:
                if attn_mask.dtype == torch.bool:
                    scores.masked_fill_(attn_mask, float("-inf"))
                else:
                    scores += attn_mask
            if key_padding_mask is not None:
                scores.view(bsz, self.num_heads, tgt_len, src_len).masked_fill_(
                    key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
            return scores

        if before_softmax:  # e_ij with autograd through the offset gather
            scores = torch.bmm(q, k.transpose(1, 2))
            if self.relative_keys is not None:
                p = torch.matmul(q.view(bsz, self.num_heads, tgt_len, -1), self.relative_keys.transpose(-1, -2))
                scores = scores + gather_by_offset(p, index).view(scores.shape)
            return mask(scores), v

        dropout_p = self.dropout_module.p if self.training or self.dropout_module.apply_during_inference else 0.0
        tensors = (q, k, v, self.relative_keys, self.relative_values)
        device_type = query.device.type
        flex = (self.attention_backend == "flex" and incremental_state is None and not need_weights
                and (attn_mask is None or attn_mask.dim() == 2))
        with contextlib.ExitStack() as stack:
            if torch.is_autocast_enabled(device_type):  # the autocast dtype for every product, as autocast would
                dtype = torch.get_autocast_dtype(device_type)
                tensors = tuple(None if t is None else t.to(dtype) for t in tensors)
                stack.enter_context(torch.autocast(device_type, enabled=False))
            if flex:
                q4, k4, v4 = (t.view(bsz, self.num_heads, -1, self.head_dim) for t in tensors[:3])
                attn = shaw_flex(q4, k4, v4, *tensors[3:], self.max_relative_positions,
                                 flex_mask(attn_mask, key_padding_mask))
                weights = None
            else:
                attn, weights = RelativeAttention.apply(*tensors, index, self.num_heads, mask, dropout_p)
        attn = self.out_proj(attn.view(bsz, self.num_heads, tgt_len, self.head_dim).permute(2, 0, 1, 3)
                             .reshape(tgt_len, bsz, embed_dim))

        attn_weights: Optional[Tensor] = None
        if need_weights:
            attn_weights = weights.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                attn_weights = attn_weights.mean(dim=0)
        return attn, attn_weights

    def _extend_cache(self, incremental_state, k: Tensor, v: Tensor, key_padding_mask: Optional[Tensor], bsz: int):
        """Append this step's keys/values to fairseq's incremental buffer (prev_key/prev_value/prev_key_padding_mask,
        stored as (B, H, S, d_z) like MultiheadAttention, so its reorder_incremental_state reorders beams)."""
        saved_state = self._get_input_buffer(incremental_state)
        if "prev_key" in saved_state:
            k = torch.cat([saved_state["prev_key"].view(bsz * self.num_heads, -1, self.head_dim), k], dim=1)
            v = torch.cat([saved_state["prev_value"].view(bsz * self.num_heads, -1, self.head_dim), v], dim=1)
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
            batch_size=bsz,
            src_len=k.size(1),
            static_kv=False,
        )
        saved_state["prev_key"] = k.view(bsz, self.num_heads, -1, self.head_dim)
        saved_state["prev_value"] = v.view(bsz, self.num_heads, -1, self.head_dim)
        saved_state["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved_state)
        return k, v, key_padding_mask
