"""The GPU check's sections machine, precision, bench and invariance (scripts/gpu/gpu_check.py; floater_graph is
tooling.gpu.graph, users_path tooling.gpu.users_path; fused attention was removed with --attention-backend flex), and
running one: each in a process of its own,
killed with all it started at its cap.

    machine         GPU, driver, CUDA, torch, Python
    precision       every arch × --fp16/--bf16/--amp, 100 updates on the toy task, then beam 4 against fp32's
    bench           scripts/bench/bench.py --device cuda: the users' regime (--regime: bf16 and amp, 16,384 tokens, base
                    dims, six schemes); then FLOATER with and without CUDA graphs, beside the Transformer
    invariance      every scheme alone vs batched (tooling.invariance); one seed trained twice
    users_path      train.sh, evaluate.sh, make_tables.py for WMT14 cells on a stand-in corpus (tooling.gpu.users_path)

    run_section(name, args, cap, data, work)   the parent: the section's process under its cap -> its result
    section_main(args)                         the child: the section's rows to --rows-file as they come
"""
import argparse
import collections
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tooling.gpu.common import (DECODE_SHARDS, FAIL_ENV, HANG_ENV, INVARIANCE_DTYPES, MEMORY_WORKERS, MODES, PLUGINS,
                                REGIME_MODELS, REPLAY_ARCHS, REPLAY_UPDATES, REPO, SCRIPT, SECTIONS, CheckError, Rows,
                                last_line, log, model_names, relative)
from tooling.gpu.graph import build_trainer, section_floater_graph
from tooling.gpu.users_path import section_users_path
from tooling.supervise import children_cpu, start_group, wait_capped


# -- the machine -------------------------------------------------------------------------------------------

def section_machine(ctx, rows):
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "device": ctx.device}
    if os.environ.get("GPU_CHECK_SETUP_SECONDS"):  # gpu_check.sh set up from the carried bundle first
        info["offline set-up from the bundle"] = f"{os.environ['GPU_CHECK_SETUP_SECONDS']} s"
    if ctx.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda,
                    cudnn=torch.backends.cudnn.version())
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=10).stdout.strip() or "n/a"
        except (OSError, subprocess.SubprocessError):
            info["driver"] = "n/a"
    else:
        info["note"] = "DRY RUN on CPU: no GPU, CUDA graphs emulated"
    info["cpu_cores"] = os.cpu_count()
    rows.add("machine", **info)


# -- every arch × precision on the toy task ----------------------------------------------------------------

# One process per job: fairseq-train's and fairseq-generate's own entry points, one after the other (one start-up
# of Python, fairseq and CUDA instead of two).
JOB_CODE = """
import json, sys
from fairseq_cli import generate, train
train_argv, generate_argv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["fairseq-train", *train_argv]
train.cli_main()
print("=== generate", flush=True)
sys.argv = ["fairseq-generate", *generate_argv]
generate.cli_main()
"""


