#!/usr/bin/env python3
"""The papers' WMT14 cells as one Slurm submission: trainings, FLOATER's warm starts, evaluations, the tables.

    scripts/submit_paper.py [paper|newer|CELL ...] [--train="SBATCH OPTIONS"] [--train-big="SBATCH OPTIONS"]
                            [--eval="SBATCH OPTIONS"] [--tables="SBATCH OPTIONS"] [--sbatch="SBATCH OPTIONS"]
                            [--override KEY=VALUE ...] [--dry-run]

e.g. (8 GPUs a training on two nodes, one GPU an evaluation):

    scripts/submit_paper.py paper --sbatch="--partition=gpu --account=mt" \\
        --train="--nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=8 --time=24:00:00" \\
        --train-big="--nodes=2 --ntasks-per-node=8 --gpus-per-node=8 --cpus-per-task=8 --time=72:00:00" \\
        --eval="--ntasks=1 --gpus=1 --cpus-per-task=8 --time=4:00:00" --tables="--partition=cpu --time=0:10:00"

The options of a job, in order (sbatch takes the last value of an option given twice): --sbatch, then --train
(--train-big for the big cells, where given), --eval or --tables. A try-out on toy cells, its own folders:
scripts/demos/slurm_tryout.sh.

The job graph, per cell (`paper`: make_tables.py --list paper; `newer`: --list newer; or cells by name):
- a training: scripts/train.sbatch CELL (requeued before its time limit, resumed from checkpoint_last.pt);
- a warm start (`*_floater_<layers>_warm`) after its Transformer's training (afterok; the Transformer of the same
  pair and size is trained too when it is not in the list): the job converts that checkpoint_last.pt into its
  warm_start.pt (scripts/transformer_to_floater.py) and trains;
- an evaluation per test set after the training (afterok): newstest2013 (`--subset valid`) for the cells of the
  tables on newstest2013 (Shaw's ablations), newstest2014 for the others;
- last, scripts/make_tables.py after every job (afterany), with the cells that have no result named under the
  tables, with why (the job that failed, or the job it waited for).
A job whose dependency fails is cancelled (--kill-on-invalid-dep=yes), not left pending.

The job ids go to a manifest (CHECKPOINTS/submit_paper.json) and a rerun submits only what is not finished: a
cell with its result JSON(s) is skipped, one with a job still queued or running is not submitted twice (a warm start
then waits for that job; an evaluation that is missing, say one sbatch refused, is submitted after it), a training
that ended ("done training" after the last start in its train.log) is not run again, only its evaluation.

No kill queues a job twice: each job sbatch accepts is written to the manifest (atomically) and its id printed
before the next sbatch. SIGTERM, SIGHUP (a dropped ssh connection) and Ctrl-C stop the submission once the job
being queued is recorded (exit 128 + the signal; sbatch runs in a session of its own, so the terminal's signal
does not kill it mid-call); a manifest that cannot be written (a full disk) stops it in one line. SIGKILL cannot
be caught: a job accepted in the instant before its record is found by the rerun, which reads this user's queue
for the submission's job names whose log goes to CHECKPOINTS, and records it instead of queueing it again. Two
submissions to one manifest at once: the second waits until the first is done (a lock beside it,
submit_paper.json.lock, removed at the end), then submits only what is still missing.

Checked before anything is made or queued, each refusal one line: each cell's data folder (the config's task.data,
or --override task.data=DIR; scripts/prepare_wmt14.sh makes it) and an evaluation's (--data-dir in --eval-args,
else the folder above the training's); every --override, composed by Hydra with each cell as the training will
compose it. Paths in overrides (task.data, checkpoint.restore_file, checkpoint.finetune_from_model) and
--eval-args' --data-dir reach the jobs absolute (they run from the repository). A refusal leaves no folder, lock
or manifest behind. Logs: CHECKPOINTS/slurm-<job name>-<job id>.out.

--dry-run prints the plan as a shell script and submits nothing: `mkdir -p CHECKPOINTS`, then per job
`dryN=$(ENV sbatch --parsable ...)`, with the environment the job reads (SAVE_DIR, WARM_START_FROM, ...) and its
dependencies on $dryN; the rest are comments. Run as it is (`... --dry-run > plan.sh; bash plan.sh`) it queues the
plan, without a manifest (the tables job is given the cells). Without the data folders it warns, one line each on
stderr, and shows the plan anyway. Verified on a one-node Slurm 22.05 (tests/test_submit_paper.py,
tests/test_submit_paper_faults.py: CPU jobs, tiny models, kills between two accepted jobs).
"""
import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path

