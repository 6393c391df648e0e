"""Scaffolding for tests that build tiny models in-process: the plugins registered, a 24-word task, and one
intra-op thread per test module (import ``one_thread`` into the module: it is an autouse fixture)."""
import argparse
from pathlib import Path

import pytest
import torch
from fairseq import utils
from tooling.invariance import EOS, PAD, TASK, VOCAB  # noqa: F401  (the 24-word task, shared)

utils.import_user_module(argparse.Namespace(user_dir=str(Path(__file__).resolve().parents[2] / "fairseq_plugins")))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models: one intra-op thread avoids spinning threads fighting over a busy machine's cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build_with_args(arch, seed=0, dropout=0.0, task=TASK, **kw):
    """(model, its args): an untrained `arch` on the 24-word task (or `task`), built as fairseq builds it, seeded."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    torch.manual_seed(seed)
    args = argparse.Namespace(arch=arch, dropout=dropout, **kw)
    ARCH_CONFIG_REGISTRY[arch](args)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task), args


def build(arch, seed=0, dropout=0.0, task=TASK, **kw):
    """An untrained `arch` on the 24-word task (every test that builds a tiny model in-process uses this)."""
    return build_with_args(arch, seed, dropout, task, **kw)[0]


def batch(bsz=3, src_len=7, tgt_len=6, seed=0):
    """(src_tokens, src_lengths, prev_output_tokens): random words, padded as fairseq pads a batch."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (bsz, src_len), generator=g)
    src[0, :3] = PAD  # left padding, as fairseq batches sources
    prev = torch.randint(4, VOCAB, (bsz, tgt_len), generator=g)
    prev[:, 0] = EOS
    prev[1, -2:] = PAD  # right padding, as fairseq batches targets
    return src, src.ne(PAD).sum(1), prev


def fixed_batch():
    """Three hand-written pairs (left-padded sources, words w0..w9 of any fairseq Dictionary built like TASK's)."""
    w = list(range(4, 4 + 10))
    src = torch.tensor([[w[1], w[2], w[3], w[4], w[5], EOS],
                        [PAD, PAD, w[6], w[2], w[7], EOS],
                        [PAD, w[3], w[3], w[8], w[9], EOS]])
    prev = torch.tensor([[EOS, w[5], w[4], w[3], w[2], w[1], w[0]],
                         [EOS, w[7], w[2], w[6], w[6], w[1], w[2]],
                         [EOS, w[9], w[8], w[3], w[3], w[4], w[4]]])
    return src, (src != PAD).sum(1), prev


def stack_schemes_after_backward(arch, scheme_class):
    """A float64 `arch` after one backward on fixed_batch(): its encoder and decoder with their score-bias scheme,
    each stack's one instance shared by every layer."""
    model = build(arch).double().train()
    src, lengths, prev = fixed_batch()
    model(src, lengths, prev)[0].pow(2).mean().backward()
    stacks = []
    for stack in (model.encoder, model.decoder):
        scheme = stack.position_scheme
        assert isinstance(scheme, scheme_class) and all(layer.self_attn.scheme is scheme for layer in stack.layers)
        stacks.append((stack, scheme))
    return model, stacks


def assert_incremental_with_reorder_equals_full(model, atol):
    """Beam search's use of a decoder: step by step with incremental state, hypotheses reordered (dropped,
    duplicated, swapped) after step 3, must give the full forward's log-probabilities of the same prefixes."""
    src, lengths, prev = fixed_batch()
    beams = torch.tensor([0, 0, 1, 1])  # two sentences, two hypotheses each, as beam search lays them out
    src, lengths, prev = src[beams], lengths[beams], torch.cat([prev[:2], prev[1:3]])
    encoder_out = model.encoder(src, src_lengths=lengths)
    full = model.get_normalized_probs(model.decoder(prev, encoder_out=encoder_out), log_probs=True)
    new_order = torch.tensor([1, 1, 3, 2])  # within each sentence: drop, duplicate and swap hypotheses
    state = {}
    for t in range(prev.size(1)):
        if t == 3:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            prev, full = prev[new_order], full[new_order]
        step = model.get_normalized_probs(model.decoder(prev[:, : t + 1], encoder_out=encoder_out,
                                                        incremental_state=state), log_probs=True)
        torch.testing.assert_close(step[:, 0], full[:, t], rtol=0, atol=atol)


def assert_alone_equals_left_padded(model):
    """Each sentence of fixed_batch() (left-padded sources) alone gives the decoder outputs it gets in the batch."""
    src, lengths, prev = fixed_batch()
    together = model(src, lengths, prev)[0]
    for b in range(3):
        n = int(lengths[b])
        alone = model(src[b:b + 1, -n:], lengths[b:b + 1], prev[b:b + 1])[0]
        torch.testing.assert_close(alone[0], together[b], rtol=0, atol=1e-9)
