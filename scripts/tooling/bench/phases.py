"""The benchmark's measurements at fixed lengths (scripts/bench/bench.py is its command line; tooling.bench.report
writes its tables). Its parts: tooling.bench.models (models and batches), tooling.bench.timing (clocks, medians,
profiles, the machine), tooling.bench.ops (--count-ops); the users' regime (--regime: a WMT-like length mix,
fairseq's Trainer in each precision) is tooling.bench.regime with tooling.bench.length_mix.

Phases of `run`, each on one `Bundle` (task, model, criterion, optimizer, as fairseq-train builds them):
`memory_phase` (fresh processes), then per length `train_phase` and `decode_phase` on fresh bundles.

The protocol, for every sequence length T (source and target both T tokens, a fixed token budget per batch, so
B = tokens // T sentences):

1. Training update: fairseq's task.train_step (forward + label-smoothed cross-entropy + backward), the trainer's
   gradient normalisation and norm, and fairseq's Adam step, on a random batch over a synthetic dictionary. The
   models are timed round-robin (one update of each per repetition, the order rotated every repetition) so that
   drift in the machine's load hits all of them alike; the figure is the median after warm-up.
   FLOATER runs twice: with the exact gradient every update (--floater-update-every 1) and with the cached
   biases of --floater-update-every N. The latter's figure is the amortised cost of one update,
   ((N − 1)·median(cached update) + median(exact update)) / N: one update in N re-solves.
   `floater_graph` (asked for by name) is the exact FLOATER with --floater-cuda-graph: its training solves
   replayed from CUDA graphs (on CUDA; on CPU only under the test layer's emulation of CUDA graphs, which
   gpu_check.sh --dry-run installs). Every length starts without captured graphs (its first update captures:
   give it warm-up updates); its rows record the buckets captured (`graph_buckets`). At inference it is the
   same model as `floater` (graphs replay training solves only), so it is not decoded twice.
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
their CPU time, one thread), at every length; it writes --out-json/--out-md (default results/bench/bench_ops.*).
"""

import ctypes
import multiprocessing
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tooling.bench.models import (BASELINE, GRAPH, PRELOAD, Bundle, model_specs, random_batch,
                                  synthetic_dictionary)
from tooling.bench.timing import (CLOCKS, counting_graphs, load_average, machine, median, num_solves,
                                  parse_lengths, parse_per_length, profile_call, rotated, source_state, summarise,
                                  sync, timed)

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
    base = peak_reset(device)
    try:
        bundle = Bundle.build(job["arch"], job["flags"], dictionary, device, job["seed"])
        for _ in range(2):
            bundle.train_update(sample)
        sync(device)
    except Exception as e:  # noqa: BLE001  its first line, as text: compiler errors hold what a pool cannot pickle
        lines = str(e).strip().splitlines()  # (torch's compiler errors end with advice on logging, not the cause)
        return f"{type(e).__name__}: {lines[0] if lines else ''}"[:500]
    return peak_mib(device, base)


def peak_reset(device, trim=False):
    """Starts this process's peak-memory count: on CUDA the allocator's peak, on CPU the peak resident set (VmHWM,
    reset through /proc/self/clear_refs to the current resident set). Returns what the peak is measured from
    (bytes): the memory allocated, or resident, now. trim (CPU): first hand glibc's free heap pages back to the
    system (malloc_trim), so that the base is the memory in use, not what earlier work freed and the heap kept, which
    a later allocation would reuse unseen."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
    return _status_kb("VmRSS") * 1024


def peak_mib(device, base):
    """The peak since peak_reset (which returned `base`), in MiB above `base`."""
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else _status_kb("VmHWM") * 1024
    return (peak - base) / 2**20


def measure_memory(jobs, workers, probe=memory_probe):
    """Each job in its own process, forked from a server that has imported the libraries and computed nothing;
    `workers` of them at a time (they measure memory, not time). Yields (job, probe(job)) in order; `probe` a
    module-level function (the server imports it by name)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    with ctx.Pool(workers, maxtasksperchild=1) as pool:
        yield from zip(jobs, pool.imap(probe, jobs))


# ---------------------------------------------------------------------------------------------------------------
# the run: memory, then per length training and decoding, each phase filling the rows of one report


@dataclass
class Plan:
    """What one run measures (from the command line) and where it writes: rows[(model, T)], loads, profiles."""

    args: Any
    lengths: list
    reps: dict  # T -> timed updates
    decode_reps: dict  # T -> timed decoding calls
    specs: dict
    names: list
    cached: str
    dictionary: Any
    rows: dict
    log: Any
    loads: list
    profiles: dict

    @property
    def decoded(self):  # the cached and the graphed FLOATER are the same model as floater at inference
        return [n for n in self.names if n not in (self.cached, GRAPH)]

    def bundles(self):
        """Fresh models (same seed) of every compared name."""
        args = self.args
        return {n: Bundle.build(self.specs[n][0], self.specs[n][1], self.dictionary, args.device, args.seed,
                                kind=self.specs[n][2]) for n in self.names}


