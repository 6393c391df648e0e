#!/usr/bin/env python3
"""The converged Multi30k campaign: every scheme of the table x 3 seeds at the literature's 8,000 updates, many runs
side by side on one GPU, inside calls of at most 9.5 minutes that keep nothing on the device.

    bash scripts/gpu/campaign.sh [--out-dir DIR]       # on the GPU machine: the next runs of the manifest (a call)
    python scripts/gpu/campaign.py plan                 # here: the runs left, as the next call would take them
    python scripts/gpu/campaign.py ingest DIR --lease L # here: what a call brought back into results/multi30k_gpu/
    python scripts/gpu/campaign.py run --dry-run --out-dir DIR --manifest M --results R   # the call on CPU, tiny

A call (`run`): prepares the data (scripts/study/multi30k_study.sh, PREPARE_ONLY=1; skipped when carried), starts
CUDA MPS's daemon for the call (its folders in the call's work folder, stopped at the end; where it cannot start the
report says why and the call runs without it; --no-mps: without), then, at the first lease only, measures the total
training updates/s of 1, 4, 8, 12 and 16 runs side by side (one CPU thread each: a few seconds each, ~1 minute
together), without MPS and with it; later leases reuse those measurements (--measure measures again). The plan
(campaign_jobs.plan_call): of every measured level with and without MPS, the one whose schedule finishes the most
runs before the deadline, each job predicted from its updates at that level's rate per run plus its evaluation, in
the manifest's order, none started that would not finish. It starts the manifest's jobs in order, as many side by
side (as MPS clients if the plan is MPS's), each only if its predicted time fits before the deadline (--budget from
the call's start, set-up included, less the packing), each job one recipe process (JOBS=1, THREADS=1, DEVICE=cuda,
its runs averaged, decoded, probed and scored by the recipe), kills what is still running at the deadline, and
packs every run it finished into at most 6 archives of at most 15.5 MiB (results, hypotheses, probes, logs; no
checkpoint) beside campaign.json and campaign.md, which are rewritten as each job ends.

`ingest` checks a call's archives against the manifest before writing anything (a run reported finished but
missing a file, or finished again although the manifest has it done, is refused), extracts them into the results'
runs/, records the runs done with the commit, the machine and the lease, and makes the tables (two-level bootstrap
over seeds and sentences, each scheme against the Transformer; the length probe's table) with the recipe's
TABLES_ONLY=1 where Multi30k is here.
"""
import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: the tooling library
from tooling.gpu import campaign_jobs as cp
from tooling.gpu import mps
from tooling.gpu.campaign_report import call_markdown, pack_runs
from tooling.atomic import write_json, write_text
from tooling.supervise import kill_group, start_group

REPO = Path(__file__).resolve().parents[2]
RECIPE_SH = REPO / "scripts" / "study" / "multi30k_study.sh"
MANIFEST = REPO / "results" / "multi30k_gpu" / "manifest.json"
RESULTS = REPO / "results" / "multi30k_gpu"
BUDGET_S = 560  # a call: at most 9.5 minutes, set-up included (campaign.sh's CAMPAIGN_STARTED)
PACK_S = 25  # packing and the last report after the deadline
EVAL_S = 90  # per run: averaging, decoding test, the length probe, source dependence, scoring (until measured)
WINDOW_S, WARMUP_S = 5.0, 30.0  # the throughput probe: seconds per level; most start-up before the first window (it
# starts 1 s after every process has done its warm-up updates, if sooner)
DRY = {"recipe": {"EPOCHS": "1", "WARMUP": "10", "AVG": "1", "FT_EPOCHS": "1", "FT_AVG": "1", "VOCAB": "500", "BEAM": "1",
                  "PROBE_PER_K": "1",
                  "MODEL_ARGS": "--encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
                                "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
                                "--decoder-attention-heads 2"},
       "sentences": {"train": 200, "val": 30, "test_2016_flickr": 30}, "levels": (1, 2), "window": 3.0,
       "warmup": 60.0, "eval_s": 20, "budget": 900}


def log(msg):
    print(f"campaign: {msg}", file=sys.stderr, flush=True)


def table_models():
    from fairseq_plugins.schemes import MODELS

    return list(MODELS)


