#!/usr/bin/env python3
"""The Multi30k study's decisions and results (scripts/tooling/study/: runs.py the run results, table.py the tables,
plan.py the decisions); scripts/study/multi30k_study.sh calls it.

  # the runs in order, one "PHASE MODEL SEED" line each (fine-tunes after everything trained from scratch)
  scripts/study/study.py plan --models "transformer relative floater_warm" --seeds "1 2 3"
  # run, skip, probe or retrain one (model, seed); an error if its result was made with another recipe
  scripts/study/study.py decide --model transformer --seed 1 --models "..." --out OUT_DIR --run-dir RUN --recipe "..." \
      [--probe [--probe-retrain]]
  # one finished run: its generate.sh JSON + hypotheses -> RUNS/MODEL.seedS.json and .hyp
  scripts/study/study.py run-result --model transformer --seed 1 --test-json RUN/test.json \
      --ref data/.../raw/test.de --train-log RUN/train.log --out RUNS/transformer.seed1.json [--meta k=v ...]
  # every run JSON in RUNS -> table.md (+ summary.json); runs missing from MODELS x SEEDS mark it partial
  scripts/study/study.py table --runs RUNS --models "transformer relative" --seeds "1 2 3" --out OUT_DIR
  # what the recipe runs after each run: the table of every finished run, probe_table.md, valid_loss.png
  scripts/study/study.py tabulate --runs RUNS --models "rope" --seeds "1 2 3" --out OUT_DIR [table's options]
  # what the recipe tabulates: MODELS and SEEDS and every finished run in RUNS (two lines: models, seeds)
  scripts/study/study.py every-run --runs RUNS --models "rope" --seeds "1 2 3"
  # validation loss against updates, one line per run
  scripts/study/study.py plot --runs RUNS --out OUT_DIR/valid_loss.png
  # the study in one table (a row per scheme: 8 and 20 epochs, converged, the probe, a reading) into
  # results/multi30k_study/results_table.md and the READMEs' copies; --check: exit 1 where a copy differs
  scripts/study/study.py results-table [--check]
  # the length probe in one figure: BLEU and length ratio by bucket, every scheme of a condition, seed bands
  scripts/study/study.py probe-plot [--folder results/multi30k_study/tok32_joined --out results/multi30k_study/probe.png]
  # a finished run trained again (its checkpoints were lost): one line on how it compares with the record
  scripts/study/study.py retrain-note --recorded RUNS/transformer.seed1.json --test-json RUN/test.json --out F
"""
import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling library
from tooling.study import plan as study_plan, results_table, runs as study, table as study_table


def decide(args):
    print(study_plan.decide(args.model, args.seed, args.models.split(), args.out, args.run_dir, args.recipe,
                            probe=args.probe, probe_retrain=args.probe_retrain))


def every_run(args):
    models, seeds = study.every_run(args.runs, args.models.split(), args.seeds.split())
    print(" ".join(models))
    print(" ".join(map(str, seeds)))


def tabulate(args):
    """Every table and plot of a study folder in one process (the recipe calls it after each run): the claims
    table of every finished run (every-run), the length probe's table, the results' paths made portable, the
    validation curves; then the study's results table and probe figure where this folder is one of their
    sources (tooling/study/results_table.py)."""
    import result_paths
    from tooling.study import probe_table as length_probe_table

    models, seeds = study.every_run(args.runs, args.models.split(), args.seeds.split())
    asked, args.models, args.seeds = args.seeds, " ".join(models), " ".join(map(str, seeds))
    study_table.table(args, asked)
    src, tgt = args.pair.split("-")
    length_probe_table.table(argparse.Namespace(runs=args.runs, models=args.models, seeds=args.seeds,
                                                out=os.path.join(args.out, "probe_table.md"),
                                                data=args.probe_data, reference="transformer", src=src,
                                                tgt=tgt))
    result_paths.rewrite_all([args.out])  # older code wrote absolute paths
    if any(Path(args.runs).glob("*.json")):
        study.plot(argparse.Namespace(runs=args.runs, out=os.path.join(args.out, "valid_loss.png"),
                                      title=args.plot_title))
    results_table.refresh(args.out)


def table_of_results(args):
    if args.check:
        wrong = results_table.check()
        for path, what in wrong:
            print(f"{path}: {what}")
        raise SystemExit(1 if wrong else 0)
    print(results_table.write(), end="")


