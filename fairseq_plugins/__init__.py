"""fairseq user-dir package: position encodings for Transformer MT (`--user-dir fairseq_plugins`)."""

import re

import torch

# The oldest supported torch (scripts/setup_env.sh reads this line): the relative attention's
# torch.is_autocast_enabled(device_type)/torch.get_autocast_dtype need 2.4, the patched fairseq's checkpoint
# loader torch.serialization.safe_globals 2.5 (older torch refuses every fairseq-train checkpoint).
TORCH_FLOOR = "2.5"

if tuple(int(v) for v in re.match(r"(\d+)\.(\d+)", str(torch.__version__)).groups()) < tuple(
        int(v) for v in TORCH_FLOOR.split(".")):
    raise ImportError(f"fairseq_plugins needs torch >= {TORCH_FLOOR}, found torch {torch.__version__} "
                      f"({torch.__file__}); see README.md, Set-up")

from . import models  # noqa: E402,F401  (registers models and architectures)
