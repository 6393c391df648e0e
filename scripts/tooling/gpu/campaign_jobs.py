"""The converged Multi30k campaign (scripts/gpu/campaign.py): which runs, in which order, how many side by side on one
GPU, what a call brings back and what the repository records of it.

    manifest = load_manifest(path)          # results/multi30k_gpu/manifest.json: every run, done or left, in order
    jobs = next_jobs(manifest)              # the runs left, as jobs: one recipe process each
    plan_call(jobs, tables, budget_s, ...)  # the level (with or without MPS) that finishes the most runs, and when
    pack(files, out_dir)                    # archives of at most ARCHIVE_MIB each, at most MAX_ARCHIVES of them
    check_archives(report, manifest, dir)   # what a call brought back, before anything is written here
    record(manifest, report, lease)         # the manifest after a call: its finished runs done, the lease's figures

A job is a list of runs trained by one scripts/study/multi30k_study.sh process: a run, or a transformer seed with
its fine-tunes (FLOATER by its paper's warm start and the control), which continue that seed's checkpoint and so
must run in the same call (nothing on the device survives it).
"""
import gzip
import json
import os
import tarfile
import time

from tooling.atomic import write_atomic, write_json, write_text
from tooling.paths import REPO

# The literature's recipe (Wu, Kong & Kao 2021: 8,000 updates of 4,096 tokens, ~130 per epoch of Multi30k), the
# study's recipe otherwise (scripts/study/multi30k_study.sh); a fine-tune is FT_EPOCHS more epochs.
RECIPE = {"EPOCHS": "62", "WARMUP": "2000", "AVG": "10"}
UPDATES_PER_EPOCH = 130
LITERATURE_BLEU = 41.0  # tokenized lowercased BLEU of the tiny Transformer on test_2016_flickr
SEEDS = (1, 2, 3)
FINE_TUNES = ("floater_warm", "transformer_ft")
FIRST = ("transformer", "relative", "floater", *FINE_TUNES, "rope", "t5", "alibi", "kerple", "fire")
# condition -> (the recipe's variables, the results' folder under the campaign's, with fine-tunes?)
CONDITIONS = {"default": ({}, "", True),
              "tok32_joined": ({"MAX_TRAIN_TOKENS": "32", "JOIN_TRAIN": "1"}, "tok32_joined", False)}
LEVELS = (1, 4, 8, 12, 16)  # runs side by side at which the first lease measures the throughput
MAX_FILES, ARCHIVE_MIB = 8, 15.5  # what comes back from a call: 8 files of at most 16 MiB (a margin kept)
MAX_ARCHIVES = MAX_FILES - 2  # campaign.json and campaign.md beside them


class CampaignError(Exception):
    """A bad input or a refused step: one line, printed without a traceback."""


def order(models):
    """The table's models in the campaign's order: FIRST, then the rest of the table as it lists them."""
    return [m for m in FIRST if m in models or m in FINE_TUNES] + [m for m in models if m not in FIRST]


def all_runs(models):
    """Every run of the campaign in order: each model's seeds 1-3 before the next model's; the default condition
    first, then the train-short probe's (no fine-tunes there)."""
    runs = []
    for condition, (_, _, fine_tunes) in CONDITIONS.items():
        for m in order(models):
            if m in FINE_TUNES and not fine_tunes:
                continue
            runs += [{"run": f"{m}.seed{s}", "model": m, "seed": s, "condition": condition, "status": "left"}
                     for s in SEEDS]
    return runs


def key(run):
    return run["condition"], run["run"]


def sync(manifest, models):
    """The manifest's runs in the campaign's order for today's table: runs it lacks added as left, its records
    kept (a run of a model no longer in the table stays, at the end)."""
    known = {key(r): r for r in manifest.get("runs", [])}
    runs = [known.pop(key(r), r) for r in all_runs(models)]
    manifest["runs"] = runs + list(known.values())
    manifest.setdefault("recipe", dict(RECIPE))
    manifest.setdefault("leases", [])
    return manifest


def load_manifest(path, models):
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        manifest = {}
    except ValueError as err:
        raise CampaignError(f"{path}: not a campaign manifest ({err})") from None
    return sync(manifest, models)


