"""FlexAttention's compiled call (``--attention-backend flex`` on CUDA), run on CPU under a counting
``torch.compile`` backend (aot_eager): one model's attention calls (encoder self-attention, decoder causal
self-attention, cross-attention, Shaw's two tail passes; with and without padding; the length and batch size
changing every batch, a batch of one sentence, sizes equal by chance) compile once per kind of call and never
recompile: a recompile per call variant reached dynamo's recompile limit, after which every call ran FlexAttention
unfused. The compiled call gives what the eager op gives."""
import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.testing import CompileCounterWithBackend

from fairseq_plugins.modules import fused_attention
from fairseq_plugins.modules.alibi import ALiBi
from fairseq_plugins.modules.positional_attention import PositionalSelfAttention
from fairseq_plugins.modules.relative_attention import RelativeMultiheadAttention
from fairseq_plugins.modules.t5_bias import T5Bias
from helpers.tiny_models import one_thread  # noqa: F401  (autouse fixture)

C, H, K = 8, 2, 4
# (T, B) of each batch: 2k+1 = 9 = T, one block of the mask (T <= 128) and several, one sentence, B = T = H
BATCHES = [(9, 3), (64, 2), (130, 4), (300, 1), (40, 5), (2, 2)]
# the kinds of call these batches make: score_mod (the scheme's, none for cross-attention) x (B = 1, one block)
KINDS = 2 * 3


def layers(name):
    """A model's self-attention layers: (encoder's, decoder's)."""
    torch.manual_seed(0)
    if name == "shaw":
        return tuple(RelativeMultiheadAttention(C, H, K, attention_backend="flex") for _ in range(2))
    make = {"t5": lambda causal: T5Bias(H, bidirectional=not causal, num_buckets=8, max_distance=6),
            "alibi": lambda causal: ALiBi(H)}[name]
    return tuple(PositionalSelfAttention(C, H, make(causal), attention_backend="flex") for causal in (False, True))


def model_calls(name):
    """Every attention output of a model's forward over BATCHES, padded and not."""
    encoder, decoder = layers(name)
    generator = torch.Generator().manual_seed(1)
    outputs = []
    for T, B in BATCHES:
        for padded in (False, True):
            x = torch.randn(T, B, C, generator=generator)
            left, right = torch.zeros(B, T, dtype=torch.bool), torch.zeros(B, T, dtype=torch.bool)
            left[0, :1] = right[0, -1:] = True  # fairseq's sources are padded on the left, its targets on the right
            causal = torch.triu(torch.full((T, T), float("-inf")), 1)
            outputs.append(encoder(x, x, x, key_padding_mask=left if padded else None, need_weights=False)[0])
            outputs.append(decoder(x, x, x, key_padding_mask=right if padded else None, attn_mask=causal,
                                   need_weights=False)[0])
            # cross-attention (the models' own is fairseq's): S = T + 3 keys, no score_mod
            q = x.view(T, B, H, C // H).permute(1, 2, 0, 3)
            memory = torch.randn(B, H, T + 3, C // H, generator=generator)
            memory_padding = torch.zeros(B, T + 3, dtype=torch.bool)
            memory_padding[-1, -2:] = padded
            mask = fused_attention.flex_mask(None, memory_padding if padded else None)
            outputs.extend(fused_attention.flex(q, memory, memory, None, (), mask, scale=0.5))
    return outputs


@pytest.fixture
def compiled_on_cpu(monkeypatch):
    """fused_attention.flex's compiled branch on CPU, counting compiles; reaching dynamo's recompile limit (an
    eager fallback) raises."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    monkeypatch.setitem(fused_attention.COMPILE_BACKENDS, "cpu", counter)
    monkeypatch.setattr(fused_attention, "_COMPILED", {})
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True), torch.no_grad():
        yield counter
    torch._dynamo.reset()


@pytest.mark.slow  # ~6 compiles and the same calls eagerly: ~15 s each
@pytest.mark.parametrize("name", ["t5", "alibi", "shaw"])
def test_a_models_calls_compile_once_per_kind_and_never_recompile(name, compiled_on_cpu):
    got = model_calls(name)
    compiles = compiled_on_cpu.frame_count
    assert len(fused_attention._COMPILED) == KINDS
    # dynamo's cache entries of each compiled copy (what its recompile limit counts): one, never a recompile
    entries = [len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__))
               for fn in fused_attention._COMPILED.values()]
    assert entries == [1] * KINDS, entries
    assert compiles <= KINDS + 1  # the first compile in a process may trace twice (a float scale made constant)
    fused_attention.COMPILE_BACKENDS.pop("cpu")  # the same calls on the eager op
    with torch.no_grad():
        want = model_calls(name)
    assert compiled_on_cpu.frame_count == compiles
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["t5", "alibi", "shaw"])
def test_score_mods_capture_tensors_and_plain_sizes_only(name, monkeypatch):
    """Inductor realizes as a buffer every captured input of FlexAttention's score_mod that is not a plain size
    symbol: a size computed in the graph (Shaw's −k, from a k that the compiled call sees as symbolic) failed the
    H100's compile ('ShapeAsConstantBuffer' object has no attribute 'dtype', results/gpu_check_2_fused.md). CPU's
    inductor has no flex with lse, so this reads the graph that inductor would be given."""
    import sympy

    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    monkeypatch.setitem(fused_attention.COMPILE_BACKENDS, "cpu", recording_backend)
    monkeypatch.setattr(fused_attention, "_COMPILED", {})
    encoder, _ = layers(name)
    with torch.no_grad():  # the public call refuses gradients on CPU, even while dynamo traces it
        for T, B in ((40, 3), (64, 2)):
            x = torch.randn(T, B, C)
            encoder(x, x, x, need_weights=False)
    torch._dynamo.reset()
    captured = [arg for gm in graphs for node in gm.graph.nodes
                if node.target is torch.ops.higher_order.flex_attention for arg in (*node.args[7], *node.args[8])]
    assert captured, "no FlexAttention call in the compiled graphs"
    sizes = [arg.meta["example_value"] for arg in captured
             if isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("example_value"), torch.SymInt)]
    computed = [str(s) for s in sizes if not isinstance(s.node.expr, sympy.Symbol)]
    assert not computed, f"sizes computed in the graph among the score_mod's captures: {computed}"
