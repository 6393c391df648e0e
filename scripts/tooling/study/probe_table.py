"""The length probe's table (scripts/study/length_probe.py table; scripts/study/study.py tabulate): mean ± std over seeds per
model and bucket of the probe results MODEL.seedS.probe.json, and with the runs' data each model's repeated
4-grams and its difference to the reference model per bucket, with the study's paired bootstrap over seeds and
starting points (tooling/bootstrap.py).
"""
import json
import os
import re

import numpy as np

from tooling.atomic import write_text
from tooling.bleu import tokenized_metric
from tooling.study.probe import (MAX_LEN_A, MAX_LEN_B, bucket_members, fail, load_probes, read_lines,
                                  repeated_ngrams)
from tooling.study.table import mean_std

PROBE_FILE = re.compile(r"(\w+)\.seed(\d+)\.probe\.json")
# below this share of multi-sentence training targets, a run counts as trained on single sentences
SINGLE_SENTENCE_SHARE = 0.05


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

