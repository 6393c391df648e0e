"""FLOATER: attention biases that follow a learned continuous dynamical system.

Liu, Yu, Dhillon, Hsieh, "Learning to Encode Position for Transformer with Continuous Dynamical Model",
ICML 2020 (arXiv 2003.09229). This module implements the paper's model exactly; the fairseq wiring is in
``fairseq_plugins/models/floater_transformer.py``.

The model
---------
Position is a continuous trajectory ``p(t)`` driven by a learned vector field ``h`` (paper eq. 8)::

    p(t) = p(s) + ∫_s^t h(τ, p(τ); θ) dτ,        position i  ↦  t_i = i·Δ

``FloaterDynamics`` is ``h``: a 2-layer MLP with the scalar time appended to each layer's input::

    h(τ, p; θ) = W2 [ relu(W1 [p; τ] + c1) ; τ ] + c2,     W1: (d+1 → hidden), W2: (hidden+1 → d)

so one flow has (d+1)·hidden + hidden + (hidden+1)·d + d parameters: 526,336 for d = hidden = 512, the
paper's "526.3K" (Table 6). Written with the time columns apart (w1, w2: the weights of τ)::

    h(τ, p) = W2 u + w2 τ + c2,     u = relu(W1 p + w1 τ + c1)

Re-parameterisation (paper eq. 12). Adding a position vector p_i^(n) to the input of block n and
projecting gives ``q_i = W_q(x_i + p_i + b_q) = q̃_i + b_{q,i}``: the position signal is a
*per-position bias* of the projection, and FLOATER lets the dynamics act on that bias directly::

    b_q^(n)(t) = b_q^(n)(0) + ∫_0^t h(τ, b_q^(n)(τ); θ) dτ,    q_i^(n) = W_q^(n) x_i + b_q^(n)(t_i)

(likewise k and v). θ is shared by every block; each block n keeps its own initial values b^(n)(0),
which are simply the projections' ordinary bias parameters. The sinusoidal input encoding stays, so with
h ≡ 0 every b^(n)(t) ≡ b^(n)(0) and the model *is* the sinusoidal Transformer: a trained Transformer is an
exact starting point (``scripts/transformer_to_floater.py``).

Initialisation: W1 is Xavier-normal with c1 = 0 (as in the authors' code); W2 and c2 start at zero, so
a new flow has h ≡ 0 and a new model starts as the sinusoidal Transformer it can also be converted from.
(The authors' code also draws W2 Xavier-normal; at d = 512 the biases then grow about 60-fold by position
50 and 2000-fold by position 100 at Δ = 0.1, roughly like e^{0.75·t}.) W2 gets gradient from the first
solve with gradient on, W1 from the second.

The solve
---------
A model has three flows, each with its own θ (the paper: one for the encoder, one for the decoder's
self-attention q/k/v and cross-attention q, one for the cross-attention k/v). A flow's state stacks the k
initial values it drives, y(0) = [b_1(0); ...; b_k(0)] of shape (k, d): one solve over the grid returns every
block's bias at every position, shared by the batch, the blocks and the sentences.

- Grid: t_i = i·Δ for i = 0..P−1, P = the longest sequence of the forward (source or target). Fixed-grid
  solvers take ``STEPS_PER_DT`` = 5 equal steps per Δ (the paper's RK4 at Δ/5) on a grid that contains every
  t_i exactly, so no output is interpolated; adaptive solvers use rtol/atol and interpolate at the t_i.
- All flows in one solver call (``solve_flows``): the flows' states are padded with zero rows to the largest
  k and stacked, (F, K, ·), and each evaluation applies flow f's θ to slice f with batched matrix products
  (``torch.baddbmm``). One forward thus takes 5·(P−1) sequential solver steps, not three times that; padded
  rows are dropped from the result (and get no gradient). In the latent solve (below) the products skip the
  padding rows (``_flow_products``): they are not integrated at all.
- Default, ``rk4`` without ``--floater-adjoint``: latent coordinates. With z = W1 p (hidden-sized)::

      u = relu(z + w1 τ + c1),   dz/dτ = W1 h = (W1 W2) u + (W1 w2) τ + W1 c2,
      p(t_i) = p(t_0) + W2 q(t_i) + w2 (t_i² − t_0²)/2 + c2 (t_i − t_0),   q(t_i) = Σ_steps δ Σ_j b_j u_j

  torchdiffeq's rk4 integrates z, one (hidden × hidden) product per evaluation instead of two, and q sums
  the same steps' stage values u_j with the RK4 weights b = (1, 3, 3, 1)/8 (step δ = Δ/5). Runge-Kutta
  methods commute with linear maps and integrate the linear-in-τ part exactly, so this *is* RK4 applied to
  p, step for step, in exact arithmetic; in floating point the two differ by rounding (about 1e-6 relative
  in float32; the tests compare both with torchdiffeq's own solve of h). The backward pass is the exact
  derivative of those RK4 steps, the gradient autograd would take through the solver (direct backprop,
  not the continuous adjoint), written out in ``_LatentRK4.backward``: one reverse sweep over the steps
  with the stage values saved by the forward; the gradient of W1W2 is one matrix product per grid interval
  (its 20 stages), so the sweep's own buffers hold one interval's stage gradients, not all of them.
- Precision: every solve runs in float32 (float64 for a float64 model) whatever the model's dtype or autocast
  state: θ and b(0) are cast to float32 differentiably (their gradients come back in their own dtype), the
  state, the products, the time grid and the saved stage values are float32 and autocast is off inside the
  solve and its backward (every solver path: latent rk4, other fixed-grid, adaptive, adjoint); Δb is cast to
  each projection's dtype where it is added. Solved in half precision, Δb was off by 0.1–0.8% (fp16) and
  1–20% (bf16), θ's gradient by 1–4% (fp16) and 19–55% (bf16), and an fp16 backward overflowed. The cost for
  a half-precision model: one cast of θ and b(0) per solve, a tape twice the half-precision size, and float32
  instead of half-precision products in the solve.
- The other fixed-grid solvers, and ``--floater-adjoint`` (torchdiffeq's ``odeint_adjoint``), integrate h
  itself on the stacked state, with autograd through the solver (or the adjoint solve). Adaptive solvers
  (dopri5, ...) solve each flow on its own, one call per flow: their step sizes, and the gradient through
  the step-size control, depend on the state they control.

Mapping to code
---------------
- ``FloaterDynamics.forward(t, y)``       h(τ, p; θ), torchdiffeq style.
- ``solve_on_grid``                       one dynamics' y(t_i) on the grid, one torchdiffeq call (reference).
- ``solve_flows``                         several flows' y(t_i) in one torchdiffeq call (what the model uses).
- ``FloaterFlow``                         one θ with the solver settings and the update counter; calling it
  solves that flow alone (no cache). It returns Δb(t_i) = b(t_i) − b(0), shape (P, k, d).
- ``FloaterPositions``                    a model's flows with the projections each drives: one solve for
  all of them per forward, and their cache.
- ``PositionBiasedLinear``                ``y_i = W x_i + b(0) + Δb(t_i)``; ``enable_position_biases``
  gives a fairseq ``MultiheadAttention`` such q/k/v projections (``PositionBiasedMultiheadAttention``:
  torch's fused ``scaled_dot_product_attention`` on them where fairseq would use its own fused path),
  ``bind_position_biases`` hands them a flow's output for one forward, ``bind_biases`` one decoding step's.

Cost and caching (paper §4.4 says one solve costs about 100 forward+backward passes of h)
------------------------------------------------------------------------------------------
- Training: ``FloaterPositions.forward_pass`` brackets one model forward; its first request solves every
  flow (for the longest sequence of the batch) and the other requests of that forward reuse the result:
  one solver call per forward whatever the number of flows.
- Training, ``update_every = 1``: that solve has gradient every forward: the exact gradient.
- Training, ``update_every = N > 1`` (the paper's cost trick): the flows re-solve with gradient on updates
  whose counter is a multiple of N (and on the first forward of a model without a training cache); on the
  other updates they reuse cached Δb(t_i) detached from the graph, with no solver work (unless a batch is
  longer than the cache), so the bias is ``b(0) + sg[Δb(t_i)]``: b(0) and everything else still get their
  exact gradient through the first term, θ gets none: it is taken out of autograd for that forward
  (``requires_grad`` off until the next re-solve or ``train()``/``eval()`` call), so its ``.grad`` stays
  unset and DDP does not fill in zeros that Adam's momentum would act on (pytorch_ddp needs
  --find-unused-parameters). The cache is a function of the training state only: each flow keeps b(0) and
  a frozen copy of θ as of the re-solve, and the cached Δb is solved from those without gradient (right
  after the re-solve, for 16 positions, then doubled by integrating from the last row as longer batches need
  it), so its values do not depend on the lengths of the batches a process saw; evaluation never replaces
  it. b(0) and θ of the re-solve are saved in the flow's state dict (``_extra_state``, one tensor; checkpoints
  without it load and re-solve), so a resumed run rebuilds exactly the biases the interrupted one was
  reusing. The update counter is each flow's ``num_updates`` buffer, fed by fairseq's ``set_num_updates``
  (the index of the update about to run) and saved in checkpoints, so the schedule survives a resume too.
- Eval and inference: a separate cache. Δb is solved once per parameter version (without gradient: eval
  mode never back-propagates into θ) and reused; incremental decoding then costs no ODE work at all, and each
  decoding step adds one bias per projection, b(0) + Δb(t), to an ordinary linear map (the decoder keeps the
  table b(0) + Δb(t_i) in fairseq's incremental state: one cache lookup per generation, not per step). The cache key holds
  the parameters' ``data_ptr`` and ``_version`` counters, the update counter and a counter bumped by
  mode changes (``train()`` after ``eval()`` and back: fairseq's validation calls ``eval()`` per batch, one
  solve serves them all); ``load_state_dict`` drops it. (fairseq's Adam updates weights through ``p.data``,
  which does not bump ``_version``: the trainer's ``set_num_updates`` and ``train()`` calls cover that.
  After editing weights by hand through ``.data`` call ``invalidate_cache()`` on a flow: it drops both
  caches.)
- Any length: a sequence longer than the cache extends it (all flows, one solver call) by integrating from
  the last cached grid point. For fixed-grid solvers the steps are the same as one solve from 0, so the
  values are the same (up to float rounding); adaptive solvers restart their step-size control at the old
  end point, so the extension differs from a single solve by up to the solver tolerance.
- A non-finite solution raises ``FloaterSolverError`` naming the solver settings.

The authors' code used Δ = 0.01 (the paper, Appendix B, states Δ = 0.1, the default here), fixed-step RK4
at Δ/5, the adjoint method and a bias cache refreshed every 400 forwards.
"""

