#!/usr/bin/env python3
"""The length probe: translation past the longest training sentence, made of test sentences joined k at a time.

  # one finished run: its evaluated checkpoint and the study's data directory (bin/, spm.model, raw/test.*)
  scripts/study/length_probe.py score --data data/multi30k_study_ende --checkpoint CKPT_DIR/t5.seed1/average.pt \
      --name t5.seed1 --model t5 --out results/multi30k_study/runs/t5.seed1.probe.json
  # the same run decoded unlike it was trained (RoPE scaled at decode time), named apart
  scripts/study/length_probe.py score ... --name rope_yarn.seed1 --model-overrides \
      "{'rope_scaling': 'yarn', 'rope_scaling_factor': 4.0, 'rope_original_length': 33}"
  # mean ± std over seeds, per model and bucket, of the probe results in RUNS (MODEL.seedS.probe.json)
  scripts/study/length_probe.py table --runs results/multi30k_study/runs --models "transformer t5" --seeds "1 2 3" \
      --out results/multi30k_study/probe_table.md
  # the same with each model's difference to the transformer per bucket (95% interval over seeds and probes)
  scripts/study/length_probe.py table ... --data data/multi30k_study_ende

Design. L = the longest training source in tokens as the encoder sees it (sentencepiece pieces + EOS), read from
the run's binarized training data. Probe j of k (j = 0..N-1, N = --per-k) is the k consecutive test sentences
from sentence j·⌊n/N⌋ on (wrapping round the n test sentences), sources and references each joined with a space:
the same N starting points for every k, so that a longer probe extends a shorter one. k = 1, 2, ... until N
probes are longer than --beyond × L (default 3), so the last bucket holds at least N probes. A probe's length is
its pieces of the run's sentencepiece model + EOS; its bucket, that length relative to L (--edges 1,1.5,2,3:
≤ 1×, 1–1.5×, 1.5–2×, 2–3×, > 3×). Decoding is the test set's (scripts/generate.sh: beam, length penalty) with
--max-len-a 2 --max-len-b 10, so that no reference-length output is cut; a probe or output longer than the
model's max_source/target_positions is refused, not truncated. Per bucket, and again per k: the Multi30k
literature's tokenized lowercased BLEU (tooling/bleu.py), the hypothesis/reference length ratio in those tokens,
the hypothesis/reference ratio of sentences (sentence ends: . ! ? before a space or the end), and how many outputs
reached the length cap. Writes OUT (atomically) and the detokenized hypotheses beside it (OUT minus .json + .hyp).

What it can show depends on the training data, so the result records the share of the training targets that hold
more than one sentence. A model trained on single captions (Multi30k: 92 of 29,000 targets) learns to end its
output after the first period: on joined test sentences its hypotheses hold one sentence at every k, within the
training positions too, and the probe then measures that, not extrapolation (results/multi30k_study/README.md).
Trained with joined pairs up to a token cap (multi30k_study.sh JOIN_TRAIN=1), inputs of several sentences are in
the training distribution, the ≤ 1× bucket translates like the test set, and the buckets past 1× are positions the
model never saw. The sentence ratio tells the two failures apart: < 1, the output stopped early; ≈ 1 with a low
BLEU, it went on but garbled.

Differences (table --data): per bucket, a model's mean per-seed BLEU minus the reference model's (the
transformer), with the study's paired bootstrap over seeds and probes (tooling/bootstrap.py). Its unit is a
starting point (the sufficient statistics of its probes in the bucket summed): probes from one starting point
share their first sentences, probes from two starting points share none (k < the stride), so resampling single
probes would count the same sentences as independent. Repeats (table --data, too): per bucket, the share of an
output's 4-grams that occurred earlier in the same output, beside the references' own share. An output that loops
("im im im ...") runs past the reference's length and, with no brevity penalty, can score a higher BLEU than one
that stops short: this column tells the two apart.

Cost on Multi30k (the study's 4+4-layer d = 128 model, one thread): trained on all lengths, L = 49 and k = 1..12,
240 probes of 21,442 source tokens (1.4× the test set); a 1-epoch model, whose outputs often ran to the cap (the
slowest case), took 92 s (45 s of CPU) on a busy 2-core machine. ≤ 14-word training: L = 38, k = 1..9, 180
probes; MAX_TRAIN_TOKENS=18: L = 19, k = 1..5, 100 probes; MAX_TRAIN_TOKENS=32 JOIN_TRAIN=1 (the condition the probe
is read in): L = 33, k = 1..8, 160 probes up to 148 tokens.

The probes and their scores are tooling/study/probe.py's, the table tooling/study/probe_table.py's.
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling library
from tooling.atomic import write_json, write_text
from tooling.bleu import METHOD_LOWERCASE, read_hypotheses
from tooling.study.probe import (MAX_LEN_A, MAX_LEN_B, bucket_labels, bucket_members, fail, load_probes,
                                  multi_sentence_share, parse_edges, read_lines, scores)
from tooling.study.probe_table import table
from tooling.paths import REPO, portable


def model_positions(checkpoint):
    """(max_source_positions, max_target_positions) of the checkpoint's model."""
    from fairseq import checkpoint_utils

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    except (OSError, RuntimeError, ValueError) as err:
        fail(f"--checkpoint {checkpoint}: not a readable fairseq checkpoint ({str(err).splitlines()[0][:200]})")
    model = state["cfg"]["model"]  # a DictConfig or a Namespace
    return tuple(int(getattr(model, f"max_{side}_positions", None) or 1024) for side in ("source", "target"))


