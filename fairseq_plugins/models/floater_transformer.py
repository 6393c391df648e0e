"""``floater_transformer``: fairseq's Transformer with FLOATER position biases (Liu et al., ICML 2020).

The maths, the solve, its caches and the binding of the biases live in ``fairseq_plugins/modules/floater/``
(the package docstring, ``modules/floater/__init__.py``, says which file holds what). Here: the flags, and which projections each flow drives.

- Encoder: one flow; its state is every driven block's self-attention q, k, v initial bias.
- Decoder: one flow for every driven block's self-attention q, k, v and cross-attention q (indexed by
  target positions), and one flow for the cross-attention k, v (indexed by *source* positions, each
  key by its own source position).
- ``--floater-layers all`` drives every block, ``input`` only the first (FLOATER Table 2's two groups); the
  other blocks keep constant, ordinary projection biases. The sinusoidal input embedding stays.
- The three flows are solved together, once per forward (``FloaterPositions``, shared by encoder and decoder):
  the model's forward announces its longest sequence, max(source length, target length), so the encoder's
  request solves the decoder's flows too; generation's encoder and decoder calls share one cache.

Grid rows follow fairseq's own position numbering (left padding does not shift positions); during
incremental decoding step t uses row t.

Not supported (rejected when the model is built): --cross-self-attention, --checkpoint-activations and
--quant-noise-pq (they change or re-run the attention projections behind the biases' back). With
--floater-update-every N > 1 and --ddp-backend pytorch_ddp, pass --find-unused-parameters: the flows take no
part in the updates that reuse cached biases (legacy_ddp needs nothing).
"""


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
from ..flags import OneLineFlag, one_of, positive
from ..modules.floater import (
    DEFAULT_SETTINGS,
    SOLVER_NAMES,
    FloaterFlow,
    FloaterPositions,
    FloaterSettings,
    bind_decoder_biases,
    bind_encoder_biases,
    check_decoding_step,
    enable_position_biases,
)

QKV = ("q_proj", "k_proj", "v_proj")


def add_floater_args(parser):
    """The FLOATER flags (also used by scripts/transformer_to_floater.py); defaults: FloaterSettings'."""
    d = DEFAULT_SETTINGS
    parser.add_argument("--floater-dt", action=OneLineFlag, parse=positive(float), metavar="D",
                        help=f"grid spacing Δ: position i is time t_i = i·Δ (default {d.dt}, the paper's "
                             "Appendix B; the authors' code used 0.01)")
    parser.add_argument("--floater-method", action=OneLineFlag, parse=one_of(SOLVER_NAMES), metavar="SOLVER",
                        help=f"torchdiffeq solver (default {d.method} with 5 steps per Δ, the paper's RK4 at Δ/5; "
                             "fixed-grid solvers take the same Δ/5 steps, adaptive ones (dopri5, ...) use "
                             "--floater-rtol/--floater-atol). One of: " + ", ".join(SOLVER_NAMES))
    parser.add_argument("--floater-rtol", action=OneLineFlag, parse=positive(float), metavar="R",
                        help=f"relative tolerance of adaptive solvers (default {d.rtol})")
    parser.add_argument("--floater-atol", action=OneLineFlag, parse=positive(float), metavar="A",
                        help=f"absolute tolerance of adaptive solvers (default {d.atol})")
    parser.add_argument("--floater-adjoint", action="store_true",
                        help="back-propagate through the ODE with torchdiffeq's adjoint method "
                             "(odeint_adjoint: less memory, one more solve backwards)")
    parser.add_argument("--floater-hidden", action=OneLineFlag, parse=positive(int), metavar="H",
                        help="hidden width of the dynamics MLP h (default: the embedding dimension d)")
    parser.add_argument("--floater-update-every", action=OneLineFlag, parse=positive(int), metavar="N",
                        help=f"re-solve the ODE with gradient every N updates (default {d.update_every}: exact "
                             "gradient every update); in between, cached biases are reused detached: b(0) still "
                             "gets its gradient, the flow θ none (the paper's §4.4 cost trick)")
    parser.add_argument("--floater-cuda-graph", action="store_true",
                        help="on CUDA, replay the default solve (rk4) of training forwards from captured CUDA "
                             "graphs (one per bucket of lengths) instead of launching it step by step. Opt-in: "
                             "verified on CPU by emulating CUDA graphs' buffer semantics, and on an H100: gradients "
                             "equal to the loop's (1e-7), update 2.1-5.2x the Transformer's against 3.9-11.3x "
                             "without, memory over its modelled bound (results/gpu_check_notes.md)")
    parser.add_argument("--floater-no-cuda-graph", action="store_true",
                        help="the default (step by step); accepted for command lines written when graphs were on "
                             "by default")
    parser.add_argument("--floater-layers", action=OneLineFlag, parse=one_of(("all", "input")), metavar="{all,input}",
                        help="blocks whose q/k/v biases follow the flow: all (default) or input (the first "
                             "block only; the others keep ordinary constant biases)")


