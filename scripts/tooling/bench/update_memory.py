"""scripts/bench/bench.py --count-ops --regime --memory: the peak host memory of one update, fairseq's
Trainer.train_step, beside its operators and syncs (tooling.bench.update_ops), for the default update and for
`--fused-update --adam-impl torch`, per (dims, max tokens, precision, model).

Each (row, repetition) is a fresh process forked from the server that tooling.bench.phases.measure_memory starts
(the libraries imported, nothing computed): it draws the row's batches (tooling.bench.update_ops.update_batches,
the counted update's), builds the trainer, runs WARM_UPDATES updates (Adam's moments, the fp32 master weights and
fairseq's lazily made buffers exist after them), then resets the peak (phases.peak_reset) and runs the measured
update: the figure is the peak above the resident set just before it (on CPU VmHWM − VmRSS; on CUDA the
allocator's peak above what is allocated). What persists from update to update is in the base, so the figure is
what one update allocates on top: activations and gradients, and the transient copies of the precision's wrapper
and of the optimizer. It is the host's resident set, not a GPU allocator's: glibc's heap keeps and reuses freed
blocks and torch's CPU allocator does not cache, so a GPU's figure (cached blocks, other kernels' workspaces)
differs; what the two updates are compared on is their transient allocations.
"""
import ctypes
import gc

import torch

from tooling.bench.timing import median

M_MMAP_THRESHOLD, MMAP_THRESHOLD = -3, 64 * 1024  # glibc's mallopt parameter (malloc.h), and the value given


def update_memory_probe(job):
    """In a fresh forked process: the peak (MiB) of the update after WARM_UPDATES, above the resident set before
    it (see the docstring)."""
    from tooling.bench import length_mix
    from tooling.bench.models import synthetic_dictionary
    from tooling.bench.phases import peak_mib, peak_reset
    from tooling.bench.regime import build_trainer
    from tooling.bench.timing import sync
    from tooling.bench.update_ops import WARM_UPDATES, update_batches

    torch.set_num_threads(job["threads"])
    device = job["device"]
    if device == "cpu":
        # every block of MMAP_THRESHOLD or more its own mapping, unmapped when freed: glibc's threshold otherwise
        # rises with the largest block freed so far, after which such blocks come from the heap and its free
        # pages, so that whether a tensor shows in the resident set depends on what ran before (measured: a
        # sample's spread of several MiB)
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    dictionary = synthetic_dictionary(job["vocab"])
    batches = update_batches(length_mix.load_pairs(), dictionary, job["max_tokens"], job["seed"])
    trainer = build_trainer(job["arch"], job["flags"], job["precision"], dictionary, device, job["seed"],
                            kind=job["kind"])
    for b in batches[:WARM_UPDATES]:
        trainer.train_step([b])
    sync(device)
    # the gradients the update makes count in it: train_step frees the last ones first thing (zero_grad), here
    # before the base; fp32 master gradients (--bf16, --fp16) persist and stay in the base
    trainer.zero_grad()
    gc.collect()
    base = peak_reset(device, trim=True)
    trainer.train_step([batches[WARM_UPDATES]])
    sync(device)
    return peak_mib(device, base)


def measure_rows(args, rows, update_flags, log):
    """Each row's peak_mib (the median of --memory-reps processes, the samples in peak_mib_samples);
    update_flags: the row's "update" -> the flags added to its model's."""
    from tooling.bench.models import model_specs
    from tooling.bench.phases import measure_memory
    from tooling.bench.regime import regime_archs

    jobs = []
    for i, r in enumerate(rows):
        _, flags, kind = model_specs(r["dims"], args.floater_every, archs=regime_archs(r["dims"]))[r["model"]]
        jobs.append(dict(row=i, arch=r["arch"], flags=flags + update_flags[r["update"]], kind=kind,
                         precision=r["precision"], max_tokens=r["max_tokens"], vocab=args.vocab, seed=args.seed,
                         device=args.device, threads=torch.get_num_threads()))
    for job, mib in measure_memory(jobs * args.memory_reps, args.memory_workers, probe=update_memory_probe):
        r = rows[job["row"]]
        r.setdefault("peak_mib_samples", []).append(mib)
        r["peak_mib"] = median(r["peak_mib_samples"])
        log(f"update memory {r['dims']} {r['precision']} {r['max_tokens']} {r['model']} {r['update']}: "
            f"{mib:.1f} MiB")


def update_memory_markdown(res):
    st = res["settings"]
    extra = " ".join(st["update_flags"]) or "none"
    lines = [f"# Peak host memory, operators and host syncs of the users' update, default and fused ({st['device']})",
             "", f"Command: `{res['command']}`  ", f"Machine: {res['machine'].get('cpu', '')}, torch "
             f"{res['machine']['torch']}, {st['threads']} thread(s); commit {res['source']['commit']}  ",
             f"Training flags beside the regime's recipe (Adam, --weight-decay 0.0 unless given here): {extra}; "
             "fused: these and `--fused-update --adam-impl torch`", "",
             "One `Trainer.train_step`, the third on the regime's batches (tooling/bench/update_memory.py). Peak "
             f"MiB: in a fresh forked process per row and repetition (the median of {st['memory_reps']}), the peak "
             "resident set (VmHWM, reset through /proc/self/clear_refs) during that update above the resident set "
             "just before it, after two updates (Adam's moments and the fp32 master weights exist and are in the "
             "base). So it is what one update allocates on top of the model and the optimizer's state: "
             "activations, gradients, and transient copies such as torch Adam's skip path with weight decay (`torch._foreach_mul(ps, 1.0 - found_inf)`: "
             "a copy of the parameters). It is the CPU's resident set: glibc reuses freed heap blocks, torch's CPU "
             "allocator caches nothing, so a GPU allocator's figure differs; the comparison is of the two "
             "updates' transient allocations. In the probe every block of 64 KiB or more is its own mapping "
             "(glibc's mmap threshold fixed: a sample then repeats to 0.3 MiB). Operators and syncs as in "
             "bench_update_ops (counted in the bench's own process, on the same update).", "",
             "| dims | precision | max tokens | model | update | operators | host syncs | peak MiB | samples |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        samples = ", ".join(f"{x:.1f}" for x in r.get("peak_mib_samples", []))
        lines.append(f"| {r['dims']} | {r['precision']} | {r['max_tokens']:,} | {r['model']} | {r['update']} | "
                     f"{r['ops']:,} | {r['syncs']} | {r['peak_mib']:.1f} | {samples} |")
    return "\n".join(lines) + "\n"
