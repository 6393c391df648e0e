"""`--floater-shared-solve`: one ODE solve per update, shared by its micro-batches, with one backward through it
after the last (fairseq_plugins/modules/floater/shared_solve.py), gives the gradients of a solve per micro-batch:

- fairseq's Trainer, --update-freq 1 to 4, fp32, --amp (fairseq's AMPOptimizer; float32 arithmetic on CPU) and
  --fp16 (float32 master weights): each update's gradient (what the optimizer steps with) equals the default
  path's, parameter by parameter, with micro-batches in increasing and decreasing length (the shared solve is
  extended from its last row when a later micro-batch is longer), and one solve from position 0 per update where
  the default path makes one per micro-batch; the same with the CUDA-graph solve (emulated on CPU). Without the
  final backward θ's gradient is zero: the same comparison fails (the control);
- gradients zeroed between two micro-batches (fairseq's recovery from an out-of-memory micro-batch) drop the
  pending solve with them; a training loop that never completes an update's gradient stops at the next update
  in one line; adaptive solvers and data-parallel backends that do not average as pytorch_ddp and legacy_ddp
  are refused in one line;
- two gloo ranks with --update-freq 2 (pytorch_ddp without --find-unused-parameters, and legacy_ddp, whose
  reduction reaches the model's all_reduce_grads through a patch hunk): the same model as without sharing.
"""
import itertools

import pytest
import torch

from helpers.cuda_graph_emulation import capture_count, emulated_cuda_graphs
from helpers.floater_helpers import one_thread, randomize_flows  # noqa: F401  (one_thread: autouse fixture)
from helpers.precision_harness import MODES, build_trainer, cpu_fp16_optimizer, gradient_errors, master_grads
from helpers.small_task import assert_same_model, small_data, two_ranks

from fairseq_plugins.modules.floater.shared_solve import SharedSolve, SharedSolveError

ARCH = "floater_transformer_tiny"
UPDATES = 3
# the largest relative gradient error (helpers.precision_harness.gradient_errors). Measured: fp32 and amp 1.1e-6
# (θ 1.1e-7 to 1.1e-6); fp16 5.4e-4 on θ, whose gradient the default path sums over micro-batches in float16
TOLERANCE = {"fp32": 1e-5, "amp": 1e-5, "fp16": 5e-3}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def trainer(data, mode, update_freq, *flags):
    mode_flags, overrides = MODES[mode]
    tr, batches = build_trainer(data, ARCH, [*mode_flags, "--update-freq", str(update_freq), *flags], overrides)
    randomize_flows(tr.model)  # h ≢ 0, so that W1 and its bias get a gradient too
    return tr, list(itertools.islice(iter(batches), 40))


def longest(sample):
    return max(sample["net_input"]["src_tokens"].size(1), sample["net_input"]["prev_output_tokens"].size(1))


def groups(batches, update_freq):
    """Per update, update_freq batches of different lengths: increasing (each later micro-batch extends the
    shared solve), then decreasing, then mixed."""
    chosen = sorted(batches[::7][:update_freq], key=longest)
    return [chosen, chosen[::-1], chosen[1:] + chosen[:1]]


def solves(tr):
    return sum(flow.num_solves for flow in tr.model.encoder.position_scheme.positions.flows)


def record_highs(group):
    """Solver calls of the shared path for one update: the first forward's, then one extension per micro-batch
    longer than all before it."""
    lengths = [longest(s) for s in group]
    return sum(1 for i, n in enumerate(lengths) if i == 0 or n > max(lengths[:i]))


