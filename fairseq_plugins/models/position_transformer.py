"""``position_transformer``: fairseq's Transformer with the position scheme of each stack picked by name from
the table of schemes (``fairseq_plugins/schemes.py``: sinusoidal, learned, every-layer, SHAPE, CAPE, randomized,
T5 bias, ALiBi, KERPLE, FIRE, RoPE, NoPE, Shaw's relative positions, FLOATER), each built through the one contract
of ``modules/position_scheme.py``.

- ``--position-scheme S`` sets both stacks; ``--encoder-position-scheme`` / ``--decoder-position-scheme``
  override one. NoPE is refused for the encoder (permutation-invariant without positions).
- Each stack asks its scheme's class for its position embedding (``embed``, and ``every_block``: added to every
  block's input too) and for its module in self-attention (``build``): one module per stack, handed by the stack
  to the layers it builds, which share it through ``PositionalSelfAttention`` (their ``build_self_attention``
  hook); None keeps fairseq's attention. A scheme that biases the projections (FLOATER) runs the decoder's
  cross-attention projections too (``PositionalCrossAttention``), and its hooks around a forward (``batch``,
  ``prepare``) give it the batch's lengths and tokens.
- ``--cross-position-prior P`` (default none) adds a prior to the decoder's cross-attention, whatever the stacks'
  schemes (``alibi_sync``: ``modules/cross_prior.py``): one module per decoder (its class's ``build_cross``),
  shared by its layers through ``PositionalCrossAttention`` (their ``build_encoder_attention`` hook); without
  one, cross-attention stays fairseq's own.
- Each scheme adds, fills in and checks its own flags (``add_args``, ``defaults``, ``validate``); a flag of a
  scheme that neither stack uses (or of a prior the model does not have) is refused in one line.

Architectures: the row's arch prefix (``<scheme>_transformer``; every-layer's, Shaw's and FLOATER's keep their
names, ``transformer_every_layer_pos``, ``relative_transformer`` and ``floater_transformer``) with fairseq's
``transformer`` dims, ``_wmt_en_de`` (base), ``_vaswani_wmt_en_de_big``, ``_vaswani_wmt_en_fr_big`` and
``_tiny`` (tests), and the values the scheme pins per size (``size_defaults``: Shaw's paper settings), for each
scheme of ``FAMILY_SCHEMES`` (a cross-attention prior's: sinusoidal stacks, or those of ``--position-scheme``,
with the prior), each under the scheme's model class (``family=``: ``RopeTransformerModel``); any other combination
through the flags on ``position_transformer``.
"""

import logging
from contextlib import contextmanager, nullcontext

from fairseq.distributed import fsdp_wrap
from fairseq.models import MODEL_REGISTRY, register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    base_architecture,
    tiny_architecture,
    transformer_vaswani_wmt_en_de_big,
    transformer_vaswani_wmt_en_fr_big,
    transformer_wmt_en_de,
)
from fairseq.modules import LearnedPositionalEmbedding
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from .. import fairseq_check
from ._base import RECORD, PluginTransformerModel, encode_record
from ._config import as_namespace
from ..flags import FlagError, OneLineFlag, add_flags, check_flags, one_of
from ..modules.floater import Floater
from ..modules.floater.model import FloaterDecoderSteps, FloaterModel, FloaterStack
from ..modules.position_scheme import CrossBias, ProjectionBiases, ScoreBias, slot_of
from ..modules.positional_attention import PositionalCrossAttention, PositionalSelfAttention, set_references
from ..schemes import FAMILY_SCHEMES, POSITION_TRANSFORMER, SCHEMES, SIZES

logger = logging.getLogger(__name__)
STACK_SCHEMES = {n: s for n, s in SCHEMES.items() if s.selectable}  # what --position-scheme can name
CROSS_PRIORS = {n: s for n, s in SCHEMES.items() if s.cross}  # what --cross-position-prior can name (and none)
# each once, in the table's order
SCHEME_CLASSES = tuple(dict.fromkeys(s.cls for s in (*STACK_SCHEMES.values(), *CROSS_PRIORS.values())))
NO_PRIOR = "none"
FAMILY_MODELS = {}  # scheme name -> the model of its architectures, in definition order (PositionTransformerModel)


