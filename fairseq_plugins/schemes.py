"""The table of position schemes: every scheme the project compares, its kind, paper, architectures and flags.

Every scheme enters a Transformer in one slot (the kinds; ``modules/position_scheme.py``):
- ``embedding``: a position embedding added to the token embeddings (fairseq's sinusoidal and learned; SHAPE, CAPE,
  randomized positions), or to the input of every block too (FLOATER's Table 2 baseline,
  ``transformer_every_layer_pos``);
- ``score bias``: an additive (heads, T, S) logit bias in self-attention (T5, ALiBi, KERPLE, FIRE; ``ScoreBias``);
- ``rotary``: a rotation of q and k in self-attention (RoPE; xPos, which also scales them by position;
  ``Rotation``);
- ``cross bias``: a (B, heads, T, S) logit bias in the decoder's cross-attention, a prior on which source
  positions a target position attends (ALiBi on the source/target diagonal), with any self-attention scheme
  (``CrossBias``);
- ``none``: no position at all (NoPE; decoder only: its causal mask carries order, while an encoder without
  positions is permutation-invariant);
- ``relative vectors`` (Shaw et al.): relative key and value vectors inside the attention's products, a product
  of its own (``RelativeProduct``);
- ``projection biases`` (FLOATER): position-dependent q/k/v biases (``ProjectionBiases``; the work around a
  forward in FLOATER's own model and stack classes).

``SCHEMES`` is the one list every other place reads: the ``position_transformer`` family (its
``--position-scheme`` choices, its flags and ``<scheme>_transformer_*`` architectures), the benchmark, the demo, the
Multi30k scripts, the study's claims and the tests. Scripts name a scheme by its ``model`` name (``transformer``,
``relative``, ``floater``, ``rope``, ...). A row of ``position_transformer`` names its class
(``modules/position_scheme.py``: its slot, its flags). Adding a scheme: its module (the maths, one docstring, one
class in its slot), one row here and its model class (docs/position_schemes.md, "Adding a scheme").
"""

from dataclasses import dataclass
from typing import Optional, Tuple, Type

from .modules.alibi import ALiBi
from .modules.cape import CAPE
from .modules.cross_prior import AlibiSync
from .modules.every_layer import EveryLayer
from .modules.fire import FIRE
from .modules.floater import Floater
from .modules.kerple import KerpleLog
from .modules.position_scheme import Learned, NoPE, PositionScheme, Sinusoidal
from .modules.randomized_positions import Randomized
from .modules.relative_attention import ShawRelative
from .modules.rope import RoPE
from .modules.shape_positions import SHAPE
from .modules.t5_bias import T5Bias
from .modules.xpos import XPos

# fairseq's architecture sizes: the suffix every family's architectures carry
SIZES = {"fairseq": "", "base": "_wmt_en_de", "big": "_vaswani_wmt_en_de_big",
         "big_en_fr": "_vaswani_wmt_en_fr_big", "tiny": "_tiny"}
KINDS = ("embedding", "score bias", "rotary", "cross bias", "none", "relative vectors", "projection biases")
POSITION_TRANSFORMER = "position_transformer"  # the family that builds any scheme with a class (``cls``)


@dataclass(frozen=True)
class Scheme:
    name: str  # as --position-scheme names it
    model: str  # as scripts name it (demo, bench, the Multi30k study): transformer, relative, floater, rope, ...
    kind: str  # one of KINDS
    paper: str
    family: str  # the fairseq model (register_model) that builds it
    arch_prefix: Optional[str]  # architectures: arch_prefix + SIZES[size]; None: flags on another's archs
    flags: Tuple[str, ...] = ()  # what the scheme adds to its architectures' command line
    cls: Optional[Type[PositionScheme]] = None  # what position_transformer builds it with; None: another family
    encoder: bool = True  # may an encoder use it
    encoder_partner: Optional[str] = None  # the encoder's scheme in the scheme's own architectures (NoPE)

    def arch(self, size="tiny"):
        """The architecture of this scheme at one of fairseq's sizes (``SIZES``)."""
        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)} (got {size!r})")
        return f"{self.arch_prefix or 'transformer'}{SIZES[size]}"

    @property
    def cross(self):
        """Whether it is a prior in cross-attention (``--cross-position-prior``), not a stack's scheme."""
        return self.kind == "cross bias"

    @property
    def selectable(self):
        """Whether ``position_transformer`` builds it as a stack's scheme (``--position-scheme``)."""
        return self.cls is not None and not self.cross

    @property
    def embedding(self):
        """sinusoidal | learned | shape | cape | randomized | none: what the stack adds to its token embeddings."""
        return self.cls.embedding if self.cls is not None else "none"


