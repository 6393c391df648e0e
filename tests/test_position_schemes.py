"""The position schemes of the table (fairseq_plugins/schemes.py), one contract for all:

- each scheme inside self-attention (every row of kind score bias, rotary or projection biases: T5 bias, ALiBi,
  KERPLE, FIRE, RoPE, FLOATER) against its naive reference (tests/helpers/scheme_references.py: a missing one fails
  by name) written from its paper's equation, loop by loop in float64 (outputs and gradients, with padding and
  the causal mask);
- what each stack adds to its token embeddings, against a naive float64 reference (SHAPE, as its authors' code:
  the sinusoid at position + k, one k in 0..K-1 per sequence in training, K at evaluation, pads untouched; NoPE's
  decoder and the attention schemes: nothing); T5's table starts as T5's own code starts it;
- for every scheme with architectures: incremental decoding with beam reordering == the full forward; a sentence
  alone == the same sentence left-padded in a batch; a 1,000-token source; beam search; the hub interface
  translates as fairseq-generate; scripting refused in one line; a bad flag is one line; no (B, H, T, T, d)
  tensor in a forward and backward;
- the table itself: every registered architecture of the plugins is in it and every one it names is registered,
  with the row's model family;
- the contract (``modules/position_scheme.py``): every scheme position_transformer builds is a ``PositionScheme``
  class; each owns its flags (adds them, validates no other), and one scheme's flag on another's model is
  refused in one line; a scheme that leaves the hooks out is fairseq's attention.
"""
import argparse
import contextlib
import io
import math
import re
import subprocess

import pytest
import torch
from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
from fairseq.modules import SinusoidalPositionalEmbedding
from fairseq.sequence_generator import SequenceGenerator
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conftest import BIN, REPO, run
from helpers.precision_harness import build_trainer
from helpers.small_task import small_data
from helpers import tiny_models
from helpers.scheme_references import REFERENCES, SELF_ATTENTION_KINDS, reference, rope_naive, t5_bucket_naive
from helpers.tiny_models import EOS, PAD, TASK, VOCAB, fixed_batch, one_thread  # noqa: F401  (one_thread: autouse fixture)
from fairseq_plugins.modules.alibi import ALiBi, alibi_slopes
from fairseq_plugins.modules.cape import CapePositionalEmbedding
from fairseq_plugins.flags import FlagError
from fairseq_plugins.models.position_transformer import PositionTransformerModel, add_position_args
from fairseq_plugins.flags import add_flags
from fairseq_plugins.modules.position_scheme import PositionScheme, ProjectionBiases, ScoreBias
from fairseq_plugins.schemes import FAMILY_SCHEMES, KINDS, NEW_SCHEMES, POSITION_TRANSFORMER, SCHEMES, Scheme, \
    architectures, by_model
from fairseq_plugins.modules.positional_attention import PositionalSelfAttention
from fairseq_plugins.modules.randomized_positions import RandomizedPositionalEmbedding
from fairseq_plugins.modules.rope import RoPE
from fairseq_plugins.modules.shape_positions import ShapePositionalEmbedding
from fairseq_plugins.modules.t5_bias import T5Bias, relative_bucket

ARCHS = [SCHEMES[name].arch("tiny") for name in FAMILY_SCHEMES]  # position_transformer's schemes
TABLE_ARCHS = [s.arch("tiny") for s in SCHEMES.values() if s.arch_prefix]  # every scheme with architectures
SELF_ATTENTION_SCHEMES = [n for n, s in SCHEMES.items() if s.kind in SELF_ATTENTION_KINDS]  # each needs a reference


def build(arch, **kw):
    model = tiny_models.build(arch, **kw)
    with torch.no_grad():  # T5's table: larger than its initialisation, so that the bias matters
        for module in model.modules():
            if isinstance(module, T5Bias):
                module.bias.weight.normal_(std=0.5)
    return model


# -- naive references, from the papers' equations (each scheme's: tests/helpers/scheme_references.py) -----------

def naive_attention(attn, x, padding, causal, bias_fn=None, rotate_fn=None, delta_fn=None, rotate_k_fn=None):
    """out_i = Σ_j softmax_j(e_ij) v_j, e_ij = (R_i q_i)·(R_j k_j)/sqrt(d) + bias_h(i, j), loop by loop (R_j k_j
    by rotate_k_fn where given: a rotation that treats keys differently, xPos'; by rotate_fn otherwise); with
    delta_fn(projection, b, i), q_i = W_q x_i + b_q(0) + Δb_q(t_i) (likewise k, v). i and j in R and the bias are
    positions in the sentence (the papers' i, j), counted from its first real token: a left-padded sentence's
    logits are its logits alone."""
    T, B, C = x.shape
    H, d = attn.num_heads, attn.head_dim
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    if delta_fn is not None:
        q, k, v = ([[y[i, b] + delta_fn(j, b, i) for b in range(B)] for i in range(T)] for j, y in enumerate((q, k, v)))
        q, k, v = (torch.stack([torch.stack(row) for row in y]) for y in (q, k, v))
    out = torch.zeros(T, B, C, dtype=x.dtype)
    rotate_k_fn = rotate_k_fn or rotate_fn
    rows = []
    for b in range(B):
        lead = int(padding[b].long().cumprod(0).sum())  # its left padding
        for h in range(H):
            sl = slice(h * d, (h + 1) * d)
            for i in range(T):
                qi = q[i, b, sl] if rotate_fn is None else rotate_fn(q[i, b, sl], i - lead)
                logits = []
                for j in range(T):
                    if padding[b, j] or (causal and j > i):
                        logits.append(torch.tensor(float("-inf"), dtype=x.dtype))
                        continue
                    kj = k[j, b, sl] if rotate_k_fn is None else rotate_k_fn(k[j, b, sl], j - lead)
                    e = (qi * kj).sum() / math.sqrt(d)
                    logits.append(e + (bias_fn(h, i - lead, j - lead) if bias_fn else 0.0))
                p = torch.softmax(torch.stack(logits), 0)
                rows.append(((b, h, i), (p[:, None] * v[:, b, sl]).sum(0)))
    for (b, h, i), value in rows:
        out[i, b, h * d:(h + 1) * d] = value
    return attn.out_proj(out)


def test_t5_buckets_are_the_papers():
    for bidirectional in (True, False):
        relative = torch.arange(-300, 301)
        got = relative_bucket(relative, bidirectional, 32, 128).tolist()
        assert got == [t5_bucket_naive(r, bidirectional) for r in relative.tolist()]
    assert t5_bucket_naive(0, True) == 0 and t5_bucket_naive(1, False) == 0  # a future key: causal bucket 0