def compare(data, mode, update_freq, *flags, common=()):
    """Largest gradient error of the shared path against the default one over UPDATES updates in lockstep (each
    update starts both from the same weights and optimizer state); asserts the solver calls, unless ``common`` (flags
    of both paths) is given."""
    with cpu_fp16_optimizer():
        (want, batches), (got, _) = (trainer(data, mode, update_freq, *common),
                                     trainer(data, mode, update_freq, *common, *flags, "--floater-shared-solve"))
        names = {id(p): name for name, p in got.model.named_parameters()}
        worst = (0.0, None)
        for number, group in enumerate(groups(batches, update_freq)[:UPDATES]):
            got.model.load_state_dict(want.model.state_dict())
            got.set_num_updates(want.get_num_updates())
            for p_want, p_got in zip(want.optimizer.params, got.optimizer.params):
                p_got.data.copy_(p_want.data)  # the float32 masters too (fp16)
            before = (solves(want), solves(got))
            assert want.train_step(group) is not None and got.train_step(group) is not None
            flows = len(got.model.encoder.position_scheme.positions.flows)
            if not common:  # (the cached updates' solves: the lockstep's load_state_dict rebuilds the shared one's cache)
                assert solves(want) - before[0] == flows * update_freq
                assert solves(got) - before[1] == flows * record_highs(group), "not one solve per update"
            ids = {name: id(p) for name, p in want.model.named_parameters()}
            ref = {id(p): master_grads(want)[ids[names[id(p)]]] for p in got.model.parameters()}
            errors = gradient_errors(master_grads(got), ref)
            key = max(errors, key=errors.get)
            if errors[key] > worst[0]:
                worst = (errors[key], names[key])
    return worst


