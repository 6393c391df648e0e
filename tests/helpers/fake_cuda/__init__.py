"""CUDA device semantics on a CPU build of torch, for tests: fake tensors on ``device='cuda'``.

Fake tensors (``torch._subclasses.fake_tensor.FakeTensorMode``) carry a device, a shape and a dtype but no
values, so a CPU build can run a model "on cuda:0" and torch's own device checks apply (an operator that mixes
a cuda and a cpu tensor raises, as on a GPU). What the CPU build lacks is the CUDA runtime that torch asks for
around the operators: autograd's engine takes a device guard and the current stream of every device it sees
(``guard.cpp`` registers a do-nothing CUDA guard and ATen's CUDA hooks: one device, streams that are only ids,
events that never wait), and Python code calls ``torch.cuda.*`` (``mode.py`` stubs them for the duration of
a check, and records device mismatches, host synchronisations and CPU tensors made during a graph capture).

Why a child process: ATen creates its CUDA hooks once, when ``torch._C`` is first imported, and keeps them;
hooks registered later are never asked. So ``preload`` must run before ``import torch``, and checks run in a
fresh interpreter (``check_models.py``), never in the test process itself (whose torch is already imported,
and whose other tests should not see a CUDA guard). This module therefore imports torch only inside
``build``, which runs in the parent.

What this cannot check: values (every number is fake: no NaN, no numerical result), kernels (no CUDA code
runs, so nothing about speed or memory), real streams and events, and anything torch's fake-tensor rules do
not model (see ``mode.py`` for the operators it has to stand in for).
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "guard.cpp"


class BuildError(RuntimeError):
    """No C++ compiler, or the guard library did not compile or link (the message holds the compiler's output)."""


def compiler() -> str:
    """The C++ compiler to use (``$CXX``, else ``c++``/``g++``), or "" when there is none."""
    for name in (os.environ.get("CXX"), "c++", "g++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return ""


def build(cache_dir=None, timeout: float = 120) -> Path:
    """Compile guard.cpp into a shared library linked against torch's c10 and torch_cpu, once per source,
    torch version and compiler; returns its path. Cached under ``cache_dir`` (default: torch's extension
    directory, ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``). Raises BuildError."""
    import torch  # here, not at module level: the child process must preload before importing torch
    from torch.utils import cpp_extension

    cxx = compiler()
    if not cxx:
        raise BuildError("no C++ compiler found ($CXX, c++, g++)")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    libs = cpp_extension.library_paths()[0]
    flags = ["-shared", "-fPIC", "-O1", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-w"]
    flags += [f"-I{p}" for p in cpp_extension.include_paths()]
    link = [f"-L{libs}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{libs}"]  # rpath: loadable before torch is
    key = "\0".join([SOURCE.read_text(), torch.__version__, cxx, *flags, *link])
    key = hashlib.sha256(key.encode()).hexdigest()[:16]
    root = Path(cache_dir or os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    out = root / f"fake_cuda_{key}" / "fake_cuda.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:  # libraries after the source: linkers that drop unused libraries (--as-needed) judge them in order
        proc = subprocess.run([cxx, *flags, str(SOURCE), *link, "-o", str(tmp)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BuildError(f"compiling {SOURCE.name} took over {timeout:.0f} s")
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise BuildError(f"{cxx} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    tmp.replace(out)  # atomic: a concurrent build of the same key writes the same file
    return out


def preload(library) -> ctypes.CDLL:
    """Load the guard library (registering the CUDA guard and hooks). Must run before ``import torch``."""
    import sys

    if "torch" in sys.modules:
        raise RuntimeError("fake_cuda.preload must run before torch is imported (ATen keeps the CUDA hooks "
                           "it finds at import)")
    lib = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    lib.fake_cuda_syncs.restype = ctypes.c_int64
    return lib