def test_alibi_slopes_are_the_papers():
    assert alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    assert alibi_slopes(4) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]
    # 6 heads: the 4-head slopes, then every other of the 8-head ones
    assert alibi_slopes(6) == [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", SELF_ATTENTION_SCHEMES)
def test_attention_equals_the_papers_equation(name, causal):
    """Every scheme of the table inside self-attention against its reference (tests/helpers/scheme_references.py)."""
    ref = reference(name)
    torch.manual_seed(0)
    T, B, C, H = 7, 2, 8, 2
    scheme = ref.build(H, C // H, causal).double()
    attn = PositionalSelfAttention(C, H, scheme).double()
    x = torch.randn(T, B, C, dtype=torch.float64, requires_grad=True)
    padding = torch.zeros(B, T, dtype=torch.bool)
    if causal:
        padding[1, -2:] = True  # right padding, as fairseq's targets
    else:
        padding[1, :2] = True  # left padding, as fairseq's sources
    mask = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1) if causal else None
    stack, tokens = argparse.Namespace(padding_idx=PAD), torch.where(padding, PAD, EOS + 3)  # what prepare reads

    def forward(need_weights):
        with contextlib.ExitStack() as around:
            if isinstance(scheme, ProjectionBiases):  # FLOATER: its model's and its stack's work (floater/model.py)
                around.enter_context(scheme.batch(T))
                around.enter_context(scheme.prepare(stack, tokens))
            return attn(x, x, x, key_padding_mask=padding, attn_mask=mask, need_weights=need_weights)

    out, _ = forward(need_weights=False)
    want = naive_attention(attn, x, padding, causal, **ref.equation(scheme, attn, causal, T, padding))
    keep = ~padding.t()[:, :, None]  # padded query rows: both give some mixture; only real rows matter
    torch.testing.assert_close(out * keep, want * keep, rtol=1e-10, atol=1e-10)
    params = [x] + list(attn.parameters()) + list(scheme.parameters())
    g_out = torch.autograd.grad((out * keep).pow(2).sum(), params, allow_unused=True)
    g_want = torch.autograd.grad((want * keep).pow(2).sum(), params, allow_unused=True)
    for a, b in zip(g_out, g_want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    # the explicit path (attention weights asked for) gives the same output
    again, weights = forward(need_weights=True)
    torch.testing.assert_close(again * keep, out * keep, rtol=1e-10, atol=1e-12)
    assert weights.shape == (B, T, T)


def test_a_scheme_without_a_reference_fails_by_name(monkeypatch):
    """A row inside self-attention added to the table with no reference fails naming it and where to add one, not
    as a mismatch against another scheme's equation."""
    monkeypatch.setitem(SCHEMES, "throwaway", Scheme("throwaway", "throwaway", "score bias", "a test's row",
                                                     POSITION_TRANSFORMER, "throwaway_transformer", cls=ALiBi))
    missing = [n for n, s in SCHEMES.items() if s.kind in SELF_ATTENTION_KINDS and n not in REFERENCES]
    assert missing == ["throwaway"]
    with pytest.raises(LookupError, match=r"^no reference for throwaway: add one to tests/helpers/scheme_refer"):
        reference("throwaway")


def test_half_precision_keeps_the_angles_and_slopes_exact():
    """model.half() must not round RoPE's θ or ALiBi's slopes: at position 1,000, θ rounded to float16 puts the
    rotated vector 0.13 off (relative to |x| + 1), against 6e-4 for float16's own rounding of input and output."""
    torch.manual_seed(0)
    x = torch.randn(1, 1, 1, 64, dtype=torch.float64)
    want = rope_naive(x[0, 0, 0], 1000)
    got = RoPE(64).half().rotated(x.half(), torch.tensor([1000]))[0, 0, 0].double()
    assert ((got - want).abs() / (want.abs() + 1)).max() < 2e-3
    bias = ALiBi(6).half().score_bias(torch.tensor([1000]), torch.tensor([0]), torch.float32)
    assert bias.dtype == torch.float32 and bias[:, 0, 0].tolist() == [-1000 * m for m in alibi_slopes(6)]


def test_rope_logits_depend_on_the_offset_only():
    torch.manual_seed(0)
    rope = RoPE(8).double()
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
    logit = lambda m, n: (rope.rotated(q, torch.tensor([m])) * rope.rotated(k, torch.tensor([n]))).sum()  # noqa: E731
    torch.testing.assert_close(logit(3, 7), logit(103, 107))
    assert not torch.allclose(logit(3, 7), logit(3, 8))


# -- every scheme with architectures: the model contract ---------------------------------------------------

def test_the_table_has_every_registered_architecture():
    """Both ways: every architecture the plugins register is in the table (but ``position_transformer``, the
    family's bare one, set by flags), and every architecture the table names is registered (fairseq's own
    ``transformer_*`` included), with the model family of its row."""
    plugins = {a for a, model in ARCH_MODEL_REGISTRY.items() if model.__module__.startswith("fairseq_plugins")}
    table = architectures()
    assert plugins - {POSITION_TRANSFORMER} - set(table) == set()
    for arch, scheme in table.items():
        assert arch in ARCH_MODEL_REGISTRY, f"{arch} ({scheme.name}) is not registered"
        family = MODEL_REGISTRY.get(scheme.family)
        if scheme.family == POSITION_TRANSFORMER:  # each scheme's architectures: a model class of its own
            assert ARCH_MODEL_REGISTRY[arch] is MODEL_REGISTRY[scheme.arch_prefix], arch
            assert issubclass(ARCH_MODEL_REGISTRY[arch], family) and ARCH_MODEL_REGISTRY[arch] is not family, arch
        else:
            assert ARCH_MODEL_REGISTRY[arch] is family, (arch, scheme.family)
    for name, scheme in SCHEMES.items():
        assert scheme.name == name and scheme.kind in KINDS and scheme.paper, scheme
    models = [s.model for s in SCHEMES.values()]
    assert len(set(models)) == len(models), models


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_with_reorder_equals_full_forward(arch):
    model = build(arch).eval().double()
    # fairseq's own attention (SHAPE's and NoPE's) takes its softmax in float32 on the incremental path
    tiny_models.assert_incremental_with_reorder_equals_full(model, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_sentence_alone_equals_it_left_padded_in_a_batch(arch):
    model = build(arch).eval().double()
    tiny_models.assert_alone_equals_left_padded(model)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_search_and_a_long_source(arch):
    model = build(arch).eval()
    src, lengths, _ = fixed_batch()
    generator = SequenceGenerator([model], TASK.target_dictionary, beam_size=3, max_len_b=8)
    hypos = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hypos) == 3 and all(h[0]["tokens"].numel() > 0 for h in hypos)
    long = torch.randint(4, VOCAB, (1, 1000), generator=torch.Generator().manual_seed(0))
    long[0, -1] = EOS
    with torch.no_grad():
        out = model.encoder(long, src_lengths=torch.tensor([1000]))["encoder_out"][0]
    assert out.shape[0] == 1000 and bool(torch.isfinite(out).all())


@pytest.mark.parametrize("arch", ARCHS)
def test_scripting_is_refused_in_one_line(arch):
    with pytest.raises(RuntimeError, match="cannot be exported with torch.jit.script"):
        torch.jit.script(build(arch))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return small_data(tmp_path_factory)


# tests/test_hub.py translates the trained demo models (Shaw's, FLOATER's) the same way
HUB_TRAINED = {by_model(m).arch("tiny") for m in ("relative", "floater")}


@pytest.mark.parametrize("arch", [a for a in ARCHS if a not in HUB_TRAINED])
def test_hub_translate_equals_generate(small, tmp_path, arch):
    """As tests/test_hub.py for the other archs: the checkpoint loads through fairseq's hub interface and
    translates exactly as scripts/generate.sh (fairseq-generate) does. The checkpoint is fairseq's Trainer's after
    3 updates on the small corpus (a trained one costs minutes per scheme), so outputs are capped at 8 tokens."""
    from fairseq.models.transformer import TransformerModel

    trainer, batches = build_trainer(small, arch, [])
    for _, sample in zip(range(3), batches):
        trainer.train_step([sample])
    trainer.consolidate_optimizer()
    ckpt = tmp_path / "checkpoint.pt"
    trainer.save_checkpoint(str(ckpt), {})
    cap = {"max_len_a": 0, "max_len_b": 8}
    run(["bash", "scripts/generate.sh", str(small), str(ckpt), "test", str(tmp_path / "test.json"),
         *(f"--{k.replace('_', '-')}={v}" for k, v in cap.items())])
    generated = (tmp_path / "test.hyp").read_text(encoding="utf-8").splitlines()
    hub = TransformerModel.from_pretrained(
        str(tmp_path), checkpoint_file=ckpt.name, data_name_or_path=str(small / "bin"), bpe="sentencepiece",
        sentencepiece_model=str(small / "spm.model"), source_lang="src", target_lang="tgt").eval()
    assert "PositionTransformerModel" in [c.__name__ for c in type(hub.models[0]).__mro__]
    row = next(s for s in SCHEMES.values() if s.arch_prefix and s.arch("tiny") == arch)
    args = hub.models[0].args
    assert (args.cross_position_prior if row.cross else args.position_scheme) == row.name
    sources = (small / "raw" / "test.src").read_text(encoding="utf-8").splitlines()[:12]
    # the sources make a difference, except for FIRE: its MLP starts as torch's default Linear (as the paper's code),
    # whose bias varies by at most 0.12 logit over 30 positions, and after 3 updates every source decodes alike;
    # hub and generate must still agree
    assert len(set(generated[:12])) > 1 or arch == "fire_transformer_tiny"
    assert hub.translate(sources, beam=4, lenpen=0.6, **cap) == generated[:12]
    assert hub.translate(sources[0], beam=4, lenpen=0.6, **cap) == generated[0]


class OutputShapes(TorchDispatchMode):
    """The shape of every tensor every aten operator returns, forward and backward."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.shapes += [(str(func), tuple(t.shape)) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def pairwise_shapes(shapes, lengths, vector_dims):
    """The (B, H, T, T, d)-like outputs, (B·H, T, T, d) included: 4 dimensions or more, two of them sequence
    lengths and one a head's vector (d, or d/2 for rotary pairs)."""
    return [(op, shape) for op, shape in shapes if len(shape) >= 4 and sum(n in lengths for n in shape) >= 2
            and any(n in vector_dims for n in shape)]


@pytest.mark.parametrize("arch", TABLE_ARCHS)
def test_no_pairwise_vector_tensor_in_forward_and_backward(arch):
    """No scheme builds a vector per head and (query, key) pair: O(B·H·T²·d) memory. Lengths 6 (source) and 7
    (target) differ from every other dimension of the tiny models here (batch 2, 2 heads of d = 32, 64
    channels, batch × heads 4), so a dimension of size 6 or 7 is a length."""
    model = build(arch).train()
    src, lengths, prev = (x[:2] for x in padded_toy_batch())
    assert (src.size(1), prev.size(1)) == (6, 7) and model.encoder.layers[0].self_attn.head_dim == 32
    with OutputShapes() as record:
        out = model(src, lengths, prev)[0]
        forward = len(record.shapes)
        out.float().pow(2).mean().backward()
    assert len(record.shapes) > forward + 10  # the backward's operators were seen too
    assert pairwise_shapes(record.shapes, {6, 7}, {32, 16}) == []
    assert pairwise_shapes([("control", (2, 2, 7, 7, 32))], {6, 7}, {32, 16})  # what it looks for is found


SCORE_BIAS_ARCHS = [s.arch("tiny") for s in SCHEMES.values() if s.selectable and s.kind == "score bias"]


@pytest.mark.parametrize("arch", SCORE_BIAS_ARCHS)
def test_each_stack_computes_its_bias_once_per_forward(arch, monkeypatch):
    """A stack's self-attentions share one bias per forward (the first layer's), teacher-forced and at each step of
    incremental decoding; outputs equal, bit for bit, and gradients to rounding, each layer computing its own."""
    model = build(arch).double().train()
    src, lengths, prev = fixed_batch()
    calls = []
    cls = type(model.encoder.position_scheme)
    original = cls.score_bias
    encoder = model.encoder.position_scheme
    monkeypatch.setattr(cls, "score_bias", lambda self, *a: calls.append(self is not encoder) or original(self, *a))

    def forward_backward():
        model.zero_grad()
        out = model(src, lengths, prev)[0]
        out.pow(2).mean().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    shared, shared_grads = forward_backward()
    assert len(model.encoder.layers) == len(model.decoder.layers) == 2
    assert sorted(calls) == [False, True]  # the encoder's once, the decoder's once
    model.eval()
    calls.clear()
    state = {}
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        for t in range(3):
            model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
    assert calls == [False] + [True] * 3
    model.train()
    monkeypatch.setattr(ScoreBias, "one_forward", lambda scheme: contextlib.nullcontext())
    calls.clear()
    each, each_grads = forward_backward()
    assert len(calls) == 4
    assert torch.equal(shared, each)
    for name, grad in each_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, rtol=1e-10, atol=1e-12)


def test_attention_schemes_are_one_module_per_stack():
    for name in ("t5", "rope", "alibi"):
        model = build(f"{name}_transformer_tiny")
        for stack in (model.encoder, model.decoder):
            assert stack.embed_positions is None
            assert all(layer.self_attn.scheme is stack.position_scheme for layer in stack.layers)
        assert all(type(layer.encoder_attn).__name__ == "MultiheadAttention" for layer in model.decoder.layers)
    t5 = build("t5_transformer_tiny")
    names = [n for n, _ in t5.named_parameters() if "position_scheme" in n]
    assert names == ["encoder.position_scheme.bias.weight", "decoder.position_scheme.bias.weight"]
    nope = build("nope_transformer_tiny")
    assert isinstance(nope.encoder.embed_positions, SinusoidalPositionalEmbedding) and nope.decoder.embed_positions is None


def test_shape_shifts_each_sequence_in_training_only():
    """The authors' code (onmt/modules/embeddings.py): k = torch.randint(0, K) per sequence in training, every
    sequence at offset K in eval mode; fairseq's numbering otherwise (pads keep the zero row)."""
    torch.manual_seed(0)
    emb = ShapePositionalEmbedding(8, PAD, 64, max_shift=5, eval_offset=5)
    tokens = torch.tensor([[PAD, PAD, 5, 6, 7], [5, 6, 7, 8, 9]])
    table = SinusoidalPositionalEmbedding.get_embedding(100, 8, PAD)
    real = tokens.ne(PAD)
    positions = torch.cumsum(real.long(), 1) + PAD

    def offsets(out):
        found = []
        for b in range(2):
            found.append(next(k for k in range(7) if torch.allclose(out[b, real[b]], table[positions[b, real[b]] + k])))
            assert out[b, ~real[b]].abs().sum() == 0  # pads keep the zero row
        return found

    emb.eval()
    assert offsets(emb(tokens)) == [5, 5]
    emb.train()
    drawn = set()
    for _ in range(40):
        drawn.update(offsets(emb(tokens)))
    assert drawn == set(range(5))  # 0..K-1: K itself is never drawn
    emb.eval_offset = 0  # --shape-eval-offset 0: fairseq's plain sinusoid at evaluation
    emb.eval()
    assert offsets(emb(tokens)) == [0, 0]


def test_shape_flags_default_to_the_authors_protocol():
    model, args = tiny_models.build_with_args("shape_transformer_tiny")
    assert (args.shape_max_shift, args.shape_eval_offset) == (100, 100)
    for stack in (model.encoder, model.decoder):
        assert (stack.embed_positions.num_shifts, stack.embed_positions.eval_offset) == (100, 100)
    model, args = tiny_models.build_with_args("shape_transformer_tiny", shape_max_shift=40)
    assert args.shape_eval_offset == 40 and model.decoder.embed_positions.eval_offset == 40
    model, args = tiny_models.build_with_args("shape_transformer_tiny", shape_max_shift=40, shape_eval_offset=0)
    assert (model.encoder.embed_positions.num_shifts, model.encoder.embed_positions.eval_offset) == (40, 0)


def test_t5_table_starts_as_t5s_own_code():
    """mesh-tensorflow's default initializer (glorot uniform over heads × buckets) by default: every bucket a
    nonzero draw within ±sqrt(6 / (heads + buckets)), the draws uniform (variance a²/3); HF transformers' normal
    and the earlier zeros on request."""
    torch.manual_seed(0)
    heads, buckets = 8, 512  # a large table, so that its moments are close to the distribution's
    weight = T5Bias(heads, bidirectional=True, num_buckets=buckets, max_distance=1024).bias.weight.detach()
    a = math.sqrt(6 / (heads + buckets))
    assert weight.shape == (buckets, heads) and bool((weight != 0).all()) and weight.abs().max() <= a
    assert abs(weight.var().item() / (a * a / 3) - 1) < 0.05 and abs(weight.mean().item()) < 0.05 * a
    model, args = tiny_models.build_with_args("t5_transformer_tiny")
    assert args.t5_bias_init == "glorot"
    for stack in (model.encoder, model.decoder):
        table = stack.position_scheme.bias.weight
        assert bool((table != 0).all()) and table.abs().max() <= math.sqrt(6 / (2 + 32))  # tiny: 2 heads
    torch.manual_seed(0)
    normal = T5Bias(heads, True, buckets, 1024, init="normal", d_model=64).bias.weight.detach()
    assert abs(normal.std().item() / 64 ** -0.5 - 1) < 0.05
    zeros = tiny_models.build("t5_transformer_tiny", t5_bias_init="zeros").encoder.position_scheme.bias.weight
    assert zeros.abs().sum() == 0


def test_t5_buckets_never_reached_in_training_keep_their_initial_draw():
    """Adam updates only the buckets the training pairs reach: the others keep their initialisation (nonzero
    with T5's), which is the bias they add at test to the longer distances they stand for."""
    model = tiny_models.build("t5_transformer_tiny").train()
    start = {name: stack.position_scheme.bias.weight.detach().clone()
             for name, stack in (("encoder", model.encoder), ("decoder", model.decoder))}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    src, lengths, prev = fixed_batch()  # sources of <= 6 tokens, targets of 7: distances up to 5 and 6
    for _ in range(3):
        optimizer.zero_grad()
        model(src, lengths, prev)[0].float().pow(2).mean().backward()
        optimizer.step()
    reached = {"encoder": set(relative_bucket(torch.arange(-5, 6), True, 32, 128).tolist()),
               "decoder": set(relative_bucket(torch.arange(-6, 7), False, 32, 128).tolist())}
    for name, stack in (("encoder", model.encoder), ("decoder", model.decoder)):
        table = stack.position_scheme.bias.weight.detach()
        for bucket in range(32):
            if bucket in reached[name]:
                assert not torch.equal(table[bucket], start[name][bucket]), (name, bucket)
            else:
                assert torch.equal(table[bucket], start[name][bucket]) and bool((table[bucket] != 0).all())


# -- what each stack adds to its token embeddings, against a naive float64 reference -------------------------

def sinusoid_naive(position, dim):
    """fairseq's sinusoidal embedding of one position (Vaswani et al.'s sinusoids, laid out as all sines, then
    all cosines), in float64: sin(p·ω_i) at i and cos(p·ω_i) at dim/2 + i, ω_i = 10000^(−i/(dim/2 − 1))."""
    half = dim // 2
    out = torch.zeros(dim, dtype=torch.float64)
    for i in range(half):
        omega = math.exp(-i * math.log(10000.0) / (half - 1))
        out[i], out[half + i] = math.sin(position * omega), math.cos(position * omega)
    return out


def randomized_eval_naive(stack, rank, n):
    """Randomized positions at evaluation (spread): the expected rank-th smallest of a uniform n-subset of
    {0..L−1}, (rank + 1)(L + 1)/(n + 1) − 1, rounded half to even, clipped to 0..L−1."""
    L = stack.embed_positions.max_position
    return min(max(round((rank + 1) * (L + 1) / (max(n, 1) + 1)) - 1, 0), L - 1)


def first_block_input_naive(stack, tokens, embedding, offset, source_lengths=None):
    """x_t = sqrt(d)·E[w_t] (+ PE(p_t + offset) for an embedding scheme), loop by loop: p_t is fairseq's position
    (padding_idx + the token's rank among the sequence's real tokens: left padding shifts nothing); a pad gets
    nothing (its embedding row is zero, and the encoder zeroes pads)."""
    E = stack.embed_tokens.weight.detach().double()
    dim = E.size(1)
    out = torch.zeros(*tokens.shape, dim, dtype=torch.float64)
    for b in range(tokens.size(0)):
        position = PAD
        for t in range(tokens.size(1)):
            word = int(tokens[b, t])
            if word == PAD:
                continue
            position += 1
            out[b, t] = math.sqrt(dim) * E[word]
            if embedding in ("sinusoidal", "shape", "cape"):  # CAPE at evaluation: plain positions
                out[b, t] += sinusoid_naive(position + offset, dim)
            elif embedding == "randomized":  # at evaluation: n the sentence's length, a decoder's round(ρ·S)
                ratio = stack.embed_positions.length_ratio
                n = int(tokens[b].ne(PAD).sum()) if ratio is None else round(ratio * int(source_lengths[b]))
                out[b, t] += sinusoid_naive(PAD + 1 + randomized_eval_naive(stack, position - PAD - 1, n), dim)
            else:
                assert embedding == "none", embedding
    return out


def first_block_inputs(model, src, lengths, prev):
    """What the first block of each stack receives in one forward: {"encoder": (B, T, C), "decoder": ...}."""
    seen = {}

    def hook(name):
        def record(module, args):  # returns None: a pre-hook's return value would replace the block's input
            seen.setdefault(name, args[0].detach().transpose(0, 1))
        return record

    hooks = [stack.layers[0].register_forward_pre_hook(hook(name))
             for name, stack in (("encoder", model.encoder), ("decoder", model.decoder))]
    try:
        model(src, lengths, prev)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def padded_toy_batch():
    src, lengths, prev = fixed_batch()
    prev = prev.clone()
    prev[1, -2:] = PAD  # right padding, as fairseq's targets (the sources are left-padded)
    return src, lengths, prev


def offsets_found(got, references, atol=1e-5):
    """Per sequence, the one offset k whose reference the sequence matches (None: none does)."""
    found = []
    for b in range(got.size(0)):
        ks = [k for k, ref in references.items() if torch.allclose(got[b], ref[b], rtol=0, atol=atol)]
        assert len(ks) <= 1, ks
        found.append(ks[0] if ks else None)
    return found


RANDOM_IN_TRAINING = ("cape", "randomized")


@pytest.mark.parametrize("arch", ARCHS)
def test_each_stack_adds_to_its_token_embeddings_what_the_table_says(arch):
    """The scheme's ``embedding`` (the encoder's: its ``encoder_partner`` if it has one): sinusoidal adds the
    sinusoid at the token's position and SHAPE at evaluation the sinusoid at position + K, NoPE's decoder and the
    attention schemes add nothing; in training a SHAPE stack shifts each sequence by one offset in 0..K-1, and the
    others stay as at evaluation."""
    max_shift = 3
    shape = arch.startswith("shape_")  # --shape-max-shift on another scheme is refused (it would do nothing)
    model = build(arch, **({"shape_max_shift": max_shift} if shape else {})).double()
    decoder_scheme = SCHEMES[model.args.position_scheme]
    encoder_scheme = SCHEMES[decoder_scheme.encoder_partner or decoder_scheme.name]
    src, lengths, prev = padded_toy_batch()
    tokens = {"encoder": src, "decoder": prev}
    stacks = {"encoder": (model.encoder, encoder_scheme), "decoder": (model.decoder, decoder_scheme)}
    for name, (stack, scheme) in stacks.items():
        assert (stack.embed_positions is None) == (scheme.embedding == "none"), (name, scheme.name)
    references = {name: {k: first_block_input_naive(stack, tokens[name], scheme.embedding, k, lengths)
                         for k in range(max_shift + 1 if scheme.embedding == "shape" else 1)}
                  for name, (stack, scheme) in stacks.items()}
    model.eval()
    got = first_block_inputs(model, src, lengths, prev)
    for name, (_, scheme) in stacks.items():
        at_test = max_shift if scheme.embedding == "shape" else 0
        # randomized positions reach ~L = 2048, where fairseq's float32 sinusoid table is off by up to ~1e-4
        atol = 1e-3 if scheme.embedding == "randomized" else 1e-5
        assert offsets_found(got[name], references[name], atol) == [at_test] * 3, name
    model.train()
    for _ in range(4):
        got = first_block_inputs(model, src, lengths, prev)
        for name, (_, scheme) in stacks.items():
            if scheme.embedding in RANDOM_IN_TRAINING:  # no offset k: their own references below
                assert offsets_found(got[name], references[name]) == [None] * 3, (name, scheme.name)
                continue
            found = offsets_found(got[name], references[name])
            assert None not in found and max_shift not in found, (name, scheme.name, found)  # the others: 0


def test_shape_draws_every_offset_per_sequence_and_stack():
    """SHAPE in training: each sequence's offset takes every value of 0..K-1, drawn independently per stack."""
    max_shift = 3
    model = build("shape_transformer_tiny", shape_max_shift=max_shift).double().train()
    src, lengths, prev = padded_toy_batch()
    references = {name: {k: first_block_input_naive(stack, tokens, "shape", k) for k in range(max_shift + 1)}
                  for name, stack, tokens in (("encoder", model.encoder, src), ("decoder", model.decoder, prev))}
    draws = {"encoder": [], "decoder": []}
    for _ in range(30):
        got = first_block_inputs(model, src, lengths, prev)
        for name in draws:
            draws[name].append(offsets_found(got[name], references[name]))
    for name, found in draws.items():
        for b in range(src.size(0)):
            assert {f[b] for f in found} == set(range(max_shift)), (name, b, [f[b] for f in found])
    assert draws["encoder"] != draws["decoder"]


def left_padded_tokens():
    """Three sequences of 6, 4 and 1 real tokens, left-padded as fairseq's sources."""
    tokens = torch.tensor([[5, 6, 7, 8, 9, EOS], [PAD, PAD, 5, 6, 7, EOS], [PAD] * 5 + [EOS]])
    return tokens, tokens.ne(PAD)


def embedding_naive(tokens, dim, position_of):
    """PE(padding_idx + 1 + position_of(b, t)) at each real token (t its rank among the sequence's real tokens),
    zero at pads, in float64."""
    out = torch.zeros(*tokens.shape, dim, dtype=torch.float64)
    for b in range(tokens.size(0)):
        t = 0
        for col in range(tokens.size(1)):
            if tokens[b, col] != PAD:
                out[b, col] = sinusoid_naive(PAD + 1 + position_of(b, t), dim)
                t += 1
    return out


@pytest.mark.parametrize("training", [True, False])
def test_cape_equals_the_papers_equation(training):
    """CAPE (Likhomanenko et al. 2021, §3): PE((t + Δ + ε_t)·λ), Δ ~ U(−Δmax, Δmax) and log λ ~ U(−log λmax,
    log λmax) per sequence, ε_t ~ U(−εmax/2, εmax/2) per token, drawn in that order from torch's generator, in
    training; plain positions at evaluation (fairseq's sinusoid). Pads get nothing, left padding shifts nothing."""
    dim, shift, jitter, scaling = 8, 5.0, 0.5, 1.5
    emb = CapePositionalEmbedding(dim, PAD, 64, shift, jitter, scaling).double().train(training)
    tokens, _ = left_padded_tokens()
    B, T = tokens.shape
    torch.manual_seed(3)
    got = emb(tokens)
    torch.manual_seed(3)
    u_shift, u_jitter, u_scale = torch.rand(B, 1).double(), torch.rand(B, T).double(), torch.rand(B, 1).double()
    if training:
        def position_of(b, t):
            delta = (2 * u_shift[b, 0].item() - 1) * shift
            eps = (u_jitter[b, t].item() - 0.5) * jitter
            lam = math.exp((2 * u_scale[b, 0].item() - 1) * math.log(scaling))
            return (t + delta + eps) * lam
    else:
        def position_of(b, t):
            return t
    want = embedding_naive(tokens, dim, position_of)
    # training: the sinusoid computed in the model's dtype; evaluation: fairseq's table, built in float32
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12 if training else 1e-7)
    plain = SinusoidalPositionalEmbedding(dim, PAD, 64).double()(tokens).double()
    assert torch.allclose(got, plain, atol=1e-6) != training  # training moves the positions off the integers
    half = emb.half()(tokens)  # an fp16 model: positions in float32, the embedding in the model's dtype
    assert half.dtype == torch.float16 and bool(torch.isfinite(half).all())