def plan(args):
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = parse_lengths(args.lengths)
    specs = model_specs(args.dims, args.floater_every)
    cached = f"floater_every{args.floater_every}"
    asked = args.models.split(",")
    names = [n for n in specs if n in asked or n == BASELINE or (n == cached and "floater_cached" in asked)]
    if cached in names and "floater" not in names:
        raise SystemExit("--models: floater_cached needs floater (its amortised update includes one exact update)")
    if GRAPH in names and device != "cuda" and not graphs_emulated():
        raise SystemExit(f"--models {GRAPH}: FLOATER's CUDA-graph solve needs --device cuda (on CPU it runs only "
                         "under gpu_check.sh --dry-run's emulation of CUDA graphs)")
    rows = {(n, T): {"model": n, "arch": specs[n][0], "flags": specs[n][1], "length": T,
                     "batch_sentences": max(1, args.tokens // T)} for n in names for T in lengths}
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not args.silent else (lambda *a: None)
    return Plan(args, lengths, parse_per_length(args.reps, lengths, "reps"),
                parse_per_length(args.decode_reps, lengths, "decode-reps"), specs, names, cached,
                synthetic_dictionary(args.vocab), rows, log, [load_average()], {})


def graphs_emulated():
    """Whether the test layer's CPU emulation of CUDA graphs is installed (it replaces FLOATER's capture predicate,
    tests/helpers/cuda_graph_emulation.py), so that FLOATER's graph path runs on CPU."""
    return torch.cuda.CUDAGraph.__module__ != "torch.cuda.graphs"


def memory_phase(p):
    """3. Peak memory, first, while this process has computed nothing (each probe is a fresh process anyway)."""
    args = p.args
    jobs = [dict(name=n, arch=p.specs[n][0], flags=p.specs[n][1], length=T, bsz=p.rows[n, T]["batch_sentences"],
                 vocab=args.vocab, device=args.device, seed=args.seed, threads=torch.get_num_threads())
            for T in p.lengths for n in p.names]
    for job, mib in measure_memory(jobs * args.memory_reps, args.memory_workers):
        row = p.rows[job["name"], job["length"]]
        if isinstance(mib, str):  # a model that cannot train here: reported with its reason, not timed
            row["error"] = mib
            p.log(f"memory {job['name']:>18} T={job['length']:<4} failed: {mib}")
            continue
        row.setdefault("peak_memory_mib_samples", []).append(mib)
        row["peak_memory_mib"] = median(row["peak_memory_mib_samples"])
        p.log(f"memory {job['name']:>18} T={job['length']:<4} {mib:9.1f} MiB")
    p.loads.append(load_average())
    failed = {n for (n, _), row in p.rows.items() if "error" in row}
    if BASELINE in failed:
        raise SystemExit(f"bench: the baseline {BASELINE} failed: {p.rows[BASELINE, p.lengths[0]].get('error')}")
    p.names[:] = [n for n in p.names if n not in failed]


def train_phase(p, bundles, T, sample):
    """1. Training updates at length T, round-robin; the cached FLOATER's amortised update and the ODE's share."""
    args, names, cached, rows = p.args, p.names, p.cached, p.rows
    times = {n: [] for n in names}  # (wall, cpu) pairs
    solve_times = []  # the cached model's updates that re-solved (excluded from its cached median)
    # graphs that torch.compile made during each model's updates (none of today's models compiles; a guard): in the
    # warm-up they are its compiles; in the timed updates any would be recompiles, which would make those times a
    # compile's
    for _ in range(args.warmup):
        for n in names:
            with counting_graphs(rows[n, T], "compiled_graphs_warmup"):
                bundles[n].train_update(sample)
    for rep in range(p.reps[T]):
        for n in rotated(names, rep):
            b = bundles[n]
            solves = num_solves(b.model)
            with counting_graphs(rows[n, T], "compiled_graphs_timed"):
                t = timed(lambda: b.train_update(sample), args.device)
            if n == cached and num_solves(b.model) > solves:
                solve_times.append(t)
            else:
                times[n].append(t)
        p.loads.append(load_average())
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
    p.log(f"train  T={T:<4} B={rows[names[0], T]['batch_sentences']:<4} " + "  ".join(
        f"{n} {rows[n, T]['train_update_median_s'] * 1e3:.1f} ms" for n in names)
        + (f"  (cached {rows[cached, T]['train_update_cached_median_s'] * 1e3:.1f} ms)" if cached in names else ""))
    if args.profile_length == T:
        for n in names:
            p.profiles[n] = profile_call(lambda: bundles[n].train_update(sample), args.device, args.profile_top)
        p.profiles["length"] = T


def decode_phase(p, bundles, T):
    """2. Beam search at length T: every decoded model produces exactly T tokens (+ EOS) per sentence."""
    from fairseq.sequence_generator import SequenceGenerator

    args, decoded, rows = p.args, p.decoded, p.rows
    dbsz = max(1, args.decode_tokens // T)
    src = random_batch(p.dictionary, dbsz, T, args.device, seed=args.seed + 7 * T)
    src = {"net_input": {k: src["net_input"][k] for k in ("src_tokens", "src_lengths")}}
    generators = {n: SequenceGenerator([bundles[n].model], p.dictionary, beam_size=4, max_len_a=0,
                                       max_len_b=T, min_len=T) for n in decoded}
    out_len = {}

    def decode(n):
        hypos = generators[n].generate([bundles[n].model], src)
        out_len[n] = {len(h[0]["tokens"]) for h in hypos}

    dtimes = {n: [] for n in decoded}
    for n in decoded:
        bundles[n].model.eval()  # once: FLOATER's eval cache lives until the next train()/eval()
        decode(n)  # warm-up (FLOATER fills its eval cache here)
    for rep in range(p.decode_reps[T]):
        for n in rotated(decoded, rep):
            dtimes[n].append(tuple(t / dbsz for t in timed(lambda: decode(n), args.device)))
        p.loads.append(load_average())
    if args.profile_decode == T:
        p.profiles["decode"] = {n: profile_call(lambda: decode(n), args.device, args.profile_top) for n in decoded}
        p.profiles["decode_length"], p.profiles["decode_sentences"] = T, dbsz
    for n in decoded:
        assert out_len[n] == {T + 1}, f"{n}: output lengths {out_len[n]}, expected {T + 1}"
        rows[n, T]["decode_sentences"] = dbsz
        summarise(rows[n, T], "decode_per_sentence", dtimes[n], args.clock)
        bundles[n].model.train()
    p.log(f"decode T={T:<4} B={dbsz:<4} " + "  ".join(
        f"{n} {rows[n, T]['decode_per_sentence_median_s'] * 1e3:.1f} ms/sent" for n in decoded))


def run(args, progress=None):
    """Every phase the command line asks for; the report (JSON-able) with ratios to the Transformer and goals.
    ``progress``, if given, receives the report so far after the memory phase and after every length but the
    last, with "partial" naming what is still to come: a run cut short (a GPU lease's cap) leaves what it measured."""
    p = plan(args)
    started = time.time()
    if not args.no_memory:
        memory_phase(p)
    params, bundles = None, {}
    for i, T in enumerate(p.lengths):
        if progress is not None and (i or not args.no_memory):
            progress(report(p, params, started, partial=f"T = {', '.join(map(str, p.lengths[i:]))} still to run"))
        # Fresh models (same seed) at every length: each length measures the same initial state, and a
        # flow trained on random batches at one length cannot diverge at the next (long grids amplify it).
        bundles.clear()  # the previous length's models go before the next ones are built
        bundles = p.bundles()
        if params is None:
            params = {n: sum(x.numel() for x in b.model.parameters()) for n, b in bundles.items()}
        sample = random_batch(p.dictionary, p.rows[p.names[0], T]["batch_sentences"], T, args.device,
                              seed=args.seed + T)
        if GRAPH in p.names:  # the graphed FLOATER captures anew at every length (fresh models)
            from fairseq_plugins.modules.floater import CUDA_GRAPHS

            CUDA_GRAPHS.reset()
        train_phase(p, bundles, T, sample)
        if GRAPH in p.names:
            p.rows[GRAPH, T]["graph_buckets"] = CUDA_GRAPHS.captured_buckets()
        if not args.no_decode:
            decode_phase(p, bundles, T)
    return report(p, params, started)


def report(p, params, started, partial=None):
    args, rows = p.args, p.rows
    for (n, T), row in rows.items():  # ratios to the Transformer
        base = rows[BASELINE, T]
        for key, ratio in (("train_update_median_s", "train_ratio"), ("decode_per_sentence_median_s", "decode_ratio"),
                           ("peak_memory_mib", "memory_ratio")):
            if row.get(key) is not None and base.get(key):
                row[ratio] = row[key] / base[key]
    settings = {k: v for k, v in vars(args).items() if k not in ("out_json", "out_md", "silent")}
    return {
        **({"partial": partial} if partial else {}),
        "command": args.command,
        "machine": machine(args.device),
        "source": source_state(),
        "settings": settings,
        "parameters": params,
        "load_average": {"samples": [x for x in p.loads if x], "start": p.loads[0], "end": load_average()},
        "wall_s": time.time() - started,
        "memory_method": ("torch.cuda.max_memory_allocated in a fresh process" if args.device == "cuda" else
                          "peak resident set (VmHWM, reset via /proc/self/clear_refs) minus the resident set just "
                          "before building the model, in a fresh process forked from a server that has only "
                          "imported the libraries")
                         + f"; building the model and two updates; median of {args.memory_reps} such processes",
        "rows": [rows[n, T] for T in p.lengths for n in p.specs if (n, T) in rows],  # failed ones too
        "profiles": p.profiles,
        "goals": goals(rows, p.lengths, p.cached),
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
