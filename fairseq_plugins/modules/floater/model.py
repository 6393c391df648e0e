"""FLOATER's work around a forward, in its own model and stack classes (``models/position_transformer.py``
composes them with its own: ``FloaterTransformerModel``, ``FloaterEncoder``, ``FloaterDecoder``; a model with a
FLOATER stack is a ``FloaterTransformerModel`` whatever its architecture). The other schemes' stacks know none of it.

- ``FloaterModel``: at build, the two stacks' flows joined into one ``FloaterPositions`` (solved together) and
  bound to the model, whose optimizer steps they count where nobody sets the update number (``update_count.py``);
  each forward, one solve for both stacks at the batch's longest sequence (or none: caches); after an update's
  last backward, the gradients the shared solve deferred (``all_reduce_grads``, which fairseq's trainer calls).
- ``FloaterStack``: each forward of a stack, Δb bound to its projections at each token's row (``Floater.prepare``).
- ``FloaterDecoderSteps``: while decoding step by step, non-finite features stop with one line
  (``Floater.check_decoding_step``).
"""

from contextlib import ExitStack, contextmanager

from .scheme import Floater


def floater_modules(model):
    """The model's FLOATER modules, encoder's first."""
    return [m for m in (model.encoder.position_scheme, model.decoder.position_scheme) if isinstance(m, Floater)]


class FloaterModel:
    """First base of a ``PositionTransformerModel`` with a FLOATER stack."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        modules = floater_modules(self)
        if len(modules) == 2:
            modules[0].join(modules[1])  # the stacks' flows solved together
        for module in modules:
            module.bind_model(self)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, *args, **kwargs):
        longest = max(src_tokens.size(1), prev_output_tokens.size(1))
        with ExitStack() as batch:  # one model forward: its longest sequence (one solve, both stacks)
            for module in floater_modules(self):
                batch.enter_context(module.batch(longest))
            return super().forward(src_tokens, src_lengths, prev_output_tokens, *args, **kwargs)

    def all_reduce_grads(self):
        """fairseq's trainer calls this after the last micro-batch's backward of an update, before it scales and
        clips the gradients (``FairseqOptimizer.all_reduce_grads``: directly in one process, through
        ModuleProxyWrapper under pytorch_ddp, after legacy_ddp's own reduction by a patch hunk): the gradient the
        shared solve deferred (``--floater-shared-solve``)."""
        for module in floater_modules(self):
            module.complete_gradients()


class FloaterStack:
    """First base of a stack whose scheme is FLOATER: its projections biased for each forward."""

    @contextmanager
    def positions(self, tokens, encoder_out=None, incremental_state=None):
        with super().positions(tokens, encoder_out, incremental_state), \
                self.position_scheme.prepare(self, tokens, encoder_out, incremental_state):
            yield


class FloaterDecoderSteps:
    """First base of a FLOATER decoder: each incremental decoding step's features checked."""

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None,
                         full_context_alignment=False, alignment_layer=None, alignment_heads=None):
        x, extra = super().extract_features(prev_output_tokens, encoder_out, incremental_state,
                                            full_context_alignment, alignment_layer, alignment_heads)
        if incremental_state is not None:
            self.position_scheme.check_decoding_step(self, x, prev_output_tokens, encoder_out)
        return x, extra
