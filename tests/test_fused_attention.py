"""The default path's fused CPU kernel (fairseq_plugins/modules/fused_attention.py): a learned score bias stays on
torch's fused CPU SDPA kernel, and no (B, H, T, S) tensor waits for the backward (the unfused path kept one per
layer)."""
import pytest
import torch

from helpers.tiny_models import one_thread  # noqa: F401  (one_thread: autouse fixture)
from fairseq_plugins.modules.alibi import ALiBi
from fairseq_plugins.modules.positional_attention import PositionalSelfAttention
from fairseq_plugins.modules.t5_bias import T5Bias

T, B, C, H = 7, 2, 8, 2

SCORE_SCHEMES = {
    "t5": lambda: T5Bias(H, bidirectional=True, num_buckets=8, max_distance=6),
    "alibi": lambda: ALiBi(H),
}


@pytest.mark.parametrize("name", list(SCORE_SCHEMES))
def test_default_path_keeps_no_probabilities_for_the_backward(name):
    """Torch's CPU SDPA with a 3-D or learned mask kept every layer's (B, H, T, S) probabilities; the 4-D mask
    and BiasedFlashCPU keep the bias (1, H, T, S) at most."""
    torch.manual_seed(0)
    attn = PositionalSelfAttention(C, H, SCORE_SCHEMES[name]())
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, :2] = True  # left padding, as fairseq's sources
    x = torch.randn(T, B, C)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        attn(x, x, x, key_padding_mask=padding, need_weights=False)[0].sum()
    assert not [s for s in saved if len(s) == 4 and s[0] == B and s[-2:] == (T, T)], saved