import yaml

import make_tables
from tooling import cells
from tooling.atomic import write_text
from tooling.slurm_jobs import (Journal, Refusal, Slurm, Stopped, held_signals, jobs_in_queue, manifest_lock,
                                missing_folders, remove_if_empty, say)

REPO = Path(__file__).resolve().parents[1]
TESTSETS = ("newstest2014", "newstest2013")
# overrides whose value is a path: handed to the jobs (which run from the repository) as absolute paths
PATH_KEYS = ("task.data", "checkpoint.finetune_from_model", "checkpoint.restore_file")


def shown(path):
    """A path as the notes show it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def warm_base(cell):
    """The Transformer a warm start converts (wmt14_en_de_base_floater_all_warm -> wmt14_en_de_base_transformer)
    and the --floater-layers of the conversion (all), or None for a cell that is not a warm start."""
    m = cells.CELL.fullmatch(cell)
    scheme = m.group("scheme")
    if not (scheme.startswith("floater_") and scheme.endswith("_warm")):
        return None
    return cell[: m.start("scheme")] + "transformer", scheme[len("floater_"):].split("_")[0]


def requested_cells(names, paper_numbers):
    """The cells named (paper and newer expanded), each once, in order; a name that is no WMT14 cell is refused."""
    known, out = set(cells.wmt14_cells()), []
    for name in names:
        if name == "paper":
            batch = make_tables.paper_experiments(paper_numbers)
        elif name == "newer":
            batch = make_tables.newer_experiments(paper_numbers)
        elif name in known:
            batch = [name]
        else:
            raise Refusal(f"{name}: not a WMT14 cell (expected paper, newer or a name from make_tables.py --list, "
                          "e.g. wmt14_en_de_base_relative)")
        out += [c for c in batch if c not in out]
    return out


def testsets_of(cell, paper_numbers):
    """The test sets a cell is evaluated on: those of the paper tables it is in, else newstest2014."""
    sets = [t for t in TESTSETS if cell in make_tables.paper_experiments(paper_numbers, t)]
    return sets or ["newstest2014"]


def training_finished(save):
    """Whether the last run in SAVE/train.log (after its last 'train.sh: ' start line) ended with fairseq's
    'done training'."""
    log = Path(save) / "train.log"
    if not log.is_file():
        return False
    text = log.read_text(errors="replace")
    return "done training" in text[text.rfind("train.sh: "):]


def config_data(cell):
    """The data folder a cell's config trains on (configs/pair/<pair>.yaml's task.data, ${oc.env:PWD} being the
    repository, as scripts/train.sh sets it)."""
    pair = cells.CELL.fullmatch(cell).group("pair")
    text = yaml.safe_load((cells.CONFIG_DIR / "pair" / f"{pair}.yaml").read_text(encoding="utf-8"))["task"]["data"]
    return Path(text.replace("${oc.env:PWD}", str(REPO)))


def data_refusal(args, cell, evaluated):
    """One line naming a data folder that a cell's jobs would not find, or None."""
    own = config_data(cell)
    train = next((o.split("=", 1)[1] for o in reversed(args.override)
                  if o.split("=", 1)[0].lstrip("+") == "task.data"), None)
    train = Path(train) if train else own
    if not train.is_dir():
        how = (f"bash scripts/prepare_wmt14.sh {cells.CELL.fullmatch(cell).group('pair').replace('_', '-')} makes it"
               if train == own else "from --override task.data")
        return f"{cell}: no data folder {shown(train)} ({how}; or --override task.data=DIR)"
    if evaluated:
        words = shlex.split(args.eval_args)
        given = words[words.index("--data-dir") + 1] if "--data-dir" in words[:-1] else None
        folder = Path(given) if given else own.parent
        if not folder.is_dir():
            return (f"{cell}: its evaluation finds no data folder {shown(folder)} "
                    f"({'from --eval-args --data-dir' if given else 'the folder above the config task.data'}; pass "
                    "--eval-args=\"--data-dir DIR\")")
    return None


