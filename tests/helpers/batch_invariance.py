"""A sentence's translation depends on the sentence alone: each sentence of a batch decoded alone against the same
sentence in a left-padded batch beside a long batch-mate, for any row of the scheme table.

``row_model(row)`` builds the row's tiny architecture through fairseq's own parser with the row's flags (the
learned row is fairseq's ``transformer_tiny`` with ``--encoder/decoder-learned-pos``). ``errors(model)`` gives
the largest |alone − batched| of the decoder's output logits, teacher-forced and in incremental decoding with a
beam reorder, over every sentence and real target position."""

import torch
from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY

from conftest import REPO
from helpers.tiny_models import EOS, PAD, TASK, VOCAB

SOURCE_LENGTHS = (1000, 3, 50)  # a long batch-mate pushes the short sentences' tokens to padded indices ~1000
TARGET_LENGTHS = (300, 4, 40)  # teacher-forced targets, right-padded as fairseq batches them
STEPS = 301  # incremental decoding steps (each hypothesis forced along its own random tokens), reordered half-way
BEAM = 2
# within each sentence's two hypotheses: swap, duplicate, swap (beam search's reorder after pruning)
NEW_ORDER = (1, 0, 3, 3, 5, 4)


def row_model(row, seed=0):
    """The row's tiny architecture with its flags, built as fairseq-train builds it, untrained and seeded."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["data-bin", "--user-dir", str(REPO / "fairseq_plugins"),
                                                "--arch", row.arch("tiny"), *row.flags, "--dropout", "0"])
    torch.manual_seed(seed)
    return ARCH_MODEL_REGISTRY[args.arch].build_model(args, TASK).eval()


def _tokens(length, generator):
    return torch.randint(4, VOCAB, (length,), generator=generator)


def batch(seed=0):
    """(sources, targets): per sentence its source (ending in EOS) and its decoder input (starting with EOS)."""
    g = torch.Generator().manual_seed(seed)
    sources, targets = [], []
    for n, m in zip(SOURCE_LENGTHS, TARGET_LENGTHS):
        src = _tokens(n, g)
        src[-1] = EOS
        prev = _tokens(m, g)
        prev[0] = EOS
        sources.append(src)
        targets.append(prev)
    return sources, targets


def left_padded(rows):
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, width - len(r):] = r
    return out


def right_padded(rows):
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for b, r in enumerate(rows):
        out[b, :len(r)] = r
    return out


def _lengths(rows):
    return torch.tensor([len(r) for r in rows])


@torch.no_grad()
def teacher_forced_error(model, sources, targets):
    """max |alone − batched| of the decoder's logits at every real target position of every sentence."""
    together = model(left_padded(sources), _lengths(sources), right_padded(targets))[0].float()
    worst = 0.0
    for b, (src, prev) in enumerate(zip(sources, targets)):
        alone = model(src[None], _lengths([src]), prev[None])[0].float()
        worst = max(worst, (alone[0] - together[b, :len(prev)]).abs().max().item())
    return worst


@torch.no_grad()
def _decode(model, sources, forced, new_order):
    """Logits (N, steps, V) of incremental decoding along `forced` (N, steps) hypotheses, BEAM per sentence,
    reordered by `new_order` half-way (as fairseq's SequenceGenerator reorders them)."""
    beams = torch.arange(len(sources)).repeat_interleave(BEAM)
    encoder_out = model.encoder(left_padded(sources)[beams], src_lengths=_lengths(sources)[beams])
    state, steps = {}, []
    for t in range(forced.size(1)):
        if t == forced.size(1) // 2:
            model.decoder.reorder_incremental_state_scripting(state, new_order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
            forced = forced[new_order]
            steps = [s[new_order] for s in steps]
        out = model.decoder(forced[:, :t + 1], encoder_out=encoder_out, incremental_state=state)[0]
        steps.append(out[:, 0].float())
    return torch.stack(steps, 1)


def incremental_error(model, sources, seed=0, steps=STEPS):
    """max |alone − batched| of the decoder's logits over `steps` incremental steps with a beam reorder."""
    g = torch.Generator().manual_seed(seed + 1)
    forced = torch.randint(4, VOCAB, (len(sources) * BEAM, steps), generator=g)
    forced[:, 0] = EOS
    order = torch.tensor(NEW_ORDER)
    together = _decode(model, sources, forced, order)
    worst = 0.0
    for b, src in enumerate(sources):
        rows = slice(b * BEAM, (b + 1) * BEAM)
        alone = _decode(model, [src], forced[rows], order[rows] - b * BEAM)
        worst = max(worst, (alone - together[rows]).abs().max().item())
    return worst


def errors(model, seed=0, steps=STEPS):
    """{"teacher_forced": ..., "incremental": ...}: the largest |alone − batched| logit of each way of decoding."""
    sources, targets = batch(seed)
    return {"teacher_forced": teacher_forced_error(model, sources, targets),
            "incremental": incremental_error(model, sources, seed, steps)}
