"""A model's flows solved and cached together (``flows.py``: one flow and the solve).

- ``FloaterPositions``  the model's flows, each with the projections whose biases it drives: one solve for all of
  them per forward (``forward_pass``), from the training or the evaluation side;
- ``_TrainingSolves``    training: the exact solve, or between the re-solves of ``update_every`` the cache
  b(0) + sg[Δb(t_i)] (kept by the flows, saved with them), or the update's shared solve (``shared_solve.py``);
- ``_EvalSolves``        evaluation: one solve per parameter version, ``cache_size`` positions, extended by
  integrating from its last row as longer inputs come.

docs/floater_solver.md ("The flows") says what is cached and when it is solved again.
"""

from contextlib import contextmanager
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from .dynamics import FloaterDynamics
from .flows import MIN_CACHE, FloaterFlow, _frozen_copy, _TrainCache, cache_size, solve_checked
from .shared_solve import SharedSolve, check_pending
from .update_count import UpdateCounter


class FloaterPositions:
    """A model's flows, each with the projections whose biases it drives, solved and cached together.

    ``biases(flow, n)`` returns that flow's Δb (n, k, d). Inside ``forward_pass(n)`` (one model forward,
    n = its longest sequence) the first request solves every flow, or takes them from a cache, and the
    other requests reuse that result; outside, every request does the same on its own. Two caches: the
    training one (``update_every`` > 1; kept by the flows, saved with them) and the eval one; eval never
    touches the training cache. A plain object, not a module: the flows and projections stay where they are in
    the module tree (parameter names).
    """

    def __init__(self):
        self.members: List[Tuple[FloaterFlow, List[nn.Module]]] = []
        self.training_solves = _TrainingSolves(self)
        self.eval_solves = _EvalSolves(self)
        self._pass_depth = 0
        self._pass_length = 0
        self._pass_result: Optional[List[Tensor]] = None
        self._pass_counted = False  # this forward's update counted (update_count: once per training forward)
        self.update_count = UpdateCounter(self)

    def add(self, flow: FloaterFlow, projections: Sequence[nn.Module]):
        lead = self.members[0][0] if self.members else flow
        if (flow.settings, flow.latent) != (lead.settings, lead.latent):
            raise ValueError("flows solved together must share their solver settings")
        self.members.append((flow, projections))  # the caller's list: a scheme attaches its projections later
        self.eval_solves.cache = None

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
            self._pass_length, self._pass_result, self._pass_counted = int(num_positions), None, False
        try:
            yield self
        finally:
            self._pass_depth -= 1
            if self._pass_depth == 0:
                self._pass_length, self._pass_result, self._pass_counted = 0, None, False

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

    def _deltas(self, num_positions: int) -> List[Tensor]:
        lead = self.members[0][0]
        if not lead.training:
            return self.eval_solves.deltas(num_positions)
        if lead.settings.update_every > 1 and not self._pass_counted:
            self.update_count.observe()  # before the schedule reads the counter: an update since the last forward?
            self._pass_counted = self._pass_depth > 0
        return self.training_solves.deltas(num_positions)

    def invalidate_cache(self):
        for flow in self.flows:
            flow.invalidate_cache()

    def complete_gradients(self):
        """After the last micro-batch's backward of an update: θ's and b(0)'s gradient through the shared solve
        (``SharedSolve.complete``); nothing without one pending."""
        self.training_solves.complete_gradients()

    def initial_values(self) -> List[Tensor]:
        """Per flow (k, d): b(0) of every projection it drives (the solve's initial state)."""
        return [torch.stack([p.bias for p in projections]) for _, projections in self.members]

    @torch.no_grad()
    def extended(self, y0: List[Tensor], delta: List[Tensor], num_positions: int,
                 dynamics: Optional[List[FloaterDynamics]] = None) -> List[Tensor]:
        """delta extended to at least num_positions rows (a power of two) by integrating from its last row."""
        have = delta[0].size(0)
        if have >= num_positions:
            return delta
        want = cache_size(max(num_positions, 2 * have))
        last = [b.to(d.dtype) + d[-1] for b, d in zip(y0, delta)]  # b(t_{have−1}), in the solve's dtype
        more = solve_checked(self.flows, last, want - have + 1, first_index=have - 1, dynamics=dynamics)
        return [torch.cat([d, m[1:] - b.to(m.dtype)]) for d, m, b in zip(delta, more, y0)]


