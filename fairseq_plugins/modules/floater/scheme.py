"""``Floater``: FLOATER as a row of ``position_transformer``, the projection-bias slot's module.

    q_i^(n) = W_q^(n) x_i + b_q^(n)(0) + Δb_q^(n)(t_i),   t_i = i·Δ,   Δb from the flows' solve (``flows.py``)

(likewise k and v; the package docstring gives the ODE). One module per stack, its flows' states being the
bias parameters of the projections it drives:
- encoder: one flow for every driven block's self-attention q, k, v;
- decoder: one flow for every driven block's self-attention q, k, v and cross-attention q (target positions),
  and one for the cross-attention k, v (each key's own source position);
- ``--floater-layers all`` drives every block, ``input`` the first only (FLOATER Table 2's two groups); the others
  keep constant, ordinary biases. The sinusoidal input embedding stays.

Mapping to code: ``Floater`` fills the projection-bias slot (``position_scheme.ProjectionBiases``): ``attach``
(each attention built with the module hands over its projections: block n's self-attention, then its
cross-attention, the order of the flows' states) and ``project`` (the q/k/v projection with its binding,
``attention.biased_projection``). Its other methods are called by FLOATER's own classes (``model.py``) only:
``join`` (the two stacks share one ``FloaterPositions``), ``bind_model`` (the update count, ``update_count.py``),
``batch(n)`` (one model forward: one solve at n = max(source, target) or none), ``prepare`` (one stack forward: Δb
at each token's grid row, fairseq's position numbering; a decoding step: its row of the table b(0) + Δb kept in the
incremental state), ``check_decoding_step`` (non-finite features: one line, ``FloaterSolverError``) and
``complete_gradients`` (``--floater-shared-solve``: ``shared_solve.py``).

Refused when the model is built: --checkpoint-activations and --offload-activations (the backward's recomputation
would run the projections after the binding ended), --quant-noise-pq (it changes the projections). With
--floater-update-every N > 1 and --ddp-backend pytorch_ddp, pass --find-unused-parameters: the flows take no
part in the updates that reuse cached biases (legacy_ddp needs nothing).

FLOATER as its authors' code trains it: configs/scheme/floater_all_authors.yaml; what still differs from their
code, one line each with the reason: docs/wmt14.md.
"""

import functools
from contextlib import contextmanager

import torch
from torch import Tensor

from ...flags import Flag, FlagError, boolean, one_of, positive
from ..position_scheme import ProjectionBiases
from .attention import Bindings, biased_projection, position_bindings, rows_from_padding_mask, step_bindings, token_rows
from .dynamics import (DEFAULT_SETTINGS, FIXED_GRID_SOLVERS, FLOW_INITS, SOLVER_NAMES, FloaterSettings,
                       FloaterSolverError)
from .flows import FloaterFlow, cache_size, describe_overflow
from .positions import FloaterPositions

_D = DEFAULT_SETTINGS
LAYERS = ("all", "input")


def build_flow(cfg, dim):
    return FloaterFlow(dim, hidden=cfg.floater_hidden or dim, settings=FloaterSettings.from_args(cfg),
                       init=getattr(cfg, "floater_flow_init", None) or "zero")


