"""FLOATER's model: the dynamics h, the solver settings, and torchdiffeq's solve of h (the reference).

Liu, Yu, Dhillon, Hsieh, ICML 2020 (arXiv 2003.09229). The flows and their caches are in ``flows.py``, the default
solve (RK4 in latent coordinates, hand-written backward) in ``rk4.py``, the position-biased projections in
``attention.py``; the scheme of ``position_transformer`` in ``scheme.py``. Why it is built so (the
re-parameterisation, the initialisation, the settings' default, why every solve runs in float32):
docs/floater_solver.md. The equations (paper eq. 8 and 12; position i ↦ t_i = i·Δ)::

    p(t) = p(s) + ∫_s^t h(τ, p(τ); θ) dτ
    h(τ, p; θ) = W2 [ relu(W1 [p; τ] + c1) ; τ ] + c2 = W2 u + w2 τ + c2,     u = relu(W1 p + w1 τ + c1)
    b_q^(n)(t) = b_q^(n)(0) + ∫_0^t h(τ, b_q^(n)(τ); θ) dτ,      q_i^(n) = W_q^(n) x_i + b_q^(n)(t_i)

θ is shared by the blocks a flow drives; b^(n)(0) are the projections' ordinary biases, so h ≡ 0 is the
sinusoidal Transformer (a new flow: W2 = c2 = 0).

Mapping to code
---------------
- ``FloaterDynamics.forward(t, y)``       h(τ, p; θ), torchdiffeq style: W1 [p; τ] + c1 = ``fc1``
  (d+1 → hidden), W2 [u; τ] + c2 = ``fc2`` (hidden+1 → d); w1, w2 are their last columns.
- ``FloaterSettings``                     the solver settings (the flags ``--floater-dt/-method/-rtol/-atol/
  -adjoint/-update-every/-cache-whole-bias/-cuda-graph/-shared-solve``), validated once.
- ``solve_on_grid``                       one dynamics' y(t_i) on the grid, one torchdiffeq call: the reference
  the tests compare the default solve with, and the solve of adaptive methods.
- ``solve_stacked``                       F flows' h on their stacked state (F, K, d), one torchdiffeq call:
  the other fixed-grid solvers and the adjoint.
- ``solve_dtype``, ``in_dtype``           every solve in float32 (float64 for a float64 model): θ cast to it
  differentiably.
"""

import dataclasses
import functools
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

# torchdiffeq's solvers (its private table, less scipy_solver; 0.2.5 is pinned in requirements.txt), written out
# so that importing the plugins does not import torchdiffeq, which imports scipy: about half a CPU second in every
# fairseq process, most of which never solve an ODE. A test checks both lists against torchdiffeq's table.
SOLVER_NAMES: Tuple[str, ...] = ("dopri8", "dopri5", "bosh3", "fehlberg2", "adaptive_heun", "euler", "midpoint",
                                 "heun2", "heun3", "rk4", "explicit_adams", "implicit_adams", "fixed_adams")
FIXED_GRID_SOLVERS = frozenset(("euler", "midpoint", "heun2", "heun3", "rk4", "explicit_adams", "implicit_adams",
                                "fixed_adams"))
STEPS_PER_DT = 5  # fixed-grid step Δ/5 (paper, Appendix B)
FLOW_INITS = ("zero", "xavier")  # W2 of a new flow: zero (h ≡ 0) or Xavier-normal (the authors' code)


class FloaterSolverError(FloatingPointError):
    """The ODE solve produced non-finite values or the solver gave up; the message names where and what helps."""

    one_line = True  # uncaught, it ends a fairseq command with its message alone (fairseq_plugins/__init__.py)


@dataclasses.dataclass(frozen=True)
class FloaterSettings:
    """The solver settings of a model's flows; the one place that defaults them (docs/floater_solver.md, "Solver
    settings"). Each field is the flag ``--floater-<field>``, whose values ``Floater``'s flags check (each alone
    when parsed or overridden, their combinations in ``Floater.validate``); this normalises their types."""

    dt: float = 0.1  # grid spacing Δ: position i is time t_i = i·Δ
    method: str = "rk4"  # torchdiffeq solver; fixed-grid ones take STEPS_PER_DT steps per Δ
    rtol: float = 1e-4  # adaptive solvers only
    atol: float = 1e-6
    adjoint: bool = False  # torchdiffeq's odeint_adjoint instead of backprop through the steps
    update_every: int = 1  # re-solve with gradient every N updates (1: the exact gradient every update)
    cache_whole_bias: bool = False  # cached updates reuse b(0) + Δb detached (b(0) too learns at re-solves only)
    cuda_graph: bool = False  # on CUDA, replay the default solve from captured CUDA graphs (opt-in)
    shared_solve: bool = False  # one solve per update, shared by its micro-batches (--update-freq; opt-in)

    def __post_init__(self):
        for name in ("dt", "rtol", "atol"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "adjoint", bool(self.adjoint))
        object.__setattr__(self, "cache_whole_bias", bool(self.cache_whole_bias))
        object.__setattr__(self, "cuda_graph", bool(self.cuda_graph))
        object.__setattr__(self, "shared_solve", bool(self.shared_solve))

    @classmethod
    def from_args(cls, args) -> "FloaterSettings":
        """From a namespace of fairseq args (``floater_dt``, ...; missing ones take the defaults)."""
        values = {f.name: getattr(args, "floater_" + f.name) for f in dataclasses.fields(cls)
                  if getattr(args, "floater_" + f.name, None) is not None}
        return _settings(cls, tuple(sorted(values.items())))

    @property
    def fixed_grid(self) -> bool:
        return self.method in FIXED_GRID_SOLVERS

    def flags(self) -> str:
        """The settings as command-line flags (for error messages)."""
        steps = f", step Δ/{STEPS_PER_DT}" if self.fixed_grid else ""
        return (f"--floater-method {self.method} --floater-dt {self.dt}{steps} --floater-rtol {self.rtol}"
                f" --floater-atol {self.atol}{' --floater-adjoint' if self.adjoint else ''}")


