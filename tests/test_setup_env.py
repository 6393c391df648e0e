"""scripts/setup_env.sh. One torch floor (fairseq_plugins.TORCH_FLOOR): the set-up refuses an older torch in one line
before it writes anything (it never replaces a user's torch), and `import fairseq_plugins` refuses it in one line
too. Set-up per checkout: a venv imports the code of the checkout whose set-up ran last, and pytest in any checkout
tests that checkout's code."""
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


def setup(env_extra, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(["bash", "scripts/setup_env.sh", *args], cwd=REPO, env={**env, **env_extra}, text=True,
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


def bare_venv(path):
    """A venv with nothing installed, not even pip; returns its site-packages."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(path)], check=True)
    (site,) = path.glob("lib/python3.*/site-packages")
    return site


def other_checkout(tmp_path):
    """Another checkout's code, as a venv set up there imports it: any import of it fails, naming it."""
    other = tmp_path / "other"
    for package in ("fairseq_plugins", "scripts/tooling"):
        (other / package).mkdir(parents=True)
        (other / package / "__init__.py").write_text(f'raise ImportError("imported {other / package}")\n')
    return other


def test_setup_points_a_shared_venv_at_the_checkout_that_runs_it(tmp_path):
    """A venv set up from another checkout with the same inputs: the set-up installs nothing (no pip needed) and
    makes the venv import this checkout's code, in one step; a second run changes and prints nothing."""
    venv, other = tmp_path / "venv", other_checkout(tmp_path)
    site = bare_venv(venv)
    (site / "fairseq_plugins_repo.pth").write_text(f"{other}\n{other / 'scripts'}\n")
    env = {"VENV": str(venv), "PYTHON": sys._base_executable}
    stamp = setup(env, "--stamp")
    assert stamp.returncode == 0 and len(stamp.stdout.strip()) == 16, stamp.stdout + stamp.stderr
    (venv / ".setup-stamp").write_text(stamp.stdout)

    proc = setup(env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"setup: {venv} now imports fairseq_plugins and tooling from {REPO}\n"
    assert (site / "fairseq_plugins_repo.pth").read_text() == f"{REPO}\n{REPO / 'scripts'}\n"
    assert sorted(p.name for p in site.iterdir() if p.name.startswith("fairseq_plugins")) == ["fairseq_plugins_repo.pth"]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import tooling; print(tooling.__file__)"],
                           cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                           text=True, capture_output=True, timeout=60)
    assert where.stdout.strip() == str(REPO / "scripts" / "tooling" / "__init__.py"), where.stderr

    again = setup(env)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")


@pytest.mark.slow
def test_pytest_in_a_checkout_tests_its_own_code_when_the_venv_imports_another(tmp_path):
    """A venv shared with another checkout that ran the set-up last (its .pth names that checkout): pytest here, from
    any folder, imports this checkout's fairseq_plugins and tooling, in the tests and in the processes they start,
    and fairseq accepts this checkout's --user-dir (it refused it as "not globally unique")."""
    other = other_checkout(tmp_path)
    site = bare_venv(tmp_path / "venv")
    (site / "this_venv.pth").write_text("".join(p + "\n" for p in __import__("site").getsitepackages()))
    (site / "fairseq_plugins_repo.pth").write_text(f"{other}\n{other / 'scripts'}\n")
    tests = REPO / "tests"
    proc = subprocess.run(
        [str(tmp_path / "venv" / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{tests / 'test_setup_env.py'}::test_floor_is_above_the_old_torch", str(tests / "test_tables.py"),
         f"{tests / 'test_floater_rk4.py'}::test_grid_solve_of_all_flows_continues_exactly_from_a_later_point"],
        cwd=tmp_path, env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "error" not in proc.stdout.lower()
