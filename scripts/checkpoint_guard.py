#!/usr/bin/env python3
"""Before a (re)start: make sure checkpoint_last.pt, if present, is a complete file.

    scripts/checkpoint_guard.py SAVE_DIR

fairseq writes the first checkpoint of a save atomically (a .tmp file, then a rename) but makes the others,
checkpoint_last.pt among them, by plain copies: a job killed during that copy (a preemption, a time limit)
leaves a truncated checkpoint_last.pt, and the resume would fail on it. A torch checkpoint is a zip archive,
whose central directory is written last, so a truncated one is not a readable zip. If checkpoint_last.pt is
damaged it is moved aside (checkpoint_last.pt.damaged) and replaced (copy to a temporary name, then rename) by
the newest intact checkpoint*.pt of the directory; with none, training starts afresh. Prints what it did.
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
    if not last.exists() or intact(last):
        return
    os.replace(last, save / "checkpoint_last.pt.damaged")
    candidates = [p for p in save.glob("checkpoint*.pt")
                  if p.name not in ("checkpoint_last.pt", "checkpoint_best.pt") and not p.name.startswith("checkpoint_avg")]
    for path in sorted(candidates, key=progress_key, reverse=True):
        if intact(path):
            write_atomic(last, lambda tmp: shutil.copyfile(path, tmp))
            print(f"checkpoint_guard: {last} was truncated (kept as checkpoint_last.pt.damaged); resuming from {path.name}")
            return
    print(f"checkpoint_guard: {last} was truncated (kept as checkpoint_last.pt.damaged) and no intact checkpoint "
          "is left; training starts afresh")


if __name__ == "__main__":
    main()