@pytest.mark.parametrize("mode", ["training", "prefix", "spread", "spread decoder"])
def test_randomized_positions_equal_the_papers_equation(mode):
    """Randomized positions (Ruoss et al. 2023, §3) in training: PE(p_t), p_0 < … < p_{n−1} the sorted first n of
    a random permutation of {0..L−1} (one per sequence of n real tokens: argsort of torch.rand(B, L)). At
    evaluation, prefix: the rank's entry of one sorted random N-subset drawn from seed 0; spread: the expected
    rank-th smallest of a uniform n-subset, (r + 1)(L + 1)/(n + 1) − 1 rounded, n the sequence's length or, in a
    decoder, round(ρ·S) from its source's length S. Pads get nothing, left padding shifts nothing."""
    dim, L, N, ratio = 8, 12, 10, 1.5
    training = mode == "training"
    rule = "prefix" if mode in ("training", "prefix") else "spread"
    emb = RandomizedPositionalEmbedding(dim, PAD, L, N, rule, ratio if mode == "spread decoder" else None)
    emb = emb.double().train(training)
    tokens, real = left_padded_tokens()
    sources = torch.tensor([3, 5, 2, 7, 4, 6][:tokens.size(0)])
    emb.source_lengths = sources if mode == "spread decoder" else None
    torch.manual_seed(5)
    got = emb(tokens)
    torch.manual_seed(5)
    scores = torch.rand(tokens.size(0), L)
    if training:
        subsets = [sorted(sorted(range(L), key=lambda j: scores[b, j].item())[:int(n)])
                   for b, n in enumerate(real.sum(1))]
    elif rule == "prefix":
        fixed = sorted(torch.randperm(L, generator=torch.Generator().manual_seed(0))[:N].tolist())
        subsets = [fixed] * tokens.size(0)
    else:
        lengths = [round(ratio * int(s)) for s in sources] if mode == "spread decoder" else real.sum(1).tolist()
        subsets = [[min(max(round((r + 1) * (L + 1) / (n + 1)) - 1, 0), L - 1) for r in range(tokens.size(1))]
                   for n in lengths]
    assert all(0 <= p < L for subset in subsets for p in subset)
    want = embedding_naive(tokens, dim, lambda b, t: subsets[b][t])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)  # fairseq's table, built in float32
    if rule == "prefix" and not training:  # L = N: the one draw is 0..N−1, fairseq's sinusoid
        plain = RandomizedPositionalEmbedding(dim, PAD, N, N).double().eval()(tokens)
        torch.testing.assert_close(plain, SinusoidalPositionalEmbedding(dim, PAD, 64).double()(tokens).double())