@pytest.mark.parametrize("update_freq", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", list(TOLERANCE))
def test_each_update_gets_the_gradient_of_a_solve_per_micro_batch(data, mode, update_freq):
    if mode != "fp32" and update_freq in (1, 3):
        pytest.skip("fp32 runs every update-freq; the other modes 2 and 4")
    error, name = compare(data, mode, update_freq)
    assert error <= TOLERANCE[mode], f"{name}: gradient off the default path's by {error:.3g} (relative)"
    print(f"{mode} update-freq {update_freq}: largest relative gradient error {error:.2e} ({name})")


@pytest.mark.parametrize("flags", [["--floater-update-every", "2"],
                                   ["--floater-update-every", "2", "--floater-cache-whole-bias"]])
def test_the_paper_s_cached_updates_share_their_re_solves(data, flags):
    """--floater-update-every 2: the re-solving updates share one solve, the cached ones reuse the cache; the
    gradients of every update are the default path's."""
    error, name = compare(data, "fp32", 3, common=flags)
    assert error <= TOLERANCE["fp32"], f"{name}: gradient off the default path's by {error:.3g} (relative)"


def test_the_cuda_graph_solve_is_shared_too(data, monkeypatch):
    """--floater-cuda-graph (CUDA graphs emulated on CPU, tests/helpers/cuda_graph_emulation.py): the update's
    solve is replayed from its graph and its backward after the last micro-batch, with the same gradients."""
    with emulated_cuda_graphs(monkeypatch):
        captures = capture_count()
        error, name = compare(data, "fp32", 3, "--floater-cuda-graph")
        assert capture_count() > captures, "the graph path was not taken"
    assert error <= TOLERANCE["fp32"], f"{name}: gradient off the default path's by {error:.3g} (relative)"


def test_without_the_final_backward_the_comparison_fails(data, monkeypatch):
    """The control: θ's gradient through the solve left out (the backward after the last micro-batch skipped)."""
    monkeypatch.setattr(SharedSolve, "complete", lambda self: None)
    error, name = compare(data, "fp32", 2)
    assert error > 0.5 and ".dynamics." in name, (error, name)


# -- the update's life cycle ----------------------------------------------------------------------------------

def micro_batch(tr, sample):
    """One micro-batch's forward and backward, as Trainer.train_step runs it (task.train_step)."""
    loss, _, _ = tr.task.train_step(tr._prepare_sample(sample)[0], tr.model, tr.criterion, tr.optimizer,
                                    tr.get_num_updates())
    return loss


def theta_grads(model):
    return {name: p.grad.clone() for name, p in model.named_parameters() if ".dynamics." in name}


def test_gradients_zeroed_between_micro_batches_drop_the_pending_solve(data):
    """fairseq's recovery from an out-of-memory micro-batch zeroes the gradients and goes on with the next: the
    update's gradient is the later micro-batches' alone, θ's included."""
    (shared, batches), (plain, _) = trainer(data, "fp32", 2, "--floater-shared-solve"), trainer(data, "fp32", 2)
    plain.model.load_state_dict(shared.model.state_dict())
    for tr in (shared, plain):
        tr.model.train()
        tr.zero_grad()
        micro_batch(tr, batches[3])
        tr.zero_grad()  # the recovery
        micro_batch(tr, batches[20])
        tr.optimizer.all_reduce_grads(tr.model)
    want, got = theta_grads(plain.model), theta_grads(shared.model)
    for name in want:
        assert torch.allclose(got[name], want[name], rtol=1e-5, atol=1e-9), name


def test_a_loop_that_never_completes_an_update_stops_in_one_line(data):
    tr, batches = trainer(data, "fp32", 2, "--floater-shared-solve")
    tr.model.train()
    micro_batch(tr, batches[3])
    tr.set_num_updates(1)  # the next update, without the model's all_reduce_grads()
    with pytest.raises(SharedSolveError) as error:
        micro_batch(tr, batches[4])
    message = str(error.value)
    assert "\n" not in message and "all_reduce_grads()" in message and "update 0" in message


def test_a_forward_without_backward_is_not_an_error(data):
    tr, batches = trainer(data, "fp32", 2, "--floater-shared-solve")
    tr.model.train()
    net_input = tr._prepare_sample(batches[3])[0]["net_input"]
    with torch.no_grad():
        tr.model(**net_input)  # no gradient: no shared solve at all
    tr.model(**net_input)  # a forward with gradient, never back-propagated
    tr.set_num_updates(1)
    micro_batch(tr, batches[4])
    tr.optimizer.all_reduce_grads(tr.model)
    assert all(g.abs().sum() > 0 for g in theta_grads(tr.model).values())


@pytest.mark.parametrize("flags,words", [
    (["--floater-method", "dopri5"], "--floater-shared-solve needs a fixed-grid --floater-method"),
    (["--ddp-backend", "fully_sharded"], "not --ddp-backend fully_sharded"),
    (["--use-bmuf"], "not --use-bmuf"),
])
def test_what_cannot_be_shared_is_refused_in_one_line(data, flags, words):
    with pytest.raises(ValueError) as error:
        build_trainer(data, ARCH, ["--floater-shared-solve", *flags])
    assert "\n" not in str(error.value) and words in str(error.value)


# -- two gloo ranks --------------------------------------------------------------------------------------------

MAX_UPDATE = 4


@pytest.mark.slow  # four two-process runs
@pytest.mark.parametrize("backend", ["pytorch_ddp", "legacy_ddp"])
def test_two_ranks_with_update_freq_2_train_the_same_model(data, tmp_path, backend):
    """Each rank's θ gradient through the shared solve is averaged over the ranks as the backend averages the
    others (without that, rank 0's model would follow its own batches' θ gradient)."""
    saves = {}
    for name, extra in (("plain", []), ("shared", ["--floater-shared-solve"])):
        save = tmp_path / name
        ranks = two_ranks(data, save, ARCH, "--floater-flow-init", "xavier", "--update-freq", "2", "--ddp-backend",
                          backend, *extra, log_prefix=tmp_path / f"{name}_rank", max_update=MAX_UPDATE)
        for rank, (returncode, log) in enumerate(ranks):
            assert returncode == 0, f"{name} rank {rank} failed:\n{log[-3000:]}"
        assert f"num_updates={MAX_UPDATE}," in ranks[0][1]
        saves[name] = save / "checkpoint_last.pt"
    assert_same_model(saves["plain"], saves["shared"], rtol=1e-5)
