"""Attention with a stack's position slots (``position_scheme.py``): in self-attention, always in this order,
projection biases of q/k/v (FLOATER), a rotation of q and k (RoPE, xPos), then a score bias (T5, ALiBi, KERPLE,
FIRE) or a product of its own (Shaw); in the decoder's cross-attention, the decoder's projection biases and a
prior's logit bias (``cross_prior.py``).

    q_i = W_q x_i + b_q(t_i)  (likewise k_j, v_j),   e_ij = (R_i q_i)·(R_j k_j) / sqrt(d_z) + bias_h(i, j) + mask_ij,
    out_i = Σ_j softmax_j(e_ij) v_j

with b(t) = b(0), R = identity and bias = 0 where the stack has no such slot. In self-attention, positions are
token indices in the padded sequence (0..T−1; during incremental decoding the step's index, from the cached keys'
length): where only differences i − j enter, fairseq's left-padded sources give each sentence the same logits as
alone; a module that reads a position itself (``per_sentence``: FIRE's normaliser) gets each sentence's positions
counted from its first real token, (B, T) and (B, S) (``slot_positions``, the one place positions are made), so
that a sentence's bias never depends on its batch-mates. In cross-attention, i is the decoder position (while
decoding step by step, a step counter kept in the incremental state) and j each source token's rank among its
sentence's real tokens, with the sentence's real length S: both count real tokens only.

Mapping to code: ``PositionalAttention`` is fairseq's ``MultiheadAttention`` (same parameters, names and
incremental-state layout, so fairseq's beam reordering works unchanged) with one forward: it projects q, k, v
(through ``ProjectionBiases.project`` where the stack has them; ``PositionalSelfAttention``: from the query,
``Rotation.rotate`` before caching k; ``PositionalCrossAttention``: from the encoder's states, cached at the first
decoding step), then calls torch's fused ``scaled_dot_product_attention`` (``fused_attention.biased_sdpa``) with
the bias added to fairseq's masks as one float mask ((H, T, S), or (B, H, T, S) with padding or per sentence); the
explicit softmax path runs only when the attention weights are asked for. The slot's module is shared by all
layers of a stack and owned by the stack (a T5 table is one set of parameters per stack; the prior is the
decoder's), and so is a score bias: computed by the first layer of each forward of the stack and reused by the
others (``ScoreBias.one_forward``, which the stack opens). A ``RelativeProduct`` gets q, k, v after the cache, the
masks and the dropout probability (``attend``) and hands back z, which is projected here; its per-layer tables
(``layer_parameters``) are each self-attention's own.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor

from .fused_attention import biased_sdpa
from .position_scheme import ProjectionBiases, RelativeProduct, Rotation, ScoreBias

STEP = "prior_step"  # the cross-attention's incremental state: the next decoder position, (B,) long


def set_references(module, **values):
    """Attributes of an nn.Module as plain references, not submodules: a layer's attention keeps its stack's
    scheme module, which the stack owns (one set of parameters per stack), and fairseq's constructors call the
    build_* hooks that read them before nn.Module.__init__ has run (it refuses a submodule then)."""
    for name, value in values.items():
        object.__setattr__(module, name, value)


def _slot(module, slot):
    return module if isinstance(module, slot) else None


class PositionalAttention(MultiheadAttention):
    """The one forward; a subclass gives q, k, v with their positions (``_project``) and the bias (``_bias``)."""

    def __init__(self, embed_dim: int, num_heads: int, scheme, dropout: float = 0.0, q_noise: float = 0.0,
                 qn_block_size: int = 8, projector=None, **kwargs):
        super().__init__(embed_dim, num_heads, dropout=dropout, q_noise=q_noise, qn_block_size=qn_block_size,
                         **kwargs)
        # the stack's module (each slot's, where it fills that slot), and the stack's projection biases (FLOATER),
        # which then run the projections (``_proj``), in self- and cross-attention alike
        set_references(self, scheme=scheme, projector=_slot(projector, ProjectionBiases),
                       rotation=_slot(scheme, Rotation), score=_slot(scheme, ScoreBias),
                       product=_slot(scheme, RelativeProduct))
        if self.projector is not None:
            self.projector.attach(self)

    def _proj(self, name: str, x: Tensor) -> Tensor:  # (T, B, C) → (T, B, C)
        if self.projector is None:
            return getattr(self, name)(x)
        return self.projector.project(self, name, x)

    def _split(self, x: Tensor, bsz: int) -> Tensor:  # (T, B, C) → (B, H, T, d)
        return x.view(x.size(0), bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None, incremental_state=None, need_weights: bool = True,
                static_kv: bool = False, attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        tgt_len, bsz, embed_dim = query.size()
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        q = self._split(self._proj("q_proj", query), bsz)
        # (B, H, T, d), (B, H, S, d) ×2, (T,) query positions; the incremental state updated in `saved`
        q, k, v, key_padding_mask, positions = self._project(q, query, key, key_padding_mask, saved, static_kv)
        if saved is not None:
            self._set_input_buffer(incremental_state, saved)
        src_len = k.size(2)
        product, weighted = self.product, need_weights or need_head_weights
        dropout_p = self.dropout_module.p if self.training or self.dropout_module.apply_during_inference else 0.0
        mask = additive_mask(attn_mask, key_padding_mask, bsz, self.num_heads, tgt_len, src_len, q.dtype)
        exact = torch.float64 if q.dtype == torch.float64 else torch.float32  # a fixed bias in float32 at least
        weights = None
        if product is not None:  # the scheme's own product (Shaw); heads, cache, masks, dropout, projection: here
            if before_softmax:
                logits = product.scores(self, q, k)
                return self._before_softmax(logits if mask is None else logits + mask, v)
            out, weights = product.attend(self, q, k, v, mask, dropout_p, weighted)  # weights (B, H, T, S) or None
        else:
            bias = self._bias(positions, key_padding_mask, src_len, exact)  # (H, T, S) or (B, H, T, S)
            if weighted or before_softmax:
                logits = torch.matmul(q * self.scaling, k.transpose(2, 3))
                if bias is not None:
                    mask = bias.to(q.dtype) if mask is None else mask + bias.to(q.dtype)
                if mask is not None:
                    logits = logits + mask
                if before_softmax:
                    return self._before_softmax(logits, v)
                half = logits.dtype in (torch.float16, torch.bfloat16)  # softmax in float32 at least, as fairseq's
                weights = F.softmax(logits, dim=-1, dtype=torch.float32 if half else logits.dtype).to(q.dtype)
                out = torch.matmul(F.dropout(weights, dropout_p, self.training), v)
            else:
                out = biased_sdpa(q, k, v, mask, bias, dropout_p)
        if weights is not None:
            weights = weights.transpose(0, 1)  # (H, B, T, S)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        return self.out_proj(out), weights

    def _before_softmax(self, logits: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
        """fairseq's ``before_softmax`` answer: the logits after the masks, (B·H, T, S), and v, (B·H, S, d)."""
        bsz, heads, tgt_len, src_len = logits.shape
        return logits.reshape(bsz * heads, tgt_len, src_len), v.reshape(bsz * heads, src_len, self.head_dim)


