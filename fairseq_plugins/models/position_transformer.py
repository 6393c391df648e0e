"""``position_transformer``: fairseq's Transformer with the position scheme of each stack picked by name from
the table of schemes (``fairseq_plugins/schemes.py``: sinusoidal, learned, every-layer, SHAPE, CAPE, randomized,
T5 bias, ALiBi, KERPLE, FIRE, RoPE, NoPE, Shaw's relative positions, FLOATER), each in its slot
(``modules/position_scheme.py``).

- ``--position-scheme S`` sets both stacks; ``--encoder-position-scheme`` / ``--decoder-position-scheme``
  override one. NoPE is refused for the encoder (permutation-invariant without positions).
- Each stack (``_PositionStack``) asks its scheme's class for its input embedding (``embed``; ``every_block``:
  added to every block's input too) and for its slot's module (``build``): one per stack, built before fairseq's
  own parts (the RNG's order), handed to the layers it builds (their ``build_self_attention`` hook:
  ``PositionalSelfAttention``); None keeps fairseq's attention. One context surrounds each forward of a stack
  (``positions``). A stack whose scheme is FLOATER is a ``FloaterEncoder``/``FloaterDecoder`` and its model a
  ``FloaterTransformerModel`` (``modules/floater/model.py``: the work around a forward that only FLOATER does).
- ``--cross-position-prior P`` (default none) adds a prior to the decoder's cross-attention, whatever the stacks'
  schemes (``alibi_sync``: ``modules/cross_prior.py``): one module per decoder, shared by its layers through
  ``PositionalCrossAttention`` (their ``build_encoder_attention`` hook); without one (and without FLOATER's
  projection biases), cross-attention stays fairseq's own.
- Each scheme adds, fills in and checks its own flags (``flags``, ``defaults``, ``validate``); a flag of a scheme
  that neither stack uses (or of a prior the model does not have) is refused in one line.

Architectures: the row's arch prefix (``<scheme>_transformer``; every-layer's, Shaw's and FLOATER's keep their
names, ``transformer_every_layer_pos``, ``relative_transformer`` and ``floater_transformer``) with fairseq's
``transformer`` dims, ``_wmt_en_de`` (base), ``_vaswani_wmt_en_de_big``, ``_vaswani_wmt_en_fr_big`` and
``_tiny`` (tests), and the values the scheme pins per size (``size_defaults``: Shaw's paper settings), for each
scheme of ``FAMILY_SCHEMES`` (a cross-attention prior's: sinusoidal stacks, or those of ``--position-scheme``,
with the prior), each under the scheme's model class (``family=``: ``RopeTransformerModel``); any other combination
through the flags on ``position_transformer``.
"""

import logging

from fairseq.models import MODEL_REGISTRY, register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerConfig,
    base_architecture,
    tiny_architecture,
    transformer_vaswani_wmt_en_de_big,
    transformer_vaswani_wmt_en_fr_big,
    transformer_wmt_en_de,
)

from .. import fairseq_check
from ._base import RECORD, PluginTransformerModel, encode_record
from ._config import as_namespace
from ._stacks import FloaterDecoder, FloaterEncoder, PositionDecoder, PositionEncoder  # noqa: F401  (theirs too)
from ..flags import FlagError, OneLineFlag, add_flags, check_flags, one_of
from ..modules.floater import Floater
from ..modules.floater.model import FloaterModel
from ..modules.position_scheme import CrossBias, slot_of
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


@register_model("xpos_transformer")
class XposTransformerModel(PositionTransformerModel, family="xpos"):
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
