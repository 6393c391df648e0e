"""The table of position schemes: each scheme's kind, paper and what it builds in an encoder or decoder stack.

Every scheme enters a Transformer at one of a few hooks (the kinds):
- ``embedding``: a position embedding added to the token embeddings (fairseq's sinusoidal and learned; SHAPE);
- ``score bias``: an additive (heads, T, S) logit bias in self-attention (T5, ALiBi);
- ``rotary``: a rotation of q and k in self-attention (RoPE);
- ``none``: no position at all (NoPE; decoder only: its causal mask carries order, while an encoder without
  positions is permutation-invariant).
Shaw et al.'s relative vectors (``relative_transformer``) and FLOATER's projection biases
(``floater_transformer``) change the attention itself and keep their own model families.

``SCHEMES`` is the one list the model family (``position_transformer``), its architectures and the tests read.
Adding a scheme: its module (the maths, one docstring) and one row here.
"""

from dataclasses import dataclass
from typing import Callable, Optional

from torch import nn

from .alibi import ALiBi
from .rope import RoPE
from .t5_bias import T5Bias


@dataclass(frozen=True)
class Scheme:
    name: str
    kind: str  # embedding | score bias | rotary | none
    paper: str
    # the stack's attention scheme (cfg, heads, head dim, causal) → module, or None: fairseq's own attention
    attention: Optional[Callable[..., nn.Module]] = None
    embedding: str = "none"  # sinusoidal | learned | shape | none: what the stack adds to its token embeddings
    encoder: bool = True  # may an encoder use it


SCHEMES = {s.name: s for s in (
    Scheme("sinusoidal", "embedding", "Vaswani et al., NeurIPS 2017", embedding="sinusoidal"),
    Scheme("learned", "embedding", "Gehring et al., ICML 2017", embedding="learned"),
    Scheme("shape", "embedding", "Kiyono et al., EMNLP 2021 (arXiv 2109.05644)", embedding="shape"),
    Scheme("t5", "score bias", "Raffel et al., JMLR 2020 (arXiv 1910.10683)",
           attention=lambda cfg, heads, head_dim, causal: T5Bias(heads, bidirectional=not causal,
                                                                 num_buckets=cfg.t5_num_buckets,
                                                                 max_distance=cfg.t5_max_distance)),
    Scheme("alibi", "score bias", "Press et al., ICLR 2022 (arXiv 2108.12409)",
           attention=lambda cfg, heads, head_dim, causal: ALiBi(heads)),
    Scheme("rope", "rotary", "Su et al., RoFormer (arXiv 2104.09864)",
           attention=lambda cfg, heads, head_dim, causal: RoPE(head_dim, base=cfg.rope_base)),
    Scheme("nope", "none", "Kazemnejad et al., NeurIPS 2023 (arXiv 2305.19466)", encoder=False),
)}

# The schemes with architectures of their own: `<name>_transformer_<size>`, the decoder's scheme named, the encoder
# paired with it (NoPE's decoder with a sinusoidal encoder).
NEW_SCHEMES = ("t5", "rope", "alibi", "shape", "nope")
ENCODER_FOR = {"nope": "sinusoidal"}