def probe_plot(args):
    print(f"probe plot -> {results_table.plot_probe(args.folder, args.out)}")


def plan(args):
    for phase, model, seed in study_plan.plan(args.models.split(), args.seeds.split()):
        print(phase, model, seed)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run-result")
    r.add_argument("--model", required=True)
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--test-json", required=True, help="scripts/generate.sh output")
    r.add_argument("--ref", required=True, help="raw reference")
    r.add_argument("--train-log", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--meta", nargs="*", default=[], help="key=value pairs stored in the JSON")
    t = sub.add_parser("table")
    t.add_argument("--runs", required=True)
    t.add_argument("--models", required=True)
    t.add_argument("--seeds", required=True)
    t.add_argument("--baseline", default="transformer")
    t.add_argument("--pair", default="en-de")
    t.add_argument("--sentences", default="1000")
    t.add_argument("--out", required=True, help="directory for table.md and summary.json")
    t.add_argument("--source-dependence", help="directory of scripts/source_dependence.py JSONs, MODEL.seedS.json")
    t.add_argument("--ref", help="the test references (default: the path each run recorded)")
    t.add_argument("--split-src", help="the test sources: adds the table on the test sentences of at most and of "
                                       "more than --split-at source words")
    t.add_argument("--split-at", type=int, help="the length that splits the test set, in source words (e.g. the "
                                                "training runs' MAX_TRAIN_LEN)")
    t.add_argument("--split-note", help="what the longer sentences are to these runs, shown in their heading "
                                        "(e.g. 'longer than any training sentence')")
    tb = sub.add_parser("tabulate", parents=[t], add_help=False,
                        help="table (of every finished run in --runs), the probe's table, portable paths, the plot")
    tb.add_argument("--plot-title", default="validation loss")
    tb.add_argument("--probe-data", help="the runs' data directory (length_probe.py score --data): the probe's "
                                         "table adds each model's repeated 4-grams and difference to the "
                                         "transformer per bucket")
    n = sub.add_parser("retrain-note")
    n.add_argument("--recorded", required=True, help="the recorded run's JSON")
    n.add_argument("--test-json", required=True, help="scripts/generate.sh output of the run trained again")
    n.add_argument("--out", required=True)
    u = sub.add_parser("updates")
    u.add_argument("run_json")
    p = sub.add_parser("plot")
    p.add_argument("--runs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--title", default="validation loss")
    e = sub.add_parser("every-run")
    e.add_argument("--runs", required=True)
    e.add_argument("--models", required=True)
    e.add_argument("--seeds", required=True)
    pl = sub.add_parser("plan")
    pl.add_argument("--models", required=True)
    pl.add_argument("--seeds", required=True)
    d = sub.add_parser("decide")
    d.add_argument("--model", required=True)
    d.add_argument("--seed", type=int, required=True)
    d.add_argument("--models", required=True, help="every model of the study (its fine-tunes keep a transformer)")
    d.add_argument("--out", required=True, help="the study's result directory (its runs/)")
    d.add_argument("--run-dir", required=True, help="the run's checkpoint directory")
    d.add_argument("--recipe", required=True, help="the recipe string every result records")
    d.add_argument("--probe", action="store_true", help="every run has its length probe (the recipe's PROBE=1)")
    d.add_argument("--probe-retrain", action="store_true",
                   help="a finished run without its probe or checkpoints is trained again to probe it")
    rt = sub.add_parser("results-table", help="the study in one table, into results_table.md and the READMEs")
    rt.add_argument("--check", action="store_true", help="change nothing; exit 1 where a README's copy differs")
    pp = sub.add_parser("probe-plot", help="the train-short length probe in one figure")
    pp.add_argument("--folder", default=str(results_table.ROOT / results_table.PROBE),
                    help="a condition's folder (its runs/*.probe.json, summary.json)")
    pp.add_argument("--out", default=str(results_table.ROOT / results_table.FIGURE))
    args = ap.parse_args()
    {"run-result": study.run_result, "table": study_table.table, "plot": study.plot, "updates": study.updates,
     "retrain-note": study.retrain_note, "every-run": every_run, "plan": plan, "decide": decide,
     "tabulate": tabulate, "results-table": table_of_results, "probe-plot": probe_plot}[args.cmd](args)


if __name__ == "__main__":
    main()
