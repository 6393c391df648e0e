#!/usr/bin/env python3
"""Score a fairseq-generate log against a raw reference: sentencepiece-decode the hypotheses, check that
every reference line got exactly one hypothesis, run sacrebleu, and write a JSON result (atomically).

  scripts/score.py --generate-log gen.out --spm data/toy/spm.model --ref data/toy/raw/test.tgt \
      --out results/toy_transformer.json [--hyp-out hyps.txt] [--meta key=value ...]
"""
import argparse
import sys

import sacrebleu
import sentencepiece as spm

from tooling.atomic import write_json, write_text
from tooling.bleu import read_hypotheses
from tooling.paths import portable


def detokenize(hyps, n_refs, spm_model, log_name):
    """Ordered detokenized hypotheses; exits with one clear line if any sentence is missing or extra."""
    if sorted(hyps) != list(range(n_refs)):
        missing = sorted(set(range(n_refs)) - set(hyps))
        sys.exit(f"score.py: {log_name} has {len(hyps)} hypotheses for {n_refs} reference lines"
                 f" (missing ids: {missing[:10]}{'...' if len(missing) > 10 else ''})")
    sp = spm.SentencePieceProcessor(model_file=spm_model)
    return [sp.decode_pieces(hyps[i].split()) for i in range(n_refs)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generate-log", required=True)
    ap.add_argument("--spm", required=True, help="sentencepiece model used to encode the data")
    ap.add_argument("--ref", required=True, help="raw (untokenized) reference, one line per sentence")
    ap.add_argument("--out", required=True, help="JSON result path")
    ap.add_argument("--hyp-out", help="also write the detokenized hypotheses here")
    ap.add_argument("--meta", nargs="*", default=[], help="extra key=value pairs stored in the JSON")
    ap.add_argument("--tokenized-bleu", action="store_true",
                    help="also store the papers' tokenized, compound-split BLEU (scripts/tokenized_bleu.py)")
    args = ap.parse_args()

    with open(args.ref, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    hyps = detokenize(read_hypotheses(args.generate_log), len(refs), args.spm, args.generate_log)
    if args.hyp_out:
        write_text(args.hyp_out, "".join(h + "\n" for h in hyps))
    bleu = sacrebleu.metrics.BLEU()
    score = bleu.corpus_score(hyps, [refs])
    result = {"bleu": round(score.score, 2), "sacrebleu_signature": str(bleu.get_signature()),
              "sentences": len(refs), "reference": portable(args.ref), "hypotheses": portable(args.hyp_out)}
    if args.tokenized_bleu:
        from tooling.bleu import METHOD, tokenized_bleu

        result["bleu_tokenized"] = round(tokenized_bleu(hyps, refs).score, 2)
        result["bleu_tokenized_method"] = METHOD
    result.update(kv.split("=", 1) for kv in args.meta)
    write_json(args.out, result, indent=2, sort_keys=True)
    print(f"BLEU {score.score:.2f}  ({len(refs)} sentences, {bleu.get_signature()})  -> {args.out}")


if __name__ == "__main__":
    main()
