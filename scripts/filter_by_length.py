#!/usr/bin/env python3
"""Keep the parallel pairs of a training set that are short enough (train-short protocols):

  --max-words N                 the source has at most N whitespace words;
  --max-tokens N --spm MODEL    source and target each have at most N sentencepiece pieces of MODEL (the
                                run's own model; the EOS the model adds is not counted).

Prints how many pairs were kept and dropped; refuses misaligned input."""
import argparse
import os
import sys

from tooling.atomic import atomic_open


def fail(message):
    sys.exit(f"filter_by_length.py: {message}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--max-words", type=int, help="keep pairs whose source has at most this many words")
    ap.add_argument("--max-tokens", type=int, help="keep pairs whose source and target each have at most this many "
                                                   "sentencepiece pieces of --spm")
    ap.add_argument("--spm", help="the sentencepiece model that counts --max-tokens")
    ap.add_argument("--out-prefix", required=True, help="writes <prefix>.<src ext> and <prefix>.<tgt ext>")
    args = ap.parse_args()
    if (args.max_words is None) == (args.max_tokens is None):
        fail("give one of --max-words and --max-tokens")
    limit = args.max_words if args.max_tokens is None else args.max_tokens
    if limit < 1:
        fail(f"--max-{'words' if args.max_tokens is None else 'tokens'} must be a positive integer, got {limit}")
    if (args.spm is None) != (args.max_tokens is None):
        fail("--max-tokens and --spm go together (the cap, and the sentencepiece model that counts it)")
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
    for path, lines in ((args.src, src), (args.tgt, tgt)):
        out = f"{args.out_prefix}{os.path.splitext(path)[1]}"
        with atomic_open(out) as f:
            f.writelines(lines[i] + "\n" for i in keep)
    print(f"kept {len(keep)} of {len(src)} pairs with {what} (dropped {len(src) - len(keep)} longer ones)")


if __name__ == "__main__":
    main()
