"""The contract of a position scheme that ``position_transformer`` builds: one class per scheme, whose optional
hooks a stack calls in this order (x-transformers' bias contract, inside fairseq's hooks)::

    x_i   = E[w_i]·sqrt(d) + embed(w)_i                                    (the stack, once per forward)
    x^(n) = block_{n−1}(x^(n−1)) + embed(w),  n ≥ 2, where every_block     (the stack, before each block)
    q_i   = W_q x_i + b_q(0) + Δb_q(t_i), likewise k, v, where projects    (each attention's projections)
    q, k  = rotate(q, k, pos)                                              (each self-attention, before its cache)
    e_ij  = q_i·k_j / sqrt(d_z) + score_bias(i, j)_h + mask_ij,  out_i = Σ_j softmax_j(e_ij) v_j
    out   = attend(q, k, v, mask)           (instead of the line above, where the scheme owns the product: Shaw)
    e_ij  = q_i·k_j / sqrt(d_z) + cross_bias(i, j, S)_h + mask_ij                (cross-attention, with a prior)

- ``embed(cfg, stack, embed_dim, max_positions)`` (class hook, at build): the module the stack keeps as fairseq's
  ``embed_positions``, (B, T) tokens → (B, T, C = embed_dim) added to the token embeddings; None adds nothing.
  fairseq's stack has built its own sinusoid already (its learned table where ``learned_table`` says so:
  ``embedding == "learned"`` by default).
- ``every_block`` (class attribute): whether the stack also adds ``embed``'s signal, the same (T, B, C) tensor, to
  the input of every block after the first (FLOATER's Table 2 baseline, ``every_layer.py``).
- ``build(cfg, heads, head_dim, causal)`` (class hook, at build): the scheme's module in self-attention, one
  per stack and shared by its layers (a T5 table is one set of parameters per stack), or None: fairseq's own
  attention.
- ``rotate(q, k, pos)``: q, k (B, H, T, d) rotated by their positions pos (T,) → (q, k); default: unchanged.
- ``score_bias(q_pos, k_pos, dtype)``: the logit bias (H, T, S) for query positions q_pos (T,) and key positions
  k_pos (S,), in dtype (float32, or float64 for a float64 model); default None: no bias. ``flex_score_mod`` may
  give the same bias as FlexAttention's score_mod (``fused_attention.bias_score_mod``).
- ``absolute_positions`` (class attribute): whether the hooks above read a position itself, not only i − j
  (FIRE's normaliser ψ(max(L, i))). Then, where the batch is padded, they get each sentence's positions counted
  from its first real token, q_pos (B, T) and k_pos (B, S) (rotate: pos (B, T)), and score_bias returns
  (B, H, T, S): a sentence's positions never depend on its batch-mates' lengths.
- ``attend(attention, q, k, v, mask, dropout_p, need_weights)`` (where ``owns_product``): the whole product of
  one self-attention, for a scheme that changes it (Shaw's e_ij = q_i·(k_j + a^K_ij), z_i = Σ_j α_ij (v_j + a^V_ij)):
  q (B, H, T, d) unscaled, k and v (B, H, S, d) after the cache, mask fairseq's masks as one additive mask
  (``positional_attention.additive_mask``) or, where the attention runs FlexAttention, a
  ``fused_attention.FlexMask``; dropout_p the attention dropout to apply → (out (B, H, T, d), weights
  (B, H, T, S) or None). ``scores(attention, q, k)`` gives its e_ij before the masks, (B, H, T, S), for
  fairseq's ``before_softmax``. The attention splits the heads, keeps the cache, builds the masks, picks the
  dropout and projects the output, for every scheme alike.
- ``layer_parameters()``: parameters that each self-attention of the stack owns, {name: Parameter or None}, kept
  under those names as the attention's own (Shaw's tables are one per layer, as in the paper); default none.
- ``size_defaults`` (class attribute): per size of ``schemes.SIZES``, argument values the scheme's architectures
  pin where the command line leaves them (Shaw's paper: FFN 1024 in its base model, k = 8 and shared tables in
  its big one).
- Projection biases (``projects``, FLOATER): ``attach(attention)``, at build, by every attention built with the
  module (a stack's self-attentions and, in the decoder, its cross-attentions, block by block): its projections;
  ``join(other)``, at build, with the other stack's module of the same class (FLOATER's flows solved together);
  ``batch(n)``, a context around one model forward whose longest sequence has n tokens (one solve for both
  stacks); ``prepare(stack, tokens, encoder_out, incremental_state)``, a context around one forward of the stack
  (the biases for its tokens' positions); ``project(attention, name, x)``: the attention's projection ``name``
  (q_proj, k_proj, v_proj) of x (T, B, C) with its bias; ``check_decoding_step(stack, features, tokens,
  encoder_out)`` after each step of incremental decoding (one line for non-finite features). The defaults do
  nothing (``project``: the projection alone).
- ``build_cross(cfg, heads)`` (class hook, at build) and ``cross_bias(q_pos, k_pos, src_lengths, dtype)``: a prior
  in the decoder's cross-attention (``--cross-position-prior``, whatever the stacks' schemes): the module, one
  per decoder and shared by its layers, or None (cross-attention stays fairseq's: source and target positions
  are not comparable without one); its logit bias (B, H, T, S) for decoder positions q_pos (T,), each key's
  position among its sentence's real tokens k_pos (B, S) and the real source lengths src_lengths (B,).

Flags belong to their scheme: ``flags`` (``fairseq_plugins/flags.py``'s ``Flag``: name, parser, help, default)
are added by ``add_args``, filled in by ``defaults`` and checked by ``validate`` (``FlagError``, one line) on a
model one of whose stacks uses the scheme (or whose cross-attention prior it is); on any other model a value
other than the default is refused.

Mapping to code: ``PositionScheme`` is that contract; ``Sinusoidal``, ``Learned`` and ``NoPE`` are fairseq's two
embeddings and no position at all, which need none of the hooks' maths; every other scheme is one module of
this package (``t5_bias``, ``alibi``, ``kerple``, ``fire``, ``rope``, ``shape_positions``, ``cape``,
``randomized_positions``, ``every_layer``, ``relative_attention``, ``floater``; ``cross_prior`` in
cross-attention).
"""

