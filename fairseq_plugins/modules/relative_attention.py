"""Self-attention with relative position representations (Shaw, Uszkoreit & Vaswani, NAACL 2018).

For one head of size d_z, a query at position i, a key at position j and a clipping distance k (eqs. 2-4):

    e_ij   = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z),   α_ij = softmax_j(e_ij),   z_i = Σ_j α_ij (x_j W^V + a^V_ij)
    a^K_ij = w^K_clip(j−i, k),   a^V_ij = w^V_clip(j−i, k),   clip(x, k) = max(−k, min(k, x))

w^K, w^V: 2k+1 learned vectors of size d_z, one table per head or one shared by the heads. Without a (T, S, d_z)
tensor (the paper's §3.3 split), with b(i, j) = clip(j − i, k) + k the table row of pair (i, j) and
q_i = x_i W^Q / sqrt(d_z):

    e_ij = q_i·(x_j W^K) + P[i, b(i, j)],     P = q (w^K)^T               (T, 2k+1)   gather_by_offset(P)
    z_i  = Σ_j α_ij (x_j W^V) + Σ_m A_im w^V_m,  A_im = Σ_{j: b(i,j)=m} α_ij   (T, 2k+1)   sum_by_offset(α)

Query i of a call sits at absolute position i + (S − T) (S − T: the steps already cached). The backward
(``RelativeAttention``, one autograd function; it recomputes α from q and k, as FlashAttention does):

    dA = dz (w^V)^T,  dw^V = A^T dz,  dv = α^T dz,  dα = dz v^T + gather_by_offset(dA)
    de_ij = α_ij (dα_ij − dz_i·z_i),  dP = sum_by_offset(de),  dq = de k + dP w^K,  dk = de^T q,  dw^K = dP^T q

Mapping to code: ``ShawRelative`` is the scheme (``position_scheme.py``'s contract): its flags, per-size settings,
tables (``layer_parameters``: each self-attention's ``relative_keys``, ``relative_values``) and the product
(``attend``, ``scores``); ``PositionalSelfAttention`` splits the heads, keeps the cache, builds the masks, picks the
dropout and projects the output; ``RelativeMultiheadAttention`` is that attention with a Shaw scheme of its own.
Why k = 0 carries no position, how sum_by_offset needs no scatter, and what the buffers cost:
docs/position_schemes.md.
"""

import contextlib
import math
from collections import OrderedDict
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..flags import Flag, boolean
from .position_scheme import RelativeProduct
from .positional_attention import PositionalSelfAttention


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


