#!/usr/bin/env python
"""What relative positions and FLOATER cost, as ratios to fairseq's Transformer measured in the same run.

The protocol, for every sequence length T (source and target both T tokens, a fixed token budget per batch, so
B = tokens // T sentences):

1. Training update: fairseq's task.train_step (forward + label-smoothed cross-entropy + backward), the trainer's
   gradient normalisation and norm, and fairseq's Adam step, on a random batch over a synthetic dictionary. The
   models are timed round-robin (one update of each per repetition, the order rotated every repetition) so that
   drift in the machine's load hits all of them alike; the figure is the median after warm-up.
   FLOATER runs twice: with the exact gradient every update (--floater-update-every 1) and with the cached
   biases of --floater-update-every N. The latter's figure is the amortised cost of one update,
   ((N − 1)·median(cached update) + median(exact update)) / N: one update in N re-solves.
2. Decoding: beam-4 search through fairseq's SequenceGenerator with incremental decoding, random sources of
   length T and min_len = max_len = T, so every model produces exactly T tokens (+ EOS) per sentence and does the
   same number of steps. Reported per sentence.
3. Peak memory of one training run: each (model, T) in fresh processes forked from a server that has only
   imported the libraries; two updates (the first creates Adam's state; FLOATER's first re-solves). On CUDA
   torch.cuda.max_memory_allocated; on CPU the process's peak resident set (VmHWM, reset through
   /proc/self/clear_refs) minus its resident set just before the model is built; the median of --memory-reps
   processes (the allocator's high-water mark varies from run to run).
4. FLOATER's ODE: its share of an exact update is 1 − (cached update) / (exact update), both medians of the same
   rounds: the cached update is the same model doing everything but the solve and its backward.

With --profile-length T the script also records torch.profiler's top operators of one update of every model.

With --count-ops it measures no time but counts, through a TorchDispatchMode, the aten operators (views aside:
each is one kernel launch on a GPU) and the host synchronisations (operators that read a device value on the
host: .item()/bool()/tolist(), equal, is_nonzero, nonzero) of one training update of the transformer, the
relative model and FLOATER, and of FLOATER's exact solve of its three flows and its backward alone (with
their CPU time, one thread), at every length; it writes --out-json/--out-md (default results/bench_ops.*).

Usage: python scripts/bench.py [--quick] [--device cpu|cuda] [--out-json F] [--out-md F] (make bench: BENCH_ARGS).
"""

import argparse
import json
import logging
import multiprocessing
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

# fairseq 0.12.2's Hydra 1.0-era config calls and its torch.cuda.amp.autocast call warn on every model build/update
warnings.filterwarnings("ignore", category=UserWarning, message=r"(?s).*(hydra|[Cc]onfig[Ss]tore|version_base|strict flag|package header)")
warnings.filterwarnings("ignore", category=FutureWarning, message=r".*torch\.cuda\.amp\.autocast")
logging.getLogger("fairseq.utils").setLevel(logging.WARNING)  # "--user-dir ... has already been imported"

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "fairseq_plugins"

from fairseq_plugins.modules.position_schemes import MODELS as SCHEME_TABLE  # noqa: E402  (the table of schemes)
from tooling.atomic import write_text  # noqa: E402
from tooling.paths import relativize  # noqa: E402
COMMON_FLAGS = [
    "--task", "translation", "--share-all-embeddings",
    "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
    "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
]
PRELOAD = ["fairseq_plugins", "fairseq.options", "fairseq.optim", "fairseq.tasks.translation",
           "fairseq.sequence_generator", "torch._dynamo"]  # torch.optim imports torch._dynamo on first use

# The compared models, from the table of schemes (fairseq_plugins/modules/position_schemes.py): (architecture, extra
# flags) per size. The base relative arch pins Shaw et al.'s FFN of 1024, so every model gets
# --encoder/decoder-ffn-embed-dim 1024: every model has the same dims and differs only in its position scheme.
BASE_FFN = ["--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024"]
ARCHS = {dims: {name: (scheme.arch(dims), list(scheme.flags) + (BASE_FFN if dims == "base" else []))
                for name, scheme in SCHEME_TABLE.items()}
         for dims in ("base", "tiny")}
SCHEME_NAMES = tuple(n for n in SCHEME_TABLE if n not in ("transformer", "relative", "floater"))
BASELINE = "transformer"


