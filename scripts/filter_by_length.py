#!/usr/bin/env python3
"""Keep the parallel pairs whose source has at most --max-words whitespace words (train-short protocol).
Prints how many pairs were kept and dropped; refuses misaligned input."""
import argparse
import os
import sys

from tooling.atomic import atomic_open


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--src", required=True)
    ap.add_argument("--tgt", required=True)
    ap.add_argument("--max-words", type=int, required=True)
    ap.add_argument("--out-prefix", required=True, help="writes <prefix>.<src ext> and <prefix>.<tgt ext>")
    args = ap.parse_args()
    with open(args.src, encoding="utf-8") as f:
        src = f.read().splitlines()
    with open(args.tgt, encoding="utf-8") as f:
        tgt = f.read().splitlines()
    if len(src) != len(tgt):
        sys.exit(f"filter_by_length.py: {args.src} has {len(src)} lines but {args.tgt} has {len(tgt)}")
    keep = [i for i, s in enumerate(src) if len(s.split()) <= args.max_words]
    for path, lines in ((args.src, src), (args.tgt, tgt)):
        out = f"{args.out_prefix}{os.path.splitext(path)[1]}"
        with atomic_open(out) as f:
            f.writelines(lines[i] + "\n" for i in keep)
    print(f"kept {len(keep)} of {len(src)} pairs with <= {args.max_words} source words "
          f"(dropped {len(src) - len(keep)} longer ones)")


if __name__ == "__main__":
    main()