def save_dir(args, cell):
    return Path(args.checkpoints) / cell


def result_file(args, cell, testset):
    return make_tables.result_path(args.results, cell, testset)


def train_options(args, cell):
    """(sbatch options, the flags they came from) of a cell's training."""
    if args.train_big is not None and cells.CELL.fullmatch(cell).group("size") == "big":
        return args.train_big, "--sbatch, --train-big"
    return args.train, "--sbatch, --train"


def job_args(args, name, extra, after=None, kind="afterok"):
    out = ["--job-name", name, f"--output={Path(args.checkpoints) / f'slurm-{name}-%j.out'}", "--open-mode=append",
           f"--chdir={REPO}", *shlex.split(args.sbatch), *extra]
    if after:
        out += [f"--dependency={kind}:{':'.join(after)}"] + (["--kill-on-invalid-dep=yes"] if kind == "afterok" else [])
    return out


class Plan:
    """The cells asked for, in the order their jobs go in: the Transformers the warm starts need first (a warm start
    depends on their job), evaluated when asked for; each one's test sets and warm-start base."""

    def __init__(self, args, paper_numbers):
        self.wanted = requested_cells(args.cells, paper_numbers)
        self.evals = {c: testsets_of(c, paper_numbers) for c in self.wanted}
        self.bases = {c: warm_base(c) for c in self.wanted}
        self.order = list(dict.fromkeys([b[0] for b in self.bases.values() if b] + self.wanted))
        self.done = {c: (all(result_file(args, c, t).is_file() for t in self.evals[c]) if c in self.evals
                         else training_finished(save_dir(args, c))) for c in self.order}

    def job_names(self):
        return {"tables"} | {f"train-{c}" for c in self.order} | {
            f"eval-{c}-{t}" for c in self.order for t in self.evals.get(c, [])}


def absolute_paths(args):
    """Path-valued overrides and --eval-args' --data-dir made absolute from the caller's directory: the jobs run
    from the repository (a relative task.data passed the check here and failed in every job)."""
    def absolute(value):
        return str(Path(value).expanduser().resolve()) if value and not os.path.isabs(value) else value

    out = []
    for override in args.override:
        key, sep, value = override.partition("=")
        bare = key.lstrip("+")
        plain = sep and value and not any(ch in value for ch in "$'\"") and value != "null"
        if plain and bare in PATH_KEYS and not (bare == "checkpoint.restore_file" and "/" not in value):
            # task.data may list shards (a:b:c); restore_file's bare name is fairseq's: inside checkpoint.save_dir
            value = ":".join(absolute(v) for v in value.split(":")) if bare == "task.data" else absolute(value)
            override = f"{key}={value}"
        out.append(override)
    args.override = out
    words = shlex.split(args.eval_args)
    if "--data-dir" in words[:-1]:
        i = words.index("--data-dir") + 1
        words[i] = absolute(words[i])
        args.eval_args = shlex.join(words)


def check_inputs(args, plan):
    """Every cell's data folders and overrides, before anything is made or queued: one line for the first that
    fails. A dry run shows the plan anyway, a warning line per missing data folder."""
    todo = [c for c in plan.order if not plan.done[c]]
    for cell in todo:
        why = data_refusal(args, cell, evaluated=cell in plan.evals)
        if why and args.dry_run:
            print(f"submit_paper.py: warning: {why}", file=sys.stderr)
        elif why:
            raise Refusal(why)
    if args.override and todo:
        os.environ["PWD"] = str(REPO)  # the configs' ${oc.env:PWD}, as scripts/train.sh sets it
        say(f"{comment(args)}checking the overrides on {len(todo)} cell(s)")
        import hydra_config

        for cell in todo:
            why = hydra_config.override_refusal(cell, args.override)
            if why:
                raise Refusal(f"--override {why}")


