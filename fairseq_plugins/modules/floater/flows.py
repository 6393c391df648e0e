"""FLOATER's flows and their solve.

The flows and their solve (``positions.py``: a model's flows solved and cached together); what a stack's
projections add is bound in ``scheme.py``, and the package docstring (``__init__.py``) says which file holds the
rest. A model has three flows, each with its own θ
(encoder; decoder self-attention q/k/v and cross-attention q; cross-attention k/v). A flow's state stacks the k
initial values it drives, y(0) = [b_1(0); ...; b_k(0)] (k, d): one solve over the grid t_i = i·Δ, i = 0..P−1
(P: the forward's longest sequence) gives every block's bias at every position, Δb(t_i) = y(t_i) − y(0), shared
by the batch, the blocks and the sentences. How the solve runs, what is cached, when it is solved again, and how
the authors' code differs: docs/floater_solver.md ("The flows").

Mapping to code
---------------
- ``solve_flows``                         several flows' y(t_i) in one solver call (what the model uses): their
  states padded with zero rows to the largest k and stacked (F, K, d); ``rk4`` without ``--floater-adjoint`` in
  latent coordinates (``rk4.solve_latent``), the other fixed-grid solvers and the adjoint on h itself
  (``dynamics.solve_stacked``), adaptive solvers one call per flow (``dynamics.solve_on_grid``).
- ``solve_checked``                       ``solve_flows``, counted; failures raise ``FloaterSolverError``.
- ``FloaterFlow``                         one θ with the solver settings and the update counter; calling it
  solves that flow alone (no cache). It returns Δb(t_i) = b(t_i) − b(0), shape (P, k, d).
- ``_TrainCache``                         one flow's part of the training cache (kept by the flow, saved in its
  state dict); ``positions.py`` holds what solves a model's flows together and caches them.
"""

import copy
from typing import List, NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .dynamics import (
    DEFAULT_SETTINGS,
    FloaterDynamics,
    FloaterSettings,
    FloaterSolverError,
    in_dtype,
    solve_dtype,
    solve_on_grid,
    solve_stacked,
)
from .rk4 import solve_latent

MIN_CACHE = 16  # eval caches hold at least this many positions and grow by doubling