FLAGS = (  # Floater.flags
    Flag("--floater-dt", positive(float), "D", f"grid spacing Δ: position i is time t_i = i·Δ (default {_D.dt}, "
         "the paper's Appendix B; the authors' code used 0.01)", _D.dt),
    Flag("--floater-method", one_of(SOLVER_NAMES), "SOLVER", f"torchdiffeq solver (default {_D.method} with 5 "
         "steps per Δ, the paper's RK4 at Δ/5; fixed-grid solvers take the same Δ/5 steps, adaptive ones "
         "(dopri5, ...) use --floater-rtol/--floater-atol). One of: " + ", ".join(SOLVER_NAMES), _D.method),
    Flag("--floater-rtol", positive(float), "R", f"relative tolerance of adaptive solvers (default {_D.rtol})",
         _D.rtol),
    Flag("--floater-atol", positive(float), "A", f"absolute tolerance of adaptive solvers (default {_D.atol})",
         _D.atol),
    Flag("--floater-adjoint", boolean, None, "back-propagate through the ODE with torchdiffeq's adjoint method "
         "(odeint_adjoint: less memory, one more solve backwards)", _D.adjoint, switch=True),
    Flag("--floater-hidden", positive(int), "H", "hidden width of the dynamics MLP h (default: the embedding "
         "dimension d)"),
    Flag("--floater-update-every", positive(int), "N", f"re-solve the ODE with gradient every N updates "
         f"(default {_D.update_every}: exact gradient every update); in between, cached biases are reused "
         "detached: b(0) still gets its gradient, the flow θ none (the paper's §4.4 cost trick)",
         _D.update_every),
    Flag("--floater-cache-whole-bias", boolean, None, "with --floater-update-every N > 1, the updates in "
         "between reuse the whole bias b(0) + Δb of the last re-solve, detached, so b(0) too learns at the "
         "re-solves only, as in the authors' code (default: only Δb is reused and b(0) learns every update)",
         _D.cache_whole_bias, switch=True),
    Flag("--floater-flow-init", one_of(FLOW_INITS), "{zero,xavier}", "initial output layer W2 of a new flow: "
         "zero (default: h ≡ 0, a new model is the sinusoidal Transformer) or xavier (Xavier-normal, as in the "
         "authors' code)", "zero"),
    Flag("--floater-cuda-graph", boolean, None, "on CUDA, replay the default solve (rk4) of training forwards "
         "from captured CUDA graphs (one per bucket of lengths) instead of launching it step by step. Opt-in: "
         "verified on CPU by emulating CUDA graphs' buffer semantics, and on an H100 and an H200: gradients "
         "equal to the loop's (1e-7), update 2.1-5.2x the Transformer's against 3.9-11.3x without (H100), "
         "memory over its modelled bound (results/gpu_check/gpu_check_notes.md)", _D.cuda_graph, switch=True,
         off="--floater-no-cuda-graph", off_help="the default (step by step); accepted for command lines "
         "written when graphs were on by default"),
    Flag("--floater-shared-solve", boolean, None, "one ODE solve per update, shared by its --update-freq "
         "micro-batches, with one backward through it after the last one: the same gradient, N times fewer "
         "solves. Opt-in: verified on CPU (gradients equal to a solve per micro-batch in fp32, amp and fp16; "
         "one process, pytorch_ddp and legacy_ddp), not yet on a GPU. fairseq-train completes the gradient in "
         "the model's all_reduce_grads(); a training loop of your own must call it before each optimizer step",
         _D.shared_solve, switch=True),
    Flag("--floater-layers", one_of(LAYERS), "{all,input}", "blocks whose q/k/v biases follow the flow: all "
         "(default) or input (the first block only; the others keep ordinary constant biases)", "all"),
)


