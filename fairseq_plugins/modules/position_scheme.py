"""The contract of a position scheme that ``position_transformer`` builds: one class per scheme, whose optional
hooks a stack calls in this order (x-transformers' bias contract, inside fairseq's hooks)::

    x_i   = E[w_i]·sqrt(d) + embed(w)_i                                    (the stack, once per forward)
    x^(n) = block_{n−1}(x^(n−1)) + embed(w),  n ≥ 2, where every_block     (the stack, before each block)
    q_i   = W_q x_i + b_q(0) + Δb_q(t_i), likewise k, v, where projects    (each attention's projections)
    q, k  = rotate(q, k, pos)                                              (each self-attention, before its cache)
    e_ij  = q_i·k_j / sqrt(d_z) + score_bias(i, j)_h + mask_ij,  out_i = Σ_j softmax_j(e_ij) v_j
    out   = attend(q, k, v, mask)           (instead of the line above, where the scheme owns the product: Shaw)
    e_ij  = q_i·k_j / sqrt(d_z) + cross_bias(i, j, S)_h + mask_ij                (cross-attention, with a prior)

Class hooks, at build: ``embed`` (the stack's ``embed_positions``; None adds nothing), ``build`` (the module in
self-attention, one per stack, shared by its layers; None: fairseq's attention), ``build_cross`` (a prior in the
decoder's cross-attention). Module hooks: ``rotate``, ``score_bias`` (H, T, S), ``attend``/``scores`` (where
``owns_product``), ``layer_parameters``, the projection biases (``projects``: ``attach``, ``join``, ``bind_model``,
``batch``, ``prepare``, ``project``, ``check_decoding_step``, ``complete_gradients``), ``cross_bias`` (B, H, T, S).
Class attributes: ``embedding``, ``every_block``, ``absolute_positions`` (the hooks read positions themselves: per
sentence, (B, T)), ``size_defaults``, ``flags`` (added by ``add_args``, filled in by ``defaults``, each value
checked by its parser, ``check_values`` where it came unparsed, their combinations by ``validate``; refused in one
line on a model that does not use the scheme), and ``title``/``equation`` (how figures name the scheme and
its term in e_ij: scripts/plot_positions.py). Each hook's arguments, shapes and defaults:
docs/position_schemes.md, "The contract, hook by hook".

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
    title = ""  # the scheme as figures name it, with its paper: "ALiBi (Press et al.)"
    equation = ""  # its term in the logit e_ij, as figures write it: "−m_h·|j − i|"

    # -- its flags, read before anything is built ------------------------------------------------------------

    @classmethod
    def add_args(cls, parser, listed: bool = True):
        for flag in cls.flags:
            flag.add_to(parser, listed)

    @classmethod
    def defaults(cls, args):
        """Fill in every flag not given. A falsy value that the flag cannot take (0 buckets, an empty name) counts
        as not given, as fairseq's ``getattr(args, name, None) or default`` architectures treat it."""
        for flag in cls.flags:
            value = getattr(args, flag.dest, None)
            if value is None or (not value and flag.default is not None and not _parses(flag, value)):
                setattr(args, flag.dest, flag.default)

    @classmethod
    def check_values(cls, args):
        """Its flags' values that the parser could not see (``--model-overrides`` sets them on a checkpoint's
        arguments unparsed), each checked by its flag's own parse function (``Flag.check``)."""
        for flag in cls.flags:
            flag.check(getattr(args, flag.dest, None))

    @classmethod
    def validate(cls, args):
        """FlagError (one line) for flags that are valid alone but contradict each other or the model (each value
        alone is ``check_values``')."""

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

    def bind_model(self, model: nn.Module):
        pass

    def batch(self, num_positions: int):
        return nullcontext()

    def prepare(self, stack, tokens: Tensor, encoder_out=None, incremental_state=None):
        return nullcontext()

    def project(self, attention, name: str, x: Tensor) -> Tensor:
        return getattr(attention, name)(x)

    def check_decoding_step(self, stack, features: Tensor, tokens: Tensor, encoder_out) -> None:
        pass

    def complete_gradients(self):
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
