"""Paths in committed results: relative to the repository, never an absolute path of the machine that made them.

Every result writer records its paths through ``portable``: a path inside the repository relative to its root
(the enclosing checkout's root when the code runs from a snapshot inside it, e.g. a study's code under
checkpoints/), any other path as given (only tests and private set-ups write outside the repository, and their
results are not committed; ``tests/test_result_paths.py`` checks the committed ones). Readers find a recorded
path with ``locate``. ``rewrite`` makes the paths of a result JSON file already written portable (the command:
scripts/result_paths.py).
"""
import json
import os
from pathlib import Path

from tooling.atomic import write_text

REPO = Path(__file__).resolve().parents[2]  # scripts/tooling/paths.py -> the repository (or snapshot) root


def _roots():
    """Where recorded paths are relative to: the enclosing git checkout of a snapshot first, then this tree."""
    roots = [REPO]
    for parent in REPO.parents:
        if (parent / ".git").exists():
            roots.insert(0, parent)
            break
    return roots


ROOTS = _roots()


def portable(path):
    """`path` as results record it: relative to the (outermost) repository root if inside it, else as given."""
    if path is None:
        return None
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    for root in ROOTS:
        for candidate in {os.path.abspath(text), os.path.realpath(text)}:
            for base in {os.path.abspath(root), os.path.realpath(root)}:
                if candidate.startswith(base + os.sep):
                    return os.path.relpath(candidate, base)
    return text


def locate(path):
    """A recorded path as a file name to open: as given if it exists (or is absolute), else below a root."""
    if path is None or os.path.isabs(path) or os.path.exists(path):
        return path
    for root in ROOTS:
        if (root / path).exists():
            return str(root / path)
    return path


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
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    data = json.loads(text)
    new = relativize(data)
    if new == data:
        return False
    indent = 1 if text.startswith("{\n ") and not text.startswith("{\n  ") else 2
    out = json.dumps(new, indent=indent, sort_keys=text == json.dumps(data, indent=indent, sort_keys=True) + "\n")
    write_text(path, out + "\n")
    return True
