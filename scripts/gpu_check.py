"""What a machine with one GPU must show before anything GPU-only becomes a default: writes results/gpu_check.md.

1. FLOATER's CUDA-graph solve (``--floater-cuda-graph``) against its step-by-step loop on real CUDA: the solve's
   values and gradients at several lengths; fairseq's Trainer with --update-freq 3 in fp32, --amp, --fp16 and
   --bf16 (the gradient the optimizer steps with, graph vs loop); memory per length bucket at base dims (peak of a
   training update with and without graphs, what the graphs hold, the predicted stage tape).
2. Every arch × --fp16 / --bf16 / --amp, 200 updates on the toy task: the final training loss against fp32's,
   and decoding (beam 4) of the toy test set: hypotheses identical to fp32's, BLEU.
3. scripts/bench.py --device cuda at T = 32, 64, 128, 256 (train, decode, peak memory, ratios to the
   Transformer).

``--dry-run`` runs the same code on CPU at the smallest sizes (CUDA graphs through the CPU emulation in
tests/helpers/cuda_graph_emulation.py), so that everything but the GPU itself is exercised; its report says so.
Budget on one H100: about 25 minutes (``--jobs`` training runs share the GPU).
"""

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from fairseq_plugins.modules.position_schemes import MODELS as SCHEME_MODELS, arch_and_flags
from tooling.atomic import write_text

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "fairseq_plugins"
# every scheme of the table (fairseq_plugins/modules/position_schemes.py) at its tiny size, and FLOATER's graph path
ARCHS = [" ".join(arch_and_flags(name)) for name in SCHEME_MODELS] + ["floater_transformer_tiny --floater-cuda-graph"]
MODES = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"], "amp": ["--amp"]}
TRAINER_MODES = {"fp32": [], "amp": ["--amp"], "fp16": ["--fp16", "--fp16-init-scale", "16"], "bf16": ["--bf16"]}


class CheckError(Exception):
    """A bad input to the check: one line for the user."""


def relative(path) -> str:
    """A path for the report: relative to the repository when inside it (no machine's absolute path)."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return path.name


def machine(device: str) -> dict:
    info = {"torch": torch.__version__, "python": sys.version.split()[0], "device": device}
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version())
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "n/a"
    return info


# -- 1. CUDA graph vs loop ------------------------------------------------------------------------------------

def random_flows(device, dtype=torch.float32, cuda_graph=False, seed=0, rows=(18, 24, 12), dim=16, hidden=16):
    """Three flows with a non-trivial h (random W2, c2, c1) and random b(0): FLOATER's solve at small dims."""
    from fairseq_plugins.modules.floater import FloaterFlow, FloaterSettings

    torch.manual_seed(seed)
    flows = [FloaterFlow(dim, hidden, FloaterSettings(cuda_graph=cuda_graph)).to(device, dtype) for _ in rows]
    with torch.no_grad():
        for flow in flows:
            flow.dynamics.fc2.weight.normal_(std=0.5 / hidden ** 0.5)
            flow.dynamics.fc2.bias.normal_(std=0.3)
            flow.dynamics.fc1.bias.normal_(std=0.3)
    initial = [torch.randn(k, dim, device=device, dtype=dtype, requires_grad=True) for k in rows]
    return flows, initial


def solve_and_grads(flows, initial, points):
    from fairseq_plugins.modules.floater import solve_checked

    ys = solve_checked(flows, initial, points)
    g = torch.Generator().manual_seed(1)
    loss = sum((y * torch.randn(y.shape, generator=g).to(y)).sum() for y in ys)
    inputs = [p for f in flows for p in f.parameters()] + list(initial)
    return [y.detach() for y in ys], torch.autograd.grad(loss, inputs)


