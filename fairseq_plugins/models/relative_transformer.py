"""`relative_transformer`: fairseq's Transformer with Shaw et al. (2018) relative position self-attention.

Encoder self-attention and decoder self-attention use RelativeMultiheadAttention
(fairseq_plugins/modules/relative_attention.py); encoder-decoder attention stays fairseq's MultiheadAttention, as in
the paper. By default no absolute (sinusoidal) positions are added: the paper's models are "relative only" (§4.1;
adding sinusoids as well gave no benefit), so embed_positions is None unless --relative-add-absolute-positions.

Architectures (the paper's §4.1 settings each pins; the rest is fairseq's):
- relative_transformer: fairseq's `transformer` dims, k = 16, tables per layer and per head, keys and values.
- relative_transformer_wmt_en_de: the paper's base model: 6+6 layers, d_x = 512, 8 heads (d_z = 64), FFN 1024,
  dropout 0.1, k = 16, tables unique per layer and per head, relative only. The FFN is pinned to the paper's 1024;
  fairseq's transformer_wmt_en_de uses 2048 (compare against it with --encoder-ffn-embed-dim 1024
  --decoder-ffn-embed-dim 1024).
- relative_transformer_vaswani_wmt_en_de_big: the paper's big model: 6+6 layers, d_x = 1024, 16 heads (d_z = 64),
  FFN 4096, dropout 0.3, k = 8, tables unique per layer and shared across heads (fairseq's
  transformer_vaswani_wmt_en_de_big dims).
- relative_transformer_vaswani_wmt_en_fr_big: the same with dropout 0.1 (fairseq's transformer_vaswani_wmt_en_fr_big).
- relative_transformer_tiny: fairseq's transformer_tiny dims (embed 64, FFN 64, 2+2 layers, 2 heads), k = 4; tests.
"""

import argparse

from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerDecoderBase,
    TransformerEncoderBase,
    base_architecture,
    tiny_architecture,
    transformer_vaswani_wmt_en_de_big,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ._base import PluginTransformerModel
from ._config import add_attention_backend_arg
from ..modules.fused_attention import check_backend
from ..modules.relative_attention import RelativeMultiheadAttention


class _ClippingDistance(argparse.Action):
    """--max-relative-positions K: an integer k >= 0. A negative k stops the run with one line on stderr
    (argparse's own errors print the whole fairseq usage first)."""

    def __call__(self, parser, namespace, value, option_string=None):
        if value < 0:
            parser.exit(2, f"{parser.prog}: error: {option_string} must be >= 0 (got {value}); "
                           "0 is the paper's no-position ablation\n")
        setattr(namespace, self.dest, value)


def build_relative_self_attention(embed_dim, num_heads, cfg, q_noise, qn_block_size):
    return RelativeMultiheadAttention(
        embed_dim,
        num_heads,
        max_relative_positions=cfg.max_relative_positions,
        relative_keys=cfg.relative_keys,
        relative_values=cfg.relative_values,
        per_head=cfg.relative_per_head,
        dropout=cfg.attention_dropout,
        q_noise=q_noise,
        qn_block_size=qn_block_size,
        attention_backend=getattr(cfg, "attention_backend", None) or "sdpa",
    )


class RelativeTransformerEncoderLayer(TransformerEncoderLayerBase):
    def build_self_attention(self, embed_dim, cfg):
        return build_relative_self_attention(
            embed_dim, cfg.encoder.attention_heads, cfg, self.quant_noise, self.quant_noise_block_size
        )


class RelativeTransformerDecoderLayer(TransformerDecoderLayerBase):
    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn:
            raise ValueError("relative self-attention supports neither add_bias_kv nor add_zero_attn")
        return build_relative_self_attention(
            embed_dim, cfg.decoder.attention_heads, cfg, self.quant_noise, self.quant_noise_block_size
        )


def _wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's build_encoder_layer/build_decoder_layer do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


class RelativeTransformerEncoder(TransformerEncoderBase):
    def build_encoder_layer(self, cfg):
        return _wrap_layer(RelativeTransformerEncoderLayer(cfg, return_fc=self.return_fc), cfg)


class RelativeTransformerDecoder(TransformerDecoderBase):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap_layer(RelativeTransformerDecoderLayer(cfg, no_encoder_attn), cfg)