import copy
from contextlib import contextmanager
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torchdiffeq import odeint, odeint_adjoint

# torchdiffeq lists its solvers in a private table; 0.2.5 is pinned in requirements.txt.
from torchdiffeq._impl.odeint import SOLVERS as _TORCHDIFFEQ_SOLVERS
from torchdiffeq._impl.solvers import FixedGridODESolver

SOLVER_NAMES: Tuple[str, ...] = tuple(m for m in _TORCHDIFFEQ_SOLVERS if m != "scipy_solver")
FIXED_GRID_SOLVERS = frozenset(
    m for m in SOLVER_NAMES if issubclass(_TORCHDIFFEQ_SOLVERS[m], FixedGridODESolver)
)
STEPS_PER_DT = 5  # fixed-grid step Δ/5 (paper, Appendix B)
MIN_CACHE = 16  # eval caches hold at least this many positions and grow by doubling
# torchdiffeq's "rk4" is the 3/8 rule (rk4_alt_step_func): stage times t + c_j·δ, inputs y + δ·Σ_l a_jl k_l.
RK4_WEIGHTS = (1 / 8, 3 / 8, 3 / 8, 1 / 8)


class FloaterSolverError(FloatingPointError):
    """The ODE solve produced non-finite values or the solver gave up."""


class FloaterDynamics(nn.Module):
    """h(τ, p; θ) = W2 [relu(W1 [p; τ] + c1); τ] + c2, applied to each row of a state (..., d)."""

    def __init__(self, dim: int, hidden: Optional[int] = None):
        super().__init__()
        hidden = hidden or dim
        self.fc1 = nn.Linear(dim + 1, hidden)
        self.fc2 = nn.Linear(hidden + 1, dim)
        nn.init.xavier_normal_(self.fc1.weight)  # as in the authors' code
        nn.init.zeros_(self.fc1.bias)
        self.zero_output_()  # h ≡ 0 at initialisation: see "Initialisation" in the module docstring

    def forward(self, t: Tensor, p: Tensor) -> Tensor:
        tau = t.to(p).expand(*p.shape[:-1], 1)  # the time, appended to each layer's input
        hidden = torch.relu(self.fc1(torch.cat([p, tau], dim=-1)))
        return self.fc2(torch.cat([hidden, tau], dim=-1))

    @torch.no_grad()
    def zero_output_(self) -> "FloaterDynamics":
        """Make h ≡ 0 (so b(t) ≡ b(0)): the warm start from a trained Transformer."""
        self.fc2.weight.zero_()
        self.fc2.bias.zero_()
        return self


def _subdivide(t: Tensor, steps: int) -> Tensor:
    """The fixed-step grid: each interval [t_j, t_j+1] split into `steps` equal steps, t_j kept exact."""
    frac = torch.arange(steps, dtype=t.dtype, device=t.device) / steps
    inner = t[:-1, None] + (t[1:] - t[:-1])[:, None] * frac
    return torch.cat([inner.reshape(-1), t[-1:]])


def _grid_times(num_points: int, dt: float, first_index: int, device) -> Tensor:
    """t_i = i·Δ for i = first_index .. first_index + num_points − 1 (float64)."""
    index = torch.arange(first_index, first_index + num_points, dtype=torch.float64, device=device)
    return index * dt


def _solver_options(method: str, steps: Optional[Tensor] = None) -> dict:
    if method not in FIXED_GRID_SOLVERS:
        return {}
    if steps is not None:
        return {"grid_constructor": lambda func, y, times: steps}
    return {"grid_constructor": lambda func, y, times: _subdivide(times, STEPS_PER_DT)}


