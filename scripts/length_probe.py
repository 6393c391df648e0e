#!/usr/bin/env python3
"""The length probe: translation past the longest training sentence, made of test sentences joined k at a time.

  # one finished run: its evaluated checkpoint and the study's data directory (bin/, spm.model, raw/test.*)
  scripts/length_probe.py score --data data/multi30k_study_ende --checkpoint CKPT_DIR/t5.seed1/average.pt \
      --name t5.seed1 --model t5 --out results/multi30k_study/runs/t5.seed1.probe.json
  # the same run decoded unlike it was trained (RoPE scaled at decode time), named apart
  scripts/length_probe.py score ... --name rope_yarn.seed1 --model-overrides \
      "{'rope_scaling': 'yarn', 'rope_scaling_factor': 4.0, 'rope_original_length': 33}"
  # mean ± std over seeds, per model and bucket, of the probe results in RUNS (MODEL.seedS.probe.json)
  scripts/length_probe.py table --runs results/multi30k_study/runs --models "transformer t5" --seeds "1 2 3" \
      --out results/multi30k_study/probe_table.md
  # the same with each model's difference to the transformer per bucket (95% interval over seeds and probes)
  scripts/length_probe.py table ... --data data/multi30k_study_ende

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
"""
import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from tooling.atomic import write_json, write_text
from tooling.bleu import METHOD_LOWERCASE, prepare, read_hypotheses, tokenized_bleu, tokenized_metric
from tooling.paths import REPO, portable

PROBE_FILE = re.compile(r"(\w+)\.seed(\d+)\.probe\.json")
MAX_LEN_A, MAX_LEN_B = 2, 10
# a sentence end: . ! or ? (repeated, then closing quotes or brackets) before a space or the end of the line
SENTENCE_END = re.compile(r"[.!?]+[\"'»«“”‘’)\]]*(?=\s|$)")
# below this share of multi-sentence training targets, a run counts as trained on single sentences
SINGLE_SENTENCE_SHARE = 0.05


def fail(message):
    sys.exit(f"length_probe.py: {message}")


def read_lines(path, flag):
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except OSError as err:
        fail(f"{flag} {path}: {err.strerror}")


def parse_edges(text):
    try:
        edges = [float(e) for e in text.split(",")]
    except ValueError:
        fail(f"--edges must be comma-separated numbers (multiples of the longest training source), got {text!r}")
    if not edges or edges[0] <= 0 or any(b <= a for a, b in zip(edges, edges[1:])):
        fail(f"--edges must be positive and strictly increasing, got {text!r}")
    return edges


def bucket_labels(edges):
    return ([f"≤ {edges[0]:g}×"] + [f"{a:g}–{b:g}×" for a, b in zip(edges, edges[1:])] + [f"> {edges[-1]:g}×"])


def bucket_of(ratio, edges):
    return next((i for i, e in enumerate(edges) if ratio <= e), len(edges))


def bucket_members(probes, longest, edges):
    """Each bucket's probe indices (len(edges) + 1 buckets), by source length relative to longest."""
    members = [[] for _ in range(len(edges) + 1)]
    for i, p in enumerate(probes):
        members[bucket_of(p[4] / longest, edges)].append(i)
    return members


def sentences(text):
    """How many sentences a line holds: its sentence ends (a line without end punctuation holds none)."""
    return len(SENTENCE_END.findall(text))


def multi_sentence_share(lines):
    """The share of lines that hold more than one sentence."""
    return sum(sentences(line) > 1 for line in lines) / len(lines) if lines else 0.0


def scores(hyps, refs):
    """tok-lc BLEU, hypothesis/reference length (tok-lc tokens) and sentences (None where the references hold
    none) of aligned hypotheses and references."""
    bleu = tokenized_bleu(hyps, refs, lowercase=True, compounds=False)
    ref_sentences = sum(sentences(r) for r in refs)
    return {"bleu_tok_lc": round(bleu.score, 2), "hyp_ref_ratio": round(bleu.sys_len / bleu.ref_len, 3),
            "hyp_ref_sentences": round(sum(sentences(h) for h in hyps) / ref_sentences, 3) if ref_sentences else None}


