"""FLOATER's default solve (``floater_rk4._LatentRK4``) replayed from CUDA graphs: opt-in, ``--floater-cuda-graph``.

A training solve from position 0 on CUDA is captured once per bucket of lengths (``graph_bucket``: 16, 24, 32,
48, ...; a length solves its bucket's grid and keeps its first rows, the same values) and replayed: one graph
for the forward, one for the backward. What a captured graph does to memory decides every rule below
(``torch/cuda/graphs.py``): its inputs, outputs and gradients live in static buffers that the next replay
overwrites, and its intermediate memory belongs to its pool for as long as the graph lives.

- fresh copies of outputs and gradients (``_Replay``): the static buffers are overwritten by the next replay;
- one solve in flight: a second forward before the first one's backward runs the loop instead;
- bounded memory: every bucket of one shape shares one set of static buffers, one pool and one capture stream
  (``_Tape``), replaced (and the cache emptied first) when a longer bucket comes;
- non-finite values in a bucket's extra rows stop the run through ``solve_checked``;
- capture on the tape's side stream in ``thread_local`` mode, after a warm-up solve; a capture that fails
  falls back to the loop for that bucket after one warning.

Each rule, the failure it prevents and what it costs: docs/floater_solver.md, "CUDA graphs (``cuda_graph.py``)".
Verified on CPU by emulating the graphs' data semantics (``tests/test_floater_cuda_graph.py``); what has run
on a GPU is in ``results/gpu_check/gpu_check.md``.
"""

import logging
import weakref
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

logger = logging.getLogger(__name__)


def graph_bucket(points: int) -> int:
    """The grid length a captured solve of `points` positions uses: the next of 16, 24, 32, 48, 64, 96, ..."""
    size = 16
    while size < points:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def tape_bytes(flows: int, rows: int, hidden: int, points: int, dtype=torch.float32) -> int:
    """Bytes of one solve's stage tape: 4 stages × 5 steps per grid interval, (F, 20·(P−1), K, H)."""
    return flows * 20 * (points - 1) * rows * hidden * torch.empty((), dtype=dtype).element_size()


class _Flight:
    """Marks a replayed forward whose backward has not run; dies with its autograd graph."""


class _Tape:
    """What every bucket of one solve shape (on one device) shares: the static inputs, the stage tape and the
    output gradient's buffer (both flat, sized for the longest bucket), the memory pool, the capture stream, and
    the graphs using them."""

    def __init__(self, args: Tuple[Tensor, ...]):
        self.inputs = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
        self.buffer: Optional[Tensor] = None
        self.grad_output: Optional[Tensor] = None
        self.graphs: Dict[int, "_Captured"] = {}  # bucket length → its graphs
        self.failed: Dict[int, str] = {}  # bucket length → why its capture failed (never tried again)
        self.pool = None
        self.stream = torch.cuda.Stream(args[0].device)  # every warm-up and capture: the pool's blocks are reused

    def views(self, flows: int, evaluations: int, points: int, rows: int, hidden: int) -> Tuple[Tensor, Tensor]:
        """A bucket's tape (F, E, K, H) and output gradient (F, P, K, H): the first elements of the shared
        buffers, so both are contiguous whatever the longest bucket."""
        tape = self.buffer[:flows * evaluations * rows * hidden].view(flows, evaluations, rows, hidden)
        grad_output = self.grad_output[:flows * points * rows * hidden].view(flows, points, rows, hidden)
        return tape, grad_output


class _Captured:
    """One bucket's forward and backward graphs with their static buffers."""

    def __init__(self, kernel, plan, inputs: Tuple[Tensor, ...], tape: Tensor, grad_output: Tensor, pool, stream):
        device = inputs[0].device
        self.inputs = inputs  # shared by the buckets: the same shapes whatever the length
        self.needs_grad = [i for i, a in enumerate(self.inputs) if a.requires_grad]
        current = torch.cuda.current_stream(device)
        stream.wait_stream(current)
        # the outer stream context restores the solve's stream even where torch.cuda.graph's exit raises
        # before restoring it (capture_end of an invalidated capture)
        with torch.cuda.stream(stream):
            try:
                # warm-up: lazy initialisation must not happen inside a capture
                out = kernel(*self.inputs, plan, tape)
                torch.autograd.grad(out, [self.inputs[i] for i in self.needs_grad], torch.zeros_like(out),
                                    allow_unused=True)
                del out
                self.forward_graph, self.backward_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
                capture = dict(pool=pool, stream=stream, capture_error_mode="thread_local")
                with torch.cuda.graph(self.forward_graph, **capture):
                    self.output = kernel(*self.inputs, plan, tape)
                self.grad_output = grad_output
                with torch.cuda.graph(self.backward_graph, **capture):
                    grads = torch.autograd.grad(self.output, [self.inputs[i] for i in self.needs_grad],
                                                self.grad_output, allow_unused=True)
            finally:  # the solve's stream reads what the warm-up wrote, failed or not
                current.wait_stream(stream)
        self.grads = dict(zip(self.needs_grad, grads))

    def static_tensors(self) -> List[Tensor]:
        """The buffers this bucket's graphs own (the shared ones are the _Tape's)."""
        return [self.output, *(g for g in self.grads.values() if g is not None)]