def model_specs(dims, floater_every):
    """name -> (arch, flags, kind) for every model bench can compare (FLOATER twice: exact and cached)."""
    archs = ARCHS[dims]
    return {
        "transformer": (*archs["transformer"], "transformer"),
        "relative": (*archs["relative"], "relative"),
        "floater": (archs["floater"][0], archs["floater"][1] + ["--floater-update-every", "1"], "floater"),
        f"floater_every{floater_every}": (
            archs["floater"][0], archs["floater"][1] + ["--floater-update-every", str(floater_every)], "floater"),
        **{name: (*archs[name], name) for name in SCHEME_NAMES},
    }


# ---------------------------------------------------------------------------------------------------------------
# building models, batches and steps through fairseq's own APIs


def synthetic_dictionary(size):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(size - len(d)):
        d.add_symbol(f"w{i}")
    return d


def build(arch, flags, dictionary, device, seed):
    """task, model, criterion and fairseq's Adam for one architecture, as fairseq-train builds them."""
    from fairseq import optim, options
    from fairseq.tasks.translation import TranslationTask

    argv = ["unused-data-dir", "--user-dir", str(PLUGINS), "--arch", arch, *COMMON_FLAGS, *flags]
    args = options.parse_args_and_arch(options.get_training_parser(), argv + (["--cpu"] if device == "cpu" else []))
    task = TranslationTask(args, dictionary, dictionary)
    torch.manual_seed(seed)
    model = task.build_model(args).to(device)
    criterion = task.build_criterion(args).to(device)
    optimizer = optim.build_optimizer(args, [p for p in model.parameters() if p.requires_grad])
    return task, model, criterion, optimizer


def random_batch(dictionary, bsz, length, device, seed):
    """B sentences of `length` random tokens (last one EOS) on both sides, as fairseq's collater lays them out."""
    g = torch.Generator().manual_seed(seed)
    eos = dictionary.eos()

    def sentences():
        x = torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=g)
        x[:, -1] = eos
        return x

    src, tgt = sentences(), sentences()
    prev = torch.cat([torch.full((bsz, 1), eos), tgt[:, :-1]], dim=1)
    sample = {
        "id": torch.arange(bsz), "nsentences": bsz, "ntokens": bsz * length, "target": tgt,
        "net_input": {"src_tokens": src, "src_lengths": torch.full((bsz,), length), "prev_output_tokens": prev},
    }
    from fairseq import utils

    return utils.move_to_cuda(sample) if device == "cuda" else sample


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def train_update(entry, sample):
    """One training update as fairseq's Trainer does it: zero grads, train_step (forward, criterion, backward),
    gradients divided by the sample size, gradient norm (no clipping), Adam step, update counter."""
    task, model, criterion, optimizer = entry["task"], entry["model"], entry["criterion"], entry["optimizer"]
    optimizer.zero_grad()
    _, sample_size, _ = task.train_step(sample, model, criterion, optimizer, entry["updates"])
    optimizer.multiply_grads(1.0 / (sample_size or 1.0))
    optimizer.clip_grad_norm(0.0)
    optimizer.step()
    entry["updates"] += 1
    model.set_num_updates(entry["updates"])


def num_solves(model):
    """FLOATER's count of ODE solves so far (its flows' num_solves diagnostics)."""
    return sum(getattr(m, "num_solves", 0) for m in model.modules())


def timed(fn, device):
    """(wall seconds, process CPU seconds) of fn()."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def load_average():
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def rotated(names, rep):
    r = rep % len(names)
    return names[r:] + names[:r]


# ---------------------------------------------------------------------------------------------------------------
# peak memory: one fresh process per (model, T)


def _status_kb(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def memory_probe(job):
    """Runs in a fresh forked process: peak memory (MiB) of building the model and two training updates."""
    import gc

    torch.set_num_threads(job["threads"])
    device = job["device"]
    dictionary = synthetic_dictionary(job["vocab"])
    sample = random_batch(dictionary, job["bsz"], job["length"], device, seed=job["seed"])
    gc.collect()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
        base = _status_kb("VmRSS") * 1024
    task, model, criterion, optimizer = build(job["arch"], job["flags"], dictionary, device, job["seed"])
    entry = {"task": task, "model": model, "criterion": criterion, "optimizer": optimizer, "updates": 1}
    for _ in range(2):
        train_update(entry, sample)
    sync(device)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else _status_kb("VmHWM") * 1024
    return (peak - base) / 2**20


def measure_memory(jobs, workers):
    """Each job in its own process, forked from a server that has imported the libraries and computed nothing;
    `workers` of them at a time (they measure memory, not time). Yields (job, MiB) in order."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    with ctx.Pool(workers, maxtasksperchild=1) as pool:
        yield from zip(jobs, pool.imap(memory_probe, jobs))