def test_randomized_positions_reach_the_whole_range_in_training():
    """Over draws, a 3-token sequence's positions cover all of 0..L−1, every draw increasing."""
    L = 16
    emb = RandomizedPositionalEmbedding(8, PAD, L, L).double().train()
    table = SinusoidalPositionalEmbedding.get_embedding(PAD + 1 + L, 8, PAD).double()[PAD + 1:]
    tokens = torch.tensor([[5, 6, EOS]] * 50)
    torch.manual_seed(0)
    got = emb(tokens).reshape(-1, 8)
    positions = torch.cdist(got, table).argmin(1).view(50, 3)
    assert set(positions.view(-1).tolist()) == set(range(L))
    assert bool((positions[:, 1:] > positions[:, :-1]).all())


def test_randomized_max_position_below_the_longest_sequence_is_one_line():
    with pytest.raises(FlagError, match=r"^--randomized-max-position must be at least the longest sequence the "
                                        r"model takes \(1024, --max-source/target-positions\), got 1000$"):
        build("randomized_transformer_tiny", randomized_max_position=1000)


def test_the_nope_decoder_adds_no_position():
    """NoPE: the decoder has no position embedding and its first block gets the scaled token embeddings alone,
    in the full forward and at every step of incremental decoding."""
    model = build("nope_transformer_tiny").double().eval()
    decoder = model.decoder
    assert decoder.embed_positions is None and decoder.position_scheme is None
    assert all(type(layer.self_attn).__name__ == "MultiheadAttention" for layer in decoder.layers)
    src, lengths, prev = padded_toy_batch()
    want = first_block_input_naive(decoder, prev, "none", 0)
    torch.testing.assert_close(first_block_inputs(model, src, lengths, prev)["decoder"], want, rtol=0, atol=1e-12)
    steps = []
    hook = decoder.layers[0].register_forward_pre_hook(lambda module, args: steps.append(args[0].transpose(0, 1))
                                                       and None)
    try:
        encoder_out, state = model.encoder(src, src_lengths=lengths), {}
        for t in range(prev.size(1)):
            decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
    finally:
        hook.remove()
    torch.testing.assert_close(torch.cat(steps, dim=1), want, rtol=0, atol=1e-12)