def solve_on_grid(
    dynamics: nn.Module,
    y0: Tensor,
    num_points: int,
    dt: float,
    method: str = "rk4",
    rtol: float = 1e-4,
    atol: float = 1e-6,
    adjoint: bool = False,
    first_index: int = 0,
) -> Tensor:
    """y(t_i) for i = first_index .. first_index + num_points − 1, t_i = i·Δ, given y(t_first_index) = y0.

    One torchdiffeq call for the whole run of grid points; returns (num_points, *y0.shape).
    """
    if num_points == 1:
        return y0.unsqueeze(0)
    t = _grid_times(num_points, dt, first_index, y0.device)
    kwargs = dict(rtol=rtol, atol=atol, method=method, options=_solver_options(method))
    if adjoint:
        return odeint_adjoint(dynamics, y0, t, adjoint_params=_theta(dynamics), **kwargs)
    return odeint(dynamics, y0, t, **kwargs)


# -- several flows in one solve ----------------------------------------------------------------------------


class _StackedDynamics(nn.Module):
    """h of F flows at once on a stacked state (F, K, d): flow f's own FloaterDynamics on slice f."""

    def __init__(self, dynamics: Sequence[FloaterDynamics]):
        super().__init__()
        self.flows = nn.ModuleList(dynamics)

    def forward(self, t: Tensor, y: Tensor) -> Tensor:
        return torch.stack([h(t, y_f) for h, y_f in zip(self.flows, y)])

    def theta(self) -> Tuple[Tensor, ...]:
        """The tensors the adjoint differentiates: each flow's θ as the solve uses it (cast or not)."""
        return tuple(p for h in self.flows for p in _theta(h))


