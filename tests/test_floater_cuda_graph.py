"""FLOATER's CUDA-graph solve trains with the same gradients as its step-by-step loop, with gradient accumulation
(--update-freq, DDP's no_sync) and in every precision mode, on CPU through an emulation of CUDA graphs
(tests/cuda_graph_emulation.py: captured buffers overwritten by every replay, as on a GPU).

- the emulation itself reproduces what torch's make_graphed_callables does on CUDA: its backward hands autograd
  its static gradient buffers detached, so a parameter reached only through views (stack, unsqueeze) keeps the
  buffer itself as its .grad; the next backward's replay overwrites it and AccumulateGrad's in-place sum then
  doubles it (float32: 2·g_last instead of Σ g_i; in float16 the cast makes a fresh tensor and the sum is right);
  a replay overwrites the static output of the previous call; a host synchronisation during capture raises;
- fairseq's Trainer in this process (tests/precision_harness.py), for --update-freq 1, 2, 3 and each precision
  mode: the gradient each update steps with is the loop's, parameter by parameter;
- two gloo ranks (legacy_ddp, pytorch_ddp), update-freq 2, the emulation in each rank: the final parameters are
  those of the same ranks running the loop.
"""
import argparse
import re
import socket
import sys
from pathlib import Path

import pytest
import torch

from cuda_graph_emulation import CaptureError, capture_count, emulated_cuda_graphs
from floater_helpers import one_thread, randomize_flows  # noqa: F401  (one_thread: autouse fixture)
from precision_harness import MODES, build_trainer, cpu_fp16_optimizer, master_grads
from small_task import assert_same_model, kill_group, small_data, start, train_cmd


@pytest.fixture
def emulation(monkeypatch):
    with emulated_cuda_graphs(monkeypatch):
        yield


# -- the emulation against torch's known behaviour ------------------------------------------------------------

