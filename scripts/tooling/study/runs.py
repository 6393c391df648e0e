"""The Multi30k study's run results (scripts/study/study.py is its command line; the study runs through
scripts/study/multi30k_study.sh). Its tables are tooling/study/table.py's, its decisions tooling/study/plan.py's.

One JSON per (model, seed) run (`run_result`): two BLEU scores, sacreBLEU (cased, detokenized, with its signature)
and the Multi30k literature's tokenized BLEU (13a tokens, lowercased, BLEU on tokens: scripts/tokenized_bleu.py
--lowercase --no-compound-split), the validation-loss curve and the training time from the fairseq-train log. The
runs of a folder (`load_runs`), which models a recipe's table covers (`every_run`: the models and seeds asked for
and every finished run), a finished run trained again compared with its record (`retrain_note`), the
validation-loss curves (`plot`).
"""
import json
import os
import re
import shutil
import statistics
import textwrap

from tooling.atomic import save_figure, write_atomic, write_json, write_text
from tooling.bleu import METHOD_LOWERCASE, tokenized_bleu
from tooling.paths import locate, portable
from tooling.tool import Tool

RUN_FILE = re.compile(r"\w+\.seed\d+\.json")  # one run's result: MODEL.seedS.json
# a finished transformer trained again for its seed's fine-tunes (its checkpoints were on another machine):
# MODEL.seedS.retrained.json, the run the fine-tunes continued, which can differ from the recorded one
RETRAINED_FILE = re.compile(r"(\w+)\.seed(\d+)\.retrained\.json")
RETRAINED = "{} trained again"  # its key in load_runs: (RETRAINED.format(model), seed)


TOOL = Tool("study.py")
fail, read_lines = TOOL.fail, TOOL.read_lines


def parse_train_log(path):
    """(validation curve [(updates, loss)], training seconds) from a fairseq-train log. A resumed run appends a
    new session to the log: its seconds run from its start line to its last finished epoch."""
    from datetime import datetime

    curve, seconds, start, end = {}, 0.0, None, None
    for line in read_lines(path) + ["<end>"]:
        stamp = line[:19]
        if "fairseq_cli.train | {" in line or line == "<end>":  # a session starts (or the log ends)
            if start is not None and end is not None:
                seconds += (end - start).total_seconds()
            start, end = (datetime.fromisoformat(stamp) if line != "<end>" else None), None
        elif "| train | epoch" in line and start is not None:
            end = datetime.fromisoformat(stamp)
        m = re.search(r"valid on 'valid' subset \| loss ([0-9.]+) .*\| num_updates (\d+)", line)
        if m:
            curve[int(m.group(2))] = float(m.group(1))
    return sorted(curve.items()), seconds


def updates(args):
    """The last update of a finished run (the x offset of the runs that continue it)."""
    try:
        with open(args.run_json, encoding="utf-8") as f:
            curve = json.load(f)["valid_loss"]
    except (OSError, ValueError, KeyError) as err:
        fail(f"{args.run_json}: not a run result ({err})")
    print(curve[-1][0] if curve else 0)


def run_result(args):
    try:
        with open(args.test_json, encoding="utf-8") as f:
            test = json.load(f)
    except (OSError, ValueError) as err:
        fail(f"--test-json {args.test_json}: not a readable generate.sh result ({err})")
    hyps, refs = read_lines(locate(test["hypotheses"])), read_lines(args.ref)
    if len(hyps) != len(refs):
        fail(f"{test['hypotheses']} has {len(hyps)} lines for {len(refs)} in {args.ref}")
    curve, train_seconds = parse_train_log(args.train_log)
    base = args.out[:-len(".json")] if args.out.endswith(".json") else args.out
    write_atomic(base + ".hyp", lambda tmp: shutil.copyfile(locate(test["hypotheses"]), tmp))
    result = {
        "model": args.model, "seed": args.seed,
        "bleu": test["bleu"], "sacrebleu_signature": test["sacrebleu_signature"],
        "bleu_tok_lc": round(tokenized_bleu(hyps, refs, lowercase=True, compounds=False).score, 2),
        "bleu_tok_lc_method": METHOD_LOWERCASE,
        "sentences": len(refs), "reference": portable(args.ref), "hypotheses": os.path.basename(base + ".hyp"),
        "checkpoint": portable(test.get("checkpoint")), "beam": test.get("beam"), "lenpen": test.get("lenpen"),
        "valid_loss": [[u, loss] for u, loss in curve], "train_seconds": round(train_seconds),
        "seconds_per_epoch": round(train_seconds / len(curve), 1) if curve else None,
    }
    result.update(kv.split("=", 1) for kv in args.meta)
    write_json(args.out, result, indent=2, sort_keys=True)
    print(f"{args.model} seed {args.seed}: BLEU {result['bleu']:.2f} (sacreBLEU), {result['bleu_tok_lc']:.2f} "
          f"(tokenized, lowercased) -> {args.out}")


def retrain_note(args):
    """A finished run trained again (its checkpoints were gone and runs continue from it): how it compares with
    the recorded run, one line into --out; the runs that continue from it record that line."""
    try:
        with open(args.recorded, encoding="utf-8") as f:
            recorded = json.load(f)
        with open(args.test_json, encoding="utf-8") as f:
            test = json.load(f)
    except (OSError, ValueError) as err:
        fail(f"cannot read a run result: {err}")
    old = read_lines(os.path.join(os.path.dirname(args.recorded), recorded["hypotheses"]))
    new = read_lines(locate(test["hypotheses"]))
    if len(old) != len(new):
        fail(f"{test['hypotheses']} has {len(new)} lines for {len(old)} recorded")
    same = sum(a == b for a, b in zip(old, new))
    note = (f"trained again: {same} of {len(old)} test hypotheses identical to the recorded run's, "
            f"sacreBLEU {test['bleu']:.2f} (recorded {recorded['bleu']:.2f})")
    write_text(args.out, note + "\n")
    print(note)