def find_multi30k(given):
    need = [f"{s}.{lang}" for s in DRY["sentences"] for lang in ("en", "de")]
    for folder in ([Path(given)] if given else [REPO / ".gpu_bundle" / "multi30k", REPO / "data" / "multi30k",
                                                REPO.parent / "shared" / "data" / "multi30k"]):
        if all((folder / f).is_file() for f in need):
            return folder
    if given:
        raise cp.CampaignError(f"--multi30k {given}: expected Multi30k's {', '.join(need)}")
    return None


def small_multi30k(multi30k, work):
    """The dry run's data: the first sentences of each split of Multi30k."""
    small = work / "multi30k"
    small.mkdir(parents=True)
    for split, n in DRY["sentences"].items():
        for lang in ("en", "de"):
            with open(multi30k / f"{split}.{lang}", encoding="utf-8") as f:
                write_text(small / f"{split}.{lang}", "".join(line for _, line in zip(range(n), f)))
    return small


class Call:
    """One call's state: the work folders, the recipe's environment, the report written as it goes."""

    def __init__(self, args, manifest):
        self.args, self.manifest = args, manifest
        self.started = float(os.environ.get("CAMPAIGN_STARTED", time.time()))
        self.budget = args.budget or (DRY["budget"] if args.dry_run else BUDGET_S)
        self.deadline = self.started + self.budget - PACK_S
        self.out = Path(args.out_dir)
        self.recipe = {**manifest["recipe"], **(DRY["recipe"] if args.dry_run else {})}
        # seconds per run besides training: the last lease's median where it measured them, else EVAL_S
        self.eval_s = DRY["eval_s"] if args.dry_run else (cp.eval_before(manifest) or EVAL_S)
        self.report = {"dry_run": args.dry_run, "code": os.environ.get("CODE_VERSION") or git_head(),
                       "machine": machine(args.dry_run), "recipe": self.recipe, "probe": True, "budget_s": self.budget,
                       "setup_s": int(os.environ.get("CAMPAIGN_SETUP_SECONDS", 0)), "runs": [], "jobs": [],
                       "archives": [], "measured": None, "measured_mps": None, "mps": None, "concurrency": None,
                       "plan": None, "why": None}
        self.mps_vars = {}  # CUDA MPS's folders, for the processes of a call that trains under MPS

    def env(self, condition, **extra):
        cond_vars, sub, _ = cp.CONDITIONS[condition]
        work = self.work
        return {**os.environ, **self.recipe, **cond_vars, "MULTI30K_DIR": str(self.multi30k),
                "DATA_DIR": str(self.data_dir(condition)), "CKPT_ROOT": str(work / "ckpt" / condition),
                "OUT_DIR": str(work / "out" / condition), "DEVICE": "cpu" if self.args.dry_run else "cuda",
                "JOBS": "1", "THREADS": "1", "TABULATE": "0", "CODE_VERSION": self.report["code"],
                "PYTHONUNBUFFERED": "1", **self.mps_vars, **extra}

    def data_dir(self, condition):
        cond_vars, _, _ = cp.CONDITIONS[condition]
        if self.args.dry_run:
            return self.work / "data" / condition
        return default_data_dir(cond_vars)

    def write(self):
        self.report["wall_s"] = round(time.time() - self.started)
        write_json(self.out / "campaign.json", self.report, indent=1)
        write_text(self.out / "campaign.md", call_markdown(self.report))


def git_head():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine(dry_run):
    if dry_run:
        return "CPU (dry run)"
    import torch

    return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, {os.cpu_count()} CPU cores"


