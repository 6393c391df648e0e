"""One torch floor (fairseq_plugins.TORCH_FLOOR): scripts/setup_env.sh refuses an older torch in one line before it
writes anything (it never replaces a user's torch), and `import fairseq_plugins` refuses it in one line too."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fairseq_plugins

REPO = Path(__file__).resolve().parents[1]
OLD = "2.3.1"


@pytest.fixture
def old_torch_python(tmp_path):
    """An interpreter (Python 3.11, as the set-up requires) whose `import torch` finds torch 2.3.1."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(f'__version__ = "{OLD}"\n')
    wrapper = tmp_path / "bin" / "python3.11"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys._base_executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def setup(env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(["bash", "scripts/setup_env.sh"], cwd=REPO, env={**env, **env_extra}, text=True,
                          capture_output=True, timeout=120)


def cache_listing():
    return sorted(str(p) for p in (REPO / ".cache").rglob("*")) if (REPO / ".cache").exists() else []


def assert_one_refusal_line(proc, where):
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0] == (f"setup_env.sh: {where} has torch {OLD}, this project needs torch >= "
                        f"{fairseq_plugins.TORCH_FLOOR} (upgrade that torch, or use a PYTHON without torch to get "
                        "torch==2.13.0 in the venv)")


def test_floor_is_above_the_old_torch():
    assert fairseq_plugins.TORCH_FLOOR == "2.5"


def test_setup_refuses_an_old_torch_and_leaves_nothing_behind(tmp_path, old_torch_python):
    venv = tmp_path / "venv"
    before = cache_listing()
    proc = setup({"PYTHON": str(old_torch_python), "VENV": str(venv)})
    assert_one_refusal_line(proc, f"PYTHON={old_torch_python}")
    assert not venv.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "fake"]
    assert cache_listing() == before


def test_setup_refuses_an_existing_venv_whose_torch_is_old(tmp_path):
    """A venv made earlier on a system torch that has since been downgraded: refused, not given a second torch."""
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3.*/site-packages")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(f'__version__ = "{OLD}"\n')
    before = sorted(p.relative_to(venv) for p in venv.rglob("*"))
    proc = setup({"PYTHON": sys._base_executable, "VENV": str(venv)})
    assert_one_refusal_line(proc, str(venv))
    assert sorted(p.relative_to(venv) for p in venv.rglob("*")) == before


def test_import_refuses_an_old_torch_in_one_line(old_torch_python):
    proc = subprocess.run([str(old_torch_python), "-c", "import fairseq_plugins"], cwd=REPO, text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: fairseq_plugins needs torch >= {fairseq_plugins.TORCH_FLOOR}, found torch "
                           f"{OLD} ("), proc.stderr