def _accumulated(dtype):
    """Two parameters stacked, unsqueezed, cast to `dtype` and passed through a graphed callable (x ↦ 2x); two
    backward passes accumulate into .grad: d/dp of (1 + 10)·2·p = 22 per entry."""
    a, b = (torch.nn.Parameter(torch.tensor([1.0, 2.0])) for _ in range(2))
    sample = torch.zeros(2, 1, 2, dtype=dtype, requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(lambda x: x * 2, (sample,))
    for scale in (1.0, 10.0):
        (graphed(torch.stack([a, b]).unsqueeze(1).to(dtype)).float().sum() * scale).backward()
    return a.grad, b.grad


def test_emulation_reproduces_make_graphed_callables_gradient_accumulation(emulation):
    a_grad, b_grad = _accumulated(torch.float32)
    assert a_grad.tolist() == [40.0, 40.0] and b_grad.tolist() == [40.0, 40.0]  # 2·20: torch's known bug
    a_grad, b_grad = _accumulated(torch.float16)
    assert a_grad.tolist() == [22.0, 22.0] and b_grad.tolist() == [22.0, 22.0]  # a cast's fresh tensor: right


def test_emulated_replay_overwrites_static_outputs(emulation):
    sample = torch.zeros(3, requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(lambda x: x.exp() + 1, (sample,))
    x1 = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
    first = graphed(x1)
    torch.testing.assert_close(first, x1.detach().exp() + 1)
    second = graphed(torch.full((3,), 3.0, requires_grad=True))
    assert torch.equal(first, second) and second.eq(torch.tensor(3.0).exp() + 1).all()  # the same buffer


def test_emulated_capture_computes_nothing_until_replayed(emulation):
    """As on a GPU: after capture the results are garbage and what it wrote to is unchanged; replay computes."""
    x, acc = torch.tensor([1.0, 2.0]), torch.zeros(2)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 3
        acc.add_(y)
    assert y.isnan().all() and acc.eq(0).all()
    g.replay()
    x.copy_(torch.tensor([10.0, 20.0]))
    g.replay()
    assert y.tolist() == [30.0, 60.0] and acc.tolist() == [33.0, 66.0]


@pytest.mark.parametrize("sync", [lambda t: t.sum().item(), lambda t: bool(t.sum() > 0), lambda t: t.nonzero()])
def test_host_synchronisation_during_capture_raises(emulation, sync):
    x = torch.ones(3)
    with pytest.raises(CaptureError):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            sync(x)
    assert not torch.cuda.is_current_stream_capturing()


def test_capture_on_the_default_stream_raises(emulation):
    g = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError):
        g.capture_begin()


# -- fairseq's Trainer: the graph path's gradients are the loop's ---------------------------------------------

UPDATES = 2
# Both paths run the same operators on the same values (the graph solves its bucket's longer grid, whose first
# rows are the loop's grid): equal to float32 rounding; fp16/bf16 solve in float32 too, then round the gradient
# (measured on CPU: equal bit for bit in every mode).
TOLERANCE = {"fp32": 1e-6, "amp": 1e-6, "fp16": 1e-3, "fp16-no-flatten-grads": 1e-3, "memory-efficient-fp16": 1e-3,
             "bf16": 1e-2, "bf16-hydra": 1e-2, "memory-efficient-bf16": 1e-2}


def graph_flags():
    """(flags that turn the CUDA-graph solve on, flags that turn it off), whichever of --floater-cuda-graph
    (off by default) and --floater-no-cuda-graph (on by default) the model's parser knows."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = argparse.ArgumentParser()
    ARCH_MODEL_REGISTRY["floater_transformer_tiny"].add_args(parser)
    known = parser._option_string_actions
    on = ["--floater-cuda-graph"] if "--floater-cuda-graph" in known else []
    off = ["--floater-no-cuda-graph"] if "--floater-no-cuda-graph" in known else []
    assert on or off, "neither --floater-cuda-graph nor --floater-no-cuda-graph"
    return on, off


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return small_data(tmp_path_factory)


def _trainer(data, mode, flags, update_freq):
    """fairseq's Trainer in `mode` with FLOATER's flows made non-trivial (h ≡ 0 at initialisation leaves W1 and
    its bias without gradient), and an iterator over its groups of `update_freq` batches."""
    mode_flags, overrides = MODES[mode]
    trainer, batches = build_trainer(data, "floater_transformer_tiny",
                                     [*mode_flags, *flags, "--update-freq", str(update_freq)], overrides)
    randomize_flows(trainer.model)  # before the optimizer (and fp16's float32 copy) is built at the first step
    return trainer, iter(lambda: [next(batches) for _ in range(update_freq)], None)


def _relative_errors(got, want, names):
    errors = {}
    for p, q in zip(got.model.parameters(), want.model.parameters()):
        g, w = master_grads(got)[id(p)], master_grads(want)[id(q)]
        assert (g is None) == (w is None), f"{names[id(p)]}: a gradient in one path only"
        if w is not None:
            errors[names[id(p)]] = float((g.double() - w.double()).norm() / w.double().norm().clamp_min(1e-30))
    return errors


@pytest.mark.parametrize("update_freq", [1, 2, 3])
@pytest.mark.parametrize("mode", list(MODES))
def test_graph_path_steps_with_the_loops_gradients(data, emulation, mode, update_freq):
    """Each update's gradient (what the optimizer steps with) on the CUDA-graph path equals the loop's, parameter
    by parameter; gradient accumulation over 2 or 3 batches sums each batch's gradient."""
    graph_on, graph_off = graph_flags()
    with cpu_fp16_optimizer():
        graphed, graphed_groups = _trainer(data, mode, graph_on, update_freq)
        loop, loop_groups = _trainer(data, mode, graph_off, update_freq)
        names = {id(p): name for name, p in graphed.model.named_parameters()}
        captures = capture_count()
        for update in range(UPDATES):
            assert graphed.train_step(next(graphed_groups)) is not None
            assert loop.train_step(next(loop_groups)) is not None
            errors = _relative_errors(graphed, loop, names)
            wrong = {name: f"{e:.3g}" for name, e in errors.items() if e > TOLERANCE[mode]}
            assert not wrong, f"update {update}: gradients off the loop's (relative): {wrong}"
        assert capture_count() > captures, "the graph path was not taken"


# -- two gloo ranks, gradient accumulation through DDP's no_sync ----------------------------------------------

MAX_UPDATE = 4  # from the second update on (h ≢ 0), the flows' fc1.bias gets a gradient


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(data, save, log_dir, backend, graph_flags_):
    """Two ranks (gloo) of fairseq-train with --update-freq 2; the CUDA-graph emulation installed in each."""
    init = f"tcp://127.0.0.1:{free_port()}"
    extra = ["--find-unused-parameters"] if backend == "pytorch_ddp" else []
    procs, captures = [], []
    try:
        for rank in (0, 1):
            cmd = train_cmd(data, save, "floater_transformer_tiny", *graph_flags_, *extra, "--update-freq", "2",
                            "--distributed-world-size", "2", "--distributed-backend", "gloo", "--ddp-backend", backend,
                            "--distributed-init-method", init, "--distributed-rank", str(rank),
                            "--distributed-no-spawn", max_update=MAX_UPDATE)
            cmd = [sys.executable, str(Path(__file__).parent / "emulated_cuda_graph_train.py"), *cmd[1:]]
            procs.append(start(cmd, log_dir / f"{save.name}_rank{rank}.log"))
        for proc in procs:
            proc.wait(timeout=600)
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_group(proc)
    for rank, proc in enumerate(procs):
        log = (log_dir / f"{save.name}_rank{rank}.log").read_text()
        assert proc.returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
        assert f"num_updates={MAX_UPDATE}," in log or rank == 1
        captures.append(int(re.search(r"emulated CUDA graphs captured: (\d+)", log).group(1)))
    return save / "checkpoint_last.pt", captures


@pytest.mark.parametrize("backend", ["legacy_ddp", "pytorch_ddp"])
def test_two_ranks_on_the_graph_path_train_as_on_the_loop(data, tmp_path, backend):
    graph_on, graph_off = graph_flags()
    graphed, captures = _two_ranks(data, tmp_path / "graph", tmp_path, backend, graph_on)
    loop, none = _two_ranks(data, tmp_path / "loop", tmp_path, backend, graph_off)
    assert min(captures) > 0 and none == [0, 0], (captures, none)
    assert_same_model(loop, graphed, rtol=1e-6)