def rel_error(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


def solve_check(device, lengths):
    rows = []
    for points in lengths:
        results = []
        for graph in (True, False):
            flows, initial = random_flows(device, cuda_graph=graph)
            results.append(solve_and_grads(flows, initial, points))
        (gv, gg), (lv, lg) = results
        rows.append({"positions": points, "values": max(rel_error(a, b) for a, b in zip(gv, lv)),
                     "gradients": max(rel_error(a, b) for a, b in zip(gg, lg))})
    return rows


def build_trainer(data, device, flags, seed=1):
    """fairseq's Trainer for floater_transformer_tiny on the toy task, as fairseq_cli/train.py builds it."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    argv = [str(data), "--user-dir", str(PLUGINS), "--arch", "floater_transformer_tiny", "--share-all-embeddings",
            "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "4", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--dropout", "0", "--max-tokens", "512", "--seed", str(seed), "--num-workers", "0", *flags]
    if device == "cpu":
        argv.append("--cpu")
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    utils.set_torch_seed(seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    with torch.no_grad():  # a non-trivial h (h ≡ 0 at initialisation leaves W1 and its bias without gradient)
        g = torch.Generator().manual_seed(seed)
        for m in model.modules():
            if type(m).__name__ == "FloaterDynamics":
                m.fc2.weight.copy_(torch.randn(m.fc2.weight.shape, generator=g) * 0.3 / m.fc2.weight.shape[1] ** 0.5)
                m.fc2.bias.copy_(torch.randn(m.fc2.bias.shape, generator=g) * 0.1)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=512, seed=seed,
                                      required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    return trainer, batches


def stepped_gradients(trainer):
    """Records, at each optimizer step, the flat gradient the underlying torch optimizer steps with (after
    fairseq's unscaling and its float32 master copies)."""
    opt = trainer.optimizer
    inner = getattr(opt, "fp32_optimizer", opt)
    torch_opt = inner.optimizer
    record = []
    step = torch_opt.step

    def recording_step(*a, **kw):
        params = [p for group in torch_opt.param_groups for p in group["params"]]
        record.append(torch.cat([p.grad.detach().float().flatten() for p in params if p.grad is not None]))
        return step(*a, **kw)

    torch_opt.step = recording_step
    return record


def trainer_check(data, device, modes, updates=2, update_freq=3):
    from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph

    rows = []
    for mode in modes:
        grads, captured = {}, 0
        for graph in (True, False):
            floater_cuda_graph.reset()
            flags = TRAINER_MODES[mode] + ["--update-freq", str(update_freq)] + (
                ["--floater-cuda-graph"] if graph else [])
            trainer, batches = build_trainer(data, device, flags)
            record = stepped_gradients(trainer)  # trainer.optimizer builds the optimizer and its master copies
            for _ in range(updates):
                trainer.train_step([next(batches) for _ in range(update_freq)])
            grads[graph] = record
            if graph:  # the buckets captured: the graph path was taken
                captured = floater_cuda_graph.captured_buckets()
        errors = [rel_error(a, b) for a, b in zip(grads[True], grads[False])]
        rows.append({"mode": mode, "update_freq": update_freq, "updates": len(errors), "captured_buckets": captured,
                     "gradient_error": max(errors) if errors else float("nan")})
    floater_cuda_graph.reset()
    return rows


def memory_check(device, dims, lengths):
    """Peak memory of one training update at each length, graph vs loop, with what the graphs hold."""
    from tooling import bench
    from fairseq_plugins.modules.floater import cuda_graph as floater_cuda_graph

    rows = []
    dictionary = bench.synthetic_dictionary(1000)
    arch, flags = bench.ARCHS[dims]["floater"]
    for graph in (False, True):
        floater_cuda_graph.reset()
        bundle = bench.Bundle.build(arch, flags + (["--floater-cuda-graph"] if graph else []), dictionary, device,
                                    seed=1)
        model = bundle.model
        for T in lengths:
            sample = bench.random_batch(dictionary, max(1, 4096 // T), T, device, seed=T)
            bundle.train_update(sample)  # captures, if graphed
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            bundle.train_update(sample)
            row = {"graph": graph, "length": T,
                   "bucket": floater_cuda_graph.graph_bucket(T) if graph else T,
                   "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
                   "held_by_graphs_mib": floater_cuda_graph.held_bytes() / 2**20 if graph else 0.0}
            # the stacked solve: 3 flows × K rows (the decoder's q, k, v and cross q per block) × hidden
            hidden = model.encoder.floater_flow.dynamics.fc1.weight.shape[0]
            row["predicted_tape_mib"] = floater_cuda_graph.tape_bytes(
                3, 4 * len(model.decoder.layers), hidden, row["bucket"]) / 2**20
            rows.append(row)
        if device == "cuda":
            rows.append({"graph": graph, "length": "end", "reserved_mib": torch.cuda.memory_reserved() / 2**20})
        del bundle, model
    floater_cuda_graph.reset()
    return rows


# -- 2. every arch × precision on the toy task ----------------------------------------------------------------

def train_and_decode(job):
    """fairseq-train for `updates` updates, then fairseq-generate on the toy test set."""
    arch, mode, data, work, updates, device = (job[k] for k in ("arch", "mode", "data", "work", "updates", "device"))
    name = f"{arch.replace(' --', '+').replace('-', '_')}.{mode}"
    save = work / name
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    bin_dir = Path(sys.executable).parent
    cpu = ["--cpu"] if device == "cpu" else []
    started = time.time()
    train = [str(bin_dir / "fairseq-train"), str(data), "--user-dir", str(PLUGINS), "--arch", *arch.split(),
             "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "2e-3",
             "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(max(1, updates // 4)),
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1",
             "--max-tokens", "4096", "--max-update", str(updates), "--seed", "1", "--num-workers", "0",
             "--save-dir", str(save), "--no-epoch-checkpoints", "--no-save-optimizer-state", "--log-format", "simple",
             "--log-interval", "10", "--disable-validation", *MODES[mode], *cpu]
    proc = subprocess.run(train, capture_output=True, text=True, env=env)
    result = {"arch": arch, "mode": mode, "ok": proc.returncode == 0}
    losses = re.findall(r"\| loss ([0-9.]+) \|", proc.stdout + proc.stderr)
    result["train_loss"] = float(losses[-1]) if losses else None
    if proc.returncode != 0:
        result["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
        return result
    gen = [str(bin_dir / "fairseq-generate"), str(data), "--user-dir", str(PLUGINS), "--path",
           str(save / "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "4", "--batch-size", "64",
           "--remove-bpe", "sentencepiece", *cpu,
           *(["--fp16"] if mode == "fp16" else ["--bf16"] if mode == "bf16" else [])]
    proc = subprocess.run(gen, capture_output=True, text=True, env=env)
    result["ok"] = proc.returncode == 0
    if proc.returncode != 0:
        result["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
        return result
    result["hypotheses"] = {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", proc.stdout,
                                                                             re.M)}
    bleu = re.search(r"BLEU4? = ([0-9.]+)", proc.stdout + proc.stderr)
    result["bleu"] = float(bleu.group(1)) if bleu else None
    result["seconds"] = round(time.time() - started, 1)
    return result


def precision_runs(data, work, archs, modes, updates, device, jobs):
    todo = [{"arch": a, "mode": m, "data": data, "work": work, "updates": updates, "device": device}
            for a in archs for m in ["fp32", *modes]]
    with ThreadPoolExecutor(jobs) as pool:  # each job is a subprocess: threads only wait
        results = list(pool.map(train_and_decode, todo))
    by = {(r["arch"], r["mode"]): r for r in results}
    rows = []
    for arch in archs:
        ref = by[arch, "fp32"]
        for mode in ["fp32", *modes]:
            r = by[arch, mode]
            row = {"arch": arch, "mode": mode, "ok": r["ok"], "error": r.get("error", ""),
                   "train_loss": r.get("train_loss"), "fp32_loss": ref.get("train_loss"), "bleu": r.get("bleu"),
                   "sentences": len(r.get("hypotheses") or {})}
            if r.get("hypotheses") and ref.get("hypotheses"):
                same = sum(r["hypotheses"].get(i) == h for i, h in ref["hypotheses"].items())
                row["identical_to_fp32"] = same / max(1, len(ref["hypotheses"]))
            rows.append(row)
    return rows


# -- 3. the benchmark -----------------------------------------------------------------------------------------

def run_bench(out_dir, device, dry_run):
    args = ["--device", device, "--out-json", str(out_dir / "gpu_check_bench.json"),
            "--out-md", str(out_dir / "gpu_check_bench.md")]
    if dry_run:
        args += ["--dims", "tiny", "--lengths", "32", "--reps", "1", "--decode-reps", "1", "--warmup", "0",
                 "--vocab", "1000", "--tokens", "256", "--decode-tokens", "64", "--no-memory", "--models", "rope"]
    else:
        args += ["--lengths", "32,64,128,256", "--models", "relative,floater,floater_cached,t5,rope,alibi"]
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), *args], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        return {"ok": False, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300], "command": args}
    return {"ok": True, "command": "scripts/bench.py " + " ".join(
        relative(a) if a.startswith("/") else a for a in args)}


# -- the report ---------------------------------------------------------------------------------------------

def fmt(x, spec=".3g"):
    return "—" if x is None else format(x, spec)


def markdown(report) -> str:
    lines = []
    if report["dry_run"]:
        lines += ["# GPU check — DRY RUN on CPU (no GPU: CUDA graphs emulated, no memory figures)", ""]
    else:
        lines += ["# GPU check", ""]
    m = report["machine"]
    lines += [f"Command: `{report['command']}`", "",
              "Machine: " + ", ".join(f"{k} {v}" for k, v in m.items()), "",
              f"Wall time: {report['seconds'] / 60:.1f} min.", "",
              "## 1. FLOATER's CUDA-graph solve against the loop", "",
              "Solve of three flows (values and the gradients of θ and b(0); relative error, worst tensor):", "",
              "| positions | values | gradients |", "|---:|---:|---:|"]
    lines += [f"| {r['positions']} | {fmt(r['values'])} | {fmt(r['gradients'])} |" for r in report["solve"]]
    lines += ["", "fairseq's Trainer, `floater_transformer_tiny`: the gradient the optimizer steps with, graph vs "
              "loop (relative error, worst update):", "",
              "| mode | update-freq | updates | buckets captured | gradient error |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['mode']} | {r['update_freq']} | {r['updates']} | {r['captured_buckets']} | "
              f"{fmt(r['gradient_error'])} |" for r in report["trainer"]]
    lines += ["", "Memory of a training update at base dims (FLOATER in all blocks, 4096 tokens):", "",
              "| graphs | T | bucket | peak MiB | held by graphs MiB | predicted tape MiB |", "|---|---:|---:|---:|---:|---:|"]
    for r in report["memory"]:
        if r["length"] == "end":
            lines.append(f"| {'yes' if r['graph'] else 'no'} | end: reserved {fmt(r['reserved_mib'], '.0f')} MiB "
                         "| | | | |")
        else:
            lines.append(f"| {'yes' if r['graph'] else 'no'} | {r['length']} | {r['bucket']} | "
                         f"{fmt(r['peak_mib'], '.0f')} | {fmt(r['held_by_graphs_mib'], '.1f')} | "
                         f"{fmt(r['predicted_tape_mib'], '.1f')} |")
    lines += ["", f"## 2. Every arch × precision, {report['updates']} updates on the toy task", "",
              "| arch | mode | ok | train loss | fp32 loss | BLEU | identical to fp32 | sentences |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in report["precision"]:
        same = r.get("identical_to_fp32")
        lines.append(f"| `{r['arch']}` | {r['mode']} | {'yes' if r['ok'] else 'no: ' + r['error']} | "
                     f"{fmt(r['train_loss'], '.3f')} | {fmt(r['fp32_loss'], '.3f')} | {fmt(r['bleu'], '.2f')} | "
                     f"{'—' if same is None else f'{same:.1%}'} | {r['sentences']} |")
    bench = report["bench"]
    lines += ["", "## 3. Benchmark", ""]
    if bench["ok"]:
        lines += [f"`{bench['command']}`: see `{relative(report['out_dir'])}/gpu_check_bench.md`."]
    else:
        lines += [f"failed: {bench['error']}"]
    lines += ["", "## Verdict", "", "| check | bound | worst | passed |", "|---|---|---:|---|"]
    lines += [f"| {v['check']} | {v['bound']} | {fmt(v['worst'])} | {'yes' if v['passed'] else '**no**'} |"
              for v in report["verdicts"]]
    return "\n".join(lines) + "\n"


# Bounds: the graph replays the loop's kernels on the same inputs, so values and gradients agree to the rounding
# of a differently ordered reduction at most; half precision's loss after 200 updates stays near float32's.
SOLVE_BOUND = 1e-5
TRAINER_BOUND = {"fp32": 1e-5, "amp": 1e-3, "fp16": 1e-3, "bf16": 1e-2}
LOSS_BOUND = 0.15  # |loss − fp32 loss| / fp32 loss after the precision runs
TAPE_MARGIN = 1.5  # what the graphs hold, against the predicted tape of the longest bucket


def verdicts(report):
    """One row per check: its bound, the worst value measured, and whether it passed (the exit status)."""
    out = []

    def add(check, bound, values, passed):
        values = [v for v in values if v is not None]
        out.append({"check": check, "bound": bound, "worst": max(values) if values else None,
                    "passed": bool(passed)})

    solve = [max(r["values"], r["gradients"]) for r in report["solve"]]
    add("solve: graph vs loop (values, gradients)", f"≤ {SOLVE_BOUND:g}", solve,
        solve and all(v <= SOLVE_BOUND for v in solve))
    for r in report["trainer"]:
        bound = TRAINER_BOUND[r["mode"]]
        add(f"Trainer {r['mode']}, --update-freq {r['update_freq']}: gradient, graph vs loop", f"≤ {bound:g}",
            [r["gradient_error"]], r["gradient_error"] <= bound and r["captured_buckets"] > 0)
    held = [(r["held_by_graphs_mib"], r["predicted_tape_mib"]) for r in report["memory"]
            if r.get("graph") and r["length"] != "end"]
    if held:
        ratio = max(h / max(t, 1e-9) for h, t in held)
        add("graph memory / predicted tape", f"≤ {TAPE_MARGIN:g}", [ratio], ratio <= TAPE_MARGIN)
    drift = [abs(r["train_loss"] - r["fp32_loss"]) / r["fp32_loss"] for r in report["precision"]
             if r["ok"] and r["train_loss"] is not None and r["fp32_loss"]]
    add("every arch × precision trains and decodes; loss vs fp32 (relative)", f"≤ {LOSS_BOUND:g}", drift,
        all(r["ok"] for r in report["precision"]) and all(d <= LOSS_BOUND for d in drift))
    add("benchmark ran", "", [], report["bench"]["ok"])
    return out


def prepare_toy_data(data_dir):
    if (data_dir / "bin" / "dict.src.txt").exists():
        return data_dir / "bin"
    raw = data_dir / "raw"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_toy_data.py"), "--out", str(raw)], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["bash", str(REPO / "scripts" / "prepare_bitext.sh"), str(raw), str(data_dir), "src", "tgt",
                    "400", "test_long"], check=True, stdout=subprocess.DEVNULL)
    return data_dir / "bin"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="on CPU at the smallest sizes (CUDA graphs emulated)")
    p.add_argument("--out-dir", default=str(REPO / "results"), help="where gpu_check.md/.json go")
    p.add_argument("--data", help="a binarized toy task (default: data/toy, prepared if missing)")
    p.add_argument("--jobs", type=int, default=None, help="training runs at a time (default 6 on GPU, 1 dry)")
    args = p.parse_args(argv)
    device = "cpu" if args.dry_run else "cuda"
    if not args.dry_run and not torch.cuda.is_available():
        print("scripts/gpu_check.sh: no CUDA device; use --dry-run to check the script on CPU", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    data = Path(args.data) if args.data else prepare_toy_data(REPO / "data" / "toy")
    if not (data / "dict.src.txt").exists():
        print(f"scripts/gpu_check.sh: --data {args.data}: expected a binarized toy task (dict.src.txt)",
              file=sys.stderr)
        return 2
    started = time.time()
    emulation = contextlib.nullcontext()
    if args.dry_run:  # CUDA graphs' buffer semantics on CPU: the test layer's emulation (gpu_check.sh puts
        from helpers.cuda_graph_emulation import emulated_cuda_graphs  # tests/ on PYTHONPATH for --dry-run

        emulation = emulated_cuda_graphs()
    report = {"dry_run": args.dry_run, "machine": machine(device), "out_dir": str(out_dir),
              "command": "scripts/gpu_check.sh" + (" --dry-run" if args.dry_run else "")}
    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    with emulation:
        t = time.time()
        report["solve"] = solve_check(device, [21] if args.dry_run else [21, 30, 100, 200])
        report["trainer"] = (trainer_check(data, device, ["fp32"], updates=1, update_freq=2) if args.dry_run
                             else trainer_check(data, device, list(TRAINER_MODES)))
        log(f"1. graph vs loop: {time.time() - t:.0f} s")
    t = time.time()
    report["memory"] = memory_check(device, "tiny" if args.dry_run else "base",
                                    [32] if args.dry_run else [32, 64, 128, 256, 512])
    log(f"1. memory: {time.time() - t:.0f} s")
    t = time.time()
    with tempfile.TemporaryDirectory(prefix="gpu_check.") as work:
        archs = ["transformer_tiny", "rope_transformer_tiny"] if args.dry_run else ARCHS
        modes = ["bf16"] if args.dry_run else ["fp16", "bf16", "amp"]
        report["updates"] = 4 if args.dry_run else 200
        report["precision"] = precision_runs(data, Path(work), archs, modes, report["updates"], device,
                                             args.jobs or (1 if args.dry_run else 6))
    log(f"2. precision runs: {time.time() - t:.0f} s")
    t = time.time()
    report["bench"] = run_bench(out_dir, device, args.dry_run)
    log(f"3. bench: {time.time() - t:.0f} s")
    report["seconds"] = time.time() - started
    report["out_dir"] = relative(out_dir)
    report["verdicts"] = verdicts(report)
    write_text(out_dir / "gpu_check.json", json.dumps(report, indent=1) + "\n")
    write_text(out_dir / "gpu_check.md", markdown(report))
    log(f"written: {relative(out_dir / 'gpu_check.md')}")
    failed = [v["check"] for v in report["verdicts"] if not v["passed"]]
    if failed:  # the report is written either way; the status says whether anything GPU-only may become a default
        log("FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
