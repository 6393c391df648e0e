"""The fast tier (pytest -m "not slow") runs the diagonal of each matrix test: every model and every precision
mode once each, in as many cases as the longer axis has values; make test runs the whole product."""
import subprocess
import sys

from helpers.precision_harness import MODELS, MODES

TEST = "tests/test_precision.py::test_each_parameter_steps_with_its_own_gradient"


def collected(*marker):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *marker, TEST], capture_output=True, text=True, check=True)
    return [line.split("[", 1)[1].rstrip("]") for line in proc.stdout.splitlines() if line.startswith(TEST + "[")]


def pairs(cases):
    """(model, mode) of each case id "<model>-<mode>" (both may hold dashes: split where both names match)."""
    return [next((m, mode) for m in MODELS for mode in MODES if case == f"{m}-{mode}") for case in cases]


def test_the_fast_tier_runs_every_model_and_every_mode_once():
    fast = pairs(collected("-m", "not slow"))
    assert len(fast) == max(len(MODELS), len(MODES))
    assert {m for m, _ in fast} == set(MODELS) and {mode for _, mode in fast} == set(MODES)
    assert len(pairs(collected())) == len(MODELS) * len(MODES)  # make test: the whole product