def repeated_ngrams(lines, n=4):
    """(repeated, all) n-grams of the lines in tok-lc tokens (as BLEU counts them): an n-gram is repeated where it
    occurred earlier in the same line. An output that loops ("im im im ...") repeats most of its n-grams; a
    translation of k joined captions, few."""
    repeated = total = 0
    for line in lines:
        words, seen = prepare(line, lowercase=True, compounds=False).split(), set()
        for i in range(len(words) - n + 1):
            gram = tuple(words[i:i + n])
            repeated += gram in seen
            seen.add(gram)
        total += max(0, len(words) - n + 1)
    return repeated, total


def longest_training(data, src, tgt):
    """(longest source, longest target) of the run's binarized training data, in tokens (pieces + EOS)."""
    from fairseq.data import indexed_dataset

    lengths = []
    for lang in (src, tgt):
        prefix = os.path.join(data, "bin", f"train.{src}-{tgt}.{lang}")
        impl = indexed_dataset.infer_dataset_impl(prefix)
        dataset = indexed_dataset.make_dataset(prefix, impl) if impl else None
        if dataset is None:
            fail(f"--data {data}: no binarized training data {prefix}.bin/.idx (expected prepare_bitext.sh output)")
        lengths.append(int(dataset.sizes.max()))
    return tuple(lengths)


def make_probes(src, ref, count_tokens, longest, per_k, beyond, max_k):
    """[(k, start, source, reference, source tokens)], k = 1, 2, ... until per_k probes are > beyond × longest."""
    n = len(src)
    if n < per_k:
        fail(f"the test set has {n} sentences: fewer than --per-k {per_k}")
    stride = n // per_k
    probes, k = [], 0
    while sum(p[4] > beyond * longest for p in probes) < per_k:
        k += 1
        if k > max_k:
            fail(f"k = {max_k} (--max-k) joined test sentences are not longer than {beyond:g} × {longest} tokens "
                 f"for {per_k} probes")
        for j in range(per_k):
            idx = [(j * stride + i) % n for i in range(k)]
            source = " ".join(src[i] for i in idx)
            probes.append((k, j * stride, source, " ".join(ref[i] for i in idx), count_tokens(source)))
    return probes


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


def load_probes(data, src_lang, tgt_lang, per_k, beyond, max_k):
    """The probes of the study's data directory (raw/test.*, spm.model, bin/): (probes, longest training source,
    longest training target, test sentences)."""
    if not os.path.isfile(os.path.join(data, "spm.model")):
        fail(f"--data: {os.path.join(data, 'spm.model')} not found")
    src = read_lines(os.path.join(data, "raw", f"test.{src_lang}"), "--data")
    ref = read_lines(os.path.join(data, "raw", f"test.{tgt_lang}"), "--data")
    if len(src) != len(ref) or not src:
        fail(f"--data {data}: raw/test.{src_lang} and raw/test.{tgt_lang} have {len(src)} and {len(ref)} lines")
    longest_src, longest_tgt = longest_training(data, src_lang, tgt_lang)
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(data, "spm.model"))
    probes = make_probes(src, ref, lambda text: len(sp.encode(text)) + 1, longest_src, per_k, beyond, max_k)
    return probes, longest_src, longest_tgt, len(src)


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