class Floater(ProjectionBiases):
    """FLOATER (Liu et al., ICML 2020): q/k/v biases that follow a learned ODE along positions."""

    embedding = "sinusoidal"
    flags = FLAGS

    @classmethod
    def defaults(cls, args):
        """Fill in the flags not given (None) only: a value given as 0 is refused by ``validate``, as the
        floater_transformer architectures did, rather than replaced by the default."""
        for flag in cls.flags:
            if getattr(args, flag.dest, None) is None:
                setattr(args, flag.dest, flag.default)

    @classmethod
    def validate(cls, args):
        """The flags that contradict each other or the machine (each value alone: its flag's parser)."""
        if args.floater_cache_whole_bias and args.floater_update_every == 1:
            raise FlagError("--floater-cache-whole-bias needs --floater-update-every N > 1 (with N = 1 no update "
                            "reuses cached biases)")
        if args.floater_shared_solve and args.floater_method not in FIXED_GRID_SOLVERS:
            # an adaptive solver's steps over the longest micro-batch's interval are not a shorter one's
            raise FlagError(f"--floater-shared-solve needs a fixed-grid --floater-method (rk4, euler, midpoint, ...), "
                            f"got the adaptive {args.floater_method}: its values at a position depend on the interval "
                            "solved")
        if args.floater_shared_solve and (getattr(args, "ddp_backend", None) in ("fully_sharded", "slowmo")
                                          or getattr(args, "use_bmuf", False)):
            backend = "--use-bmuf" if getattr(args, "use_bmuf", False) else f"--ddp-backend {args.ddp_backend}"
            raise FlagError(f"--floater-shared-solve supports one process, --ddp-backend pytorch_ddp and legacy_ddp, "
                            f"not {backend}: its gradient is averaged over the processes as those two average")
        if args.floater_cuda_graph and torch.version.hip is not None:
            # HIP invalidates a capture when another thread (NCCL's watchdog) queries an event, even in the
            # thread-local capture mode that makes this safe on CUDA (cuda_graph.py)
            raise FlagError("--floater-cuda-graph is not supported on ROCm (another thread's event query breaks "
                            "the capture); train without it")

    @classmethod
    def build(cls, cfg, heads, head_dim, causal):
        # fairseq's flags that re-run or change the projections: refused here, where the stack's config has them
        # (--offload-activations first: fairseq's arch defaults set --checkpoint-activations from it)
        for flag, value in (("--offload-activations", cfg.offload_activations),
                            ("--checkpoint-activations", cfg.checkpoint_activations),
                            ("--quant-noise-pq", cfg.quant_noise.pq)):
            if value:
                raise FlagError(f"FLOATER does not support {flag}: its position biases are bound to the attention "
                                "projections for one forward, which that flag runs again or changes")
        return cls(cfg, heads * head_dim, decoder=causal)

    def __init__(self, cfg, dim: int, decoder: bool):
        super().__init__()
        self.decoder = decoder
        self.driven_blocks = None if cfg.floater_layers == "all" else 1
        self.flow = build_flow(cfg, dim)
        self.cross_flow = build_flow(cfg, dim) if decoder and not cfg.no_cross_attention else None
        self.projections, self.cross_projections = [], []  # filled by attach; the attentions own them
        self.positions = FloaterPositions()  # a plain object; join() makes it the model's
        self.positions.add(self.flow, self.projections)
        if self.cross_flow is not None:
            self.positions.add(self.cross_flow, self.cross_projections)
        self._blocks = 0
        self._bound: Bindings = {}

    # -- at build ------------------------------------------------------------------------------------------
    def attach(self, attention):
        self._blocks += attention.self_attention
        if self.driven_blocks is not None and self._blocks > self.driven_blocks:
            return
        driven = [attention.q_proj, attention.k_proj, attention.v_proj]
        if attention.self_attention:
            self.projections += driven
        else:  # the decoder's cross-attention: q by target position, k and v by source position
            self.projections.append(attention.q_proj)
            self.cross_projections += driven[1:]
        if self.flow.settings.cache_whole_bias:
            # b(0) sits out the cached updates with θ (FloaterFlow.pause_theta): optimizers must know (as for θ)
            for proj in driven:
                proj.bias.may_skip_update = True

    def complete_gradients(self):
        self.positions.complete_gradients()  # both stacks share it: the second call finds nothing pending

    def join(self, other: "Floater"):
        self.positions = other.positions = FloaterPositions.joined(self.positions, other.positions)

    def bind_model(self, model):
        self.positions.update_count.bind(model)  # after join: the stacks' shared positions

    def upgrade_state_dict_named(self, state_dict, name):
        """Checkpoints of the floater_transformer family kept the flows on the stacks (``encoder.floater_flow``,
        ``decoder.floater_cross_flow``): fairseq calls this on load (``name``: ``<stack>.position_scheme``)."""
        stack = name.rsplit(".", 1)[0]
        for old, new in (("floater_flow", "flow"), ("floater_cross_flow", "cross_flow")):
            prefix = f"{stack}.{old}."
            for key in [k for k in state_dict if k.startswith(prefix)]:
                state_dict[f"{name}.{new}.{key[len(prefix):]}"] = state_dict.pop(key)

    # -- one forward ---------------------------------------------------------------------------------------
    def batch(self, num_positions: int):
        return self.positions.forward_pass(num_positions)

    def prepare(self, stack, tokens: Tensor, encoder_out=None, incremental_state=None):
        return self.bound(self._decoder_bindings(stack, tokens, encoder_out, incremental_state) if self.decoder
                          else self._encoder_bindings(stack, tokens))

    @contextmanager
    def bound(self, bindings: Bindings):
        """What ``project`` adds to each projection (``attention.position_bindings``) for the ``with`` block."""
        # the one dict made in __init__, filled and emptied in place: no attribute set on the module per forward
        self._bound.update(bindings)
        try:
            yield
        finally:
            self._bound.clear()

    def project(self, attention, name: str, x: Tensor) -> Tensor:
        proj = getattr(attention, name)
        return biased_projection(proj, x, self._bound.get(proj))

    def _encoder_bindings(self, stack, src_tokens: Tensor) -> Bindings:
        src_len = src_tokens.size(1)
        with self.positions.forward_pass(src_len) as positions:
            delta = positions.biases(self.flow, src_len)
        return position_bindings(self.projections, delta, token_rows(src_tokens, stack.padding_idx))

    def _decoder_bindings(self, stack, tokens: Tensor, encoder_out, incremental_state) -> Bindings:
        """The target flow's projections at each target token's row, the source flow's (cross-attention k, v) at
        each source position's row, Δb of both flows from one request (one solve, or none). An incremental
        decoding step takes both from the table in the incremental state (``_step_biases``): its token sits at
        row tgt_len − 1 and adds that row's whole bias."""
        tgt_len = tokens.size(1)
        cross = self.cross_flow is not None and encoder_out is not None and len(encoder_out["encoder_out"]) > 0
        src_len = encoder_out["encoder_out"][0].size(0) if cross else 0
        if incremental_state is not None:
            saved = _step_biases(self, stack, incremental_state, tgt_len, src_len)
            bindings = step_bindings(self.projections, saved["biases"][tgt_len - 1])
            src_delta = saved.get("cross_delta")
        else:
            with self.positions.forward_pass(max(tgt_len, src_len)) as positions:
                delta = positions.biases(self.flow, tgt_len)
                src_delta = positions.biases(self.cross_flow, src_len) if cross else None
            bindings = position_bindings(self.projections, delta, token_rows(tokens, stack.padding_idx))
        if cross:
            if len(encoder_out["encoder_padding_mask"]) > 0:
                # lazily: incremental decoding projects the encoder states on the first step only
                mask = encoder_out["encoder_padding_mask"][0]
                src_rows = functools.lru_cache(maxsize=None)(lambda: rows_from_padding_mask(mask))
            else:
                src_rows = torch.arange(src_len, device=tokens.device).unsqueeze(1)
            bindings.update(position_bindings(self.cross_projections, src_delta, src_rows))
        return bindings

    def check_decoding_step(self, stack, features: Tensor, tokens: Tensor, encoder_out) -> None:
        """Non-finite decoder features stop the generation with ``FloaterSolverError``, one line naming the source
        or target position from which the position biases can overflow the attention and the flag that helps
        (else the beam search goes on with NaN scores and dies on one of fairseq's assertions). One host sync
        per step, where the beam search makes several; training and validation are not checked."""
        if not bool(torch.isfinite(features).all()):
            raise FloaterSolverError(_overflow(self, tokens, encoder_out, features.dtype))


