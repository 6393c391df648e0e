"""FLOATER's dynamics and solver settings (fairseq_plugins/modules/floater/dynamics.py): h's size, torchdiffeq's
solve of h on the grid, and every solve in float32 for half-precision models and under autocast."""
import argparse
from pathlib import Path

import pytest
import torch
from fairseq import utils
from torchdiffeq import odeint

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[1] / "fairseq_plugins")))
from fairseq_plugins.modules.floater import (  # noqa: E402
    FloaterDynamics,
    FloaterSettings,
    solve_flows,
    solve_on_grid,
)
from helpers.floater_helpers import (  # noqa: E402, F401  (one_thread: autouse fixture)
    one_thread,
    build,
    randomize_flows,
    batch,
    random_flows,
    values_and_gradients,
    rounded_copies,
)


def test_flow_parameter_count_matches_paper():
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(FloaterDynamics(512)) == 526_336  # the paper's "526.3K" (Table 6)
    for d, h in ((64, 64), (512, 128), (1024, 1024)):
        assert n(FloaterDynamics(d, h)) == (d + 1) * h + h + (h + 1) * d + d


@pytest.mark.parametrize("method", ["rk4", "dopri5"])
def test_grid_solve_equals_independent_solves(method):
    torch.manual_seed(0)
    f = FloaterDynamics(6).double()
    torch.nn.init.xavier_normal_(f.fc2.weight)
    y0 = torch.randn(4, 6, dtype=torch.float64)
    dt, n = 0.1, 12
    tol = dict(rtol=1e-9, atol=1e-11)
    grid = solve_on_grid(f, y0, n, FloaterSettings(dt=dt, method=method, **tol))
    assert grid.shape == (n, 4, 6)
    torch.testing.assert_close(grid[0], y0, rtol=0, atol=0)
    for i in range(1, n):
        t = torch.tensor([0.0, i * dt], dtype=torch.float64)
        if method == "rk4":  # torchdiffeq's own step-size grid, Δ/5
            alone = odeint(f, y0, t, method="rk4", options=dict(step_size=dt / 5))[-1]
        else:
            alone = odeint(f, y0, t, method="dopri5", **tol)[-1]
        torch.testing.assert_close(grid[i], alone, rtol=0, atol=1e-5)


def test_grid_solve_continues_exactly_from_a_later_point():
    torch.manual_seed(0)
    f = FloaterDynamics(5).double()
    torch.nn.init.xavier_normal_(f.fc2.weight)
    y0 = torch.randn(3, 5, dtype=torch.float64)
    full = solve_on_grid(f, y0, 30)
    tail = solve_on_grid(f, full[11], 19, first_index=11)
    torch.testing.assert_close(tail, full[11:], rtol=0, atol=1e-12)


# -- precision: every solve in float32 -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("method,adjoint", [("rk4", False), ("rk4", True), ("euler", False), ("dopri5", False)])
def test_half_precision_model_solves_in_float32(dtype, method, adjoint):
    """A bf16/fp16 model's solve equals the float32 model's with the same weight values; θ's and b(0)'s gradients
    come back in the parameters' dtype, equal to the float32 gradients up to that dtype's rounding."""
    flows, initial = random_flows(dim=16, hidden=16, dtype=torch.float32, method=method, adjoint=adjoint,
                                  rtol=1e-6, atol=1e-8)
    initial, low_flows, low_initial = rounded_copies(flows, initial, dtype)
    reference = values_and_gradients(solve_flows(flows, initial, 20), flows, initial)
    out = solve_flows(low_flows, low_initial, 20)
    assert all(y.dtype == torch.float32 for y in out)
    values, grads = values_and_gradients(out, low_flows, low_initial)
    for y, ref in zip(values, reference[0]):
        assert (y - ref).abs().max() <= 1e-5 * ref.abs().max()
    eps = torch.finfo(dtype).eps
    for g, ref in zip(grads, reference[1]):
        assert g.dtype == dtype
        torch.testing.assert_close(g.float(), ref, rtol=eps, atol=eps * float(ref.abs().max()))


def test_solve_is_float32_under_autocast():
    flows, initial = random_flows(dim=16, hidden=16, dtype=torch.float32)
    reference = values_and_gradients(solve_flows(flows, initial, 20), flows, initial)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = solve_flows(flows, initial, 20)
    assert all(y.dtype == torch.float32 for y in out)
    for a, b in zip([*values_and_gradients(out, flows, initial)[0]], reference[0]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_model_trains_and_decodes(dtype):
    """Δb is added in the projections' dtype: a bf16/fp16 model's forward stays in its dtype, θ gets gradient."""
    model = randomize_flows(build("floater_transformer_tiny")).to(dtype)
    out = model.train()(*batch())[0]
    assert out.dtype == dtype
    out.float().pow(2).mean().backward()
    theta = model.encoder.position_scheme.flow.dynamics.fc2.weight
    assert theta.grad.dtype == dtype and theta.grad.abs().sum() > 0
    with torch.no_grad():
        assert model.eval()(*batch())[0].dtype == dtype


def test_solver_names_are_torchdiffeqs():
    # the plugins write torchdiffeq's solver table out (so that importing them imports neither torchdiffeq nor
    # scipy); the pinned torchdiffeq must list the same solvers, and the same fixed-grid ones
    from torchdiffeq._impl.odeint import SOLVERS
    from torchdiffeq._impl.solvers import FixedGridODESolver

    from fairseq_plugins.modules.floater.dynamics import FIXED_GRID_SOLVERS, SOLVER_NAMES

    assert SOLVER_NAMES == tuple(m for m in SOLVERS if m != "scipy_solver")
    assert FIXED_GRID_SOLVERS == {m for m in SOLVER_NAMES if issubclass(SOLVERS[m], FixedGridODESolver)}


def test_importing_the_plugins_leaves_torchdiffeq_and_scipy_unimported():
    # every fairseq command with --user-dir imports the plugins; only a torchdiffeq solve needs torchdiffeq
    import subprocess
    import sys

    code = ("import argparse, sys; from fairseq import utils; utils.import_user_module(argparse.Namespace("
            f"user_dir={str(Path(__file__).resolve().parents[1] / 'fairseq_plugins')!r})); "
            "print(sorted(m for m in ('torchdiffeq', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
