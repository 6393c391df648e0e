"""How a position scheme enters ``position_transformer``: one small face that says how to build it, and one slot,
the place in a block where its module acts. A stack holds at most one module, in the one slot its scheme's class
names (``slot_of``, checked when the stack is built); a decoder may also hold a cross-attention prior::

    x_i   = E[w_i]·sqrt(d) + embed(w)_i                                   input embedding (the stack's, fairseq's)
    q_i   = W_q x_i + b_q(t_i), likewise k, v                             ProjectionBiases  (FLOATER)
    q, k  = rotate(q, k, pos)                                             Rotation          (RoPE, xPos)
    e_ij  = q_i·k_j / sqrt(d_z) + score_bias(i, j)_h + mask_ij            ScoreBias         (T5, ALiBi, KERPLE, FIRE)
    out   = attend(q, k, v, mask)   (the product itself)                  RelativeProduct   (Shaw)
    e_ij  = q_i·k_j / sqrt(d_z) + cross_bias(i, j, S)_h + mask_ij         CrossBias         (a decoder's prior)

The face (``PositionScheme``, every scheme's class): ``flags`` (added to the parser, filled in by ``defaults``,
each value checked by its parser, their combinations by ``validate``), ``build`` (the slot's module, or None),
the input embedding (``embedding``, ``embed``, ``embeds``, ``learned_table``, ``every_block``: added to every
block's input too), ``size_defaults`` (what its paper pins per architecture size), and ``title``/``equation``
(how figures name it). Each slot's module has the slot's members only: a score bias one method, a rotation one
(two where q and k differ), and so on. Positions reach a slot as (T,) indices in the padded sequence, or, for a
module that reads positions themselves (``per_sentence``), as (B, T) counted from each sentence's first real
token: the attention makes them (``positional_attention.py``), in one place for every slot.

Mapping to code: the classes below are that contract; ``Sinusoidal``, ``Learned`` and ``NoPE`` are fairseq's two
embeddings and no position at all. Each other scheme is one module of this package, its class a subclass of its
slot (``t5_bias``, ``alibi``, ``kerple``, ``fire``: ``ScoreBias``; ``rope``, ``xpos``: ``Rotation``;
``relative_attention``: ``RelativeProduct``; ``floater``: ``ProjectionBiases``; ``cross_prior``: ``CrossBias``;
``shape_positions``, ``cape``, ``randomized_positions``, ``every_layer``: the face alone). FLOATER's work around a
forward (its solve, caches, the two stacks' joint solve) lives in its own model and stack classes
(``floater/model.py``). Each member's arguments, shapes and defaults: docs/position_schemes.md, "The slots".
"""

from contextlib import contextmanager
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ..flags import Flag


class PositionScheme:
    """The face of a scheme: build-time facts and ``build``; nothing here runs inside a forward."""

    flags: Tuple[Flag, ...] = ()
    embedding = "none"  # what the stack adds to its token embeddings: sinusoidal | learned | shape | ... | none
    every_block = False  # whether that embedding is added to every block's input too
    size_defaults: Dict[str, Dict[str, Any]] = {}  # architecture size -> {flag dest: value its paper pins}
    title = ""  # the scheme as figures name it, with its paper: "ALiBi (Press et al.)"
    equation = ""  # its term in the logit e_ij, as figures write it: "−m_h·|j − i|"

    @classmethod
    def defaults(cls, args):
        """Fill in every flag not given. A falsy value that the flag cannot take (0 buckets, an empty name) counts
        as not given, as fairseq's ``getattr(args, name, None) or default`` architectures treat it."""
        for flag in cls.flags:
            value = getattr(args, flag.dest, None)
            if value is None or (not value and flag.default is not None and not flag.parses(value)):
                setattr(args, flag.dest, flag.default)

    @classmethod
    def validate(cls, args):
        """FlagError (one line) for flags that are valid alone but contradict each other or the model (each value
        alone is checked by its flag's parser, ``Flag.check``)."""

    @classmethod
    def build(cls, cfg, heads: int, head_dim: int, causal: bool) -> Optional[nn.Module]:
        """The module of the stack's slot (one per stack, shared by its layers), or None: nothing in attention."""
        return None

    @classmethod
    def embed(cls, cfg, stack, embed_dim: int, max_positions: int) -> Optional[nn.Module]:
        """The stack's ``embed_positions`` (fairseq's, as its stack built it, where ``embedding`` names one)."""
        return stack.embed_positions if cls.embedding in ("sinusoidal", "learned") else None

    @classmethod
    def embeds(cls, args) -> bool:
        """Whether the stack adds an embedding to its tokens (``--no-token-positional-embeddings`` is refused where
        one does)."""
        return cls.embedding != "none"

    @classmethod
    def learned_table(cls, learned_pos: bool) -> bool:
        """Whether the stack's embedding is fairseq's learned table rather than its sinusoid, given fairseq's
        ``learned_pos`` of the stack as its TransformerConfig reads it; those flags are refused where this is
        False whatever their value."""
        return cls.embedding == "learned"


