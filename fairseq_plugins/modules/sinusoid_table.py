"""fairseq's sinusoidal embedding with its model's float dtype and device at hand, on every fairseq: the base of
the schemes that index the table at positions of their own (SHAPE, CAPE, randomized positions)."""
import torch
from fairseq.modules import SinusoidalPositionalEmbedding


class SinusoidTable(SinusoidalPositionalEmbedding):
    """fairseq 0.12.2 marks the model's dtype with the buffer ``_float_tensor``; fairseq's main removed it (its
    ``weights`` became a buffer). An empty buffer of our own follows the model's ``.half()``/``.to()`` on both, and
    is not persistent, so checkpoints hold exactly what fairseq's own embedding saves."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("model_float", torch.empty(0), persistent=False)