def floater_defaults(args):
    """Missing FLOATER args take FloaterSettings' defaults (and the model's own: hidden, layers)."""
    for name, value in (("dt", DEFAULT_SETTINGS.dt), ("method", DEFAULT_SETTINGS.method),
                        ("rtol", DEFAULT_SETTINGS.rtol), ("atol", DEFAULT_SETTINGS.atol),
                        ("adjoint", DEFAULT_SETTINGS.adjoint), ("update_every", DEFAULT_SETTINGS.update_every),
                        ("cuda_graph", DEFAULT_SETTINGS.cuda_graph), ("hidden", None), ("layers", "all")):
        setattr(args, "floater_" + name, getattr(args, "floater_" + name, value))


def check_floater_args(args) -> FloaterSettings:
    """The solver settings (checked by FloaterSettings) and the model's own FLOATER args: one-line ValueError
    naming the flag, for settings given outside the command line."""
    settings = FloaterSettings.from_args(args)
    hidden = args.floater_hidden
    if hidden is not None and not (isinstance(hidden, int) and hidden >= 1):
        raise ValueError(f"--floater-hidden must be an integer >= 1, got {hidden!r}")
    if args.floater_layers not in ("all", "input"):
        raise ValueError(f"--floater-layers must be 'all' or 'input', got {args.floater_layers!r}")
    # --offload-activations before --checkpoint-activations: fairseq's arch defaults set the latter from it
    for flag, name in (("--cross-self-attention", "cross_self_attention"),
                       ("--offload-activations", "offload_activations"),
                       ("--checkpoint-activations", "checkpoint_activations")):
        if getattr(args, name, False):
            raise ValueError(f"floater_transformer does not support {flag}")
    if getattr(args, "quant_noise_pq", 0):
        raise ValueError("floater_transformer does not support --quant-noise-pq")
    return settings


def build_flow(cfg, dim):
    return FloaterFlow(dim, hidden=cfg.floater_hidden or dim, settings=FloaterSettings.from_args(cfg))


@register_model("floater_transformer")
class FloaterTransformerModel(PluginTransformerModel):
    """Transformer whose attention q/k/v biases follow a learned ODE along positions (FLOATER)."""

    family = "floater_transformer"
    scheme = "floater"
    not_scriptable = "its position biases come from an ODE solve bound to the attention in Python"

    @classmethod
    def add_family_args(cls, parser):
        add_floater_args(parser)

    @classmethod
    def prepare_args(cls, args):
        floater_defaults(args)
        check_floater_args(args)

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        # One solver call for all three flows per forward, one cache for encoder and decoder.
        self.floater_positions = FloaterPositions.joined(encoder.floater_positions, decoder.floater_positions)
        encoder.floater_positions = decoder.floater_positions = self.floater_positions

    def forward(self, src_tokens, src_lengths, prev_output_tokens, *args, **kwargs):
        with self.floater_positions.forward_pass(max(src_tokens.size(1), prev_output_tokens.size(1))):
            return super().forward(src_tokens, src_lengths, prev_output_tokens, *args, **kwargs)