class ScoreBias(PositionScheme, nn.Module):
    """A logit bias in self-attention, the same for every layer of the stack: computed once per forward of the
    stack (``one_forward``, which the stack opens) and shared by its layers."""

    per_sentence = False  # whether score_bias reads positions themselves: then (B, T) per sentence

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """(T,) and (S,) positions → (H, T, S); (B, T) and (B, S) → (B, H, T, S). In ``dtype`` (float32 at
        least: the attention adds it to the logits in theirs)."""
        raise NotImplementedError

    _shared: Optional[Dict] = None  # within one forward of the stack: {(shape, S, dtype): its bias}

    @contextmanager
    def one_forward(self):
        """The stack's self-attentions compute the bias once and share it (the same tensor, so its gradient
        reaches the module once, summed over the layers)."""
        self._shared = {}
        try:
            yield
        finally:
            self._shared = None

    def shared_bias(self, q_pos: Tensor, src_len: int, keys: Callable[[], Tensor], dtype: torch.dtype) -> Tensor:
        """``score_bias`` for q_pos and the positions of src_len keys (``keys()``, made only when the bias is),
        once per forward and shapes (every self-attention of a stack has the same queries, keys and padding)."""
        key = (tuple(q_pos.shape), src_len, dtype)
        if self._shared is not None and key in self._shared:
            return self._shared[key]
        bias = self.score_bias(q_pos, keys(), dtype)
        if self._shared is not None:
            self._shared[key] = bias
        return bias


class Rotation(PositionScheme, nn.Module):
    """A rotation of q and k in self-attention, before the keys are cached."""

    per_sentence = False  # whether the rotation reads positions themselves: then (B, T) per sentence

    def rotated(self, x: Tensor, pos: Tensor) -> Tensor:
        """R_pos x: x (B, H, T, d_z), positions (T,) or (B, T) → (B, H, T, d_z) (``rotate_pairs``)."""
        raise NotImplementedError

    def rotate(self, q: Tensor, k: Tensor, pos: Tensor) -> Tuple[Tensor, Tensor]:
        """q and k at positions pos; a rotation that treats them differently (xPos' decay) overrides this."""
        return self.rotated(q, pos), self.rotated(k, pos)

    def theta(self, device, dtype) -> Tensor:
        """(d_z/2,) the angular frequency of each pair of dimensions (figures draw what it does with distance)."""
        raise NotImplementedError

    alone: Optional[str] = None  # how figures name the rotation's own effect with distance (None: RoPE's cosines)

    def check_length(self, length: int, dtype: torch.dtype) -> None:
        """Before rotating positions 0..length − 1 in dtype: ``RangeError`` (one line) where the rotation cannot
        represent them (xPos' scale in float16); the attention calls it with Python numbers, no device read."""


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Each pair (x_2i, x_2i+1) of x (B, H, T, d) rotated by the angle whose cos and sin are given per position and
    pair: (T, d/2), or (B, T, d/2) for per-sentence positions, in x's dtype."""
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d/2): every head alike
    pairs = x.unflatten(-1, (-1, 2))  # (B, H, T, d/2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class RelativeProduct(PositionScheme, nn.Module):
    """A product of its own in self-attention (relative vectors in keys and values): the attention hands it q, k,
    v after its cache, the masks and the dropout probability, and projects what it returns."""

    def layer_parameters(self) -> Dict[str, Optional[nn.Parameter]]:
        """Parameters of one layer (registered on that layer's self-attention, in this order)."""
        return {}

    def scores(self, attention, q: Tensor, k: Tensor) -> Tensor:
        """The logits before the masks, (B, H, T, S) (fairseq's ``before_softmax``)."""
        raise NotImplementedError

    def attend(self, attention, q: Tensor, k: Tensor, v: Tensor, mask, dropout_p: float,
               need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """(out (B, H, T, d), weights (B, H, T, S) or None)."""
        raise NotImplementedError


class ProjectionBiases(PositionScheme, nn.Module):
    """Position-dependent biases of the q/k/v projections, in self-attention and in the decoder's
    cross-attention: the module runs the projections of every attention of its stack."""

    def attach(self, attention) -> None:
        """At build: an attention of the stack hands over its projections (self-attention, then cross)."""

    def project(self, attention, name: str, x: Tensor) -> Tensor:
        """The projection ``name`` (q_proj, k_proj, v_proj) of x (T, B, C), with its positions' biases."""
        return getattr(attention, name)(x)


class CrossBias(PositionScheme, nn.Module):
    """A prior in the decoder's cross-attention (``--cross-position-prior``), with any stack scheme."""

    def cross_bias(self, q_pos: Tensor, k_pos: Tensor, src_lengths: Tensor,
                   dtype: torch.dtype = torch.float32) -> Tensor:
        """q_pos (T,) decoder positions, k_pos (B|1, S) each key's rank among its sentence's real tokens,
        src_lengths (B|1,) → (B|1, H, T, S)."""
        raise NotImplementedError


class RangeError(ValueError):
    """A position beyond what a slot's module can represent in the model's precision."""
    one_line = True  # fairseq_plugins' excepthook prints the message alone


SLOTS = (ProjectionBiases, Rotation, ScoreBias, RelativeProduct, CrossBias)  # in a block's order


def slot_of(scheme) -> Optional[type]:
    """The slot a scheme's class (or module) fills, or None (an input embedding alone); TypeError where it claims
    more than one: a stack holds at most one module, in one slot."""
    cls = scheme if isinstance(scheme, type) else type(scheme)
    slots = [slot for slot in SLOTS if issubclass(cls, slot)]
    if len(slots) > 1:
        raise TypeError(f"{cls.__name__} fills {len(slots)} slots ({', '.join(s.__name__ for s in slots)}): a "
                        "scheme's module fills one")
    return slots[0] if slots else None


class Sinusoidal(PositionScheme):
    """fairseq's sinusoidal embedding (Vaswani et al. 2017), as fairseq's stack builds it."""
    embedding = "sinusoidal"


class Learned(PositionScheme):
    """fairseq's learned table (Gehring et al. 2017), as fairseq's stack builds it (``--*-learned-pos``)."""
    embedding = "learned"


class NoPE(PositionScheme):
    """No position at all (Kazemnejad et al. 2023): a decoder's causal mask carries order."""
