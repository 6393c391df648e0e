"""The fast tier (pytest -m "not slow") runs the diagonal of each matrix test: every model and every precision
mode once each, in as many cases as the longer axis has values; make test runs the whole product. The fast tier
is clocked: under make test-fast a test not marked slow that uses over TIER_MAX_SECONDS CPU seconds fails the run."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.precision_harness import MODELS, MODES

TESTS = Path(__file__).resolve().parent
MAKEFILE = TESTS.parent / "Makefile"
TEST = "tests/test_precision.py::test_each_parameter_steps_with_its_own_gradient"


def collected(*marker):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *marker, TEST], capture_output=True, text=True, check=True)
    return [line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if line.startswith(TEST + "[")]


def pairs(cases):
    """(model, mode) of each case id "<model>-<mode>" (both may hold dashes: split where both names match)."""
    return [next((m, mode) for m in MODELS for mode in MODES if case == f"{m}-{mode}") for case in cases]


@pytest.mark.slow  # collects the whole suite twice
def test_the_fast_tier_runs_every_model_and_every_mode_once():
    fast = pairs(collected("-m", "not slow"))
    assert len(fast) == max(len(MODELS), len(MODES))
    assert {m for m, _ in fast} == set(MODELS) and {mode for _, mode in fast} == set(MODES)
    assert len(pairs(collected())) == len(MODELS) * len(MODES)  # make test: the whole product


SLOW_AND_FAST = '''
import time

import pytest


def busy(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_quick():
    time.sleep(1)  # wall time, no CPU: the clock counts CPU seconds


def test_busy():
    busy(1)


@pytest.mark.slow
def test_busy_but_marked():
    busy(1)
'''


def clocked(tmp_path, *args, bound=None):
    """pytest with the tier clock (tests/helpers/tier_clock.py) on a file of three tests: one that sleeps 1 s, one
    that computes for 1 CPU s, one that does too but is marked slow; TIER_MAX_SECONDS=bound where given."""
    (tmp_path / "test_three.py").write_text(SLOW_AND_FAST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    env = {k: v for k, v in os.environ.items() if k != "TIER_MAX_SECONDS"}
    if bound is not None:
        env["TIER_MAX_SECONDS"] = str(bound)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "helpers.tier_clock", "-p", "no:cacheprovider",
                           *args, "test_three.py"], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_the_tier_clock_fails_a_fast_test_over_the_bound_and_lists_it(tmp_path):
    # 1 CPU s against 0.5: far from the bound either way (a sleep uses next to no CPU, on any machine)
    proc = clocked(tmp_path, bound=0.5)
    assert proc.returncode == 1, proc.stdout
    listed = proc.stdout.split("tests not marked slow over TIER_MAX_SECONDS=0.5 CPU s", 1)[1].splitlines()
    assert [line.split()[-1] for line in listed if " s  " in line] == ["test_three.py::test_busy"]
    assert "3 passed" in proc.stdout


@pytest.mark.slow  # three pytest processes
def test_the_tier_clock_only_records_without_its_variable_and_passes_tests_within_it(tmp_path):
    assert clocked(tmp_path).returncode == 0  # plain pytest: the bound is make test-fast's
    assert clocked(tmp_path, bound=60).returncode == 0


def test_the_tier_clock_lists_the_costliest_tests_with_their_tier(tmp_path):
    """Without the bound too (make test): each tier's CPU seconds, and the tests that used the most, costliest first."""
    proc = clocked(tmp_path)
    assert proc.returncode == 0 and "CPU seconds: " in proc.stdout, proc.stdout
    listed = proc.stdout.split("tests that used the most CPU seconds", 1)[1].splitlines()[1:4]
    rows = [(line.split()[-2], line.split()[-1]) for line in listed]
    assert sorted(rows[:2]) == [("fast", "test_three.py::test_busy"), ("slow", "test_three.py::test_busy_but_marked")]
    assert rows[2] == ("fast", "test_three.py::test_quick")  # a sleep: next to no CPU


