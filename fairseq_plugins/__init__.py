"""fairseq user-dir package: position encodings for Transformer MT (`--user-dir fairseq_plugins`)."""

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
from . import optim  # noqa: E402,F401  (registers --optimizer torch_adam)
from .fairseq_check import log_once as _log_fairseq_once  # noqa: E402

_log_fairseq_once()  # on a fairseq without this project's patch: what is refused there, in one line


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


from . import exit_handling, fairseq_check  # noqa: E402

exit_handling.register()
# after the excepthook: --fused-update/--adam-impl on a fairseq without 04-fused-update.patch, one line
fairseq_check.refuse_fast_update_flags(sys.argv[1:])