def _scheme_names(encoder):
    return [n for n, s in STACK_SCHEMES.items() if s.encoder or not encoder]


def add_position_args(parser, listed=None):
    """The flags of every scheme; ``listed``: the scheme classes whose flags --help shows (None: all)."""
    names = ", ".join(STACK_SCHEMES)
    for flag, encoder, what in (("--position-scheme", False, "both stacks (nope: the decoder only)"),
                                ("--encoder-position-scheme", True, "the encoder (overrides --position-scheme)"),
                                ("--decoder-position-scheme", False, "the decoder (overrides --position-scheme)")):
        why = " (an encoder without positions is permutation-invariant)" if encoder else ""
        parser.add_argument(flag, action=OneLineFlag, parse=one_of(_scheme_names(encoder), why), metavar="SCHEME",
                            help=f"position scheme of {what}: one of {names}")
    parser.add_argument("--cross-position-prior", action=OneLineFlag, parse=one_of((NO_PRIOR, *CROSS_PRIORS)),
                        metavar="PRIOR", help=f"a position prior in the decoder's cross-attention, with any stack "
                                              f"scheme: {NO_PRIOR} (default) or {', '.join(CROSS_PRIORS)}")
    for cls in SCHEME_CLASSES:
        add_flags(parser, cls.flags, listed=listed is None or cls in listed)


def check_flags_act(args, encoder, decoder):
    """FlagError (one line) for a flag this model would ignore: another scheme's flag, or fairseq's
    --encoder/decoder-learned-pos on a stack whose scheme sets its own positions. Only values other than the
    default are refused: a checkpoint's stored arguments hold every flag filled with its default, whatever its
    scheme."""
    used = {encoder.name, decoder.name}
    prior = cross_prior(args)
    for scheme in (*STACK_SCHEMES.values(), *CROSS_PRIORS.values()):
        if scheme.name in used or scheme is prior:
            continue
        for flag in scheme.cls.flags:
            value = getattr(args, flag.dest, None)
            if value is not None and value != flag.default:
                ours = (f"cross-attention prior is {args.cross_position_prior}" if scheme.cross else
                        f"position schemes are {encoder.name} (encoder) and {decoder.name} (decoder)")
                article = "an" if scheme.name[0] in "aeiou" else "a"
                raise FlagError(f"{flag.flag} is {article} {scheme.name} flag, and this model's {ours}: it would do "
                                "nothing")
    for side, scheme in (("encoder", encoder), ("decoder", decoder)):
        # refused where no value of the flag could give the stack a learned table (every-layer's --learned-pos
        # supersedes it, as fairseq's TransformerConfig reads them, and transformer_every_layer_pos took it so)
        if getattr(args, f"{side}_learned_pos", False) and not scheme.cls.learned_table(True):
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


def cross_prior(args):
    """The row of the decoder's cross-attention prior, or None (ValueError with one line for an unknown name:
    --model-overrides sets it unparsed)."""
    name = getattr(args, "cross_position_prior", None) or NO_PRIOR
    if name != NO_PRIOR and name not in CROSS_PRIORS:
        raise FlagError(f"--cross-position-prior must be one of {', '.join((NO_PRIOR, *CROSS_PRIORS))} (got {name!r})")
    return CROSS_PRIORS.get(name)


class _PositionalLayer:
    """A fairseq layer whose self-attention follows its stack's scheme module (``position_scheme``, handed over by
    the stack; None: fairseq's attention). First base of a fairseq layer class."""

    def __init__(self, cfg, *args, position_scheme=None, **kwargs):
        set_references(self, position_scheme=position_scheme)  # read by build_self_attention in fairseq's __init__
        super().__init__(cfg, *args, **kwargs)
        # fairseq 0.12.2 without this project's patch: after a checkpoint load its encoder sends an eval batch
        # through torch's BetterTransformer kernel, which never calls self.self_attn (the scheme's attention);
        # both the encoder and the layer test this flag first
        if hasattr(self, "can_use_fastpath"):
            self.can_use_fastpath = False

    def build_self_attention(self, embed_dim, cfg, **extra):
        if self.position_scheme is None:
            return super().build_self_attention(embed_dim, cfg, **extra)
        if any(extra.values()):  # the decoder's add_bias_kv / add_zero_attn
            raise ValueError("position schemes in attention support neither add_bias_kv nor add_zero_attn")
        heads = (cfg.decoder if isinstance(self, TransformerDecoderLayerBase) else cfg.encoder).attention_heads
        return PositionalSelfAttention(embed_dim, heads, self.position_scheme, dropout=cfg.attention_dropout,
                                       q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size)


