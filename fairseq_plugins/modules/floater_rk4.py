"""FLOATER's default solve: torchdiffeq's rk4 steps at Δ/5 on all flows at once, in latent coordinates, with
the exact derivative of those steps written out.

With z = W1 p (hidden-sized) the dynamics h of ``floater_dynamics.py`` become::

    u = relu(z + w1 τ + c1),   dz/dτ = W1 h = (W1 W2) u + (W1 w2) τ + W1 c2,
    p(t_i) = p(t_0) + W2 q(t_i) + w2 (t_i² − t_0²)/2 + c2 (t_i − t_0),   q(t_i) = Σ_steps δ Σ_j b_j u_j

RK4 integrates z, one (hidden × hidden) product per evaluation instead of two, and q sums the same steps'
stage values u_j with the RK4 weights b = (1, 3, 3, 1)/8 (torchdiffeq's "rk4" is the 3/8 rule; step
δ = Δ/5). Runge-Kutta methods commute with linear maps and integrate the linear-in-τ part exactly, so this *is*
RK4 applied to p, step for step, in exact arithmetic; in floating point the two differ by rounding (about 1e-6
relative in float32; the tests compare both with torchdiffeq's own solve of h). The backward pass is the exact
derivative of those RK4 steps, the gradient autograd would take through the solver (direct backprop, not the
continuous adjoint), written out in ``_LatentRK4.backward``: one reverse sweep over the steps with the stage
values saved by the forward; the gradient of W1W2 is one matrix product per grid interval (its 20 stages), so
the sweep's own buffers hold one interval's stage gradients, not all of them.

Used for ``rk4`` without ``--floater-adjoint`` when hidden ≤ 2d (``FloaterFlow.latent``).
"""

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable
from torchdiffeq import odeint

from .floater_dynamics import STEPS_PER_DT, FloaterDynamics, _solver_options, _subdivide

# torchdiffeq's "rk4" is the 3/8 rule (rk4_alt_step_func): stage times t + c_j·δ, inputs y + δ·Σ_l a_jl k_l.
RK4_WEIGHTS = (1 / 8, 3 / 8, 3 / 8, 1 / 8)


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


def solve_latent(dynamics: Sequence[FloaterDynamics], y0: Tensor, t: Tensor,
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