def submit(args, paper_numbers, slurm):
    plan = Plan(args, paper_numbers)
    absolute_paths(args)
    check_inputs(args, plan)
    journal = Journal(args.manifest, args.dry_run, shown)
    if args.dry_run:  # the printed lines, run in order by a shell, queue the plan
        print(f"mkdir -p {shlex.quote(args.checkpoints)}")
        return submit_locked(args, plan, slurm, journal)
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # sbatch would retry it for a minute, then fail
        raise Refusal(f"SLURM_CONF={conf}: no such file (point it at the cluster's slurm.conf, or unset it)")
    if not shutil.which("sbatch"):
        raise Refusal("sbatch: not found (run this on a Slurm login node, or use --dry-run)")
    made = missing_folders(args.checkpoints, Path(args.manifest).parent)
    try:
        Path(args.checkpoints).mkdir(parents=True, exist_ok=True)  # Slurm fails a job whose log folder is missing
        with manifest_lock(args.manifest, shown), held_signals() as journal.held:
            return submit_locked(args, plan, slurm, journal)
    finally:  # a refusal before the first job leaves no folder behind (a queued job's log goes there)
        if not journal.queued:
            remove_if_empty(made)


def adopt(args, plan, slurm, manifest):
    """Records in `manifest` the jobs of this submission that are queued or running but not in it (a submission
    killed after sbatch accepted them)."""
    found = jobs_in_queue(slurm, plan.job_names(), args.checkpoints)

    def take(name, current):
        ids = found.get(name, [])
        if not ids or (current in ids) or (current and slurm.live(current)):
            return current
        if len(ids) > 1:
            say(f"{name}: {len(ids)} jobs of this name in the queue ({', '.join(ids)}): recording the newest; "
                f"scancel the others")
        say(f"{name}: job {ids[-1]} is queued but was not recorded (a submission stopped after sbatch accepted it): "
            "recorded now")
        return ids[-1]

    jobs = manifest["cells"]
    for cell in plan.order:
        entry = jobs.get(cell, {})
        entry["train"] = take(f"train-{cell}", entry.get("train"))
        evals = entry.setdefault("eval", {})
        for testset in plan.evals.get(cell, []):
            job = take(f"eval-{cell}-{testset}", evals.get(testset))
            if job:
                evals[testset] = job
        if entry["train"] or entry["eval"]:
            jobs[cell] = entry
    tables = take("tables", manifest.get("tables"))
    if tables:
        manifest["tables"] = tables


def submit_locked(args, plan, slurm, journal):
    manifest_path = Path(args.manifest)
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"cells": {}}
    manifest["wanted"] = list(dict.fromkeys(manifest.get("wanted", []) + plan.wanted))
    journal.manifest = manifest
    try:
        before = json.dumps(manifest, sort_keys=True)
        adopt(args, plan, slurm, manifest)
        if json.dumps(manifest, sort_keys=True) != before:
            journal.write()
    except Refusal as err:  # a dry run shows the plan without the queue
        if not args.dry_run:
            raise
        print(f"submit_paper.py: warning: {err}; the plan does not count jobs of an interrupted submission",
              file=sys.stderr)
    train_job, submitted, waiting = {}, [], []
    submit_cells(args, slurm, plan, manifest["cells"], train_job, submitted, waiting, journal)
    # the tables job waits for every job of the cells; a rerun after a submission stopped before it queues it
    if submitted or (waiting and not slurm.live(manifest.get("tables"))):
        tables = [sys.executable, str(Path(__file__).resolve()), "--write-tables", "--manifest", str(manifest_path),
                  "--results", str(args.results), "--checkpoints", str(args.checkpoints),
                  "--paper-numbers", str(args.paper_numbers)]
        if args.dry_run:  # the printed script queues the jobs but writes no manifest: the cells on its line
            tables += plan.wanted
        manifest["tables"] = slurm.submit(
            job_args(args, "tables", shlex.split(args.tables), submitted + waiting, "afterany") +
            ["--wrap", shlex.join(tables)], {}, "--sbatch, --tables")
        journal.accepted(manifest["tables"])
        say(f"{comment(args)}tables: job {manifest['tables']} after {len(submitted) + len(waiting)} jobs -> "
            f"{shown(Path(args.results) / 'tables.md')}")
    else:
        say(f"{comment(args)}nothing to submit")
    if journal.queued and not args.dry_run:
        say(f"manifest: {shown(manifest_path)}")


