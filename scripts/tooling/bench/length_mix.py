"""A WMT-like length mix and the batches fairseq-train makes of it (the users' regime of scripts/bench/bench.py --regime,
tooling.bench.regime).

    LENGTHS_FILE                the committed histogram of (source, target) lengths of newstest2014 en→de in
                                sentencepiece tokens (how it was made: its "how" field, and `derive`)
    load_pairs(path)            [(source, target), ...]: every sentence pair of the histogram
    draw(pairs, n, seed)        n pairs drawn with replacement, seeded
    language_pairs(pairs, d, seed)   fairseq's LanguagePairDataset over random tokens of those lengths (+ EOS)
    fairseq_batches(dataset, max_tokens, seed)   its batches as fairseq-train makes them: fairseq's own
                                ordered_indices (shuffled, then sorted by target and source length), batch_by_size
                                (at most max_tokens per batch, padding included, sentences a multiple of 8) and
                                collater (left-padded sources), the batches in a seeded random order
    derive(source, target, train_files)   the histogram from newstest files (../shared/data/wmt14 when present)
"""
import json
import math
from pathlib import Path

import numpy as np
import torch

LENGTHS_FILE = Path(__file__).with_name("newstest2014_ende_lengths.json")
REQUIRED_BATCH_SIZE_MULTIPLE = 8  # fairseq-train's --required-batch-size-multiple default


def load_pairs(path=LENGTHS_FILE):
    """Every (source, target) length pair of the histogram, in sentencepiece tokens without EOS."""
    table = json.loads(Path(path).read_text(encoding="utf-8"))
    return [(s, t) for s, t, count in table["pairs"] for _ in range(count)]


def draw(pairs, n, seed):
    """n pairs drawn uniformly with replacement (a newstest-like corpus of any size), seeded."""
    g = torch.Generator().manual_seed(seed)
    return [pairs[i] for i in torch.randint(len(pairs), (n,), generator=g).tolist()]


def language_pairs(pairs, dictionary, seed, max_tokens=None):
    """fairseq's LanguagePairDataset of random sentences of the pairs' lengths, each ending in EOS as binarized
    text does; pairs whose longer side (+ EOS) exceeds max_tokens are left out, as fairseq-train must (its
    batch_by_size refuses them). Returns (dataset, number left out)."""
    from fairseq.data import LanguagePairDataset

    kept = [(s, t) for s, t in pairs if max_tokens is None or max(s, t) + 1 <= max_tokens]
    g = torch.Generator().manual_seed(seed)
    eos = dictionary.eos()

    def sentence(n):
        x = torch.randint(dictionary.nspecial, len(dictionary), (n + 1,), generator=g)
        x[-1] = eos
        return x

    src = [sentence(s) for s, _ in kept]
    tgt = [sentence(t) for _, t in kept]
    dataset = LanguagePairDataset(src, np.array([len(x) for x in src]), dictionary, tgt,
                                  np.array([len(x) for x in tgt]), dictionary, left_pad_source=True,
                                  left_pad_target=False, shuffle=True)
    return dataset, len(pairs) - len(kept)


def fairseq_batches(dataset, max_tokens, seed, multiple=REQUIRED_BATCH_SIZE_MULTIPLE):
    """The collated batches of one epoch, as fairseq-train's EpochBatchIterator makes them: indices ordered by
    the dataset (a seeded shuffle, then a stable sort by target, then source length), grouped by fairseq's
    batch_by_size under max_tokens (each batch's sentences × its longest side, padding included), the batches
    in a seeded random order (fairseq shuffles them every epoch)."""
    from fairseq.data import data_utils

    with data_utils.numpy_seed(seed):
        indices = dataset.ordered_indices()
    groups = dataset.batch_by_size(indices, max_tokens=max_tokens, required_batch_size_multiple=multiple)
    with data_utils.numpy_seed(seed + 1):
        order = np.random.permutation(len(groups))
    return [dataset.collater([dataset[int(i)] for i in groups[j]]) for j in order]


def padded_tokens(sample):
    """(source, target) tokens of a collated batch, padding included: sentences × longest sentence per side."""
    return sample["net_input"]["src_tokens"].numel(), sample["target"].numel()


def corpus(pairs, dictionary, max_tokens, batches, seed):
    """At least `batches` batches (more sentences drawn until there are) of the length mix under max_tokens, in
    fairseq's order: (batches, sentences drawn, sentences left out as longer than max_tokens)."""
    mean = sum(max(s, t) + 1 for s, t in pairs) / len(pairs)
    n = max(16, math.ceil(1.5 * batches * max_tokens / mean))
    while True:
        dataset, left_out = language_pairs(draw(pairs, n, seed), dictionary, seed, max_tokens)
        out = fairseq_batches(dataset, max_tokens, seed) if len(dataset) else []
        if len(out) >= batches:
            return out[:batches], n, left_out
        n *= 2


def derive(source, target, train_files, vocab=8000):
    """The histogram of `source`/`target` (line-aligned files) in the pieces of a joint sentencepiece BPE model of
    `vocab` pieces trained on `train_files` (one thread: the same model every time). LENGTHS_FILE is
    derive(newstest2014.ende.en, newstest2014.ende.de, [newstest2013.ende.en, newstest2013.ende.de])."""
    import collections
    import tempfile

    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as work:
        text = Path(work) / "train.txt"
        text.write_text("".join(Path(f).read_text(encoding="utf-8") for f in train_files), encoding="utf-8")
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=f"{work}/m", vocab_size=vocab,
                                       model_type="bpe", character_coverage=1.0, num_threads=1, minloglevel=2)
        sp = spm.SentencePieceProcessor(model_file=f"{work}/m.model")
        lines = [Path(f).read_text(encoding="utf-8").splitlines() for f in (source, target)]
        lengths = [[len(sp.encode(x)) for x in side] for side in lines]
    counts = collections.Counter(zip(*lengths))
    return {"what": f"(source, target) lengths of {Path(source).name} / {Path(target).name} in sentencepiece "
                    "tokens (EOS not counted): [source, target, sentences]",
            "how": f"tooling.bench.length_mix.derive: a joint sentencepiece BPE model of {vocab} pieces trained on "
                   + " + ".join(Path(f).name for f in train_files) + " (one thread), applied to each side",
            "sentences": sum(counts.values()),
            "mean": [sum(x) / len(x) for x in lengths],
            "pairs": [[s, t, c] for (s, t), c in sorted(counts.items())]}
