"""``FakeCuda``: fake tensors on cuda:0 with ``torch.cuda`` stubbed, and a record of what would hurt on a GPU.

Import only in a process that called ``fake_cuda.preload`` before importing torch (see ``__init__.py``).

Inside ``with FakeCuda() as fc:`` every tensor is a fake tensor (shapes, dtypes and devices; no values), and
``torch.device('cuda')``/``.cuda()``/``.to('cuda')`` give cuda:0 tensors. ``fc.findings`` then lists:

- ``device mismatch``: an operator given non-scalar tensors on cuda and on cpu (on a GPU it raises; torch's
  fake tensors raise too, after the record is made). Zero-dimensional cpu tensors are allowed, as torch allows
  them; so are copies between devices (``copy_``/``_to_copy``: transfers, recorded below).
- ``host sync``: the host waits for the device: an operator that reads a cuda tensor's value into Python
  (``_local_scalar_dense``: ``.item()``, ``bool()``, ``int()``, ``float()``, ``.tolist()``; ``is_nonzero``,
  ``equal``), one whose output shape depends on values (``nonzero``, ``masked_select``, ``unique`` ...), a
  copy from cuda to cpu (``.cpu()``), and ``torch.cuda.synchronize``/``Stream.synchronize``/
  ``Event.synchronize``. Fake tensors have no value to give: the record is made and a placeholder returned
  (True for a bool, 1 for a number): code that branches on it follows one arbitrary branch. Operators whose
  output shape depends on values cannot continue and raise (torch's ``DynamicOutputShapeException``).
- ``cpu tensor in capture`` / ``host copy in capture``: a cpu tensor made, or a host<->device copy, while a
  CUDA graph capture is open (``torch.cuda.graph``, ``CUDAGraph.capture_begin``): a captured graph replays
  device work only, so such a tensor would be stale or the capture would fail.
- each finding says whether a capture was open (``in_capture``): a sync during a capture is an error on a GPU.

Each finding names the innermost frame outside torch and outside this file (``where``: path:line
(function)), and the torch function it called (``via``), once per distinct (kind, op, where, in_capture).
"""
import sys
import warnings
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.cuda.graphs
import torch.onnx.operators
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import cuda_stand_ins

TORCH_DIR = str(Path(torch.__file__).resolve().parent)
HERE = str(Path(__file__).resolve())
SITE = str(Path(torch.__file__).resolve().parents[1])
REPO = str(Path(__file__).resolve().parents[3])
# torch's own frames between an operator call and a dispatch mode: not the torch function the code called
DISPATCH_PLUMBING = tuple(f"{TORCH_DIR}/{p}" for p in (
    "_compile.py", "_dynamo/", "_ops.py", "utils/_python_dispatch.py", "utils/_stats.py", "_subclasses/"))

# operators that read a tensor's value on the host
READS_VALUE = {"_local_scalar_dense", "item", "is_nonzero", "equal", "allclose"}
# operators whose output shape depends on values: the host must wait for the device to size the output
VALUE_SHAPED = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_consecutive", "unique_dim",
                "repeat_interleave", "bincount", "histc", "nonzero_static"}