DEFAULT_SETTINGS = FloaterSettings()


@functools.lru_cache(maxsize=None)
def _settings(cls, items: tuple) -> FloaterSettings:
    """One checked FloaterSettings per distinct set of values: a model's flows share it."""
    return cls(**dict(items))


class FloaterDynamics(nn.Module):
    """h(τ, p; θ) = W2 [relu(W1 [p; τ] + c1); τ] + c2, applied to each row of a state (..., d)."""

    def __init__(self, dim: int, hidden: Optional[int] = None, init: str = "zero"):
        super().__init__()
        hidden = hidden or dim
        self.fc1 = nn.Linear(dim + 1, hidden)
        self.fc2 = nn.Linear(hidden + 1, dim)
        nn.init.xavier_normal_(self.fc1.weight)  # as in the authors' code
        nn.init.zeros_(self.fc1.bias)
        if init == "xavier":  # the authors' code: both layers alike
            nn.init.xavier_normal_(self.fc2.weight)
            nn.init.zeros_(self.fc2.bias)
        else:
            self.zero_output_()  # h ≡ 0 at initialisation: docs/floater_solver.md, "Initialisation"

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


def solve_on_grid(dynamics: nn.Module, y0: Tensor, num_points: int, settings: FloaterSettings = DEFAULT_SETTINGS,
                  first_index: int = 0) -> Tensor:
    """y(t_i) for i = first_index .. first_index + num_points − 1, t_i = i·Δ, given y(t_first_index) = y0.

    One torchdiffeq call for the whole run of grid points, in the dynamics' dtype; returns (num_points,
    *y0.shape).
    """
    if num_points == 1:
        return y0.unsqueeze(0)
    t = _grid_times(num_points, settings.dt, first_index, y0.device)
    kwargs = dict(rtol=settings.rtol, atol=settings.atol, method=settings.method,
                  options=_solver_options(settings.method))
    from torchdiffeq import odeint, odeint_adjoint  # here, not at import: see SOLVER_NAMES

    if settings.adjoint and torch.is_grad_enabled():
        return odeint_adjoint(dynamics, y0, t, adjoint_params=_theta(dynamics), **kwargs)
    return odeint(dynamics, y0, t, **kwargs)


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


def solve_stacked(dynamics: Sequence[nn.Module], y0: Tensor, num_points: int, settings: FloaterSettings,
                  first_index: int = 0) -> Tensor:
    """y(t_i) of F flows at once on their stacked state y0 (F, K, d), i = first_index .. first_index + num_points
    − 1: h itself integrated by torchdiffeq (a fixed-grid solver, or the adjoint), one call; (num_points, F, K, d).
    The dynamics are used as given (``in_dtype`` casts them to the solve's dtype)."""
    t = _grid_times(num_points, settings.dt, first_index, y0.device)
    stacked = _StackedDynamics(dynamics)
    kwargs = dict(rtol=settings.rtol, atol=settings.atol, method=settings.method,
                  options=_solver_options(settings.method))
    from torchdiffeq import odeint, odeint_adjoint  # here, not at import: see SOLVER_NAMES

    if settings.adjoint and torch.is_grad_enabled():
        return odeint_adjoint(stacked, y0, t, adjoint_params=stacked.theta(), **kwargs)
    return odeint(stacked, y0, t, **kwargs)


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


def in_dtype(dynamics: nn.Module, dtype: torch.dtype) -> nn.Module:
    """h with θ in `dtype`: the dynamics themselves when already so, else cast differentiably (``_CastDynamics``)."""
    if all(p.dtype == dtype for p in dynamics.parameters()):
        return dynamics
    return _CastDynamics(dynamics, dtype)


def _theta(dynamics: nn.Module) -> Tuple[Tensor, ...]:
    return tuple(dynamics.theta.values()) if isinstance(dynamics, _CastDynamics) else tuple(dynamics.parameters())

