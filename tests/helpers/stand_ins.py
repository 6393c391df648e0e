"""Stand-in command-line tools for a test: shell scripts in a folder that goes first on PATH (a stand-in srun that
prints what it was asked to start, an sbatch that hands out job ids)."""
from pathlib import Path


def stand_ins(folder, scripts):
    """folder/NAME for each {NAME: shell script body}, executable; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/sh\n" + body)
        (folder / name).chmod(0o755)
    return folder