def next_jobs(manifest):
    """The runs left, grouped into jobs in the manifest's order: a transformer seed's fine-tunes join that seed's
    transformer job (its checkpoint is made in the same call); fine-tunes whose transformer is done form a job that
    trains it again (the recipe records that retraining beside the run it repeats)."""
    jobs, by_key = [], {}
    for r in manifest["runs"]:
        if r["status"] == "done":
            continue
        base = "transformer" if r["model"] in FINE_TUNES else r["model"]
        k = (r["condition"], base, r["seed"])
        if k not in by_key:
            by_key[k] = {"condition": r["condition"], "seed": r["seed"], "runs": []}
            jobs.append(by_key[k])
        by_key[k]["runs"].append(r["run"])
    for job in jobs:
        models = [name.split(".seed")[0] for name in job["runs"]]
        if any(m in FINE_TUNES for m in models) and "transformer" not in models:
            models.insert(0, "transformer")  # trained again: its checkpoint is not here
        job["models"] = models
        job["name"] = f"{job['condition']}:{'+'.join(models)}.seed{job['seed']}"
    return jobs


def study_model_args():
    """The study's model dimensions: the default MODEL_ARGS of scripts/study/multi30k_study.sh, as one string
    (what the campaign's probe and the speed check train)."""
    text = (REPO / "scripts" / "study" / "multi30k_study.sh").read_text()
    start = text.index('MODEL_ARGS=${MODEL_ARGS:-"') + len('MODEL_ARGS=${MODEL_ARGS:-"')
    return text[start:text.index('"}', start)].replace("\\\n", "")


def job_updates(job, recipe):
    """The job's updates: each run from scratch the recipe's epochs, each fine-tune FT_EPOCHS (default 3)."""
    epochs = int(recipe["EPOCHS"])
    ft = int(recipe.get("FT_EPOCHS", 3))
    return sum((ft if m in FINE_TUNES else epochs) * UPDATES_PER_EPOCH for m in job["models"])


def job_seconds(job, recipe, per_run_rate, eval_s):
    """Predicted wall time of a job with `per_run_rate` updates/s: its updates, and eval_s per run for averaging,
    decoding, the length probe and scoring."""
    return job_updates(job, recipe) / per_run_rate + eval_s * len(job["models"])


def schedule(jobs, level, per_run_rate, seconds_left, recipe, eval_s):
    """The jobs in order on `level` slots, each to the slot free first, as the call starts them: ([(job, start_s,
    end_s)], the jobs left). A job that would not finish (with its evaluation) within `seconds_left` is not started,
    nor any after it (in order: the next call takes them), so no run is left unfinished."""
    slots, planned = [0.0] * level, []
    for i, job in enumerate(jobs):
        slot = min(range(level), key=slots.__getitem__)
        end = slots[slot] + job_seconds(job, recipe, per_run_rate, eval_s)
        if end > seconds_left:
            return planned, jobs[i:]
        planned.append((job, slots[slot], end))
        slots[slot] = end
    return planned, []


def plan_call(jobs, tables, seconds_left, recipe, eval_s, most=None):
    """The call's plan from measured rates. tables: {name ("without MPS", "with MPS"): {level: total updates/s}}.
    Of every (table, level), the one whose schedule finishes the most runs (ties: the higher total updates/s):
    a dict with name, level, per_run_rate, planned [(job, start_s, end_s)] and left; None if no job fits."""
    best = None
    for name, measured in tables.items():
        for level, rate in (measured or {}).items():
            if rate <= 0 or (most is not None and level > most):
                continue
            planned, left = schedule(jobs, level, rate / level, seconds_left, recipe, eval_s)
            runs = sum(len(job["runs"]) for job, _, _ in planned)
            key = (runs, rate)
            if planned and (best is None or key > best["key"]):
                best = {"key": key, "name": name, "level": level, "per_run_rate": rate / level, "planned": planned,
                        "left": left, "runs": runs}
    return best


# -- what comes back from a call ------------------------------------------------------------------------------