def run(args):
    manifest = cp.load_manifest(args.manifest, table_models())
    call = Call(args, manifest)
    call.out.mkdir(parents=True, exist_ok=True)
    jobs = cp.next_jobs(manifest)[:args.max_jobs or None]
    if not jobs:
        log("every run of the manifest is done")
        call.write()
        return 0
    with tempfile.TemporaryDirectory(prefix="campaign.") as tmp:
        call.work = (Path(args.work) if args.work else Path(tmp) if args.dry_run
                     else REPO / "checkpoints" / "campaign")
        multi30k = find_multi30k(args.multi30k)
        if multi30k is None:
            raise cp.CampaignError("Multi30k not found: expected it in .gpu_bundle/multi30k (make gpu-bundle), "
                                   "data/multi30k or ../shared/data/multi30k, or --multi30k DIR")
        call.multi30k = small_multi30k(multi30k, call.work) if args.dry_run else multi30k
        call.write()
        conditions = sorted({j["condition"] for j in jobs}, key=list(cp.CONDITIONS).index)
        for condition in conditions:
            prepare(call, condition)
        measured = None if args.measure else cp.measured_before(manifest)
        measured_mps = None if args.measure else cp.measured_before(manifest, "measured_mps_updates_per_s")
        mps_env = None
        if args.mps:  # processes that share the GPU instead of time-slicing it; without it where it cannot start
            mps_env, why = mps.start(call.work / "mps")
            call.report["mps"] = "started" if mps_env else f"not started: {why}"
            log(f"CUDA MPS {call.report['mps']}")
        try:
            if measured is None:
                measured = measure(call, conditions[0])
            if mps_env is not None and measured_mps is None:
                measured_mps = measure(call, conditions[0], mps_vars=mps_client_vars(mps_env))
            call.report["measured"] = {str(k): v for k, v in sorted(measured.items())}
            call.report["measured_mps"] = measured_mps and {str(k): v for k, v in sorted(measured_mps.items())}
            tables = {"without MPS": measured, **({"with MPS": measured_mps} if mps_env and measured_mps else {})}
            if args.concurrency:  # as asked, at the rate measured for it (the slowest measured where it was not)
                name = "with MPS" if "with MPS" in tables else "without MPS"
                rates = tables[name]
                tables = {name: {args.concurrency: rates.get(args.concurrency, min(rates.values()) * args.concurrency)}}
            best = cp.plan_call(jobs, tables, call.deadline - time.time(), call.recipe, call.eval_s,
                                most=None if args.concurrency else os.cpu_count())
            if best is None:
                call.report["why"] = ("no measured level lets a run finish before the deadline: " + "; ".join(
                    f"{name}: " + ", ".join(f"{k} side by side {v:.1f} updates/s" for k, v in rates.items())
                    for name, rates in tables.items()))
                call.write()
                log(call.report["why"])
                return 1
            level = best["level"]
            call.report["concurrency"] = level
            call.report["plan"] = {"table": best["name"], "level": level, "predicted_runs": best["runs"],
                                   "predicted_jobs": len(best["planned"]), "jobs_left": len(best["left"]),
                                   "per_run_updates_per_s": round(best["per_run_rate"], 1)}
            call.report["why"] = (f"{level} side by side {best['name']}: the plan that finishes the most runs "
                                  f"({best['runs']}) before the deadline")
            call.mps_vars = mps_client_vars(mps_env) if best["name"] == "with MPS" else {}
            log(f"{level} jobs side by side {best['name']}, {best['runs']} runs predicted to finish "
                f"(measured total updates/s: {call.report['measured']}; with MPS: {call.report['measured_mps']})")
            train(call, jobs, best["per_run_rate"], level)
        finally:
            mps.stop(mps_env)
        call.report["archives"] = pack_runs(call)
        call.write()
    finished = sum(r["status"] == "finished" for r in call.report["runs"])
    log(f"{finished} run(s) finished; {call.out / 'campaign.md'}")
    return 0 if finished else 1


def prepare(call, condition):
    started = time.time()
    for sub in ("runs", "source_dependence"):  # the runs done before (the recipe skips them, retrains for fine-tunes)
        src = Path(call.args.results) / cp.CONDITIONS[condition][1] / sub
        if src.is_dir():
            shutil.copytree(src, call.work / "out" / condition / sub, dirs_exist_ok=True)
    proc = subprocess.run(["bash", str(RECIPE_SH)], cwd=REPO, env=call.env(condition, PREPARE_ONLY="1",
                                                                         MODELS="transformer", SEEDS="1"),
                          capture_output=True, text=True)
    if proc.returncode:
        raise cp.CampaignError(f"preparing the data of {condition}: {proc.stderr.strip().splitlines()[-1:]}")
    call.report.setdefault("prepare_s", {})[condition] = round(time.time() - started)