def train_and_decode(job):
    """fairseq-train for `updates` updates, then fairseq-generate (beam 4) on the toy test set."""
    arch, mode, data, work, updates, device = (job[k] for k in ("arch", "mode", "data", "work", "updates", "device"))
    save = Path(work) / f"{arch.replace(' --', '+').replace('-', '_')}.{mode}"
    cpu = ["--cpu"] if device == "cpu" else []
    started = time.time()
    train = [str(data), "--user-dir", str(PLUGINS), "--arch", *arch.split(),
             "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "2e-3",
             "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(max(1, updates // 4)),
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1",
             "--max-tokens", "4096", "--max-update", str(updates), "--seed", "1", "--num-workers", "0",
             "--save-dir", str(save), "--no-epoch-checkpoints", "--no-save-optimizer-state", "--log-format", "simple",
             "--log-interval", "10", "--disable-validation", *MODES[mode], *cpu]
    gen = [str(data), "--user-dir", str(PLUGINS), "--path", str(save / "checkpoint_last.pt"), "--gen-subset", "test",
           "--beam", "4", "--batch-size", "64", "--max-len-a", "1.5", "--max-len-b", "10",  # toy targets: ~ sources
           "--num-shards", str(DECODE_SHARDS), "--shard-id", "0",  # a fifth of the test set: 100 sentences
           "--remove-bpe", "sentencepiece", *cpu,
           *(["--fp16"] if mode == "fp16" else ["--bf16"] if mode == "bf16" else [])]
    proc = subprocess.run([sys.executable, "-c", JOB_CODE, json.dumps(train), json.dumps(gen)], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    trained, _, decoded = proc.stdout.partition("=== generate\n")
    losses = re.findall(r"\| loss ([0-9.]+) \|", trained + "\n" + proc.stderr)
    result = {"arch": arch, "mode": mode, "ok": proc.returncode == 0,
              "train_loss": float(losses[-1]) if losses else None,
              "seconds": round(time.time() - started, 1)}
    if proc.returncode != 0:
        result["error"] = ("decoding: " if decoded else "training: ") + last_line(proc.stderr)
        return result
    result["hypotheses"] = {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", decoded, re.M)}
    bleu = re.search(r"BLEU4? = ([0-9.]+)", decoded)
    result["bleu"] = float(bleu.group(1)) if bleu else None
    return result


def section_precision(ctx, rows):
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from fairseq_plugins.schemes import MODELS as SCHEME_MODELS, arch_and_flags

    # every scheme of the table (or --models) at its tiny size; FLOATER's graph path is section floater_graph's, in fairseq's
    # Trainer in all four modes (decoding never takes it)
    names = model_names(ctx.models) or (["rope"] if ctx.dry_run else SCHEME_MODELS)
    archs = [" ".join(arch_and_flags(name)) for name in names]
    modes, updates = (["bf16"], 4) if ctx.dry_run else (["fp16", "bf16", "amp"], 100)
    jobs = ctx.jobs or (2 if ctx.dry_run else os.cpu_count() or 1)
    rows.add("plan", archs=archs, modes=["fp32", *modes], updates=updates, jobs=jobs)
    # the slowest jobs (FLOATER's solve) first, so that the last wave is short
    todo = sorted(({"arch": a, "mode": m, "data": str(ctx.data), "work": str(ctx.work), "updates": updates,
                    "device": ctx.device} for a in archs for m in ["fp32", *modes]),
                  key=lambda job: "floater" not in job["arch"])
    with ThreadPoolExecutor(jobs) as pool:  # each job is a subprocess: threads only wait
        for future in as_completed([pool.submit(train_and_decode, job) for job in todo]):
            r = future.result()
            rows.add("job", **r)
            log(f"{r['arch']} {r['mode']}: " + (f"loss {r['train_loss']}, BLEU {r.get('bleu')}" if r["ok"]
                                                else r["error"]) + f" ({r['seconds']} s)")


def precision_rows(rows):
    """The jobs' results against fp32's of the same arch (hypotheses compared, then dropped), in the plan's
    order; a job that did not finish is a row saying so."""
    plan = next((r for r in rows if r["kind"] == "plan"), None)
    if plan is None:
        return rows
    by = {(r["arch"], r["mode"]): r for r in rows if r["kind"] == "job"}
    out = [plan]
    for arch in plan["archs"]:
        ref = by.get((arch, "fp32"), {})
        for mode in plan["modes"]:
            r = by.get((arch, mode))
            if r is None:
                out.append({"kind": "precision", "arch": arch, "mode": mode, "ok": False, "error": "did not finish",
                            "train_loss": None, "fp32_loss": ref.get("train_loss"), "bleu": None, "sentences": 0})
                continue
            row = {"kind": "precision", "arch": arch, "mode": mode, "ok": r["ok"], "error": r.get("error", ""),
                   "train_loss": r.get("train_loss"), "fp32_loss": ref.get("train_loss"), "bleu": r.get("bleu"),
                   "sentences": len(r.get("hypotheses", {})), "seconds": r.get("seconds")}
            if r["ok"] and ref.get("ok") and r.get("hypotheses"):
                same = sum(r["hypotheses"].get(i) == h for i, h in ref["hypotheses"].items())
                row["identical_to_fp32"] = same / max(1, len(ref["hypotheses"]))
            out.append(row)
    return out


# -- the benchmark -----------------------------------------------------------------------------------------

def section_bench(ctx, rows):
    section_regime(ctx, rows)  # first: the figures users quote (a cut run keeps the groups it finished)
    out_json, out_md = ctx.out_dir / "gpu_check_bench.json", ctx.out_dir / "gpu_check_bench.md"
    args = ["--device", ctx.device, "--notes", "", "--out-json", str(out_json), "--out-md", str(out_md)]
    if ctx.dry_run:
        args += ["--dims", "tiny", "--lengths", "32", "--reps", "1", "--decode-reps", "1", "--warmup", "0",
                 "--vocab", "1000", "--tokens", "256", "--decode-tokens", "64", "--no-memory",
                 "--models", "floater,floater_graph"]
    else:
        args += ["--lengths", "64,256", "--models", "relative,floater,floater_graph", "--reps", "5",
                 "--decode-reps", "2", "--memory-reps", "1", "--memory-workers", str(MEMORY_WORKERS)]
    run_bench(rows, args, out_json, out_md, decode_ratio="decode_ratio", graph_buckets="graph_buckets")


def section_regime(ctx, rows):
    """bench.py --regime: fairseq's Trainer in bf16 and amp on 16,384-token batches of the newstest length mix, base
    dims, the Transformer and REGIME_MODELS, one more bf16 update of each profiled (where the time goes); then bf16 updates of 4 × 8,192 tokens (--update-freq 4), FLOATER
    solving per micro-batch and once per update (floater_shared). A "regime" row per (update-freq, precision, model)."""
    common = ["--regime", "--device", ctx.device]
    if ctx.dry_run:
        common += ["--dims", "tiny", "--max-tokens", "512", "--updates", "1", "--warmup", "0", "--vocab", "1000",
                   "--decode-max-tokens", "256", "--threads", "1"]
        calls = [("regime", ["--precision", "bf16,amp", "--decode-batches", "1", "--models", "floater",
                             "--profile-update", "--profile-top", "5"]),
                 ("regime_uf4", ["--precision", "bf16", "--update-freq", "4", "--no-decode", "--models",
                                 "floater,floater_shared"])]
    else:
        common += ["--dims", "base"]
        calls = [("regime", ["--precision", "bf16,amp", "--decode-batches", "1", "--max-tokens", "16384", "--models",
                             ",".join(REGIME_MODELS), "--updates", "3", "--warmup", "2", "--profile-update"]),
                 ("regime_uf4", ["--precision", "bf16", "--update-freq", "4", "--no-decode", "--max-tokens", "8192",
                                 "--models", "floater,floater_shared", "--updates", "2", "--warmup", "1"])]
    for name, args in calls:
        out_json, out_md = ctx.out_dir / f"gpu_check_{name}.json", ctx.out_dir / f"gpu_check_{name}.md"
        call_bench(rows, [*common, *args, "--out-json", str(out_json), "--out-md", str(out_md)], out_md)
        report = json.loads(out_json.read_text())
        for r in report["rows"]:
            rows.add("regime", **{k: r.get(k) for k in ("model", "dims", "precision", "max_tokens", "tokens_per_s",
                                                        "train_ratio", "decode_tokens_per_s", "decode_ratio",
                                                        "matmul_fraction")},
                     update_freq=report["settings"].get("update_freq", 1),
                     gflop_per_update=r["flops"] / r["updates"] / 1e9)


def call_bench(rows, args, out_md):
    """The benchmark (tooling.bench.cli, scripts/bench/bench.py's command line) with args in this process, and a
    "bench" row with its command and report."""
    from tooling.bench.cli import main as bench_main

    command = " ".join(shlex.quote(a) for a in ["scripts/bench/bench.py", *(relative(a) if a.startswith("/") else a
                                                                           for a in args)])
    bench_main(args, command=command)  # the report records this command line, without a machine's paths
    rows.add("bench", command=command, report=relative(out_md))


def run_bench(rows, args, out_json, out_md, **extra):
    """scripts/bench/bench.py with args in this process; a "bench" row with its command and a "ratio" row per model and
    length (extra: row field = bench.py's key, beside the ratios every row has)."""
    call_bench(rows, args, out_md)
    for r in json.loads(out_json.read_text())["rows"]:
        rows.add("ratio", model=r["model"], length=r["length"], train_ratio=r.get("train_ratio"),
                 memory_ratio=r.get("memory_ratio"),
                 train_ms=None if r.get("train_update_median_s") is None else r["train_update_median_s"] * 1e3,
                 peak_mib=r.get("peak_memory_mib"), error=r.get("error"),
                 **{field: r.get(key) for field, key in extra.items()})


# -- batch invariance and replay ---------------------------------------------------------------------------

def section_invariance(ctx, rows):
    """Every row of the scheme table in fp32 and bf16: teacher-forced and 301-step incremental logits alone vs
    batched, and how many of the 3 sentences get other beam-4 hypotheses alone; then one seed trained twice
    (dropout on) with and without torch.use_deterministic_algorithms: bit-identical parameters?, ms per update."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic mode, before CUDA starts
    import torch
    from fairseq_plugins.schemes import SCHEMES
    from tooling import invariance

    steps, lengths = (4, invariance.SMALL) if ctx.dry_run else (invariance.STEPS, invariance.LENGTHS)
    half_steps = min(steps, 60)  # bf16: 60 steps (positions past thresholds are fp32's check)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for row in (r for r in SCHEMES.values() if r.arch_prefix or r.flags):
        for name in INVARIANCE_DTYPES:
            model = invariance.row_model(row, ctx.device, dtypes[name])
            n = steps if name == "fp32" else half_steps
            errors = invariance.errors(model, steps=n, lengths=lengths)
            rows.add("invariance", scheme=row.name, dtype=name, steps=n, **errors,
                     beam_differ=invariance.beam_differences(model, lengths=lengths))
            log(f"invariance {row.name} {name}: {errors}")
    data = ctx.data  # the parent prepared it (NEED_DATA)
    for arch in REPLAY_ARCHS[:1] if ctx.dry_run else REPLAY_ARCHS:
        for deterministic in (False, True):
            torch.use_deterministic_algorithms(deterministic)
            try:
                runs = [replay_run(data, ctx.device, arch, 3 if ctx.dry_run else REPLAY_UPDATES) for _ in range(2)]
                same = all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0]))
                rows.add("replay", arch=arch, deterministic=deterministic, identical=same,
                         ms_per_update=min(r[1] for r in runs))
            except RuntimeError as e:  # an operator without a deterministic implementation: which one
                rows.add("replay", arch=arch, deterministic=deterministic, identical=None, ms_per_update=None,
                         error=last_line(str(e)))
            finally:
                torch.use_deterministic_algorithms(False)
            log(f"replay {rows.rows[-1]}")


def replay_run(data, device, arch, updates):
    """(parameters, ms per update after the first) of `updates` updates of arch, seed 1, dropout 0.1."""
    import torch

    trainer, batches = build_trainer(data, device, ["--dropout", "0.1"], arch=arch)
    trainer.train_step([next(batches)])  # the first builds the optimizer's state
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(updates - 1):
        trainer.train_step([next(batches)])
    if device == "cuda":
        torch.cuda.synchronize()
    ms = 1000 * (time.perf_counter() - start) / max(updates - 1, 1)
    return [p.detach().cpu().clone() for p in trainer.model.parameters()], ms


SECTION_FUNCTIONS = {"machine": section_machine, "floater_graph": section_floater_graph,
                     "precision": section_precision, "bench": section_bench, "invariance": section_invariance,
                     "users_path": section_users_path}
EMULATED = ("floater_graph", "bench")  # the sections whose dry run needs CUDA graphs emulated
NEED_DATA = ("floater_graph", "precision", "invariance")  # the sections training on the toy task


def section_main(args):
    """One section in this process (started by the parent, run_section, with --section): its rows go to
    --rows-file."""
    rows = Rows(args.rows_file)
    name = args.section
    try:
        if os.environ.get(FAIL_ENV) == name:
            raise RuntimeError(f"failure injected into section {name} ({FAIL_ENV})")
        if os.environ.get(HANG_ENV) == name:  # a hung call, with a child of its own: both must go at the cap
            child = subprocess.Popen(["sleep", "3600"])
            log(f"hanging: pids {os.getpid()} {child.pid}")
            time.sleep(3600)
        with tempfile.TemporaryDirectory(prefix="gpu_check.") as work:
            ctx = argparse.Namespace(dry_run=args.dry_run, device="cpu" if args.dry_run else "cuda",
                                     data=Path(args.data) if args.data else None, out_dir=Path(args.out_dir),
                                     jobs=args.jobs, models=args.models, work=Path(work))
            emulation = contextlib.nullcontext()
            if args.dry_run and name in EMULATED:  # CUDA graphs' buffer semantics on CPU: the test layer's
                from helpers.cuda_graph_emulation import emulated_cuda_graphs  # emulation (tests/ on PYTHONPATH)

                emulation = emulated_cuda_graphs()
            with emulation:
                SECTION_FUNCTIONS[name](ctx, rows)
        return 0
    except BaseException as e:  # noqa: BLE001  (SystemExit from bench.py's checks too): the reason, then the trace
        rows.add("error", reason=last_line("".join(traceback.format_exception_only(type(e), e))))
        traceback.print_exc()
        return 1


def run_section(name, args, cap, data, work):
    """The section in a child process (scripts/gpu/gpu_check.py --section NAME: section_main) killed, with
    everything it started, at `cap` seconds; its result."""
    rows_file = work / f"{name}.rows.json"
    cmd = [sys.executable, str(SCRIPT), "--section", name, "--rows-file", str(rows_file),
           "--out-dir", str(args.out_dir)]
    cmd += (["--dry-run"] if args.dry_run else []) + (["--data", str(data)] if data else []) + (
        ["--jobs", str(args.jobs)] if args.jobs else []) + (["--models", args.models] if args.models else [])
    tail = collections.deque(maxlen=50)
    started, cpu = time.monotonic(), children_cpu()
    proc, pump = start_group(cmd, f"  {name}| ", tail, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    # killed at the cap (or on Ctrl-C, which its session does not get); after a normal end, what it left running
    timed_out = wait_capped(proc, pump, cap)
    rc = proc.returncode
    seconds, cpu = time.monotonic() - started, children_cpu() - cpu
    rows = json.loads(rows_file.read_text()) if rows_file.exists() else []
    errors = [r["reason"] for r in rows if r["kind"] == "error"]
    rows = [r for r in rows if r["kind"] != "error"]
    if name == "precision":
        rows = precision_rows(rows)
    if timed_out:
        status, reason = "timed out", f"timed out after {cap:g} s"
    elif rc != 0:
        status = "failed"
        reason = errors[-1] if errors else last_line("\n".join(tail), f"exited with status {rc}")
    else:
        status, reason = "completed", None
    return {"title": SECTIONS[name][0], "cap_s": cap, "seconds": round(seconds, 1), "cpu_s": round(cpu, 1),
            "status": status, "reason": reason, "rows": rows}


def prepare_toy_data(data_dir, timeout):
    """data/toy's binarized task, made (make_toy_data.py, prepare_bitext.sh) if missing, within `timeout` s."""
    if (data_dir / "bin" / "dict.src.txt").exists():
        return data_dir / "bin"
    raw = data_dir / "raw"
    deadline = time.monotonic() + timeout
    for cmd in ([sys.executable, str(REPO / "scripts" / "make_toy_data.py"), "--out", str(raw)],
                ["bash", str(REPO / "scripts" / "prepare_bitext.sh"), str(raw), str(data_dir), "src", "tgt", "400",
                 "test_long"]):
        tail = collections.deque(maxlen=20)
        proc, pump = start_group(cmd, None, tail)
        if wait_capped(proc, pump, max(1.0, deadline - time.monotonic())):
            raise CheckError(f"timed out after {timeout:g} s")
        if proc.returncode != 0:
            raise CheckError(last_line("\n".join(tail), f"{Path(cmd[1]).name} exited with {proc.returncode}"))
    return data_dir / "bin"
