"""CUDA graphs emulated on CPU tensors, for the data semantics that code capturing and replaying them relies on.

A CUDA graph records kernels on fixed memory: a replay re-runs them on the very buffers of the capture, reading
whatever its static inputs hold and overwriting its static outputs, the intermediate values its backward reads
(a tape) and its gradient buffers, while the capture itself computes nothing. ``make_graphed_callables`` hands
its static outputs and its static gradient buffers to autograd ``.detach()``ed, so anything that keeps one of
them without copying sees it change at the next replay. Those are the bugs this emulation is for; a stub that
calls the plain function instead cannot show them.

How: ``CUDAGraph.capture_begin`` pushes a TorchDispatchMode that runs and records every aten call below
autograd and autocast (operator, arguments, results). ``replay`` re-runs the record on the same tensor objects,
without autograd: operators that write in place or into ``out=`` run as recorded, functional ones run again and
their results are copied into the recorded result tensors, views are skipped (they share their base's storage)
and so are ``empty``-like allocations (no kernel). As on CUDA, after ``capture_end`` the tensors the capture
allocated hold garbage (NaN) and those it wrote into hold their values from before the capture, until a replay;
a host synchronisation during capture (``.item()``, ``bool(t)``, ``nonzero``...) raises, and so does ending that
capture (cudaStreamEndCapture of an invalidated capture); capturing on the default stream raises. Streams, events,
pools and devices are stand-ins that order nothing (CPU work is synchronous). Replays leave autograd's version
counters alone, as kernels on a GPU do. ``capture_allocations`` lists the storages each capture allocated (on CUDA:
taken from the graph's pool).

``emulated_cuda_graphs(monkeypatch)`` installs all of it in ``torch.cuda`` (torch's own ``torch.cuda.graph`` and
``make_graphed_callables`` run on top of it, unmodified) and makes FLOATER's training solves on CPU take their
CUDA-graph path.
"""
import contextlib
import itertools
import math

import torch
import torch.cuda.graphs
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from helpers import cuda_stand_ins

aten = torch.ops.aten


def _ops(*names):
    return {getattr(aten, n) for n in names if hasattr(aten, n)}


# host synchronisations: a value (or a data-dependent size) read back by the host, illegal during capture
HOST_SYNC = _ops("_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select", "_unique",
                 "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive", "allclose",
                 "argwhere")
# allocations without a kernel: a replay leaves their memory as it is
UNINITIALISED = _ops("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted")


class CaptureError(RuntimeError):
    """What CUDA reports for an operation that is illegal while a stream is capturing."""


def _tensors(value):
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _storage(t):
    return t.untyped_storage().data_ptr() if t.numel() else None


