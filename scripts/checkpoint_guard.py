#!/usr/bin/env python3
"""Before a (re)start: resume from the newest intact checkpoint of SAVE_DIR, and say which.

    scripts/checkpoint_guard.py SAVE_DIR

fairseq resumes from SAVE_DIR/checkpoint_last.pt, and starts from update 0 when that file is missing. It writes
the first checkpoint of a save atomically (a .tmp file, then a rename) but makes the others, checkpoint_last.pt
among them, by plain copies: a job killed during that copy (a preemption, a time limit) leaves a truncated
checkpoint_last.pt. A torch checkpoint is a zip archive, whose central directory is written last, so a truncated
one is not a readable zip.

The order: checkpoint_last.pt; then the epoch and update checkpoints (checkpointE.pt, checkpoint_E_U.pt), newest
first; then checkpoint_best.pt (and --keep-best-checkpoints' files). A damaged checkpoint_last.pt is moved aside
(checkpoint_last.pt.damaged); a missing or damaged one is replaced (copy to a temporary name, then rename) by the
first intact checkpoint in that order. Prints which checkpoint the run resumes from, or that the directory has
none (a first start). Checkpoints present but none intact: exit status 1 and one line, never a silent restart.
"""
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

from tooling.atomic import write_atomic


def intact(path):
    try:
        with zipfile.ZipFile(path) as archive:
            return bool(archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def progress_key(path):
    """Newest first: by (epoch, updates) parsed from fairseq's names, then by modification time."""
    m = re.fullmatch(r"checkpoint(\d+)\.pt|checkpoint_(\d+)_(\d+)\.pt", path.name)
    if not m:
        return (-1, -1, path.stat().st_mtime)
    if m.group(1):
        return (int(m.group(1)), -1, path.stat().st_mtime)
    return (int(m.group(2)), int(m.group(3)), path.stat().st_mtime)


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} SAVE_DIR")
    save = Path(sys.argv[1])
    last = save / "checkpoint_last.pt"
    if intact(last):
        print(f"checkpoint_guard: resuming from {last}")
        return
    damaged = last.exists()
    if damaged:
        os.replace(last, save / "checkpoint_last.pt.damaged")
    others = [p for p in save.glob("checkpoint*.pt") if p.name != "checkpoint_last.pt"
              and not p.name.startswith("checkpoint_avg")]
    progress = sorted((p for p in others if progress_key(p)[0] >= 0), key=progress_key, reverse=True)
    best = sorted((p for p in others if progress_key(p)[0] < 0), key=lambda p: p.stat().st_mtime, reverse=True)
    why = (f"{last} was truncated (kept as checkpoint_last.pt.damaged)" if damaged
           else f"{last} is missing")
    for path in progress + best:
        if intact(path):
            write_atomic(last, lambda tmp: shutil.copyfile(path, tmp))
            print(f"checkpoint_guard: {why}; resuming from {path.name} (copied to checkpoint_last.pt)")
            return
    set_aside = sorted(save.glob("checkpoint*.pt.damaged"))  # from this run or an earlier one
    if others or set_aside:
        left = (f"its other checkpoints ({', '.join(p.name for p in others[:3])}) are unreadable too" if others
                else f"only {', '.join(p.name for p in set_aside)} is left")
        sys.exit(f"checkpoint_guard: {why} and {left}: not starting afresh; to train from update 0, move "
                 f"the checkpoints out of {save}")
    print(f"checkpoint_guard: no checkpoint in {save}: training starts from update 0")


if __name__ == "__main__":
    main()