# ---------------------------------------------------------------------------------------------------------------
# profiles


def profile_call(fn, device, top):
    """torch.profiler over one call of fn: the top operators by self time, and the self time of fairseq's
    and FLOATER's labelled ranges (record_function), which is the Python between operators in that range."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    events = prof.key_averages()
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events)
    rows = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
    out = {"total_self_ms": total / 1e3,
           "top": [{"op": e.key, "self_ms": getattr(e, key) / 1e3, "calls": e.count,
                    "share": getattr(e, key) / total if total else 0.0} for e in rows]}
    out["ranges_self_ms"] = {e.key: e.self_cpu_time_total / 1e3 for e in events
                             if e.key.startswith("EnsembleModel") or "floater" in e.key.lower()}
    return out


# ---------------------------------------------------------------------------------------------------------------
# the run


CLOCKS = ("wall", "cpu")


def median(xs):
    return statistics.median(xs) if xs else None


def summarise(row, key, samples, clock):
    """row[key_s] = {clock: samples}, row[key_{clock}_median_s] for both clocks, row[key_median_s] = the chosen one."""
    row[f"{key}_s"] = {c: [t[i] for t in samples] for i, c in enumerate(CLOCKS)}
    for c in CLOCKS:
        row[f"{key}_{c}_median_s"] = median(row[f"{key}_s"][c])
    row[f"{key}_median_s"] = row[f"{key}_{clock}_median_s"]


def parse_lengths(text):
    return [int(x) for x in text.split(",")]


def parse_per_length(text, lengths, name):
    values = [int(x) for x in str(text).split(",")]
    if len(values) == 1:
        values = values * len(lengths)
    if len(values) != len(lengths) or min(values) < 1:
        raise SystemExit(f"--{name}: one positive integer or one per length ({len(lengths)})")
    return dict(zip(lengths, values))


SYNCING_OPS = frozenset({"_local_scalar_dense", "equal", "is_nonzero", "nonzero", "item"})


def op_counter():
    """A TorchDispatchMode counting non-view aten operators and, by name, those that synchronise with the host."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops, self.syncs = 0, Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += not func.is_view
            name = func.overloadpacket.__name__
            if name in SYNCING_OPS:
                self.syncs[name] += 1
            return func(*args, **(kwargs or {}))

    return CountOps()


