"""Shared by tests/test_floater*.py: tiny FLOATER models, batches, random flows, and counters of solves and of
operators."""
import copy

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.tiny_models import EOS, PAD, TASK, VOCAB, batch, build, one_thread  # noqa: F401  (one_thread: autouse fixture)
from fairseq_plugins.modules.floater import flows as floater  # solve_flows is looked up there
from fairseq_plugins.modules.floater import FloaterFlow, FloaterSettings


def flows(model):
    return [m for m in model.modules() if isinstance(m, FloaterFlow)]


def randomize_flows(model, scale=0.3, seed=1):
    """A non-trivial h: W2 drawn small so the biases move but stay moderate over a few hundred positions."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for flow in flows(model):
            w = flow.dynamics.fc2.weight
            w.copy_(torch.randn(w.shape, generator=g) * scale / w.shape[1] ** 0.5)
            flow.dynamics.fc2.bias.copy_(torch.randn(w.shape[0], generator=g) * 0.1)
    return model


def floater_model(seed=0, **kw):
    return randomize_flows(build("floater_transformer_tiny", seed=seed, **kw)).double()


def count_solves(monkeypatch):
    """Record every solver call made for a model's flows: the number of grid points it solves for."""
    calls = []
    solve = floater.solve_flows

    def counting(flows, initial, num_points, *args, **kwargs):
        calls.append(num_points)
        return solve(flows, initial, num_points, *args, **kwargs)

    monkeypatch.setattr(floater, "solve_flows", counting)
    return calls


def random_flows(rows=(3, 4, 2), dim=6, hidden=7, dtype=torch.float64, seed=0, **settings):
    """Flows with a non-trivial h (random W2, c2, c1) and random initial values, one per entry of rows."""
    torch.manual_seed(seed)
    flows = [FloaterFlow(dim, hidden, FloaterSettings(**settings)).to(dtype) for _ in rows]
    for flow in flows:
        torch.nn.init.normal_(flow.dynamics.fc2.weight, std=0.5 / hidden ** 0.5)
        torch.nn.init.normal_(flow.dynamics.fc2.bias, std=0.3)
        torch.nn.init.normal_(flow.dynamics.fc1.bias, std=0.3)
    initial = [torch.randn(k, dim, dtype=dtype, requires_grad=True) for k in rows]
    return flows, initial


def values_and_gradients(outputs, flows, initial, seed=1):
    """The outputs and the gradients of a fixed random linear function of them w.r.t. θ and b(0)."""
    g = torch.Generator().manual_seed(seed)
    loss = sum((y * torch.randn(y.shape, generator=g, dtype=y.dtype).to(y.device)).sum() for y in outputs)
    inputs = [p for flow in flows for p in flow.parameters()] + list(initial)
    return [y.detach() for y in outputs], torch.autograd.grad(loss, inputs)


def rounded_copies(flows, initial, dtype):
    """The float32 flows and b(0) with their values rounded through dtype, and copies of them in dtype."""
    with torch.no_grad():
        for flow in flows:
            for p in flow.parameters():
                p.copy_(p.to(dtype).float())
    initial = [y.detach().to(dtype).float().requires_grad_() for y in initial]
    low = [copy.deepcopy(flow).to(dtype) for flow in flows]
    return initial, low, [y.detach().to(dtype).requires_grad_() for y in initial]


def train_updates(model, n_updates, seed=0):
    """fairseq's loop in miniature: forward, backward, step, set_num_updates. Yields per-update facts."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    enc_flow = model.encoder.position_scheme.flow
    theta = list(enc_flow.dynamics.parameters())
    b0 = model.encoder.position_scheme.projections[0].bias
    for k in range(n_updates):
        opt.zero_grad(set_to_none=True)
        solves_before = enc_flow.num_solves
        model(*batch(seed=seed + k))[0].pow(2).mean().backward()
        theta_grad = sum(float(p.grad.abs().sum()) if p.grad is not None else 0.0 for p in theta)
        b0_grad = float(b0.grad.abs().sum()) if b0.grad is not None else 0.0  # None: b(0) sat out
        yield dict(update=k, theta_grad=theta_grad, b0_grad=b0_grad,
                   solved=enc_flow.num_solves > solves_before)
        opt.step()
        model.set_num_updates(k + 1)


SYNCING = {"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "item"}  # aten ops that wait for the device


class CountOps(TorchDispatchMode):
    """Every non-view aten operator (one kernel launch on a GPU) and those that synchronise with the host."""

    def __init__(self):
        super().__init__()
        self.ops, self.syncs = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += not func.is_view
        if func.overloadpacket.__name__ in SYNCING:
            self.syncs.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))