def solve_flows(
    flows: Sequence["FloaterFlow"], initial: Sequence[Tensor], num_points: int, first_index: int = 0,
    dynamics: Optional[Sequence[FloaterDynamics]] = None,
) -> List[Tensor]:
    """y(t_i), i = first_index .. first_index + num_points − 1, of several flows in one solver call.

    ``initial[f]`` (k_f, d) is flow f's state at t_first_index; returns one (num_points, k_f, d) per flow, in
    the solve's dtype (``solve_dtype``). The flows must share their solver settings; ``dynamics`` replaces
    their θ (a cached copy). See docs/floater_solver.md, "The solve" (adaptive solvers: one call per flow).
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
    settings = lead.settings
    if not settings.fixed_grid:
        return [solve_on_grid(in_dtype(h, dtype), y0, num_points, settings, first_index)
                for h, y0 in zip(dynamics, initial)]
    rows = [y.size(0) for y in initial]
    K = max(rows)
    y0 = torch.stack([F.pad(y, (0, 0, 0, K - k)) for y, k in zip(initial, rows)])  # (F, K, d)
    if lead.latent:
        y = solve_latent(dynamics, y0, settings.dt, first_index, num_points, dtype, settings.cuda_graph)
    else:
        y = solve_stacked([in_dtype(h, dtype) for h in dynamics], y0, num_points, settings, first_index)
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

    def __init__(self, dim: int, hidden: Optional[int] = None, settings: FloaterSettings = DEFAULT_SETTINGS,
                 init: str = "zero"):
        super().__init__()
        hidden = hidden if hidden is not None else dim
        if not isinstance(settings, FloaterSettings):
            raise TypeError(f"FloaterFlow takes its solver settings as a FloaterSettings, "
                            f"got {type(settings).__name__}")
        self.settings = settings
        self.dynamics = FloaterDynamics(dim, hidden, init)
        if settings.update_every > 1:
            # θ sits out the cached updates (pause_theta: no gradient, not even a zero one); an optimizer that
            # keeps flat parameter buffers (fairseq's FP16Optimizer) must then not step it, as fp32 optimizers
            # skip a parameter whose grad is None.
            for p in self.dynamics.parameters():
                p.may_skip_update = True
        # rk4 by direct backprop solves in latent coordinates z = W1 p when that is cheaper (hidden ≤ 2d).
        self.latent = settings.method == "rk4" and not settings.adjoint and hidden <= 2 * dim
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        self._num_updates = 0  # host copy of the buffer (no device sync per forward)
        self._sets = 0  # set_num_updates calls: the model counts its own updates only between them (update_count.py)
        self._generation = 0  # bumped when train()/eval() changes the mode; part of the eval cache key
        self._epoch = 0  # bumped by invalidate_cache() and load_state_dict: drops the eval cache
        self.train_cache: Optional[_TrainCache] = None
        self._paused: List[nn.Parameter] = []  # θ taken out of autograd for cached updates (see pause_theta)
        self.num_solves = 0  # solver calls that included this flow (diagnostics)

    def extra_repr(self) -> str:
        s = self.settings
        return (f"dt={s.dt}, method={s.method}, rtol={s.rtol}, atol={s.atol}, adjoint={s.adjoint}, "
                f"update_every={s.update_every}")

    # -- fairseq / nn.Module hooks ------------------------------------------------------------------
    def set_num_updates(self, num_updates: int):
        """The number of the update about to run; fairseq sets it before every training forward (the task's
        train_step, through the model's set_num_updates). A training loop that never calls it gets the model's own
        count of its optimizer steps (``update_count.py``)."""
        self._sets += 1
        self._num_updates = int(num_updates)
        self.num_updates.fill_(self._num_updates)

    def advance_update(self):
        """One more update, counted by the model itself (``update_count.py``), not set by a trainer."""
        self._num_updates += 1
        self.num_updates.fill_(self._num_updates)

    def train(self, mode: bool = True):
        # A mode change, not every call: fairseq's validation calls eval() before every batch, and one solve
        # per parameter version is enough. Every training update lies between a train() and the next eval().
        if bool(mode) != self.training:
            self._generation += 1
        self.resume_theta()
        return super().train(mode)

    def pause_theta(self, initial_values: Sequence[Tensor] = ()):
        """A cached update: θ takes no part, so it gets no gradient, not even a zero one (DDP backends fill
        in zeros for parameters that require grad and have none, and Adam's momentum would then move θ).
        ``initial_values``: b(0) parameters that sit out too (``cache_whole_bias``; they carry
        ``may_skip_update`` from ``Floater.attach``).
        With update_every > 1 θ's parameters carry ``may_skip_update = True`` (set in ``__init__``): an
        optimizer with flat parameter buffers (fairseq's FP16Optimizer) keeps them apart and does not step
        them on such updates, as fp32 optimizers skip a parameter whose grad is None."""
        if not self._paused:
            self._paused = [p for p in (*self.dynamics.parameters(), *initial_values) if p.requires_grad]
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
        return (f"FLOATER ODE solve failed ({what}) for positions {first_index}..{first_index + num_points - 1}"
                f" with {self.settings.flags()}; try a smaller --floater-dt, another --floater-method, or a lower"
                f" learning rate for the flow")


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


def cache_size(n: int) -> int:
    """The next power of two ≥ n (at least MIN_CACHE): decoding a long output extends the cache log(n) times."""
    return max(MIN_CACHE, 1 << (n - 1).bit_length())


def describe_overflow(deltas, lengths, dtype: torch.dtype) -> str:
    """The message for non-finite attention output given each side's Δb (P, k, d): the first position whose
    |Δb| passes sqrt(max(dtype) / d), from where q·k can leave the dtype's range."""
    largest = max(((float(d.abs().max()), side, int(d.abs().flatten(1).max(1).values.argmax()))
                   for side, d in deltas), key=lambda t: t[0])
    overflows = []  # (first position past the limit, side, limit), per flow
    for side, delta in deltas:
        limit = (torch.finfo(dtype).max / delta.size(-1)) ** 0.5
        over = (delta.abs().flatten(1).max(1).values >= limit).nonzero()
        if len(over):
            overflows.append((int(over[0]), side, limit))
    if overflows:
        first, side, limit = min(overflows)
        fix = ("decode inputs up to {n} tokens (--max-source-positions {n} --skip-invalid-size-inputs-valid-test)"
               if side == "source" else "cap the output length below {n} tokens (--max-len-a 0 --max-len-b {n})")
        return (f"FLOATER position biases overflow the attention ({dtype}) while decoding a {side} of "
                f"{lengths[side]} tokens: |Δb| passes {limit:.3g} from {side} position {first} on "
                f"(up to {largest[0]:.3g} at {largest[1]} position {largest[2]}); {fix.format(n=first)}, "
                f"or train with a smaller --floater-dt")
    return (f"non-finite decoder output while decoding, with FLOATER's position biases in range (largest |Δb| "
            f"{largest[0]:.3g}, at {largest[1]} position {largest[2]}): not a position overflow; check the "
            f"checkpoint's weights and the precision (--fp16, --bf16)")
