#!/usr/bin/env python3
"""stdin -> stdout: encode each line into sentencepiece pieces (space-separated), one output line per input line."""
import argparse
import sys

import sentencepiece as spm


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--decode", action="store_true", help="pieces -> text instead")
    args = ap.parse_args()
    sp = spm.SentencePieceProcessor(model_file=args.model)
    for line in sys.stdin:
        line = line.rstrip("\n")
        out = sp.decode_pieces(line.split()) if args.decode else " ".join(sp.encode(line, out_type=str))
        sys.stdout.write(out + "\n")


if __name__ == "__main__":
    main()
