"""FLOATER's default solve (fairseq_plugins/modules/floater/rk4.py): all flows in one solve against each flow's
torchdiffeq solve of h (values and gradients), the hand-written backward against finite differences, padding rows,
no host synchronisation, operators per step, and the CUDA-graph path."""
import argparse
from pathlib import Path

import pytest
import torch
from fairseq import utils

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.modules.floater import rk4 as floater_rk4  # noqa: E402
from fairseq_plugins.modules.floater import (  # noqa: E402
    FloaterFlow,
    FloaterSettings,
    solve_flows,
    solve_on_grid,
)
from helpers.floater_helpers import (  # noqa: E402, F401  (one_thread: autouse fixture)
    one_thread,
    random_flows,
    values_and_gradients,
    CountOps,
)


@pytest.mark.parametrize("method,adjoint", [("rk4", False), ("rk4", True), ("euler", False), ("dopri5", False)])
def test_all_flows_in_one_solve_equal_separate_solves(method, adjoint):
    """solve_flows (fixed grid: stacked and padded states, one torchdiffeq call; default rk4 in latent coordinates
    with its hand-written backward; adaptive: one call per flow) == each flow's own torchdiffeq solve of h: values
    and gradients to θ and b(0)."""
    tol = dict(rtol=1e-10, atol=1e-12)
    flows, initial = random_flows(method=method, adjoint=adjoint, **tol)
    assert flows[0].latent == (method == "rk4" and not adjoint)
    n = 11
    together = values_and_gradients(solve_flows(flows, initial, n), flows, initial)
    alone = values_and_gradients([solve_on_grid(f.dynamics, y0, n, f.settings)
                                  for f, y0 in zip(flows, initial)], flows, initial)
    for a, b in zip([*together[0], *together[1]], [*alone[0], *alone[1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_latent_rk4_in_float32_matches_torchdiffeq_on_h():
    """At the tiny model's sizes and 60 positions, float32 rounding is the only difference from rk4 on p."""
    flows, initial = random_flows(rows=(6, 8, 4), dim=64, hidden=64, dtype=torch.float32)
    ys = solve_flows(flows, initial, 60)
    for flow, y0, y in zip(flows, initial, ys):
        reference = solve_on_grid(flow.dynamics, y0, 60)
        assert (y - reference).abs().max() <= 2e-6 * reference.abs().max()


def test_latent_rk4_backward_passes_gradcheck():
    """The hand-written backward of the latent rk4 steps against finite differences (every input, float64)."""
    torch.manual_seed(0)
    flows, rows, hidden = 2, 3, 4
    args = [torch.randn(flows, rows, hidden), torch.randn(flows, hidden, hidden) / 2,
            *(torch.randn(flows, 1, hidden) for _ in range(4))]
    args = [a.double().requires_grad_() for a in args]
    plan = floater_rk4.rk4_plan(4, 0.1)
    assert torch.autograd.gradcheck(lambda *a: floater_rk4._LatentRK4.apply(*a, plan), args, eps=1e-6, atol=1e-7)
    # rows never mix: flow 1's first 2 rows, and their gradient, as if solved alone
    used = lambda *a: floater_rk4._LatentRK4.apply(*a, plan)[1, :, :2]  # noqa: E731
    assert torch.autograd.gradcheck(used, args, eps=1e-6, atol=1e-7)
    alone = floater_rk4._LatentRK4.apply(args[0][1:, :2], *(a[1:] for a in args[1:]), plan)[0]
    torch.testing.assert_close(used(*args), alone, rtol=0, atol=1e-12)


@pytest.mark.parametrize("points", [2, 7, 33])
def test_latent_rk4_equals_torchdiffeq_on_h_with_padding_rows(points):
    """The default solve (own RK4 loop, padded flows of 5/2/3 rows) == torchdiffeq's rk4 on h, flow by flow:
    values and gradients to θ and b(0), float64, for several grid lengths; also continuing from a later index."""
    flows, initial = random_flows(rows=(5, 2, 3))
    assert flows[0].latent
    together = values_and_gradients(solve_flows(flows, initial, points), flows, initial)
    alone = values_and_gradients([solve_on_grid(f.dynamics, y0, points) for f, y0 in zip(flows, initial)],
                                 flows, initial)
    for a, b in zip([*together[0], *together[1]], [*alone[0], *alone[1]]):
        assert (a - b).abs().max() <= 1e-6 * b.abs().max() + 1e-14
    later = solve_flows(flows, initial, points, first_index=9)
    reference = [solve_on_grid(f.dynamics, y0, points, first_index=9) for f, y0 in zip(flows, initial)]
    for a, b in zip(later, reference):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_grid_solve_of_all_flows_continues_exactly_from_a_later_point():
    flows, initial = random_flows()
    with torch.no_grad():
        full = solve_flows(flows, initial, 30)
        tail = solve_flows(flows, [y[11] for y in full], 19, first_index=11)
    for a, b in zip(tail, full):
        torch.testing.assert_close(a, b[11:], rtol=0, atol=1e-12)


# -- the solve's operators and host synchronisations --------------------------------------------------

@pytest.mark.parametrize("points", [9, 40])
def test_default_solve_has_no_host_sync_and_few_operators(points):
    """The default solve (forward and backward) waits on no device value (.item(), tolist, equal, bool(tensor)):
    counted on CPU through the dispatcher, and under CUDA's sync debug mode when a GPU is present; its
    operators per RK4 step stay under a bound (≤ 16 forward, ≤ 24 backward; measured 12 and about 15)."""
    flows, initial = random_flows(rows=(5, 2, 3), dtype=torch.float32)
    steps = 5 * (points - 1)
    with CountOps() as forward:
        ys = solve_flows(flows, initial, points)
    loss = sum(y.sum() for y in ys)
    with CountOps() as backward:
        loss.backward()
    assert forward.syncs == [] and backward.syncs == []
    assert forward.ops <= 16 * steps + 60 and backward.ops <= 24 * steps + 60, (forward.ops, backward.ops)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_default_solve_on_cuda_has_no_host_sync(cuda_graph):
    flows, initial = random_flows(rows=(5, 2, 3), dtype=torch.float32, cuda_graph=cuda_graph)
    flows = [f.cuda() for f in flows]
    initial = [y.detach().cuda().requires_grad_() for y in initial]
    reference = values_and_gradients(solve_flows(flows, initial, 21), flows, initial)  # captures, if graphed
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ys = solve_flows(flows, initial, 21)
        grads = torch.autograd.grad(sum(y.sum() for y in ys), [p for f in flows for p in f.parameters()])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(grads) == 12
    again = values_and_gradients(solve_flows(flows, initial, 21), flows, initial)
    for a, b in zip([*again[0], *again[1]], [*reference[0], *reference[1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_captured_solve_path_buckets_lengths_and_keeps_values(monkeypatch):
    """The CUDA-graph path on CPU through the emulation of CUDA graphs (replays overwrite static buffers): a length
    solves its bucket's grid and keeps its first rows, values and gradients as the plain loop; a forward and a
    backward graph per bucket; a longer bucket replaces the shared tape (and recaptures a shorter one later)."""
    from helpers.cuda_graph_emulation import capture_count, emulated_cuda_graphs

    assert [floater_rk4.graph_bucket(n) for n in (1, 16, 17, 24, 25, 33, 49, 65, 97, 129, 200)] == \
        [16, 16, 24, 24, 32, 48, 64, 96, 128, 192, 256]
    with emulated_cuda_graphs(monkeypatch):
        flows, initial = random_flows(rows=(5, 2, 3), cuda_graph=True)
        plain = [FloaterFlow(6, 7, FloaterSettings(cuda_graph=False)).double() for _ in flows]
        for a, b in zip(plain, flows):
            a.load_state_dict(b.state_dict())
        captures = []
        for points in (21, 19, 30, 21):
            before = capture_count()
            graphed = values_and_gradients(solve_flows(flows, initial, points), flows, initial)
            captures.append(capture_count() - before)
            reference = values_and_gradients(solve_flows(plain, initial, points), plain, initial)
            for a, b in zip([*graphed[0], *graphed[1]], [*reference[0], *reference[1]]):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # bucket 24 captured, reused for 19; bucket 32 replaces the tape and drops 24's graphs, which 21 captures again
    assert captures == [2, 0, 2, 2]