def mps_client_vars(env):
    """The variables that make a process a client of the call's MPS daemon (none without one)."""
    return {k: env[k] for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")} if env else {}


def measure(call, condition, mps_vars=None):
    """{level: total updates/s}: the transformer's training command, max(levels) processes started together, each
    timing its updates in the windows where it is one of the first `level` (scripts/gpu/campaign.py probe-worker);
    with mps_vars, as clients of the call's MPS daemon."""
    levels = [n for n in (DRY["levels"] if call.args.dry_run else cp.LEVELS) if n <= (os.cpu_count() or 1)]
    window = DRY["window"] if call.args.dry_run else WINDOW_S
    t0 = time.time() + (DRY["warmup"] if call.args.dry_run else WARMUP_S)
    shutil.rmtree(call.work / "probe" / "ready", ignore_errors=True)  # an earlier measurement's
    procs = []
    for rank in range(max(levels)):
        out = call.work / "probe" / f"rank{rank}.json"
        save = call.work / "probe" / f"save{rank}"
        worker = (f"{sys.executable} {REPO / 'scripts' / 'gpu' / 'campaign.py'} probe-worker --rank {rank} --t0 {t0} "
                  f"--window {window} --levels {','.join(map(str, levels))} --out {out} "
                  f"--ready {call.work / 'probe' / 'ready'} --ranks {max(levels)} --")
        env = call.env(condition, FAIRSEQ_TRAIN=worker, LR="0.005", WARMUP=call.recipe["WARMUP"], DROPOUT="0.3",
                       MAX_TOKENS="4096", EPOCHS="1000", SEED=str(rank + 1), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                       **(mps_vars or {}))
        cmd = ["bash", "scripts/train_small.sh", str(call.data_dir(condition) / "bin"), str(save), "transformer_tiny",
               *call.recipe.get("MODEL_ARGS", cp.study_model_args()).split(), "--disable-validation", "--no-save"]
        procs.append(start_group(cmd, None, collections.deque(maxlen=20), cwd=REPO, env=env))
    end = t0 + window * len(levels) + 30
    for proc, pump in procs:
        try:
            proc.wait(timeout=max(1, end - time.time()))
        except subprocess.TimeoutExpired:
            pass
        kill_group(proc)
        proc.wait()
    counts = {n: 0.0 for n in levels}
    for rank in range(max(levels)):
        f = call.work / "probe" / f"rank{rank}.json"
        if f.is_file():
            for n, c in zip(levels, cp.read_json(f)["counts"]):
                counts[n] += c / window
    return {n: round(c, 1) for n, c in counts.items()}


def probe_worker(args, train_argv):
    """fairseq-train itself, whose Trainer.train_step waits outside this rank's windows and counts the updates
    finished inside them; writes the counts and exits at the last window's end."""
    import fairseq.trainer
    from fairseq_cli import train as fairseq_train

    levels = [int(n) for n in args.levels.split(",")]
    counts = [0] * len(levels)
    original = fairseq.trainer.Trainer.train_step

    def done():
        write_json(args.out, {"rank": args.rank, "counts": counts})
        os._exit(0)

    def start_when_all_are_ready():
        """The windows' start: 1 s after the last rank finished its warm-up updates, at the latest args.t0 (the
        start-up allowance), so no rank waits out the whole allowance once every rank is training. Each rank reads
        the same files, so all start alike."""
        write_json(os.path.join(args.ready, f"rank{args.rank}.json"), {"at": time.time()})
        while time.time() < args.t0:
            files = [os.path.join(args.ready, f"rank{r}.json") for r in range(args.ranks)]
            if all(os.path.isfile(f) for f in files):
                args.t0 = min(args.t0, max(cp.read_json(f)["at"] for f in files) + 1.0)
                return
            time.sleep(0.2)

    def step(self, samples, *a, **kw):
        while True:
            now = time.time()
            if step.warm == 3 and not step.ready:
                step.ready = True
                start_when_all_are_ready()
                now = time.time()
            k = int((now - args.t0) // args.window) if now >= args.t0 else -1
            if k >= len(levels):
                done()
            if k >= 0 and args.rank < levels[k]:
                break
            if k == -1 and step.warm < 3:  # a few updates before the first window: the first ones are slower
                step.warm += 1
                return original(self, samples, *a, **kw)
            time.sleep(max(0.0, args.t0 + (k + 1) * args.window - now))
        out = original(self, samples, *a, **kw)
        if int((time.time() - args.t0) // args.window) == k:
            counts[k] += 1
        return out

    step.warm, step.ready = 0, False
    fairseq.trainer.Trainer.train_step = step
    sys.argv = ["fairseq-train", *train_argv]
    fairseq_train.cli_main()
    done()


def train(call, jobs, per_run_rate, level):
    """The jobs in order, `level` at a time, each started only if predicted to finish before the deadline."""
    queue, running = list(jobs), []
    while queue or running:
        for entry in list(running):
            job, proc, pump, tail, started = entry
            if proc.poll() is not None:
                pump.join(timeout=10)
                running.remove(entry)
                finish(call, job, started, None if proc.returncode == 0 else
                       (list(tail)[-1] if tail else f"exited with {proc.returncode}"))
        while queue and len(running) < level:
            job = queue[0]
            predicted = cp.job_seconds(job, call.recipe, per_run_rate, call.eval_s)
            if time.time() + predicted > call.deadline:
                queue = []  # in order: the next call takes it
                break
            queue.pop(0)
            tail = collections.deque(maxlen=20)
            env = call.env(job["condition"], MODELS=" ".join(job["models"]), SEEDS=str(job["seed"]))
            proc, pump = start_group(["bash", str(RECIPE_SH)], None, tail, cwd=REPO, env=env)
            log(f"started {job['name']} (predicted {predicted:.0f} s)")
            call.report["jobs"].append({"job": job["name"], "predicted_s": round(predicted)})
            running.append((job, proc, pump, tail, time.time()))
        if time.time() > call.deadline:
            for job, proc, pump, tail, started in running:
                kill_group(proc, grace=5)
                proc.wait()
                finish(call, job, started, "killed at the call's deadline")
            running = []
        time.sleep(0.5)


def finish(call, job, started, reason):
    """The job's runs in the report: finished when this call wrote its result."""
    out = call.work / "out" / job["condition"] / "runs"
    # a run's own seconds: from the job's start, or from the result of the run before it in the job (the recipe
    # runs a job's runs one after another); less its training, what averaging, decoding and the probe took
    made = sorted(f.stat().st_mtime for f in out.glob("*.json")
                  if f.stat().st_mtime >= started and f.name.count(".") == 2)
    for name in job["runs"]:
        result = out / f"{name}.json"
        row = {"run": name, "condition": job["condition"], "job": job["name"]}
        if result.is_file() and result.stat().st_mtime >= started:
            r = cp.read_json(result)
            end = result.stat().st_mtime
            own = end - max([started, *(t for t in made if t < end)])
            row.update(status="finished", wall_s=round(end - started), own_s=round(own),
                       eval_s=round(own - (r.get("train_seconds") or 0)),
                       bleu_tok_lc=r["bleu_tok_lc"], bleu=r["bleu"], train_seconds=r.get("train_seconds"),
                       updates=(r.get("valid_loss") or [[None]])[-1][0])
        else:
            log_file = call.work / "ckpt" / job["condition"] / name / "train.log"
            row.update(status="no result", reason=reason or cp.log_tail(log_file) or "no result written")
        call.report["runs"].append(row)
        log(f"{name}: {row['status']}" + (f" ({row.get('reason')})" if row["status"] != "finished" else
                                           f", BLEU tok-lc {row['bleu_tok_lc']:.2f} in {row['wall_s']} s"))
    call.write()


def ingest(args):
    manifest = cp.load_manifest(args.manifest, table_models())
    out_dir = Path(args.dir)
    try:
        report = cp.read_json(out_dir / "campaign.json")
    except (OSError, ValueError) as err:
        raise cp.CampaignError(f"{out_dir}/campaign.json: not a call's report ({err})") from None
    if report["dry_run"] and not args.dry_run:
        raise cp.CampaignError(f"{out_dir}: a dry run's output; only --dry-run ingests it")
    finished, found = cp.check_archives(report, manifest, out_dir)  # everything checked before a file is written
    cp.extract(out_dir, found, args.results)
    cp.write_manifest(args.manifest, cp.record(manifest, finished, report, args.lease))
    log(f"{len(finished)} run(s) recorded in {args.manifest}")
    if args.tables:
        tables(args, manifest, report)
    return 0


def tables(args, manifest, report):
    multi30k = find_multi30k(args.multi30k)
    if multi30k is None:
        log("Multi30k not here: the tables are left as they were (--multi30k DIR makes them)")
        return
    for condition, (cond_vars, sub, _) in cp.CONDITIONS.items():
        runs = [r for r in manifest["runs"] if r["condition"] == condition]
        if not any(r["status"] == "done" for r in runs):
            continue
        models = " ".join(dict.fromkeys(r["model"] for r in runs))
        env = {**os.environ, **report["recipe"], **cond_vars, "TABLES_ONLY": "1", "MODELS": models,
               "SEEDS": " ".join(map(str, cp.SEEDS)), "MULTI30K_DIR": str(multi30k),
               "OUT_DIR": str(Path(args.results) / sub),
               "DATA_DIR": str(args.data_root / condition if args.data_root else default_data_dir(cond_vars)),
               "CKPT_ROOT": str(REPO / "checkpoints" / "campaign")}
        proc = subprocess.run(["bash", str(RECIPE_SH)], cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise cp.CampaignError(f"the tables of {condition}: {proc.stderr.strip()[-400:]}")
        log(f"tables of {condition}: {Path(args.results) / sub}")


def default_data_dir(cond_vars):
    """The recipe's own data folder of a condition (the CPU study's: the same sentencepiece model)."""
    return REPO / "data" / ("multi30k_study_ende_tok32_joined" if cond_vars else "multi30k_study_ende")


def plan(args):
    manifest = cp.load_manifest(args.manifest, table_models())
    jobs = cp.next_jobs(manifest)
    done = sum(r["status"] == "done" for r in manifest["runs"])
    print(f"{done} of {len(manifest['runs'])} runs done; {len(jobs)} jobs left, in order:")
    for j in jobs:
        print(f"  {j['name']}  ({', '.join(j['runs'])})")
    if not os.path.isfile(args.manifest):
        cp.write_manifest(args.manifest, manifest)
        print(f"written: {args.manifest}")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe-worker"]:
        cut = argv.index("--")
        p = argparse.ArgumentParser(prog="campaign.py probe-worker")
        for flag, kind in (("--rank", int), ("--t0", float), ("--window", float), ("--levels", str), ("--out", str),
                           ("--ready", str), ("--ranks", int)):
            p.add_argument(flag, type=kind, required=True)
        return probe_worker(p.parse_args(argv[1:cut]), argv[cut + 1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--manifest", default=str(MANIFEST), help="the campaign's manifest (default: %(default)s)")
    p.add_argument("--results", default=str(RESULTS), help="the campaign's results (default: %(default)s)")
    p.add_argument("--multi30k", help="Multi30k's folder (default: .gpu_bundle/multi30k, data/multi30k or "
                                      "../shared/data/multi30k)")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="a call: the next runs of the manifest, side by side on the GPU")
    r.add_argument("--out-dir", required=True, help="where campaign.json, campaign.md and the archives go")
    r.add_argument("--budget", type=int, help=f"seconds from the call's start to its end (default {BUDGET_S})")
    r.add_argument("--concurrency", type=int, help="jobs side by side (default: from the measured updates/s)")
    r.add_argument("--measure", action="store_true", help="measure the updates/s again (default: the last lease's)")
    r.add_argument("--no-mps", dest="mps", action="store_false",
                   help="without CUDA MPS (default: its daemon started for the call; measured with and without it "
                        "once, the faster plan taken)")
    r.add_argument("--max-jobs", type=int, help="take at most this many jobs")
    r.add_argument("--dry-run", action="store_true", help="on CPU, tiny models on a few hundred sentences")
    r.add_argument("--work", help="the call's data, checkpoints and runs (default: checkpoints/campaign; the dry "
                                  "run's: a temporary folder)")
    i = sub.add_parser("ingest", help="a call's archives into the results; the manifest updated; the tables")
    i.add_argument("dir", help="the call's --out-dir, as it came back")
    i.add_argument("--lease", required=True, help="the lease's name in the manifest, e.g. 2026-12-02a")
    i.add_argument("--no-tables", dest="tables", action="store_false", help="leave the tables as they are")
    i.add_argument("--data-root", type=Path, help="the prepared data, one folder per condition (the dry run's)")
    i.add_argument("--dry-run", action="store_true", help="accept a dry run's output (tests)")
    sub.add_parser("plan", help="the runs left, as the next call takes them (writes the manifest if missing)")
    args = p.parse_args(argv)
    for flag in ("budget", "concurrency", "max_jobs"):
        if getattr(args, flag, None) is not None and getattr(args, flag) < 1:
            p.exit(2, f"campaign.py: --{flag.replace('_', '-')} {getattr(args, flag)}: expected a positive integer\n")
    try:
        return {"run": run, "ingest": ingest, "plan": plan}[args.command](args)
    except cp.CampaignError as err:
        p.exit(2, f"campaign.py: {err}\n")


if __name__ == "__main__":
    sys.exit(main())
