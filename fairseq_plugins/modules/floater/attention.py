"""FLOATER's position-biased attention: projections whose bias depends on the token's position (paper eq. 12).

Block n's query projection with a per-position bias::

    q_i^(n) = W_q^(n) x_i + b_q^(n)(t_i) = W_q^(n) x_i + b_q^(n)(0) + Δb_q^(n)(t_i)

(likewise k and v), where b(0) is the projection's ordinary bias parameter and Δb comes from the flow's solve
(``flows.py``).

Mapping to code
---------------
- ``PositionBiasedLinear``                ``y_i = W x_i + b(0) + Δb(t_i)`` (Δb is in the solve's dtype, float32
  for half-precision models: it is cast to the projection's dtype where it is added).
- ``enable_position_biases``              gives a fairseq ``MultiheadAttention`` such q/k/v projections
  (``PositionBiasedMultiheadAttention``: torch's fused ``scaled_dot_product_attention`` on them where fairseq
  would use its own fused path).
- ``position_bindings``, ``step_bindings``   what each projection adds in one forward: a flow's Δb at each
  token's row, or one decoding step's whole bias; ``bind`` sets them all for one forward.
- ``token_rows``, ``rows_from_padding_mask``   the grid row of each token (fairseq's position numbering).
"""

from contextlib import contextmanager
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn


