"""Rewrites result JSON files already written so that they name no absolute path of the machine that made them
(idempotent; only path strings change). The logic, and ``portable``/``locate`` for writers and readers, is
scripts/tooling/paths.py.

    python scripts/result_paths.py results/           # every *.json below, in place
"""
import argparse
import sys
from pathlib import Path

from tooling.paths import rewrite


def rewrite_all(paths):
    """Rewrites the JSON files among paths and below its directories: (files changed, files read). A missing path
    or a file that is not JSON ends the program with one line."""
    files = []
    for p in map(Path, paths):
        if not p.exists():
            sys.exit(f"result_paths.py: {p}: no such file or directory")
        files += sorted(p.rglob("*.json")) if p.is_dir() else [p]
    changed = 0
    for f in files:
        try:
            changed += rewrite(f)
        except ValueError as err:
            sys.exit(f"result_paths.py: {f}: not JSON ({err})")
    return changed, len(files)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="JSON files or directories (every *.json below)")
    args = ap.parse_args(argv)
    changed, total = rewrite_all(args.paths)
    print(f"{changed} of {total} files rewritten")


if __name__ == "__main__":
    main()