def load_runs(runs_dir, retrained=False):
    """{(model, seed): run} from MODEL.seedS.json; with retrained, also {(RETRAINED.format(model), seed): run}
    from MODEL.seedS.retrained.json."""
    runs = {}
    if not os.path.isdir(runs_dir):
        return runs
    for name in sorted(os.listdir(runs_dir)):
        again = RETRAINED_FILE.fullmatch(name)
        if not (RUN_FILE.fullmatch(name) or (retrained and again)):  # e.g. MODEL.seedS.length.json sits beside
            continue
        path = os.path.join(runs_dir, name)
        try:
            with open(path, encoding="utf-8") as f:
                run = json.load(f)
            run["_hyps"] = read_lines(os.path.join(runs_dir, run["hypotheses"]))
        except (ValueError, KeyError) as err:
            fail(f"{path}: not a run result ({err})")
        model = RETRAINED.format(again.group(1)) if again else run["model"]
        runs[(model, int(run["seed"]))] = run
    return runs


# the recipe's default MODELS: every table lists them first, in this order (every_run)
STUDY_MODELS = ("transformer", "relative", "floater", "floater_warm", "transformer_ft")


def every_run(runs_dir, models, seeds):
    """(models, seeds) a recipe's table covers: those asked for and those of every finished run in runs_dir
    (MODEL.seedS.json), so that a run of a few models into a shared directory does not rewrite its table from
    those alone. One order whoever asks: STUDY_MODELS, then the table of schemes' order, then by name; seeds
    ascending."""
    found = set()
    if os.path.isdir(runs_dir):
        for name in os.listdir(runs_dir):
            m = re.fullmatch(r"(\w+)\.seed(\d+)\.json", name)
            if m and os.path.getsize(os.path.join(runs_dir, name)) > 0:
                found.add((m.group(1), int(m.group(2))))
    every = set(models) | {m for m, _ in found}
    order = list(STUDY_MODELS)
    if every - set(order):  # only then import the plugins (torch) for the table of schemes
        from fairseq_plugins.schemes import MODELS

        order += [m for m in MODELS if m not in order]
    rank = {m: i for i, m in enumerate(order)}
    return (sorted(every, key=lambda m: (rank.get(m, len(rank)), m)),
            sorted({int(s) for s in seeds} | {s for _, s in found}))



def plot(args):
    """Validation loss against updates: one panel per model (its seeds one line each, a fine-tune continuing its
    transformer's x axis), every panel on the same axes, the transformer's mean over seeds in grey beside the
    others for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(args.runs)
    if not runs:
        fail(f"no run results in {args.runs}")
    curves = {}
    for (model, seed), run in runs.items():
        curve = run.get("valid_loss") or []
        offset = int(run.get("update_offset", 0))
        if curve:
            curves.setdefault(model, {})[seed] = ([u + offset for u, _ in curve], [loss for _, loss in curve])
    models, seeds = every_run(args.runs, list(curves), [])
    models = [m for m in models if m in curves]
    cols = min(4, len(models))
    rows = -(-len(models) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, 2.5 * rows + 1.0), sharex=True, sharey=True,
                             squeeze=False)
    reference = None
    base = curves.get("transformer", {})
    if base and len({tuple(x) for x, _ in base.values()}) == 1:  # the seeds share their updates: their mean
        xs = next(iter(base.values()))[0]
        reference = (xs, [statistics.mean(c[1][i] for c in base.values()) for i in range(len(xs))])
    colors = {s: f"C{i}" for i, s in enumerate(seeds)}
    for ax, model in zip(axes.flat, models):
        if reference and model != "transformer":
            ax.plot(*reference, color="0.6", linestyle="--", linewidth=1.2, label="transformer, mean of its seeds")
        for seed, (xs, ys) in sorted(curves[model].items()):
            ax.plot(xs, ys, color=colors[seed], marker=".", markersize=4, linewidth=1.2, label=f"seed {seed}")
        ax.set_title(f"{model} (seed{'s' if len(curves[model]) > 1 else ''} "
                     f"{', '.join(map(str, sorted(curves[model])))})", fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    for col in range(cols):  # the lowest panel of each column: its updates axis
        lowest = [ax for ax in axes[:, col] if ax.get_visible()][-1]
        lowest.xaxis.set_tick_params(labelbottom=True)
        lowest.set_xlabel("updates", fontsize=10)
    handles = {}
    for ax in axes.flat[:len(models)]:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    order = sorted(handles, key=lambda label: (not label.startswith("transformer"), label))
    fig.legend([handles[k] for k in order], order, loc="lower center", ncol=len(order), fontsize=9, frameon=False)
    fig.supylabel("validation loss (label-smoothed, base 2)", fontsize=10)
    fig.suptitle(textwrap.fill(args.title, int(3.3 * cols * 11)), fontsize=11)  # ~11 characters an inch
    fig.tight_layout(rect=(0, 0.5 / (2.5 * rows + 1.0), 1, 1))
    save_figure(fig, args.out, dpi=110)
    print(f"plot -> {args.out}")