TRANSFERS = {"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "copy"}


@dataclass(frozen=True)
class Finding:
    kind: str  # "device mismatch", "host sync", "cpu tensor in capture", "host copy in capture"
    op: str  # the aten operator or torch.cuda function
    where: str  # innermost frame outside torch and this package: "path:line (function)"
    via: str  # the torch function it called, its outermost frame ("" when none: an operator called directly)
    in_capture: bool
    detail: str = ""

    def as_dict(self):
        return asdict(self)


def _short(filename: str) -> str:
    for root in (SITE, REPO):  # site-packages first: a virtual environment may live inside the repository
        if filename.startswith(root + "/"):
            return filename[len(root) + 1:]
    return filename


def caller():
    """(where, via): the innermost frame outside torch and outside this file, and the torch function it
    called (the outermost torch frame below it; "" when it called an operator directly)."""
    frame, via = sys._getframe(1), ""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(TORCH_DIR):
            if not name.startswith(DISPATCH_PLUMBING):
                via = f"{_short(name)}:{frame.f_lineno} ({frame.f_code.co_name})"
        elif name != HERE:
            return f"{_short(name)}:{frame.f_lineno} ({frame.f_code.co_name})", via
        frame = frame.f_back
    return "?", via


def _placeholder(tensor):
    """A stand-in for a value fake tensors do not have: True for bool, 1 for integers and floats."""
    if tensor.dtype == torch.bool:
        return True
    return 1 if not tensor.is_floating_point() and not tensor.is_complex() else 1.0


class DeviceChecks(TorchDispatchMode):
    """Records device mismatches, host syncs and cpu tensors made during a capture (sits above the fake mode)."""

    def __init__(self):
        super().__init__()
        self.findings = []
        self._seen = set()
        self.capturing = 0  # open captures (torch.cuda.graph / CUDAGraph.capture_begin)
        self.ops = 0

    def record(self, kind, op, detail=""):
        where, via = caller()
        key = (kind, op, where, bool(self.capturing))
        if key not in self._seen:
            self._seen.add(key)
            self.findings.append(Finding(kind, op, where, via, bool(self.capturing), detail))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        name = func.overloadpacket.__name__
        tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        on_cuda = any(t.device.type == "cuda" for t in tensors)
        if name in TRANSFERS:
            out_device = kwargs.get("device")
            srcs = {t.device.type for t in tensors}
            dst = torch.device(out_device).type if out_device is not None else (
                tensors[0].device.type if name in ("copy_", "_copy_from", "_copy_from_and_resize") else None)
            if name in ("_copy_from", "_copy_from_and_resize"):
                dst = tensors[1].device.type
            if dst == "cpu" and "cuda" in srcs:
                self.record("host sync", name, "copy from cuda to cpu")
            if self.capturing and len(srcs | {dst} - {None}) > 1:
                self.record("host copy in capture", name, f"{sorted(srcs)} -> {dst}")
        else:
            devices = {t.device.type for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
            if len(devices) > 1:
                shapes = ", ".join(f"{t.device.type}{tuple(t.shape)}" for t in tensors)
                self.record("device mismatch", name, shapes)
        if name in VALUE_SHAPED and on_cuda:
            self.record("host sync", name, "output shape depends on values")
        if name in READS_VALUE and on_cuda:
            self.record("host sync", name, "value read on the host")
            if name in ("_local_scalar_dense", "item", "is_nonzero"):
                return _placeholder(tensors[0])
            if name in ("equal", "allclose"):
                return True
        if name in ("_local_scalar_dense", "item") and tensors and not tensors[0].device.type == "cuda":
            try:  # a cpu tensor: no device sync; fake constants (from Python literals) have their value
                return func(*args, **kwargs)
            except torch._subclasses.fake_tensor.DataDependentOutputException:
                return _placeholder(tensors[0])
        out = func(*args, **kwargs)
        if self.capturing:
            made = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type == "cpu"]
            if made and name not in TRANSFERS:
                self.record("cpu tensor in capture", name, ", ".join(str(tuple(t.shape)) for t in made))
        return out


# -- torch.cuda stand-ins --------------------------------------------------------------------------------
# Each stands in for the torch.cuda function of the same name while a FakeCuda is open; they check calls,
# not CUDA (no device work exists to order, wait for or capture).

_ACTIVE = []  # the open FakeCuda (one at a time)


def _checks() -> DeviceChecks:
    return _ACTIVE[-1].checks


class Stream(cuda_stand_ins.Stream):
    """torch.cuda.Stream on cuda:0; ``synchronize`` records a host sync."""

    def __init__(self, device=None, priority=0, stream_id=None, **kwargs):
        super().__init__(torch.device("cuda", 0), priority, stream_id)

    def host_sync(self, what):
        _checks().record("host sync", what)


class Event(cuda_stand_ins.Event):
    """torch.cuda.Event; ``synchronize`` records a host sync."""

    def host_sync(self, what):
        _checks().record("host sync", what)


Stream.event_type = Event
_STREAMS = cuda_stand_ins.Streams(Stream(stream_id=0))
stream = _STREAMS.stream


def _index(device):
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    return torch.device(device).index or 0


class device:
    """torch.cuda.device: one device exists (cuda:0); another index raises, as it would on a 1-GPU machine."""

    def __init__(self, device):
        set_device(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def set_device(device):
    if _index(device) not in (0, -1):
        raise RuntimeError(f"fake CUDA has one device (cuda:0), asked for {device}")


def synchronize(device=None):
    _checks().record("host sync", "torch.cuda.synchronize")


class CUDAGraph:
    """torch.cuda.CUDAGraph: ``capture_begin``/``capture_end`` open and close a capture (DeviceChecks then
    flags cpu tensors, host copies and syncs); ``replay`` does nothing (fake outputs already have their shapes:
    the static outputs of the capture). Counts captures and replays."""

    def __init__(self, keep_graph=False):
        self.captured, self.replays = False, 0

    def capture_begin(self, pool=None, capture_error_mode="global", **kwargs):
        if _checks().capturing:
            raise RuntimeError("a CUDA graph capture is already open")  # one capture at a time, as on a GPU
        _checks().capturing += 1
        _ACTIVE[-1].captures += 1

    def capture_end(self):
        _checks().capturing -= 1
        self.captured = True

    def replay(self):
        if not self.captured:
            raise RuntimeError("replay of a graph that was not captured")
        self.replays += 1
        _ACTIVE[-1].replays += 1

    def reset(self):
        self.captured = False

    def pool(self):
        return ("fake_pool", id(self))

    def instantiate(self):
        pass


class graph:
    """torch.cuda.graph: a capture into ``cuda_graph`` on a side stream; like torch's, it synchronises first
    (recorded as a host sync via torch.cuda.graph, outside the capture)."""

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", **kwargs):
        self.cuda_graph, self.stream = cuda_graph, stream or Stream()

    def __enter__(self):
        _checks().record("host sync", "torch.cuda.synchronize", "torch.cuda.graph: before the capture")
        self._stream = stream(self.stream)
        self._stream.__enter__()
        self.cuda_graph.capture_begin()

    def __exit__(self, *exc):
        self.cuda_graph.capture_end()
        self._stream.__exit__(*exc)
        return False


def graph_pool_handle():
    return ("fake_pool", object())


def is_current_stream_capturing():
    return bool(_ACTIVE and _checks().capturing)


def _shape_as_tensor(x):
    """torch._shape_as_tensor and torch.onnx.operators.shape_as_tensor (fairseq's sinusoidal embedding): ATen's
    version writes the sizes into a new cpu tensor's memory, which a fake tensor does not have, and a fake cpu
    tensor would not give its values back. This returns the sizes as Python ints (``torch.Size``): fairseq's
    eager path uses them only as sizes and indices, where an int does what the one-element cpu tensor does
    (its ONNX-export path would differ; it is not used in training or generation)."""
    return torch.Size(x.shape)


STUBS = dict(
    is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0, set_device=set_device,
    device=device, Stream=Stream, Event=Event, stream=stream, current_stream=_STREAMS.current_stream,
    default_stream=_STREAMS.default_stream, synchronize=synchronize, empty_cache=lambda: None,
    CUDAGraph=CUDAGraph, graph=graph, graph_pool_handle=graph_pool_handle,
    is_current_stream_capturing=is_current_stream_capturing,
    get_device_capability=lambda device=None: (8, 0), get_device_name=lambda device=None: "fake cuda",
    is_bf16_supported=lambda *a, **k: True, manual_seed=lambda seed: None, manual_seed_all=lambda seed: None,
)
# names torch.cuda.make_graphed_callables (the real one, used as is) looks up in its own module
GRAPH_MODULE_STUBS = dict(graph_pool_handle=graph_pool_handle, is_current_stream_capturing=is_current_stream_capturing)


class _FakeMode(FakeTensorMode):
    """FakeTensorMode that never runs a real kernel on cuda: it asks ``torch.cuda.is_available()`` (stubbed
    True here) to decide whether it may compute a copy of a real tensor to cuda for real (constant
    propagation), which on a CPU build fails ("Could not run 'aten::empty_strided' ... 'CUDA' backend")."""

    avoid_device_init = True


def to_cuda(module: torch.nn.Module) -> torch.nn.Module:
    """``module.cuda()`` for a module built outside the FakeCuda (real cpu tensors): each parameter and buffer
    becomes a fake cuda:0 tensor, in place. (``Module.to`` cannot do it: it swaps fake parameters in place,
    which the fake mode's weak references forbid.) A tensor shared by several modules stays shared; Python
    attributes of parameters (e.g. ``may_skip_update``) are kept; plain tensor attributes stay where they
    are, as ``.cuda()`` leaves them."""
    if not _ACTIVE:
        raise RuntimeError("to_cuda needs an open FakeCuda")
    moved = {}
    with torch.no_grad():
        for m in module.modules():
            for table in (m._parameters, m._buffers):
                for name, t in table.items():
                    if t is None:
                        continue
                    if id(t) not in moved:
                        new = t.detach().to("cuda")
                        if isinstance(t, torch.nn.Parameter):
                            new = torch.nn.Parameter(new, requires_grad=t.requires_grad)
                            new.__dict__.update(t.__dict__)
                        moved[id(t)] = (t, new)  # t kept alive: ids stay unique during the walk
                    table[name] = moved[id(t)][1]
    return module


class FakeCuda:
    """Fake tensors with cuda:0, torch.cuda stubbed, DeviceChecks recording. One open at a time.

    ``findings``: the records (``Finding``); ``captures``/``replays``: graph captures and replays seen;
    ``guard_syncs``: synchronisations asked of the C++ guard (stream/event/device), if ``lib`` is given.
    """

    def __init__(self, lib=None):
        self.lib = lib
        self.checks = DeviceChecks()
        self.captures = self.replays = 0
        self.fake_mode = _FakeMode(allow_non_fake_inputs=True)  # real tensors met inside become fakes

    @property
    def findings(self):
        return self.checks.findings

    def guard_syncs(self):
        return int(self.lib.fake_cuda_syncs()) if self.lib is not None else 0

    def __enter__(self):
        if _ACTIVE:
            raise RuntimeError("one FakeCuda at a time")
        self._stack = ExitStack()
        for module, stubs in ((torch.cuda, STUBS), (torch.cuda.graphs, GRAPH_MODULE_STUBS),
                              (torch, dict(_shape_as_tensor=_shape_as_tensor)),
                              (torch.onnx.operators, dict(shape_as_tensor=_shape_as_tensor))):
            for name, stub in stubs.items():
                self._stack.callback(setattr, module, name, getattr(module, name))
                setattr(module, name, stub)
        self._stack.enter_context(warnings.catch_warnings())
        # fake tensors have no memory: data_ptr() is 0 (torch warns; make_graphed_callables compares them)
        warnings.filterwarnings("ignore", "Accessing the data pointer of FakeTensor")
        _ACTIVE.append(self)
        self._stack.callback(_ACTIVE.pop)
        self._stack.enter_context(self.fake_mode)
        self._stack.enter_context(self.checks)
        return self

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)
