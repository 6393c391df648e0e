"""One solve per update, shared by its micro-batches (``--floater-shared-solve``).

θ and b(0) change once per optimizer step, so every micro-batch of one update (``--update-freq N``) would solve
the same ODE. Here the update's first training forward solves it, with its graph, and hands the micro-batches a
detached copy D = sg[Δb]; their backwards sum their gradients on D, and after the last one a single backward
through the solve gives θ and b(0)

    ∂L/∂θ = Σ_m (∂Δb/∂θ)ᵀ ∂L_m/∂Δb = (∂Δb/∂θ)ᵀ (Σ_m ∂L_m/∂Δb)                 (likewise b(0))

the per-micro-batch gradient exactly (backward is linear in the output gradient), for one solve instead of N.
A micro-batch longer than what was solved extends the solve from its last row with gradient (fixed-grid solvers:
the same steps as one solve from 0), a segment of its own; the final backward runs through every segment.

Mapping to code
---------------
- ``SharedSolve.deltas``    the update's Δb for a forward (solve, extend or reuse), through ``_Deferred``: its
  backward hands θ a zero gradient per micro-batch, so that pytorch_ddp sees every parameter used (its real
  gradient comes in ``complete``).
- ``SharedSolve.complete``  the one backward, after the last micro-batch's: fairseq's trainer calls the model's
  ``all_reduce_grads()`` there (directly in one process; through ModuleProxyWrapper under pytorch_ddp, whose
  backward already averaged the other gradients; legacy_ddp after its own reduction, a patch hunk). With several
  processes the contributions to θ and b(0) are averaged over the data-parallel group as those backends average
  gradients, then added to ``.grad``.
- A solve whose update ended without ``complete`` (a training loop that never calls it: an optimizer step over
  θ or b(0) ran, or the update number moved on) raises at the next forward; one whose gradients were zeroed
  without a step (fairseq's recovery from an out-of-memory micro-batch) is dropped with them.
"""

from typing import List, Optional, Sequence

import torch
from torch import Tensor, nn

from .update_count import StepWatch


class SharedSolveError(RuntimeError):
    one_line = True  # uncaught, it ends a fairseq command with its message alone (fairseq_plugins/__init__.py)


class _Deferred(torch.autograd.Function):
    """D as one micro-batch uses it: its gradient accumulates on D; θ gets a zero one (see the module docstring)."""

    @staticmethod
    def forward(ctx, delta, *theta):
        ctx.theta = [(p.shape, p.dtype, p.device) for p in theta]
        return delta.view_as(delta)

    @staticmethod
    def backward(ctx, grad):
        return (grad, *(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.theta))


class _Segment:
    """Rows [start, start + n) of every flow's Δb: the graph's outputs and the detached copies the forwards use."""

    def __init__(self, outputs: List[Tensor]):
        self.outputs = outputs
        self.leaves = [out.detach().clone().requires_grad_(True) for out in outputs]  # clone: a graph's static
        # output buffer is overwritten by its next replay (cuda_graph.py hands out copies already; cheap anyway)


class SharedSolve:
    """The pending solve of one update: its segments, the parameters it reaches, the update it belongs to."""

    def __init__(self, update: int, theta: Sequence[Sequence[nn.Parameter]], initial: Sequence[nn.Parameter]):
        self.update = update
        self.theta = [list(t) for t in theta]  # per flow
        self.params = [p for p in (*(q for t in self.theta for q in t), *initial) if p.requires_grad]
        self.segments: List[_Segment] = []
        self.watch = StepWatch(self.params)  # an optimizer step ends the update, completed or not

    @property
    def rows(self) -> int:
        return sum(seg.outputs[0].size(0) for seg in self.segments)

    def used(self) -> bool:
        """A micro-batch's backward has reached D."""
        return any(leaf.grad is not None for seg in self.segments for leaf in seg.leaves)

    def zeroed(self) -> bool:
        """The gradients were zeroed since a backward reached D: θ got its zero gradient from ``_Deferred``."""
        return self.used() and all(p.grad is None for p in self.params)

    def add(self, outputs: List[Tensor]):
        self.segments.append(_Segment(outputs))

    def last_rows(self) -> List[Tensor]:
        """Every flow's last solved row of Δb, with its graph (where an extension starts)."""
        return [out[-1] for out in self.segments[-1].outputs]

    def deltas(self, num_positions: int) -> List[Tensor]:
        out = []
        for f, theta in enumerate(self.theta):
            leaves = [seg.leaves[f] for seg in self.segments]
            whole = leaves[0] if len(leaves) == 1 else torch.cat(leaves)
            out.append(_Deferred.apply(whole[:num_positions], *(p for p in theta if p.requires_grad)))
        return out

    def complete(self):
        """The one backward through the solve; its contributions averaged over the data-parallel group."""
        pairs = [(out, leaf.grad) for seg in self.segments for out, leaf in zip(seg.outputs, seg.leaves)
                 if leaf.grad is not None]
        if not pairs or not self.params:
            return
        grads = torch.autograd.grad([o for o, _ in pairs], self.params, [g for _, g in pairs], allow_unused=True)
        grads = _averaged([g if g is not None else torch.zeros_like(p) for p, g in zip(self.params, grads)])
        for p, g in zip(self.params, grads):
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)


def _averaged(grads: List[Tensor]) -> List[Tensor]:
    """The mean over the data-parallel group (one all-reduce per dtype), as legacy_ddp and pytorch_ddp average."""
    from fairseq.distributed import utils as distributed_utils

    world = distributed_utils.get_data_parallel_world_size()
    if world == 1:
        return grads
    group = distributed_utils.get_data_parallel_group()
    out: List[Optional[Tensor]] = [None] * len(grads)
    for dtype in dict.fromkeys(g.dtype for g in grads):
        index = [i for i, g in enumerate(grads) if g.dtype == dtype]
        flat = torch.cat([grads[i].reshape(-1) for i in index]).div_(world)
        distributed_utils.all_reduce(flat, group)
        for i, part in zip(index, flat.split([grads[i].numel() for i in index])):
            out[i] = part.view_as(grads[i])
    return out


def check_pending(pending: Optional[SharedSolve], update: int) -> Optional[SharedSolve]:
    """The pending solve if this forward can use it, None if it is to be dropped; raises for a lost gradient."""
    if pending is None:
        return None
    if pending.used() and pending.watch.stepped:
        # a loop of one's own: its step ran without the model's all_reduce_grads(); zeroing the gradients after
        # (zero_grad() sets them to None) or leaving the update number as it was would otherwise hide it
        raise SharedSolveError(
            f"--floater-shared-solve: an optimizer step ended update {pending.update} before the model's "
            "all_reduce_grads() gave θ and b(0) their gradient from the update's solve (θ would never train): call "
            "model.all_reduce_grads() after the last micro-batch's backward and before the step, as fairseq's "
            "trainer does")
    if pending.zeroed():  # fairseq's recovery from an out-of-memory micro-batch: no step, gradients zeroed
        return None
    if pending.update == update:
        return pending
    if not pending.used():
        return None  # solved, never back-propagated (a forward alone): nothing lost
    raise SharedSolveError(
        f"--floater-shared-solve: the solve of update {pending.update} got its micro-batches' gradients but never "
        f"gave θ and b(0) theirs (update {update} began first): the training loop must call the model's "
        f"all_reduce_grads() after the last micro-batch's backward, as fairseq's trainer does")