class PositionalSelfAttention(PositionalAttention):
    def __init__(self, embed_dim: int, num_heads: int, scheme, dropout: float = 0.0, q_noise: float = 0.0,
                 qn_block_size: int = 8):
        super().__init__(embed_dim, num_heads, scheme, dropout=dropout, q_noise=q_noise, qn_block_size=qn_block_size,
                         projector=scheme, self_attention=True)
        if self.product is not None:
            for name, parameter in self.product.layer_parameters().items():  # this layer's own (Shaw's tables)
                self.register_parameter(name, parameter)

    def _project(self, q, query, key, key_padding_mask, saved, static_kv):
        bsz, tgt_len = q.size(0), q.size(2)
        k, v = self._split(self._proj("k_proj", query), bsz), self._split(self._proj("v_proj", query), bsz)
        start = saved["prev_key"].size(2) if saved is not None and "prev_key" in saved else 0
        if saved is not None:  # the padding of every key, cached ones first
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask, saved.get("prev_key_padding_mask"), bsz, start + tgt_len, False)
        slot = self.rotation if self.rotation is not None else self.score
        positions = slot_positions(slot, torch.arange(start, start + tgt_len, device=query.device), key_padding_mask)
        if self.rotation is not None:
            self.rotation.check_length(start + tgt_len, q.dtype)
            q, k = self.rotation.rotate(q, k, positions)  # (B, H, T, d) each
        if saved is not None:
            if "prev_key" in saved:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
            saved["prev_key"], saved["prev_value"] = k, v
            saved["prev_key_padding_mask"] = key_padding_mask
        return q, k, v, key_padding_mask, positions

    def _bias(self, positions, key_padding_mask, src_len, dtype):
        score = self.score
        if score is None:
            return None

        def keys():  # made only when the bias is (the stack's first layer of a forward)
            return slot_positions(score, torch.arange(src_len, device=positions.device), key_padding_mask)

        return score.shared_bias(positions, src_len, keys, dtype)  # (H, T, S), or (B, H, T, S) per sentence


