"""The Multi30k study's tables (scripts/study/study.py table, tabulate): the table with mean ± std, the mean per-seed
difference to the reference model with its 95% interval and p-values, and the papers' claims with a verdict each
(`table`), from the run results tooling/study/runs.py reads.

Significance: tooling/bootstrap.py, a paired bootstrap of the mean per-seed difference over seeds and test
sentences (2,000 resamples, seed 12345); beside it the same over the test sentences alone, for the seeds together
and each alone. A fine-tune (tooling/study/plan.py's FINE_TUNES) is compared with the transformer it continued.
"""
import json
import os
import statistics

import sacrebleu

from tooling import bootstrap
from tooling.atomic import write_json, write_text
from tooling.bleu import METHOD_LOWERCASE, tokenized_bleu
from tooling.paths import locate
from tooling.study.runs import RETRAINED, fail, load_runs, read_lines
from tooling.study.plan import FINE_TUNES

LEVEL_PCT = f"{bootstrap.LEVEL:.0%}"
SAMPLES = bootstrap.SAMPLES
# The papers' claims, as (claim, model, reference model): "model > reference" is what the paper reports; every
# other scheme of the table gets its own row against the Transformer (claims()).
CLAIMS = [
    ("relative > absolute (Shaw et al. 2018, Table 1)", "relative", "transformer"),
    ("FLOATER > sinusoidal, paper's protocol (Liu et al. 2020, Table 2)", "floater_warm", "transformer"),
    ("FLOATER > sinusoidal, same extra fine-tuning for both", "floater_warm", "transformer_ft"),
    ("FLOATER > sinusoidal, both from scratch (not in the paper)", "floater", "transformer"),
    ("warm start >= from scratch (Liu et al. 2020, Sec. 3.3)", "floater_warm", "floater"),
    # FLOATER as its authors' code trains it (MODELS=floater_authors; docs/wmt14.md): this project's default, the
    # exact gradient every update, against it
    ("FLOATER from scratch, exact gradient every update >= its authors' training (this project's default)",
     "floater", "floater_authors"),
]



def reference_run(runs, model, ref_model, seed):
    """The key of the run that model's seed is compared with: a fine-tune is compared with the transformer it
    continued, the retrained one where the recorded run's checkpoints were not on the machine."""
    again = (RETRAINED.format(ref_model), seed)
    return again if model in FINE_TUNES and again in runs else (ref_model, seed)


def run_stats(run, refs, key):
    """The run's per-sentence BLEU statistics for metric key (kept with the run: a run is scored once)."""
    cache = run.setdefault("_stats", {})
    if key not in cache:
        cache[key] = bootstrap.sentence_stats(run["_hyps"], refs, key)
    return cache[key]


def compare(runs, model, ref_model, seeds):
    """model against ref_model on the seeds both have, seed s against seed s: the mean per-seed difference
    (delta: of the runs' recorded scores, as the table shows them) and, per metric, tooling/bootstrap.py's paired
    bootstrap of it over seeds and sentences, beside the sentence-only p's."""
    common = [s for s in seeds if (model, s) in runs and (ref_model, s) in runs]
    if not common:
        return None
    done = runs[(model, common[0])].setdefault("_compared", {})  # a model row and a claim row ask alike
    if (ref_model, tuple(common)) in done:
        return done[(ref_model, tuple(common))]
    base = {s: runs[reference_run(runs, model, ref_model, s)] for s in common}
    refs = base[common[0]].get("_refs") or read_lines(locate(base[common[0]]["reference"]))
    tests = {}
    for key in bootstrap.METRICS:
        metric = run_stats(runs[(model, common[0])], refs, key)[0]
        tests[key] = bootstrap.compare({s: run_stats(runs[(model, s)], refs, key)[1] for s in common},
                                       {s: run_stats(base[s], refs, key)[1] for s in common}, metric)
    delta = {k: statistics.mean(runs[(model, s)][k] - base[s][k] for s in common) for k in ("bleu", "bleu_tok_lc")}
    again = [s for s in common if reference_run(runs, model, ref_model, s) != (ref_model, s)]
    done[(ref_model, tuple(common))] = {"seeds": common, "delta": delta, "bootstrap": tests, "retrained_seeds": again}
    return done[(ref_model, tuple(common))]