from contextlib import nullcontext
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ..flags import Flag


class PositionScheme(nn.Module):
    embedding = "none"  # what the stack adds to its token embeddings: sinusoidal | learned | shape | none
    flags: Tuple[Flag, ...] = ()

    # -- its flags, read before anything is built ------------------------------------------------------------

    @classmethod
    def add_args(cls, parser):
        for flag in cls.flags:
            flag.add_to(parser)

    @classmethod
    def defaults(cls, args):
        """Fill in every flag not given. A falsy value that the flag cannot take (0 buckets, an empty name) counts
        as not given, as fairseq's ``getattr(args, name, None) or default`` architectures treat it."""
        for flag in cls.flags:
            value = getattr(args, flag.dest, None)
            if value is None or (not value and flag.default is not None and not _parses(flag, value)):
                setattr(args, flag.dest, flag.default)

    @classmethod
    def validate(cls, args):
        """FlagError (one line) for its own flags' values that the parser could not see (``--model-overrides``
        sets them on a checkpoint's arguments unparsed) or that contradict each other."""

    # -- building a stack -----------------------------------------------------------------------------------

    @classmethod
    def embed(cls, cfg, stack, embed_dim: int, max_positions: int) -> Optional[nn.Module]:
        return stack.embed_positions if cls.embedding in ("sinusoidal", "learned") else None

    every_block = False
    size_defaults: Dict[str, Dict[str, Any]] = {}

    @classmethod
    def embeds(cls, args) -> bool:
        """Whether the stack adds an embedding to its tokens (``--no-token-positional-embeddings`` is refused where
        one does)."""
        return cls.embedding != "none"

    @classmethod
    def learned_table(cls, learned_pos: bool) -> bool:
        """Whether the stack's embedding is fairseq's learned table rather than its sinusoid, given fairseq's
        ``learned_pos`` of the stack as its TransformerConfig reads it (``--learned-pos`` for both stacks where
        the arguments have it, else ``--encoder/decoder-learned-pos``); those flags are refused where this is
        False whatever their value."""
        return cls.embedding == "learned"

    @classmethod
    def build(cls, cfg, heads: int, head_dim: int, causal: bool) -> Optional["PositionScheme"]:
        return None

    # -- inside self-attention, in this order -------------------------------------------------------------

    def rotate(self, q: Tensor, k: Tensor, pos: Tensor) -> Tuple[Tensor, Tensor]:
        return q, k

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Optional[Tensor]:
        return None

    absolute_positions = False  # whether rotate/score_bias read positions themselves (then per sentence)

    owns_product = False  # whether attend (and scores) replace the product above

    def attend(self, attention, q: Tensor, k: Tensor, v: Tensor, mask, dropout_p: float,
               need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        raise NotImplementedError(f"{type(self).__name__} does not own the attention product")

    def scores(self, attention, q: Tensor, k: Tensor) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} does not own the attention product")

    def layer_parameters(self) -> Dict[str, Optional[nn.Parameter]]:
        return {}

    # -- projection biases (FLOATER) ------------------------------------------------------------------------

    projects = False  # whether project adds position-dependent biases to q, k and v

    def attach(self, attention):
        pass

    def join(self, other: "PositionScheme"):
        pass

    def batch(self, num_positions: int):
        return nullcontext()

    def prepare(self, stack, tokens: Tensor, encoder_out=None, incremental_state=None):
        return nullcontext()

    def project(self, attention, name: str, x: Tensor) -> Tensor:
        return getattr(attention, name)(x)

    def check_decoding_step(self, stack, features: Tensor, tokens: Tensor, encoder_out) -> None:
        pass

    # -- inside the decoder's cross-attention (a cross-attention prior) ---------------------------------------

    @classmethod
    def build_cross(cls, cfg, heads: int) -> Optional["PositionScheme"]:
        return None

    def cross_bias(self, q_pos: Tensor, k_pos: Tensor, src_lengths: Tensor,
                   dtype: torch.dtype = torch.float32) -> Optional[Tensor]:
        return None


def _parses(flag, value):
    try:
        flag.parse(str(value))
    except ValueError:
        return False
    return True


class Sinusoidal(PositionScheme):
    """fairseq's sinusoidal embedding (Vaswani et al. 2017), as fairseq's stack builds it."""
    embedding = "sinusoidal"


class Learned(PositionScheme):
    """fairseq's learned table (Gehring et al. 2017), as fairseq's stack builds it (``--*-learned-pos``)."""
    embedding = "learned"


class NoPE(PositionScheme):
    """No position at all (Kazemnejad et al. 2023): a decoder's causal mask carries order."""