class _Replay(torch.autograd.Function):
    """The captured solve as an autograd function: copies in, replays, copies out (see the module docstring)."""

    @staticmethod
    def forward(ctx, graphs: "CudaGraphSolves", captured: _Captured, *args: Tensor) -> Tensor:
        for static, value in zip(captured.inputs, args):
            static.copy_(value)
        captured.forward_graph.replay()
        ctx.graphs, ctx.captured, ctx.flight = graphs, captured, _Flight()
        graphs.flight = weakref.ref(ctx.flight)
        return captured.output.clone()  # the next replay overwrites the static output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        captured = ctx.captured
        captured.grad_output.copy_(grad)
        captured.backward_graph.replay()
        if ctx.graphs.flight is not None and ctx.graphs.flight() is ctx.flight:
            ctx.graphs.flight = None
        # fresh tensors: autograd may keep a returned gradient as a parameter's .grad, and the next replay
        # would overwrite it in place (torch's make_graphed_callables returns the static buffers themselves)
        grads = [captured.grads.get(i) for i in range(len(captured.inputs))]
        return (None, None, *(g.clone() if g is not None else None for g in grads))


def _capture(shape: _Tape, kernel, plan, flows: int, rows: int, hidden: int) -> Optional[_Captured]:
    """The bucket's graphs, registered with `shape`; None (after one warning) where capturing them fails."""
    z0, evaluations = shape.inputs[0], 4 * len(plan.steps)
    elements = flows * evaluations * rows * hidden
    if shape.buffer is None or shape.buffer.numel() < elements:
        # a longer bucket: new buffers for all; graphs captured on the old ones go with them
        replacing = shape.buffer is not None
        shape.graphs.clear()
        shape.buffer = shape.grad_output = None
        if replacing:
            # the old tape's segment goes back to the device before the new buffers are placed: the caching
            # allocator hands a request the smallest cached block that fits, so the new output gradient would be
            # split out of the dead tape's segment and keep all of it reserved while it lives (empty_cache returns
            # only segments with nothing allocated). torch.cuda.graph empties the cache before each capture anyway.
            torch.cuda.empty_cache()
        shape.buffer = z0.new_empty(elements)
        shape.grad_output = z0.new_empty(flows * plan.points * rows * hidden)
        shape.pool = torch.cuda.graph_pool_handle()
    try:
        views = shape.views(flows, evaluations, plan.points, rows, hidden)
        captured = _Captured(kernel, plan, shape.inputs, *views, shape.pool, shape.stream)
    except Exception as error:  # any failure: the loop still computes the same solve
        shape.failed[plan.points] = f"{type(error).__name__}: {error}"
        logger.warning("FLOATER CUDA graph: capturing the bucket of %d positions failed (%s); its solves run "
                       "the loop", plan.points, shape.failed[plan.points].splitlines()[0])
        if not shape.graphs:  # no graph uses the buffers: they go back to the allocator
            shape.buffer = shape.grad_output = shape.pool = None
        return None
    shape.graphs[plan.points] = captured
    return captured


class CudaGraphSolves:
    """The process's captured solves: a _Tape per solve shape (device, dtype, sizes, grid step) with its buckets'
    graphs, and the one replayed forward that waits for its backward. One per process (``GRAPHS``): the graphs,
    their pools and the tape belong to the device, whichever model solves."""

    def __init__(self):
        self.tapes: Dict[tuple, _Tape] = {}
        self.flight: Optional[weakref.ref] = None  # the replayed forward whose backward has not run

    def reset(self):
        """Drop every captured graph and tape (their memory goes back to torch's allocator)."""
        self.tapes.clear()
        self.flight = None

    def in_flight(self) -> bool:
        """Whether a replayed forward still waits for its backward (its autograd graph is alive)."""
        return self.flight is not None and self.flight() is not None

    def captured_buckets(self) -> int:
        """How many buckets are captured now, over every solve shape."""
        return sum(len(tape.graphs) for tape in self.tapes.values())

    def held_bytes(self) -> int:
        """Bytes held between solves: the tapes and every graph's static buffers (not the shared pools)."""
        total = 0
        for tape in self.tapes.values():
            shared = [*tape.inputs] + [t for t in (tape.buffer, tape.grad_output) if t is not None]
            total += sum(t.numel() * t.element_size() for t in shared)
            for captured in tape.graphs.values():
                total += sum(t.numel() * t.element_size() for t in captured.static_tensors())
        return total

    def replay(self, kernel, plan, args: Tuple[Tensor, ...], num_points: int) -> Optional[Tensor]:
        """q of ``kernel`` on ``plan``'s grid (a bucket's), replayed from graphs captured on first use, cut to
        num_points rows; None while another replayed solve waits for its backward (the caller runs the loop)."""
        if self.in_flight():
            return None
        z0 = args[0]
        flows, rows, hidden = z0.shape
        key = (z0.device, z0.dtype, flows, rows, hidden, plan.dt,
               tuple((a.shape, a.requires_grad) for a in args))
        with torch.cuda.device(z0.device):
            shape = self.tapes.get(key)
            if shape is None:
                shape = self.tapes[key] = _Tape(args)
            if plan.points in shape.failed:
                return None
            captured = shape.graphs.get(plan.points)
            if captured is None:
                captured = _capture(shape, kernel, plan, flows, rows, hidden)
                if captured is None:
                    return None
            q = _Replay.apply(self, captured, *args)
        kept = q[:, :num_points]
        # NaN in the kept rows when any extra row is not finite: solve_checked then refuses the solve
        return torch.where(torch.isfinite(q).all(), kept, torch.full_like(kept, float("nan")))


GRAPHS = CudaGraphSolves()