_FAIRSEQ = "transformer"
SCHEMES = {s.name: s for s in (
    Scheme("sinusoidal", "transformer", "embedding", "Vaswani et al., NeurIPS 2017 (arXiv 1706.03762)",
           _FAIRSEQ, "transformer", cls=Sinusoidal),
    Scheme("learned", "learned", "embedding", "Gehring et al., ICML 2017 (arXiv 1705.03122)",
           _FAIRSEQ, None, flags=("--encoder-learned-pos", "--decoder-learned-pos"), cls=Learned),
    Scheme("every_layer", "every_layer", "embedding", "Liu et al., ICML 2020, Table 2 (sinusoid in every block)",
           POSITION_TRANSFORMER, "transformer_every_layer_pos", cls=EveryLayer),
    Scheme("shape", "shape", "embedding", "Kiyono et al., EMNLP 2021 (arXiv 2109.05644)",
           POSITION_TRANSFORMER, "shape_transformer", cls=SHAPE),
    Scheme("cape", "cape", "embedding", "Likhomanenko et al., NeurIPS 2021 (arXiv 2106.03143)",
           POSITION_TRANSFORMER, "cape_transformer", cls=CAPE),
    Scheme("randomized", "randomized", "embedding", "Ruoss et al., ACL 2023 (arXiv 2305.16843)",
           POSITION_TRANSFORMER, "randomized_transformer", cls=Randomized),
    Scheme("t5", "t5", "score bias", "Raffel et al., JMLR 2020 (arXiv 1910.10683)",
           POSITION_TRANSFORMER, "t5_transformer", cls=T5Bias),
    Scheme("alibi", "alibi", "score bias", "Press et al., ICLR 2022 (arXiv 2108.12409)",
           POSITION_TRANSFORMER, "alibi_transformer", cls=ALiBi),
    Scheme("kerple", "kerple", "score bias", "Chi et al., NeurIPS 2022 (arXiv 2205.09921), log variant",
           POSITION_TRANSFORMER, "kerple_transformer", cls=KerpleLog),
    Scheme("fire", "fire", "score bias", "Li et al., ICLR 2024 (arXiv 2310.04418)",
           POSITION_TRANSFORMER, "fire_transformer", cls=FIRE),
    Scheme("rope", "rope", "rotary", "Su et al., RoFormer (arXiv 2104.09864)",
           POSITION_TRANSFORMER, "rope_transformer", cls=RoPE),
    Scheme("xpos", "xpos", "rotary", "Sun et al., ACL 2023 (arXiv 2212.10554)",
           POSITION_TRANSFORMER, "xpos_transformer", cls=XPos),
    Scheme("nope", "nope", "none", "Kazemnejad et al., NeurIPS 2023 (arXiv 2305.19466)",
           POSITION_TRANSFORMER, "nope_transformer", cls=NoPE, encoder=False, encoder_partner="sinusoidal"),
    Scheme("alibi_sync", "alibi_sync", "cross bias", "Press et al., ICLR 2022 (ALiBi's slopes) on a source/target "
           "diagonal in cross-attention, as Marian's sequence-to-sequence ALiBi", POSITION_TRANSFORMER,
           "alibi_sync_transformer", cls=AlibiSync, encoder=False),
    Scheme("shaw", "relative", "relative vectors", "Shaw et al., NAACL 2018 (arXiv 1803.02155)",
           POSITION_TRANSFORMER, "relative_transformer", cls=ShawRelative),
    Scheme("floater", "floater", "projection biases", "Liu et al., ICML 2020 (arXiv 2003.09229)",
           POSITION_TRANSFORMER, "floater_transformer", cls=Floater),
)}

MODELS = {s.model: s for s in SCHEMES.values()}  # by the name scripts use
# The schemes position_transformer registers architectures for: <arch_prefix><size suffix>.
FAMILY_SCHEMES = tuple(n for n, s in SCHEMES.items() if s.family == POSITION_TRANSFORMER)
# Those of them that no paper's table reports (their WMT14 configs are scripts/make_tables.py --list newer):
# every-layer positions are FLOATER's Table 2 baseline, and Shaw's and FLOATER's have their papers' own rows.
NEW_SCHEMES = tuple(n for n in FAMILY_SCHEMES if n not in ("every_layer", "shaw", "floater"))


def by_model(name):
    """The scheme scripts call ``name`` (``transformer``, ``relative``, ``rope``, ...); ValueError in one line."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: expected one of {', '.join(MODELS)}")
    return MODELS[name]


def architectures():
    """Every architecture the table names: {arch: scheme}."""
    return {s.arch(size): s for s in SCHEMES.values() if s.arch_prefix for size in SIZES}


def arch_and_flags(name, size="tiny"):
    """A model name (``rope``) at SIZE, or an architecture the table names (``rope_transformer_tiny``) as is:
    (arch, *flags); ValueError in one line for anything else."""
    if name in MODELS:
        scheme = MODELS[name]
        return (scheme.arch(size), *scheme.flags)
    if name in architectures():
        return (name,)
    raise ValueError(f"unknown model {name!r}: expected one of {', '.join(MODELS)} or one of their architectures")
