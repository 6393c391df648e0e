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
that ended ("done training" after the last start in its train.log) is not run again, only its evaluation. A job
enters the manifest once sbatch has accepted it. Two submissions to one manifest at once: the second waits until
the first has written its manifest (a lock beside it, submit_paper.json.lock), then submits only what is still
missing. Before any job is queued, each cell's data folder must exist (the config's task.data, or --override
task.data=DIR; scripts/prepare_wmt14.sh makes it), and so must an evaluation's (--data-dir in --eval-args, else the
folder above the training's). Logs: CHECKPOINTS/slurm-<job name>-<job id>.out. --dry-run prints the sbatch
commands with the environment the jobs read (SAVE_DIR, WARM_START_FROM, ...), each line one a shell runs as it is,
and submits nothing. Verified on a one-node Slurm 22.05 (tests/test_submit_paper.py: CPU jobs, tiny models).
"""
import argparse
import errno
import fcntl
import json
import os
import shlex
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tables  # noqa: E402
from tooling import cells  # noqa: E402
from tooling.atomic import write_text  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
        "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}
TESTSETS = ("newstest2014", "newstest2013")


class Refusal(Exception):
    """Bad input: one line, no traceback."""


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


class Slurm:
    """sbatch and the job states, through Slurm's own clients."""

    def __init__(self, dry_run=False):
        self.dry_run, self.fake_ids = dry_run, 0

    def run(self, *args, check=True, env=None, what=None):
        try:
            proc = subprocess.run(list(args), capture_output=True, text=True, env={**os.environ, **(env or {})},
                                  cwd=REPO)
        except FileNotFoundError:
            raise Refusal(f"{args[0]}: not found (run this on a Slurm login node, or use --dry-run)")
        if check and proc.returncode != 0:
            raise Refusal(f"{what or args[0] + ' failed'}: {one_line(args[0], proc.stderr or proc.stdout)}")
        return proc

    def submit(self, args, env, options):
        """The job id; `options` names the flags its sbatch options came from (for the message of a refusal)."""
        print("  " + "".join(f"{k}={shlex.quote(v)} " for k, v in env.items()) + "sbatch " + shlex.join(args))
        if self.dry_run:
            self.fake_ids += 1
            return f"dry{self.fake_ids}"
        name = args[args.index("--job-name") + 1]
        return self.run("sbatch", "--parsable", *args, env=env,
                        what=f"sbatch refused {name} (its options: {options})").stdout.strip().split(";")[0]

    def info(self, job):
        """{'JobState': ..., 'ExitCode': ..., 'Reason': ...}, or {} when Slurm no longer knows the job."""
        if not job or job.startswith("dry"):
            return {}
        out = self.run("scontrol", "show", "job", "-o", job, check=False).stdout
        fields = dict(part.split("=", 1) for part in out.split() if "=" in part)
        if fields.get("JobState"):
            return fields
        try:  # a finished job scontrol has forgotten (after MinJobAge): Slurm's accounting, where the cluster keeps it
            acct = self.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode", check=False).stdout.split()
        except Refusal:  # no sacct here
            return {}
        if acct and "|" in acct[0]:
            state, code = acct[0].split("|", 1)
            return {"JobState": state.split()[0], "ExitCode": code}
        return {}

    def live(self, job):
        return self.info(job).get("JobState") in LIVE