class PositionBiasedLinear(nn.Linear):
    """A Linear map whose bias depends on the token's position: y_i = W x_i + b(0) + Δb(t_i) (eq. 12).

    ``self.bias`` is b(0). Inside ``bind``, ``position_binding`` is either
    (Δb rows (P, out_features), the row of each input token (T, B) or (T, 1), or a function returning
    them, called when the projection runs) or the whole bias b(0) + Δb(t) of one position shared by every
    token (a step of incremental decoding); otherwise None and the module is an ordinary Linear.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=True)
        self.position_binding = None

    def forward(self, x: Tensor) -> Tensor:  # x: (T, B, in_features)
        binding = self.position_binding
        if binding is None:
            return super().forward(x)
        if isinstance(binding, Tensor):
            return F.linear(x, self.weight, binding.to(self.weight.dtype))
        y = super().forward(x)
        delta, rows = binding
        if callable(rows):
            rows = rows()
        if rows.size(1) not in (1, y.size(1)):
            # Beam search: encoder-decoder attention projects one copy of the encoder states per
            # sentence (MultiheadAttention.beam_size), the first of each group of hypotheses.
            rows = rows.view(rows.size(0), y.size(1), -1)[:, :, 0]
        # (T, B, out) + (T, B|1, out); Δb is in the solve's dtype. F.embedding, not delta[rows]: the indexing's
        # backward (index_put with accumulate) adds rows in a thread-dependent order on a multi-threaded CPU, so
        # training was not reproducible run to run; embedding's backward sums each row in token order.
        return y + F.embedding(rows, delta).to(y.dtype)


class PositionBiasedMultiheadAttention(MultiheadAttention):
    """fairseq's MultiheadAttention whose q/k/v projections are ``PositionBiasedLinear``: same parameters, same
    interface. fairseq's fused path (``F.multi_head_attention_forward``) takes one bias vector per projection, so
    it cannot apply per-position biases; the biases change q, k and v only, not the attention, so when fairseq
    would not need the weights this class projects q, k, v itself and calls ``F.scaled_dot_product_attention``
    (torch's fused kernels, as the Transformer's fused path does) instead of fairseq's Python path, which
    materialises the (T, S) scores per head. Everything else (incremental decoding, attention weights) is
    fairseq's own forward."""

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None, incremental_state=None, need_weights: bool = True,
                static_kv: bool = False, attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        # static_kv only decides what an incremental state keeps; beam_size > 1 shares encoder states per beam.
        fused = (incremental_state is None and not (need_weights or need_head_weights or before_softmax)
                 and key is not None and self.bias_k is None and not self.add_zero_attn and not self.onnx_trace
                 and self.beam_size == 1 and query.device.type != "xla")
        if not fused:
            return super().forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                   static_kv, attn_mask, before_softmax, need_head_weights)
        if self.self_attention:
            key = value = query
        elif self.encoder_decoder_attention:
            value = key  # as fairseq: keys and values are both projections of the encoder states
        tgt_len, bsz, embed_dim = query.size()
        src_len = key.size(0)
        q = self.q_proj(query).view(tgt_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        k = self.k_proj(key).view(src_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        v = self.v_proj(value).view(src_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        mask = _additive_mask(attn_mask, key_padding_mask, bsz, self.num_heads, tgt_len, src_len, q.dtype)
        dropout_p = self.dropout_module.p if self.training or self.dropout_module.apply_during_inference else 0.0
        # (B, H, T, d_z); the scale is fairseq's self.scaling, d_z^-1/2, SDPA's default
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)), None


def _additive_mask(attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], bsz: int, heads: int,
                   tgt_len: int, src_len: int, dtype: torch.dtype) -> Optional[Tensor]:
    """fairseq's two masks as one additive mask broadcastable to (B, H, T, S): attn_mask (T, S) or (B·H, T, S),
    added (or −inf where True, if bool); key_padding_mask (B, S), −inf where True (non-zero)."""
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill_(
                attn_mask, float("-inf"))
        mask = attn_mask.to(dtype)
        if mask.dim() == 3:
            mask = mask.view(bsz, heads, tgt_len, src_len)
    if key_padding_mask is not None:
        padding = torch.zeros(bsz, 1, 1, src_len, dtype=dtype, device=key_padding_mask.device).masked_fill_(
            key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
        mask = padding if mask is None else padding + mask
    return mask


def enable_position_biases(attention: MultiheadAttention, names=("q_proj", "k_proj", "v_proj")) -> nn.Module:
    """Give a fairseq MultiheadAttention position-dependent q/k/v biases (same parameters, same names).

    The module built by fairseq's own ``build_*_attention`` hook becomes a ``PositionBiasedMultiheadAttention``
    (a subclass that adds no state, only its forward), so every constructor option stays fairseq's."""
    if type(attention) is not MultiheadAttention:
        raise TypeError(f"FLOATER biases need fairseq's MultiheadAttention, got {type(attention).__name__}")
    for name in names:
        old = getattr(attention, name)
        new = PositionBiasedLinear(old.in_features, old.out_features)
        new.weight, new.bias = old.weight, old.bias
        setattr(attention, name, new)
    attention.__class__ = PositionBiasedMultiheadAttention
    # fairseq's own path then never takes F.multi_head_attention_forward (one bias vector per projection):
    # this flag makes it call q_proj/k_proj/v_proj itself. It only skips a shape assertion.
    attention._set_skip_embed_dim_check()
    return attention


Bindings = List[Tuple[PositionBiasedLinear, object]]  # (projection, its position_binding) for one forward


def position_bindings(projections: List[PositionBiasedLinear], delta: Tensor, rows) -> Bindings:
    """Projection j adds Δb[:, j] at the row of each token. delta: (P, k, d).

    rows: (T, B) or (T, 1) grid rows, or a function returning them (called only if a projection runs).
    """
    return list(zip(projections, [(delta_j, rows) for delta_j in delta.unbind(1)]))


def step_bindings(projections: List[PositionBiasedLinear], biases: Tensor) -> Bindings:
    """Projection j's whole bias is biases[j] for every token (k, d): one decoding step."""
    return list(zip(projections, biases.unbind(0)))


@contextmanager
def bind(bindings: Bindings):
    """Each projection's ``position_binding`` set for the ``with`` block, then None again."""
    # object.__setattr__: nn.Module's own __setattr__ costs microseconds per call, every decoding step.
    for proj, binding in bindings:
        object.__setattr__(proj, "position_binding", binding)
    try:
        yield
    finally:
        for proj, _ in bindings:
            object.__setattr__(proj, "position_binding", None)


def token_rows(tokens: Tensor, padding_idx: int) -> Tensor:
    """(B, T) tokens → (T, B) grid row of each token: its index among the sentence's non-padding tokens
    (fairseq's make_positions − padding_idx − 1, so left padding does not shift positions); 0 for pads."""
    return rows_from_padding_mask(tokens.eq(padding_idx))


def rows_from_padding_mask(padding_mask: Tensor) -> Tensor:
    """(B, T) padding mask → (T, B) grid rows, as ``token_rows``."""
    keep = (~padding_mask).long()
    return ((keep.cumsum(dim=1) * keep) - 1).clamp(min=0).t()