def count_ops(args):
    """Operators and host syncs of one training update per model and of FLOATER's exact solve (see the docstring)."""
    from fairseq_plugins.modules.floater import solve_flows
    from fairseq_plugins.modules.floater.dynamics import STEPS_PER_DT

    device, lengths = args.device, parse_lengths(args.lengths)
    if args.threads:
        torch.set_num_threads(args.threads)
    specs = model_specs(args.dims, args.floater_every)
    dictionary = synthetic_dictionary(args.vocab)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.silent else (lambda *a: None)
    updates, solves = [], []
    for T in lengths:
        bsz = max(1, args.tokens // T)
        for name in ("transformer", "relative", "floater"):
            arch, flags, _ = specs[name]
            task, model, criterion, optimizer = build(arch, flags, dictionary, device, args.seed)
            entry = {"task": task, "model": model, "criterion": criterion, "optimizer": optimizer, "updates": 1}
            sample = random_batch(dictionary, bsz, T, device, args.seed)
            train_update(entry, sample)  # Adam's state and every lazily built buffer exist from here on
            with op_counter() as counter:
                train_update(entry, sample)
            updates.append({"model": name, "length": T, "batch_sentences": bsz, "ops": counter.ops,
                            "syncs": dict(counter.syncs)})
            log(f"ops {name:>12} T={T:<4} update: {counter.ops} operators, syncs {dict(counter.syncs)}")
            if name != "floater":
                continue
            flows = model.floater_positions.flows
            rows = [len(projections) for _, projections in model.floater_positions.members]
            steps = STEPS_PER_DT * (T - 1)

            def solve():
                initial = model.floater_positions._initial()
                return solve_flows(flows, initial, T)

            with op_counter() as forward:
                ys = solve()
            loss = sum(y.float().sum() for y in ys)
            with op_counter() as backward:
                loss.backward()
            times = []
            for _ in range(2):  # CPU seconds on CPU (a shared machine), wall seconds on CUDA; the better of two
                box = []
                forward_t = timed(lambda: box.append(solve()), device)
                backward_t = timed(lambda: sum(y.float().sum() for y in box.pop()).backward(), device)
                clock = 1 if device == "cpu" else 0
                times.append((forward_t[clock], backward_t[clock]))
            forward_s = min(t[0] for t in times)
            backward_s = min(t[1] for t in times)
            solves.append({"length": T, "rows": rows, "steps": steps, "forward_ops": forward.ops,
                           "backward_ops": backward.ops, "forward_ops_per_step": forward.ops / steps,
                           "backward_ops_per_step": backward.ops / steps, "forward_syncs": dict(forward.syncs),
                           "backward_syncs": dict(backward.syncs), "forward_s": forward_s,
                           "backward_s": backward_s})
            log(f"ops solve T={T}: forward {forward.ops} ({forward.ops / steps:.1f}/step), backward {backward.ops}"
                f" ({backward.ops / steps:.1f}/step), syncs {dict(forward.syncs)} / {dict(backward.syncs)}")
    return {"kind": "count_ops", "command": "scripts/bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            "settings": {"dims": args.dims, "lengths": lengths, "tokens": args.tokens, "device": device,
                         "threads": torch.get_num_threads()},
            "machine": machine(device), "source": source_state(), "updates": updates, "solves": solves}


def ops_markdown(res):
    st = res["settings"]
    syncs = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"  # noqa: E731
    lines = [f"# Operators and host synchronisations ({st['dims']} dims, {st['device']})", "",
             f"Command: `{res['command']}`  ", f"Machine: {res['machine'].get('cpu', '')}, torch "
             f"{res['machine']['torch']}, {st['threads']} thread(s); commit {res['source']['commit']}", "",
             "Counted through a TorchDispatchMode: every aten operator that is not a view (one kernel launch on a "
             "GPU), and the operators that read a device value on the host (`_local_scalar_dense` = .item()/bool()/"
             "tolist(), `equal`, `is_nonzero`, `nonzero`).", "",
             "## One training update (forward, label-smoothed cross-entropy, backward, Adam)", "",
             "| model | T | sentences | operators | × transformer | host syncs |", "|---|---|---|---|---|---|"]
    base = {r["length"]: r["ops"] for r in res["updates"] if r["model"] == "transformer"}
    for r in res["updates"]:
        lines.append(f"| {r['model']} | {r['length']} | {r['batch_sentences']} | {r['ops']:,} | "
                     f"{r['ops'] / base[r['length']]:.2f}× | {syncs(r['syncs'])} |")
    lines += ["", "## FLOATER's exact solve of its three flows (RK4 at Δ/5, P = T) and its backward", "",
              "| T | rows per flow | RK4 steps | forward operators (per step) | backward operators (per step) | "
              "host syncs forward / backward | seconds forward / backward |", "|---|---|---|---|---|---|---|"]
    for r in res["solves"]:
        lines.append(f"| {r['length']} | {'/'.join(map(str, r['rows']))} | {r['steps']:,} | {r['forward_ops']:,} "
                     f"({r['forward_ops_per_step']:.1f}) | {r['backward_ops']:,} ({r['backward_ops_per_step']:.1f}) | "
                     f"{syncs(r['forward_syncs'])} / {syncs(r['backward_syncs'])} | "
                     f"{r['forward_s']:.2f} / {r['backward_s']:.2f} |")
    lines += ["", "Seconds: the better of two solves, CPU time on CPU (one thread unless --threads), wall time on CUDA.",
              "", "The solve's one host sync, if any, is the finiteness check after it (solve_checked, in the "
              "training update); the solve itself (solve_flows) has none."]
    return "\n".join(lines) + "\n"