def _train_argv(arch, *flags):
    return ["data-bin", "--user-dir", str(REPO / "fairseq_plugins"), "--arch", arch, *flags]


@pytest.mark.parametrize("flags,message", [
    (("--encoder-position-scheme", "nope"), "argument --encoder-position-scheme: invalid choice: 'nope'"),
    (("--position-scheme", "wavy"), "argument --position-scheme: invalid choice: 'wavy'"),
    (("--t5-num-buckets", "2"), "argument --t5-num-buckets: must be >= 4, got 2"),
    (("--shape-max-shift", "-1"), "argument --shape-max-shift: must be >= 0, got -1"),
    (("--shape-eval-offset", "x"), "argument --shape-eval-offset: expected an integer, got 'x'"),
    (("--t5-bias-init", "ones"), "argument --t5-bias-init: invalid choice: 'ones' (choose from glorot, normal, zeros)"),
    (("--rope-base", "x"), "argument --rope-base: expected a number, got 'x'"),
    (("--cape-max-global-scaling", "0.5"), "argument --cape-max-global-scaling: must be >= 1.0, got 0.5"),
    (("--randomized-max-position", "0"), "argument --randomized-max-position: must be > 0, got 0"),
])
def test_a_bad_flag_is_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        options.parse_args_and_arch(options.get_training_parser(), _train_argv("t5_transformer_tiny", *flags))
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and message in err[0], err


