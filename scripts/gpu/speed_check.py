"""The training update's speed on one GPU, fairseq's default update against --fused-update --adam-impl torch, in one
call (scripts/gpu/speed_check.sh sets up from the bundle and runs this; docs/benchmarks.md).

In order, each given what is left of --budget seconds (counted from the set-up's start), so a call cut short keeps
what it measured:
1. base dims: scripts/bench/bench.py --regime (fairseq's Trainer on newstest2014's length mix) in bf16, fp16 and
   amp at 8,192 and 16,384 tokens, 20 timed updates after 3, fairseq's Transformer and Shaw's model, once with
   fairseq's default update and once with the fused one, one update of each profiled (torch.profiler's top
   operators) in the first group; each bench call writes its JSON after every group;
2. exactness (tooling/bench/exactness.py): the fused update against the default one on this device, each precision
   from the same weights on the same batches (base dims, 8,192 tokens), and 50 free-running fp32 updates of the tiny
   recipe, beside the default run twice (the device's own floor);
3. the study's tiny recipe (transformer_tiny with scripts/study/multi30k_study.sh's MODEL_ARGS, fp32, 4,096 tokens,
   fairseq's Trainer): its updates/s alone and 16 processes side by side (one thread each), default and fused,
   side by side once without and once with CUDA MPS (`nvidia-cuda-mps-control -d`, its pipe and log folders in a
   scratch folder, stopped at the end; where it does not start the report says why);
4. every scheme: bench.py --regime at base dims, bf16, 8,192 tokens, the fused update, each model's ratio to
   fairseq's Transformer and to the same model through the plugins' attention (transformer_plugin_attention);
   FLOATER exact (and with its CUDA-graph solve) and with --floater-update-every 100 (the dry run: DRY_SCHEMES);
5. big dims as 1.

Writes to --out-dir: regime_{base,big}_{default,fused}.json, regime_schemes.json, exactness.json, tiny_rates.json and
speed_check.md (tokens/s side by side and the speed-up; the exactness; the tiny rates; the schemes' ratios), eight
files at most. --dry-run: on CPU at tiny dims, one update per group, two processes side by side for two seconds,
five free-running updates (checks the script; no figure). --steps runs some of them (in the order above): a second
call takes what the first left for its budget (`--steps schemes,big`).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from tooling.atomic import write_json, write_text  # noqa: E402
from tooling.gpu import mps as mps_service  # noqa: E402
from tooling.bench.models import BASELINE, FUSED_UPDATE, PLUGIN_BASELINE, SHARED, model_specs  # noqa: E402
from tooling.gpu.campaign_jobs import study_model_args  # noqa: E402

FUSED = " ".join(FUSED_UPDATE)
VARIANTS = {"default": "", "fused": FUSED}


DRY_SCHEMES = ("relative", "floater_every100", PLUGIN_BASELINE)  # the dry run's: the same code as every model's


def scheme_models(dry_run):
    """Every model of the table (and the two baselines): FLOATER exact, with its CUDA-graph solve and cached
    (--floater-update-every 100); the dry run a few."""
    if dry_run:
        return list(DRY_SCHEMES)
    return [n for n in model_specs("base", 100) if n not in (BASELINE, SHARED)]


def schemes_args(out_json, out_md, dry_run):
    args = ["--regime", "--precision", "bf16", "--models", ",".join(scheme_models(dry_run)), "--no-decode",
            f"--train-flags={FUSED}", "--out-json", str(out_json), "--out-md", str(out_md), "--silent"]
    if dry_run:
        return args + ["--dims", "tiny", "--device", "cpu", "--max-tokens", "512", "--updates", "1", "--warmup", "0",
                       "--vocab", "1000", "--threads", "1"]
    return args + ["--dims", "base", "--device", "cuda", "--max-tokens", "8192", "--updates", "10", "--warmup", "3"]


def exactness_step(out_json, dry_run):
    """exactness.json (tooling/bench/exactness.py), in a process of its own like the bench calls."""
    import torch

    from tooling.bench import exactness

    def progress(result):  # a call cut short keeps the parts it finished
        write_json(out_json, result, indent=1)

    if dry_run:
        torch.set_num_threads(1)
        result = exactness.run("cpu", "tiny", 512, ["fp32", "bf16", "amp"], study_model_args().split(), 512,
                               loss_updates=5, progress=progress)
    else:
        result = exactness.run("cuda", "base", 8192, ["fp32", "amp", "bf16", "fp16"], study_model_args().split(),
                               TINY_TOKENS, progress=progress)
    return 0 if result["ok"] else 1


def bench_args(dims, variant, out_json, out_md, dry_run):
    args = ["--regime", "--dims", dims, "--precision", "bf16,fp16,amp", "--models", "relative", "--no-decode",
            f"--train-flags={VARIANTS[variant]}", "--out-json", str(out_json), "--out-md", str(out_md), "--silent"]
    if dims in ("base", "tiny"):  # where the time of one update goes (tiny: the dry run's)
        args += ["--profile-update", "--profile-top", "15"]
    if dry_run:
        return args + ["--device", "cpu", "--max-tokens", "512", "--updates", "1", "--warmup", "0", "--vocab", "1000",
                       "--threads", "1", "--precision", "bf16,amp"]
    return args + ["--device", "cuda", "--max-tokens", "8192,16384", "--updates", "20", "--warmup", "3"]


# ---- the tiny recipe's updates/s, alone and side by side, with and without CUDA MPS -------------------------------

STEPS = ("base", "exactness", "rates", "schemes", "big")  # the call's steps, in order (docstring)
TINY_TOKENS = 4096
SIDE_BY_SIDE = 16


START_UP_S = 25  # a process's start-up and warm-up before the counted window (plus 2 s per process beside it)
DRY = {"seconds": 2, "processes": 2, "tokens": 512, "start_up_s": 10}


def tiny_worker(args):
    """One process: the tiny recipe's Trainer; updates counted for --seconds from --t0, or from 1 s after the last of
    the processes started with it (--ranks, each --out's .ready file) has warmed up if that is sooner (a JSON
    line to --out)."""
    import torch

    torch.set_num_threads(1)
    from tooling.bench import length_mix
    from tooling.bench.models import synthetic_dictionary
    from tooling.bench.regime import build_trainer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dictionary = synthetic_dictionary(10000)
    batches, _, _ = length_mix.corpus(length_mix.load_pairs(), dictionary, args.tokens, 16, args.seed)
    flags = study_model_args().split() + VARIANTS[args.variant].split()
    trainer = build_trainer("transformer_tiny", flags, "fp32", dictionary, device, args.seed)
    for b in batches[:3]:  # warm-up: Adam's state, lazily built buffers
        trainer.train_step([b])
    if device == "cuda":
        torch.cuda.synchronize()
    write_json(args.out + ".ready", {"at": time.time()})
    ready = [f"{args.out.rsplit('_', 1)[0]}_{rank}.json.ready" for rank in range(args.ranks)]  # tiny_rate's TAG_RANK.json
    while time.time() < args.t0:
        if all(os.path.isfile(f) for f in ready):  # each process reads the same files: all start alike
            args.t0 = min(args.t0, max(json.loads(Path(f).read_text())["at"] for f in ready) + 1.0)
        time.sleep(0.005)
    done, i = 0, 0
    while time.time() < args.t0 + args.seconds:
        trainer.train_step([batches[i % len(batches)]])
        i += 1
        if device == "cuda":
            torch.cuda.synchronize()
        if time.time() <= args.t0 + args.seconds:
            done += 1
    write_json(args.out, {"updates": done, "seconds": args.seconds})


def tiny_rate(variant, processes, seconds, env, scratch, tag, tokens, start_up_s):
    """Total updates/s of `processes` tiny-recipe trainers started together (each one thread), counted over the same
    `seconds` once all have warmed up."""
    t0 = time.time() + start_up_s + 2 * processes  # start-up and warm-up of every process first
    procs, outs = [], []
    for rank in range(processes):
        out = scratch / f"{tag}_{rank}.json"
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "tiny-worker", "--variant", variant, "--seed", str(rank + 1), "--t0", str(t0),
             "--ranks", str(processes), "--seconds", str(seconds), "--tokens", str(tokens), "--out", str(out)],
            cwd=REPO, env={**(env or os.environ), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errors = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=max(5, t0 + seconds + 60 - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode:
            errors.append((err.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200])
    updates = sum(json.loads(o.read_text())["updates"] for o in outs if o.is_file())
    return {"variant": variant, "processes": processes, "seconds": seconds, "updates": updates,
            "updates_per_s": round(updates / seconds, 1), "mps": env is not None, "errors": errors}


def tiny_rates(out_dir, dry_run, scratch, deadline):
    """tiny_rates.json: alone (default, fused), side by side without and with MPS."""
    if dry_run:  # every path once: alone, side by side, MPS (absent on CPU: its fallback)
        seconds, tokens, start_up_s = DRY["seconds"], DRY["tokens"], DRY["start_up_s"]
        plan = [("fused", 1, False), ("fused", DRY["processes"], False), ("fused", DRY["processes"], True)]
    else:
        seconds, tokens, start_up_s = 15, TINY_TOKENS, START_UP_S
        plan = [("default", 1, False), ("fused", 1, False), ("default", SIDE_BY_SIDE, False),
                ("fused", SIDE_BY_SIDE, False), ("default", SIDE_BY_SIDE, True), ("fused", SIDE_BY_SIDE, True)]
    result = {"model": "transformer_tiny " + " ".join(study_model_args().split()), "precision": "fp32", "tokens": tokens,
              "rows": [], "mps": None}
    mps_env = None
    try:
        for variant, processes, mps in plan:
            if time.time() + start_up_s + 2 * processes + seconds + 15 > deadline:
                result["rows"].append({"variant": variant, "processes": processes, "mps": mps,
                                       "skipped": "budget spent"})
                continue
            if mps and mps_env is None and result["mps"] is None:
                mps_env, why = mps_service.start(scratch)
                result["mps"] = "started" if mps_env else f"not started: {why}"
            if mps and mps_env is None:
                result["rows"].append({"variant": variant, "processes": processes, "mps": mps,
                                       "skipped": result["mps"]})
                continue
            row = tiny_rate(variant, processes, seconds, mps_env if mps else None, scratch,
                            f"{variant}_{processes}_{int(mps)}", tokens, start_up_s)
            result["rows"].append(row)
            print(f"speed_check: tiny {variant} x{processes}{' MPS' if mps else ''}: {row['updates_per_s']} updates/s",
                  file=sys.stderr, flush=True)
            write_json(out_dir / "tiny_rates.json", result, indent=1)
    finally:
        if mps_env is not None:
            mps_service.stop(mps_env)
    write_json(out_dir / "tiny_rates.json", result, indent=1)
    return result


def exactness_lines(path):
    """The fused update against the default one: the largest relative difference of the master weights after each
    update (and the default run twice: the floor), the free run's losses."""
    if not path.is_file():
        return []
    e = json.loads(path.read_text())
    out = ["", f"Exactness on {e['device']} ({e['dims']} dims, {e['model']}, {e['tokens']:,} tokens, {e['flags']}): "
           f"`{e['fused']}` against fairseq's default update; master weights, max |a − b| / max |a| over tensors, "
           "after each update (the first is judged)", "",
           "| precision | fused − default | default − default (floor) | bound (first update) | within |",
           "|---|---|---|---:|---|"]
    for p in e["precisions"]:
        if "error" in p:
            out.append(f"| {p['precision']} | failed: {p['error']} | — | {p['bound']:g} | NO |")
            continue
        out.append(f"| {p['precision']} | {', '.join(f'{x:.2g}' for x in p['fused'])} | "
                   f"{', '.join(f'{x:.2g}' for x in p['default_twice'])} | {p['bound']:g} | "
                   f"{'yes' if p['ok'] else 'NO'} |")
    f = e.get("free_running")
    if f and "error" in f:
        out += ["", f"fp32, {f['model']}, {f['updates']} free-running updates: failed: {f['error']}"]
    elif f:
        out += ["", f"fp32, {f['model']}, {f['tokens']:,} tokens, {f['updates']} free-running updates: losses within "
                f"{f['fused_loss']:.2g} relative of the default's (bound {f['bound']:g}: "
                f"{'within' if f['ok'] else 'NOT within'}; the default twice: {f['default_twice_loss']:.2g}); "
                f"weights after them {f['fused_weights']:.2g} (twice: {f['default_twice_weights']:.2g}); loss "
                f"{f['losses_default'][0]:.3f} → {f['losses_default'][-1]:.3f}"]
    return out


