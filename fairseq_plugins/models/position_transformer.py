"""``position_transformer``: fairseq's Transformer with the position scheme of each stack picked by name from
``fairseq_plugins/modules/position_schemes.py`` (T5 bias, RoPE, ALiBi, SHAPE, NoPE, sinusoidal, learned).

- ``--position-scheme S`` sets both stacks; ``--encoder-position-scheme`` / ``--decoder-position-scheme``
  override one. NoPE is refused for the encoder (permutation-invariant without positions).
- A stack whose scheme works in attention (score bias, rotary) gets ``PositionalSelfAttention`` from its
  layers' ``build_self_attention`` hook, one scheme module per stack shared by its layers, and no position
  embedding; cross-attention stays fairseq's own (none of these schemes defines one).
- A stack with an embedding scheme keeps fairseq's attention; SHAPE replaces the sinusoidal embedding by its
  shifted one.

Architectures: ``<scheme>_transformer`` (fairseq's ``transformer`` dims), ``_wmt_en_de`` (base),
``_vaswani_wmt_en_de_big``, ``_vaswani_wmt_en_fr_big`` and ``_tiny`` (tests), for each scheme of
``NEW_SCHEMES``; any other combination through the flags on ``position_transformer``.
"""

import logging

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    base_architecture,
    tiny_architecture,
    transformer_vaswani_wmt_en_de_big,
    transformer_vaswani_wmt_en_fr_big,
    transformer_wmt_en_de,
)
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ._base import PluginTransformerModel
from ._config import OneLineFlag, add_attention_backend_arg, at_least, one_of, positive
from .relative_transformer import _wrap_layer
from ..modules.fused_attention import check_backend
from ..modules.position_schemes import NEW_SCHEMES, POSITION_TRANSFORMER, SCHEMES

logger = logging.getLogger(__name__)
STACK_SCHEMES = {n: s for n, s in SCHEMES.items() if s.selectable}  # what --position-scheme can name
from ..modules.positional_attention import PositionalSelfAttention
from ..modules.rope import SCALINGS as ROPE_SCALINGS
from ..modules.shape_positions import ShapePositionalEmbedding
from ..modules.t5_bias import T5_INITS


def _scheme_names(encoder):
    return [n for n, s in STACK_SCHEMES.items() if s.encoder or not encoder]


def add_position_args(parser):
    names = ", ".join(STACK_SCHEMES)
    for flag, encoder, what in (("--position-scheme", False, "both stacks (nope: the decoder only)"),
                                ("--encoder-position-scheme", True, "the encoder (overrides --position-scheme)"),
                                ("--decoder-position-scheme", False, "the decoder (overrides --position-scheme)")):
        why = " (an encoder without positions is permutation-invariant)" if encoder else ""
        parser.add_argument(flag, action=OneLineFlag, parse=one_of(_scheme_names(encoder), why), metavar="SCHEME",
                            help=f"position scheme of {what}: one of {names}")
    parser.add_argument("--t5-num-buckets", action=OneLineFlag, parse=at_least(int, 4), metavar="B",
                        help="T5 bias: buckets of relative distance (default 32)")
    parser.add_argument("--t5-max-distance", action=OneLineFlag, parse=at_least(int, 2), metavar="D",
                        help="T5 bias: distances from D on share the last bucket (default 128)")
    parser.add_argument("--rope-base", action=OneLineFlag, parse=positive(float), metavar="b",
                        help="RoPE: θ_i = b^(-2i/d) (default 10000, the paper's)")
    parser.add_argument("--rope-scaling", action=OneLineFlag, parse=one_of(ROPE_SCALINGS), metavar="KIND",
                        help="RoPE, for decoding longer inputs than training (e.g. at decode time through "
                             "--model-overrides): none (default), linear (position interpolation, m → m/S), ntk "
                             "(NTK-aware, b → b·S^(d/(d-2))) or yarn (YaRN: θ_i ramped by wavelength, q and k times "
                             "0.1·ln S + 1)")
    parser.add_argument("--rope-scaling-factor", action=OneLineFlag, parse=positive(float), metavar="S",
                        help="RoPE, for decoding longer inputs than training: --rope-scaling's factor S, the "
                             "longest decoded length over the training length (needed by linear, ntk and yarn)")
    parser.add_argument("--rope-original-length", action=OneLineFlag, parse=positive(float), metavar="L",
                        help="RoPE, for decoding longer inputs than training: the training length L (tokens) that "
                             "yarn's ramp measures wavelengths against (needed by yarn)")
    parser.add_argument("--fire-threshold", action=OneLineFlag, parse=positive(float), metavar="L0",
                        help="FIRE: the threshold L's starting value, L = |λ·L0| with λ learned from 1 (default "
                             "512, the paper's)")
    parser.add_argument("--t5-bias-init", action=OneLineFlag, parse=one_of(T5_INITS), metavar="INIT",
                        help="T5 bias: the table's initialisation: glorot (default; T5's own code, "
                             "mesh-tensorflow: U(-a, a), a = sqrt(6 / (heads + buckets))), normal (HF transformers' "
                             "port: N(0, 1/d_model)) or zeros")
    parser.add_argument("--shape-max-shift", action=OneLineFlag, parse=at_least(int, 0), metavar="K",
                        help="SHAPE: training offsets drawn uniformly from 0..K-1, one per sequence, as the authors' "
                             "code (default 100; 0: no shift)")
    parser.add_argument("--shape-eval-offset", action=OneLineFlag, parse=at_least(int, 0), metavar="E",
                        help="SHAPE: the offset of every sequence at validation and test (default K, as the "
                             "authors' code)")
    add_attention_backend_arg(parser)