class FloaterEncoderLayer(TransformerEncoderLayerBase):
    def build_self_attention(self, embed_dim, cfg):
        return enable_position_biases(super().build_self_attention(embed_dim, cfg))


class FloaterDecoderLayer(TransformerDecoderLayerBase):
    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return enable_position_biases(super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn))

    def build_encoder_attention(self, embed_dim, cfg):
        return enable_position_biases(super().build_encoder_attention(embed_dim, cfg))


def _driven(layers, cfg):
    return list(layers) if cfg.floater_layers == "all" else list(layers)[:1]


class FloaterTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.floater_flow = build_flow(cfg, cfg.encoder.embed_dim)
        # The flow's state, in order: block n's self-attention q, k, v (a plain list: not a submodule).
        self.floater_projections = [getattr(layer.self_attn, name)
                                    for layer in _driven(self.layers, cfg) for name in QKV]
        self.floater_positions = FloaterPositions()  # the model replaces it by one shared with the decoder
        self.floater_positions.add(self.floater_flow, self.floater_projections)

    def build_encoder_layer(self, cfg):
        return FloaterEncoderLayer(cfg, return_fc=self.return_fc)

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False, token_embeddings=None):
        with bind_encoder_biases(self, src_tokens):
            return super().forward(src_tokens, src_lengths, return_all_hiddens, token_embeddings)


class FloaterTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        driven = _driven(self.layers, cfg)
        dim = cfg.decoder.embed_dim
        # Target-indexed: block n's self-attention q, k, v and cross-attention q.
        self.floater_flow = build_flow(cfg, dim)
        self.floater_projections = [
            proj for layer in driven for proj in
            [getattr(layer.self_attn, name) for name in QKV]
            + ([layer.encoder_attn.q_proj] if layer.encoder_attn is not None else [])
        ]
        # Source-indexed: block n's cross-attention k, v.
        self.floater_cross_flow = build_flow(cfg, dim) if not no_encoder_attn else None
        self.floater_cross_projections = [getattr(layer.encoder_attn, name)
                                          for layer in driven if layer.encoder_attn is not None
                                          for name in ("k_proj", "v_proj")]
        self.floater_positions = FloaterPositions()  # the model replaces it by one shared with the encoder
        self.floater_positions.add(self.floater_flow, self.floater_projections)
        if self.floater_cross_flow is not None:
            self.floater_positions.add(self.floater_cross_flow, self.floater_cross_projections)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return FloaterDecoderLayer(cfg, no_encoder_attn)

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         full_context_alignment=False, alignment_layer=None, alignment_heads=None):
        with bind_decoder_biases(self, prev_output_tokens, encoder_out, incremental_state):
            x, extra = super().extract_features(prev_output_tokens, encoder_out, incremental_state,
                                                full_context_alignment, alignment_layer, alignment_heads)
        if incremental_state is not None:  # generation: one line instead of the beam search's assertion
            check_decoding_step(self, x, prev_output_tokens, encoder_out)
        return x, extra


FloaterTransformerModel.encoder_class, FloaterTransformerModel.decoder_class = FloaterTransformerEncoder, FloaterTransformerDecoder


# architectures


@register_model_architecture("floater_transformer", "floater_transformer")
def floater_transformer(args):
    floater_defaults(args)
    base_architecture(args)


@register_model_architecture("floater_transformer", "floater_transformer_wmt_en_de")
def floater_transformer_wmt_en_de(args):
    floater_defaults(args)
    transformer_wmt_en_de(args)


@register_model_architecture("floater_transformer", "floater_transformer_vaswani_wmt_en_de_big")
def floater_transformer_vaswani_wmt_en_de_big(args):
    floater_defaults(args)
    transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("floater_transformer", "floater_transformer_vaswani_wmt_en_fr_big")
def floater_transformer_vaswani_wmt_en_fr_big(args):
    floater_defaults(args)
    transformer_vaswani_wmt_en_fr_big(args)


@register_model_architecture("floater_transformer", "floater_transformer_tiny")
def floater_transformer_tiny(args):
    floater_defaults(args)
    tiny_architecture(args)