class _TrainingSolves:
    """Δb for a training forward: the exact solve, the cached one between re-solves, or the shared one."""

    def __init__(self, positions: FloaterPositions):
        self.positions = positions
        self.pending: Optional[SharedSolve] = None  # the update's shared solve (--floater-shared-solve)

    def deltas(self, num_positions: int) -> List[Tensor]:
        positions = self.positions
        flows = positions.flows
        lead = flows[0]
        every = lead.settings.update_every
        if self.pending is not None:  # a cached update after an unfinished re-solve is told too, not N updates on
            self.pending = check_pending(self.pending, lead._num_updates)
        caches = self._caches() if every > 1 else None
        if caches is None or lead._num_updates % every == 0:
            for flow in flows:
                flow.resume_theta()
            b0 = positions.initial_values()
            if lead.settings.shared_solve and torch.is_grad_enabled():  # this forward joins the update's solve
                delta, solved = self._shared_deltas(b0, num_positions)
            else:
                ys, solved = solve_checked(flows, b0, num_positions), True  # exact gradient to θ and b(0)
                delta = [y - b.to(y.dtype) for y, b in zip(ys, b0)]
            if every > 1:
                if solved:
                    caches = [_TrainCache(b.detach().clone(), _frozen_copy(flow.dynamics))
                              for flow, b in zip(flows, b0)]
                else:  # a later micro-batch of the update's shared solve: the cache its first one made
                    caches = self._caches()
                self._canonical(caches, num_positions)  # now: the cached updates then do no solver work
            return delta
        whole = lead.settings.cache_whole_bias
        for flow, projections in positions.members:
            flow.pause_theta([proj.bias for proj in projections] if whole else ())
        delta = self._canonical(caches, num_positions)
        if whole:  # the re-solve's b(0) in place of today's, which the projection adds (paused: no gradient)
            b0 = [b.detach() for b in positions.initial_values()]
            delta = [(c.y0.to(d.dtype) - b.to(d.dtype)) + d for c, b, d in zip(caches, b0, delta)]
        return delta

    def _shared_deltas(self, b0: List[Tensor], num_positions: int) -> Tuple[List[Tensor], bool]:
        """Δb from the update's shared solve (``shared_solve.py``): solved by its first forward, extended from its
        last row for a longer micro-batch; (Δb, whether a solve from position 0 ran)."""
        positions = self.positions
        flows, lead = positions.flows, positions.members[0][0]
        pending = self.pending = check_pending(self.pending, lead._num_updates)
        solved = pending is None
        if solved:
            pending = self.pending = SharedSolve(lead._num_updates, [f.dynamics.parameters() for f in flows],
                                                 [q.bias for _, projections in positions.members for q in projections])
            ys = solve_checked(flows, b0, num_positions)
            pending.add([y - b.to(y.dtype) for y, b in zip(ys, b0)])
        elif pending.rows < num_positions:
            have = pending.rows
            last = [b.to(d.dtype) + d for b, d in zip(b0, pending.last_rows())]  # b(t_{have−1}), with its graph
            more = solve_checked(flows, last, num_positions - have + 1, first_index=have - 1)
            pending.add([m[1:] - b.to(m.dtype) for m, b in zip(more, b0)])
        return pending.deltas(num_positions), solved

    def complete_gradients(self):
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.complete()

    def _canonical(self, caches: List[_TrainCache], num_positions: int) -> List[Tensor]:
        """The cached Δb (at least num_positions rows), without gradient, from the re-solve's b(0) and θ alone:
        solved for MIN_CACHE positions, then doubled by integrating from the last row as longer batches need.
        The same rows whatever the lengths of the batches before, so a resumed run, or another process that
        saw other batches, reuses exactly the same biases. Stored in the flows' ``train_cache``."""
        flows = self.positions.flows
        delta = [c.delta for c in caches]
        if delta[0] is None:
            with torch.no_grad():
                ys = solve_checked(flows, [c.y0 for c in caches], MIN_CACHE, dynamics=[c.dynamics for c in caches])
            delta = [y - c.y0.to(y.dtype) for y, c in zip(ys, caches)]
        while delta[0].size(0) < num_positions:
            delta = self.positions.extended([c.y0 for c in caches], delta, 2 * delta[0].size(0),
                                            [c.dynamics for c in caches])
        if delta[0] is not caches[0].delta:
            for flow, cache, d in zip(flows, caches, delta):
                flow.train_cache = cache._replace(delta=d)
        return delta

    def _caches(self) -> Optional[List[_TrainCache]]:
        """The flows' training caches, on the biases' device and dtype; None unless every flow has one."""
        caches = []
        for flow, projections in self.positions.members:
            cache, bias = flow.train_cache, projections[0].bias
            if cache is None or cache.y0.shape != (len(projections), bias.size(0)):
                return None
            if cache.y0.device != bias.device or cache.y0.dtype != bias.dtype:
                cache = flow.train_cache = cache.to(bias)
            caches.append(cache)
        return caches


class _EvalCache(NamedTuple):
    key: tuple  # parameter versions, update counters, train()/eval() generations
    epochs: tuple  # the flows' _epoch counters when solved
    layout: tuple  # per flow: rows, bias shape, dtype, device
    y0: List[Tensor]  # per flow (k, d): b(0) it was solved from
    delta: List[Tensor]  # per flow (P, k, d): Δb(t_i)


class _EvalSolves:
    """Δb for an evaluation forward: solved once per parameter version, then reused and extended."""

    def __init__(self, positions: FloaterPositions):
        self.positions = positions
        self.cache: Optional[_EvalCache] = None

    def deltas(self, num_positions: int) -> List[Tensor]:
        positions, cache, key = self.positions, self.cache, self._key()
        if (cache is None or cache.epochs != self._epochs() or cache.layout != self._layout()
                or cache.key != key):
            with torch.no_grad():
                b0 = positions.initial_values()
                ys = solve_checked(positions.flows, b0, cache_size(num_positions))
            cache = self.cache = _EvalCache(key, self._epochs(), self._layout(), b0,
                                            [y - b.to(y.dtype) for y, b in zip(ys, b0)])
        delta = positions.extended(cache.y0, cache.delta, num_positions)
        if delta is not cache.delta:
            self.cache = cache._replace(delta=delta)
        return delta

    def _layout(self) -> tuple:
        return tuple((len(projections), projections[0].bias.shape, projections[0].bias.dtype,
                      projections[0].bias.device) for _, projections in self.positions.members)

    def _epochs(self) -> tuple:
        return tuple(flow._epoch for flow in self.positions.flows)

    def _key(self) -> tuple:
        key = []
        for flow, projections in self.positions.members:
            h = flow.dynamics  # its four parameters, read directly (parameters() walks the module tree)
            tensors = [q.bias for q in projections] + [h.fc1.weight, h.fc1.bias, h.fc2.weight, h.fc2.bias]
            key += [flow._generation, flow._num_updates] + [(p.data_ptr(), p._version) for p in tensors]
        return tuple(key)