class FlagError(ValueError):
    one_line = True  # fairseq_plugins' excepthook prints the message alone


# The schemes' own flags: (flag, attribute, default, the scheme it acts on). A flag given to a model none of whose
# stacks uses its scheme would do nothing, so it is refused. Only values other than the default are refused: a
# checkpoint's stored arguments hold every flag filled with its default, whatever its scheme.
# The defaults are position_transformer()'s (below); SHAPE's evaluation offset defaults to its K.
SCHEME_DEFAULTS = {"t5_num_buckets": 32, "t5_max_distance": 128, "t5_bias_init": "glorot", "rope_base": 10000.0,
                   "rope_scaling": "none", "rope_scaling_factor": None, "rope_original_length": None,
                   "fire_threshold": 512.0, "shape_max_shift": 100}
SCHEME_DEFAULTS["shape_eval_offset"] = SCHEME_DEFAULTS["shape_max_shift"]
SCHEME_FLAGS = tuple((flag, name, SCHEME_DEFAULTS[name], scheme) for flag, name, scheme in (
    ("--t5-num-buckets", "t5_num_buckets", "t5"), ("--t5-max-distance", "t5_max_distance", "t5"),
    ("--t5-bias-init", "t5_bias_init", "t5"), ("--rope-base", "rope_base", "rope"),
    ("--rope-scaling", "rope_scaling", "rope"), ("--rope-scaling-factor", "rope_scaling_factor", "rope"),
    ("--rope-original-length", "rope_original_length", "rope"),
    ("--fire-threshold", "fire_threshold", "fire"),
    ("--shape-max-shift", "shape_max_shift", "shape"), ("--shape-eval-offset", "shape_eval_offset", "shape")))


def check_flags_act(args, encoder, decoder):
    """FlagError (one line) for a flag this model would ignore: another scheme's flag, or fairseq's
    --encoder/decoder-learned-pos on a stack whose scheme sets its own positions."""
    used = {encoder.name, decoder.name}
    for flag, name, default, scheme in SCHEME_FLAGS:
        value = getattr(args, name, None)
        if scheme not in used and value is not None and value != default:
            raise FlagError(f"{flag} is a {scheme} flag, and this model's position schemes are {encoder.name} "
                            f"(encoder) and {decoder.name} (decoder): it would do nothing")
    for side, scheme in (("encoder", encoder), ("decoder", decoder)):
        if getattr(args, f"{side}_learned_pos", False) and scheme.embedding != "learned":
            raise FlagError(f"--{side}-learned-pos does nothing with the {side}'s position scheme {scheme.name}; "
                            f"for learned positions use --{side}-position-scheme learned on position_transformer")