def restrict(runs, split_src, split_at, longer):
    """The runs on the test sentences whose source has more than split_at words (longer=True) or at most that
    many (longer=False), both metrics recomputed on them. Returns (runs, count)."""
    if not runs:
        return runs, 0
    src = read_lines(split_src)
    keep = [i for i, line in enumerate(src) if (len(line.split()) > split_at) == longer]
    refs = None
    out = {}
    for key, run in runs.items():
        refs = refs or run.get("_refs") or read_lines(locate(run["reference"]))
        if len(src) != len(refs):
            fail(f"--split-src {split_src} has {len(src)} lines for {len(refs)} in {run['reference']}")
        hyps, sub_refs = [run["_hyps"][i] for i in keep], [refs[i] for i in keep]
        kept = {k: v for k, v in run.items() if k not in ("_stats", "_compared")}  # of all the sentences
        out[key] = {**kept, "_hyps": hyps, "_refs": sub_refs,
                    "bleu": round(sacrebleu.corpus_bleu(hyps, [sub_refs]).score, 2),
                    "bleu_tok_lc": round(tokenized_bleu(hyps, sub_refs, lowercase=True, compounds=False).score, 2)}
    return out, len(keep)


def mean_std(values):
    """'mean ± std' of the values given (None: a run without the value), the value alone, or '–'."""
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def fmt_p(p):
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def fmt_ci(ci):
    return "–" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"


def fmt_opt_p(p):
    return "–" if p is None else fmt_p(p)


VERDICT_SEEDS = 3  # the study's design; resampling 2 seeds draws only {a, a}, {a, b}, {b, b}: their spread alone


def verdict(cmp, key="bleu_tok_lc", at_least=False):
    """What the claim "model > reference" (at_least: ">=") comes to on these seeds: beyond seed noise where the
    95% interval over seeds and sentences excludes 0, within seed noise where it includes 0; one seed cannot
    tell (its variance over seeds is not estimated), and two are too few for a verdict (their interval knows
    only their own spread)."""
    test = cmp["bootstrap"][key]
    noise = bootstrap.within_noise(test)
    ahead, behind = test["effect"] > 0, test["effect"] < 0
    way = "same direction" if ahead else "reversed" if behind else "no difference"
    if noise is None:
        return f"{way} on one seed; seed noise not measured"
    seeds = len(test["p_per_seed"])
    if seeds < VERDICT_SEEDS:
        return f"{way} on {seeds} seeds; too few for a verdict ({VERDICT_SEEDS} at least)"
    if noise:
        return "yes (within seed noise: not worse)" if at_least else \
            f"within seed noise{' (reversed)' if behind else ''}"
    if ahead:
        return "yes, beyond seed noise"
    return "no, worse beyond seed noise" if at_least else "no, reversed beyond seed noise"


def per_run_lines(runs, models, seeds, dep_dir, summary):
    """One row per finished run, so that a seed that failed shows as such; source dependence where measured."""
    lines = ["", "Per run: the final validation loss (label-smoothed, base 2, as fairseq logs it) and the source "
             "dependence (`scripts/source_dependence.py` on the evaluated checkpoint: the test references' loss with "
             "deranged sources minus with the true ones, nats per token; – where not measured):", "",
             "| run | BLEU tok-lc | sacreBLEU | valid loss | training min | source dependence |", "|---|---|---|---|---|---|"]
    summary["runs"] = {}
    for model in models:
        for s in seeds:
            for m, name, label in ((model, f"{model}.seed{s}", f"{model} seed {s}"),
                                   (RETRAINED.format(model), f"{model}.seed{s}.retrained",
                                    f"{model} seed {s}, trained again (the run its fine-tunes continued)")):
                if (m, s) not in runs:
                    continue
                run, gap = runs[(m, s)], None
                dep_file = os.path.join(dep_dir, f"{name}.json") if dep_dir else None
                if dep_file and os.path.isfile(dep_file):
                    with open(dep_file, encoding="utf-8") as f:
                        gap = json.load(f)["gap"]
                curve = run.get("valid_loss") or []
                loss = curve[-1][1] if curve else None
                summary["runs"][name] = {"valid_loss": loss, "source_dependence": gap}
                lines.append(f"| {label} | {run['bleu_tok_lc']:.2f} | {run['bleu']:.2f} | "
                             f"{'–' if loss is None else f'{loss:.3f}'} | {run['train_seconds'] / 60:.0f} | "
                             f"{'–' if gap is None else f'{gap:.2f}'} |")
    return lines


