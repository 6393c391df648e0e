"""Paths in committed results: relative to the repository, never an absolute path of the machine that made them.

Every result writer records its paths through ``portable``: inside the repository, the path relative to its root
(readers resolve it from the root, where every script runs); outside it, the file name alone. As a command it
rewrites result JSON files already written (idempotent; only path strings change):

    python scripts/result_paths.py results/           # every *.json below, in place
"""
import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_ROOTS = {os.path.abspath(REPO), os.path.realpath(REPO)}  # the checkout as given and behind its links


def portable(path):
    """`path` as results record it: relative to the repository root if inside it, else its file name."""
    if path is None:
        return None
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    for candidate in {os.path.abspath(text), os.path.realpath(text)}:
        for root in _ROOTS:
            if candidate == root or candidate.startswith(root + os.sep):
                return os.path.relpath(candidate, root)
    return os.path.basename(text)


def relativize(value):
    """Every absolute path string in a JSON value made portable."""
    if isinstance(value, str):
        return portable(value) if value.startswith(os.sep) and "\n" not in value else value
    if isinstance(value, list):
        return [relativize(v) for v in value]
    if isinstance(value, dict):
        return {k: relativize(v) for k, v in value.items()}
    return value


def rewrite(path: Path) -> bool:
    """Rewrites one JSON file in place if any of its paths changes (same formatting rules as the writers)."""
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    new = relativize(data)
    if new == data:
        return False
    indent = 1 if text.startswith("{\n ") and not text.startswith("{\n  ") else 2
    out = json.dumps(new, indent=indent, sort_keys=text == json.dumps(data, indent=indent, sort_keys=True) + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(out + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="JSON files or directories (every *.json below)")
    args = ap.parse_args(argv)
    files = []
    for p in map(Path, args.paths):
        if not p.exists():
            sys.exit(f"result_paths.py: {p}: no such file or directory")
        files += sorted(p.rglob("*.json")) if p.is_dir() else [p]
    changed = 0
    for f in files:
        try:
            changed += rewrite(f)
        except ValueError as err:
            sys.exit(f"result_paths.py: {f}: not JSON ({err})")
    print(f"{changed} of {len(files)} files rewritten")


if __name__ == "__main__":
    main()
