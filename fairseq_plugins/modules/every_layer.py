"""Every-layer positions: the absolute position encoding added to the input of every block.

The baselines of FLOATER's Table 2, "position signal in all blocks" (Liu et al. 2020): the encoding p_i that
fairseq adds to the token embedding (block 1's input) is also added to the input of blocks 2..N::

    x^(1)_i = E(w_i)·sqrt(d) + p_i            (fairseq's embedding, unchanged)
    x^(n)_i = block_{n-1}(x^(n-1))_i + p_i    (n ≥ 2: this scheme)

p is sinusoidal (default) or, with ``--learned-pos``, fairseq's learned fixed-length table
(``LearnedPositionalEmbedding``, --max-source-positions / --max-target-positions rows; one table per side,
shared by the embedding and every block).
A sentence longer than the learned table is an error, raised before any lookup. Positions follow fairseq's
numbering (padding does not shift them); incremental decoding step t uses position t.

The "input block only" rows of Table 2 are fairseq's own ``transformer`` (with --encoder-learned-pos
--decoder-learned-pos for the learned table).

Mapping to code: ``EveryLayer`` is the scheme: fairseq's embedding (``embed``'s default), ``every_block`` set, and
its flag. ``position_transformer``'s stacks add p (the stack's ``embed_positions`` output, computed once per
forward) to the input of blocks 2..N; their blocks are fairseq's own, built and wrapped as fairseq builds them, so
--checkpoint-activations and --offload-activations work as in fairseq's ``transformer``. Its architectures keep
their names, ``transformer_every_layer_pos[_wmt_en_de|_vaswani_wmt_en_de_big|_vaswani_wmt_en_fr_big|_tiny]``.
"""

from ..flags import Flag, boolean
from .position_scheme import PositionScheme


class EveryLayer(PositionScheme):
    embedding = "sinusoidal"  # fairseq's learned table instead with --learned-pos (``learned_table``)
    every_block = True
    flags = (
        Flag("--learned-pos", boolean, None,
             "every-layer positions: learned fixed-length position tables (fairseq's LearnedPositionalEmbedding, "
             "--max-source/target-positions rows; one per side, shared by the embedding and every block) instead "
             "of sinusoids; longer sentences are an error", False, switch=True),
    )

    @classmethod
    def learned_table(cls, learned_pos):
        # --learned-pos, both stacks' (fairseq's TransformerConfig reads it so, over --encoder/decoder-learned-pos)
        return learned_pos
