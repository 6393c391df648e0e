#!/usr/bin/env python3
"""Train one joint sentencepiece model on the given files (source and target training text).

Above --max-sentences lines the training text is a seeded random sample of that many lines (sentencepiece's own
sampling is not reproducible across runs), so the same inputs always give the same model."""
import argparse
import os
import random
import tempfile

import sentencepiece as spm


def sample_lines(paths, max_lines, seed, out_dir):
    """The input files, or one file holding a seeded random sample of max_lines of their lines."""
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += sum(1 for _ in f)
    if total <= max_lines:
        return paths, total
    keep = set(random.Random(seed).sample(range(total), max_lines))
    fd, sample = tempfile.mkstemp(prefix="spm-sample.", suffix=".txt", dir=out_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        n = 0
        for path in paths:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if n in keep:
                        out.write(line)
                    n += 1
    return [sample], max_lines


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--input", nargs="+", required=True)
    ap.add_argument("--model-prefix", required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--max-sentences", type=int, default=2000000, help="lines sampled for training")
    ap.add_argument("--seed", type=int, default=1, help="seeds that sample")
    ap.add_argument("--model-type", default="bpe", choices=["unigram", "bpe", "word"],
                    help="word: a piece per whitespace-separated word (a stand-in corpus whose lengths are set in words)")
    args = ap.parse_args()
    inputs, n_lines = sample_lines(args.input, args.max_sentences, args.seed, os.path.dirname(args.model_prefix) or ".")
    try:
        spm.SentencePieceTrainer.train(
            input=",".join(inputs),
            model_prefix=args.model_prefix,
            vocab_size=args.vocab_size,
            model_type=args.model_type,
            character_coverage=1.0,
            input_sentence_size=n_lines,  # all of them: the sampling is done above
            hard_vocab_limit=False,  # a small corpus may not support the full vocabulary size
            # fairseq's Dictionary adds its own <s>, <pad>, </s>, <unk>; keep sentencepiece's out of the pieces.
            bos_id=-1, eos_id=-1, unk_id=0,
            minloglevel=2,
        )
    finally:
        for path in inputs:
            if path not in args.input:
                os.remove(path)


if __name__ == "__main__":
    main()
