"""FLOATER's default solve: torchdiffeq's rk4 steps at Δ/5 on all flows at once, in latent coordinates, with
the exact derivative of those steps written out; on CUDA optionally replayed from captured CUDA graphs.

With z = W1 p (hidden-sized) the dynamics h of ``dynamics.py`` become::

    u = relu(z + w1 τ + c1),   dz/dτ = W1 h = (W1 W2) u + (W1 w2) τ + W1 c2,
    p(t_i) = p(t_0) + W2 q(t_i) + w2 (t_i² − t_0²)/2 + c2 (t_i − t_0),   q(t_i) = Σ_steps δ Σ_j b_j u_j

RK4 integrates z, one (hidden × hidden) product per evaluation instead of two, and q sums the same steps'
stage values u_j with the RK4 weights b = (1, 3, 3, 1)/8. torchdiffeq's "rk4" is the 3/8 rule, which is what
this file computes, step δ = Δ/5 (k_j = f(τ_j, ·), τ_j = t, t + δ/3, t + 2δ/3, t + δ)::

    k1 = f(z),  k2 = f(z + δ k1/3),  k3 = f(z + δ(k2 − k1/3)),  k4 = f(z + δ(k1 − k2 + k3)),
    z' = z + δ (k1 + 3 k2 + 3 k3 + k4)/8,        f(τ, z) = u(τ, z) M + e(τ),  M = (W1 W2)ᵀ, e(τ) = W1(w2 τ + c2)

This is RK4 applied to p, step for step, in exact arithmetic; why, how the loop avoids host synchronisation,
and what the backward sweep holds: docs/floater_solver.md ("The default solve").

Mapping to code
---------------
- ``solve_latent``     the solve: W1, W2, c's and w's split from the flows (``_split_weights``), z0, M, e; p from q.
- ``rk4_plan``         the grid, step sizes δ and stage times τ_j on the host, as torchdiffeq computes them.
- ``_time_terms``      c(τ_j) + δ Σ_l a_jl e(τ_l) and the earlier steps' e terms, tabulated once per solve.
- ``_LatentRK4``       the steps above (forward) and their exact derivative (backward; its docstring).
- ``capturable``       whether a solve is replayed from CUDA graphs (``cuda_graph.py``, ``--floater-cuda-graph``).
"""

import functools
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import cuda_graph as floater_cuda_graph
from .cuda_graph import graph_bucket
from .dynamics import STEPS_PER_DT, FloaterDynamics

# torchdiffeq's "rk4" is the 3/8 rule (rk4_alt_step_func).
RK4_WEIGHTS = (1 / 8, 3 / 8, 3 / 8, 1 / 8)
STAGES = 4 * STEPS_PER_DT  # stage evaluations per grid interval


class RK4Plan:
    """The grid of one solve, on the host: t_i = i·Δ for i = first .. first + points − 1, each interval split into
    STEPS_PER_DT steps exactly as torchdiffeq's grid constructor does (float64), the step sizes δ_s and the
    stage times. Device tables derived from it are cached per (device, dtype)."""

    def __init__(self, points: int, dt: float, first: int):
        self.points, self.dt, self.first = points, dt, first
        t = [(first + i) * dt for i in range(points)]  # float64, as torch.arange(..., float64) * dt
        frac = [j / STEPS_PER_DT for j in range(STEPS_PER_DT)]
        grid = [a + (b - a) * f for a, b in zip(t[:-1], t[1:]) for f in frac] + t[-1:]
        self.times = t
        self.steps = [b - a for a, b in zip(grid[:-1], grid[1:])]  # δ_s = t1 − t0, as torchdiffeq
        self.stage_times = [x for a, b in zip(grid[:-1], grid[1:])
                            for x in (a, a + (b - a) * (1 / 3), a + (b - a) * (2 / 3), b)]
        self._tables: Dict[tuple, dict] = {}

    def tables(self, device, dtype) -> dict:
        """Constant tensors of the solve, copied to the device once per grid length, device and dtype (the only
        host-to-device copies of the solve; a captured solve builds them in its warm-up), never per solve."""
        key = (str(device), dtype)
        if key not in self._tables:
            f64 = dict(dtype=torch.float64)
            steps = torch.tensor(self.steps, **f64)
            tau = torch.tensor(self.stage_times, **f64).view(-1, 4)  # (S, 4)
            t = torch.tensor(self.times, **f64)
            a = torch.tensor([[0, 0, 0, 0], [1 / 3, 0, 0, 0], [-1 / 3, 1, 0, 0], [1, -1, 1, 0]], **f64)
            b = torch.tensor(RK4_WEIGHTS, **f64)
            q_weights = (steps[:, None] * b).view(self.points - 1, 1, STAGES)  # per interval: δ_s b_j
            as_ = dict(device=device, dtype=dtype)
            self._tables[key] = dict(
                tau=tau.to(**as_),
                stage_mix=(steps[:, None, None] * a).to(**as_),  # (S, 4, 4): δ_s a_jl
                update_mix=(steps[:, None] * b).to(**as_),  # (S, 4): δ_s b_j
                q_weights=q_weights.to(**as_),
                linear=(t - t[0]).to(**as_)[:, None, None],  # ∫ c2 dτ from t_0
                square=((t * t - t[0] * t[0]) / 2).to(**as_)[:, None, None],  # ∫ w2 τ dτ from t_0
                comb3=torch.tensor([[1.0, -1.0, 1.0]], **f64).to(**as_),  # k1 − k2 + k3
                comb4=torch.tensor([[1.0, 3.0, 3.0, 1.0]], **f64).to(**as_),  # k1 + 3 k2 + 3 k3 + k4
                gk1=torch.tensor([[1 / 3, -1 / 3, 1.0]], **f64).to(**as_),  # ∂a2, ∂a3, ∂a4 in ∂k1
                gk2=torch.tensor([[1.0, -2.0]], **f64).to(**as_),  # ∂a3, ∂a4 in ∂k2
                ones4=torch.ones(1, 4, **f64).to(**as_),
            )
        return self._tables[key]