def test_the_tier_clock_works_under_workers(tmp_path):
    """With pytest-xdist the controller checks what every worker reports (as make test-fast runs it)."""
    proc = clocked(tmp_path, "-n", "2", bound=0.5)
    assert proc.returncode == 1 and "test_three.py::test_busy\n" in proc.stdout, proc.stdout


def test_make_runs_both_tiers_on_workers_with_durations_and_the_fast_one_clocked():
    recipes = {}
    for block in MAKEFILE.read_text().split("\n\n"):
        for target in ("test", "test-fast"):
            if block.startswith(f"{target}: "):
                recipes[target] = block
    variables = MAKEFILE.read_text().split("\ntest: ", 1)[0]
    pytest_line = next(line for line in variables.splitlines() if line.startswith("PYTEST :="))
    assert "-n $(JOBS)" in pytest_line and "--dist loadfile" in pytest_line and "--durations=" in pytest_line
    assert "$(PYTEST)" in recipes["test"] and "TIER_MAX_SECONDS" not in recipes["test"]
    assert "TIER_MAX_SECONDS=$(TIER_MAX_SECONDS) $(PYTEST) -m \"not slow\"" in recipes["test-fast"]



def test_openmp_threads_of_the_suite_sleep_while_they_wait():
    """A test's OpenMP threads do not spin while they wait for each other (conftest), in the test process (set
    before torch loaded) and in each process it starts: the runtime's own report says so."""
    import conftest

    assert not conftest.TORCH_LOADED_FIRST, "torch was imported before conftest set OMP_WAIT_POLICY"
    proc = subprocess.run([sys.executable, "-c", "import torch; torch.set_num_threads(2); torch.ones(10**6).sum()"],
                          env={**conftest.env(), "OMP_DISPLAY_ENV": "VERBOSE"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    if "GOMP_SPINCOUNT" in proc.stderr:  # GNU OpenMP (Linux wheels): passive means a spin count of 0
        assert "GOMP_SPINCOUNT = '0'" in proc.stderr, proc.stderr
    else:
        assert re.search(r"OMP_WAIT_POLICY\s*=\s*'?PASSIVE", proc.stderr), proc.stderr


def test_workers_run_the_files_in_collection_order(tmp_path):
    """pytest-xdist's loadfile hands out files in the order collected (conftest's COSTLIEST_FIRST), not sorted by
    their number of tests, its default: one file of one test and one of three, on one worker, run as collected."""
    (tmp_path / "test_a_one.py").write_text("def test_1():\n    pass\n")
    (tmp_path / "test_b_three.py").write_text("".join(f"def test_{i}():\n    pass\n" for i in range(3)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "helpers.file_order", "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-n", "1", "--dist", "loadfile", "test_a_one.py", "test_b_three.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    ran = [line.split("PASSED ", 1)[1].split("::")[0] for line in proc.stdout.splitlines() if "PASSED " in line]
    assert ran == ["test_a_one.py"] + ["test_b_three.py"] * 3, proc.stdout

@pytest.mark.slow  # collects the whole suite
def test_the_costliest_files_are_collected_first_and_exist():
    # pytest-xdist's loadfile schedules whole files in collection order: a long file collected last would run
    # alone at the end of make test
    from conftest import COSTLIEST_FIRST

    assert all((TESTS / f"{name}.py").is_file() for name in COSTLIEST_FIRST), "a renamed or deleted file"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
                          capture_output=True, text=True, check=True, cwd=TESTS.parent)
    files = list(dict.fromkeys(line.split("::", 1)[0] for line in proc.stdout.splitlines() if "::" in line))
    assert files[:len(COSTLIEST_FIRST)] == [f"tests/{name}.py" for name in COSTLIEST_FIRST]
    assert len(files) == len(set(files)), "each file's tests stay together"