def scheme_lines(path):
    """Each scheme's time per token over the two baselines' (1.10× = 10 % slower)."""
    if not path.is_file():
        return []
    res = json.loads(path.read_text())
    out = ["", "Every scheme, `--fused-update --adam-impl torch`: time per target token over fairseq's Transformer's "
           f"and over {PLUGIN_BASELINE}'s (the same model through the plugins' attention)", "",
           "| dims | precision | max tokens | model | tokens/s | over transformer | over plugin attention |",
           "|---|---|---:|---|---:|---:|---:|"]
    for r in res["rows"]:
        plugin = r.get("plugin_train_ratio")
        out.append(f"| {r['dims']} | {r['precision']} | {r['max_tokens']:,} | {r['model']} | {r['tokens_per_s']:,.0f} | "
                   f"{r['train_ratio']:.2f}× | {f'{plugin:.2f}×' if plugin else '—'} |")
    return out


def summary(out_dir, runs, started, setup_s):
    """speed_check.md: per (dims, precision, tokens, model) tokens/s of the default and the fused update."""
    rows = {}
    for (dims, variant), status in runs.items():
        path = out_dir / f"regime_{dims}_{variant}.json"
        if not path.is_file():
            continue
        for r in json.loads(path.read_text())["rows"]:
            key = (r["dims"], r["precision"], r["max_tokens"], r["model"])
            rows.setdefault(key, {})[variant] = r["tokens_per_s"]
    lines = ["# The training update's speed: fairseq's default update and --fused-update --adam-impl torch", "",
             f"Set-up {setup_s or 0} s; measured {time.time() - started:.0f} s. Each bench call: "
             + "; ".join(f"{d}{' ' + v if v else ''}: {s}" for (d, v), s in runs.items()), "",
             "| dims | precision | max tokens | model | default tokens/s | fused tokens/s | speed-up |",
             "|---|---|---:|---|---:|---:|---:|"]
    for (dims, precision, tokens, model), v in rows.items():
        a, b = v.get("default"), v.get("fused")
        ratio = f"{b / a:.2f}×" if a and b else "—"
        lines.append(f"| {dims} | {precision} | {tokens:,} | {model} | {a and f'{a:,.0f}' or '—'} | "
                     f"{b and f'{b:,.0f}' or '—'} | {ratio} |")
    lines += exactness_lines(out_dir / "exactness.json")
    tiny = out_dir / "tiny_rates.json"
    if tiny.is_file():
        t = json.loads(tiny.read_text())
        lines += ["", f"The tiny recipe ({t['model']}, {t['precision']}, {t['tokens']:,} tokens), total updates/s; "
                  f"CUDA MPS: {t['mps'] or 'not asked for'}", "",
                  "| update | processes | MPS | updates/s |", "|---|---:|---|---:|"]
        for r in t["rows"]:
            value = r.get("skipped") or f"{r['updates_per_s']:,.1f}" + (f" ({len(r['errors'])} failed: "
                                                                         f"{r['errors'][0]})" if r["errors"] else "")
            lines.append(f"| {r['variant']} | {r['processes']} | {'yes' if r['mps'] else 'no'} | {value} |")
    lines += scheme_lines(out_dir / "regime_schemes.json")
    text = "\n".join(lines) + "\n"
    write_text(out_dir / "speed_check.md", text)
    return text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["exactness"]:
        w = argparse.ArgumentParser()
        w.add_argument("--out", required=True)
        w.add_argument("--dry-run", action="store_true")
        a = w.parse_args(argv[1:])
        return exactness_step(Path(a.out), a.dry_run)
    if argv[:1] == ["tiny-worker"]:
        w = argparse.ArgumentParser()
        for flag, kind in (("--variant", str), ("--seed", int), ("--t0", float), ("--ranks", int), ("--seconds", float),
                           ("--tokens", int), ("--out", str)):
            w.add_argument(flag, type=kind, required=True)
        return tiny_worker(w.parse_args(argv[1:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out-dir", required=True)
    p.add_argument("--budget", type=float, default=420, help="seconds for the call, set-up included (default 420)")
    p.add_argument("--dry-run", action="store_true", help="on CPU at tiny dims (checks the script)")
    p.add_argument("--steps", default=",".join(STEPS),
                   help="which steps, in this order: any of %(default)s (default: all; a second call can take what "
                        "the first left for the budget; the dry run has no big step)")
    args = p.parse_args(argv)
    asked = args.steps.split(",")
    unknown = [x for x in asked if x not in STEPS]
    if unknown or not asked:
        p.error(f"--steps {args.steps}: expected a comma-separated list of {', '.join(STEPS)}")
    started = float(os.environ.get("SPEED_CHECK_STARTED") or time.time())
    setup_s = os.environ.get("SPEED_CHECK_SETUP_SECONDS")
    deadline = started + args.budget - 10  # 10 s for the summary
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("speed_check.py: no CUDA device (on CPU: --dry-run)")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    steps = [(("tiny" if args.dry_run else step) if step in ("base", "big") else step, variant)
             for step in STEPS if step in asked and not (args.dry_run and step == "big")
             for variant in (VARIANTS if step in ("base", "big") else [None])]
    runs = {}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for dims, variant in steps:
            if dims == "rates":  # its rows each check the budget
                rates = tiny_rates(out_dir, args.dry_run, scratch, deadline)
                runs["tiny", "rates"] = "ok" if all(not r.get("errors") for r in rates["rows"]) else "failed"
                summary(out_dir, runs, started, setup_s)
                continue
            left = deadline - time.time()
            if left < 20:
                runs[dims, variant] = "not run (budget spent)"
                continue
            bench = [sys.executable, str(REPO / "scripts" / "bench" / "bench.py")]
            if dims == "exactness":
                cmd = [sys.executable, __file__, "exactness", "--out", str(out_dir / "exactness.json")] + \
                    (["--dry-run"] if args.dry_run else [])
            elif dims == "schemes":
                cmd = bench + schemes_args(out_dir / "regime_schemes.json", scratch / "schemes.md", args.dry_run)
            else:
                cmd = bench + bench_args(dims, variant, out_dir / f"regime_{dims}_{variant}.json",
                                         scratch / f"{dims}_{variant}.md", args.dry_run)
            t0 = time.time()
            try:
                proc = subprocess.run(cmd, cwd=REPO, timeout=left, capture_output=True, text=True)
                status = "ok" if proc.returncode == 0 else \
                    f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1][:200]}"
            except subprocess.TimeoutExpired:
                status = "cut at the budget (the groups it finished are kept)"
            runs[dims, variant] = f"{status}, {time.time() - t0:.0f} s"
            print(f"speed_check: {dims} {variant or ''}: {runs[dims, variant]}", file=sys.stderr, flush=True)
            summary(out_dir, runs, started, setup_s)
    print(summary(out_dir, runs, started, setup_s))
    return 0 if all(s.startswith("ok") for s in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