class PositionalEncoderLayer(_PositionalLayer, TransformerEncoderLayerBase):
    pass


class PositionalDecoderLayer(_PositionalLayer, TransformerDecoderLayerBase):
    def __init__(self, cfg, *args, cross_prior=None, **kwargs):
        set_references(self, cross_prior=cross_prior)  # the decoder's, as position_scheme is the stack's
        super().__init__(cfg, *args, **kwargs)

    def build_encoder_attention(self, embed_dim, cfg):
        prior, scheme = self.cross_prior, self.position_scheme
        if prior is None and not isinstance(scheme, ProjectionBiases):  # nothing positional (FLOATER: q, k, v)
            return super().build_encoder_attention(embed_dim, cfg)
        # fairseq's constructor arguments (xformers' aside: the prior needs the one SDPA path)
        return PositionalCrossAttention(embed_dim, cfg.decoder.attention_heads, prior, kdim=cfg.encoder.embed_dim,
                                        vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout,
                                        q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
                                        projector=scheme)


def _add_block_signal(layer, args):
    """Forward pre-hook of every block of an ``every_block`` stack: adds the bound ``position_signal``
    (T, B|1, C) to the block's input. A pre-hook runs in the module call, outside the block's forward: with
    --checkpoint-activations the sum is an input of the checkpointed forward, so its recomputation in backward
    (after the binding ended) is the same."""
    if layer.position_signal is None:
        return None
    return (args[0] + layer.position_signal,) + tuple(args[1:])


def _wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's build_encoder_layer/build_decoder_layer do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


def _block_input(layer, every_block):
    """A block as fairseq's build_encoder_layer/build_decoder_layer return it (activation checkpointing, CPU
    offloading and FSDP wrapping included), taking the stack's position signal at its input if every_block."""
    if every_block:
        layer.position_signal = None
        layer.register_forward_pre_hook(_add_block_signal)
    return layer


@contextmanager
def _bind(stack, signal):
    """signal() (T, B|1, C), computed once, at the input of blocks 2..N (block 1's input has it from the
    embedding) for one forward of an ``every_block`` stack; nothing otherwise."""
    layers = list(stack.layers)[1:] if stack.every_block else []
    value = signal() if layers else None
    for layer in layers:
        layer.position_signal = value
    try:
        yield
    finally:
        for layer in layers:
            layer.position_signal = None


@contextmanager
def source_lengths(embed_positions, encoder_out):
    """For one decoder forward, an embedding that reads its source (``reads_source``: randomized positions'
    length estimate) holds the real source lengths (B|B·beam,), as fairseq reorders them with the hypotheses."""
    if not getattr(embed_positions, "reads_source", False):
        yield
        return
    embed_positions.source_lengths = encoder_out["src_lengths"][0].view(-1) if encoder_out is not None else None
    try:
        yield
    finally:
        embed_positions.source_lengths = None


def _check_table(embed_positions, tokens, padding_idx, side, flag):
    """A learned table has no row for positions past its length: say so instead of indexing out of range."""
    if not isinstance(embed_positions, LearnedPositionalEmbedding):
        return
    rows = embed_positions.max_positions
    if tokens.size(1) > rows:
        longest = int(tokens.ne(padding_idx).sum(dim=1).max())
        if longest > rows:
            raise ValueError(f"a {side} sentence of {longest} tokens is longer than the learned position table "
                             f"({flag} {rows}); use sinusoidal positions or train with a larger {flag}")


