"""``transformer_every_layer_pos``: the absolute position encoding added to the input of every block.

The baselines of FLOATER's Table 2, "position signal in all blocks" (Liu et al. 2020): the encoding p_i that
fairseq adds to the token embedding (block 1's input) is also added to the input of blocks 2..N::

    x^(1)_i = E(w_i)·sqrt(d) + p_i            (fairseq's embedding, unchanged)
    x^(n)_i = block_{n-1}(x^(n-1))_i + p_i    (n ≥ 2: this model)

p is sinusoidal (default) or, with ``--learned-pos``, fairseq's learned fixed-length table
(``LearnedPositionalEmbedding``, --max-source-positions / --max-target-positions rows; one table per side,
shared by the embedding and every block). A sentence longer than the learned table is an error, raised before
any lookup. Positions follow fairseq's numbering (padding does not shift them); incremental decoding step t
uses position t.

The blocks are fairseq's own (built by its build_encoder_layer/build_decoder_layer, so --checkpoint-activations and
--offload-activations work as in fairseq's ``transformer``); a forward pre-hook adds p to their input.

The "input block only" rows of Table 2 are fairseq's own ``transformer`` (with --encoder-learned-pos
--decoder-learned-pos for the learned table).
"""

from contextlib import contextmanager

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
from fairseq.modules import LearnedPositionalEmbedding

from ._base import PluginTransformerModel


@register_model("transformer_every_layer_pos")
class TransformerEveryLayerPosModel(PluginTransformerModel):
    """Transformer whose absolute position encoding enters every block, not only the embedding."""

    family = "transformer_every_layer_pos"
    scheme = "every_layer"
    not_scriptable = "its blocks take the position signal through a Python-side binding"

    @classmethod
    def add_family_args(cls, parser):
        parser.add_argument("--learned-pos", action="store_true",
                            help="learned fixed-length position tables (fairseq's LearnedPositionalEmbedding, "
                                 "--max-source/target-positions rows; one per side, shared by the embedding and "
                                 "every block) instead of sinusoids; longer sentences are an error")

    @classmethod
    def prepare_args(cls, args):
        every_layer_pos_defaults(args)
        if args.learned_pos:
            args.encoder_learned_pos = args.decoder_learned_pos = True
        if getattr(args, "no_token_positional_embeddings", False):
            raise ValueError("transformer_every_layer_pos needs position encodings: "
                             "drop --no-token-positional-embeddings")


def _add_position_signal(layer, args):
    """Forward pre-hook of every block: adds the bound ``position_signal`` (T, B|1, C) to the block's input.
    A pre-hook runs in the module call, outside the block's forward: with --checkpoint-activations the sum is an
    input of the checkpointed forward, so its recomputation in backward (after the binding ended) is the same."""
    if layer.position_signal is None:
        return None
    return (args[0] + layer.position_signal,) + tuple(args[1:])


def _with_position_input(layer):
    """A block as fairseq's build_encoder_layer/build_decoder_layer return it (activation checkpointing,
    CPU offloading and FSDP wrapping included) that adds the bound position signal to its input."""
    layer.position_signal = None
    layer.register_forward_pre_hook(_add_position_signal)
    return layer


@contextmanager
def _bind(layers, signal):
    for layer in layers:
        layer.position_signal = signal
    try:
        yield
    finally:
        for layer in layers:
            layer.position_signal = None


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


class EveryLayerPosEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return _with_position_input(super().build_encoder_layer(cfg))

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None):
        _check_table(self.embed_positions, src_tokens, self.padding_idx, "source", "--max-source-positions")
        signal = self.embed_positions(src_tokens).transpose(0, 1)  # (T, B, C), what the embedding got
        with _bind(list(self.layers)[1:], signal):
            return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)


class EveryLayerPosDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _with_position_input(super().build_decoder_layer(cfg, no_encoder_attn))

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         full_context_alignment=False, alignment_layer=None, alignment_heads=None):
        _check_table(self.embed_positions, prev_output_tokens, self.padding_idx, "target",
                     "--max-target-positions")
        signal = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:  # this step's position only
            signal = signal[:, -1:]
        with _bind(list(self.layers)[1:], signal.transpose(0, 1)):
            return super().extract_features(prev_output_tokens, encoder_out, incremental_state,
                                            full_context_alignment, alignment_layer, alignment_heads)


TransformerEveryLayerPosModel.encoder_class, TransformerEveryLayerPosModel.decoder_class = EveryLayerPosEncoder, EveryLayerPosDecoder


# architectures


def every_layer_pos_defaults(args):
    args.learned_pos = getattr(args, "learned_pos", False)


@register_model_architecture("transformer_every_layer_pos", "transformer_every_layer_pos")
def transformer_every_layer_pos(args):
    every_layer_pos_defaults(args)
    base_architecture(args)


@register_model_architecture("transformer_every_layer_pos", "transformer_every_layer_pos_wmt_en_de")
def transformer_every_layer_pos_wmt_en_de(args):
    every_layer_pos_defaults(args)
    transformer_wmt_en_de(args)


@register_model_architecture("transformer_every_layer_pos", "transformer_every_layer_pos_vaswani_wmt_en_de_big")
def transformer_every_layer_pos_vaswani_wmt_en_de_big(args):
    every_layer_pos_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_every_layer_pos", "transformer_every_layer_pos_vaswani_wmt_en_fr_big")
def transformer_every_layer_pos_vaswani_wmt_en_fr_big(args):
    every_layer_pos_defaults(args)
    transformer_vaswani_wmt_en_fr_big(args)


@register_model_architecture("transformer_every_layer_pos", "transformer_every_layer_pos_tiny")
def transformer_every_layer_pos_tiny(args):
    every_layer_pos_defaults(args)
    tiny_architecture(args)
