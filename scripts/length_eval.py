#!/usr/bin/env python3
"""BLEU by source-length bucket (FLOATER, Fig. 2), and a plot of BLEU vs length with one line per model.

  # score: one model's detokenized hypotheses; several (src, ref, hyp) triples are concatenated in order
  scripts/length_eval.py score --name transformer --src test.src test_long.src --ref test.tgt test_long.tgt \
      --hyp t.test.hyp t.test_long.hyp --edges 1,11,21,31,41,61,81 --out results/toy_transformer.length.json
  # plot: several .length.json files, one line each; table: the same as markdown
  scripts/length_eval.py plot results/toy_*.length.json --out results/toy_length.png
  scripts/length_eval.py table results/toy_*.length.json --out results/toy_length.md
  # runs of one model with several seeds (score --model M --name M.seedS): --mean gives mean +- std per model
  scripts/length_eval.py table runs/*.length.json --mean --out length_table.md

A run scored with --note (e.g. "trained on all lengths") is a reference condition for its model: its row reads
"MODEL, NOTE" and its plotted line is dashed, in its model's colour.

Length = whitespace words of the raw source sentence. Bucket i holds lengths in [edges[i], edges[i+1]); the
last edge may be "inf". Every sentence must fall into a bucket (no sentence is silently left out); each
bucket's score is sacrebleu's corpus BLEU on exactly that subset.
"""
import argparse
import json
import math

import sacrebleu

from tooling.atomic import save_figure, write_json, write_text
from tooling.paths import portable
from tooling.tool import Tool


TOOL = Tool("length_eval.py")


def read_lines(paths, what):
    """The lines of --WHAT's files, one after the other."""
    lines = [line for path in paths for line in TOOL.read_lines(path, f"--{what}")]
    if not lines:
        TOOL.fail(f"--{what} files {paths} are empty")
    return lines


def parse_edges(text):
    try:
        edges = [math.inf if e.strip() == "inf" else int(e) for e in text.split(",")]
    except ValueError:
        TOOL.fail(f"--edges must be comma-separated integers (last may be inf), got {text!r}")
    if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:])):
        TOOL.fail(f"--edges must be at least two strictly increasing values, got {text!r}")
    return edges


def bucket_label(lo, hi):
    return f"{lo}+" if hi == math.inf else f"{lo}-{hi - 1}"


def score_buckets(src, ref, hyp, edges):
    """[{bucket, lo, hi, sentences, bleu}] for each bucket, plus the overall score."""
    if not len(src) == len(ref) == len(hyp):
        TOOL.fail(f"{len(src)} source, {len(ref)} reference and {len(hyp)} hypothesis lines"
                  " (must be equal)")
    lengths = [len(s.split()) for s in src]
    outside = [n for n in lengths if not edges[0] <= n < edges[-1]]
    if outside:
        TOOL.fail(f"{len(outside)} sentences have lengths outside --edges "
                  f"[{edges[0]}, {edges[-1]}) (e.g. {outside[0]} words)")
    buckets = []
    for lo, hi in zip(edges, edges[1:]):
        idx = [i for i, n in enumerate(lengths) if lo <= n < hi]
        bleu = sacrebleu.corpus_bleu([hyp[i] for i in idx], [[ref[i] for i in idx]]).score if idx else None
        buckets.append({"bucket": bucket_label(lo, hi), "lo": lo, "hi": None if hi == math.inf else hi,
                        "sentences": len(idx), "bleu": None if bleu is None else round(bleu, 2)})
    overall = sacrebleu.corpus_bleu(hyp, [ref])
    return buckets, round(overall.score, 2)


def cmd_score(args):
    src, ref, hyp = (read_lines(getattr(args, k), k) for k in ("src", "ref", "hyp"))
    buckets, overall = score_buckets(src, ref, hyp, parse_edges(args.edges))
    result = {"name": args.name, "model": args.model or args.name, "note": args.note, "bleu": overall,
              "sentences": len(src), "buckets": buckets, "length_unit": "source words",
              "src": [portable(p) for p in args.src], "ref": [portable(p) for p in args.ref],
              "hyp": [portable(p) for p in args.hyp]}
    write_json(args.out, result, indent=2)
    cells = "  ".join(f"{b['bucket']}: {b['bleu'] if b['bleu'] is not None else '-'} ({b['sentences']})"
                      for b in buckets)
    print(f"{args.name}: BLEU {overall}  |  {cells}")


def load_results(paths):
    results = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                result = json.load(f)
            if not {"name", "bleu", "sentences", "buckets"} <= set(result):
                raise ValueError("lacks name, bleu, sentences or buckets")
        except (OSError, ValueError) as err:
            TOOL.fail(f"{path} is not a result of length_eval.py score ({err})")
        results.append(result)
    labels = [b["bucket"] for b in results[0]["buckets"]]
    if any([b["bucket"] for b in r["buckets"]] != labels for r in results):
        TOOL.fail("the inputs use different buckets; score them with the same --edges")
    if any([b["sentences"] for b in r["buckets"]] != [b["sentences"] for b in results[0]["buckets"]]
           for r in results):
        TOOL.fail("the inputs were scored on different test sets (their buckets hold different "
                  "numbers of sentences)")
    return results, labels, [b["sentences"] for b in results[0]["buckets"]]