class _PositionStack:
    """What the encoder and the decoder share: their slot's module (``position_scheme``, built before fairseq's
    own parts: the RNG's order), their input embedding, and one context around each forward (``positions``)."""

    def _build(self, cfg, scheme, side, causal):
        """Before fairseq's __init__: the slot's module (one per stack, shared by its layers), read by the layers'
        build hooks, and the stack's learned_pos as the scheme has it."""
        config = getattr(cfg, side)
        module = scheme.cls.build(cfg, config.attention_heads, config.embed_dim // config.attention_heads,
                                  causal=causal)
        set_references(self, position_scheme=module)  # for build_*_layer, in fairseq's __init__
        self.every_block = scheme.cls.every_block
        config.learned_pos = scheme.cls.learned_table(config.learned_pos)
        return module

    def _own(self, cfg, scheme, module, side, max_positions):
        """After fairseq's __init__: the module registered (the stack owns it) and the input embedding."""
        self.position_scheme = module
        self.embed_positions = scheme.cls.embed(cfg, self, getattr(cfg, side).embed_dim, max_positions)

    def _signal(self, tokens, incremental_state):
        """(T, B, C): what the embedding added; this step's position only when decoding step by step."""
        if incremental_state is None:
            return self.embed_positions(tokens).transpose(0, 1)
        return self.embed_positions(tokens, incremental_state=incremental_state)[:, -1:].transpose(0, 1)

    @contextmanager
    def positions(self, tokens, encoder_out=None, incremental_state=None):
        """One forward of the stack: the input embedding's length checked, its source lengths (randomized
        positions' estimate) and every block's signal (every-layer) bound, a score bias shared by the layers."""
        _check_table(self.embed_positions, tokens, self.padding_idx, *self.TABLE)
        module = self.position_scheme
        with source_lengths(self.embed_positions, encoder_out), \
                _bind(self, lambda: self._signal(tokens, incremental_state)), \
                (module.one_forward() if isinstance(module, ScoreBias) else nullcontext()):
            yield


class PositionEncoder(_PositionStack, TransformerEncoderBase):
    TABLE = ("source", "--max-source-positions")

    def __init__(self, cfg, dictionary, embed_tokens, scheme, return_fc=False):
        module = self._build(cfg, scheme, "encoder", causal=False)
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self._own(cfg, scheme, module, "encoder", cfg.max_source_positions)

    def build_encoder_layer(self, cfg):
        layer = PositionalEncoderLayer(cfg, return_fc=self.return_fc, position_scheme=self.position_scheme)
        return _block_input(_wrap_layer(layer, cfg), self.every_block)

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None):
        with self.positions(src_tokens):
            return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)


class PositionDecoder(_PositionStack, TransformerDecoderBase):
    TABLE = ("target", "--max-target-positions")

    def __init__(self, cfg, dictionary, embed_tokens, scheme, prior=None, no_encoder_attn=False):
        module = self._build(cfg, scheme, "decoder", causal=True)
        heads = cfg.decoder.attention_heads
        cross = prior.cls.build(cfg, heads, cfg.decoder.embed_dim // heads, causal=True) if prior else None
        set_references(self, cross_position_prior=cross)  # for build_decoder_layer, as the stack's module
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.cross_position_prior = cross  # owned here, shared by the layers' cross-attention
        self._own(cfg, scheme, module, "decoder", cfg.max_target_positions)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = PositionalDecoderLayer(cfg, no_encoder_attn, position_scheme=self.position_scheme,
                                       cross_prior=self.cross_position_prior)
        return _block_input(_wrap_layer(layer, cfg), self.every_block)

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         full_context_alignment=False, alignment_layer=None, alignment_heads=None):
        with self.positions(prev_output_tokens, encoder_out, incremental_state):
            return super().extract_features(prev_output_tokens, encoder_out, incremental_state,
                                            full_context_alignment, alignment_layer, alignment_heads)


class FloaterEncoder(FloaterStack, PositionEncoder):
    """An encoder whose scheme is FLOATER (``modules/floater/model.py``)."""


class FloaterDecoder(FloaterDecoderSteps, FloaterStack, PositionDecoder):
    """A decoder whose scheme is FLOATER (``modules/floater/model.py``)."""