def run_files(name, condition_dir, out_dir, ckpt_root):
    """(path here, name in the archive) of one run's files that exist: its result, hypotheses, probe, source
    dependence (and a retraining's), its training log and retraining note."""
    runs = os.path.join(out_dir, "runs")
    found = []
    for f in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
        if f.startswith(name + "."):
            found.append((os.path.join(runs, f), f"{condition_dir}runs/{f}"))
    dep = os.path.join(out_dir, "source_dependence", f"{name}.json")
    if os.path.isfile(dep):
        found.append((dep, f"{condition_dir}source_dependence/{name}.json"))
    for f in ("train.log", "retrain.txt"):
        p = os.path.join(ckpt_root, name, f)
        if os.path.isfile(p):
            found.append((p, f"{condition_dir}logs/{name}.{f}"))
    return found


def pack(files, out_dir):
    """Archives runs_K.tar.gz in out_dir holding `files` [(path, arcname)], each at most ARCHIVE_MIB compressed,
    at most MAX_ARCHIVES: the archives' names. A file is whole in one archive; what does not fit is an error."""
    limit = int(ARCHIVE_MIB * 2**20)
    archives, current, size = [], [], 0
    for path, arc in files:
        blob = compressed_size(path)
        if blob > limit:
            raise CampaignError(f"{path}: {blob / 2**20:.1f} MiB compressed, over the {ARCHIVE_MIB} MiB of an archive")
        if current and size + blob > limit:
            archives.append(current)
            current, size = [], 0
        current.append((path, arc))
        size += blob
    if current:
        archives.append(current)
    if len(archives) > MAX_ARCHIVES:
        raise CampaignError(f"{len(archives)} archives needed, {MAX_ARCHIVES} may come back")
    names = []
    for i, members in enumerate(archives, 1):
        name = f"runs_{i}.tar.gz"
        tmp = os.path.join(out_dir, f".{name}.tmp")
        with tarfile.open(tmp, "w:gz") as tar:
            for path, arc in members:
                tar.add(path, arcname=arc, filter=anonymous)
        os.replace(tmp, os.path.join(out_dir, name))
        names.append(name)
    return names


def anonymous(info):
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def compressed_size(path):
    with open(path, "rb") as f:
        return len(gzip.compress(f.read(), compresslevel=6)) + 1024


def members(out_dir, archives):
    """{archive member name: archive} over a call's archives."""
    found = {}
    for a in archives:
        try:
            with tarfile.open(os.path.join(out_dir, a), "r:gz") as tar:
                for m in tar.getmembers():
                    if not m.isfile() or m.name.startswith("/") or ".." in m.name.split("/"):
                        raise CampaignError(f"{a}: unexpected member {m.name!r}")
                    found[m.name] = a
        except (OSError, tarfile.TarError) as err:
            raise CampaignError(f"{os.path.join(out_dir, a)}: not a readable archive ({err})") from None
    return found


def expected_members(run, probe):
    prefix = CONDITIONS[run["condition"]][1]
    prefix = f"{prefix}/" if prefix else ""
    names = [f"{prefix}runs/{run['run']}.json", f"{prefix}runs/{run['run']}.hyp", f"{prefix}logs/{run['run']}.train.log"]
    if probe:
        names.append(f"{prefix}runs/{run['run']}.probe.json")
    return names


def check_archives(report, manifest, out_dir):
    """The finished runs of a call's report, each checked before anything is written: in the manifest and not done
    already (a finished run taken again), every file it needs in the archives. Returns (runs, {member: archive})."""
    found = members(out_dir, report["archives"])
    index = {key(r): r for r in manifest["runs"]}
    finished = []
    for row in report["runs"]:
        if row["status"] != "finished":
            continue
        run = index.get((row["condition"], row["run"]))
        if run is None:
            raise CampaignError(f"{row['run']} ({row['condition']}): not a run of the manifest")
        if run["status"] == "done":
            raise CampaignError(f"{row['run']} ({row['condition']}): finished again, but the manifest has it done "
                                f"(lease {run.get('lease')}): a finished run was taken again")
        missing = [m for m in expected_members(run, report.get("probe", True)) if m not in found]
        if missing:
            raise CampaignError(f"{row['run']} ({row['condition']}): reported finished but missing from the "
                                f"archives: {', '.join(missing)}")
        finished.append((run, row))
    return finished, found