def comment(args):
    """Narrative lines of a dry run are shell comments: its output runs as a script."""
    return "# " if args.dry_run else ""


def submit_cells(args, slurm, plan, jobs, train_job, submitted, waiting, journal):
    """Submits each cell's jobs that are neither finished nor queued; records each job in `jobs` (and the journal)
    once sbatch has accepted it."""
    c, evals = comment(args), plan.evals
    for cell in plan.order:
        todo = [t for t in evals.get(cell, []) if not result_file(args, cell, t).is_file()]
        old = jobs.get(cell, {})
        if cell in evals and not todo:
            say(f"{c}{cell}: done ({', '.join(shown(result_file(args, cell, t)) for t in evals[cell])})")
            continue
        if cell not in evals and training_finished(save_dir(args, cell)):
            say(f"{c}{cell}: trained (for its warm starts)")
            continue
        train = old.get("train") if old.get("train") and slurm.live(old["train"]) else None
        queued = {t: j for t, j in old.get("eval", {}).items() if t in todo and slurm.live(j)}
        entry, live = {"train": train, "eval": dict(queued)}, [train] * bool(train) + list(queued.values())
        if live:  # its missing evaluations (one sbatch refused, say) are still submitted below
            say(f"{c}{cell}: queued or running (jobs {', '.join(live)}): not submitted again")
            waiting += live
        if train:
            train_job[cell] = train
        env = {"SAVE_DIR": str(save_dir(args, cell)), "RESULTS_DIR": str(args.results)}
        if not live and training_finished(save_dir(args, cell)):
            say(f"{c}{cell}: trained; evaluating")
        elif not live:
            after, base = [], plan.bases.get(cell)
            if base:
                env.update(WARM_START_FROM=str(save_dir(args, base[0]) / "checkpoint_last.pt"),
                           WARM_START_LAYERS=base[1], WARM_START_ARGS=args.warm_args)
                after = [train_job[base[0]]] if base[0] in train_job else []
            say(f"{c}{cell}: training" + (f" after job {after[0]} ({base[0]})" if after else ""))
            options, flags = train_options(args, cell)
            entry["train"] = train_job[cell] = slurm.submit(
                job_args(args, f"train-{cell}", shlex.split(options), after) +
                ["scripts/train.sbatch", cell, *args.override], env, flags)
            jobs[cell] = entry
            submitted.append(entry["train"])
            journal.accepted(entry["train"])
        for testset in (t for t in todo if t not in queued):
            subset = ["--subset", "valid"] if testset == "newstest2013" else []
            say(f"{c}{cell}: evaluation on {testset}" + (f" after job {train}" if train else ""))
            entry["eval"][testset] = slurm.submit(
                job_args(args, f"eval-{cell}-{testset}", shlex.split(args.eval),
                                [entry["train"]] if entry["train"] else None) +
                ["--wrap", shlex.join(["bash", "scripts/evaluate.sh", cell, *subset, *shlex.split(args.eval_args)])],
                env, "--sbatch, --eval")
            jobs[cell] = entry
            submitted.append(entry["eval"][testset])
            journal.accepted(entry["eval"][testset])


def failure(slurm, job, what, args):
    """Why a job of a cell gave no result, or None when it did not fail."""
    info = slurm.info(job)
    state = info.get("JobState", "")
    if state == "COMPLETED":
        return None
    if not state:
        return f"{what} job {job}: no longer known to Slurm"
    if state == "CANCELLED" and info.get("Reason") == "DependencyNeverSatisfied":
        return "cancelled"
    log = Path(args.checkpoints) / f"slurm-{info.get('JobName', '?')}-{job}.out"
    return f"{what} job {job} {state} (exit {info.get('ExitCode', '?')}); log {shown(log)}"


