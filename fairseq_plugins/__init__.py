"""fairseq user-dir package: position encodings for Transformer MT (`--user-dir fairseq_plugins`)."""

import atexit
import re
import sys

import torch

# The oldest supported torch (scripts/setup_env.sh reads this line): the relative attention's
# torch.is_autocast_enabled(device_type)/torch.get_autocast_dtype need 2.4, the patched fairseq's checkpoint
# loader torch.serialization.safe_globals 2.5 (older torch refuses every fairseq-train checkpoint).
TORCH_FLOOR = "2.5"

if tuple(int(v) for v in re.match(r"(\d+)\.(\d+)", str(torch.__version__)).groups()) < tuple(
        int(v) for v in TORCH_FLOOR.split(".")):
    raise ImportError(f"fairseq_plugins needs torch >= {TORCH_FLOOR}, found torch {torch.__version__} "
                      f"({torch.__file__}); see docs/setup.md")

from . import models  # noqa: E402,F401  (registers models and architectures)


def _one_line_errors(default_hook):
    """Uncaught errors whose message already says what happened and which flag helps (``one_line = True``:
    FLOATER's overflow while decoding, a solve gone non-finite) end a fairseq command with that one line, not
    a traceback through fairseq's beam search; every other error keeps Python's default report."""

    def excepthook(kind, value, traceback):
        if getattr(value, "one_line", False):
            print(f"{kind.__name__}: {value}", file=sys.stderr)
        else:
            default_hook(kind, value, traceback)

    excepthook.default_hook = default_hook
    return excepthook


if not hasattr(sys.excepthook, "default_hook"):  # once, whatever the number of imports
    sys.excepthook = _one_line_errors(sys.excepthook)


def _destroy_gloo_process_group():
    """fairseq returns from training without destroying its process group. A gloo group's worker threads can
    still hold finished work (tensors) when the interpreter shuts down; releasing it then takes the GIL, which
    a finalizing interpreter no longer grants, and a run that finished aborts ("terminate called without an
    active exception", exit status -6, or a segfault). Destroyed at exit, while Python is still whole, the group
    goes quietly. Gloo only: NCCL's teardown is left to torch, as fairseq leaves it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()
        _drop_group_references(dist.ProcessGroup)


def _drop_group_references(group_type):
    """destroy_process_group() unregisters every group, but a group (and its threads) lives on while Python
    holds it. Two references do in every fairseq run: fairseq caches its data-parallel group on
    get_global_group, and torch.distributed.nn.functional, first imported after the group's creation (by
    torch.optim's first optimizer), binds the world group as its functions' default ``group``."""
    fairseq_distributed = sys.modules.get("fairseq.distributed.utils")
    if fairseq_distributed is not None:
        vars(fairseq_distributed.get_global_group).pop("_global_group", None)
    functional = sys.modules.get("torch.distributed.nn.functional")
    for f in vars(functional).values() if functional is not None else ():
        defaults = getattr(f, "__defaults__", None)
        if isinstance(defaults, tuple) and any(isinstance(d, group_type) for d in defaults):
            f.__defaults__ = tuple(None if isinstance(d, group_type) else d for d in defaults)


atexit.register(_destroy_gloo_process_group)