class _Recorder(TorchDispatchMode):
    """Runs and records every aten call: (func, args, kwargs, [(result index, recorded result tensor)])."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.fresh = []  # tensors the capture allocated
        self.written = {}  # data_ptr → (storage, its copy from before) for pre-existing memory the capture writes
        self.invalidated = None  # the error that invalidated the capture, if any
        self._fresh_storages = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in HOST_SYNC:
            self.invalidated = CaptureError(f"{func}: host synchronisation during CUDA graph capture (operation "
                                            f"not permitted when stream is capturing)")
            raise self.invalidated
        schema = func._schema
        if any(str(r.type) in ("Scalar", "float", "int", "bool") for r in schema.returns) \
                and not func.__name__.startswith(("is_", "sym_", "_has_")):  # metadata queries are fine
            self.invalidated = CaptureError(f"{func}: returns a host value during CUDA graph capture")
            raise self.invalidated
        inputs = _tensors((args, kwargs))
        # remember what the capture writes into that existed before it (on CUDA the capture writes nothing)
        for arg, value in zip(schema.arguments, itertools.chain(args, [kwargs.get(a.name) for a in
                                                                       schema.arguments[len(args):]])):
            if arg.alias_info is not None and arg.alias_info.is_write:
                for t in _tensors(value):
                    key = _storage(t)
                    if key is not None and key not in self._fresh_storages and key not in self.written:
                        storage = t.untyped_storage()
                        self.written[key] = (storage, storage.clone())
        out = func(*args, **kwargs)
        results = _tensors(out)
        if func.overloadpacket in UNINITIALISED:
            self._add_fresh(results)
            return out
        shared = {_storage(t) for t in inputs} - {None}
        new = [(i, t) for i, t in enumerate(results) if t.numel() and _storage(t) not in shared]
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        if new or mutates:  # a view's data is its base's: nothing to re-run
            self.calls.append((func, args, kwargs, new))
        self._add_fresh([t for _, t in new])
        return out

    def _add_fresh(self, tensors):
        for t in tensors:
            if _storage(t) is not None:
                self._fresh_storages.add(_storage(t))
                self.fresh.append(t)


@contextlib.contextmanager
def _untracked(tensors):
    """No autograd, no autocast, and every version counter as it was: a replay is invisible to autograd."""
    tensors = list(tensors)
    versions = [t._version for t in tensors]
    try:
        with torch.no_grad(), torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            yield
    finally:
        torch._C._autograd._unsafe_set_version_counter(tensors, versions)


def _garbage(t):
    if t.is_floating_point() or t.is_complex():
        t.fill_(math.nan)
    elif t.dtype != torch.bool:
        t.fill_(-12345)


class _State:
    capturing = None  # the graph being captured
    pools = itertools.count(1)
    captures = 0
    allocations = []  # per capture, in order: the bytes of each storage it allocated


def capture_count():
    """How many graphs have been captured under the emulation (in this process)."""
    return _State.captures


def capture_allocations():
    """Per capture (in order, this process): the size in bytes of each storage the capture allocated, factories
    and functional operators' results alike (on CUDA: memory taken from the graph's pool)."""
    return list(_State.allocations)


Stream, Event = cuda_stand_ins.Stream, cuda_stand_ins.Event
_STREAMS = cuda_stand_ins.Streams(Stream(stream_id=0))
current_stream, default_stream, stream = _STREAMS.current_stream, _STREAMS.default_stream, _STREAMS.stream


class device:
    """torch.cuda.device stand-in (a context manager that selects nothing)."""

    def __init__(self, device=None):
        self.idx = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def graph_pool_handle():
    return (0, next(_State.pools))


class CUDAGraph:
    """torch.cuda.CUDAGraph on CPU: see the module docstring."""

    def __init__(self, keep_graph=False):
        self._calls, self._tensors, self._pool = None, [], None

    def capture_begin(self, pool=None, capture_error_mode="global", **kwargs):
        if _State.capturing is not None:
            raise CaptureError("another CUDA graph capture is underway")
        if current_stream() is _STREAMS.default:
            raise CaptureError("CUDA graphs must be captured on a non-default stream")
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(f"capture_error_mode {capture_error_mode!r}")
        self._pool = pool if pool is not None else graph_pool_handle()
        self._recorder = _Recorder()
        _State.capturing = self
        self._recorder.__enter__()

    def capture_end(self):
        recorder = self._recorder
        recorder.__exit__(None, None, None)
        _State.capturing, self._recorder = None, None
        if recorder.invalidated is not None:  # as cudaStreamEndCapture: the capture ends, without a graph
            raise CaptureError("operation failed due to a previous error during capture") from recorder.invalidated
        self._calls = recorder.calls
        _State.captures += 1
        _State.allocations.append(list({_storage(t): t.untyped_storage().nbytes() for t in recorder.fresh}.values()))
        self._tensors = [t for call in recorder.calls for t in _tensors((call[1], call[2]))] + \
            [t for call in recorder.calls for _, t in call[3]]
        # the capture ran nothing on the device: what it allocated is garbage, what it wrote is unchanged
        with _untracked(recorder.fresh):
            for t in recorder.fresh:
                _garbage(t)
        for storage, before in recorder.written.values():
            storage.copy_(before)

    def instantiate(self):
        pass

    def replay(self):
        if self._calls is None:
            raise RuntimeError("replay of a CUDA graph that was not captured")
        with _untracked(self._tensors):
            for func, args, kwargs, new in self._calls:
                out = _tensors(func(*args, **kwargs))
                for i, t in new:
                    t.copy_(out[i])

    def reset(self):
        self._calls, self._tensors = None, []

    def pool(self):
        return self._pool

    def enable_debug_mode(self):
        pass

    def debug_dump(self, path):
        pass


def is_current_stream_capturing():
    return _State.capturing is not None


def _reset_floater_graph_caches(floater_rk4, setattr_):
    """Drop any cached captures in floater_rk4 (dicts/caches named *GRAPH*), so that each test captures anew."""
    for name in dir(floater_rk4):
        value = getattr(floater_rk4, name)
        if "GRAPH" in name.upper() and isinstance(value, dict):
            setattr_(floater_rk4, name, type(value)())
        elif "GRAPH" in name.upper() and hasattr(value, "cache_clear"):
            value.cache_clear()


def _capturable(y0, args, first_index):
    """floater_rk4's predicate for CPU: a training solve (from position 0, with gradient) is captured."""
    return first_index == 0 and torch.is_grad_enabled() and any(a.requires_grad for a in args)


@contextlib.contextmanager
def emulated_cuda_graphs(monkeypatch=None):
    """Installs the emulation in torch.cuda (and FLOATER's capture predicate for CPU); undone on exit (by
    `monkeypatch` at the end of the test, if given)."""
    own = monkeypatch is None
    if own:
        from _pytest.monkeypatch import MonkeyPatch

        monkeypatch = MonkeyPatch()
    try:
        cuda = torch.cuda
        for name, value in [("CUDAGraph", CUDAGraph), ("graph_pool_handle", graph_pool_handle), ("Stream", Stream),
                            ("Event", Event), ("stream", stream), ("current_stream", current_stream),
                            ("default_stream", default_stream), ("device", device),
                            ("is_current_stream_capturing", is_current_stream_capturing),
                            ("synchronize", lambda device=None: None), ("empty_cache", lambda: None)]:
            monkeypatch.setattr(cuda, name, value)
            if hasattr(torch.cuda.graphs, name):  # make_graphed_callables calls graph_pool_handle by this name
                monkeypatch.setattr(torch.cuda.graphs, name, value)
        monkeypatch.setattr(torch._C, "_host_emptyCache", lambda: None, raising=False)
        monkeypatch.setattr(torch.cuda.graph, "default_capture_stream", None)  # else a stand-in outlives us
        from fairseq_plugins.modules.floater import rk4 as floater_rk4

        monkeypatch.setattr(floater_rk4, "capturable", _capturable)
        _reset_floater_graph_caches(floater_rk4, monkeypatch.setattr)
        _reset_captures()
        yield
    finally:
        _reset_captures()  # emulated graphs must not outlive the emulation
        _STREAMS.reset()
        if own:
            monkeypatch.undo()


def _reset_captures():
    try:
        from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph
    except ImportError:  # code from before the module existed
        return
    graphs = getattr(floater_cuda_graph, "GRAPHS", floater_cuda_graph)  # older code: module functions
    graphs.reset()