@functools.lru_cache(maxsize=64)
def rk4_plan(points: int, dt: float, first: int = 0) -> RK4Plan:
    return RK4Plan(points, dt, first)


def _time_terms(plan: RK4Plan, c1: Tensor, w1: Tensor, ec: Tensor, et: Tensor) -> Tensor:
    """(F, S, 4, 1, H): the part of each stage's input that depends on time alone, with w's offset
    (docs/floater_solver.md, "How it runs"): c(τ_j) + δ Σ_l a_jl e(τ_l) + Σ_{earlier steps} δ Σ_j b_j e(τ_j)."""
    tab = plan.tables(c1.device, c1.dtype)
    tau = tab["tau"]  # (S, 4)
    flows, hidden = c1.size(0), c1.size(-1)
    c = torch.addcmul(c1.view(flows, 1, 1, hidden), w1.view(flows, 1, 1, hidden), tau[..., None])  # (F, S, 4, H)
    e = torch.addcmul(ec.view(flows, 1, 1, hidden), et.view(flows, 1, 1, hidden), tau[..., None])
    stage = c + torch.matmul(tab["stage_mix"], e)  # (S, 4, 4) @ (F, S, 4, H)
    update = torch.matmul(tab["update_mix"].unsqueeze(1), e).squeeze(2)  # (F, S, H): δ Σ_j b_j e(τ_j)
    earlier = torch.cumsum(update, 1) - update  # exclusive: the steps before s
    return (stage + earlier.unsqueeze(2)).unsqueeze(3)