def decode(args, probes, tmp):
    """The probes translated with scripts/generate.sh: (detokenized hypotheses, pieces per hypothesis, wall seconds,
    CPU seconds of the processes it ran)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.data, "spm.model"))
    for folder in ("raw", "spm"):
        os.makedirs(os.path.join(tmp, folder))
    for side, lang in ((2, args.src), (3, args.tgt)):
        lines = [p[side] for p in probes]
        write_text(os.path.join(tmp, "raw", f"test.{lang}"), "".join(line + "\n" for line in lines))
        write_text(os.path.join(tmp, "spm", f"test.{lang}"),
                   "".join(" ".join(pieces) + "\n" for pieces in sp.encode(lines, out_type=str)))
    shutil.copyfile(os.path.join(args.data, "spm.model"), os.path.join(tmp, "spm.model"))
    dicts = [os.path.join(args.data, "bin", f"dict.{lang}.txt") for lang in (args.src, args.tgt)]
    start, cpu = time.time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["fairseq-preprocess", "--source-lang", args.src, "--target-lang", args.tgt,
                    "--srcdict", dicts[0], "--tgtdict", dicts[1], "--testpref", os.path.join(tmp, "spm", "test"),
                    "--destdir", os.path.join(tmp, "bin"), "--workers", "1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {**os.environ, "SRC": args.src, "TGT": args.tgt, "BEAM": str(args.beam), "LENPEN": str(args.lenpen)}
    overrides = ["--model-overrides", args.model_overrides] if args.model_overrides else []
    proc = subprocess.run(["bash", "scripts/generate.sh", tmp, os.path.abspath(args.checkpoint), "test",
                           os.path.join(tmp, "probe.json"), "--max-len-a", str(MAX_LEN_A), "--max-len-b",
                           str(MAX_LEN_B), *overrides], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"decoding failed: {(proc.stderr.strip().splitlines() or ['(no message)'])[-1]}")
    seconds, after = time.time() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    hyps = read_lines(os.path.join(tmp, "probe.hyp"), "hypotheses")
    pieces = {i: len(h.split()) for i, h in read_hypotheses(os.path.join(tmp, "probe.gen")).items()}
    return hyps, [pieces[i] for i in range(len(probes))], seconds, cpu_seconds



def score(args):
    edges = parse_edges(args.edges)
    if not os.path.isfile(args.checkpoint):
        fail(f"--checkpoint: {args.checkpoint} not found")
    probes, longest_src, longest_tgt, test_sentences = load_probes(args.data, args.src, args.tgt, args.per_k,
                                                                   args.beyond, args.max_k)
    train_targets = read_lines(os.path.join(args.data, "raw", f"train.{args.tgt}"), "--data")
    max_src, max_tgt = model_positions(args.checkpoint)
    longest_probe = max(p[4] for p in probes)
    if longest_probe > max_src:
        fail(f"the longest probe has {longest_probe} source tokens, more than the model's max_source_positions "
             f"{max_src}")
    if MAX_LEN_A * longest_probe + MAX_LEN_B > max_tgt - 1:
        fail(f"outputs of up to {MAX_LEN_A} × {longest_probe} + {MAX_LEN_B} tokens would pass the model's "
             f"max_target_positions {max_tgt}: the longest would be cut")
    with tempfile.TemporaryDirectory(prefix="length_probe.") as tmp:
        hyps, pieces, seconds, cpu_seconds = decode(args, probes, tmp)
    labels = bucket_labels(edges)
    members = bucket_members(probes, longest_src, edges)
    buckets = []
    for b, (label, idx) in enumerate(zip(labels, members)):
        row = {"bucket": label, "lo": edges[b - 1] if b else 0, "hi": edges[b] if b < len(edges) else None,
               "probes": len(idx), "ks": sorted({probes[i][0] for i in idx}),
               "source_tokens": [min(probes[i][4] for i in idx), max(probes[i][4] for i in idx)] if idx else None,
               "bleu_tok_lc": None, "hyp_ref_ratio": None, "hyp_ref_sentences": None, "at_max_len": 0}
        if idx:
            row.update(scores([hyps[i] for i in idx], [probes[i][3] for i in idx]))
            row["at_max_len"] = sum(pieces[i] >= int(MAX_LEN_A * probes[i][4] + MAX_LEN_B) for i in idx)
        buckets.append(row)
    by_k = []
    for k in sorted({p[0] for p in probes}):
        idx = [i for i, p in enumerate(probes) if p[0] == k]
        by_k.append({"k": k, "probes": len(idx), "source_tokens": [min(probes[i][4] for i in idx),
                                                                    max(probes[i][4] for i in idx)],
                     **scores([hyps[i] for i in idx], [probes[i][3] for i in idx])})
    base = args.out[:-len(".json")] if args.out.endswith(".json") else args.out
    write_text(base + ".hyp", "".join(h + "\n" for h in hyps))
    result = {
        "name": args.name, "model": args.model or args.name.split(".")[0],
        "checkpoint": portable(os.path.abspath(args.checkpoint)), "data": portable(os.path.abspath(args.data)),
        "unit": "tokens: sentencepiece pieces of the run's model + EOS, as the encoder sees a sentence",
        "train_longest_source": longest_src, "train_longest_target": longest_tgt,
        "train_multi_sentence_targets": round(multi_sentence_share(train_targets), 4),
        "per_k": args.per_k, "ks": sorted({p[0] for p in probes}), "beyond": args.beyond, "edges": edges,
        "probes": len(probes), "longest_probe_source": longest_probe,
        "test_sentences": test_sentences, "stride": test_sentences // args.per_k,
        "decoding": {"beam": args.beam, "lenpen": args.lenpen, "max_len_a": MAX_LEN_A, "max_len_b": MAX_LEN_B,
                     "max_source_positions": max_src, "max_target_positions": max_tgt,
                     **({"model_overrides": args.model_overrides} if args.model_overrides else {})},
        "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1), "bleu_tok_lc_method": METHOD_LOWERCASE,
        "hypotheses": os.path.basename(base + ".hyp"), "buckets": buckets, "by_k": by_k,
        **({"trained_again": args.trained_again} if args.trained_again else {}),
    }
    write_json(args.out, result, indent=2)
    cells = "  ".join(f"{b['bucket']}: {'-' if b['bleu_tok_lc'] is None else b['bleu_tok_lc']} ({b['probes']})"
                      for b in buckets)
    print(f"{args.name}: longest training source {longest_src} tokens; k = 1..{max(result['ks'])}, "
          f"{len(probes)} probes up to {longest_probe} tokens, {seconds:.0f} s ({cpu_seconds:.0f} s CPU)  |  {cells}  "
          f"-> {args.out}")



def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score", help="probe one run's checkpoint")
    s.add_argument("--data", required=True, help="the study's data directory (bin/, spm.model, raw/test.*)")
    s.add_argument("--checkpoint", required=True, help="the run's evaluated checkpoint (the study's average.pt)")
    s.add_argument("--name", required=True, help="the run, e.g. t5.seed1")
    s.add_argument("--model", help="the model the run is a seed of (default: --name up to its first dot)")
    s.add_argument("--src", default="en")
    s.add_argument("--tgt", default="de")
    s.add_argument("--beam", type=int, default=5)
    s.add_argument("--lenpen", type=float, default=1.0)
    s.add_argument("--per-k", type=int, default=20, help="probes per k (default 20)")
    s.add_argument("--beyond", type=float, default=3.0,
                   help="k grows until --per-k probes are longer than this many times the longest training source")
    s.add_argument("--max-k", type=int, default=60, help="refuse to join more sentences than this")
    s.add_argument("--edges", default="1,1.5,2,3", help="bucket edges, multiples of the longest training source")
    s.add_argument("--model-overrides", metavar="DICT",
                   help="fairseq-generate's --model-overrides for the decoding, recorded in the result: e.g. a RoPE "
                        "model scaled at decode time, \"{'rope_scaling': 'yarn', 'rope_scaling_factor': 4.0, "
                        "'rope_original_length': 33}\" (name the run apart: --name rope_yarn.seed1)")
    s.add_argument("--out", required=True, help="the probe result, e.g. runs/MODEL.seedS.probe.json")
    s.add_argument("--trained-again", metavar="NOTE",
                   help="the checkpoint is the run trained again (its own were gone): how its test hypotheses "
                        "compare with the recorded run's, recorded in the result and noted in the table")
    s.set_defaults(func=score)
    t = sub.add_parser("table", help="mean ± std over seeds per model and bucket")
    t.add_argument("--runs", required=True, help="the folder of MODEL.seedS.probe.json files")
    t.add_argument("--models", required=True)
    t.add_argument("--seeds", required=True)
    t.add_argument("--out", help="also write the table here")
    t.add_argument("--data", help="the runs' data directory (as for score): adds each model's share of repeated "
                                  "4-grams and its difference to --reference per bucket, with its interval over "
                                  "seeds and probes")
    t.add_argument("--reference", default="transformer",
                   help="the model the differences are to (default transformer)")
    t.add_argument("--src", default="en")
    t.add_argument("--tgt", default="de")
    t.set_defaults(func=table)
    args = ap.parse_args()
    if args.cmd == "score" and (args.per_k < 1 or args.beyond <= 0 or args.max_k < 1 or args.beam < 1):
        fail("--per-k, --max-k and --beam must be positive integers and --beyond a positive number")
    args.func(args)


if __name__ == "__main__":
    main()
