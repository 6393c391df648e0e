"""A sentence's translation depends on the sentence alone: each sentence of a batch decoded alone against the same
sentence in a left-padded batch beside a long batch-mate, for any row of the scheme table, on any device.

``row_model(row, device, dtype)`` builds the row's tiny architecture through fairseq's own parser with the row's
flags (the learned row is fairseq's ``transformer_tiny`` with ``--encoder/decoder-learned-pos``), untrained.
``errors(model)`` gives the largest |alone − batched| of the decoder's output logits, teacher-forced and in
incremental decoding with a beam reorder, over every sentence and real target position; ``beam_differences``
counts the sentences whose beam-search hypotheses differ alone and batched. Used by tests/test_batch_invariance.py
(CPU) and scripts/gpu/gpu_check.py's invariance section (CUDA)."""
import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

from tooling.paths import REPO

VOCAB = 24
SOURCE_LENGTHS = (1000, 3, 50)  # a long batch-mate pushes the short sentences' tokens to padded indices ~1000
TARGET_LENGTHS = (300, 4, 40)  # teacher-forced targets, right-padded as fairseq batches them
LENGTHS = (SOURCE_LENGTHS, TARGET_LENGTHS)
SMALL = ((40, 3, 10), (12, 4, 8))  # a dry run's
STEPS = 301  # incremental decoding steps (each hypothesis forced along its own random tokens), reordered half-way
BEAM = 2
# within each sentence's two hypotheses: swap, duplicate, swap (beam search's reorder after pruning)
NEW_ORDER = (1, 0, 3, 3, 5, 4)


class Task:
    """A 24-word task: what build_model reads of fairseq's translation task."""

    def __init__(self):
        d = Dictionary()
        for i in range(VOCAB - len(d)):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


TASK = Task()
PAD, EOS = TASK.source_dictionary.pad(), TASK.source_dictionary.eos()


def row_model(row, device="cpu", dtype=torch.float32, seed=0):
    """The row's tiny architecture with its flags, built as fairseq-train builds it, untrained and seeded."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["data-bin", "--user-dir", str(REPO / "fairseq_plugins"),
                                                "--arch", row.arch("tiny"), *row.flags, "--dropout", "0"])
    torch.manual_seed(seed)
    model = ARCH_MODEL_REGISTRY[args.arch].build_model(args, TASK)
    return model.to(device=device, dtype=dtype).eval()


def batch(seed=0, lengths=LENGTHS):
    """(sources, targets): per sentence its source (ending in EOS) and its decoder input (starting with EOS), of
    lengths (source lengths, target lengths)."""
    g = torch.Generator().manual_seed(seed)
    sources, targets = [], []
    for n, m in zip(*lengths):
        src = torch.randint(4, VOCAB, (n,), generator=g)
        src[-1] = EOS
        prev = torch.randint(4, VOCAB, (m,), generator=g)
        prev[0] = EOS
        sources.append(src)
        targets.append(prev)
    return sources, targets


def _padded(rows, device, left):
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), PAD, dtype=torch.long)
    for b, r in enumerate(rows):  # fairseq left-pads sources and right-pads decoder inputs
        if left:
            out[b, width - len(r):] = r
        else:
            out[b, :len(r)] = r
    return out.to(device)


def _lengths(rows, device):
    return torch.tensor([len(r) for r in rows], device=device)


def _device(model):
    return next(model.parameters()).device


@torch.no_grad()
def teacher_forced_error(model, sources, targets):
    """max |alone − batched| of the decoder's logits at every real target position of every sentence."""
    dev = _device(model)
    together = model(_padded(sources, dev, True), _lengths(sources, dev), _padded(targets, dev, False))[0].float()
    worst = 0.0
    for b, (src, prev) in enumerate(zip(sources, targets)):
        alone = model(src[None].to(dev), _lengths([src], dev), prev[None].to(dev))[0].float()
        worst = max(worst, (alone[0] - together[b, :len(prev)]).abs().max().item())
    return worst


@torch.no_grad()
def _decode(model, sources, forced, new_order):
    """Logits (N, steps, V) of incremental decoding along `forced` (N, steps) hypotheses, BEAM per sentence,
    reordered by `new_order` half-way (as fairseq's SequenceGenerator reorders them)."""
    dev = _device(model)
    beams = torch.arange(len(sources), device=dev).repeat_interleave(BEAM)
    encoder_out = model.encoder(_padded(sources, dev, True)[beams], src_lengths=_lengths(sources, dev)[beams])
    forced, new_order = forced.to(dev), new_order.to(dev)
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


def errors(model, seed=0, steps=STEPS, lengths=LENGTHS):
    """{"teacher_forced": ..., "incremental": ...}: the largest |alone − batched| logit of each way of decoding."""
    sources, targets = batch(seed, lengths)
    return {"teacher_forced": teacher_forced_error(model, sources, targets),
            "incremental": incremental_error(model, sources, seed, steps)}


@torch.no_grad()
def beam_differences(model, beam=4, max_len=30, seed=0, lengths=LENGTHS):
    """How many of the batch's sentences get other beam-search hypotheses (the beam's tokens) alone than batched,
    fairseq's SequenceGenerator, outputs capped at max_len tokens."""
    from fairseq.sequence_generator import SequenceGenerator

    dev = _device(model)
    sources, _ = batch(seed, lengths)
    generator = SequenceGenerator([model], TASK.target_dictionary, beam_size=beam, max_len_a=0, max_len_b=max_len)

    def hypotheses(rows):
        sample = {"net_input": {"src_tokens": _padded(rows, dev, True), "src_lengths": _lengths(rows, dev)}}
        return [[h["tokens"].tolist() for h in sentence] for sentence in generator.forward(sample)]

    together = hypotheses(sources)
    return sum(hypotheses([src])[0] != together[b] for b, src in enumerate(sources))
