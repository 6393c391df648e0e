"""What each position scheme costs, as ratios to fairseq's Transformer measured in the same run: training
update, beam-search decoding and peak memory per sequence length, or (--count-ops) operators and host syncs.

The protocol is in scripts/tooling/bench/phases.py's docstring (the measurements); scripts/tooling/bench/report.py
writes the markdown. Usage: python scripts/bench/bench.py [--quick] [--device cpu|cuda] [--out-json F] [--out-md F]
(make bench: BENCH_ARGS).

--regime measures instead what users train with (scripts/tooling/bench/regime.py's docstring): a newstest-like
length mix batched by fairseq under --max-tokens, fairseq's Trainer in each --precision, beam-4 decoding; tokens
per second, ratios to the Transformer, FLOPs per update and the fraction of the device's bf16 matmul rate.
Verified on CPU only (tests/test_bench.py, tiny dims); it has not yet run on a GPU.

This module is scripts/bench/bench.py's command line: its flags, their defaults and checks, and the report it writes
(the GPU check's bench section calls main() with its own arguments and the command line to record).
"""
import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from tooling.atomic import write_text
from tooling.bench.phases import run
from tooling.bench.models import ARCHS, SCHEME_NAMES
from tooling.bench.ops import count_ops
from tooling.bench.update_memory import update_memory_markdown
from tooling.bench.update_ops import count_update_ops, update_ops_markdown
from tooling.bench.timing import CLOCKS, parse_lengths
from tooling.bench.regime import PRECISIONS, check_args, run_regime
from tooling.bench.report import markdown, ops_markdown, regime_markdown
from tooling.paths import REPO, relativize