def _clipping_distance(text):
    """--max-relative-positions K: an integer k >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise ValueError(f"must be >= 0 (got {value}); 0 is the paper's no-position ablation")
    return value


class ShawRelative(RelativeProduct):
    """Shaw et al.'s relative keys and values as a scheme of ``position_transformer`` (the equations above): it
    owns the attention product (``attend``: ``RelativeAttention``), and its tables w^K, w^V are one pair per layer,
    as in the paper (``layer_parameters``: each attention's ``relative_keys`` and ``relative_values``, the
    state-dict keys ``relative_transformer`` always wrote). No absolute positions by default (the paper's models
    are "relative only", §4.1; adding sinusoids gave no benefit): fairseq's embedding only with
    --relative-add-absolute-positions (its learned table with --encoder/decoder-learned-pos).

    Its architectures keep their names, ``relative_transformer[_wmt_en_de|_vaswani_wmt_en_de_big|
    _vaswani_wmt_en_fr_big|_tiny]``, with the paper's §4.1 settings each pins (``size_defaults``): fairseq's dims,
    k = 16, tables per head, keys and values; the base model's FFN is the paper's 1024 (fairseq's
    transformer_wmt_en_de has 2048); the big models have k = 8 and tables shared by the heads; tiny has k = 4."""

    embedding = "none"
    flags = (
        Flag("--max-relative-positions", _clipping_distance, "K",
             "Shaw's clipping distance k: relative distances beyond ±k share one vector (2k+1 vectors per table); "
             "0 keeps a single vector, the paper's no-position ablation", 16),
        Flag("--relative-keys", boolean, None, "Shaw: learn relative key vectors a^K (added to the keys in the "
             "attention scores)", True, switch=True, off="--no-relative-keys",
             off_help="Shaw: no relative key vectors"),
        Flag("--relative-values", boolean, None, "Shaw: learn relative value vectors a^V (added to the values; "
             "paper Table 3 ablates them)", True, switch=True, off="--no-relative-values",
             off_help="Shaw: no relative value vectors"),
        Flag("--relative-per-head", boolean, None, "Shaw: unique relative tables per head (the paper's base "
             "model)", True, switch=True, off="--relative-shared-heads",
             off_help="Shaw: one relative table per layer shared across heads (the paper's big model)"),
        Flag("--relative-add-absolute-positions", boolean, None, "Shaw: also add fairseq's absolute (sinusoidal, "
             "or learned with --encoder/decoder-learned-pos) position embeddings; default: relative positions "
             "only, as in the paper", False, switch=True),
    )
    size_defaults = {
        "base": {"encoder_ffn_embed_dim": 1024, "decoder_ffn_embed_dim": 1024},
        "big": {"max_relative_positions": 8, "relative_per_head": False},
        "big_en_fr": {"max_relative_positions": 8, "relative_per_head": False},
        "tiny": {"max_relative_positions": 4},
    }

    @classmethod
    def embeds(cls, args):
        return args.relative_add_absolute_positions

    @classmethod
    def embed(cls, cfg, stack, embed_dim, max_positions):
        return stack.embed_positions if cfg.relative_add_absolute_positions else None

    @classmethod
    def learned_table(cls, learned_pos):
        return learned_pos  # fairseq's own flags, for --relative-add-absolute-positions

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        return cls(heads, head_dim, cfg.max_relative_positions, cfg.relative_keys, cfg.relative_values,
                   cfg.relative_per_head)

    def __init__(self, num_heads: int, head_dim: int, max_relative_positions: int, relative_keys: bool = True,
                 relative_values: bool = True, per_head: bool = True):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, head_dim
        self.max_relative_positions, self.per_head = max_relative_positions, per_head
        self.relative_keys, self.relative_values = relative_keys, relative_values

    def extra_repr(self):
        return (f"max_relative_positions={self.max_relative_positions}, per_head={self.per_head}, "
                f"relative_keys={self.relative_keys}, relative_values={self.relative_values}")

    def layer_parameters(self):
        """w^K and w^V of one layer: Glorot-uniform over each (2k+1, d_z) table, tensor2tensor's initialiser."""
        shape = ((self.num_heads,) if self.per_head else ()) + (2 * self.max_relative_positions + 1, self.head_dim)
        bound = math.sqrt(6.0 / (2 * self.max_relative_positions + 1 + self.head_dim))
        tables = {}
        for name, wanted in (("relative_keys", self.relative_keys), ("relative_values", self.relative_values)):
            tables[name] = nn.Parameter(torch.empty(shape).uniform_(-bound, bound)) if wanted else None
        return tables

    def scores(self, attention, q: Tensor, k: Tensor) -> Tensor:
        """e_ij = q_i·(k_j + a^K_ij) / sqrt(d_z), with autograd through the offset gather: (B, H, T, S)."""
        q = q * attention.scaling
        scores = torch.matmul(q, k.transpose(2, 3))
        if attention.relative_keys is not None:
            index = relative_index(self.max_relative_positions, q.size(2), k.size(2), q.device)
            scores = scores + gather_by_offset(torch.matmul(q, attention.relative_keys.transpose(-1, -2)), index)
        return scores

    def attend(self, attention, q, k, v, mask, dropout_p, need_weights):
        """z (B, H, T, d) and α (B, H, T, S) (float32 at least; None unless need_weights) by ``RelativeAttention``
        (written-out backward, no (T, S, d) tensor). Under autocast every product runs in the autocast dtype, as
        autocast would run them (the autograd function is outside autocast's reach)."""
        B, H, T, d = q.shape
        S = k.size(2)
        tensors = (q * attention.scaling, k, v, attention.relative_keys, attention.relative_values)
        device_type = q.device.type
        with contextlib.ExitStack() as stack:
            if torch.is_autocast_enabled(device_type):
                dtype = torch.get_autocast_dtype(device_type)
                tensors = tuple(None if t is None else t.to(dtype) for t in tensors)
                stack.enter_context(torch.autocast(device_type, enabled=False))
            q, k, v = (t.reshape(B * H, -1, d) for t in tensors[:3])
            index = relative_index(self.max_relative_positions, T, S, q.device)

            def masked(scores: Tensor) -> Tensor:  # in place, keeping the scores' dtype (as fairseq)
                if mask is not None:
                    scores.view(B, H, T, S).add_(mask)
                return scores

            out, weights = RelativeAttention.apply(q, k, v, *tensors[3:], index, H, masked, dropout_p)
        return out.view(B, H, T, d), (weights.view(B, H, T, S) if need_weights else None)


class RelativeMultiheadAttention(PositionalSelfAttention):
    """The project's self-attention (``PositionalSelfAttention``: fairseq's MultiheadAttention parameters and
    incremental state) with a Shaw scheme of its own: one layer of Shaw et al.'s attention, built alone.

    Args:
        max_relative_positions: the clipping distance k (>= 0).
        relative_keys: learn w^K (a^K in the scores).
        relative_values: learn w^V (a^V in the outputs).
        per_head: one (2k+1, d_z) table per head, shape (H, 2k+1, d_z); otherwise one table shared by all heads.
    """

    def __init__(self, embed_dim: int, num_heads: int, max_relative_positions: int, relative_keys: bool = True,
                 relative_values: bool = True, per_head: bool = True, dropout: float = 0.0, q_noise: float = 0.0,
                 qn_block_size: int = 8):
        scheme = ShawRelative(num_heads, embed_dim // num_heads, max_relative_positions, relative_keys,
                              relative_values, per_head)
        super().__init__(embed_dim, num_heads, scheme, dropout=dropout, q_noise=q_noise,
                         qn_block_size=qn_block_size)

    @property
    def max_relative_positions(self):
        return self.scheme.max_relative_positions

    @property
    def per_head(self):
        return self.scheme.per_head