class PositionalCrossAttention(PositionalAttention):
    """The decoder's cross-attention with a prior (``scheme.cross_bias``) or the decoder scheme's projection biases
    (``projector``), or both: fairseq's encoder-decoder attention,
    its parameters (kdim, vdim) and its incremental state (the encoder's keys and values, projected at the first
    step, and their padding mask), plus the step counter ``prior_step`` that gives the query's position."""

    def __init__(self, embed_dim: int, num_heads: int, prior, kdim: int, vdim: int, dropout: float = 0.0,
                 q_noise: float = 0.0, qn_block_size: int = 8, projector=None):
        super().__init__(embed_dim, num_heads, prior, dropout=dropout, q_noise=q_noise, qn_block_size=qn_block_size,
                         projector=projector, kdim=kdim, vdim=vdim, encoder_decoder_attention=True)

    def set_beam_size(self, beam_size):
        """fairseq's beamable cross-attention (beam_size > 1) keeps one copy of the encoder states per sentence;
        this one keeps one per hypothesis, as fairseq does at beam size 1 (fairseq's SequenceGenerator sets no
        beam size on a Transformer; a decoder's ``set_beam_size`` would reach this module)."""

    def _project(self, q, query, key, key_padding_mask, saved, static_kv):
        bsz, tgt_len = q.size(0), q.size(2)
        if saved is not None and "prev_key" in saved:
            if not static_kv:
                raise ValueError("PositionalCrossAttention: incremental decoding needs static_kv (the encoder's "
                                 "states, projected once)")
            k, v, key_padding_mask, start = (saved["prev_key"], saved["prev_value"], saved["prev_key_padding_mask"],
                                             saved[STEP])
        else:
            # as fairseq: keys and values are both projections of the encoder states
            k, v = self._split(self._proj("k_proj", key), bsz), self._split(self._proj("v_proj", key), bsz)
            start = torch.zeros(bsz, dtype=torch.long, device=query.device)
        positions = start[:1] + torch.arange(tgt_len, device=query.device)  # every hypothesis is at the same step
        if saved is not None:
            saved["prev_key"], saved["prev_value"], saved["prev_key_padding_mask"] = k, v, key_padding_mask
            saved[STEP] = start + tgt_len
        return q, k, v, key_padding_mask, positions

    def _bias(self, positions, key_padding_mask, src_len, dtype):
        if self.scheme is None:  # no prior: the decoder's projection biases alone
            return None
        if key_padding_mask is None:
            k_pos = torch.arange(src_len, device=positions.device)[None]  # (1, S)
            src_lengths = torch.full((1,), src_len, device=positions.device)
        else:
            real = ~key_padding_mask.to(torch.bool)  # (B, S)
            k_pos = real.long().cumsum(1) - 1  # each key's rank among its sentence's real tokens (pads: masked)
            src_lengths = real.sum(1)
        return self.scheme.cross_bias(positions, k_pos, src_lengths, dtype)  # (B|1, H, T, S)


def slot_positions(module, index: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
    """The positions a slot's module gets, the one place they are made: indices in the padded sequence (N,), or,
    for a module that reads positions themselves (``per_sentence``), each sentence's (B, N)."""
    return from_first_real_token(index, key_padding_mask) if getattr(module, "per_sentence", False) else index


def from_first_real_token(index: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
    """Indices in the padded batch (N,) → each sentence's positions (B, N), counted from its first real key
    (fairseq left-pads sources; a right-padded sentence keeps its indices; pads before the first real token: 0);
    the indices themselves where there is no padding mask. No host sync."""
    if key_padding_mask is None:
        return index
    first = (~key_padding_mask.to(torch.bool)).to(torch.int32).argmax(1)  # (B,): the leading pads
    return (index[None, :] - first[:, None].to(index.dtype)).clamp_min(0)


def additive_mask(attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], bsz: int, heads: int,
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