def holes(args, paper_numbers, slurm, manifest):
    """{cell: why it has no result} for the cells asked for that have none."""
    jobs, notes = manifest["cells"], {}

    def training_failure(cell):
        entry = jobs.get(cell, {})
        why = failure(slurm, entry.get("train"), "training", args) if entry.get("train") else None
        base = warm_base(cell)
        if why == "cancelled" and base:
            return f"not started: {base[0]}, whose checkpoint it starts from, did not train ({training_failure(base[0])})"
        return why

    for cell in manifest.get("wanted", []):
        missing = [t for t in testsets_of(cell, paper_numbers) if not result_file(args, cell, t).is_file()]
        if not missing:
            continue
        entry = jobs.get(cell)
        if entry is None:
            notes[cell] = ("no job recorded (queued from a --dry-run's lines: see its logs "
                           f"{shown(Path(args.checkpoints) / f'slurm-*-{cell}*.out')})" if manifest.get("by_hand")
                           else "not submitted")
            continue
        why = training_failure(cell)
        if not why:
            whys = [failure(slurm, entry.get("eval", {}).get(t), f"evaluation on {t}", args) or
                    f"evaluation on {t} ended without {shown(result_file(args, cell, t))}" for t in missing]
            why = "; ".join(whys)
        notes[cell] = why
    return notes


def write_tables(args, paper_numbers, slurm):
    path = Path(args.manifest)
    # no manifest: the jobs were queued by a dry run's printed lines, which name the cells
    manifest = (json.loads(path.read_text()) if path.is_file() else
                {"cells": {}, "wanted": requested_cells(args.cells, paper_numbers), "by_hand": True})
    notes = holes(args, paper_numbers, slurm, manifest)
    out = Path(args.results) / "tables.md"
    write_text(out, make_tables.render(paper_numbers, args.results, notes))
    print(f"wrote {shown(out)}; {len(notes)} cell(s) without a result" + "".join(f"\n  {c}: {w}" for c, w in notes.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cells", nargs="*", default=["paper"], help="paper (default), newer, or WMT14 cell names")
    ap.add_argument("--train", default="", help="sbatch options of every training (nodes, GPUs, time)")
    ap.add_argument("--train-big", help="sbatch options of the big cells' trainings (default: --train's)")
    ap.add_argument("--eval", default="", help="sbatch options of every evaluation")
    ap.add_argument("--tables", default="--ntasks=1 --cpus-per-task=1",
                    help="sbatch options of the tables job, after --sbatch's (e.g. --partition=cpu: it needs no GPU; "
                         "default: %(default)s)")
    ap.add_argument("--sbatch", default="", help="sbatch options of every job (partition, account, qos)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override for every training (repeatable)")
    ap.add_argument("--warm-args", default="", help="options for every warm start's scripts/transformer_to_floater.py")
    ap.add_argument("--eval-args", default="", help="options for every scripts/evaluate.sh (e.g. \"--cpu\")")
    ap.add_argument("--checkpoints", default=str(REPO / "checkpoints"), help="where the cells' folders and logs go")
    ap.add_argument("--results", default=str(REPO / "results"), help="where the result JSON files and tables.md go")
    ap.add_argument("--paper-numbers", default=str(REPO / "results" / "paper_numbers.json"))
    ap.add_argument("--manifest", help="default: CHECKPOINTS/submit_paper.json")
    ap.add_argument("--dry-run", action="store_true", help="print the sbatch commands, submit nothing")
    ap.add_argument("--write-tables", action="store_true", help=argparse.SUPPRESS)  # the last job of a submission
    args = ap.parse_args()
    args.checkpoints, args.results = str(Path(args.checkpoints).resolve()), str(Path(args.results).resolve())
    args.paper_numbers = str(Path(args.paper_numbers).resolve())
    args.manifest = str(Path(args.manifest or Path(args.checkpoints) / "submit_paper.json").resolve())
    try:
        try:
            paper_numbers = json.loads(Path(args.paper_numbers).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise Refusal(f"--paper-numbers {args.paper_numbers}: {err}")
        slurm = Slurm(REPO, args.dry_run)
        if args.write_tables:
            write_tables(args, paper_numbers, slurm)
        else:
            submit(args, paper_numbers, slurm)
    except Refusal as err:
        sys.exit(f"submit_paper.py: {err}")
    except Stopped as stop:  # every job queued so far is in the manifest: the rerun queues the rest, none twice
        try:
            print(f"submit_paper.py: stopped by {stop} after queueing what {shown(args.manifest)} records; rerun the "
                  "same command to queue the rest", file=sys.stderr)
        except OSError:
            pass
        sys.exit(128 + stop.signum)


if __name__ == "__main__":
    main()
