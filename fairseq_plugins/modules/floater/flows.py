"""FLOATER's flows: one solve for all of a model's flows per forward, and its caches.

The flows, their solve and caches; what a stack's projections add is bound in ``scheme.py``, and the package
docstring (``__init__.py``) says which file holds the rest. A model has three flows, each with its own θ
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
- ``FloaterPositions``                    a model's flows with the projections each drives: one solve for
  all of them per forward (``forward_pass``), the training cache (b(0) + sg[Δb(t_i)] between the re-solves of
  ``update_every``) and the evaluation cache (once per parameter version; ``cache_size`` positions).
"""

import copy
from contextlib import contextmanager
from typing import List, NamedTuple, Optional, Sequence, Tuple

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
from .shared_solve import SharedSolve, check_pending

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
        self._pending: Optional[SharedSolve] = None  # the update's shared solve (--floater-shared-solve)

    def add(self, flow: FloaterFlow, projections: Sequence[nn.Module]):
        lead = self.members[0][0] if self.members else flow
        if (flow.settings, flow.latent) != (lead.settings, lead.latent):
            raise ValueError("flows solved together must share their solver settings")
        self.members.append((flow, projections))  # the caller's list: a scheme attaches its projections later
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
        every = lead.settings.update_every
        caches = self._train_caches() if every > 1 else None
        if caches is None or lead._num_updates % every == 0:
            for flow in flows:
                flow.resume_theta()
            b0 = self.initial_values()
            if self._shares():
                delta, solved = self._shared_deltas(b0, num_positions)
            else:
                ys, solved = solve_checked(flows, b0, num_positions), True  # exact gradient to θ and b(0)
                delta = [y - b.to(y.dtype) for y, b in zip(ys, b0)]
            if every > 1:
                if solved:
                    caches = [_TrainCache(b.detach().clone(), _frozen_copy(flow.dynamics)) for flow, b in zip(flows, b0)]
                else:  # a later micro-batch of the update's shared solve: the cache its first one made
                    caches = self._train_caches()
                self._canonical(caches, num_positions)  # now: the cached updates then do no solver work
            return delta
        whole = lead.settings.cache_whole_bias
        for flow, projections in self.members:
            flow.pause_theta([proj.bias for proj in projections] if whole else ())
        delta = self._canonical(caches, num_positions)
        if whole:  # the re-solve's b(0) in place of today's, which the projection adds (paused: no gradient)
            b0 = [b.detach() for b in self.initial_values()]
            delta = [(c.y0.to(d.dtype) - b.to(d.dtype)) + d for c, b, d in zip(caches, b0, delta)]
        return delta

    def _shares(self) -> bool:
        """This forward joins the update's shared solve (``--floater-shared-solve``, gradients on)."""
        return self.members[0][0].settings.shared_solve and torch.is_grad_enabled()

    def _shared_deltas(self, b0: List[Tensor], num_positions: int) -> Tuple[List[Tensor], bool]:
        """Δb from the update's shared solve (``shared_solve.py``): solved by its first forward, extended from its
        last row for a longer micro-batch; (Δb, whether a solve from position 0 ran)."""
        flows, lead = self.flows, self.members[0][0]
        pending = self._pending = check_pending(self._pending, lead._num_updates)
        solved = pending is None
        if solved:
            pending = self._pending = SharedSolve(lead._num_updates, [f.dynamics.parameters() for f in flows],
                                                  [q.bias for _, projections in self.members for q in projections])
            ys = solve_checked(flows, b0, num_positions)
            pending.add([y - b.to(y.dtype) for y, b in zip(ys, b0)])
        elif pending.rows < num_positions:
            have = pending.rows
            last = [b.to(d.dtype) + d for b, d in zip(b0, pending.last_rows())]  # b(t_{have−1}), with its graph
            more = solve_checked(flows, last, num_positions - have + 1, first_index=have - 1)
            pending.add([m[1:] - b.to(m.dtype) for m, b in zip(more, b0)])
        return pending.deltas(num_positions), solved

    def complete_gradients(self):
        """After the last micro-batch's backward of an update: θ's and b(0)'s gradient through the shared solve
        (``SharedSolve.complete``); nothing without one pending."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.complete()

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
                b0 = self.initial_values()
                ys = solve_checked(self.flows, b0, cache_size(num_positions))
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
        want = cache_size(max(num_positions, 2 * have))
        last = [b.to(d.dtype) + d[-1] for b, d in zip(y0, delta)]  # b(t_{have−1}), in the solve's dtype
        more = solve_checked(self.flows, last, want - have + 1, first_index=have - 1, dynamics=dynamics)
        return [torch.cat([d, m[1:] - b.to(m.dtype)]) for d, m, b in zip(delta, more, y0)]

    def initial_values(self) -> List[Tensor]:
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
