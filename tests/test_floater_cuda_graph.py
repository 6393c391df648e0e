"""FLOATER's CUDA-graph solve trains with the same gradients as its step-by-step loop, with gradient accumulation
(--update-freq, DDP's no_sync) and in every precision mode, on CPU through an emulation of CUDA graphs
(tests/helpers/cuda_graph_emulation.py: captured buffers overwritten by every replay, as on a GPU).

- the emulation itself reproduces what torch's make_graphed_callables does on CUDA: its backward hands autograd
  its static gradient buffers detached, so a parameter reached only through views (stack, unsqueeze) keeps the
  buffer itself as its .grad; the next backward's replay overwrites it and AccumulateGrad's in-place sum then
  doubles it (float32: 2·g_last instead of Σ g_i; in float16 the cast makes a fresh tensor and the sum is right);
  a replay overwrites the static output of the previous call; a host synchronisation during capture raises;
- fairseq's Trainer in this process (tests/helpers/precision_harness.py), for --update-freq 1, 2, 3 and each precision
  mode: the gradient each update steps with is the loop's, parameter by parameter;
- two gloo ranks (legacy_ddp, pytorch_ddp), update-freq 2, the emulation in each rank: the final parameters are
  those of the same ranks running the loop.
"""
import argparse
import re
import sys
from pathlib import Path

import pytest
import torch

from helpers.cuda_graph_emulation import CaptureError, capture_allocations, capture_count, emulated_cuda_graphs
from helpers.floater_helpers import one_thread, randomize_flows  # noqa: F401  (one_thread: autouse fixture)
from helpers.precision_harness import MODES, build_trainer, cpu_fp16_optimizer, master_grads
from helpers.small_task import assert_same_model, small_data, two_ranks


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


# -- FLOATER's capture: where, how, what it holds -------------------------------------------------------------

def test_capture_is_thread_local_on_a_side_stream_of_the_solves_device(emulation, monkeypatch):
    """Other threads (NCCL's watchdog) may query events while a capture is open: only thread_local capture mode
    leaves them alone; the capture runs under the solve's own device (a model on cuda:1 without set_device)."""
    from fairseq_plugins.modules.floater import solve_flows
    from helpers.floater_helpers import random_flows

    entered, captures = [], []

    class RecordingDevice(torch.cuda.device):
        def __enter__(self):
            entered.append(self.idx)
            return self

        def __exit__(self, *exc):
            entered.pop()
            return False

    begin = torch.cuda.CUDAGraph.capture_begin

    def recording_begin(graph, pool=None, capture_error_mode="global", **kwargs):
        captures.append((capture_error_mode, list(entered), torch.cuda.current_stream()))
        return begin(graph, pool=pool, capture_error_mode=capture_error_mode, **kwargs)

    monkeypatch.setattr(torch.cuda, "device", RecordingDevice)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", recording_begin)
    flows, initial = random_flows(rows=(3, 2), cuda_graph=True)
    sum(y.sum() for y in solve_flows(flows, initial, 20)).backward()
    assert len(captures) == 2  # the bucket's forward and backward
    for mode, devices, stream in captures:
        assert mode == "thread_local"
        assert devices and devices[-1] == initial[0].device
        assert stream is not torch.cuda.default_stream()