def check_rope_scaling(args):
    """FlagError (one line) for RoPE's scaling flags that are out of range, missing or would do nothing. Also
    checked here, not only when parsed: --model-overrides sets them on a checkpoint's arguments unparsed."""
    kind, factor, length = args.rope_scaling, args.rope_scaling_factor, args.rope_original_length
    if kind not in ROPE_SCALINGS:
        raise FlagError(f"--rope-scaling must be one of {', '.join(ROPE_SCALINGS)} (got {kind!r})")
    for flag, value in (("--rope-scaling-factor", factor), ("--rope-original-length", length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 < value < float("inf")):
            raise FlagError(f"{flag} must be a number > 0 (got {value!r})")
    if kind == "none" and factor is not None:
        raise FlagError("--rope-scaling-factor does nothing without --rope-scaling linear, ntk or yarn")
    if kind != "none" and factor is None:
        raise FlagError(f"--rope-scaling {kind} needs --rope-scaling-factor S (the decoded length over the "
                        "training length)")
    if kind == "yarn" and length is None:
        raise FlagError("--rope-scaling yarn needs --rope-original-length L (the training length, in tokens)")
    if kind != "yarn" and length is not None:
        raise FlagError(f"--rope-original-length does nothing with --rope-scaling {kind}: only yarn uses it")


def stack_schemes(args):
    """(encoder scheme, decoder scheme) names from the flags, checked (ValueError with one line)."""
    both = args.position_scheme
    partner = STACK_SCHEMES[both].encoder_partner if both in STACK_SCHEMES else None
    encoder = args.encoder_position_scheme or partner or both
    decoder = args.decoder_position_scheme or both
    for side, name in (("encoder", encoder), ("decoder", decoder)):
        if name not in STACK_SCHEMES or (side == "encoder" and not STACK_SCHEMES[name].encoder):
            raise ValueError(f"--{side}-position-scheme must be one of {', '.join(_scheme_names(side == 'encoder'))}"
                             f" (got {name!r})")
    return STACK_SCHEMES[encoder], STACK_SCHEMES[decoder]


def _positional(layer_base):
    """A fairseq layer class whose self-attention follows the stack's scheme (``cfg.stack_scheme``)."""

    class Layer(layer_base):
        def build_self_attention(self, embed_dim, cfg, **extra):
            scheme = getattr(cfg, "stack_scheme_module", None)
            if scheme is None:
                return super().build_self_attention(embed_dim, cfg, **extra)
            if any(extra.values()):  # the decoder's add_bias_kv / add_zero_attn
                raise ValueError("position schemes in attention support neither add_bias_kv nor add_zero_attn")
            heads = cfg.decoder.attention_heads if issubclass(layer_base, TransformerDecoderLayerBase) \
                else cfg.encoder.attention_heads
            return PositionalSelfAttention(embed_dim, heads, scheme, dropout=cfg.attention_dropout,
                                           q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
                                           attention_backend=getattr(cfg, "attention_backend", None) or "sdpa")

    Layer.__name__ = f"Positional{layer_base.__name__.replace('Base', '')}"
    return Layer


PositionalEncoderLayer = _positional(TransformerEncoderLayerBase)
PositionalDecoderLayer = _positional(TransformerDecoderLayerBase)


def _scheme_module(scheme, cfg, heads, embed_dim, causal):
    return scheme.attention(cfg, heads, embed_dim // heads, causal) if scheme.attention is not None else None


def _embedding(scheme, cfg, embed_dim, padding_idx, max_positions, stack):
    """The stack's position embedding for its scheme (fairseq built the sinusoidal/learned one already)."""
    if scheme.embedding in ("sinusoidal", "learned"):
        return stack.embed_positions
    if scheme.embedding == "shape":
        return ShapePositionalEmbedding(embed_dim, padding_idx, max_positions + padding_idx + 1,
                                        cfg.shape_max_shift, cfg.shape_eval_offset)
    return None


class PositionEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, scheme, return_fc=False):
        embed_dim, heads = cfg.encoder.embed_dim, cfg.encoder.attention_heads
        module = _scheme_module(scheme, cfg, heads, embed_dim, causal=False)
        cfg.stack_scheme_module, cfg.encoder.learned_pos = module, scheme.embedding == "learned"
        try:
            super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        finally:
            cfg.stack_scheme_module = None
        self.position_scheme = module  # owned here: one table per stack, shared by its layers
        self.embed_positions = _embedding(scheme, cfg, embed_dim, self.padding_idx, cfg.max_source_positions,
                                          self)

    def build_encoder_layer(self, cfg):
        return _wrap_layer(PositionalEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class PositionDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, scheme, no_encoder_attn=False):
        embed_dim, heads = cfg.decoder.embed_dim, cfg.decoder.attention_heads
        module = _scheme_module(scheme, cfg, heads, embed_dim, causal=True)
        cfg.stack_scheme_module, cfg.decoder.learned_pos = module, scheme.embedding == "learned"
        try:
            super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        finally:
            cfg.stack_scheme_module = None
        self.position_scheme = module
        self.embed_positions = _embedding(scheme, cfg, embed_dim, self.padding_idx, cfg.max_target_positions,
                                          self)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(PositionalDecoderLayer(cfg, no_encoder_attn), cfg)


@register_model("position_transformer")
class PositionTransformerModel(PluginTransformerModel):
    """Transformer whose stacks each use a position scheme from the table (position_schemes.py)."""

    not_scriptable = "the position schemes are Python modules outside TorchScript"
    encoder_class, decoder_class = PositionEncoder, PositionDecoder

    @classmethod
    def add_family_args(cls, parser):
        add_position_args(parser)

    @classmethod
    def prepare_args(cls, args):
        position_transformer(args)
        encoder, decoder = stack_schemes(args)
        check_flags_act(args, encoder, decoder)
        check_rope_scaling(args)
        if getattr(args, "arch", None) == POSITION_TRANSFORMER:  # fairseq's base dims: say so, once per build
            logger.warning(f"--arch position_transformer builds fairseq's transformer (base) dims, "
                           f"{args.encoder_layers}+{args.decoder_layers} layers of {args.encoder_embed_dim}, with "
                           f"{encoder.name} (encoder) and {decoder.name} (decoder) positions; for another size use "
                           "<scheme>_transformer_tiny, _wmt_en_de, _vaswani_wmt_en_de_big or _vaswani_wmt_en_fr_big")
        if args.cross_self_attention:
            raise ValueError("position_transformer does not support --cross-self-attention")
        check_backend(args.attention_backend, args.attention_dropout)
        if args.no_token_positional_embeddings:
            raise ValueError("position_transformer: choose positions with --position-scheme (nope for none), "
                             "not --no-token-positional-embeddings")

    @classmethod
    def stack_args(cls, args, decoder):
        return {"scheme": stack_schemes(args)[decoder]}

    def family_name(self):
        return f"{self.args.position_scheme}_transformer"

    def position_schemes(self):
        return tuple(s.name for s in stack_schemes(self.args))


# architectures


@register_model_architecture("position_transformer", "position_transformer")
def position_transformer(args):
    args.position_scheme = getattr(args, "position_scheme", None) or "sinusoidal"
    args.encoder_position_scheme = getattr(args, "encoder_position_scheme", None)
    args.decoder_position_scheme = getattr(args, "decoder_position_scheme", None)
    for name in ("t5_num_buckets", "t5_max_distance", "t5_bias_init", "rope_base", "rope_scaling",
                 "fire_threshold"):
        setattr(args, name, getattr(args, name, None) or SCHEME_DEFAULTS[name])
    for name in ("rope_scaling_factor", "rope_original_length"):  # None: not given (checkpoints before them too)
        setattr(args, name, getattr(args, name, None))
    args.attention_backend = getattr(args, "attention_backend", None) or "sdpa"
    shift = getattr(args, "shape_max_shift", None)
    args.shape_max_shift = SCHEME_DEFAULTS["shape_max_shift"] if shift is None else shift
    offset = getattr(args, "shape_eval_offset", None)
    args.shape_eval_offset = args.shape_max_shift if offset is None else offset
    base_architecture(args)


def _register(scheme):
    """<scheme>_transformer[_wmt_en_de|_vaswani_wmt_en_de_big|_vaswani_wmt_en_fr_big|_tiny]."""
    def pick(args):
        given = getattr(args, "position_scheme", None)
        if given not in (None, scheme):  # it would build another scheme under this scheme's name
            raise FlagError(f"--position-scheme {given} contradicts --arch {scheme}_transformer*: use "
                            f"{given}_transformer* or position_transformer --position-scheme {given}")
        args.position_scheme = scheme

    for suffix, dims in (("", None), ("_wmt_en_de", transformer_wmt_en_de),
                         ("_vaswani_wmt_en_de_big", transformer_vaswani_wmt_en_de_big),
                         ("_vaswani_wmt_en_fr_big", transformer_vaswani_wmt_en_fr_big),
                         ("_tiny", tiny_architecture)):
        def arch(args, dims=dims):
            pick(args)
            if dims is not None:
                dims(args)
            position_transformer(args)

        register_model_architecture("position_transformer", f"{scheme}_transformer{suffix}")(arch)


for _scheme in NEW_SCHEMES:
    _register(_scheme)  # the table's arch prefix is f"{_scheme}_transformer" (checked by the tests)