class _LatentRK4(torch.autograd.Function):
    """q(t_i) (F, P, K, hidden) of RK4 (3/8 rule) on the latent system of F stacked flows; backward = the exact
    derivative of those steps, the gradient autograd would take through the solver (direct backprop, not the
    continuous adjoint): one reverse sweep over the steps with the stage values saved by the forward. With
    λ = ∂L/∂z' and the adjoint l of the step's q increment::

        ∂k4 = δ/8 λ,             ∂a_j = relu'(a_j) ⊙ (∂k_j Mᵀ + δ b_j l)     (a_j: stage j's pre-activation)
        ∂k3 = 3δ/8 λ + δ ∂a4,    ∂k2 = ∂k3 + δ(∂a3 − 2 ∂a4),    ∂k1 = ∂k4 + δ(∂a4 − ∂a3/3 + ∂a2/3),
        ∂z = λ + Σ_j ∂a_j,       ∂M += Σ_j u_jᵀ ∂k_j,   ∂c(τ_j) = ∂a_j,   ∂e(τ_j) = ∂k_j
    """

    @staticmethod
    def forward(ctx, z0: Tensor, Mt: Tensor, c1: Tensor, w1: Tensor, ec: Tensor, et: Tensor, plan: RK4Plan,
                tape: Optional[Tensor] = None):
        flows, rows, hidden = z0.shape
        S = len(plan.steps)
        tab = plan.tables(z0.device, z0.dtype)
        offsets = _time_terms(plan, c1, w1, ec, et)  # (F, S, 4, 1, H)
        if tape is None:  # the stage values u, saved for the backward (captured solves bring a shared one)
            tape = z0.new_empty(flows, 4 * S, rows, hidden)
        w = z0.clone()
        Zs = z0.new_empty(flows, 4, rows, hidden)  # one step's four stage inputs before their products
        comb = z0.new_empty(flows, rows, hidden)
        comb_flat = comb.view(flows, 1, rows * hidden)
        comb3 = tab["comb3"].expand(flows, 1, 3)
        comb4 = tab["comb4"].expand(flows, 1, 4)
        for s, delta in enumerate(plan.steps):
            n = 4 * s
            u = tape[:, n: n + 4]
            torch.add(w.unsqueeze(1), offsets[:, s], out=Zs)
            torch.clamp_min(Zs[:, 0], 0, out=u[:, 0])
            torch.baddbmm(Zs[:, 1], u[:, 0], Mt, alpha=delta / 3, out=u[:, 1]).relu_()
            torch.add(u[:, 1], u[:, 0], alpha=-1 / 3, out=comb)
            torch.baddbmm(Zs[:, 2], comb, Mt, alpha=delta, out=u[:, 2]).relu_()
            torch.bmm(comb3, u[:, :3].reshape(flows, 3, rows * hidden), out=comb_flat)
            torch.baddbmm(Zs[:, 3], comb, Mt, alpha=delta, out=u[:, 3]).relu_()
            torch.bmm(comb4, u.reshape(flows, 4, rows * hidden), out=comb_flat)
            w.baddbmm_(comb, Mt, alpha=delta / 8)
        # q(t_i) = Σ over the steps before t_i of δ Σ_j b_j u_j: weights per stage, summed per interval
        increments = torch.matmul(tab["q_weights"], tape.view(flows, plan.points - 1, STAGES, rows * hidden))
        q = torch.cat([z0.new_zeros(flows, 1, rows * hidden), increments.squeeze(2).cumsum(1)], 1)
        ctx.save_for_backward(tape, Mt)
        ctx.plan = plan
        return q.view(flows, plan.points, rows, hidden)

    @staticmethod
    @once_differentiable
    def backward(ctx, q_grad: Tensor):
        with torch.autocast(q_grad.device.type, enabled=False):  # the sweep in the solve's dtype, like the forward
            return _LatentRK4._backward(ctx, q_grad.contiguous())

    @staticmethod
    def _backward(ctx, q_grad: Tensor):
        tape, Mt = ctx.saved_tensors
        plan: RK4Plan = ctx.plan
        flows, evaluations, rows, hidden = tape.shape
        tab = plan.tables(tape.device, tape.dtype)
        size = rows * hidden
        # the adjoint of the q increment of interval i: Σ_{i' > i} ∂L/∂q(t_i')
        q_adjoint = q_grad[:, 1:].flip(1).cumsum(1).flip(1)  # (F, P − 1, K, H)
        MtT = Mt.transpose(1, 2)
        gk = tape.new_empty(flows, STAGES, rows, hidden)  # ∂L/∂k_j of one interval's stages
        ga = torch.empty_like(gk)  # ∂L/∂a_j, a_j: stage j's pre-activation
        product = tape.new_empty(flows, rows, hidden)
        z_adjoint = tape.new_zeros(flows, rows, hidden)  # λ = ∂L/∂z after the step being reversed
        z_flat = z_adjoint.view(flows, 1, size)
        Mt_grad = torch.zeros_like(Mt)
        a_sums = tape.new_zeros(flows, 2, hidden)  # Σ ∂a_j and Σ τ_j ∂a_j over every stage and row
        k_sums = tape.new_zeros(flows, 2, hidden)  # the same of ∂k_j
        gk1_mix = tab["gk1"].expand(flows, 1, 3)
        gk2_mix = tab["gk2"].expand(flows, 1, 2)
        ones4 = tab["ones4"].expand(flows, 1, 4)
        # per interval: [1; τ_j] for each of its stages, repeated over the rows
        tau_rows = torch.stack([torch.ones_like(tab["tau"]), tab["tau"]], 1)  # (S, 2, 4)
        tau_rows = tau_rows.view(plan.points - 1, STEPS_PER_DT, 2, 4).permute(0, 2, 1, 3).reshape(
            plan.points - 1, 1, 2, STAGES, 1).expand(-1, flows, -1, -1, rows).reshape(
            plan.points - 1, flows, 2, STAGES * rows)
        b1, b2, b3, b4 = RK4_WEIGHTS
        relu_grad = torch.ops.aten.threshold_backward.grad_input
        for interval in reversed(range(plan.points - 1)):
            lq, first = q_adjoint[:, interval], interval * STAGES
            for s in reversed(range(interval * STEPS_PER_DT, (interval + 1) * STEPS_PER_DT)):
                delta, n, m = plan.steps[s], 4 * s, 4 * s - first  # n: stage in the tape, m: in the buffers
                k1, k2, k3, k4 = (gk[:, m + j] for j in range(4))
                a1, a2, a3, a4 = (ga[:, m + j] for j in range(4))
                torch.mul(z_adjoint, delta * b4, out=k4)
                relu_grad(torch.baddbmm(lq, k4, MtT, beta=delta * b4, out=product), tape[:, n + 3], 0, grad_input=a4)
                torch.add(z_adjoint, a4, alpha=1 / b3, out=k3).mul_(delta * b3)
                relu_grad(torch.baddbmm(lq, k3, MtT, beta=delta * b3, out=product), tape[:, n + 2], 0, grad_input=a3)
                torch.baddbmm(k3.view(flows, 1, size), gk2_mix, ga[:, m + 2: m + 4].reshape(flows, 2, size),
                              alpha=delta, out=k2.view(flows, 1, size))
                relu_grad(torch.baddbmm(lq, k2, MtT, beta=delta * b2, out=product), tape[:, n + 1], 0, grad_input=a2)
                torch.baddbmm(k4.view(flows, 1, size), gk1_mix, ga[:, m + 1: m + 4].reshape(flows, 3, size),
                              alpha=delta, out=k1.view(flows, 1, size))
                relu_grad(torch.baddbmm(lq, k1, MtT, beta=delta * b1, out=product), tape[:, n], 0, grad_input=a1)
                z_flat.baddbmm_(ones4, ga[:, m: m + 4].reshape(flows, 4, size))
            # parameters: sums over the interval's stages (k_j = u_j M + e(τ_j), a_j = z_j + c(τ_j) + ...)
            stages = tape[:, first: first + STAGES].reshape(flows, STAGES * rows, hidden)
            Mt_grad.baddbmm_(stages.transpose(1, 2), gk.view(flows, STAGES * rows, hidden))
            a_sums.baddbmm_(tau_rows[interval], ga.view(flows, STAGES * rows, hidden))
            k_sums.baddbmm_(tau_rows[interval], gk.view(flows, STAGES * rows, hidden))
        c1_grad, w1_grad = a_sums.split(1, dim=1)
        ec_grad, et_grad = k_sums.split(1, dim=1)
        return z_adjoint, Mt_grad, c1_grad, w1_grad, ec_grad, et_grad, None, None


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