def main(argv=None, command=None):
    """The benchmark as the command line asks (argv: default sys.argv[1:]); command: the command line its report
    records (default: scripts/bench/bench.py and argv)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true",
                   help="tiny dims, two short lengths, few repetitions (a smoke run of well under a minute on CPU)")
    p.add_argument("--dims", default=None, help=f"one of {', '.join(ARCHS)} (default base); with --regime a "
                   "comma-separated list (default base,big: fairseq's transformer_wmt_en_de and "
                   "transformer_vaswani_wmt_en_de_big dims)")
    p.add_argument("--lengths", default="32,128,256,512", help="comma-separated sequence lengths T")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per training batch on each side (B = tokens // T)")
    p.add_argument("--decode-tokens", type=int, default=1024, help="source tokens per decoding call (B = this // T)")
    p.add_argument("--vocab", type=int, default=32768, help="size of the synthetic joint dictionary")
    p.add_argument("--warmup", type=int, default=2, help="untimed updates of each model per length")
    p.add_argument("--reps", default="7", help="timed updates of each model: one number or one per length")
    p.add_argument("--decode-reps", default="3", help="timed decoding calls of each model: one number or one per length")
    p.add_argument("--models", default="relative,floater,floater_cached",
                   help="compared with the transformer: any of relative, floater, floater_cached (needs floater), "
                        "floater_graph (FLOATER with --floater-cuda-graph: --device cuda), floater_shared (with "
                        "--floater-shared-solve; --regime), transformer_plugin_attention (the transformer with the plugins' "
                        "self-attention: --regime gives each model's ratio to it too), " + ", ".join(SCHEME_NAMES))
    p.add_argument("--floater-every", type=int, default=100, help="N of the cached FLOATER (--floater-update-every N)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--clock", choices=CLOCKS, default=None,
                   help="the clock of the ratios: wall time, or this process's CPU time (default: cpu on --device "
                        "cpu, where a shared machine's load swings the wall time; wall on cuda). Both are recorded")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    p.add_argument("--memory-reps", type=int, default=3, help="memory probes of each (model, T); the median is reported")
    p.add_argument("--memory-workers", type=int, default=2, help="memory probes run at the same time")
    p.add_argument("--no-decode", action="store_true", help="skip decoding")
    p.add_argument("--profile-length", type=int, default=0, help="profile one update of each model at this T (0: none)")
    p.add_argument("--profile-decode", type=int, default=0,
                   help="profile one decoding call of each model at this T, after the timed calls (0: none)")
    p.add_argument("--profile-top", type=int, default=15)
    p.add_argument("--count-ops", action="store_true",
                   help="count operators and host syncs (no timing) of one update per model and of FLOATER's solve; "
                        "writes results/bench/bench_ops.json/.md unless --out-json/--out-md are given; with --regime: "
                        "of fairseq's Trainer.train_step per precision, each sync named "
                        "(results/bench/bench_update_ops.*)")
    p.add_argument("--memory", action="store_true",
                   help="with --count-ops --regime: the default update and --fused-update --adam-impl torch, each "
                        "row with the peak host memory of the counted update above the resident set before it, in "
                        "fresh processes (--memory-reps, --memory-workers; results/bench/bench_update_memory.*)")
    r = p.add_argument_group("the users' regime (--regime; verified on CPU at tiny dims only, not yet run on a GPU)")
    r.add_argument("--regime", action="store_true",
                   help="a newstest2014-like length mix batched as fairseq-train batches it, fairseq's Trainer, "
                        "beam 4; tokens/s and ratios per --dims x --precision x --max-tokens (writes results/bench/bench_regime.*)")
    r.add_argument("--precision", default="fp32",
                   help="comma-separated, of " + ", ".join(PRECISIONS) + " (fairseq's --amp, --bf16, --fp16); users "
                        "train in bf16 or amp, which gpu_check.sh's section bench runs")
    r.add_argument("--max-tokens", default="8192,16384",
                   help="comma-separated tokens per batch (fairseq's --max-tokens)")
    r.add_argument("--updates", type=int, default=5, help="timed updates of each model per group (after --warmup)")
    r.add_argument("--update-freq", type=int, default=1,
                   help="batches per update (fairseq's --update-freq: the Trainer's micro-batches); floater_shared "
                        "(--floater-shared-solve) solves FLOATER's ODE once per update, floater once per batch")
    r.add_argument("--decode-max-tokens", type=int, default=8000,
                   help="source tokens per decoding batch (scripts/evaluate.sh's --max-tokens)")
    r.add_argument("--decode-batches", type=int, default=2, help="timed decoding batches of each model")
    r.add_argument("--train-flags", default="",
                   help="fairseq-train flags added to every model's, one shell-quoted string after '=' "
                        "(--train-flags='--fused-update --adam-impl torch')")
    r.add_argument("--profile-update", action="store_true",
                   help="after the timed updates of the first group, profile one more update of each model "
                        "(torch.profiler: its top operators by self time, --profile-top of them) into the report")
    p.add_argument("--out-json", default=None, help="default results/bench/bench.json (--count-ops: results/bench/bench_ops.json)")
    p.add_argument("--out-md", default=None, help="default results/bench/bench.md (--count-ops: results/bench/bench_ops.md)")
    p.add_argument("--silent", action="store_true", help="no progress lines on stderr")
    p.add_argument("--notes", default=str(REPO / "results" / "bench" / "bench_notes.md"),
                   help="markdown appended to --out-md (the analysis of the committed run), if the file exists")
    args = p.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    args.command = command or " ".join(shlex.quote(a) for a in ["scripts/bench/bench.py", *given])
    args.update_flags = shlex.split(args.train_flags)
    if args.memory and not (args.count_ops and args.regime):
        raise SystemExit("--memory: only with --count-ops --regime (the fixed-length benchmark measures peak memory "
                         "unless --no-memory)")
    stem = "bench_update_memory" if args.memory else "bench_update_ops" if args.count_ops and args.regime else "bench_ops" if args.count_ops else \
        "bench_regime" if args.regime else "bench"
    args.out_json = args.out_json or str(REPO / "results" / "bench" / f"{stem}.json")
    args.out_md = args.out_md or str(REPO / "results" / "bench" / f"{stem}.md")
    if args.regime:
        return main_regime(p, args)
    if args.quick:
        for name, value in (("dims", "tiny"), ("threads", 1), ("lengths", "16,32"), ("tokens", 256), ("decode_tokens", 64),
                            ("vocab", 64), ("warmup", 1), ("reps", "3"), ("decode_reps", "2"), ("memory_reps", 1)):
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    args.dims = args.dims or "base"
    if args.dims not in ARCHS:
        raise SystemExit(f"--dims {args.dims}: one of {', '.join(ARCHS)} (a list only with --regime)")
    if args.floater_every < 2:
        raise SystemExit("--floater-every must be >= 2 (N = 1 is the exact FLOATER, always measured)")
    lengths = parse_lengths(args.lengths)
    for flag, value in (("--profile-length", args.profile_length), ("--profile-decode", args.profile_decode)):
        if value and value not in lengths:
            raise SystemExit(f"{flag} {value}: not one of --lengths {args.lengths}")
    if args.profile_decode and args.no_decode:
        raise SystemExit("--profile-decode needs decoding (drop --no-decode)")
    if args.clock is None:
        args.clock = "cpu" if args.device == "cpu" else "wall"
    if args.count_ops:
        res = count_ops(args)
        res = relativize(res)
        for path, text in ((args.out_json, json.dumps(res, indent=1) + "\n"), (args.out_md, ops_markdown(res))):
            write_text(Path(path), text)
        print(ops_markdown(res))
        return
    res = write_report(run(args, progress=lambda partial: write_report(partial, args)), args)
    print(markdown(res))


REGIME_MODELS = "relative,t5,alibi,floater,rope"  # --regime's --models unless given


def main_regime(p, args):
    """--regime: the users' regime (tooling.bench.regime), its report written after every group of rows."""
    if args.models == p.get_default("models"):
        args.models = REGIME_MODELS
    if args.quick:  # tiny models, small batches of the same length mix
        for name, value in (("dims", "tiny"), ("threads", 1), ("max_tokens", "512,1024"), ("vocab", 64),
                            ("warmup", 1), ("updates", 2), ("decode_max_tokens", 256), ("decode_batches", 1)):
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
    args.dims = args.dims or "base,big"
    if args.clock is None:
        args.clock = "cpu" if args.device == "cpu" else "wall"
    check_args(args)
    if args.count_ops:
        if args.memory_reps < 1 or args.memory_workers < 1:
            raise SystemExit("--memory-reps and --memory-workers must be >= 1")
        res = relativize(count_update_ops(args))
        report = update_memory_markdown if args.memory else update_ops_markdown
        for path, text in ((args.out_json, json.dumps(res, indent=1) + "\n"), (args.out_md, report(res))):
            write_text(Path(path), text)
        print(report(res))
        return

    def write(res):
        res = relativize(res)
        for path, text in ((args.out_json, json.dumps(res, indent=1) + "\n"), (args.out_md, regime_markdown(res))):
            write_text(Path(path), text)
        return res

    print(regime_markdown(write(run_regime(args, progress=write))))


def write_report(res, args):
    """--out-json and --out-md (each atomically), the committed notes appended; the report as written."""
    res["notes"] = Path(args.notes).read_text(encoding="utf-8") if args.notes and Path(args.notes).is_file() else None
    res = relativize(res)  # no absolute path of this machine in the results
    for path, text in ((args.out_json, json.dumps(res, indent=1) + "\n"), (args.out_md, markdown(res))):
        write_text(Path(path), text)
    return res