def mean_std(values, spread):
    """(cell text, mean, std) of one model's scores; "-" when a run has no sentence in the bucket."""
    if any(v is None for v in values):
        return "-", None, None
    m = sum(values) / len(values)
    if not spread or len(values) == 1:
        return f"{m:.1f}", m, 0.0
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return f"{m:.1f} ± {sd:.1f}", m, sd


def rows(results, mean):
    """One row per result, or with mean one per (model, note): its label, model, note, and (text, mean, std) for
    the whole test set and each bucket."""
    groups = {}
    for i, r in enumerate(results):
        groups.setdefault((r.get("model", r["name"]), r.get("note")) if mean else i, []).append(r)
    out = []
    for runs in groups.values():
        model, note = runs[0].get("model", runs[0]["name"]), runs[0].get("note")
        name = f"{model} ({len(runs)} run{'s' * (len(runs) > 1)})" if mean else runs[0]["name"]
        out.append({"label": f"{name}, {note}" if note else name, "model": model, "note": note,
                    "all": mean_std([r["bleu"] for r in runs], mean),
                    "buckets": [mean_std([r["buckets"][i]["bleu"] for r in runs], mean)
                                for i in range(len(runs[0]["buckets"]))]})
    return out


def cmd_table(args):
    results, labels, counts = load_results(args.inputs)
    lines = ["| model | all | " + " | ".join(f"{lab} words" for lab in labels) + " |",
             "|---" * (len(labels) + 2) + "|",
             f"| sentences | {results[0]['sentences']} | " + " | ".join(str(n) for n in counts) + " |"]
    for row in rows(results, args.mean):
        lines.append(f"| {row['label']} | {row['all'][0]} | " + " | ".join(c[0] for c in row["buckets"]) + " |")
    table = "\n".join(lines) + "\n"
    if args.out:
        write_text(args.out, table)
    print(table, end="")


def cmd_plot(args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, labels, counts = load_results(args.inputs)
    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    x = list(range(len(labels)))
    colours = {}  # one colour per model; its reference conditions (notes) dashed in the same colour
    for row in rows(results, args.mean):
        colour = colours.setdefault(row["model"], f"C{len(colours) % 10}")
        y = [c[1] if c[1] is not None else float("nan") for c in row["buckets"]]
        err = [c[2] if c[2] is not None else float("nan") for c in row["buckets"]] if args.mean else None
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=colour, linestyle="--" if row["note"] else "-",
                    label=f"{row['label']} (all: {row['all'][0]})")
    ax.set_xticks(x, [f"{lab}\n(n={n})" for lab, n in zip(labels, counts)])
    ax.set_xlabel(f"source length ({results[0].get('length_unit', 'words')}), sentences per bucket")
    ax.set_ylabel("BLEU (sacrebleu)" + (", mean ± std over seeds" if args.mean else ""))
    if args.train_max_len:
        # the first bucket that starts beyond the training lengths: shade everything from there on
        first = next((i for i, b in enumerate(results[0]["buckets"]) if b["lo"] > args.train_max_len), None)
        if first is not None:
            ax.axvspan(first - 0.5, len(labels) - 0.5, color="0.92", zorder=0)
            ax.text(first - 0.4, ax.get_ylim()[1] * 0.97, "longer than any training sentence", va="top", fontsize=8)
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # beside the axes: never over a line
    fig.tight_layout()
    save_figure(fig, args.out, dpi=120, format="png")
    print(f"plot: {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("score", help="BLEU per source-length bucket for one model")
    s.add_argument("--name", required=True, help="run name shown in tables and plots (e.g. transformer.seed1)")
    s.add_argument("--model", help="the model this run is a seed of, for --mean (default: --name)")
    s.add_argument("--note", help="a reference condition of the model, e.g. 'trained on all lengths' "
                                  "(shown after its name; plotted dashed)")
    s.add_argument("--src", nargs="+", required=True, help="raw source file(s)")
    s.add_argument("--ref", nargs="+", required=True, help="raw reference file(s)")
    s.add_argument("--hyp", nargs="+", required=True, help="detokenized hypothesis file(s)")
    s.add_argument("--edges", default="1,11,21,31,41,61,81", help="bucket edges in source words")
    s.add_argument("--out", required=True, help="output .length.json")
    s.set_defaults(func=cmd_score)
    p = sub.add_parser("plot", help="plot BLEU vs length for several .length.json files")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--out", required=True, help="output .png")
    p.add_argument("--title", default="BLEU by source length")
    p.add_argument("--train-max-len", type=int, help="shade the buckets beyond this training length")
    p.add_argument("--mean", action="store_true", help="one line per model: mean +- std over its runs")
    p.set_defaults(func=cmd_plot)
    t = sub.add_parser("table", help="markdown table of several .length.json files")
    t.add_argument("inputs", nargs="+")
    t.add_argument("--out", help="also write the table here")
    t.add_argument("--mean", action="store_true", help="one row per model: mean +- std over its runs")
    t.set_defaults(func=cmd_table)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