@register_model("position_transformer")
class PositionTransformerModel(PluginTransformerModel):
    """Transformer whose stacks each use a position scheme from the table (fairseq_plugins/schemes.py)."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        arch = getattr(self.args, "arch", None) or self.family_name()
        self.register_buffer(RECORD, encode_record(" ".join((arch, *self.position_schemes()))))

    def forward(self, src_tokens, src_lengths, prev_output_tokens, *args, **kwargs):
        if self.training and not getattr(self, "fairseq_checked", True):
            refusal = fairseq_check.unpatched_refusal(self.run_settings, self.args, self)
            if refusal:
                raise fairseq_check.UnpatchedFairseq(refusal)
            self.fairseq_checked = True
        return super().forward(src_tokens, src_lengths, prev_output_tokens, *args, **kwargs)

    listed = None  # the scheme classes whose flags --help lists (None: every scheme's; a family's model: its own)

    def __init_subclass__(cls, family=None, **kwargs):
        """``family="x"``: the model of scheme x's architectures (model name: its arch prefix),
        position_transformer itself, whose --help lists x's flags alone, with the cross-attention priors' that any
        stack scheme takes. The other schemes' flags stay accepted, unlisted, so that a value that would do nothing
        gets its one line (check_flags_act); a checkpoint names its architecture, so old ones load as this class."""
        super().__init_subclass__(**kwargs)
        if family is None:
            return
        scheme = SCHEMES[family]
        cls.listed = {scheme.cls, *(s.cls for s in CROSS_PRIORS.values())}
        cls.__doc__ = f"position_transformer with --help listing the flags of {scheme.name} ({scheme.paper})."
        FAMILY_MODELS[family] = cls

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_position_args(parser, cls.listed)

    @classmethod
    def build_model(cls, args, task):
        settings = fairseq_check.settings_reader(args)  # the run's precision and DDP settings, as handed over
        args = as_namespace(args)  # fairseq-hydra-train passes a DictConfig
        cls.prepare_args(args)
        # a FLOATER stack's model is FloaterTransformerModel, whatever the architecture: FLOATER's work around a
        # forward lives in its own classes (modules/floater/model.py)
        floater = Floater in (s.cls for s in stack_schemes(args))
        builder = FloaterTransformerModel if floater and not issubclass(cls, FloaterModel) else cls
        model = super(PositionTransformerModel, builder).build_model(args, task)
        # judged at the first training forward, not here: decoding builds the model from the training flags, and
        # the trainer has then cast the model and joined the process group (fairseq_check)
        model.run_settings, model.fairseq_checked = settings, False
        return model

    @classmethod
    def prepare_args(cls, args):
        """Fill the schemes' defaults and check their flags (ValueError with one line) before fairseq builds."""
        position_transformer(args)
        encoder, decoder = stack_schemes(args)
        prior = cross_prior(args)
        check_flags_act(args, encoder, decoder)
        for cls in dict.fromkeys((encoder.cls, decoder.cls, *((prior.cls,) if prior else ()))):
            check_flags(args, cls.flags)
            cls.validate(args)
        if prior is not None and args.no_cross_attention:
            raise FlagError(f"--cross-position-prior {prior.name} needs cross-attention, and --no-cross-attention "
                            "removes it")
        if getattr(args, "arch", None) == POSITION_TRANSFORMER:  # fairseq's base dims: say so, once per build
            logger.warning(f"--arch position_transformer builds fairseq's transformer (base) dims, "
                           f"{args.encoder_layers}+{args.decoder_layers} layers of {args.encoder_embed_dim}, with "
                           f"{encoder.name} (encoder) and {decoder.name} (decoder) positions; for another size use "
                           "<scheme>_transformer_tiny, _wmt_en_de, _vaswani_wmt_en_de_big or _vaswani_wmt_en_fr_big")
        if args.cross_self_attention:
            raise ValueError("position_transformer does not support --cross-self-attention")
        for side, scheme in (("encoder", encoder), ("decoder", decoder)):
            if args.no_token_positional_embeddings and scheme.cls.embeds(args):
                raise FlagError(f"--no-token-positional-embeddings contradicts the {side}'s position scheme "
                                f"{scheme.name}, which adds position embeddings: choose positions with "
                                "--position-scheme (nope for none)")

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        scheme = stack_schemes(args)[0]
        stack = FloaterEncoder if scheme.cls is Floater else PositionEncoder
        return stack(TransformerConfig.from_namespace(args), src_dict, embed_tokens, scheme=scheme)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        cfg, scheme = TransformerConfig.from_namespace(args), stack_schemes(args)[1]
        stack = FloaterDecoder if scheme.cls is Floater else PositionDecoder
        return stack(cfg, tgt_dict, embed_tokens, scheme=scheme, prior=cross_prior(args),
                     no_encoder_attn=cfg.no_cross_attention)

    def family_name(self):
        """The architectures' prefix of the model's row (a cross-attention prior's, where the model has one)."""
        prior = cross_prior(self.args)
        row = prior if prior is not None else SCHEMES[self.args.position_scheme]
        return row.arch_prefix if row.family == POSITION_TRANSFORMER else f"{row.name}_transformer"

    def position_schemes(self):
        """(encoder, decoder), the decoder's as ``<scheme>+<prior>`` with a cross-attention prior: a fixed prior
        has no parameters, so only the record tells its checkpoints from the plain decoder's."""
        encoder, decoder = stack_schemes(self.args)
        prior = cross_prior(self.args)
        return encoder.name, decoder.name if prior is None else f"{decoder.name}+{prior.name}"

    def __prepare_scriptable__(self):
        # torch.jit.script calls this first: one line instead of TorchScript's compile error deep inside
        raise RuntimeError(f"{self.family_name()} cannot be exported with torch.jit.script: the position schemes are "
                           "Python modules outside TorchScript; use the model unscripted")