@register_model("relative_transformer")
class RelativeTransformerModel(PluginTransformerModel):
    """Transformer with relative position representations in encoder and decoder self-attention
    (Shaw, Uszkoreit & Vaswani, NAACL 2018, https://arxiv.org/abs/1803.02155)."""

    family = "relative_transformer"
    scheme = "shaw"
    not_scriptable = "its relative attention (a custom autograd function) is not TorchScript code"

    @classmethod
    def add_family_args(cls, parser):
        # no defaults here: the architectures set them (fairseq's legacy convention)
        parser.add_argument(
            "--max-relative-positions", type=int, action=_ClippingDistance, metavar="K",
            help="clipping distance k: relative distances beyond ±k share one vector (2k+1 vectors per table); "
            "0 keeps a single vector, the paper's no-position ablation",
        )
        parser.add_argument(
            "--relative-keys", action=argparse.BooleanOptionalAction,
            help="learn relative key vectors a^K (added to the keys in the attention scores)",
        )
        parser.add_argument(
            "--relative-values", action=argparse.BooleanOptionalAction,
            help="learn relative value vectors a^V (added to the values; paper Table 3 ablates them)",
        )
        heads = parser.add_mutually_exclusive_group()
        heads.add_argument(
            "--relative-per-head", dest="relative_per_head", action="store_true",
            help="unique relative tables per head (the paper's base model)",
        )
        heads.add_argument(
            "--relative-shared-heads", dest="relative_per_head", action="store_false",
            help="one relative table per layer shared across heads (the paper's big model)",
        )
        parser.add_argument(
            "--relative-add-absolute-positions", action="store_true",
            help="also add fairseq's absolute (sinusoidal/learned) position embeddings; "
            "default: relative positions only, as in the paper",
        )
        add_attention_backend_arg(parser)

    @classmethod
    def prepare_args(cls, args):
        relative_transformer(args)  # make sure every relative option is present
        k = args.max_relative_positions
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"--max-relative-positions must be an integer >= 0 (got {k!r})")
        if args.cross_self_attention:
            raise ValueError("relative_transformer does not support --cross-self-attention")
        check_backend(args.attention_backend, args.attention_dropout)
        if args.relative_add_absolute_positions and args.no_token_positional_embeddings:
            raise ValueError("--relative-add-absolute-positions contradicts --no-token-positional-embeddings")
        if not args.relative_add_absolute_positions:
            args.no_token_positional_embeddings = True  # relative positions only


RelativeTransformerModel.encoder_class, RelativeTransformerModel.decoder_class = RelativeTransformerEncoder, RelativeTransformerDecoder


# architectures


@register_model_architecture("relative_transformer", "relative_transformer")
def relative_transformer(args):
    args.max_relative_positions = getattr(args, "max_relative_positions", 16)
    args.relative_keys = getattr(args, "relative_keys", True)
    args.relative_values = getattr(args, "relative_values", True)
    args.attention_backend = getattr(args, "attention_backend", None) or "sdpa"
    args.relative_per_head = getattr(args, "relative_per_head", True)
    args.relative_add_absolute_positions = getattr(args, "relative_add_absolute_positions", False)
    base_architecture(args)


@register_model_architecture("relative_transformer", "relative_transformer_wmt_en_de")
def relative_transformer_wmt_en_de(args):
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 1024)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 1024)
    relative_transformer(args)


@register_model_architecture("relative_transformer", "relative_transformer_vaswani_wmt_en_de_big")
def relative_transformer_vaswani_wmt_en_de_big(args):
    args.max_relative_positions = getattr(args, "max_relative_positions", 8)
    args.relative_per_head = getattr(args, "relative_per_head", False)
    transformer_vaswani_wmt_en_de_big(args)
    relative_transformer(args)


@register_model_architecture("relative_transformer", "relative_transformer_vaswani_wmt_en_fr_big")
def relative_transformer_vaswani_wmt_en_fr_big(args):
    args.dropout = getattr(args, "dropout", 0.1)
    relative_transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("relative_transformer", "relative_transformer_tiny")
def relative_transformer_tiny(args):
    args.max_relative_positions = getattr(args, "max_relative_positions", 4)
    tiny_architecture(args)
    relative_transformer(args)
