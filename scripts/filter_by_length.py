#!/usr/bin/env python3
"""Keep the parallel pairs of a training set that are short enough (train-short protocols):

  --max-words N                 the source has at most N whitespace words;
  --max-tokens N --spm MODEL    source and target each have at most N sentencepiece pieces of MODEL (the
                                run's own model; the EOS the model adds is not counted);
  --join (with --max-tokens)    also consecutive pairs joined, source with source and target with target, a space
                                between: from each line on, as many following pairs as keep both sides within N
                                pieces (greedy, each pair in at most one join), written after the single pairs.

Why --join: Multi30k's captions are single sentences (92 of 29,000 training targets hold a second one), so a model
trained on them ends its output after the first period, and a length probe made of joined test sentences would
measure that instead of unseen positions. With joins up to the cap, several sentences in one input are in the
training distribution, and only the positions past the cap are new.

Prints how many pairs were kept and dropped (and joined); refuses misaligned input."""
import argparse
import os

from tooling.atomic import atomic_open
from tooling.tool import Tool


fail = Tool("filter_by_length.py").fail


def packs(src_len, tgt_len, limit):
    """Greedy runs of >= 2 consecutive pairs whose summed pieces stay <= limit on both sides: [(first, last)]. The
    space that joins two lines adds no piece (sentencepiece marks a word start inside the next piece)."""
    runs, i, n = [], 0, len(src_len)
    while i < n:
        j, s, t = i, src_len[i], tgt_len[i]
        while j + 1 < n and s + src_len[j + 1] <= limit and t + tgt_len[j + 1] <= limit:
            j += 1
            s, t = s + src_len[j], t + tgt_len[j]
        if j > i:
            runs.append((i, j))
        i = j + 1
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--max-words", type=int, help="keep pairs whose source has at most this many words")
    ap.add_argument("--max-tokens", type=int, help="keep pairs whose source and target each have at most this many "
                                                   "sentencepiece pieces of --spm")
    ap.add_argument("--spm", help="the sentencepiece model that counts --max-tokens")
    ap.add_argument("--join", action="store_true", help="also write consecutive pairs joined up to --max-tokens")
    ap.add_argument("--out-prefix", required=True, help="writes <prefix>.<src ext> and <prefix>.<tgt ext>")
    args = ap.parse_args()
    if (args.max_words is None) == (args.max_tokens is None):
        fail("give one of --max-words and --max-tokens")
    limit = args.max_words if args.max_tokens is None else args.max_tokens
    if limit < 1:
        fail(f"--max-{'words' if args.max_tokens is None else 'tokens'} must be a positive integer, got {limit}")
    if (args.spm is None) != (args.max_tokens is None):
        fail("--max-tokens and --spm go together (the cap, and the sentencepiece model that counts it)")
    if args.join and args.max_tokens is None:
        fail("--join needs --max-tokens (joins are capped in sentencepiece pieces)")
    with open(args.src, encoding="utf-8") as f:
        src = f.read().splitlines()
    with open(args.tgt, encoding="utf-8") as f:
        tgt = f.read().splitlines()
    if len(src) != len(tgt):
        fail(f"{args.src} has {len(src)} lines but {args.tgt} has {len(tgt)}")
    if args.max_tokens is None:
        keep = [i for i, s in enumerate(src) if len(s.split()) <= limit]
        what = f"<= {limit} source words"
    else:
        import sentencepiece as spm

        try:
            sp = spm.SentencePieceProcessor(model_file=args.spm)
        except (OSError, RuntimeError):
            fail(f"--spm {args.spm}: not a readable sentencepiece model")
        src_len = [len(p) for p in sp.encode(src, out_type=str)]
        tgt_len = [len(p) for p in sp.encode(tgt, out_type=str)]
        keep = [i for i in range(len(src)) if src_len[i] <= limit and tgt_len[i] <= limit]
        what = f"<= {limit} sentencepiece pieces on both sides"
    joined = packs(src_len, tgt_len, limit) if args.join else []
    for path, lines in ((args.src, src), (args.tgt, tgt)):
        out = f"{args.out_prefix}{os.path.splitext(path)[1]}"
        with atomic_open(out) as f:
            f.writelines(lines[i] + "\n" for i in keep)
            f.writelines(" ".join(lines[a:b + 1]) + "\n" for a, b in joined)
    print(f"kept {len(keep)} of {len(src)} pairs with {what} (dropped {len(src) - len(keep)} longer ones)"
          + (f"; added {len(joined)} joins of 2-{max((b - a + 1 for a, b in joined), default=2)} consecutive pairs "
             f"within the same cap" if args.join else ""))


if __name__ == "__main__":
    main()