# architectures


@register_model_architecture("position_transformer", "position_transformer")
def position_transformer(args):
    args.position_scheme = getattr(args, "position_scheme", None) or "sinusoidal"
    args.encoder_position_scheme = getattr(args, "encoder_position_scheme", None)
    args.decoder_position_scheme = getattr(args, "decoder_position_scheme", None)
    args.cross_position_prior = getattr(args, "cross_position_prior", None) or NO_PRIOR
    for cls in SCHEME_CLASSES:  # every scheme's: a checkpoint's arguments hold them all, whatever its schemes
        cls.defaults(args)
    base_architecture(args)


# the dims of each size of the table (``SIZES``): fairseq's architecture functions
SIZE_DIMS = {"fairseq": None, "base": transformer_wmt_en_de, "big": transformer_vaswani_wmt_en_de_big,
             "big_en_fr": transformer_vaswani_wmt_en_fr_big, "tiny": tiny_architecture}
assert SIZE_DIMS.keys() == SIZES.keys()


def _register(scheme):
    """The scheme's architectures: its arch prefix with each size's suffix (``Scheme.arch``)."""
    def pick(args):
        if scheme.cross:  # the prior's architectures: any stack scheme (sinusoidal by default)
            given = getattr(args, "cross_position_prior", None)
            if given not in (None, scheme.name):
                raise FlagError(f"--cross-position-prior {given} contradicts --arch {scheme.arch_prefix}*: use "
                                f"position_transformer --cross-position-prior {given}")
            args.cross_position_prior = scheme.name
            return
        given = getattr(args, "position_scheme", None)
        if given not in (None, scheme.name):  # it would build another scheme under this scheme's name
            other = SCHEMES.get(given)
            also = f"{other.arch_prefix}* or " if other is not None and other.family == POSITION_TRANSFORMER else ""
            raise FlagError(f"--position-scheme {given} contradicts --arch {scheme.arch_prefix}*: use "
                            f"{also}position_transformer --position-scheme {given}")
        args.position_scheme = scheme.name

    for size, dims in SIZE_DIMS.items():
        def arch(args, dims=dims, size=size):
            pick(args)
            for name, value in scheme.cls.size_defaults.get(size, {}).items():  # what the scheme's paper pins
                if getattr(args, name, None) is None:
                    setattr(args, name, value)
            if dims is not None:
                dims(args)
            position_transformer(args)

        register_model_architecture(scheme.arch_prefix, scheme.arch(size))(arch)


