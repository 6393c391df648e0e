"""--checkpoint-activations / --offload-activations in the plugin archs: position_transformer (every scheme of the
table with architectures of a plugin family but FLOATER's, transformer_every_layer_pos and relative_transformer
among them) wrap every block as fairseq's `transformer` does (fairseq's checkpoint_wrapper; offloading
implies checkpointing) and compute what the unwrapped model computes, with dropout: the same outputs bit for bit, the
same gradients up to float64 rounding; floater_transformer refuses both flags in one line."""
import functools

import pytest
import torch
from fairseq.modules.checkpoint_activations import _checkpointed_forward

from helpers import tiny_models
from helpers.tiny_models import batch, one_thread  # noqa: F401  (one_thread: autouse fixture)
from fairseq_plugins.schemes import SCHEMES, by_model

FLOATER = by_model("floater").arch("tiny")  # refuses both flags (the last test)


def build(arch, **kw):
    return tiny_models.build(arch, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, **kw).double()


def blocks(model):
    return list(model.encoder.layers) + list(model.decoder.layers)


def forward_backward(model):
    model.train()
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout masks in both models
    src, lengths, prev = batch()
    out = model(src, lengths, prev)[0]
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters()}


CASES = [(s.arch("tiny"), {}) for s in SCHEMES.values()
         if s.arch_prefix and s.family != "transformer" and s.arch("tiny") != FLOATER]
# gradients reach the learned table through every block
CASES.append(("transformer_every_layer_pos_tiny", {"learned_pos": True}))


@pytest.mark.parametrize("flag", ["checkpoint_activations", "offload_activations"])
@pytest.mark.parametrize("arch,kw", CASES)
def test_checkpointed_blocks_compute_exactly_the_unwrapped_model(arch, kw, flag):
    plain, wrapped = build(arch, **kw), build(arch, **kw, **{flag: True})
    wrapped.load_state_dict(plain.state_dict())
    assert not any(hasattr(block, "precheckpoint_forward") for block in blocks(plain))
    for block in blocks(wrapped):  # fairseq's checkpoint_wrapper, offloading to CPU only with --offload-activations
        assert isinstance(block.forward, functools.partial) and block.forward.func is _checkpointed_forward
        assert block.forward.args[1] is (flag == "offload_activations")
    out, grads = forward_backward(plain)
    out_w, grads_w = forward_backward(wrapped)
    assert torch.equal(out, out_w)
    assert grads.keys() == grads_w.keys()
    for name, grad in grads.items():
        assert (grad is None) == (grads_w[name] is None), name
        # The recomputing backward adds the same terms in another order (fairseq's own `transformer` too):
        # equal up to float64 rounding. A block recomputed without its position signal is off by O(1).
        if grad is not None:
            torch.testing.assert_close(grads_w[name], grad, rtol=1e-9, atol=1e-12, msg=name)
    assert grads["encoder.layers.0.fc1.weight"].abs().sum() > 0
    if kw.get("learned_pos"):
        assert grads["encoder.embed_positions.weight"].abs().sum() > 0


@pytest.mark.parametrize("flag", ["checkpoint_activations", "offload_activations"])
def test_every_layer_pos_incremental_decoding_with_checkpointed_blocks(flag):
    model = build("transformer_every_layer_pos_tiny", **{flag: True}).eval()
    src, lengths, prev = batch()
    prev[1, -2:] = 5
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        full = model.decoder(prev, enc)[0]
        state = {}
        steps = [model.decoder(prev[:, : t + 1], enc, incremental_state=state)[0] for t in range(prev.size(1))]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("flag", ["--checkpoint-activations", "--offload-activations"])
def test_floater_refuses_activation_checkpointing_in_one_line(flag):
    with pytest.raises(ValueError) as error:
        build(FLOATER, **{flag.lstrip("-").replace("-", "_"): True})
    message = str(error.value)
    assert message.startswith(f"FLOATER does not support {flag}:") and "\n" not in message  # the flag given