def model_rows(runs, models, seeds, baseline, summary_models, expect):
    lines = [f"| model | seeds | BLEU tok-lc | sacreBLEU | Δ tok-lc vs {baseline} | {LEVEL_PCT} CI, seeds + sentences | "
             "p, seeds + sentences | p, sentences only (per seed) |", "|---|---|---|---|---|---|---|---|"]
    for m in models:
        have = [s for s in seeds if (m, s) in runs]
        tok = [runs[(m, s)]["bleu_tok_lc"] for s in have]
        sac = [runs[(m, s)]["bleu"] for s in have]
        entry = {"seeds": have, "bleu_tok_lc": tok, "bleu": sac}
        cells = [m, f"{len(have)}/{len(expect[m])}", mean_std(tok), mean_std(sac), "", "", "", ""]
        if m != baseline and have:
            cmp = compare(runs, m, baseline, seeds)
            if cmp:
                entry["vs_" + baseline] = cmp
                test = cmp["bootstrap"]["bleu_tok_lc"]
                per = ", ".join(fmt_p(test["p_per_seed"][s]) for s in cmp["seeds"])
                cells[4:] = [f"{cmp['delta']['bleu_tok_lc']:+.2f}", fmt_ci(test["ci"]), fmt_opt_p(test["p"]),
                             f"{fmt_p(test['p_sentences'])} ({per})"]
        summary_models[m] = entry
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def claims(models, baseline="transformer"):
    """The papers' claims, then every other scheme of the table against the sinusoidal Transformer."""
    named = {m for _, m, _ in CLAIMS} | {baseline}
    unnamed = [m for m in models if m not in named]
    if not unnamed:  # the papers' models only: no need to import the plugins (torch, fairseq) for the table
        return CLAIMS
    from fairseq_plugins.schemes import MODELS

    return CLAIMS + [(f"{m} > sinusoidal ({MODELS[m].paper}; not a claim of the two papers)", m, baseline)
                     for m in unnamed if m in MODELS]


def claim_rows(runs, models, seeds, summary_claims, suffix=""):
    lines = [f"| claim | seeds | Δ tok-lc | {LEVEL_PCT} CI, seeds + sentences | p, seeds + sentences | "
             "p, sentences only | Δ sacreBLEU | p sacreBLEU, seeds + sentences | reproduces here? |",
             "|---|---|---|---|---|---|---|---|---|"]
    for claim, m, ref in claims(models):
        if m not in models or ref not in models:
            continue
        claim += suffix
        cmp = compare(runs, m, ref, seeds)
        if cmp is None:
            lines.append(f"| {claim} | 0 | | | | | | | not run yet |")
            continue
        v = verdict(cmp, at_least=">=" in claim)
        summary_claims.append({"claim": claim, "model": m, "reference": ref, "verdict": v, **cmp})
        tok, sac = cmp["bootstrap"]["bleu_tok_lc"], cmp["bootstrap"]["bleu"]
        lines.append(f"| {claim} | {len(cmp['seeds'])} | {cmp['delta']['bleu_tok_lc']:+.2f} | {fmt_ci(tok['ci'])} | "
                     f"{fmt_opt_p(tok['p'])} | {fmt_p(tok['p_sentences'])} | {cmp['delta']['bleu']:+.2f} | "
                     f"{fmt_opt_p(sac['p'])} | {v} |")
    return lines


