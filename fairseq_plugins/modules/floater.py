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
paper's "526.3K" (Table 6).

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

Mapping to code
---------------
- ``FloaterDynamics.forward(t, y)``       h(τ, p; θ), torchdiffeq style.
- ``solve_on_grid``                       p(t_i) for a run of grid points, one torchdiffeq call. Fixed-grid
  solvers take ``STEPS_PER_DT`` = 5 equal steps per Δ (the paper's RK4 at Δ/5); adaptive ones use
  rtol/atol and interpolate at the t_i.
- ``FloaterFlow``                         one θ and the bias cache. Its state stacks the k initial
  values it drives, y(0) = [b_1(0); ...; b_k(0)] of shape (k, d), and one solve over t_0..t_{P-1}
  returns every block's biases at every position: the work is shared by the batch, the blocks and
  the sentences. It returns Δb(t_i) = b(t_i) − b(0), shape (P, k, d).
- ``PositionBiasedLinear``                ``y_i = W x_i + b(0) + Δb(t_i)``; ``enable_position_biases``
  gives a fairseq ``MultiheadAttention`` such q/k/v projections, ``bind_position_biases`` hands them a
  flow's output for one forward.

Cost and caching (paper §4.4 says one solve costs about 100 forward+backward passes of h)
------------------------------------------------------------------------------------------
- Training, ``update_every = 1``: one solve with gradient per flow per forward: the exact gradient.
- Training, ``update_every = N > 1`` (the paper's cost trick): the flow re-solves with gradient on updates
  whose counter is a multiple of N (and on the first forward after building or loading); on the other
  updates it reuses the cached Δb(t_i) detached from the graph, so the bias is ``b(0) + sg[Δb(t_i)]``:
  b(0) and everything else still get their exact gradient through the first term, θ gets none
  (its ``.grad`` stays unset; an optimizer with momentum may still move it; under DDP pass
  --find-unused-parameters). The update counter is the ``num_updates`` buffer, fed by fairseq's
  ``set_num_updates`` (the index of the update about to run) and saved in checkpoints, so the schedule
  survives a resume.
- Eval and inference: Δb is solved once per parameter version (without gradient: eval mode never
  back-propagates into θ) and reused; incremental decoding then costs no ODE work at all. The cache key holds the parameters' ``data_ptr`` and
  ``_version`` counters, the update counter and a counter bumped by ``train()``/``eval()``;
  ``load_state_dict`` drops the cache. (fairseq's Adam updates weights through ``p.data``, which does not
  bump ``_version``: the trainer's ``set_num_updates`` and ``train()`` calls cover that. After editing
  weights by hand through ``.data`` call ``invalidate_cache()``.)
- Any length: a sequence longer than the cache extends it by integrating from the last cached grid
  point. For fixed-grid solvers the steps are the same as one solve from 0, so the values are the
  same (up to float rounding of the step times); adaptive solvers restart their step-size control at
  the old end point, so the extension differs from a single solve by up to the solver tolerance.
- A non-finite solution raises ``FloaterSolverError`` naming the solver settings.

The authors' code used Δ = 0.01 (the paper, Appendix B, states Δ = 0.1, the default here), fixed-step RK4
at Δ/5, the adjoint method and a bias cache refreshed every 400 forwards.
"""

from contextlib import contextmanager
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
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
    index = torch.arange(first_index, first_index + num_points, dtype=torch.float64, device=y0.device)
    t = index * dt
    options = {}
    if method in FIXED_GRID_SOLVERS:
        options["grid_constructor"] = lambda func, y, times: _subdivide(times, STEPS_PER_DT)
    kwargs = dict(rtol=rtol, atol=atol, method=method, options=options)
    if adjoint:
        return odeint_adjoint(dynamics, y0, t, adjoint_params=tuple(dynamics.parameters()), **kwargs)
    return odeint(dynamics, y0, t, **kwargs)


class _Cache(NamedTuple):
    key: tuple
    y0: Tensor  # (k, d) the initial values the cached deltas were solved from
    delta: Tensor  # (P, k, d) Δb(t_i) = b(t_i) − b(0), detached


class FloaterFlow(nn.Module):
    """One shared flow θ that moves k bias vectors along the position grid, with its cache.

    ``flow(initial, num_positions)`` takes the k initial values b_j(0) (each (d,); the projections'
    bias parameters) and returns Δb of shape (P, k, d), P ≥ num_positions, with
    ``b_j(t_i) = b_j(0) + Δb[i, j]``. See the module docstring for when it solves and what gets gradient.
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
        check_flow_settings(dt=dt, method=method, rtol=rtol, atol=atol, update_every=update_every,
                            hidden=hidden if hidden is not None else dim)
        self.dynamics = FloaterDynamics(dim, hidden)
        self.dt, self.method, self.rtol, self.atol = float(dt), method, float(rtol), float(atol)
        self.adjoint, self.update_every = bool(adjoint), int(update_every)
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        self._num_updates = 0  # host copy of the buffer (no device sync per forward)
        self._generation = 0  # bumped by train()/eval(); part of the eval cache key
        self._cache: Optional[_Cache] = None
        self.num_solves = 0  # solver calls so far (diagnostics)

    def extra_repr(self) -> str:
        return (f"dt={self.dt}, method={self.method}, rtol={self.rtol}, atol={self.atol}, "
                f"adjoint={self.adjoint}, update_every={self.update_every}")

    # -- fairseq / nn.Module hooks ------------------------------------------------------------------
    def set_num_updates(self, num_updates: int):
        """Called by fairseq's trainer after every update (through the model's set_num_updates)."""
        self._num_updates = int(num_updates)
        self.num_updates.fill_(self._num_updates)

    def train(self, mode: bool = True):
        self._generation += 1
        return super().train(mode)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._num_updates = int(self.num_updates)
        self.invalidate_cache()

    def invalidate_cache(self):
        self._cache = None

    # -- the biases --------------------------------------------------------------------------------
    def forward(self, initial: Sequence[Tensor], num_positions: int) -> Tensor:
        b0 = torch.stack(list(initial))  # (k, d): the state, every driven projection's b(0)
        num_positions = max(int(num_positions), 1)
        cache = self._cache
        compatible = (cache is not None and cache.y0.shape == b0.shape
                      and cache.y0.dtype == b0.dtype and cache.y0.device == b0.device)
        if self.training:
            if (not compatible or self.update_every == 1
                    or self._num_updates % self.update_every == 0):
                b = self._solve(b0, num_positions)  # exact gradient to θ and b(0)
                delta = b - b0
                self._cache = _Cache(self._key(initial), b0.detach(), delta.detach())
                return delta
        else:
            key = self._key(initial)
            if not compatible or cache.key != key:
                with torch.no_grad():
                    b0_const = b0.detach()
                    b = self._solve(b0_const, _cache_size(num_positions))
                    self._cache = _Cache(key, b0_const, b - b0_const)
        self._extend_cache(num_positions)
        return self._cache.delta[:num_positions]

    def _key(self, initial: Sequence[Tensor]) -> tuple:
        tensors = list(initial) + list(self.dynamics.parameters())
        return (self._generation, self._num_updates) + tuple((p.data_ptr(), p._version) for p in tensors)

    @torch.no_grad()
    def _extend_cache(self, num_positions: int):
        cache = self._cache
        have = cache.delta.size(0)
        if have >= num_positions:
            return
        want = _cache_size(max(num_positions, 2 * have))
        last = cache.y0 + cache.delta[-1]  # b(t_{have−1})
        more = self._solve(last, want - have + 1, first_index=have - 1)[1:]
        self._cache = cache._replace(delta=torch.cat([cache.delta, more - cache.y0]))

    def _solve(self, y0: Tensor, num_points: int, first_index: int = 0) -> Tensor:
        self.num_solves += 1
        try:
            y = solve_on_grid(self.dynamics, y0, num_points, self.dt, self.method, self.rtol,
                              self.atol, self.adjoint, first_index)
        except AssertionError as err:  # torchdiffeq reports e.g. "underflow in dt" this way
            raise FloaterSolverError(self._describe(first_index, num_points, str(err))) from err
        if not bool(torch.isfinite(y).all()):
            raise FloaterSolverError(self._describe(first_index, num_points, "non-finite values"))
        return y

    def _describe(self, first_index: int, num_points: int, what: str) -> str:
        steps = f", step Δ/{STEPS_PER_DT}" if self.method in FIXED_GRID_SOLVERS else ""
        return (f"FLOATER ODE solve failed ({what}) for positions {first_index}..{first_index + num_points - 1}"
                f" with --floater-method {self.method} --floater-dt {self.dt}{steps}"
                f" --floater-rtol {self.rtol} --floater-atol {self.atol}"
                f"{' --floater-adjoint' if self.adjoint else ''}; try a smaller --floater-dt, another"
                f" --floater-method, or a lower learning rate for the flow")


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

    ``self.bias`` is b(0). Between ``bind_position_biases`` enter and exit, ``position_delta`` holds
    Δb rows (P, out_features) and ``position_rows`` the row of each input token, (T, B) or (T, 1);
    otherwise the module is an ordinary Linear.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=True)
        self.position_delta: Optional[Tensor] = None
        self.position_rows: Optional[Tensor] = None

    def forward(self, x: Tensor) -> Tensor:  # x: (T, B, in_features)
        y = super().forward(x)
        if self.position_delta is None:
            return y
        rows = self.position_rows
        if rows.size(1) not in (1, y.size(1)):
            # Beam search: encoder-decoder attention projects one copy of the encoder states per
            # sentence (MultiheadAttention.beam_size), the first of each group of hypotheses.
            rows = rows.view(rows.size(0), y.size(1), -1)[:, :, 0]
        return y + self.position_delta[rows]  # (T, B, out) + (T, B|1, out)


def enable_position_biases(attention: nn.Module, names=("q_proj", "k_proj", "v_proj")) -> nn.Module:
    """Give a fairseq MultiheadAttention position-dependent q/k/v biases (same parameters, same names)."""
    for name in names:
        old = getattr(attention, name)
        new = PositionBiasedLinear(old.in_features, old.out_features)
        new.weight, new.bias = old.weight, old.bias
        setattr(attention, name, new)
    # The fused path (F.multi_head_attention_forward) takes one bias vector per projection; this flag
    # makes MultiheadAttention call q_proj/k_proj/v_proj itself. It only skips a shape assertion.
    attention._set_skip_embed_dim_check()
    return attention


@contextmanager
def bind_position_biases(projections: List[PositionBiasedLinear], delta: Tensor, rows: Tensor):
    """For one forward, projection j adds Δb[:, j] at the row of each token. delta: (P, k, d)."""
    for j, proj in enumerate(projections):
        proj.position_delta, proj.position_rows = delta[:, j], rows
    try:
        yield
    finally:
        for proj in projections:
            proj.position_delta = proj.position_rows = None


def token_rows(tokens: Tensor, padding_idx: int) -> Tensor:
    """(B, T) tokens → (T, B) grid row of each token: its index among the sentence's non-padding tokens
    (fairseq's make_positions − padding_idx − 1, so left padding does not shift positions); 0 for pads."""
    return rows_from_padding_mask(tokens.eq(padding_idx))


def rows_from_padding_mask(padding_mask: Tensor) -> Tensor:
    """(B, T) padding mask → (T, B) grid rows, as ``token_rows``."""
    keep = (~padding_mask).long()
    return ((keep.cumsum(dim=1) * keep) - 1).clamp(min=0).t()