def test_one_solve_in_flight_and_bounded_graph_memory(emulation):
    """A second forward before the first one's backward runs the loop (its replay would overwrite the tape the
    first backward reads); the graphs hold one tape, of the longest bucket, plus small static buffers."""
    from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph
    from fairseq_plugins.modules.floater import FloaterFlow, FloaterSettings, solve_flows
    from helpers.floater_helpers import random_flows, values_and_gradients

    flows, initial = random_flows(rows=(3, 2), cuda_graph=True)
    plain = [FloaterFlow(6, 7, FloaterSettings()).double() for _ in flows]
    for a, b in zip(plain, flows):
        a.load_state_dict(b.state_dict())
    captures = capture_count()
    first, second = solve_flows(flows, initial, 20), solve_flows(flows, initial, 30)  # second: the loop
    assert floater_cuda_graph.GRAPHS.in_flight() and capture_count() - captures == 2
    got = values_and_gradients([*first, *second], flows, initial)
    want = values_and_gradients([*solve_flows(plain, initial, 20), *solve_flows(plain, initial, 30)], plain, initial)
    for a, b in zip([*got[0], *got[1]], [*want[0], *want[1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert not floater_cuda_graph.GRAPHS.in_flight()
    rows, hidden, element = 3, 7, 8  # float64 here
    seen = []
    for points in (20, 40, 30, 100, 16):
        values_and_gradients(solve_flows(flows, initial, points), flows, initial)
        seen.append(points)
        longest = floater_cuda_graph.graph_bucket(max(seen))
        tape = floater_cuda_graph.tape_bytes(2, rows, hidden, longest, torch.float64)
        statics = floater_cuda_graph.GRAPHS.held_bytes() - tape
        # per captured bucket: its input copies, output, output gradient and input gradients
        assert 0 < statics <= 2 * 2 * rows * hidden * element * sum(
            floater_cuda_graph.graph_bucket(p) + 8 for p in (20, 40, 30, 100, 16)), statics
        assert floater_cuda_graph.GRAPHS.held_bytes() < 1.2 * tape


def _latent_args(flows, rows, hidden, seed=0):
    """Random inputs of the latent solve (z0, Mt, c1, w1, ec, et), with gradient."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(flows, rows, hidden), (flows, hidden, hidden)] + [(flows, 1, hidden)] * 4
    return tuple((torch.randn(s, generator=g, dtype=torch.float64) / hidden ** 0.5).requires_grad_() for s in shapes)


def _capture_buckets(buckets, flows, rows, hidden):
    """Captures (and replays once) each bucket in turn; per bucket: the bytes its two captures allocated, and per
    kernel call (warm-up, captures) whether its tape was contiguous and the stream it ran on."""
    from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph
    from fairseq_plugins.modules.floater.rk4 import _LatentRK4, rk4_plan

    args = _latent_args(flows, rows, hidden)
    allocated, calls = {}, []

    def kernel(*inputs):
        calls.append((inputs[-1].is_contiguous(), torch.cuda.current_stream()))
        return _LatentRK4.apply(*inputs)

    for points in buckets:
        before = len(capture_allocations())
        q = floater_cuda_graph.GRAPHS.replay(kernel, rk4_plan(points, 0.1), args, points)
        q.sum().backward()
        allocated[points] = capture_allocations()[before:]
        assert len(allocated[points]) == 2, points  # its forward and backward, captured now
    floater_cuda_graph.GRAPHS.reset()
    return allocated, calls


def test_a_shorter_bucket_captures_on_a_contiguous_tape_without_a_tape_sized_copy(emulation):
    """Buckets of one shape share one stage tape (the longest bucket's) and one pool. A shorter bucket's strided
    slice of a longer tape made RK4's batched product copy the whole slice inside its capture: a tape-sized
    block of the pool per bucket. Each capture must allocate what it allocates first in line, no block beyond
    the solve's largest workspace."""
    from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph

    flows, rows, hidden, element = 2, 3, 8, 8  # float64
    buckets = (16, 24, 48, 64)
    by_order = {}
    for order in ("ascending", "descending"):
        allocated, calls = _capture_buckets(sorted(buckets, reverse=order == "descending"), flows, rows, hidden)
        by_order[order] = allocated
        for points, captures in allocated.items():
            tape = floater_cuda_graph.tape_bytes(flows, rows, hidden, points, torch.float64)
            evaluations = 20 * (points - 1)
            # the largest workspace of the solve: its output (F, P, K, H), the time terms (F, E, H) of the
            # forward and the backward's per-stage [1; τ] table (P − 1, F, 2, 20·K)
            largest = element * max(flows * points * rows * hidden, flows * evaluations * hidden,
                                    2 * flows * evaluations * rows)
            biggest = max(max(sizes) for sizes in captures)
            assert biggest <= largest < tape, f"{order}: bucket {points} allocated {biggest} B in one block " \
                f"inside its capture (its tape: {tape} B, its largest workspace: {largest} B)"
        assert all(contiguous for contiguous, _ in calls), f"{order}: a bucket's tape is a strided slice"
    assert {p: [sum(c) for c in v] for p, v in by_order["descending"].items()} == \
        {p: [sum(c) for c in v] for p, v in by_order["ascending"].items()}


def test_a_longer_bucket_returns_the_replaced_tape_before_placing_its_buffers(emulation, monkeypatch):
    """The caching allocator gives a request the smallest cached free block that fits, and empty_cache returns
    only segments with nothing allocated in them. A longer bucket's output gradient allocated while the replaced
    tape's segment was still cached went into that segment and kept all of it reserved for the rest of the run
    (gpu_check, shortest-first: bucket 128's 358 MiB tape segment held for bucket 256's 36 MiB gradient). So a
    replacement empties the cache between dropping the old buffers and allocating the new ones; a bucket that
    fits the buffers (longest-first) costs no extra empty_cache."""
    from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph

    flows, rows, hidden = 2, 3, 8
    seen = []  # per empty_cache: the tape's shared buffer (its elements; None between drop and allocation)

    def recording_empty_cache():
        seen.append([None if t.buffer is None else t.buffer.numel() for t in floater_cuda_graph.GRAPHS.tapes.values()])

    monkeypatch.setattr(torch.cuda, "empty_cache", recording_empty_cache)  # torch.cuda.graph calls it too

    def tape(points):
        return [flows * 20 * (points - 1) * rows * hidden]

    _capture_buckets((16, 24), flows, rows, hidden)
    # each capture (a forward and a backward per bucket) empties the cache on entering torch.cuda.graph
    assert seen == [tape(16)] * 2 + [[None]] + [tape(24)] * 2, seen
    seen.clear()
    _capture_buckets((24, 16), flows, rows, hidden)
    assert seen == [tape(24)] * 4, seen


def test_every_bucket_of_a_tape_warms_up_and_captures_on_the_tapes_one_stream(emulation, monkeypatch):
    """The caching allocator hands a freed block of a pool only to allocations on the stream that freed it: a
    side stream per bucket kept each capture from the workspace the previous ones left in the shared pool."""
    created = []

    class CountedStream(torch.cuda.Stream):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self)

    begin, captured_on = torch.cuda.CUDAGraph.capture_begin, []

    def recording_begin(graph, *args, **kwargs):
        captured_on.append(torch.cuda.current_stream())
        return begin(graph, *args, **kwargs)

    monkeypatch.setattr(torch.cuda, "Stream", CountedStream)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", recording_begin)
    for order in ((16, 24, 48), (48, 24, 16)):
        created.clear(), captured_on.clear()
        _, calls = _capture_buckets(order, 2, 3, 8)
        streams = [stream for _, stream in calls] + captured_on  # the warm-ups' solves, the captures
        assert len(streams) == 4 * len(order)  # per bucket: the warm-up's solve, the forward's, two captures
        assert len(created) == 1 and all(stream is created[0] for stream in streams), \
            f"{order}: {len(created)} capture streams for one tape"


@pytest.mark.parametrize("where", ["capture", "warm-up"])
def test_a_failed_capture_runs_the_loop_with_one_warning_and_is_not_retried(emulation, monkeypatch, caplog, where):
    """A capture that raises (CUDA refuses an operation while capturing; memory runs out in the warm-up) must
    cost no training: the solve runs the loop (the same values and gradients), one warning names the bucket and
    the error, nothing of it stays captured, the solve's stream is current again, and the bucket is not tried
    again; other buckets are still captured."""
    from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph
    from fairseq_plugins.modules.floater import rk4 as floater_rk4
    from fairseq_plugins.modules.floater import FloaterFlow, FloaterSettings, solve_flows
    from helpers.floater_helpers import random_flows, values_and_gradients

    time_terms, tries = floater_rk4._time_terms, []

    def failing(plan, *args):
        side = torch.cuda.current_stream() is not torch.cuda.default_stream()
        if side and plan.points == 24:
            tries.append(plan.points)
            if where == "capture" and torch.cuda.is_current_stream_capturing():
                args[0].sum().item()  # a host synchronisation: CUDA invalidates the capture
            if where == "warm-up" and not torch.cuda.is_current_stream_capturing():
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
        return time_terms(plan, *args)

    monkeypatch.setattr(floater_rk4, "_time_terms", failing)
    flows, initial = random_flows(rows=(3, 2), cuda_graph=True)
    plain = [FloaterFlow(6, 7, FloaterSettings()).double() for _ in flows]
    for a, b in zip(plain, flows):
        a.load_state_dict(b.state_dict())
    caplog.set_level("WARNING", logger=floater_cuda_graph.__name__)
    for _ in range(2):  # bucket 24 both times
        got = values_and_gradients(solve_flows(flows, initial, 20), flows, initial)
        want = values_and_gradients(solve_flows(plain, initial, 20), plain, initial)
        assert all(torch.equal(a, b) for a, b in zip([*got[0], *got[1]], [*want[0], *want[1]]))
        assert torch.cuda.current_stream() is torch.cuda.default_stream()
        assert floater_cuda_graph.GRAPHS.captured_buckets() == 0 and not floater_cuda_graph.GRAPHS.in_flight()
    assert len(set(tries)) == 1 and len(tries) == {"capture": 2, "warm-up": 1}[where], tries  # tried once
    warnings = [r.getMessage() for r in caplog.records if r.name == floater_cuda_graph.__name__]
    error = {"capture": "CaptureError", "warm-up": "OutOfMemoryError"}[where]
    assert len(warnings) == 1 and "24 positions" in warnings[0] and error in warnings[0], warnings
    # nothing of the failed bucket is held: only the static inputs' copies
    assert floater_cuda_graph.GRAPHS.held_bytes() < floater_cuda_graph.tape_bytes(2, 3, 7, 16, torch.float64)
    captures = capture_count()
    got = values_and_gradients(solve_flows(flows, initial, 30), flows, initial)  # bucket 32: captured
    want = values_and_gradients(solve_flows(plain, initial, 30), plain, initial)
    assert capture_count() - captures == 2 and floater_cuda_graph.GRAPHS.captured_buckets() == 1
    for a, b in zip([*got[0], *got[1]], [*want[0], *want[1]]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_non_finite_extra_rows_of_a_bucket_stop_the_solve(emulation):
    """A captured solve integrates to its bucket's length: if only the rows past the batch's overflow, their
    0·inf would enter θ's gradient as NaN; the kept rows become NaN and the finiteness check refuses the solve."""
    from fairseq_plugins.modules.floater import FloaterSolverError, solve_checked
    from helpers.floater_helpers import random_flows

    from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph

    for scale in (1.0, 1.5, 2.0, 3.0, 4.0, 6.0):
        flows, initial = random_flows(rows=(3, 2), cuda_graph=True)
        with torch.no_grad():
            for flow in flows:
                flow.dynamics.fc2.weight.mul_(scale * 10)
        bad = _first_non_finite_row(flows, initial, 400)  # the loop's solve
        # a batch of bad positions: finite itself, its bucket (> bad rows) is not
        if bad is not None and 16 < bad and floater_cuda_graph.graph_bucket(bad) > bad:
            break
    else:
        pytest.fail("no flow overflowing within a bucket")
    captures = capture_count()
    with pytest.raises(FloaterSolverError, match="non-finite"):
        solve_checked(flows, initial, bad)
    assert capture_count() > captures  # the captured path, not the loop


def _first_non_finite_row(flows, initial, points):
    from fairseq_plugins.modules.floater import FloaterFlow, FloaterSettings, solve_flows

    plain = [FloaterFlow(6, 7, FloaterSettings()).double() for _ in flows]
    for a, b in zip(plain, flows):
        a.load_state_dict(b.state_dict())
    with torch.no_grad():
        finite = torch.stack([torch.isfinite(y).flatten(1).all(1) for y in solve_flows(plain, initial, points)]).all(0)
    return None if bool(finite.all()) else int((~finite).nonzero()[0])


def test_graphs_refused_on_rocm(monkeypatch):
    from helpers.tiny_models import build

    monkeypatch.setattr(torch.version, "hip", "6.2.0")
    with pytest.raises(ValueError, match="--floater-cuda-graph is not supported on ROCm"):
        build("floater_transformer_tiny", floater_cuda_graph=True)
    build("floater_transformer_tiny", floater_cuda_graph=False)


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


@pytest.mark.matrix
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


def _two_ranks(data, save, log_dir, backend, graph_flags_):
    """Two ranks (gloo) of fairseq-train with --update-freq 2; the CUDA-graph emulation installed in each."""
    extra = ["--find-unused-parameters"] if backend == "pytorch_ddp" else []
    emulated = lambda cmd: [sys.executable, str(Path(__file__).parent / "emulated_cuda_graph_train.py"), *cmd[1:]]  # noqa: E731
    ranks = two_ranks(data, save, "floater_transformer_tiny", *graph_flags_, *extra, "--update-freq", "2",
                      "--ddp-backend", backend, log_prefix=log_dir / f"{save.name}_rank", max_update=MAX_UPDATE,
                      wrap=emulated)
    captures = []
    for rank, (returncode, log) in enumerate(ranks):
        assert returncode == 0, f"rank {rank} failed:\n{log[-3000:]}"
        assert f"num_updates={MAX_UPDATE}," in log or rank == 1
        captures.append(int(re.search(r"emulated CUDA graphs captured: (\d+)", log).group(1)))
    return save / "checkpoint_last.pt", captures


@pytest.mark.slow  # two processes
@pytest.mark.parametrize("backend", ["legacy_ddp", "pytorch_ddp"])
def test_two_ranks_on_the_graph_path_train_as_on_the_loop(data, tmp_path, backend):
    graph_on, graph_off = graph_flags()
    graphed, captures = _two_ranks(data, tmp_path / "graph", tmp_path, backend, graph_on)
    loop, none = _two_ranks(data, tmp_path / "loop", tmp_path, backend, graph_off)
    assert min(captures) > 0 and none == [0, 0], (captures, none)
    assert_same_model(loop, graphed, rtol=1e-6)