def solve_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of every solve: float64 for a float64 model, float32 for any other (half, bfloat16, float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class _CastDynamics(nn.Module):
    """h with θ cast to the solve's dtype, differentiably (θ's gradient goes back to the parameters in their own
    dtype). The original module is held outside the module tree: its parameters are not this module's."""

    def __init__(self, dynamics: FloaterDynamics, dtype: torch.dtype):
        super().__init__()
        self.theta = {name: p.to(dtype) for name, p in dynamics.named_parameters()}
        self.original = (dynamics,)

    def forward(self, t: Tensor, p: Tensor) -> Tensor:
        return torch.func.functional_call(self.original[0], self.theta, (t, p))


def _in_dtype(dynamics: nn.Module, dtype: torch.dtype) -> nn.Module:
    if all(p.dtype == dtype for p in dynamics.parameters()):
        return dynamics
    return _CastDynamics(dynamics, dtype)


def _theta(dynamics: nn.Module) -> Tuple[Tensor, ...]:
    return tuple(dynamics.theta.values()) if isinstance(dynamics, _CastDynamics) else tuple(dynamics.parameters())


def _split_weights(dynamics: Sequence[FloaterDynamics]):
    """Stacked W1 (F, hidden, d), w1, c1 (F, 1, hidden), W2 (F, d, hidden), w2, c2 (F, 1, d) (autograd-tracked)."""
    d = dynamics[0].fc1.in_features - 1
    hidden = dynamics[0].fc2.in_features - 1
    fc1 = torch.stack([h.fc1.weight for h in dynamics])  # (F, hidden, d + 1)
    fc2 = torch.stack([h.fc2.weight for h in dynamics])  # (F, d, hidden + 1)
    c1 = torch.stack([h.fc1.bias for h in dynamics]).unsqueeze(1)
    c2 = torch.stack([h.fc2.bias for h in dynamics]).unsqueeze(1)
    W1, w1 = fc1[..., :d], fc1[..., d].unsqueeze(1)
    W2, w2 = fc2[..., :hidden], fc2[..., hidden].unsqueeze(1)
    return W1, w1, c1, W2, w2, c2


def _rk4_stage_times(grid: Tensor) -> Tensor:
    """The times at which torchdiffeq's rk4 evaluates the dynamics, in order: per step t0, t0 + δ/3,
    t0 + 2δ/3, t1 (δ = t1 − t0), with torchdiffeq's own float64 arithmetic (rk4_alt_step_func)."""
    t0, t1 = grid[:-1], grid[1:]
    step = t1 - t0
    return torch.stack([t0, t0 + step * (1 / 3), t0 + step * (2 / 3), t1], dim=1).reshape(-1)


class _LatentDynamics(nn.Module):
    """dz/dτ = W1 h in latent coordinates z = W1 p (F flows stacked), torchdiffeq style.

    The n-th evaluation (stage time τ_n, known in advance) writes u = relu(z + w1 τ_n + c1) into ``tape[:, n]``,
    the stage values the backward pass and q need, and returns u (W1 W2)ᵀ + (w2 τ_n + c2) W1ᵀ. ``c[:, n]`` and
    ``e[:, n]`` hold the time terms w1 τ_n + c1 and (w2 τ_n + c2) W1ᵀ; the times torchdiffeq passes are kept
    to check that they are the τ_n.
    """

    def __init__(self, Mt: Tensor, c: Tensor, e: Tensor, tape: Tensor, used_rows: Optional[Tuple[int, ...]]):
        super().__init__()
        self.Mt, self.c, self.e, self.used_rows = Mt, c, e, used_rows
        self.tape = tape  # (F, evaluations, K, hidden)
        self.times: List[Tensor] = []

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        n = len(self.times)
        if n >= self.tape.size(1):
            raise RuntimeError("torchdiffeq's rk4 evaluated the dynamics more often than 4 times per step")
        self.times.append(t)
        u = torch.add(z, self.c[:, n], out=self.tape[:, n]).relu_()
        return _flow_products(self.e[:, n], u, self.Mt, self.used_rows)


def _flow_products(bias: Tensor, x: Tensor, weight: Tensor, used_rows: Optional[Tuple[int, ...]],
                   beta: float = 1.0):
    """beta·bias + x @ weight for each flow f (batched over F) on its first used_rows[f] rows (None: all rows);
    the padding rows below are zero (the flows' states are padded to one height K: the products skip the
    padding, 25% of the rows for a model's three flows). bias: (F, 1 | K, n), x: (F, K, m), weight: (F, m, n)."""
    if used_rows is None:
        return torch.baddbmm(bias, x, weight, beta=beta)
    out = x.new_zeros(x.size(0), x.size(1), weight.size(-1))
    for f, r in enumerate(used_rows):
        torch.addmm(bias[f, :r], x[f, :r], weight[f], beta=beta, out=out[f, :r])
    return out


class _LatentRK4(torch.autograd.Function):
    """q(t_i) (F, P, K, hidden) of torchdiffeq's rk4 on the latent system; backward = the exact derivative of
    those steps (see the module docstring, "The solve")."""

    @staticmethod
    def forward(ctx, z0: Tensor, Mt: Tensor, c1: Tensor, w1: Tensor, ec: Tensor, et: Tensor, t: Tensor,
                used_rows: Optional[Tuple[int, ...]] = None):
        flows, rows, hidden = z0.shape
        # rows of flow f from used_rows[f] on are padding: they are not integrated (their q is unspecified);
        # None when no flow has padding (checked once here, not at every evaluation)
        if used_rows is not None and all(r == rows for r in used_rows):
            used_rows = None
        points = t.numel()
        grid = _subdivide(t, STEPS_PER_DT)
        step_sizes = torch.diff(grid.cpu()).tolist()  # δ of each step, as torchdiffeq computes it (t1 − t0)
        evaluations = 4 * len(step_sizes)
        times = _rk4_stage_times(grid).to(z0.dtype)  # as torchdiffeq hands them to the dynamics
        tau = times.view(1, evaluations, 1, 1)
        c = torch.addcmul(c1.unsqueeze(1), w1.unsqueeze(1), tau)  # (F, evaluations, 1, hidden)
        e = torch.addcmul(ec.unsqueeze(1), et.unsqueeze(1), tau)
        tape = z0.new_empty(flows, evaluations, rows, hidden)
        dynamics = _LatentDynamics(Mt, c, e, tape, used_rows)
        odeint(dynamics, z0, t, method="rk4", options=_solver_options("rk4", grid))
        if len(dynamics.times) != evaluations or not torch.equal(torch.stack(dynamics.times), times):
            raise RuntimeError("torchdiffeq's rk4 did not evaluate the dynamics at the expected stage times "
                               "(4 per step: t0, t0 + δ/3, t0 + 2δ/3, t1)")
        # q(t_i) = Σ over the steps before t_i of δ Σ_j b_j u_j: weights per evaluation, summed per interval.
        weights = torch.tensor(step_sizes, dtype=z0.dtype)[:, None] * torch.tensor(RK4_WEIGHTS, dtype=z0.dtype)
        per_interval = 4 * STEPS_PER_DT
        weights = weights.reshape(1, points - 1, 1, per_interval).to(z0.device)
        increments = torch.matmul(weights, tape.view(flows, points - 1, per_interval, rows * hidden))
        q = torch.cat([z0.new_zeros(flows, 1, rows * hidden), increments.squeeze(2).cumsum(1)], dim=1)
        ctx.save_for_backward(tape, Mt, times)
        ctx.step_sizes, ctx.used_rows = step_sizes, used_rows
        return q.view(flows, points, rows, hidden)

    @staticmethod
    @once_differentiable
    def backward(ctx, q_grad: Tensor):
        with torch.autocast(q_grad.device.type, enabled=False):  # the sweep in the solve's dtype, like the forward
            return _LatentRK4._backward(ctx, q_grad)

    @staticmethod
    def _backward(ctx, q_grad: Tensor):
        tape, Mt, times = ctx.saved_tensors
        step_sizes, used_rows = ctx.step_sizes, ctx.used_rows
        flows, evaluations, rows, hidden = tape.shape
        # The adjoint of q after step s: the gradient of every later grid point (q(t_i) sums all steps before t_i).
        q_adjoint = q_grad[:, 1:].flip(1).cumsum(1).flip(1)  # [:, i]: Σ_{i' > i} ∂L/∂q(t_i'), steps of interval i
        for f, r in enumerate(used_rows or ()):  # the padding rows are not part of the solve: no gradient there
            q_adjoint[f, :, r:] = 0
        Mt_t = Mt.transpose(1, 2)
        # One interval of the grid (STEPS_PER_DT steps, 4 stages each) at a time: its stages' gradients live
        # in two small buffers and go into the parameters' gradients before the next interval is reversed,
        # so the backward needs no arrays as large as the tape.
        per_interval = 4 * STEPS_PER_DT
        k_grad = tape.new_empty(flows, per_interval, rows, hidden)  # ∂L/∂k_j: the z-part of each stage derivative
        a_grad = torch.empty_like(k_grad)  # ∂L/∂(z + w1 τ + c1) of each stage
        a_rows = tape.new_empty(flows, evaluations, hidden)  # both summed over the rows, for every stage
        k_rows = torch.empty_like(a_rows)
        Mt_grad = torch.zeros_like(Mt)
        z_adjoint = q_grad.new_zeros(flows, rows, hidden)  # ∂L/∂z after the step being reversed
        b1, b2, b3, b4 = RK4_WEIGHTS
        relu_grad = torch.ops.aten.threshold_backward.grad_input
        for interval in reversed(range(len(step_sizes) // STEPS_PER_DT)):
            lq, first = q_adjoint[:, interval], interval * per_interval
            for s in reversed(range(interval * STEPS_PER_DT, (interval + 1) * STEPS_PER_DT)):
                delta, n, m = step_sizes[s], 4 * s, 4 * s - first  # n: stage in the tape, m: in the buffers
                k1, k2, k3, k4 = (k_grad[:, m + j] for j in range(4))
                a1, a2, a3, a4 = (a_grad[:, m + j] for j in range(4))
                # torchdiffeq's rk4 (3/8 rule): k1 = f(z), k2 = f(z + δ k1/3), k3 = f(z + δ(k2 − k1/3)),
                # k4 = f(z + δ(k1 − k2 + k3)), z' = z + δ(k1 + 3 k2 + 3 k3 + k4)/8; reversed stage by stage.
                torch.mul(z_adjoint, delta * b4, out=k4)
                relu_grad(_flow_products(lq, k4, Mt_t, used_rows, delta * b4), tape[:, n + 3], 0, grad_input=a4)
                torch.add(z_adjoint, a4, alpha=1 / b3, out=k3).mul_(delta * b3)
                relu_grad(_flow_products(lq, k3, Mt_t, used_rows, delta * b3), tape[:, n + 2], 0, grad_input=a3)
                torch.add(k3, a4, alpha=-2 * delta, out=k2).add_(a3, alpha=delta)
                relu_grad(_flow_products(lq, k2, Mt_t, used_rows, delta * b2), tape[:, n + 1], 0, grad_input=a2)
                torch.add(k4, a4, alpha=delta, out=k1).add_(a3, alpha=-delta / 3).add_(a2, alpha=delta / 3)
                relu_grad(_flow_products(lq, k1, Mt_t, used_rows, delta * b1), tape[:, n], 0, grad_input=a1)
                z_adjoint.add_(a_grad[:, m: m + 4].sum(1))
            # Parameters: sums over every stage (k_j = u_j Mt + ec + et τ_j, u_j = relu(z + w1 τ_j + c1)).
            stages = tape[:, first: first + per_interval]
            if used_rows is None:
                Mt_grad.baddbmm_(stages.reshape(flows, -1, hidden).transpose(1, 2), k_grad.view(flows, -1, hidden))
            else:  # the used rows only
                for f, r in enumerate(used_rows):
                    Mt_grad[f].addmm_(stages[f, :, :r].reshape(-1, hidden).t(), k_grad[f, :, :r].reshape(-1, hidden))
            a_rows[:, first: first + per_interval] = a_grad.sum(2)
            k_rows[:, first: first + per_interval] = k_grad.sum(2)
        c1_grad, ec_grad = a_rows.sum(1, keepdim=True), k_rows.sum(1, keepdim=True)
        w1_grad = torch.matmul(times.to(a_rows), a_rows).unsqueeze(1)
        et_grad = torch.matmul(times.to(k_rows), k_rows).unsqueeze(1)
        return z_adjoint, Mt_grad, c1_grad, w1_grad, ec_grad, et_grad, None, None


def _solve_latent(dynamics: Sequence[FloaterDynamics], y0: Tensor, t: Tensor,
                  used_rows: Optional[Tuple[int, ...]] = None, dtype: Optional[torch.dtype] = None) -> Tensor:
    """RK4 on the stacked flows in latent coordinates; y0 (F, K, d) → y(t_i) (F, P, K, d) (rows of flow f from
    used_rows[f] on are padding: unspecified)."""
    W1, w1, c1, W2, w2, c2 = (w.to(dtype or y0.dtype) for w in _split_weights(dynamics))
    W1t, W2t = W1.transpose(1, 2), W2.transpose(1, 2)  # (F, d, hidden), (F, hidden, d)
    Mt = torch.bmm(W2t, W1t)  # (W1 W2)ᵀ: (F, hidden, hidden)
    z0 = torch.bmm(y0, W1t)  # z = W1 p
    ec, et = torch.bmm(c2, W1t), torch.bmm(w2, W1t)  # W1 c2, W1 w2 (as rows)
    q = _LatentRK4.apply(z0, Mt, c1, w1, ec, et, t, used_rows)  # (F, P, K, hidden)
    flows, points, rows, hidden = q.shape
    p = y0.unsqueeze(1) + torch.bmm(q.view(flows, points * rows, hidden), W2t).view(flows, points, rows, -1)
    t0 = t[0]
    linear = (t - t0).to(y0)[:, None, None]  # ∫ c2 dτ from t_0
    square = ((t * t - t0 * t0) / 2).to(y0)[:, None, None]  # ∫ w2 τ dτ from t_0
    return p + w2.unsqueeze(1) * square + c2.unsqueeze(1) * linear


def solve_flows(
    flows: Sequence["FloaterFlow"], initial: Sequence[Tensor], num_points: int, first_index: int = 0,
    dynamics: Optional[Sequence[FloaterDynamics]] = None,
) -> List[Tensor]:
    """y(t_i), i = first_index .. first_index + num_points − 1, of several flows in one torchdiffeq call.

    ``initial[f]`` (k_f, d) is flow f's state at t_first_index; returns one (num_points, k_f, d) per flow. The
    flows must share their solver settings; ``dynamics`` replaces their θ (a cached copy). See "The solve"
    in the module docstring (adaptive solvers: one call per flow).
    """
    lead = flows[0]
    dynamics = list(dynamics) if dynamics is not None else [flow.dynamics for flow in flows]
    dtype = solve_dtype(initial[0].dtype)
    initial = [y.to(dtype) for y in initial]  # differentiable: b(0)'s gradient goes back in its own dtype
    if num_points == 1:
        return [y.unsqueeze(0) for y in initial]
    with torch.autocast(initial[0].device.type, enabled=False):
        return _solve_flows(lead, dynamics, initial, num_points, first_index, dtype)


def _solve_flows(lead, dynamics, initial, num_points, first_index, dtype):
    if lead.method not in FIXED_GRID_SOLVERS:
        return [solve_on_grid(_in_dtype(h, dtype), y0, num_points, lead.dt, lead.method, lead.rtol, lead.atol,
                              lead.adjoint, first_index) for h, y0 in zip(dynamics, initial)]
    rows = [y.size(0) for y in initial]
    K = max(rows)
    y0 = torch.stack([F.pad(y, (0, 0, 0, K - k)) for y, k in zip(initial, rows)])  # (F, K, d)
    t = _grid_times(num_points, lead.dt, first_index, y0.device)
    if lead.latent:
        y = _solve_latent(dynamics, y0, t, tuple(rows), dtype).transpose(0, 1)  # (P, F, K, d)
    else:
        stacked = _StackedDynamics([_in_dtype(h, dtype) for h in dynamics])
        kwargs = dict(rtol=lead.rtol, atol=lead.atol, method=lead.method, options=_solver_options(lead.method))
        if lead.adjoint and torch.is_grad_enabled():
            y = odeint_adjoint(stacked, y0, t, adjoint_params=stacked.theta(), **kwargs)
        else:
            y = odeint(stacked, y0, t, **kwargs)
    return [y[:, f, :k] for f, k in enumerate(rows)]


# -- one flow --------------------------------------------------------------------------------------------


class _TrainCache(NamedTuple):
    """One flow's state at its last training re-solve (``update_every`` > 1), reused until the next one."""

    y0: Tensor  # (k, d) b(0) as it was
    dynamics: "FloaterDynamics"  # a frozen copy of θ as it was
    delta: Optional[Tensor] = None  # (P, k, d) Δb(t_i) solved from those, without gradient (see _canonical)

    def to(self, like: Tensor) -> "_TrainCache":
        delta = self.delta.to(like.device) if self.delta is not None else None  # stays in the solve's dtype
        return _TrainCache(self.y0.to(like), self.dynamics.to(like), delta)


def _frozen_copy(dynamics: FloaterDynamics) -> FloaterDynamics:
    frozen = copy.deepcopy(dynamics)
    for p in frozen.parameters():
        p.requires_grad_(False)
        p.grad = None
    return frozen


class FloaterFlow(nn.Module):
    """One flow θ that moves k bias vectors along the position grid, with its solver settings.

    ``flow(initial, num_positions)`` takes the k initial values b_j(0) (each (d,); the projections' bias
    parameters) and returns Δb of shape (num_positions, k, d) with ``b_j(t_i) = b_j(0) + Δb[i, j]``, solving
    this flow alone (with gradient when gradients are on; nothing cached). A model solves and caches its flows
    together through ``FloaterPositions``; the flow keeps its part of the training cache (``train_cache``),
    which its state dict carries (``_extra_state``) so that a resumed run continues exactly.
    """

    def __init__(
        self,
        dim: int,
        hidden: Optional[int] = None,
        dt: float = 0.1,
        method: str = "rk4",
        rtol: float = 1e-4,
        atol: float = 1e-6,
        adjoint: bool = False,
        update_every: int = 1,
    ):
        super().__init__()
        hidden = hidden if hidden is not None else dim
        check_flow_settings(dt=dt, method=method, rtol=rtol, atol=atol, update_every=update_every, hidden=hidden)
        self.dynamics = FloaterDynamics(dim, hidden)
        if update_every > 1:
            # θ sits out the cached updates (pause_theta: no gradient, not even a zero one); an optimizer that
            # keeps flat parameter buffers (fairseq's FP16Optimizer) must then not step it, as fp32 optimizers
            # skip a parameter whose grad is None.
            for p in self.dynamics.parameters():
                p.may_skip_update = True
        self.dt, self.method, self.rtol, self.atol = float(dt), method, float(rtol), float(atol)
        self.adjoint, self.update_every = bool(adjoint), int(update_every)
        # rk4 by direct backprop solves in latent coordinates z = W1 p when that is cheaper (hidden ≤ 2d).
        self.latent = method == "rk4" and not self.adjoint and hidden <= 2 * dim
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        self._num_updates = 0  # host copy of the buffer (no device sync per forward)
        self._generation = 0  # bumped when train()/eval() changes the mode; part of the eval cache key
        self._epoch = 0  # bumped by invalidate_cache() and load_state_dict: drops the eval cache
        self.train_cache: Optional[_TrainCache] = None
        self._paused: List[nn.Parameter] = []  # θ taken out of autograd for cached updates (see pause_theta)
        self.num_solves = 0  # solver calls that included this flow (diagnostics)

    def extra_repr(self) -> str:
        return (f"dt={self.dt}, method={self.method}, rtol={self.rtol}, atol={self.atol}, "
                f"adjoint={self.adjoint}, update_every={self.update_every}")

    def settings(self) -> tuple:
        return (self.dt, self.method, self.rtol, self.atol, self.adjoint, self.update_every, self.latent)

    # -- fairseq / nn.Module hooks ------------------------------------------------------------------
    def set_num_updates(self, num_updates: int):
        """Called by fairseq's trainer after every update (through the model's set_num_updates)."""
        self._num_updates = int(num_updates)
        self.num_updates.fill_(self._num_updates)

    def train(self, mode: bool = True):
        # A mode change, not every call: fairseq's validation calls eval() before every batch, and one solve
        # per parameter version is enough. Every training update lies between a train() and the next eval().
        if bool(mode) != self.training:
            self._generation += 1
        self.resume_theta()
        return super().train(mode)

    def pause_theta(self):
        """A cached update: θ takes no part, so it gets no gradient, not even a zero one (DDP backends fill
        in zeros for parameters that require grad and have none, and Adam's momentum would then move θ).
        With update_every > 1 θ's parameters carry ``may_skip_update = True`` (set in ``__init__``): an
        optimizer with flat parameter buffers (fairseq's FP16Optimizer) keeps them apart and does not step
        them on such updates, as fp32 optimizers skip a parameter whose grad is None."""
        if not self._paused:
            self._paused = [p for p in self.dynamics.parameters() if p.requires_grad]
            for p in self._paused:
                p.requires_grad_(False)

    def resume_theta(self):
        """Undo pause_theta (parameters frozen by the user stay frozen)."""
        for p in self._paused:
            p.requires_grad_(True)
        self._paused = []

    def get_extra_state(self) -> Tensor:
        """The training cache's state, [b(0) at the re-solve; θ at the re-solve] flattened into one tensor
        (empty without one): the cached Δb is a function of it alone, so a resumed run rebuilds exactly the
        biases the interrupted run was reusing."""
        cache = self.train_cache
        if cache is None:
            return self.num_updates.new_zeros(0, dtype=self.dynamics.fc1.weight.dtype)
        return torch.cat([cache.y0.reshape(-1)] + [p.reshape(-1) for p in cache.dynamics.parameters()])

    def set_extra_state(self, state):
        self.train_cache = None
        if isinstance(state, Tensor) and state.numel() > 0:
            dynamics = _frozen_copy(self.dynamics)
            theta = list(dynamics.parameters())
            y0_size = state.numel() - sum(p.numel() for p in theta)
            y0, *flat = state.split([y0_size] + [p.numel() for p in theta])
            with torch.no_grad():
                for p, values in zip(theta, flat):
                    p.copy_(values.view_as(p))
            self.train_cache = _TrainCache(y0.view(-1, self.dynamics.fc2.out_features).clone(), dynamics)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict.setdefault(prefix + "_extra_state", None)  # checkpoints saved before the cache travelled
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._num_updates = int(self.num_updates)
        self._epoch += 1  # the eval cache goes; the training cache came with the state dict

    def invalidate_cache(self):
        """Drop every cached solve of this flow (e.g. after editing its weights by hand through ``.data``)."""
        self._epoch += 1
        self.train_cache = None

    # -- the biases --------------------------------------------------------------------------------
    def forward(self, initial: Sequence[Tensor], num_positions: int) -> Tensor:
        b0 = torch.stack(list(initial))  # (k, d): the state, every driven projection's b(0)
        y = solve_checked([self], [b0], max(int(num_positions), 1))[0]
        return y - b0.to(y.dtype)

    def describe_failure(self, first_index: int, num_points: int, what: str) -> str:
        steps = f", step Δ/{STEPS_PER_DT}" if self.method in FIXED_GRID_SOLVERS else ""
        return (f"FLOATER ODE solve failed ({what}) for positions {first_index}..{first_index + num_points - 1}"
                f" with --floater-method {self.method} --floater-dt {self.dt}{steps}"
                f" --floater-rtol {self.rtol} --floater-atol {self.atol}"
                f"{' --floater-adjoint' if self.adjoint else ''}; try a smaller --floater-dt, another"
                f" --floater-method, or a lower learning rate for the flow")


def solve_checked(flows: Sequence[FloaterFlow], initial: Sequence[Tensor], num_points: int,
                  first_index: int = 0, dynamics: Optional[Sequence[FloaterDynamics]] = None) -> List[Tensor]:
    """``solve_flows`` that counts the solve and raises ``FloaterSolverError`` for failures and non-finite values."""
    for flow in flows:
        flow.num_solves += 1
    try:
        ys = solve_flows(flows, initial, num_points, first_index, dynamics)
    except AssertionError as err:  # torchdiffeq reports e.g. "underflow in dt" this way
        raise FloaterSolverError(flows[0].describe_failure(first_index, num_points, str(err))) from err
    if not bool(torch.stack([torch.isfinite(y).all() for y in ys]).all()):
        raise FloaterSolverError(flows[0].describe_failure(first_index, num_points, "non-finite values"))
    return ys


# -- a model's flows -------------------------------------------------------------------------------------


class _EvalCache(NamedTuple):
    key: tuple  # parameter versions, update counters, train()/eval() generations
    epochs: tuple  # the flows' _epoch counters when solved
    layout: tuple  # per flow: rows, bias shape, dtype, device
    y0: List[Tensor]  # per flow (k, d): b(0) it was solved from
    delta: List[Tensor]  # per flow (P, k, d): Δb(t_i)


class FloaterPositions:
    """A model's flows, each with the projections whose biases it drives, solved and cached together.

    ``biases(flow, n)`` returns that flow's Δb (n, k, d). Inside ``forward_pass(n)`` (one model forward,
    n = its longest sequence) the first request solves every flow, or takes them from a cache, and the
    other requests reuse that result; outside, every request does the same on its own. Two caches: the
    training one (``update_every`` > 1; kept by the flows, saved with them) and the eval one (here); eval
    never touches the training cache. A plain object, not a module: the flows and projections stay where
    they are in the module tree (parameter names).
    """

    def __init__(self):
        self.members: List[Tuple[FloaterFlow, List[nn.Module]]] = []
        self._eval_cache: Optional[_EvalCache] = None
        self._pass_depth = 0
        self._pass_length = 0
        self._pass_result: Optional[List[Tensor]] = None

    def add(self, flow: FloaterFlow, projections: Sequence[nn.Module]):
        if self.members and flow.settings() != self.members[0][0].settings():
            raise ValueError("flows solved together must share their solver settings")
        self.members.append((flow, list(projections)))
        self._eval_cache = None

    @classmethod
    def joined(cls, *groups: "FloaterPositions") -> "FloaterPositions":
        joint = cls()
        for group in groups:
            for flow, projections in group.members:
                joint.add(flow, projections)
        return joint

    @property
    def flows(self) -> List[FloaterFlow]:
        return [flow for flow, _ in self.members]

    @contextmanager
    def forward_pass(self, num_positions: int):
        """One forward: every flow solved once, for at least num_positions positions (nested passes join)."""
        self._pass_depth += 1
        if self._pass_depth == 1:
            self._pass_length, self._pass_result = int(num_positions), None
        try:
            yield self
        finally:
            self._pass_depth -= 1
            if self._pass_depth == 0:
                self._pass_length, self._pass_result = 0, None

    def biases(self, flow: FloaterFlow, num_positions: int) -> Tensor:
        """Δb of ``flow`` for the first num_positions grid points, (num_positions, k, d)."""
        num_positions = max(int(num_positions), 1)
        index = next(i for i, (member, _) in enumerate(self.members) if member is flow)
        if self._pass_depth == 0:
            return self._deltas(num_positions)[index][:num_positions]
        result = self._pass_result
        if result is None or result[index].size(0) < num_positions:
            result = self._pass_result = self._deltas(max(num_positions, self._pass_length))
        return result[index][:num_positions]

    def invalidate_cache(self):
        for flow in self.flows:
            flow.invalidate_cache()

    # -- solving and caching -------------------------------------------------------------------------
    def _deltas(self, num_positions: int) -> List[Tensor]:
        lead = self.members[0][0]
        if lead.training:
            return self._train_deltas(num_positions)
        return self._eval_deltas(num_positions)

    def _train_deltas(self, num_positions: int) -> List[Tensor]:
        flows = self.flows
        lead = flows[0]
        caches = self._train_caches() if lead.update_every > 1 else None
        if caches is None or lead._num_updates % lead.update_every == 0:
            for flow in flows:
                flow.resume_theta()
            b0 = self._initial()
            ys = solve_checked(flows, b0, num_positions)  # exact gradient to θ and b(0)
            if lead.update_every > 1:
                caches = [_TrainCache(b.detach().clone(), _frozen_copy(flow.dynamics)) for flow, b in zip(flows, b0)]
                self._canonical(caches, num_positions)  # now: the cached updates then do no solver work
            return [y - b.to(y.dtype) for y, b in zip(ys, b0)]
        for flow in flows:
            flow.pause_theta()
        return self._canonical(caches, num_positions)

    def _canonical(self, caches: List[_TrainCache], num_positions: int) -> List[Tensor]:
        """The cached Δb (at least num_positions rows), without gradient, from the re-solve's b(0) and θ alone:
        solved for MIN_CACHE positions, then doubled by integrating from the last row as longer batches need.
        The same rows whatever the lengths of the batches before, so a resumed run, or another process that
        saw other batches, reuses exactly the same biases. Stored in the flows' ``train_cache``."""
        flows = self.flows
        delta = [c.delta for c in caches]
        if delta[0] is None:
            with torch.no_grad():
                ys = solve_checked(flows, [c.y0 for c in caches], MIN_CACHE, dynamics=[c.dynamics for c in caches])
            delta = [y - c.y0.to(y.dtype) for y, c in zip(ys, caches)]
        while delta[0].size(0) < num_positions:
            delta = self._extended([c.y0 for c in caches], delta, 2 * delta[0].size(0),
                                   [c.dynamics for c in caches])
        if delta[0] is not caches[0].delta:
            for flow, cache, d in zip(flows, caches, delta):
                flow.train_cache = cache._replace(delta=d)
        return delta

    def _train_caches(self) -> Optional[List[_TrainCache]]:
        """The flows' training caches, on the biases' device and dtype; None unless every flow has one."""
        caches = []
        for flow, projections in self.members:
            cache, bias = flow.train_cache, projections[0].bias
            if cache is None or cache.y0.shape != (len(projections), bias.size(0)):
                return None
            if cache.y0.device != bias.device or cache.y0.dtype != bias.dtype:
                cache = flow.train_cache = cache.to(bias)
            caches.append(cache)
        return caches

    def _eval_deltas(self, num_positions: int) -> List[Tensor]:
        cache, key = self._eval_cache, self._key()
        if (cache is None or cache.epochs != self._epochs() or cache.layout != self._layout()
                or cache.key != key):
            with torch.no_grad():
                b0 = self._initial()
                ys = solve_checked(self.flows, b0, _cache_size(num_positions))
            cache = self._eval_cache = _EvalCache(key, self._epochs(), self._layout(), b0,
                                                  [y - b.to(y.dtype) for y, b in zip(ys, b0)])
        delta = self._extended(cache.y0, cache.delta, num_positions)
        if delta is not cache.delta:
            self._eval_cache = cache._replace(delta=delta)
        return delta

    @torch.no_grad()
    def _extended(self, y0: List[Tensor], delta: List[Tensor], num_positions: int,
                  dynamics: Optional[List[FloaterDynamics]] = None) -> List[Tensor]:
        """delta extended to at least num_positions rows (a power of two) by integrating from its last row."""
        have = delta[0].size(0)
        if have >= num_positions:
            return delta
        want = _cache_size(max(num_positions, 2 * have))
        last = [b.to(d.dtype) + d[-1] for b, d in zip(y0, delta)]  # b(t_{have−1}), in the solve's dtype
        more = solve_checked(self.flows, last, want - have + 1, first_index=have - 1, dynamics=dynamics)
        return [torch.cat([d, m[1:] - b.to(m.dtype)]) for d, m, b in zip(delta, more, y0)]

    def _initial(self) -> List[Tensor]:
        """Per flow (k, d): b(0) of every projection it drives (the solve's initial state)."""
        return [torch.stack([p.bias for p in projections]) for _, projections in self.members]

    def _layout(self) -> tuple:
        return tuple((len(projections), projections[0].bias.shape, projections[0].bias.dtype,
                      projections[0].bias.device) for _, projections in self.members)

    def _epochs(self) -> tuple:
        return tuple(flow._epoch for flow in self.flows)

    def _key(self) -> tuple:
        key = []
        for flow, projections in self.members:
            h = flow.dynamics  # its four parameters, read directly (parameters() walks the module tree)
            tensors = [q.bias for q in projections] + [h.fc1.weight, h.fc1.bias, h.fc2.weight, h.fc2.bias]
            key += [flow._generation, flow._num_updates] + [(p.data_ptr(), p._version) for p in tensors]
        return tuple(key)


def _cache_size(n: int) -> int:
    """The next power of two ≥ n (at least MIN_CACHE): decoding a long output extends the cache log(n) times."""
    return max(MIN_CACHE, 1 << (n - 1).bit_length())


def check_flow_settings(dt, method, rtol, atol, update_every, hidden):
    """Raise ValueError (one line, naming the flag) for settings FloaterFlow cannot use."""
    if not (isinstance(dt, (int, float)) and dt > 0 and dt != float("inf")):
        raise ValueError(f"--floater-dt must be a finite number > 0, got {dt!r}")
    if method not in SOLVER_NAMES:
        raise ValueError(f"--floater-method must be one of {', '.join(SOLVER_NAMES)}; got {method!r}")
    for flag, value in (("--floater-rtol", rtol), ("--floater-atol", atol)):
        if not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{flag} must be > 0, got {value!r}")
    if not (isinstance(update_every, int) and update_every >= 1):
        raise ValueError(f"--floater-update-every must be an integer >= 1, got {update_every!r}")
    if not (isinstance(hidden, int) and hidden >= 1):
        raise ValueError(f"--floater-hidden must be an integer >= 1, got {hidden!r}")


class PositionBiasedLinear(nn.Linear):
    """A Linear map whose bias depends on the token's position: y_i = W x_i + b(0) + Δb(t_i) (eq. 12).

    ``self.bias`` is b(0). Inside ``bind_position_biases`` or ``bind_biases``, ``position_binding`` is either
    (Δb rows (P, out_features), the row of each input token (T, B) or (T, 1), or a function returning
    them, called when the projection runs) or the whole bias b(0) + Δb(t) of one position shared by every
    token (a step of incremental decoding); otherwise None and the module is an ordinary Linear.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=True)
        self.position_binding = None

    def forward(self, x: Tensor) -> Tensor:  # x: (T, B, in_features)
        binding = self.position_binding
        if binding is None:
            return super().forward(x)
        if isinstance(binding, Tensor):
            return F.linear(x, self.weight, binding.to(self.weight.dtype))
        y = super().forward(x)
        delta, rows = binding
        if callable(rows):
            rows = rows()
        if rows.size(1) not in (1, y.size(1)):
            # Beam search: encoder-decoder attention projects one copy of the encoder states per
            # sentence (MultiheadAttention.beam_size), the first of each group of hypotheses.
            rows = rows.view(rows.size(0), y.size(1), -1)[:, :, 0]
        return y + delta[rows].to(y.dtype)  # (T, B, out) + (T, B|1, out); Δb is in the solve's dtype


class PositionBiasedMultiheadAttention(MultiheadAttention):
    """fairseq's MultiheadAttention whose q/k/v projections are ``PositionBiasedLinear``: same parameters, same
    interface. fairseq's fused path (``F.multi_head_attention_forward``) takes one bias vector per projection, so
    it cannot apply per-position biases; the biases change q, k and v only, not the attention, so when fairseq
    would not need the weights this class projects q, k, v itself and calls ``F.scaled_dot_product_attention``
    (torch's fused kernels, as the Transformer's fused path does) instead of fairseq's Python path, which
    materialises the (T, S) scores per head. Everything else (incremental decoding, attention weights) is
    fairseq's own forward."""

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None, incremental_state=None, need_weights: bool = True,
                static_kv: bool = False, attn_mask: Optional[Tensor] = None, before_softmax: bool = False,
                need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        # static_kv only decides what an incremental state keeps; beam_size > 1 shares encoder states per beam.
        fused = (incremental_state is None and not (need_weights or need_head_weights or before_softmax)
                 and key is not None and self.bias_k is None and not self.add_zero_attn and not self.onnx_trace
                 and self.beam_size == 1 and query.device.type != "xla")
        if not fused:
            return super().forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                   static_kv, attn_mask, before_softmax, need_head_weights)
        if self.self_attention:
            key = value = query
        elif self.encoder_decoder_attention:
            value = key  # as fairseq: keys and values are both projections of the encoder states
        tgt_len, bsz, embed_dim = query.size()
        src_len = key.size(0)
        q = self.q_proj(query).view(tgt_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        k = self.k_proj(key).view(src_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        v = self.v_proj(value).view(src_len, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)
        mask = _additive_mask(attn_mask, key_padding_mask, bsz, self.num_heads, tgt_len, src_len, q.dtype)
        dropout_p = self.dropout_module.p if self.training or self.dropout_module.apply_during_inference else 0.0
        # (B, H, T, d_z); the scale is fairseq's self.scaling, d_z^-1/2, SDPA's default
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)), None


def _additive_mask(attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], bsz: int, heads: int,
                   tgt_len: int, src_len: int, dtype: torch.dtype) -> Optional[Tensor]:
    """fairseq's two masks as one additive mask broadcastable to (B, H, T, S): attn_mask (T, S) or (B·H, T, S),
    added (or −inf where True, if bool); key_padding_mask (B, S), −inf where True (non-zero)."""
    mask = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=dtype, device=attn_mask.device).masked_fill_(
                attn_mask, float("-inf"))
        mask = attn_mask.to(dtype)
        if mask.dim() == 3:
            mask = mask.view(bsz, heads, tgt_len, src_len)
    if key_padding_mask is not None:
        padding = torch.zeros(bsz, 1, 1, src_len, dtype=dtype, device=key_padding_mask.device).masked_fill_(
            key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
        mask = padding if mask is None else padding + mask
    return mask


def enable_position_biases(attention: MultiheadAttention, names=("q_proj", "k_proj", "v_proj")) -> nn.Module:
    """Give a fairseq MultiheadAttention position-dependent q/k/v biases (same parameters, same names).

    The module built by fairseq's own ``build_*_attention`` hook becomes a ``PositionBiasedMultiheadAttention``
    (a subclass that adds no state, only its forward), so every constructor option stays fairseq's."""
    if type(attention) is not MultiheadAttention:
        raise TypeError(f"FLOATER biases need fairseq's MultiheadAttention, got {type(attention).__name__}")
    for name in names:
        old = getattr(attention, name)
        new = PositionBiasedLinear(old.in_features, old.out_features)
        new.weight, new.bias = old.weight, old.bias
        setattr(attention, name, new)
    attention.__class__ = PositionBiasedMultiheadAttention
    # fairseq's own path then never takes F.multi_head_attention_forward (one bias vector per projection):
    # this flag makes it call q_proj/k_proj/v_proj itself. It only skips a shape assertion.
    attention._set_skip_embed_dim_check()
    return attention


def bind_position_biases(projections: List[PositionBiasedLinear], delta: Tensor, rows):
    """For one forward, projection j adds Δb[:, j] at the row of each token. delta: (P, k, d).

    rows: (T, B) or (T, 1) grid rows, or a function returning them (called only if a projection runs).
    """
    return _bound(projections, [(delta_j, rows) for delta_j in delta.unbind(1)])


def bind_biases(projections: List[PositionBiasedLinear], biases: Tensor):
    """For one forward, projection j's whole bias is biases[j] for every token (k, d): one decoding step."""
    return _bound(projections, biases.unbind(0))


@contextmanager
def _bound(projections: List[PositionBiasedLinear], bindings):
    """Each projection's ``position_binding`` set for the ``with`` block, then None again."""
    # object.__setattr__: nn.Module's own __setattr__ costs microseconds per call, every decoding step.
    for proj, binding in zip(projections, bindings):
        object.__setattr__(proj, "position_binding", binding)
    try:
        yield
    finally:
        for proj in projections:
            object.__setattr__(proj, "position_binding", None)


def token_rows(tokens: Tensor, padding_idx: int) -> Tensor:
    """(B, T) tokens → (T, B) grid row of each token: its index among the sentence's non-padding tokens
    (fairseq's make_positions − padding_idx − 1, so left padding does not shift positions); 0 for pads."""
    return rows_from_padding_mask(tokens.eq(padding_idx))


def rows_from_padding_mask(padding_mask: Tensor) -> Tensor:
    """(B, T) padding mask → (T, B) grid rows, as ``token_rows``."""
    keep = (~padding_mask).long()
    return ((keep.cumsum(dim=1) * keep) - 1).clamp(min=0).t()