def one_line(tool, text):
    """A Slurm client's error lines as one: its 'sbatch: error: ' prefixes dropped, the lines joined by '; '."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    lines = [line for line in lines if line.startswith(f"{tool}: fatal: ")] or lines  # the cause, where named
    for prefix in (f"{tool}: error: ", f"{tool}: fatal: ", f"{tool}: "):
        lines = [line[len(prefix):] if line.startswith(prefix) else line for line in lines]
    return "; ".join(dict.fromkeys(lines)) or "no message"


@contextmanager
def manifest_lock(manifest_path):
    """Held while a submission reads, submits and writes the manifest: a second submission waits here, then sees
    the first one's jobs as queued. POSIX record locks (lockf): NFS and Lustre clients honour them across nodes."""
    lock_path = Path(f"{manifest_path}.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as lock:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EACCES, errno.EAGAIN):
                raise Refusal(f"--manifest {shown(manifest_path)}: cannot lock {shown(lock_path)} ({err.strerror}); "
                              "put the manifest on a file system with locks")
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            print(f"waiting for the submission running on {shown(manifest_path)} ({holder})", flush=True)
            fcntl.lockf(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(f"submit_paper.py, pid {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        yield


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


def submit(args, paper_numbers, slurm):
    if args.dry_run:
        return submit_locked(args, paper_numbers, slurm)
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # sbatch would retry it for a minute, then fail
        raise Refusal(f"SLURM_CONF={conf}: no such file (point it at the cluster's slurm.conf, or unset it)")
    with manifest_lock(args.manifest):
        return submit_locked(args, paper_numbers, slurm)


def submit_locked(args, paper_numbers, slurm):
    wanted = requested_cells(args.cells, paper_numbers)
    manifest_path = Path(args.manifest)
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"cells": {}}
    jobs = manifest["cells"]
    evals = {c: testsets_of(c, paper_numbers) for c in wanted}
    bases = {c: warm_base(c) for c in wanted}
    # the Transformers the warm starts need come first (a warm start depends on their job), evaluated when asked for
    order = [b[0] for b in bases.values() if b] + wanted
    order = list(dict.fromkeys(order))
    for cell in order:  # every cell checked before the first job is queued: nothing half-submitted
        done = (all(result_file(args, cell, t).is_file() for t in evals[cell]) if cell in evals
                else training_finished(save_dir(args, cell)))
        if not done:
            why = data_refusal(args, cell, evaluated=cell in evals)
            if why:
                raise Refusal(why)
    train_job, submitted, waiting = {}, [], []
    if not args.dry_run:  # Slurm opens each job's --output there and fails the job if the folder is missing
        Path(args.checkpoints).mkdir(parents=True, exist_ok=True)
    try:
        submit_cells(args, slurm, order, evals, bases, jobs, train_job, submitted, waiting)
        manifest["wanted"] = list(dict.fromkeys(manifest.get("wanted", []) + wanted))
        if submitted:
            tables = [sys.executable, str(Path(__file__).resolve()), "--write-tables", "--manifest", str(manifest_path),
                      "--results", str(args.results), "--checkpoints", str(args.checkpoints),
                      "--paper-numbers", str(args.paper_numbers)]
            manifest["tables"] = slurm.submit(
                job_args(args, "tables", shlex.split(args.tables), submitted + waiting, "afterany") +
                ["--wrap", shlex.join(tables)], {}, "--sbatch, --tables")
            print(f"tables: job {manifest['tables']} after {len(submitted) + len(waiting)} jobs -> "
                  f"{shown(Path(args.results) / 'tables.md')}")
        else:
            print("nothing to submit")
    finally:  # what was submitted is recorded even when a later sbatch failed, so a rerun does not submit it twice
        if not args.dry_run and submitted:
            write_text(manifest_path, json.dumps(manifest, indent=1) + "\n")
            print(f"manifest: {shown(manifest_path)}")


def submit_cells(args, slurm, order, evals, bases, jobs, train_job, submitted, waiting):
    """Submits each cell's jobs that are neither finished nor queued; records each job in `jobs` once sbatch has
    accepted it."""
    for cell in order:
        todo = [t for t in evals.get(cell, []) if not result_file(args, cell, t).is_file()]
        old = jobs.get(cell, {})
        if cell in evals and not todo:
            print(f"{cell}: done ({', '.join(shown(result_file(args, cell, t)) for t in evals[cell])})")
            continue
        if cell not in evals and training_finished(save_dir(args, cell)):
            print(f"{cell}: trained (for its warm starts)")
            continue
        train = old.get("train") if old.get("train") and slurm.live(old["train"]) else None
        queued = {t: j for t, j in old.get("eval", {}).items() if t in todo and slurm.live(j)}
        entry, live = {"train": train, "eval": dict(queued)}, [train] * bool(train) + list(queued.values())
        if live:  # its missing evaluations (one sbatch refused, say) are still submitted below
            print(f"{cell}: queued or running (jobs {', '.join(live)}): not submitted again")
            waiting += live
        if train:
            train_job[cell] = train
        env = {"SAVE_DIR": str(save_dir(args, cell)), "RESULTS_DIR": str(args.results)}
        if not live and training_finished(save_dir(args, cell)):
            print(f"{cell}: trained; evaluating")
        elif not live:
            after, base = [], bases.get(cell)
            if base:
                env.update(WARM_START_FROM=str(save_dir(args, base[0]) / "checkpoint_last.pt"),
                           WARM_START_LAYERS=base[1], WARM_START_ARGS=args.warm_args)
                after = [train_job[base[0]]] if base[0] in train_job else []
            print(f"{cell}: training" + (f" after job {after[0]} ({base[0]})" if after else ""))
            options, flags = train_options(args, cell)
            entry["train"] = train_job[cell] = slurm.submit(
                job_args(args, f"train-{cell}", shlex.split(options), after) +
                ["scripts/train.sbatch", cell, *args.override], env, flags)
            jobs[cell] = entry
            submitted.append(entry["train"])
        for testset in (t for t in todo if t not in queued):
            subset = ["--subset", "valid"] if testset == "newstest2013" else []
            print(f"{cell}: evaluation on {testset}" + (f" after job {train}" if train else ""))
            entry["eval"][testset] = slurm.submit(
                job_args(args, f"eval-{cell}-{testset}", shlex.split(args.eval), [entry["train"]] if entry["train"] else None) +
                ["--wrap", shlex.join(["bash", "scripts/evaluate.sh", cell, *subset, *shlex.split(args.eval_args)])],
                env, "--sbatch, --eval")
            jobs[cell] = entry
            submitted.append(entry["eval"][testset])


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
            notes[cell] = "not submitted"
            continue
        why = training_failure(cell)
        if not why:
            whys = [failure(slurm, entry.get("eval", {}).get(t), f"evaluation on {t}", args) or
                    f"evaluation on {t} ended without {shown(result_file(args, cell, t))}" for t in missing]
            why = "; ".join(whys)
        notes[cell] = why
    return notes


def write_tables(args, paper_numbers, slurm):
    manifest = json.loads(Path(args.manifest).read_text())
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
    args.manifest = str(Path(args.manifest or Path(args.checkpoints) / "submit_paper.json").resolve())
    try:
        try:
            paper_numbers = json.loads(Path(args.paper_numbers).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise Refusal(f"--paper-numbers {args.paper_numbers}: {err}")
        slurm = Slurm(args.dry_run)
        if args.write_tables:
            write_tables(args, paper_numbers, slurm)
        else:
            submit(args, paper_numbers, slurm)
    except Refusal as err:
        sys.exit(f"submit_paper.py: {err}")


if __name__ == "__main__":
    main()
