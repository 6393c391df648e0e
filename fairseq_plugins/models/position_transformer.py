"""``position_transformer``: fairseq's Transformer with the position scheme of each stack picked by name from
the table of schemes (``fairseq_plugins/schemes.py``: sinusoidal, learned, SHAPE, T5 bias, ALiBi, KERPLE, FIRE,
RoPE, NoPE), each built through the one contract of ``modules/position_scheme.py``.

- ``--position-scheme S`` sets both stacks; ``--encoder-position-scheme`` / ``--decoder-position-scheme``
  override one. NoPE is refused for the encoder (permutation-invariant without positions).
- Each stack asks its scheme's class for its position embedding (``embed``) and for its module in
  self-attention (``build``): one module per stack, shared by its layers through ``PositionalSelfAttention``
  (their ``build_self_attention`` hook); None keeps fairseq's attention. Cross-attention stays fairseq's own
  (none of these schemes defines one).
- Each scheme adds, fills in and checks its own flags (``add_args``, ``defaults``, ``validate``); a flag of a
  scheme that neither stack uses is refused in one line.

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
from ._config import add_attention_backend_arg
from .relative_transformer import _wrap_layer
from ..flags import FlagError, OneLineFlag, one_of
from ..modules.fused_attention import check_backend
from ..modules.positional_attention import PositionalSelfAttention
from ..schemes import NEW_SCHEMES, POSITION_TRANSFORMER, SCHEMES

logger = logging.getLogger(__name__)
STACK_SCHEMES = {n: s for n, s in SCHEMES.items() if s.selectable}  # what --position-scheme can name
SCHEME_CLASSES = tuple(dict.fromkeys(s.cls for s in STACK_SCHEMES.values()))  # each once, in the table's order


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
    for cls in SCHEME_CLASSES:
        cls.add_args(parser)
    add_attention_backend_arg(parser)


def check_flags_act(args, encoder, decoder):
    """FlagError (one line) for a flag this model would ignore: another scheme's flag, or fairseq's
    --encoder/decoder-learned-pos on a stack whose scheme sets its own positions. Only values other than the
    default are refused: a checkpoint's stored arguments hold every flag filled with its default, whatever its
    scheme."""
    used = {encoder.name, decoder.name}
    for scheme in STACK_SCHEMES.values():
        if scheme.name in used:
            continue
        for flag in scheme.cls.flags:
            value = getattr(args, flag.dest, None)
            if value is not None and value != flag.default:
                raise FlagError(f"{flag.flag} is a {scheme.name} flag, and this model's position schemes are "
                                f"{encoder.name} (encoder) and {decoder.name} (decoder): it would do nothing")
    for side, scheme in (("encoder", encoder), ("decoder", decoder)):
        if getattr(args, f"{side}_learned_pos", False) and scheme.embedding != "learned":
            raise FlagError(f"--{side}-learned-pos does nothing with the {side}'s position scheme {scheme.name}; "
                            f"for learned positions use --{side}-position-scheme learned on position_transformer")


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


class PositionEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, scheme, return_fc=False):
        embed_dim, heads = cfg.encoder.embed_dim, cfg.encoder.attention_heads
        module = scheme.cls.build(cfg, heads, embed_dim // heads, causal=False)  # before fairseq's: the RNG's order
        cfg.stack_scheme_module, cfg.encoder.learned_pos = module, scheme.embedding == "learned"
        try:
            super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        finally:
            cfg.stack_scheme_module = None
        self.position_scheme = module  # owned here: one table per stack, shared by its layers
        self.embed_positions = scheme.cls.embed(cfg, self, embed_dim, cfg.max_source_positions)

    def build_encoder_layer(self, cfg):
        return _wrap_layer(PositionalEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class PositionDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, scheme, no_encoder_attn=False):
        embed_dim, heads = cfg.decoder.embed_dim, cfg.decoder.attention_heads
        module = scheme.cls.build(cfg, heads, embed_dim // heads, causal=True)
        cfg.stack_scheme_module, cfg.decoder.learned_pos = module, scheme.embedding == "learned"
        try:
            super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        finally:
            cfg.stack_scheme_module = None
        self.position_scheme = module
        self.embed_positions = scheme.cls.embed(cfg, self, embed_dim, cfg.max_target_positions)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(PositionalDecoderLayer(cfg, no_encoder_attn), cfg)


@register_model("position_transformer")
class PositionTransformerModel(PluginTransformerModel):
    """Transformer whose stacks each use a position scheme from the table (fairseq_plugins/schemes.py)."""

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
        for cls in dict.fromkeys((encoder.cls, decoder.cls)):
            cls.validate(args)
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
    for cls in SCHEME_CLASSES:  # every scheme's: a checkpoint's arguments hold them all, whatever its schemes
        cls.defaults(args)
    args.attention_backend = getattr(args, "attention_backend", None) or "sdpa"
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