def extract(out_dir, found, results):
    """Every archive member into `results` (logs gzipped), each written atomically."""
    by_archive = {}
    for name, a in found.items():
        by_archive.setdefault(a, []).append(name)
    for a, names in by_archive.items():
        with tarfile.open(os.path.join(out_dir, a), "r:gz") as tar:
            for name in names:
                data = tar.extractfile(name).read()
                dest = os.path.join(results, name)
                if "/logs/" in f"/{name}":
                    dest += ".gz"
                    data = gzip.compress(data, mtime=0)
                write_atomic(dest, data)


def record(manifest, finished, report, lease):
    """The manifest with a call's finished runs done (commit, machine, lease, wall time) and the lease's figures."""
    for run, row in finished:
        run.update(status="done", lease=lease, code=report["code"], machine=report["machine"],
                   wall_s=row.get("wall_s"), bleu_tok_lc=row.get("bleu_tok_lc"))
    manifest["leases"].append({
        "lease": lease, "code": report["code"], "machine": report["machine"], "dry_run": report["dry_run"],
        "measured_updates_per_s": report.get("measured"), "measured_mps_updates_per_s": report.get("measured_mps"),
        "mps": report.get("mps"), "concurrency": report.get("concurrency"),
        "why": report.get("why"), "wall_s": report.get("wall_s"), "finished": len(finished),
        "eval_s_median": median([row["eval_s"] for _, row in finished if row.get("eval_s") is not None]),
        "recorded": time.strftime("%Y-%m-%d", time.gmtime())})
    return manifest


def eval_before(manifest):
    """The median seconds a run took besides training (averaging, decoding, probe) at the last lease that
    measured them (not a dry run's), or None."""
    for lease in reversed(manifest["leases"]):
        if lease.get("eval_s_median") and not lease.get("dry_run"):
            return lease["eval_s_median"]
    return None


def measured_before(manifest, key="measured_updates_per_s"):
    """The last lease's measured {level: updates/s} (not a dry run's), or None; key "measured_mps_updates_per_s":
    those measured with CUDA MPS."""
    for lease in reversed(manifest["leases"]):
        if lease.get(key) and not lease.get("dry_run"):
            return {int(k): v for k, v in lease[key].items()}
    return None


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def write_manifest(path, manifest):
    write_json(path, manifest, indent=1)
    write_text(os.path.splitext(path)[0] + ".md", manifest_markdown(manifest))


def manifest_markdown(manifest):
    runs = manifest["runs"]
    done = [r for r in runs if r["status"] == "done"]
    lines = ["# The GPU campaign's manifest", "",
             f"Generated by `scripts/gpu/campaign.py` from `manifest.json`. {len(done)} of {len(runs)} runs done; "
             f"recipe {' '.join(f'{k}={v}' for k, v in manifest['recipe'].items())} (the rest as "
             "scripts/study/multi30k_study.sh). A call takes the runs left in this order.", "",
             "| lease | code | machine | side by side | runs finished | wall s |", "|---|---|---|---:|---:|---:|"]
    for lease in manifest["leases"]:
        lines.append(f"| {lease['lease']} | {lease['code']} | {lease['machine']} | {lease.get('concurrency') or '—'} "
                     f"| {lease['finished']} | {lease.get('wall_s') or '—'} |")
    lines += ["", "| condition | run | status | lease | BLEU tok-lc | wall s |", "|---|---|---|---|---:|---:|"]
    for r in runs:
        bleu = r.get("bleu_tok_lc")
        lines.append(f"| {r['condition']} | {r['run']} | {r['status']} | {r.get('lease', '')} | "
                     f"{'' if bleu is None else f'{bleu:.2f}'} | {r.get('wall_s') or ''} |")
    return "\n".join(lines) + "\n"


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def log_tail(path, n=3):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return " / ".join(line.strip() for line in f.readlines()[-n:])
    except OSError:
        return ""