def source_state():
    """The commit measured, and any plugin file that differs from it (uncommitted changes)."""
    import subprocess

    def git(*argv):  # only trailing whitespace is stripped: porcelain lines start with a status column
        try:
            return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=True).stdout.rstrip()
        except (OSError, subprocess.CalledProcessError):
            return None

    changed = git("status", "--porcelain", "--", "fairseq_plugins")
    return {"commit": git("rev-parse", "HEAD"),
            "uncommitted_plugin_files": [line[3:] for line in changed.splitlines()] if changed else []}


def machine(device):
    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cores": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def run(args):
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = parse_lengths(args.lengths)
    reps = parse_per_length(args.reps, lengths, "reps")
    decode_reps = parse_per_length(args.decode_reps, lengths, "decode-reps")
    specs = model_specs(args.dims, args.floater_every)
    cached = f"floater_every{args.floater_every}"
    names = [n for n in specs if n in args.models.split(",") or n == BASELINE
             or (n == cached and "floater_cached" in args.models.split(","))]
    if cached in names and "floater" not in names:
        raise SystemExit("--models: floater_cached needs floater (its amortised update includes one exact update)")
    decoded = [n for n in names if n != cached]  # the cached FLOATER is the same model at inference
    dictionary = synthetic_dictionary(args.vocab)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.silent else (lambda *a: None)
    started = time.time()
    loads = [load_average()]

    rows = {(n, T): {"model": n, "arch": specs[n][0], "flags": specs[n][1], "length": T,
                     "batch_sentences": max(1, args.tokens // T)} for n in names for T in lengths}

    # 3. memory first, while this process has computed nothing (each probe is a fresh process anyway)
    if not args.no_memory:
        jobs = [dict(name=n, arch=specs[n][0], flags=specs[n][1], length=T, bsz=rows[n, T]["batch_sentences"],
                     vocab=args.vocab, device=device, seed=args.seed, threads=torch.get_num_threads())
                for T in lengths for n in names]
        for job, mib in measure_memory(jobs * args.memory_reps, args.memory_workers):
            row = rows[job["name"], job["length"]]
            row.setdefault("peak_memory_mib_samples", []).append(mib)
            row["peak_memory_mib"] = median(row["peak_memory_mib_samples"])
            log(f"memory {job['name']:>18} T={job['length']:<4} {mib:9.1f} MiB")
        loads.append(load_average())

    def fresh_entries():
        entries = {}
        for n in names:
            arch, flags, kind = specs[n]
            task, model, criterion, optimizer = build(arch, flags, dictionary, device, args.seed)
            entries[n] = {"task": task, "model": model, "criterion": criterion, "optimizer": optimizer,
                          "updates": 1, "kind": kind}
        return entries

    entries, params, profiles = {}, None, {}
    for T in lengths:
        # Fresh models (same seed) at every length: each length measures the same initial state, and a
        # flow trained on random batches at one length cannot diverge at the next (long grids amplify it).
        entries.clear()  # the previous length's models go before the next ones are built
        entries = fresh_entries()
        if params is None:
            params = {n: sum(p.numel() for p in e["model"].parameters()) for n, e in entries.items()}
        bsz = rows[names[0], T]["batch_sentences"]
        sample = random_batch(dictionary, bsz, T, device, seed=args.seed + T)
        times = {n: [] for n in names}  # (wall, cpu) pairs
        solve_times = []  # the cached model's updates that re-solved (excluded from its cached median)
        for _ in range(args.warmup):
            for n in names:
                train_update(entries[n], sample)
        for rep in range(reps[T]):
            for n in rotated(names, rep):
                e = entries[n]
                solves = num_solves(e["model"])
                t = timed(lambda: train_update(e, sample), device)
                if n == cached and num_solves(e["model"]) > solves:
                    solve_times.append(t)
                else:
                    times[n].append(t)
            loads.append(load_average())
        for n in names:
            summarise(rows[n, T], "train_update", times[n], args.clock)
        if cached in names:
            row, every = rows[cached, T], args.floater_every
            row["train_update_resolve_s"] = {c: [t[i] for t in solve_times] for i, c in enumerate(CLOCKS)}
            for suffix in ("", "_wall", "_cpu"):  # amortised: one exact update in N
                exact = rows["floater", T][f"train_update{suffix}_median_s"]
                row[f"train_update_cached{suffix}_median_s"] = row[f"train_update{suffix}_median_s"]
                row[f"train_update{suffix}_median_s"] = ((every - 1) * row[f"train_update{suffix}_median_s"]
                                                         + exact) / every
            # the ODE's share of an exact update: all that the cached update (same model) does not do
            rows["floater", T]["ode_share"] = (
                1 - row["train_update_cached_median_s"] / rows["floater", T]["train_update_median_s"])
        log(f"train  T={T:<4} B={bsz:<4} " + "  ".join(
            f"{n} {rows[n, T]['train_update_median_s'] * 1e3:.1f} ms" for n in names)
            + (f"  (cached {rows[cached, T]['train_update_cached_median_s'] * 1e3:.1f} ms)" if cached in names else ""))

        if args.profile_length == T:
            for n in names:
                profiles[n] = profile_call(lambda: train_update(entries[n], sample), device, args.profile_top)
            profiles["length"] = T

        # 2. decoding
        if not args.no_decode:
            from fairseq.sequence_generator import SequenceGenerator

            dbsz = max(1, args.decode_tokens // T)
            src = random_batch(dictionary, dbsz, T, device, seed=args.seed + 7 * T)
            src = {"net_input": {k: src["net_input"][k] for k in ("src_tokens", "src_lengths")}}
            generators = {n: SequenceGenerator([entries[n]["model"]], dictionary, beam_size=4, max_len_a=0,
                                               max_len_b=T, min_len=T) for n in decoded}
            out_len = {}

            def decode(n):
                hypos = generators[n].generate([entries[n]["model"]], src)
                out_len[n] = {len(h[0]["tokens"]) for h in hypos}

            dtimes = {n: [] for n in decoded}
            for n in decoded:
                entries[n]["model"].eval()  # once: FLOATER's eval cache lives until the next train()/eval()
                decode(n)  # warm-up (FLOATER fills its eval cache here)
            for rep in range(decode_reps[T]):
                for n in rotated(decoded, rep):
                    dtimes[n].append(tuple(t / dbsz for t in timed(lambda: decode(n), device)))
                loads.append(load_average())
            if args.profile_decode == T:
                profiles["decode"] = {n: profile_call(lambda: decode(n), device, args.profile_top) for n in decoded}
                profiles["decode_length"], profiles["decode_sentences"] = T, dbsz
            for n in decoded:
                assert out_len[n] == {T + 1}, f"{n}: output lengths {out_len[n]}, expected {T + 1}"
                rows[n, T]["decode_sentences"] = dbsz
                summarise(rows[n, T], "decode_per_sentence", dtimes[n], args.clock)
                entries[n]["model"].train()
            log(f"decode T={T:<4} B={dbsz:<4} " + "  ".join(
                f"{n} {rows[n, T]['decode_per_sentence_median_s'] * 1e3:.1f} ms/sent" for n in decoded))

    # ratios to the Transformer
    for (n, T), row in rows.items():
        base = rows[BASELINE, T]
        for key, ratio in (("train_update_median_s", "train_ratio"), ("decode_per_sentence_median_s", "decode_ratio"),
                           ("peak_memory_mib", "memory_ratio")):
            if row.get(key) is not None and base.get(key):
                row[ratio] = row[key] / base[key]

    settings = {k: v for k, v in vars(args).items() if k not in ("out_json", "out_md", "silent")}
    return {
        "command": " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
        "machine": machine(device),
        "source": source_state(),
        "settings": settings,
        "parameters": params,
        "load_average": {"samples": [x for x in loads if x], "start": loads[0], "end": load_average()},
        "wall_s": time.time() - started,
        "memory_method": ("torch.cuda.max_memory_allocated in a fresh process" if device == "cuda" else
                          "peak resident set (VmHWM, reset via /proc/self/clear_refs) minus the resident set just "
                          "before building the model, in a fresh process forked from a server that has only "
                          "imported the libraries")
                         + f"; building the model and two updates; median of {args.memory_reps} such processes",
        "rows": [rows[n, T] for T in lengths for n in names],
        "profiles": profiles,
        "goals": goals(rows, lengths, cached),
    }


GOALS = [  # (model, measure, bound, lengths: None = every length)
    ("relative", "train_ratio", 1.05, None),
    ("relative", "decode_ratio", 1.10, None),
    ("relative", "memory_ratio", 1.10, [256]),
    ("floater", "train_ratio", 1.15, None),
    ("CACHED", "train_ratio", 1.03, None),
    ("floater", "decode_ratio", 1.02, None),
    ("rope", "train_ratio", 1.03, None),
    ("rope", "decode_ratio", 1.03, None),
    *((m, measure, 1.08, None) for m in ("t5", "alibi") for measure in ("train_ratio", "decode_ratio")),
    *((m, "memory_ratio", 1.05, None) for m in ("rope", "t5", "alibi")),
]


def goals(rows, lengths, cached):
    out = []
    for model, measure, bound, at in GOALS:
        model = cached if model == "CACHED" else model
        for T in (at if at is not None else lengths):
            value = rows.get((model, T), {}).get(measure)
            if value is not None:
                out.append({"model": model, "measure": measure, "length": T, "bound": bound, "value": value,
                            "met": value <= bound})
    return out


# ---------------------------------------------------------------------------------------------------------------
# markdown


def fmt(x, unit_scale=1.0, digits=1):
    return "—" if x is None else f"{x * unit_scale:.{digits}f}"


def ratio(x):
    return "—" if x is None else f"{x:.3f}×"


def markdown(res):
    s, m = res["settings"], res["machine"]
    cached = f"floater_every{s['floater_every']}"
    other = "wall" if s["clock"] == "cpu" else "cpu"
    lines = [
        "# Cost of each position scheme, as ratios to fairseq's Transformer",
        "",
        f"Command: `{res['command']}`",
        "",
        f"Code: commit `{(res['source']['commit'] or '?')[:12]}`"
        + (f" with uncommitted changes to {', '.join(f'`{f}`' for f in res['source']['uncommitted_plugin_files'])}"
           if res["source"]["uncommitted_plugin_files"] else "") + ".",
        "",
        f"Machine: {m.get('gpu', m.get('cpu', '?'))}; {m['cores']} CPU cores, {m['threads']} torch threads, "
        f"torch {m['torch']}, Python {m['python']}, device `{s['device']}`. Load average (1 min) during the run: "
        + _load_summary(res["load_average"]) + f"; wall time {res['wall_s'] / 60:.1f} min.",
        "",
        f"Models ({s['dims']} dims, vocabulary {s['vocab']}, shared embeddings, fairseq's Adam, label-smoothed CE): "
        + "; ".join(f"`{r['model']}` = `--arch {r['arch']}{' ' + ' '.join(r['flags']) if r['flags'] else ''}`"
                    for r in res["rows"] if r["length"] == res["rows"][0]["length"]) + ".",
        "",
        f"Training: {s['tokens']} tokens per batch (B = {s['tokens']} // T sentences of T source and T target "
        f"tokens), {s['warmup']} warm-up updates, then {s['reps']} timed updates of each model (per length), "
        "round-robin; medians. "
        f"`{cached}` is the amortised update ((N − 1)·cached + exact) / N with N = {s['floater_every']}. "
        f"Decoding: beam 4, min_len = max_len = T, {s['decode_tokens']} // T sentences per call, "
        f"{s['decode_reps']} timed calls of each model after one warm-up, round-robin; milliseconds per sentence. "
        f"Peak memory: {res['memory_method']}.",
        "",
        f"Times are medians of {'process CPU time' if s['clock'] == 'cpu' else 'wall time'} (the ratios use them); "
        f"the {'wall' if s['clock'] == 'cpu' else 'CPU'}-time medians are listed beside them.",
        "",
        f"| model | T | B | train update | train ms | train ms ({other}) | decode | decode ms/sent | "
        f"decode ms/sent ({other}) | peak memory | peak MiB | ODE share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['model']} | {r['length']} | {r['batch_sentences']} | {ratio(r.get('train_ratio'))} | "
            f"{fmt(r.get('train_update_median_s'), 1e3)} | {fmt(r.get(f'train_update_{other}_median_s'), 1e3)} | "
            f"{ratio(r.get('decode_ratio'))} | {fmt(r.get('decode_per_sentence_median_s'), 1e3)} | "
            f"{fmt(r.get(f'decode_per_sentence_{other}_median_s'), 1e3)} | {ratio(r.get('memory_ratio'))} | "
            f"{fmt(r.get('peak_memory_mib'), 1.0, 0)} | "
            f"{'—' if r.get('ode_share') is None else format(100 * r['ode_share'], '.0f') + '%'} |")
    lines += ["", "Goals (ratio to the Transformer at the same length):", "",
              "| model | measure | T | bound | measured | met |", "|---|---|---:|---:|---:|---|"]
    for g in res["goals"]:
        lines.append(f"| {g['model']} | {g['measure']} | {g['length']} | ≤ {g['bound']:.2f}× | "
                     f"{g['value']:.3f}× | {'yes' if g['met'] else 'no'} |")
    profiles = res["profiles"]
    if "length" in profiles:
        lines += ["", f"Profiles: torch.profiler, one training update at T = {profiles['length']}, "
                      "top operators by self time:", ""]
        lines += _profile_lines({n: p for n, p in profiles.items() if n in {r["model"] for r in res["rows"]}})
    if "decode" in profiles:
        lines += ["", f"Profiles: one decoding call at T = {profiles['decode_length']} "
                      f"({profiles['decode_sentences']} sentences, beam 4), top operators by self time; "
                      "the self time of a labelled range is the Python between its operators:", ""]
        lines += _profile_lines(profiles["decode"])
    if res.get("notes"):
        lines += ["", res["notes"].strip()]
    return "\n".join(lines) + "\n"


def _profile_lines(profiles):
    lines = []
    for name, p in profiles.items():
        ops = ", ".join(f"{o['op']} {100 * o['share']:.0f}% ({o['self_ms']:.0f} ms, {o['calls']} calls)"
                        for o in p["top"][:8])
        extra = "".join(f"; range `{k}` {v:.0f} ms" for k, v in p["ranges_self_ms"].items())
        lines.append(f"- `{name}` ({p['total_self_ms']:.0f} ms{extra}): {ops}")
    return lines


def _load_summary(load):
    samples = [x[0] for x in load["samples"]]
    if not samples:
        return "unknown"
    return f"median {statistics.median(samples):.2f} (min {min(samples):.2f}, max {max(samples):.2f})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true",
                   help="tiny dims, two short lengths, few repetitions (a smoke run of well under a minute on CPU)")
    p.add_argument("--dims", choices=tuple(ARCHS), default="base")
    p.add_argument("--lengths", default="32,128,256,512", help="comma-separated sequence lengths T")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per training batch on each side (B = tokens // T)")
    p.add_argument("--decode-tokens", type=int, default=1024, help="source tokens per decoding call (B = this // T)")
    p.add_argument("--vocab", type=int, default=32768, help="size of the synthetic joint dictionary")
    p.add_argument("--warmup", type=int, default=2, help="untimed updates of each model per length")
    p.add_argument("--reps", default="7", help="timed updates of each model: one number or one per length")
    p.add_argument("--decode-reps", default="3", help="timed decoding calls of each model: one number or one per length")
    p.add_argument("--models", default="relative,floater,floater_cached",
                   help="compared with the transformer: any of relative, floater, floater_cached (needs floater), "
                        + ", ".join(SCHEME_NAMES))
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
                        "writes results/bench_ops.json/.md unless --out-json/--out-md are given")
    p.add_argument("--out-json", default=None, help="default results/bench.json (--count-ops: results/bench_ops.json)")
    p.add_argument("--out-md", default=None, help="default results/bench.md (--count-ops: results/bench_ops.md)")
    p.add_argument("--silent", action="store_true", help="no progress lines on stderr")
    p.add_argument("--notes", default=str(REPO / "results" / "bench_notes.md"),
                   help="markdown appended to --out-md (the analysis of the committed run), if the file exists")
    args = p.parse_args(argv)
    stem = "bench_ops" if args.count_ops else "bench"
    args.out_json = args.out_json or str(REPO / "results" / f"{stem}.json")
    args.out_md = args.out_md or str(REPO / "results" / f"{stem}.md")
    if args.quick:
        for name, value in (("dims", "tiny"), ("threads", 1), ("lengths", "16,32"), ("tokens", 256), ("decode_tokens", 64),
                            ("vocab", 64), ("warmup", 1), ("reps", "3"), ("decode_reps", "2"), ("memory_reps", 1)):
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
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
    res = run(args)
    res["notes"] = Path(args.notes).read_text(encoding="utf-8") if args.notes and Path(args.notes).is_file() else None
    res = relativize(res)  # no absolute path of this machine in the results
    for path, text in ((args.out_json, json.dumps(res, indent=1) + "\n"), (args.out_md, markdown(res))):
        write_text(Path(path), text)
    print(markdown(res))



if __name__ == "__main__":
    main()
