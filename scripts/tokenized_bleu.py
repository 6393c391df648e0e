#!/usr/bin/env python3
"""The papers' BLEU: tokenized text with compound splitting (the "get_ende_bleu" recipe), as a command.

    tokenized_bleu.py HYPOTHESES REFERENCE      prints the score (plain text, one sentence per line)
    tokenized_bleu.py --lowercase --no-compound-split HYPOTHESES REFERENCE

The second form is the Multi30k literature's BLEU: lowercased, tokenized text, no compound splitting. How it is
computed, and why it is comparable to the papers' tables but not across tokenizations: scripts/tooling/bleu.py.
"""
import argparse

from tooling.bleu import tokenized_bleu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hypotheses")
    ap.add_argument("reference")
    ap.add_argument("--lowercase", action="store_true", help="lowercase both sides after tokenizing")
    ap.add_argument("--no-compound-split", dest="compounds", action="store_false",
                    help="score the tokens as they are (no ##AT##-##AT## splitting)")
    args = ap.parse_args()
    with open(args.hypotheses, encoding="utf-8") as f:
        hyps = [line.rstrip("\n") for line in f]
    with open(args.reference, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    print(f"{tokenized_bleu(hyps, refs, args.lowercase, args.compounds).score:.2f}")


if __name__ == "__main__":
    main()