def _step_biases(scheme: "Floater", stack, incremental_state, num_positions: int, src_len: int):
    """For incremental decoding, kept in the incremental state: ``biases``, b(0) + Δb(t_i) of the target flow's
    projections, (P, k, d) with P ≥ num_positions, and ``cross_delta``, the source flow's Δb for the src_len
    source positions. Formed once per generation (the target table again each time a longer output doubles it),
    so a step only picks its row. The parameters cannot change within one generation: the cached keys and values
    of the earlier steps were computed from them too."""
    saved = stack.get_incremental_state(incremental_state, "floater")
    if saved is None or saved["biases"].size(0) < num_positions:
        rows = cache_size(num_positions)
        with scheme.positions.forward_pass(max(rows, src_len)) as positions:  # one solve, or none
            delta = positions.biases(scheme.flow, rows)
            b0 = torch.stack([proj.bias for proj in scheme.projections])
            saved = {"biases": (b0.to(delta.dtype) + delta).to(b0.dtype)}  # one rounding
            if src_len:
                saved["cross_delta"] = positions.biases(scheme.cross_flow, src_len)
        stack.set_incremental_state(incremental_state, "floater", saved)
    return saved


def _overflow(scheme: "Floater", tokens: Tensor, encoder_out, dtype: torch.dtype) -> str:
    """Why a decoding step's features are not finite: the first source or target position from which the model's
    position biases can overflow the attention in ``dtype`` (``describe_overflow``)."""
    lengths = {"target": tokens.size(1)}
    if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
        lengths["source"] = encoder_out["encoder_out"][0].size(0)
    # every flow of the model (the encoder's too: the stacks share their FloaterPositions), by the side it indexes
    flows = [("target" if flow is scheme.flow else "source", flow) for flow, _ in scheme.positions.members]
    flows = [(side, flow, lengths[side]) for side, flow in flows if side in lengths]
    with scheme.positions.forward_pass(max(lengths.values())) as positions:
        deltas = [(side, positions.biases(flow, n).detach()) for side, flow, n in flows]
    return describe_overflow(deltas, lengths, dtype)
