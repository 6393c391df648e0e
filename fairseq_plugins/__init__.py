"""fairseq user-dir package: position encodings for Transformer MT (`--user-dir fairseq_plugins`)."""

from . import models  # noqa: F401  (registers models and architectures)