def mean_std(values):
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def table(args):
    models, seeds = args.models.split(), [int(s) for s in args.seeds.split()]
    results = {}
    for name in sorted(os.listdir(args.runs)) if os.path.isdir(args.runs) else []:
        m = PROBE_FILE.fullmatch(name)
        if m and m.group(1) in models and int(m.group(2)) in seeds:
            with open(os.path.join(args.runs, name), encoding="utf-8") as f:
                try:
                    results.setdefault(m.group(1), {})[int(m.group(2))] = json.load(f)
                except ValueError as err:
                    fail(f"{os.path.join(args.runs, name)}: not a probe result ({err})")
    if not results:
        return  # no run of MODELS × SEEDS has its probe yet
    runs = [r for model in models for r in results.get(model, {}).values()]
    first = runs[0]
    design = ("train_longest_source", "edges", "ks", "per_k", "test_sentences")
    for r in runs:
        if any(r[key] != first[key] for key in design):
            fail(f"{r['name']} and {first['name']} were probed differently ({', '.join(design)} must agree): "
                 f"score them with the same data and settings")
    longest = first["train_longest_source"]
    heads = [f"{b['bucket']} ({b['source_tokens'][0]}–{b['source_tokens'][1]})" if b["source_tokens"] else b["bucket"]
             for b in first["buckets"]]
    lines = [f"Length probe: test sentences joined k = 1..{max(first['ks'])} at a time ({first['per_k']} probes per k), "
             f"bucketed by source length relative to the longest training source ({longest} tokens: sentencepiece "
             f"pieces + EOS); cells: mean ± std over seeds. Decoding: beam {first['decoding']['beam']}, length "
             f"penalty {first['decoding']['lenpen']}, max length {MAX_LEN_A}·source + {MAX_LEN_B}.", ""]
    for title, key in (("BLEU tok-lc", "bleu_tok_lc"), ("hypothesis / reference length (tok-lc tokens)",
                                                         "hyp_ref_ratio"),
                       ("hypothesis / reference sentences (sentence ends)", "hyp_ref_sentences")):
        lines += [f"**{title}**", "", "| model | runs | " + " | ".join(heads) + " |",
                  "|---" * (len(heads) + 2) + "|",
                  "| probes | | " + " | ".join(str(b["probes"]) for b in first["buckets"]) + " |"]
        for model in models:
            group = list(results.get(model, {}).values())
            if group:
                # results written before a quantity existed lack it: their cells stay empty
                cells = [mean_std([r["buckets"][i].get(key) for r in group]) for i in range(len(heads))]
                lines.append(f"| {model} | {len(group)} | " + " | ".join(cells) + " |")
        lines.append("")
    if getattr(args, "data", None):
        probes, members, hyps = probe_outputs(args, results, models, first)
        lines += repeat_lines(results, models, probes, members, hyps, heads)
        if args.reference in results:
            lines += delta_lines(args, results, models, probes, members, hyps, heads)
    shares = [r.get("train_multi_sentence_targets") for r in runs]
    known = [x for x in shares if x is not None]
    if known and max(known) < SINGLE_SENTENCE_SHARE:
        lines += [f"**Trained on single sentences** ({max(known):.1%} or less of the training targets hold more than "
                  "one): a joined probe is out of these models' training distribution at every length, the ≤ 1× "
                  "bucket included (the sentence ratio shows whether an output stops after one sentence), so the "
                  "buckets past 1× do not measure unseen positions.", ""]
    elif known:
        spread = f"{min(known):.1%}" + (f"–{max(known):.1%}" if max(known) > min(known) else "")
        lines += [f"Training targets with more than one sentence: {spread} (joined pairs "
                  "up to the cap): several sentences in one input are in the training distribution, and the "
                  "buckets past 1× are positions the models never saw.", ""]
    notes = []  # a model decoded unlike it was trained (a RoPE scaled at decode time) says how
    for model in models:
        kinds = sorted({r["decoding"].get("model_overrides") or "none" for r in results.get(model, {}).values()})
        if kinds and kinds != ["none"]:
            notes.append(f"{model}: {' or '.join(kinds)}")
    if notes:
        lines += ["Decoded with --model-overrides: " + "; ".join(notes) + ".", ""]
    again = [f"{r['name']} ({r['trained_again']})" for model in models
             for _, r in sorted(results.get(model, {}).items()) if r.get("trained_again")]
    if again:  # the recorded run's checkpoints were gone: the probe is of the same command trained again
        lines += ["Probed after training again with the recorded command (the recorded run's checkpoints were gone): "
                  + "; ".join(again) + ".", ""]
    capped = sum(b["at_max_len"] for r in runs for b in r["buckets"])
    lines.append(f"Outputs that reached the length cap: {capped} of {sum(r['probes'] for r in runs)}. "
                 f"Probe seconds per run: {min(r['seconds'] for r in runs):.0f}–{max(r['seconds'] for r in runs):.0f}.")
    text = "\n".join(lines) + "\n"
    if args.out:
        write_text(args.out, text)
    print(text, end="")


def probe_outputs(args, results, models, first):
    """The probes rebuilt from args.data (refused unless they are the runs'), each bucket's probe indices, and each
    run's hypotheses by name."""
    probes, longest, _, _ = load_probes(args.data, args.src, args.tgt, first["per_k"], first["beyond"],
                                        max(first["ks"]))
    if longest != first["train_longest_source"] or [p[0] for p in probes[::first["per_k"]]] != first["ks"]:
        fail(f"--data {args.data}: its probes (k = 1..{probes[-1][0]}, longest training source {longest}) are not "
             f"the runs' (k = 1..{max(first['ks'])}, {first['train_longest_source']}): give the runs' data")
    hyps = {}
    for model in models:
        for r in results.get(model, {}).values():
            path = os.path.join(args.runs, r.get("hypotheses", r["name"] + ".probe.hyp"))
            hyps[r["name"]] = read_lines(path, "--runs")
            if len(hyps[r["name"]]) != len(probes):
                fail(f"{path}: {len(hyps[r['name']])} hypotheses for {len(probes)} probes")
    return probes, bucket_members(probes, longest, first["edges"]), hyps


