"""The GPU check's section users_path (scripts/gpu/gpu_check.py): the path a user takes for the papers' tables, end to end on a
stand-in corpus, with each WMT14 cell's own precision, max-tokens and update-freq.

    1. a stand-in for prepare_wmt14.sh's En-De output (tooling.gpu.wmt14_stand_in: newstest2014's lengths, made-up
       words, a 32,768-word vocabulary as the recipe's, binarized by prepare_bitext.sh)
    2. scripts/train.sh wmt14_en_de_base_<scheme> for 2 epochs of it (a handful of updates), one scheme after
       the other so that each has the GPU to itself: tokens/s is fairseq's own wps of the last epoch
    3. scripts/evaluate.sh for every scheme at once (the last 2 epochs averaged where the cell averages epochs,
       as only 2 exist), then scripts/make_tables.py on the results they wrote

Everything is written in the section's work folder (SAVE_DIR, RESULTS_DIR), never checkpoints/ or results/. The
BLEU of a few updates on made-up words is meaningless: the section shows that the path runs and how fast it
trains. The dry run takes the same steps on CPU (CPU=1) with the smallest model and corpus.

    section_users_path(ctx, rows)    rows: corpus, one per step (train, evaluate) and scheme, tables
    train_stats(log)                 updates, wps, precision, max-tokens and update-freq from a train.log
    ran_rows(tables_md)              the tables' rows that hold a result of ours
"""
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tooling.gpu import wmt14_stand_in
from tooling.atomic import write_text
from tooling.gpu.common import (REPO, USERS_CORPUS, USERS_DRY_CORPUS, USERS_DRY_SCHEMES, USERS_SCHEMES, last_line,
                                log)

CELL = "wmt14_en_de_base_{}"
EPOCHS = 2  # epoch checkpoints for evaluate.sh to average; the second epoch's wps is past the first's warm-up
# CPU only: base dims cannot train on CPU in the dry run's time (nor in fp16 at all: train.sh turns it off)
TINY = ["++model.encoder_layers=1", "++model.decoder_layers=1", "++model.encoder_embed_dim=16",
        "++model.decoder_embed_dim=16", "++model.encoder_ffn_embed_dim=32", "++model.decoder_ffn_embed_dim=32",
        "++model.encoder_attention_heads=2", "++model.decoder_attention_heads=2", "dataset.num_workers=0"]


def train_stats(text):
    """What fairseq-train's log says of the run: the cell's precision, max-tokens and update-freq as trained
    (its config dump) and, from the last epoch's summary, updates so far, target tokens per second (wps), target
    tokens per update (wpb)."""
    def first(pattern, cast=str):
        m = re.search(pattern, text)
        return cast(m.group(1)) if m else None

    # the train summary at each epoch's end, "epoch 002 | loss ... | wps ... | ups ... | wpb ... | num_updates ..."
    epochs = re.findall(r"\bepoch (\d+) \| loss [^\n]*?\| wps ([0-9.]+) \| ups [0-9.]+ \| wpb ([0-9.]+) \|"
                        r"[^\n]*?\| num_updates (\d+)", text)
    last = epochs[-1] if epochs else None
    precision = "fp16" if first(r"'fp16': (\w+)") == "True" else "bf16" if first(r"'bf16': (\w+)") == "True" \
        else "amp" if first(r"'amp': (\w+)") == "True" else "fp32"
    return {"precision": precision, "max_tokens": first(r"'max_tokens': (\d+)", int),
            "update_freq": first(r"'update_freq': \[(\d+)\]", int), "epochs": len(epochs),
            "updates": int(last[3]) if last else None, "tokens_per_s": float(last[1]) if last else None,
            "tokens_per_update": float(last[2]) if last else None}


OURS = re.compile(r"-?\d+\.\d\d \(")  # make_tables.py's cell with a result: "27.31 (27.9, -0.59)"


def ran_rows(text):
    """[(table title, header line, [rows holding a result of ours])] of make_tables.py's output, tables with
    none left out ("not run (paper)" is every other cell)."""
    out, title, header = [], None, None
    for line in text.splitlines():
        if line.startswith("## "):
            title, header = line[3:], None
        elif line.startswith("|") and title:
            if header is None:
                header = line
                out.append((title, header, []))
            elif not line.startswith("|---"):
                if any(OURS.match(c.strip()) for c in line.strip("|").split("|")):
                    out[-1][2].append(line)
    return [t for t in out if t[2]]


