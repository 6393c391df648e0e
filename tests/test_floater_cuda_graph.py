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

import pytest
import torch

from cuda_graph_emulation import CaptureError, emulated_cuda_graphs


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