def test_a_bad_flag_is_one_line_from_the_command_line(tmp_path):
    proc = subprocess.run([str(BIN / "fairseq-train"), str(tmp_path / "no-data"), "--user-dir",
                           str(REPO / "fairseq_plugins"), "--arch", "nope_transformer_tiny",
                           "--encoder-position-scheme", "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    encoder_schemes = ", ".join(n for n, s in SCHEMES.items() if s.selectable and s.encoder)  # the table's
    assert proc.stderr.strip().splitlines() == [
        f"fairseq-train: error: argument --encoder-position-scheme: invalid choice: 'nope' (choose from "
        f"{encoder_schemes}) (an encoder without positions is permutation-invariant)"]


def test_alibi_encoder_cannot_tell_a_source_from_its_mirror_image():
    """ALiBi's symmetric encoder bias −m·|i − j| (as specified for encoders) depends on distance only: the encoder
    maps a source and its mirror image (EOS included) to the same states in mirrored order, and cross-attention
    has no positions, so the decoder sees the same thing. T5's bidirectional buckets keep the direction."""
    src = torch.tensor([list(range(5, 10)) + [EOS]])
    prev = torch.tensor([[EOS, 10, 11]])
    outputs = {}
    for arch in ("alibi_transformer_tiny", "t5_transformer_tiny"):
        model = build(arch).eval().double()  # build() gives T5's table (zero at first) random values
        with torch.no_grad():
            outputs[arch] = [model(s, torch.tensor([6]), prev)[0] for s in (src, src.flip(1))]
    alibi, t5 = outputs["alibi_transformer_tiny"], outputs["t5_transformer_tiny"]
    torch.testing.assert_close(alibi[0], alibi[1], rtol=0, atol=1e-6)
    assert (t5[0] - t5[1]).abs().max() > 1e-2


# -- the contract: one class per scheme, its own flags ---------------------------------------------------------

STACK_ROWS = [s for s in SCHEMES.values() if s.selectable]
CLASS_ROWS = [s for s in SCHEMES.values() if s.cls is not None]  # the stacks' schemes and the cross-attention priors
# a valid value other than the default, per flag of every scheme (a new flag needs one here)
OTHER_VALUES = {"--t5-num-buckets": "16", "--t5-max-distance": "64", "--t5-bias-init": "zeros",
                "--fire-threshold": "64", "--rope-base": "500", "--rope-scaling": "linear",
                "--rope-scaling-factor": "2", "--rope-original-length": "100", "--xpos-scale-base": "256",
                "--shape-max-shift": "5", "--shape-eval-offset": "7", "--cape-max-global-shift": "2",
                "--cape-max-local-shift": "0.5", "--cape-max-global-scaling": "1.5",
                "--randomized-max-position": "4096",
                "--randomized-eval-positions": "prefix", "--randomized-length-ratio": "1.2",
                "--learned-pos": None, "--max-relative-positions": "3", "--relative-keys": ("--no-relative-keys",),
                "--relative-values": ("--no-relative-values",), "--relative-per-head": ("--relative-shared-heads",),
                "--relative-add-absolute-positions": None,  # None: a switch, given alone; a tuple: given so
                "--cross-prior-ratio": "1.5", "--cross-prior-slopes": "learned",
                "--floater-dt": "0.2", "--floater-method": "euler", "--floater-rtol": "0.001",
                "--floater-atol": "1e-05", "--floater-adjoint": None, "--floater-hidden": "32",
                "--floater-update-every": "2", "--floater-cuda-graph": None, "--floater-layers": "input",
                "--floater-cache-whole-bias": None, "--floater-flow-init": "xavier", "--floater-shared-solve": None}
OWNED = [(row, flag) for row in STACK_ROWS for flag in row.cls.flags]  # a prior's: tests/test_cross_prior.py


def test_every_position_transformer_scheme_is_a_position_scheme_class():
    """A row of position_transformer names a class of the contract (no lambda); the other families' rows none."""
    assert {s.name for s in CLASS_ROWS} >= set(FAMILY_SCHEMES) | {"sinusoidal", "learned"}
    assert set(NEW_SCHEMES) <= set(FAMILY_SCHEMES)
    for scheme in SCHEMES.values():
        if scheme.family == POSITION_TRANSFORMER or scheme.name in ("sinusoidal", "learned"):
            assert isinstance(scheme.cls, type) and issubclass(scheme.cls, PositionScheme), scheme.name
        else:
            assert scheme.cls is None, scheme.name
    assert len({s.cls for s in CLASS_ROWS}) == len(CLASS_ROWS)  # one class, one row


class ReadOnly(argparse.Namespace):
    """The attributes a check reads."""

    def __init__(self, **values):
        super().__init__(**values)
        object.__setattr__(self, "read", set())

    def __getattribute__(self, name):
        if not name.startswith("__") and name != "read":
            object.__getattribute__(self, "read").add(name)
        return object.__getattribute__(self, name)


def test_each_scheme_owns_exactly_the_flags_it_validates():
    """A scheme's add_args adds its flags and no other, with help; its validate reads only those; no flag has two
    owners; position_transformer's parser has every one of them (and so fairseq-train --help)."""
    owned = [f.flag for row in CLASS_ROWS for f in row.cls.flags]
    assert sorted(owned) == sorted(OTHER_VALUES)  # no two owners; every flag has a value here
    family = argparse.ArgumentParser()
    add_position_args(family)
    for row in CLASS_ROWS:
        parser = argparse.ArgumentParser(add_help=False)
        add_flags(parser, row.cls.flags)
        own = {f.flag for f in row.cls.flags} | {f.off for f in row.cls.flags if f.off}
        assert {o for a in parser._actions for o in a.option_strings} == own, row.name
        assert all(a.help for a in parser._actions), row.name
        assert own <= {o for a in family._actions for o in a.option_strings}, row.name
        filled = argparse.Namespace()
        for other in CLASS_ROWS:
            other.cls.defaults(filled)
        args = ReadOnly(**vars(filled))
        row.cls.validate(args)  # the defaults are valid
        assert args.read <= {f.dest for f in row.cls.flags}, (row.name, args.read)


def _model_args(scheme, *flags):
    return options.parse_args_and_arch(options.get_training_parser(), _train_argv(
        POSITION_TRANSFORMER, "--position-scheme", scheme, "--encoder-position-scheme",
        "sinusoidal" if scheme == "nope" else scheme, *flags))


@pytest.mark.parametrize("owner,flag", [(row.name, f.flag) for row, f in OWNED])
def test_a_flag_of_one_scheme_on_another_is_refused_in_one_line(owner, flag):
    """Given with a value other than its default, a scheme's flag on a model neither of whose stacks uses the
    scheme would do nothing: refused in one line naming the flag, its scheme and the model's; on its own scheme's
    model it is accepted. The other model cycles through the table's schemes from one flag to the next."""
    others = [s.name for s in STACK_ROWS if s.name != owner]
    other = others[[f.flag for _, f in OWNED].index(flag) % len(others)]
    companions = {"--rope-scaling": ("--rope-scaling-factor", "2"), "--rope-scaling-factor": ("--rope-scaling", "linear"),
                  "--rope-original-length": ("--rope-scaling", "yarn", "--rope-scaling-factor", "2"),
                  "--floater-cache-whole-bias": ("--floater-update-every", "2")}.get(flag, ())
    value = OTHER_VALUES[flag]
    given = (flag,) if value is None else value if isinstance(value, tuple) else (flag, value)
    args = _model_args(owner, *given, *companions)
    PositionTransformerModel.prepare_args(args)
    args = _model_args(other, *given)
    with pytest.raises(FlagError) as err:
        PositionTransformerModel.prepare_args(args)
    encoder = "sinusoidal" if other == "nope" else other
    article = "an" if owner[0] in "aeiou" else "a"
    assert str(err.value) == (f"{flag} is {article} {owner} flag, and this model's position schemes are {encoder} "
                              f"(encoder) and {other} (decoder): it would do nothing")


def test_a_scheme_without_hooks_is_fairseqs_attention():
    """No slot's module (no rotation, no bias) through PositionalSelfAttention's one path is fairseq's own
    MultiheadAttention, with padding and the causal mask, in full and step by step."""
    from fairseq.modules import MultiheadAttention

    torch.manual_seed(0)
    T, B, C, H = 5, 2, 8, 2
    ours = PositionalSelfAttention(C, H, None).double().eval()
    theirs = MultiheadAttention(C, H, self_attention=True).double().eval()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(T, B, C, dtype=torch.float64)
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, :2] = True
    causal = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    for mask in (None, causal):
        want = theirs(x, x, x, key_padding_mask=padding, attn_mask=mask, need_weights=False)[0]
        got = ours(x, x, x, key_padding_mask=padding, attn_mask=mask, need_weights=False)[0]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_before_softmax_is_fairseqs_logits_with_the_schemes_bias():
    """fairseq's before_softmax ((B·H, T, S) logits after the masks, and v) from PositionalSelfAttention: with
    no slot's module, fairseq's own; with a bias (T5), logits whose softmax is the attention's head weights."""
    from fairseq.modules import MultiheadAttention

    torch.manual_seed(0)
    T, B, C, H = 5, 2, 8, 2
    ours = PositionalSelfAttention(C, H, None).double().eval()
    theirs = MultiheadAttention(C, H, self_attention=True).double().eval()
    theirs.load_state_dict(ours.state_dict())
    theirs.skip_embed_dim_check = True  # fairseq's own product (its call of torch's fused one skips before_softmax)
    x = torch.randn(T, B, C, dtype=torch.float64)
    padding = torch.zeros(B, T, dtype=torch.bool)
    padding[1, -2:] = True
    causal = torch.triu(torch.full((T, T), float("-inf"), dtype=torch.float64), 1)
    got = ours(x, x, x, key_padding_mask=padding, attn_mask=causal, before_softmax=True)
    want = theirs(x, x, x, key_padding_mask=padding, attn_mask=causal, before_softmax=True)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    t5 = T5Bias(H, bidirectional=False, num_buckets=8, max_distance=6).double()
    torch.nn.init.normal_(t5.bias.weight)
    attn = PositionalSelfAttention(C, H, t5).double().eval()
    logits, v = attn(x, x, x, key_padding_mask=padding, attn_mask=causal, before_softmax=True)
    _, weights = attn(x, x, x, key_padding_mask=padding, attn_mask=causal, need_head_weights=True)  # (H, B, T, S)
    assert logits.shape == (B * H, T, T) and v.shape == (B * H, T, C // H)
    torch.testing.assert_close(logits.softmax(-1).view(B, H, T, T).transpose(0, 1), weights, rtol=0, atol=1e-12)


def test_no_config_carries_a_scheme_module_while_the_stacks_build(monkeypatch):
    """Each stack hands its scheme's module to the layers it builds: no config object holds a module while fairseq
    builds the layers (they share their stack's config), nor after. Seen from fairseq's own layer __init__, which
    every layer of the family runs, for a model with a module in both stacks (T5's table, RoPE's rotation)."""
    from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

    def modules_in(cfg):
        found = []
        for value in [*vars(cfg).values(), *vars(cfg.encoder).values(), *vars(cfg.decoder).values()]:
            if isinstance(value, torch.nn.Module):
                found.append(type(value).__name__)
        return found

    seen, configs = [], []
    for base in (TransformerEncoderLayerBase, TransformerDecoderLayerBase):
        def spy(self, cfg, *args, __init__=base.__init__, **kwargs):
            seen.append(modules_in(cfg))
            configs.append(cfg)
            __init__(self, cfg, *args, **kwargs)

        monkeypatch.setattr(base, "__init__", spy)
    model = tiny_models.build("position_transformer", encoder_position_scheme="t5", decoder_position_scheme="rope",
                              cross_position_prior="alibi_sync", encoder_layers=2, decoder_layers=2)
    assert len(seen) == 4 and seen == [[]] * 4, seen
    assert all(modules_in(cfg) == [] for cfg in configs)
    # and yet each layer's attention got its own stack's module
    for stack in (model.encoder, model.decoder):
        assert all(layer.self_attn.scheme is stack.position_scheme for layer in stack.layers)
    assert type(model.encoder.position_scheme).__name__ == "T5Bias"
    assert type(model.decoder.position_scheme).__name__ == "RoPE"
    # the decoder's cross-attention prior, handed over the same way
    assert type(model.decoder.cross_position_prior).__name__ == "AlibiSync"
    assert all(layer.encoder_attn.scheme is model.decoder.cross_position_prior for layer in model.decoder.layers)


def _flag_cases():
    from fairseq_plugins.schemes import SCHEMES

    return [(s.arch(), flag) for s in SCHEMES.values() if s.cls is not None for flag in s.cls.flags]


@pytest.mark.parametrize("arch,flag", _flag_cases(), ids=lambda x: getattr(x, "flag", x))
def test_every_flag_set_without_the_parser_is_checked_by_its_own_parse(arch, flag):
    """--model-overrides sets a checkpoint's arguments unparsed: each scheme flag's value is checked at build by the
    function that parses it on the command line (Flag.check), one line naming the flag, whatever its scheme; the
    schemes without a validate of their own (T5, SHAPE, CAPE, randomized, KERPLE, FIRE) took any value before."""
    from fairseq_plugins.flags import FlagError

    with pytest.raises(FlagError, match=f"^{flag.flag} ") as refused:
        tiny_models.build(arch, **{flag.dest: "not-a-value"})
    assert "\n" not in str(refused.value)
    if flag.default is not None:  # the default itself passes its own check
        tiny_models.build(arch, **{flag.dest: flag.default})


def _help(arch):
    parser = options.get_training_parser()
    with contextlib.redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit):
        options.parse_args_and_arch(parser, input_args=["data-bin", "--user-dir", str(REPO / "fairseq_plugins"),
                                                        "--arch", arch, "--help"])
    return set(re.findall(r"^\s+(--[a-z0-9-]+)", out.getvalue(), flags=re.M))


@pytest.mark.parametrize("name", [n for n in FAMILY_SCHEMES if SCHEMES[n].arch_prefix])
def test_an_architectures_help_lists_its_schemes_flags_alone(name):
    """fairseq-train --arch X --help: X's scheme's flags and the cross-attention priors' (any stack scheme takes
    one), no other scheme's; position_transformer's lists them all. The others stay accepted, unlisted, for the
    one-line refusal of a flag the model would ignore."""
    from fairseq_plugins.models.position_transformer import CROSS_PRIORS, SCHEME_CLASSES

    every = {f.flag for cls in SCHEME_CLASSES for f in cls.flags}
    assert every <= _help(POSITION_TRANSFORMER)
    scheme = SCHEMES[name]
    own = {f.flag for f in scheme.cls.flags} | {f.flag for s in CROSS_PRIORS.values() for f in s.cls.flags}
    assert _help(scheme.arch("tiny")) & every == own
    if name != "floater":  # another scheme's flag is refused in one line at build, not by the parser
        from fairseq_plugins.flags import FlagError

        with pytest.raises(FlagError, match=r"^--floater-dt is a floater flag, and this model's"):
            tiny_models.build(scheme.arch("tiny"), floater_dt=0.5)