def table(args, asked=None):
    """asked: the seeds every model is expected at (default: --seeds; tabulate shows more seeds than it asks for)"""
    if (args.split_src is None) != (args.split_at is None):
        fail("--split-src and --split-at go together (the test sources, and a length in source words)")
    models, seeds = args.models.split(), [int(s) for s in args.seeds.split()]
    runs = load_runs(args.runs, retrained=True)
    if args.ref:  # instead of the path each run recorded (which may be another machine's data directory)
        refs = read_lines(args.ref)
        for (m, s), run in runs.items():
            if len(refs) != len(run["_hyps"]):
                fail(f"--ref {args.ref} has {len(refs)} lines for {len(run['_hyps'])} hypotheses of {m} seed {s}")
            run["_refs"] = refs
    # each model is expected at the seeds asked for and at its own finished ones, not at every other model's (a
    # model run at more seeds, as FLOATER's own share at 5, leaves the others' rows complete at 3); tabulate asks
    # for the recipe's SEEDS and shows every finished run's
    asked = [int(s) for s in (asked or args.seeds).split()]
    expect = {m: sorted(set(asked) | {s for s in seeds if (m, s) in runs}) for m in models}
    expected = [(m, s) for m in models for s in expect[m]]
    done = [k for k in expected if k in runs]
    baseline = args.baseline
    signatures = sorted({run["sacrebleu_signature"] for run in runs.values()}) or ["(no run yet)"]
    lines = []
    if len(done) < len(expected):
        per_model = ", ".join(f"{m} {sum((m, s) in runs for s in expect[m])}/{len(expect[m])}" for m in models)
        lines += [f"**PARTIAL: {len(done)} of {len(expected)} runs done** (seeds done: {per_model}).", ""]
    lines += [f"Multi30k {args.pair} test_2016_flickr ({args.sentences} sentences); mean ± std over seeds. "
              f"tok-lc: {METHOD_LOWERCASE}; sacreBLEU: {', '.join(f'`{x}`' for x in signatures)}. "
              f"Δ: the mean over the common seeds of seed s minus seed s of {baseline} (the runs' scores below). "
              f"{LEVEL_PCT} CI and p, seeds + sentences: a paired bootstrap of that mean difference ({SAMPLES} "
              "resamples, each drawing the seeds and the test sentences with replacement, one sentence draw for every "
              "drawn seed and both systems: `scripts/tooling/bootstrap.py`); p two-sided, from the resamples centred "
              "on their mean. p, sentences only: the same with the seeds fixed (in brackets: each seed alone). "
              "With one seed the variance over seeds is not estimated (–).", ""]
    again = sorted(s for m, s in runs if m == RETRAINED.format(baseline) and s in seeds)
    if again and any(m in FINE_TUNES for m in models):
        lines += [f"The fine-tunes ({', '.join(FINE_TUNES)}) are compared with the {baseline} they continued: for "
                  f"seed{'s' if len(again) > 1 else ''} {', '.join(map(str, again))} that is the {baseline} trained "
                  "again (its checkpoints were not kept), which differs from the recorded run where the machine "
                  "differs (its row below); the recorded run stays in the other comparisons.", ""]
    summary = {"models": {}, "claims": [], "expected_runs": len(expected), "done_runs": len(done),
               "samples": SAMPLES, "level": bootstrap.LEVEL, "bootstrap_seed": bootstrap.SEED}
    lines += model_rows(runs, models, seeds, baseline, summary["models"], expect)
    lines += per_run_lines(runs, models, seeds, args.source_dependence, summary)
    lines += ["", f"The papers' claims (verdict on tok-lc BLEU: beyond seed noise where the {LEVEL_PCT} CI over seeds "
              "and sentences excludes 0, within seed noise where it includes 0; none on fewer than "
              f"{VERDICT_SEEDS} seeds):", ""]
    lines += claim_rows(runs, models, seeds, summary["claims"])
    if args.split_src:  # e.g. runs trained on short pairs: the sentences within and beyond the training lengths
        n, note = args.split_at, f" ({args.split_note})" if args.split_note else ""
        for key, longer, heading in (("short_sources", False, f"at most {n} words"),
                                     ("long_sources", True, f"more than {n} words{note}")):
            part, count = restrict(runs, args.split_src, n, longer)
            entry = summary[key] = {"split_at": n, "sentences": count, "models": {}, "claims": []}
            lines += ["", f"The {count} test sentences whose source has {heading}: both metrics and the paired "
                      "bootstrap on them alone.", ""]
            lines += model_rows(part, models, seeds, baseline, entry["models"], expect)
            if longer:
                lines += [""] + claim_rows(part, models, seeds, entry["claims"], f", sources > {n} words")
    text = "\n".join(lines) + "\n"
    os.makedirs(args.out, exist_ok=True)
    write_text(os.path.join(args.out, "table.md"), text)
    write_json(os.path.join(args.out, "summary.json"), summary, indent=2, sort_keys=True, default=str)
    print(text, end="")