def repeat_lines(results, models, probes, members, hyps, heads):
    """Per bucket, the share of the outputs' 4-grams that repeat one earlier in the same output (mean ± std over
    seeds), beside the references' own share: outputs that loop can score a higher BLEU than outputs that stop."""
    def share(lines):
        repeated, total = repeated_ngrams(lines)
        return repeated / total if total else None

    lines = ["**Repeated 4-grams** (the share of an output's 4-grams, tok-lc tokens, that occurred earlier in the "
             "same output, mean ± std over seeds; the references' own share first. An output that loops repeats "
             "most of its 4-grams; BLEU counts its repeated words up to their count in the reference and, unlike "
             "an output that stops short, gives it no brevity penalty: its higher BLEU is not better translation)", "",
             "| model | runs | " + " | ".join(heads) + " |", "|---" * (len(heads) + 2) + "|",
             "| references | | " + " | ".join(mean_std([share([probes[i][3] for i in idx])]) for idx in members)
             + " |"]
    for model in models:
        group = list(results.get(model, {}).values())
        if group:
            # an empty bucket, or outputs shorter than 4 tokens, have no share: "–"
            cells = [mean_std([share([hyps[r["name"]][i] for i in idx]) for r in group]) for idx in members]
            lines.append(f"| {model} | {len(group)} | " + " | ".join(cells) + " |")
    return lines + [""]


def delta_lines(args, results, models, probes, members, hyps, heads):
    """Per bucket, each model's mean per-seed BLEU difference to args.reference with its 95% interval over seeds
    and probes (tooling/bootstrap.py), from the hypotheses and the probes rebuilt from args.data."""
    from tooling.bleu import tokenized_stats
    from tooling.bootstrap import compare

    # the unit resampled is a starting point: its probes of different k in one bucket share sentences, probes of
    # different starting points none (k < the stride); a starting point's sufficient statistics add up
    summed_stats = {}  # (run, bucket): the reference's are asked for once per model

    def stats(run, b):  # one row of summed sufficient statistics per starting point in bucket b
        key = (run["name"], b)
        if key not in summed_stats:
            summed_stats[key] = starting_point_stats(run, members[b])
        return summed_stats[key]

    def starting_point_stats(run, idx):
        rows = np.asarray(tokenized_stats([hyps[run["name"]][i] for i in idx], [probes[i][3] for i in idx],
                                          lowercase=True, compounds=False), dtype=np.int64)
        starts = sorted({probes[i][1] for i in idx})
        summed = np.zeros((len(starts), rows.shape[1]), dtype=np.int64)
        np.add.at(summed, [starts.index(probes[i][1]) for i in idx], rows)
        return summed

    reference = results[args.reference]  # seed: result, the seed as the file name gives it
    lines = [f"**Δ BLEU tok-lc against {args.reference}** (the mean over the common seeds of seed s minus seed s "
             f"of {args.reference}; in brackets its 95% interval from the study's paired bootstrap over seeds and "
             "probes, tooling/bootstrap.py, resampling the starting points: a starting point's probes share "
             "sentences. An interval without 0: beyond seed and probe noise)", "",
             "| model | seeds | " + " | ".join(heads) + " |", "|---" * (len(heads) + 2) + "|"]
    for model in models:
        group = {s: r for s, r in results.get(model, {}).items() if s in reference}
        if model == args.reference or not group:
            continue
        cells = []
        for b, idx in enumerate(members):
            if not idx:
                cells.append("–")
                continue
            c = compare({s: stats(r, b) for s, r in group.items()},
                        {s: stats(reference[s], b) for s in group}, tokenized_metric())
            cells.append(f"{c['effect']:+.2f}" + (f" [{c['ci'][0]:+.2f}, {c['ci'][1]:+.2f}]" if c["ci"] else
                                                  " (one seed)"))
        lines.append(f"| {model} | {len(group)} | " + " | ".join(cells) + " |")
    return lines + [""]


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
