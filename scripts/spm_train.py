#!/usr/bin/env python3
"""Train one joint sentencepiece model on the given files (source and target training text)."""
import argparse

import sentencepiece as spm


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--input", nargs="+", required=True)
    ap.add_argument("--model-prefix", required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--max-sentences", type=int, default=2000000, help="sentences sampled for training")
    ap.add_argument("--model-type", default="bpe", choices=["unigram", "bpe"])
    args = ap.parse_args()
    spm.SentencePieceTrainer.train(
        input=",".join(args.input),
        model_prefix=args.model_prefix,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        character_coverage=1.0,
        input_sentence_size=args.max_sentences,
        shuffle_input_sentence=True,
        hard_vocab_limit=False,  # a small corpus may not support the full vocabulary size
        # fairseq's Dictionary adds its own <s>, <pad>, </s>, <unk>; keep sentencepiece's out of the pieces.
        bos_id=-1, eos_id=-1, unk_id=0,
        minloglevel=2,
    )


if __name__ == "__main__":
    main()