def step(cmd, env, log_path):
    """(exit status, seconds, last line of its output) of one of the users' commands, its output to log_path; the
    line names the section's work folder WORK (no machine's paths in the report)."""
    started = time.monotonic()
    with open(log_path, "w") as f:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    line = last_line(log_path.read_text(errors="replace")).replace(str(log_path.parent), "WORK")
    return rc, round(time.monotonic() - started, 1), line.replace(str(REPO), ".")


def section_users_path(ctx, rows):
    schemes, sizes = (USERS_DRY_SCHEMES, USERS_DRY_CORPUS) if ctx.dry_run else (USERS_SCHEMES, USERS_CORPUS)
    work = ctx.work
    corpus, results = work / "wmt14_en_de", work / "results"
    started = time.monotonic()
    entries = wmt14_stand_in.write_stand_in(corpus, sizes["sentences"], sizes["vocab"], seed=1,
                                            workers=2 if ctx.dry_run else 8)
    rows.add("corpus", **sizes["sentences"], dictionary=entries, seconds=round(time.monotonic() - started, 1))
    log(f"users_path: stand-in corpus {sizes['sentences']}, {entries} dictionary entries")
    env = {**os.environ, "RESULTS_DIR": str(results), **({"CPU": "1"} if ctx.dry_run else {})}
    overrides = [f"task.data={corpus / 'bin'}", f"optimization.max_epoch={EPOCHS}", *(TINY if ctx.dry_run else [])]
    trained = []
    for scheme in schemes:  # one at a time: each has the GPU to itself while timed
        save = work / "checkpoints" / scheme
        rc, seconds, last = step(["bash", "scripts/train.sh", CELL.format(scheme), *overrides],
                                 {**env, "SAVE_DIR": str(save)}, work / f"train.{scheme}.out")
        stats = train_stats((save / "train.log").read_text(errors="replace")) if (save / "train.log").exists() \
            else {}
        rows.add("step", scheme=scheme, step="train.sh", rc=rc, seconds=seconds, **stats,
                 error=None if rc == 0 else last)
        log(f"users_path: train.sh {scheme}: exit {rc}, {seconds} s, {stats}")
        if rc == 0:
            trained.append(scheme)

    def evaluate(scheme):
        save = work / "checkpoints" / scheme
        cmd = ["bash", "scripts/evaluate.sh", CELL.format(scheme), "--data-dir", str(corpus), "--num-checkpoints",
               str(EPOCHS), *(["--cpu"] if ctx.dry_run else [])]
        return scheme, step(cmd, {**env, "SAVE_DIR": str(save)}, work / f"evaluate.{scheme}.out")

    with ThreadPoolExecutor(max_workers=2 if ctx.dry_run else len(schemes)) as pool:  # decoding is not timed
        for scheme, (rc, seconds, last) in pool.map(evaluate, trained):
            result = results / f"{CELL.format(scheme)}.json"
            fields = {}
            if rc == 0 and result.exists():
                r = json.loads(result.read_text())
                fields = {"bleu": r.get("bleu_tokenized"), "sentences": r.get("sentences"),
                          "checkpoints": r.get("checkpoints_averaged", "").rsplit("/", 1)[-1]}
            rows.add("step", scheme=scheme, step="evaluate.sh", rc=rc, seconds=seconds, **fields,
                     error=None if rc == 0 else last)
            log(f"users_path: evaluate.sh {scheme}: exit {rc}, {seconds} s, {fields}")
    tables = results / "tables.md"
    rc, seconds, last = step([sys.executable, "scripts/make_tables.py", "--results", str(results),
                              "--out", str(tables)], env, work / "make_tables.out")
    ran = ran_rows(tables.read_text()) if rc == 0 and tables.exists() else []
    if ran:  # the whole of it beside the report
        write_text(ctx.out_dir / "gpu_check_users_tables.md", tables.read_text())
    rows.add("tables", rc=rc, seconds=seconds, tables=[{"title": t, "header": h, "rows": r} for t, h, r in ran],
             error=None if rc == 0 else last)