# the model of each scheme of FAMILY_SCHEMES, in the table's order (that of fairseq's registries and of --help's
# list of models); a row without its class fails the import, naming the class to write (check_family_models)


@register_model("transformer_every_layer_pos")
class TransformerEveryLayerPosModel(PositionTransformerModel, family="every_layer"):
    pass


@register_model("shape_transformer")
class ShapeTransformerModel(PositionTransformerModel, family="shape"):
    pass


@register_model("cape_transformer")
class CapeTransformerModel(PositionTransformerModel, family="cape"):
    pass


@register_model("randomized_transformer")
class RandomizedTransformerModel(PositionTransformerModel, family="randomized"):
    pass


@register_model("t5_transformer")
class T5TransformerModel(PositionTransformerModel, family="t5"):
    pass


@register_model("alibi_transformer")
class AlibiTransformerModel(PositionTransformerModel, family="alibi"):
    pass


@register_model("kerple_transformer")
class KerpleTransformerModel(PositionTransformerModel, family="kerple"):
    pass


@register_model("fire_transformer")
class FireTransformerModel(PositionTransformerModel, family="fire"):
    pass


@register_model("rope_transformer")
class RopeTransformerModel(PositionTransformerModel, family="rope"):
    pass


@register_model("nope_transformer")
class NopeTransformerModel(PositionTransformerModel, family="nope"):
    pass


@register_model("alibi_sync_transformer")
class AlibiSyncTransformerModel(PositionTransformerModel, family="alibi_sync"):
    pass


@register_model("relative_transformer")
class RelativeTransformerModel(PositionTransformerModel, family="shaw"):
    pass


@register_model("floater_transformer")
class FloaterTransformerModel(FloaterModel, PositionTransformerModel, family="floater"):
    pass  # also the model of any architecture with a FLOATER stack (PositionTransformerModel.build_model)


def check_slots(rows=SCHEMES):
    """ImportError unless each row's class fills at most one slot (``slot_of``), a cross-attention prior's the
    decoder's cross slot (``CrossBias``) and a stack scheme's any other: a stack holds one module, in one slot."""
    for row in rows.values():
        if row.cls is None:
            continue
        try:
            slot = slot_of(row.cls)
        except TypeError as err:
            raise ImportError(f"{__name__}: scheme {row.name}: {err}") from None
        if (slot is CrossBias) != row.cross:
            where = "the decoder's cross-attention (kind 'cross bias')" if slot is CrossBias else "a stack"
            raise ImportError(f"{__name__}: scheme {row.name} is of kind {row.kind!r}, and its class "
                              f"{row.cls.__name__} fills a slot of {where}")


def family_class(scheme):
    """The model class a scheme's row asks for, as one line of source: named after its arch prefix
    (rope_transformer: RopeTransformerModel) and registered under it."""
    name = "".join(part.capitalize() for part in scheme.arch_prefix.split("_")) + "Model"
    return _source(scheme.arch_prefix, name, scheme.name)


def _source(registered, name, family):
    return f'@register_model("{registered}") class {name}(PositionTransformerModel, family="{family}"): pass'


def check_family_models(names=FAMILY_SCHEMES, models=FAMILY_MODELS):
    """ImportError unless the model classes above are those the rows ``names`` ask for, in their order (that of
    fairseq's registries), naming the class to write where one is missing or differs."""
    have = [_source(next((k for k, v in MODEL_REGISTRY.items() if v is model), None), model.__name__, family)
            for family, model in models.items()]
    for i, name in enumerate(names):
        if have[i:i + 1] != [family_class(SCHEMES[name])]:
            where = f"after the class of {names[i - 1]}" if i else "first"
            raise ImportError(f"{__name__}: scheme {name} needs its model class, {where} (the table's order): "
                              f"{family_class(SCHEMES[name])}")
    if len(have) > len(names):
        raise ImportError(f"{__name__}: model classes of no row of FAMILY_SCHEMES: {'; '.join(have[len(names):])}")


check_family_models()
check_slots()
# each row's architectures, its arch prefix with each size's suffix: their names, in
# tests/data/golden_architectures.json
for _scheme in FAMILY_SCHEMES:
    _register(SCHEMES[_scheme])
