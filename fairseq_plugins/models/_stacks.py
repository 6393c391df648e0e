"""The stacks of ``position_transformer``: fairseq's encoder and decoder (and their layers) holding a position
scheme's slot module and input embedding (``_PositionStack``), with one context around each forward
(``positions``); FLOATER's stacks add its own work (``modules/floater/model.py``)."""

from contextlib import contextmanager, nullcontext

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules import LearnedPositionalEmbedding
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from ..modules.floater.model import FloaterDecoderSteps, FloaterStack
from ..modules.position_scheme import ProjectionBiases, ScoreBias
from ..modules.positional_attention import PositionalCrossAttention, PositionalSelfAttention, set_references


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
