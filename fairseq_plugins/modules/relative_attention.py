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

sum_by_offset (α summed into 2k+1 buckets) and gather_by_offset are adjoint linear maps, so each one's backward is
the other. Neither needs a scatter: with the cumulative sum C_i(p) = Σ_{j≤p} α_ij, the buckets are
A_i0 = C_i(i−k) (every j ≤ i−k), A_im = C_i(i−k+m) − C_i(i−k+m−1) = α_i,i−k+m for 0 < m < 2k (the diagonals), and
A_i,2k = C_i(S−1) − C_i(i+k−1) (every j ≥ i+k), i.e. the differences of 2k+1 gathered columns of C.
Memory stays O(B·H·T·S + B·H·T·(2k+1)). Query i of a call sits at absolute position i + (S − T): S − T is the number
of steps already cached during incremental decoding, and 0 otherwise, so step-by-step decoding scores exactly what a
full causal forward scores.
"""

import math
from typing import Dict, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn


class RelativeIndex(NamedTuple):
    """Where `tgt_len` queries at positions a_i = src_len − tgt_len + i meet `src_len` keys."""

    bucket: Tensor  # (T, S) long: b(i, j) = clip(j − a_i, k) + k, the table row of each pair
    cum_column: Tensor  # (T, 2k+1) long: p_im = a_i − k + m for m < 2k and S − 1 for m = 2k, clamped to [0, S−1]
    before_start: Tensor  # (T, 2k+1) bool: p_im < 0, where C_i(p_im) is an empty sum


# Index tables shared by every layer, grown on demand: (k, device) -> RelativeIndex over positions 0 … size−1.
_INDEX_TABLES: Dict[Tuple[int, torch.device], RelativeIndex] = {}


def relative_index(k: int, tgt_len: int, src_len: int, device: torch.device) -> RelativeIndex:
    tables = _INDEX_TABLES.get((k, device))
    if tables is None or tables.bucket.size(0) < src_len:
        size = max(64, 1 << (src_len - 1).bit_length())
        with torch.inference_mode(False):  # usable under autograd even if first built during inference
            pos = torch.arange(size, device=device)
            column = pos[:, None] - k + torch.arange(2 * k + 1, device=device)
            column[:, 2 * k] = size  # the last bucket ends at the last key: clamped to S − 1 below
            tables = RelativeIndex((pos[None, :] - pos[:, None]).clamp(-k, k) + k, column.clamp(min=0), column < 0)
        _INDEX_TABLES[(k, device)] = tables
    rows = slice(src_len - tgt_len, src_len)
    return RelativeIndex(
        tables.bucket[rows, :src_len], tables.cum_column[rows].clamp(max=src_len - 1), tables.before_start[rows]
    )


def _gather_by_offset(x: Tensor, index: RelativeIndex) -> Tensor:
    """y_ij = x_i,b(i,j): (…, T, 2k+1) -> (…, T, S)."""
    return x.gather(-1, index.bucket.expand(x.shape[:-1] + index.bucket.shape[-1:]))


def _sum_by_offset(y: Tensor, index: RelativeIndex) -> Tensor:
    """x_im = Σ_{j: b(i,j)=m} y_ij: (…, T, S) -> (…, T, 2k+1), from cumulative sums (see the module docstring)."""
    accumulate = torch.promote_types(y.dtype, torch.float32)  # half-precision cumsums would lose the buckets
    cumulative = y.cumsum(-1, dtype=accumulate)  # C_i(p)
    g = cumulative.gather(-1, index.cum_column.expand(y.shape[:-1] + index.cum_column.shape[-1:]))
    g = g.masked_fill(index.before_start, 0.0)  # G_im = Σ_{j: b(i,j) ≤ m} y_ij
    return torch.diff(g, dim=-1, prepend=g.new_zeros(g.shape[:-1] + (1,))).to(y.dtype)


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


class RelativeMultiheadAttention(MultiheadAttention):
    """fairseq's MultiheadAttention (same interface and q_proj/k_proj/v_proj/out_proj parameters) for
    self-attention with Shaw et al. relative position representations.

    Args:
        max_relative_positions: the clipping distance k (>= 0).
        relative_keys: learn w^K (a^K in the scores).
        relative_values: learn w^V (a^V in the outputs).
        per_head: one (2k+1, d_z) table per head, shape (H, 2k+1, d_z); otherwise one table shared by all heads.

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
    ):
        if max_relative_positions < 0:
            raise ValueError(f"max_relative_positions must be >= 0 (got {max_relative_positions})")
        super().__init__(
            embed_dim, num_heads, dropout=dropout, bias=bias, self_attention=True,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.max_relative_positions = max_relative_positions
        self.per_head = per_head
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

    def _per_head(self, table: Tensor) -> Tensor:
        """A relative table as (H, 2k+1, d_z): per-head tables as they are, a shared one broadcast to every head."""
        return table if table.dim() == 3 else table.expand(self.num_heads, -1, -1)

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

        # e_ij = q_i·(x_j W^K) + q_i·w^K_b(i,j)
        if self.relative_keys is not None:
            q4 = q.view(bsz, self.num_heads, tgt_len, self.head_dim)
            p = torch.einsum("bhtd,hrd->bhtr", q4, self._per_head(self.relative_keys))  # P = q (w^K)^T
            key_term = gather_by_offset(p, index)  # P[i, b(i, j)]: (B, H, T, S)
            scores = torch.baddbmm(key_term.view(-1, tgt_len, src_len), q, k.transpose(1, 2))
        else:
            scores = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(attn_mask, float("-inf"))
            else:
                scores += attn_mask  # in place: keeps the scores' dtype, as fairseq
        if key_padding_mask is not None:
            scores = (
                scores.view(bsz, self.num_heads, tgt_len, src_len)
                .masked_fill(key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
                .view(bsz * self.num_heads, tgt_len, src_len)
            )
        if before_softmax:
            return scores, v

        # α, in float32 at least (as fairseq's utils.softmax), float64 kept
        weights_float = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        probs = self.dropout_module(weights_float.type_as(scores))

        # z_i = Σ_j α_ij (x_j W^V) + Σ_m A_im w^V_m
        attn = torch.bmm(probs, v).view(bsz, self.num_heads, tgt_len, self.head_dim)
        if self.relative_values is not None:
            buckets = sum_by_offset(probs.view(bsz, self.num_heads, tgt_len, src_len), index)  # A: (B, H, T, 2k+1)
            attn = attn + torch.einsum("bhtr,hrd->bhtd", buckets, self._per_head(self.relative_values))
        attn = self.out_proj(attn.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim))

        attn_weights: Optional[Tensor] = None
        if need_weights:
            attn_weights = weights_float.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0)
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
