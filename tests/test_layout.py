"""docs/layout.md and the tree agree: every tool and library module under scripts/ is named there, every folder of
the tree sketch exists; no two files share a name; no library module imports a command-line script."""
import ast
import subprocess
from collections import Counter
from pathlib import Path

from conftest import REPO

LAYOUT = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
TRACKED = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
CODE = [Path(f) for f in TRACKED if f.endswith((".py", ".sh", ".sbatch")) and not f.startswith(("tests/data/",
                                                                                                   "third_party/"))]


def test_every_script_and_library_module_is_named_in_the_layout():
    missing = []
    for path in CODE:
        if path.parts[0] != "scripts" or path.name == "__init__.py":
            continue
        name = path.stem if "tooling" in path.parts else path.name  # tooling's modules by module name
        if f"`{name}`" not in LAYOUT and f"`{path.name}`" not in LAYOUT:
            missing.append(str(path))
    assert not missing, f"docs/layout.md does not name: {missing}"


def test_every_folder_of_the_sketch_exists():
    sketch = LAYOUT.split("```")[1]
    stack, folders = [], []
    for line in sketch.splitlines():
        head = line.split("  ")[0] if not line.startswith(" ") else line.strip().split("  ")[0]
        depth = (len(line) - len(line.lstrip())) // 2
        for word in head.split():
            if word.endswith("/"):
                stack[depth:] = [word]
                folders.append("".join(stack[:depth]) + word)
    assert len(folders) > 10
    for folder in folders:
        assert (REPO / folder).is_dir(), f"docs/layout.md's sketch names {folder}, which does not exist"


def test_no_two_files_share_a_name():
    # names Python or pytest look for: a package's, pytest's, the start-up hook of each PYTHONPATH folder (tests/preload,
    # tests/census)
    names = Counter(p.name for p in CODE if p.name not in ("__init__.py", "conftest.py", "sitecustomize.py"))
    assert [n for n, c in names.items() if c > 1] == []


def test_no_library_module_imports_a_command_line_script():
    scripts = {p.stem for p in CODE if p.parts[0] == "scripts" and "tooling" not in p.parts and p.suffix == ".py"}
    wrong = []
    for path in CODE:
        if path.parts[:2] != ("scripts", "tooling") or path.suffix != ".py":
            continue
        for node in ast.walk(ast.parse((REPO / path).read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path}: {n}" for n in names if n.split(".")[0] in scripts]
    assert not wrong, wrong