def capturable(y0: Tensor, args: Tuple[Tensor, ...], first_index: int) -> bool:
    """A training solve on CUDA: from position 0 (the bucket's extra rows then change nothing), with gradient."""
    return y0.is_cuda and first_index == 0 and torch.is_grad_enabled() and any(a.requires_grad for a in args)


def solve_latent(dynamics: Sequence[FloaterDynamics], y0: Tensor, dt: float, first_index: int, num_points: int,
                 dtype: torch.dtype, cuda_graph: bool = False) -> Tensor:
    """RK4 on the stacked flows in latent coordinates; y0 (F, K, d) → y(t_i) (P, F, K, d) (a view), in `dtype`."""
    W1, w1, c1, W2, w2, c2 = (w.to(dtype) for w in _split_weights(dynamics))
    W1t, W2t = W1.transpose(1, 2), W2.transpose(1, 2)  # (F, d, hidden), (F, hidden, d)
    Mt = torch.bmm(W2t, W1t)  # (W1 W2)ᵀ: (F, hidden, hidden)
    z0 = torch.bmm(y0, W1t)  # z = W1 p
    ec, et = torch.bmm(c2, W1t), torch.bmm(w2, W1t)  # W1 c2, W1 w2 (as rows)
    args = (z0, Mt, c1, w1, ec, et)
    q = None
    if cuda_graph and capturable(y0, args, first_index):
        plan = rk4_plan(graph_bucket(num_points), dt, first_index)
        q = floater_cuda_graph.GRAPHS.replay(_LatentRK4.apply, plan, args, num_points)  # None: another awaits its backward
    plan = rk4_plan(num_points, dt, first_index)
    if q is None:
        q = _LatentRK4.apply(*args, plan)  # (F, P, K, hidden)
    flows, points, rows, hidden = q.shape
    tab = plan.tables(y0.device, dtype)
    p = y0.unsqueeze(1) + torch.bmm(q.view(flows, points * rows, hidden), W2t).view(flows, points, rows, -1)
    return (p + w2.unsqueeze(1) * tab["square"] + c2.unsqueeze(1) * tab["linear"]).transpose(0, 1)
